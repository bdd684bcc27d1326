//! Object key rules shared by every backend.

use super::BlobError;

/// Longest accepted key, in bytes (S3 allows 1024).
pub const MAX_KEY_BYTES: usize = 1024;

/// Checks that `key` is a key every backend stores the same way: non-empty
/// `/`-separated segments of ASCII letters, digits, `-`, `_`, `.` and `=`, no
/// segment starting with `.` (which also rules out `.` and `..`, and keeps the
/// local store's private `.chorus-*` entries out of reach).
pub fn validate_key(key: &str) -> Result<(), BlobError> {
    let invalid = |reason| BlobError::InvalidKey {
        key: key.chars().take(200).collect(),
        reason,
    };
    if key.is_empty() {
        return Err(invalid("empty"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(invalid("longer than 1024 bytes"));
    }
    for segment in key.split('/') {
        if segment.is_empty() {
            return Err(invalid("empty path segment"));
        }
        if segment.starts_with('.') {
            return Err(invalid("path segment starts with '.'"));
        }
        if !segment.bytes().all(is_key_byte) {
            return Err(invalid(
                "only ASCII letters, digits and - _ . = are allowed",
            ));
        }
    }
    Ok(())
}

/// Checks a listing prefix: empty (everything) or a valid key.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), BlobError> {
    if prefix.is_empty() {
        Ok(())
    } else {
        validate_key(prefix)
    }
}

fn is_key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'=')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_protocol_keys() {
        for key in [
            "log/segments/0000000000000001-00000000/00000000000000000007",
            "log/sealed/0000000000000001-00000000-0badf00d",
            "db/HEAD.json",
            "db/snapshots/g1-s2",
        ] {
            validate_key(key).unwrap();
        }
    }

    #[test]
    fn rejects_ambiguous_keys() {
        let long = "a".repeat(MAX_KEY_BYTES + 1);
        for key in [
            "",
            "/a",
            "a/",
            "a//b",
            ".",
            "a/..",
            ".chorus-locks/x",
            "a b",
            "a\\b",
            "é",
            long.as_str(),
        ] {
            assert!(validate_key(key).is_err(), "{key:?} accepted");
        }
        validate_prefix("").unwrap();
    }
}
