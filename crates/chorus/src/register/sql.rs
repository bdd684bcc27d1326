//! Row encoding shared by the SQL backends: a version counter column and the
//! fields as a JSON object.

use super::{Fields, RegisterError, RegisterVersion, VersionToken, VersionedManifest};

/// The fields as stored in the `fields` column.
pub(super) fn encode_fields(fields: &Fields) -> String {
    serde_json::to_string(fields).expect("string maps encode")
}

/// The counter a CAS must find in the `version` column. A version from another
/// backend can never match, so it is a conflict.
pub(super) fn expected_counter(
    name: &str,
    version: &RegisterVersion,
) -> Result<i64, RegisterError> {
    match version.0 {
        VersionToken::Counter(counter) => {
            i64::try_from(counter).map_err(|_| RegisterError::backend(name, "version out of range"))
        }
        VersionToken::Blob(_) => Err(RegisterError::conflict(name)),
    }
}

/// The version after a successful CAS from `expected`.
pub(super) fn next_version(expected: i64) -> RegisterVersion {
    RegisterVersion(VersionToken::Counter(expected as u64 + 1))
}

/// The version of a freshly created row.
pub(super) fn first_version() -> RegisterVersion {
    RegisterVersion(VersionToken::Counter(1))
}

/// Decodes a stored row.
pub(super) fn decode_row(
    name: &str,
    version: i64,
    fields: &str,
) -> Result<VersionedManifest, RegisterError> {
    let version = u64::try_from(version)
        .map_err(|_| RegisterError::backend(name, format!("negative version {version}")))?;
    let fields: Fields = serde_json::from_str(fields).map_err(|e| {
        RegisterError::backend(
            name,
            format!("register row is not a JSON object of strings: {e}"),
        )
    })?;
    Ok(VersionedManifest {
        version: RegisterVersion(VersionToken::Counter(version)),
        fields,
    })
}
