//! Bytes in JSON, the same convention as `chorus log read`: a field `name`
//! holds the bytes as text when they are valid UTF-8, otherwise `name_b64`
//! holds them as standard base64 (with padding).

use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use bytes::Bytes;
use serde::de::DeserializeOwned;
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

/// The key prefix of a list or a watch: `prefix` (text) or `prefix_b64`
/// (any bytes, standard base64); empty when neither is given.
pub fn prefix_bytes(text: Option<String>, b64: Option<String>) -> Result<Bytes, ApiError> {
    Ok(field_bytes("prefix", text, b64)?.unwrap_or_default())
}

/// A query string deserialized into `T`, like axum's `Query`, except that a
/// name or value that does not percent-decode to UTF-8 is refused with 400
/// instead of being decoded lossily (`%FF` to U+FFFD would name other keys
/// than the client asked for).
#[derive(Debug)]
pub struct Utf8Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Utf8Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        check_utf8_query(parts.uri.query().unwrap_or_default())?;
        Query::try_from_uri(&parts.uri)
            .map(|Query(value)| Utf8Query(value))
            .map_err(|rejection| ApiError::bad_request(rejection.body_text()))
    }
}

/// Refuses a query whose names or values are not UTF-8 once decoded.
pub fn check_utf8_query(query: &str) -> Result<(), ApiError> {
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = String::from_utf8(percent_decode(name)).map_err(|_| {
            ApiError::bad_request("query parameter name is not UTF-8 after percent-decoding")
        })?;
        if std::str::from_utf8(&percent_decode(value)).is_err() {
            return Err(ApiError::bad_request(format!(
                "query parameter is not UTF-8 after percent-decoding: name={name}"
            )));
        }
    }
    Ok(())
}

/// Form-style percent-decoding (`+` is a space); a `%` not followed by two
/// hex digits stays as it is, as form decoders leave it.
fn percent_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut position = 0;
    while position < bytes.len() {
        let escaped = match bytes.get(position..position + 3) {
            Some([b'%', high, low]) if high.is_ascii_hexdigit() && low.is_ascii_hexdigit() => {
                let digits = [*high, *low];
                std::str::from_utf8(&digits)
                    .ok()
                    .and_then(|digits| u8::from_str_radix(digits, 16).ok())
            }
            _ => None,
        };
        match (escaped, bytes[position]) {
            (Some(byte), _) => {
                decoded.push(byte);
                position += 3;
            }
            (None, b'+') => {
                decoded.push(b' ');
                position += 1;
            }
            (None, byte) => {
                decoded.push(byte);
                position += 1;
            }
        }
    }
    decoded
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
    fn queries_that_are_not_utf8_are_refused_not_replaced() {
        assert_eq!(percent_decode("a%2Fb+c%ff%"), b"a/b c\xff%");
        assert_eq!(percent_decode("%e2%82%ac%4"), "€%4".as_bytes());
        for good in [
            "",
            "prefix=a%2F",
            "prefix=%E2%82%AC&limit=3",
            "flag",
            "a=&b=%41",
        ] {
            assert!(check_utf8_query(good).is_ok(), "{good}");
        }
        for bad in ["prefix=%FF%FE", "limit=1&prefix=%C3", "%FF=1"] {
            let error = check_utf8_query(bad).unwrap_err();
            assert_eq!(error.status, axum::http::StatusCode::BAD_REQUEST, "{bad}");
        }
        let error = check_utf8_query("prefix=%FF").unwrap_err();
        assert!(error.message.contains("name=prefix"), "{}", error.message);
        assert_eq!(prefix_bytes(None, None).unwrap(), Bytes::new());
        assert_eq!(
            prefix_bytes(None, Some("//4=".into())).unwrap(),
            &[0xff, 0xfe][..]
        );
        assert!(prefix_bytes(Some("a".into()), Some("YQ==".into())).is_err());
    }

    #[test]
    fn cursors_round_trip_any_key() {
        for key in [&b"a"[..], b"a/b c", &[0, 0xff, 7]] {
            assert_eq!(parse_cursor(&cursor(key)).unwrap(), key);
        }
        assert!(parse_cursor("not a cursor!").is_err());
    }
}
