//! The register as a JSON object in any CAS-capable blob store, written with
//! create-if-absent and updated with if-match on its version token.

use async_trait::async_trait;
use bytes::Bytes;

use super::manifest::{F_FORMAT, readable_formats_text};
use super::{
    DEFAULT_MAX_DIRECTORY_BYTES, FORMAT, Fields, Manifest, ManifestStore, RegisterError,
    RegisterVersion, VersionToken, VersionedManifest,
};
use crate::blob::{BlobError, DynBlobStore};
use crate::codec::{DOCUMENT_CHECKSUM_FIELD, NewerFormat, checksum_failure, document_checksum};

/// The register document's key in its store.
pub const REGISTER_KEY: &str = "manifest.json";

/// A register stored as the object `manifest.json` in a blob store.
#[derive(Debug, Clone)]
pub struct ObjectRegister {
    store: DynBlobStore,
    name: String,
}

impl ObjectRegister {
    /// A register in `store` (which must enforce conditional writes; open it
    /// with [`open_store`](crate::blob::open_store) so it has been probed).
    pub fn new(store: DynBlobStore) -> ObjectRegister {
        let name = format!("{} key={REGISTER_KEY}", store.name());
        ObjectRegister { store, name }
    }

    fn error(&self, error: BlobError) -> RegisterError {
        match error {
            // A CAS on a vanished document is a conflict: it is not at `version`.
            BlobError::Conflict { .. } | BlobError::NotFound { .. } => {
                RegisterError::conflict(&self.name)
            }
            BlobError::AlreadyExists { .. } => RegisterError::already_exists(&self.name),
            error @ BlobError::Unavailable { .. } => RegisterError::unavailable(&self.name, error),
            error => RegisterError::backend(&self.name, error),
        }
    }
}

/// Encodes register fields as the stored document, adding its checksum
/// ([`document_checksum`]; an entry named [`DOCUMENT_CHECKSUM_FIELD`] in
/// `fields` is not a register field and is replaced).
pub fn encode_document(fields: &Fields) -> Bytes {
    let mut document = fields.clone();
    document.insert(
        DOCUMENT_CHECKSUM_FIELD.to_owned(),
        document_checksum(fields),
    );
    Bytes::from(serde_json::to_vec_pretty(&document).expect("string maps encode"))
}

/// Parses a stored document and checks its checksum; the error says what is
/// wrong with it. The fields are not validated here ([`Manifest::from_fields`]
/// does that).
///
/// [`Manifest::from_fields`]: super::Manifest::from_fields
pub fn decode_document(bytes: &[u8]) -> Result<Fields, String> {
    let mut fields: Fields = serde_json::from_slice(bytes)
        .map_err(|e| format!("register document is not a JSON object of strings: {e}"))?;
    // Another claimed format is worth naming only when this build cannot
    // read it.
    let claimed = fields
        .get(F_FORMAT)
        .filter(|_| Manifest::stored_format(&fields).is_err())
        .cloned();
    let supported = readable_formats_text();
    // A newer build's register may checksum differently: say that first.
    let newer = claimed
        .as_deref()
        .and_then(|found| NewerFormat::check_text("register", found, FORMAT.into()));
    let unsupported_or = |reason: String| match &newer {
        Some(newer) => format!("{newer} (unless it is damaged: {reason})"),
        None => checksum_failure(F_FORMAT, claimed.as_deref(), &supported, reason),
    };
    let Some(stored) = fields.remove(DOCUMENT_CHECKSUM_FIELD) else {
        return Err(unsupported_or(format!(
            "register document has no {DOCUMENT_CHECKSUM_FIELD:?} checksum entry (written by \
             hand, or by a build before checksums)"
        )));
    };
    let computed = document_checksum(&fields);
    if stored != computed {
        return Err(unsupported_or(format!(
            "register document checksum mismatch: stored {stored:?}, its fields give \
             {computed:?} (damaged in storage or in transit, or edited by hand)"
        )));
    }
    Ok(fields)
}

#[async_trait]
impl ManifestStore for ObjectRegister {
    fn name(&self) -> &str {
        &self.name
    }

    async fn read(&self) -> Result<Option<VersionedManifest>, RegisterError> {
        let blob = match self.store.get(REGISTER_KEY).await {
            Ok(blob) => blob,
            Err(BlobError::NotFound { .. }) => return Ok(None),
            Err(error) => return Err(self.error(error)),
        };
        let fields = decode_document(&blob.bytes)
            .map_err(|reason| RegisterError::backend(&self.name, reason))?;
        Ok(Some(VersionedManifest {
            version: RegisterVersion(VersionToken::Blob(blob.version)),
            fields,
        }))
    }

