//! Checks of a request's framing before any handler reads it: an HTTP/1.1
//! request must name its `Host`, and a body announced over the limit is
//! refused before it is read (so a client that sent `Expect: 100-continue`
//! is answered 413 at once, never invited to upload it).

use axum::http::{Version, header};

use crate::error::ApiError;

/// Why `request` is refused before its body is read, if it is: 400 for an
/// HTTP/1.1 request without `Host` (RFC 9112 §3.2), 413 for a
/// `Content-Length` over `max_body_bytes`.
pub fn framing_error<B>(
    request: &axum::http::Request<B>,
    max_body_bytes: usize,
) -> Option<ApiError> {
    if request.version() == Version::HTTP_11 && !request.headers().contains_key(header::HOST) {
        return Some(ApiError::bad_request(
            "missing host header: an HTTP/1.1 request must carry one",
        ));
    }
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok());
    match announced {
        Some(length) if length > max_body_bytes as u64 => Some(ApiError::too_large(format!(
            "request body too large: content_length={length} max_body_bytes={max_body_bytes}"
        ))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    fn request(version: Version, headers: &[(&str, &str)]) -> axum::http::Request<()> {
        let mut builder = axum::http::Request::builder()
            .uri("/v1/kv/a")
            .version(version);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn framing_is_checked_before_the_body_is_read() {
        let status = |version, headers: &[(&str, &str)]| {
            framing_error(&request(version, headers), 100).map(|error| error.status)
        };
        assert_eq!(status(Version::HTTP_11, &[("host", "x")]), None);
        assert_eq!(status(Version::HTTP_11, &[]), Some(StatusCode::BAD_REQUEST));
        // HTTP/1.0 has no Host requirement.
        assert_eq!(status(Version::HTTP_10, &[]), None);
        assert_eq!(
            status(
                Version::HTTP_11,
                &[("host", "x"), ("content-length", "100")]
            ),
            None
        );
        assert_eq!(
            status(
                Version::HTTP_11,
                &[("host", "x"), ("content-length", "101")]
            ),
            Some(StatusCode::PAYLOAD_TOO_LARGE)
        );
    }
}
