//! Bearer-token authentication.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::AppState;
use crate::error::ApiError;

/// Refuses a request without `Authorization: Bearer <token>` when a token is
/// configured: `401` with a JSON body.
pub async fn require_token(
    State(app): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(expected) = app.config.token.as_deref() else {
        return next.run(request).await;
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    match presented {
        Some(token) if constant_time_eq(token.as_bytes(), expected.as_bytes()) => {
            next.run(request).await
        }
        Some(_) => ApiError::new(StatusCode::UNAUTHORIZED, "invalid bearer token").into_response(),
        None => ApiError::new(StatusCode::UNAUTHORIZED, "missing bearer token").into_response(),
    }
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
    fn tokens_match_only_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
