//! Bearer-token authentication.

use axum::http::{Request, StatusCode, header};

use crate::error::ApiError;

/// Why a request is refused when `expected` is the configured token:
/// `401` without `Authorization: Bearer <token>` or with another token;
/// `None` when it may go on (or no token is configured).
pub fn refusal<B>(expected: Option<&str>, request: &Request<B>) -> Option<ApiError> {
    let expected = expected?;
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(bearer_token);
    match presented {
        Some(token) if constant_time_eq(token.as_bytes(), expected.as_bytes()) => None,
        Some(_) => Some(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid bearer token",
        )),
        None => Some(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing bearer token",
        )),
    }
}

/// The token of an `Authorization` value in the `Bearer` scheme, whose
/// name is case-insensitive (RFC 7235 §2.1); the token itself is not.
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Compares in time that depends only on the lengths, so a wrong token's
/// answer time does not tell how much of it was right.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_is_case_insensitive_and_the_token_is_not() {
        for value in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER s3cret",
            "bEaReR  s3cret",
        ] {
            assert_eq!(bearer_token(value), Some("s3cret"), "{value}");
        }
        assert_eq!(bearer_token("bearer S3CRET"), Some("S3CRET"));
        for value in ["Basic czNjcmV0", "Bearer", "Bearer ", "Bearers3cret", ""] {
            assert_eq!(bearer_token(value), None, "{value}");
        }
    }

    #[test]
    fn tokens_match_only_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