    async fn create(&self, fields: &Fields) -> Result<RegisterVersion, RegisterError> {
        let version = self
            .store
            .create(REGISTER_KEY, encode_document(fields))
            .await
            .map_err(|e| self.error(e))?;
        Ok(RegisterVersion(VersionToken::Blob(version)))
    }

    async fn update(
        &self,
        version: &RegisterVersion,
        fields: &Fields,
    ) -> Result<RegisterVersion, RegisterError> {
        let VersionToken::Blob(expected) = &version.0 else {
            return Err(RegisterError::conflict(&self.name));
        };
        let version = self
            .store
            .update(REGISTER_KEY, expected, encode_document(fields))
            .await
            .map_err(|e| self.error(e))?;
        Ok(RegisterVersion(VersionToken::Blob(version)))
    }

    fn max_directory_bytes(&self) -> usize {
        DEFAULT_MAX_DIRECTORY_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::register::manifest::FORMAT;

    fn fields() -> Fields {
        [("chorus.tail_base", "120"), ("chorus.epoch", "7")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    #[test]
    fn documents_round_trip_and_layout_is_not_content() {
        let encoded = encode_document(&fields());
        assert_eq!(decode_document(&encoded).unwrap(), fields());
        let value: serde_json::Value = serde_json::from_slice(&encoded).unwrap();
        assert_eq!(
            decode_document(&serde_json::to_vec(&value).unwrap()).unwrap(),
            fields()
        );
    }

    #[test]
    fn a_changed_value_or_a_missing_checksum_is_refused() {
        let text = String::from_utf8(encode_document(&fields()).to_vec()).unwrap();
        let damaged = text.replace("\"120\"", "\"130\"");
        let error = decode_document(damaged.as_bytes()).unwrap_err();
        assert!(error.contains("checksum mismatch"), "{error}");
        let unsigned = serde_json::to_vec(&fields()).unwrap();
        let error = decode_document(&unsigned).unwrap_err();
        assert!(error.contains("no \"crc32c\" checksum"), "{error}");
    }

    #[test]
    fn a_newer_format_is_named_when_its_checksum_does_not_fit() {
        let (current, next) = (FORMAT, FORMAT + 1);
        let mut newer = fields();
        newer.insert("chorus.format".into(), next.to_string());
        let unsigned = serde_json::to_vec(&newer).unwrap();
        let error = decode_document(&unsigned).unwrap_err();
        assert!(
            error.starts_with(&format!(
                "register written by a newer Chorus: format {next}; this build reads up to {current} \
                 (unless it is damaged: register document has no"
            )),
            "{error}"
        );
        let text = String::from_utf8(encode_document(&newer).to_vec()).unwrap();
        let damaged = text.replace("\"120\"", "\"130\"");
        let error = decode_document(damaged.as_bytes()).unwrap_err();
        assert!(
            error.contains(&format!(
                "reads up to {current} (unless it is damaged: register document checksum mismatch"
            )),
            "{error}"
        );
        // Intact, it decodes here; the manifest refuses its format in one line.
        assert_eq!(decode_document(text.as_bytes()).unwrap(), newer);
    }

    #[test]
    fn a_readable_older_format_is_not_blamed_for_damage() {
        let mut older = fields();
        older.insert("chorus.format".into(), "1".into());
        let text = String::from_utf8(encode_document(&older).to_vec()).unwrap();
        assert_eq!(decode_document(text.as_bytes()).unwrap(), older);
        let damaged = text.replace("\"120\"", "\"130\"");
        let error = decode_document(damaged.as_bytes()).unwrap_err();
        assert!(
            error.starts_with("register document checksum mismatch"),
            "{error}"
        );
    }

    #[test]
    fn another_format_is_named_when_its_checksum_does_not_fit() {
        let mut other = fields();
        other.insert("chorus.format".into(), "one".into());
        let unsigned = serde_json::to_vec(&other).unwrap();
        let error = decode_document(&unsigned).unwrap_err();
        assert!(
            error.starts_with("unsupported format: field=chorus.format value=one supported=1-3, or register document has no"),
            "{error}"
        );
    }

    #[test]
    fn every_single_bit_flip_is_refused_or_harmless() {
        let encoded = encode_document(&fields());
        for bit in 0..encoded.len() * 8 {
            let mut flipped = encoded.to_vec();
            flipped[bit / 8] ^= 1 << (bit % 8);
            if let Ok(decoded) = decode_document(&flipped) {
                assert_eq!(decoded, fields(), "bit {bit} changed the register");
            }
        }
    }
}
