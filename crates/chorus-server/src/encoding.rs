//! Bytes in JSON, the same convention as `chorus log read`: a field `name`
//! holds the bytes as text when they are valid UTF-8, otherwise `name_b64`
//! holds them as standard base64 (with padding).

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use bytes::Bytes;
use serde_json::Value;

use crate::error::ApiError;

/// `(name, text)` for UTF-8 bytes, else `(name_b64, base64)`.
pub fn text_or_base64(name: &str, bytes: &[u8]) -> Vec<(String, Value)> {
    match std::str::from_utf8(bytes) {
        Ok(text) => vec![(name.to_owned(), Value::String(text.to_owned()))],
        Err(_) => vec![(format!("{name}_b64"), Value::String(STANDARD.encode(bytes)))],
    }
}

/// Adds `name` (or `name_b64`) to a JSON object.
pub fn insert_bytes(object: &mut serde_json::Map<String, Value>, name: &str, bytes: &[u8]) {
    object.extend(text_or_base64(name, bytes));
}

/// The bytes of a request field given as `text` or as `b64` (exactly one).
pub fn field_bytes(
    name: &str,
    text: Option<String>,
    b64: Option<String>,
) -> Result<Option<Bytes>, ApiError> {
    match (text, b64) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(format!(
            "give {name} or {name}_b64, not both"
        ))),
        (Some(text), None) => Ok(Some(Bytes::from(text))),
        (None, Some(b64)) => STANDARD
            .decode(b64.as_bytes())
            .map(|bytes| Some(Bytes::from(bytes)))
            .map_err(|e| ApiError::bad_request(format!("{name}_b64 is not valid base64: {e}"))),
        (None, None) => Ok(None),
    }
}

/// A list cursor: the last key of a page, URL-safe base64 without padding.
pub fn cursor(key: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(key)
}

/// The key a cursor names.
pub fn parse_cursor(cursor: &str) -> Result<Bytes, ApiError> {
    URL_SAFE_NO_PAD
        .decode(cursor.as_bytes())
        .map(Bytes::from)
        .map_err(|_| ApiError::bad_request("after: not a cursor from a previous page's `next`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_stays_text_and_other_bytes_become_base64() {
        assert_eq!(
            text_or_base64("key", b"a/1"),
            vec![("key".into(), Value::from("a/1"))]
        );
        assert_eq!(
            text_or_base64("value", &[0xff, 0]),
            vec![("value_b64".into(), Value::from("/wA="))]
        );
        let bytes = field_bytes("value", None, Some("/wA=".into())).unwrap();
        assert_eq!(bytes.as_deref(), Some(&[0xff, 0][..]));
        assert!(field_bytes("value", Some("a".into()), Some("YQ==".into())).is_err());
        assert!(field_bytes("value", None, Some("!".into())).is_err());
        assert_eq!(field_bytes("value", None, None).unwrap(), None);
    }

    #[test]
    fn cursors_round_trip_any_key() {
        for key in [&b"a"[..], b"a/b c", &[0, 0xff, 7]] {
            assert_eq!(parse_cursor(&cursor(key)).unwrap(), key);
        }
        assert!(parse_cursor("not a cursor!").is_err());
    }
}
