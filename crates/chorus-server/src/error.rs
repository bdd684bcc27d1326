//! The one API error type: every failure the service answers, with its
//! status, JSON body and headers decided here and nowhere else.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chorus::kv::{CommandError, IdempotencyKey};
use chorus::log::LogError;
use chorus::runtime::{LogReadError, Unavailable, WriteError};
use serde_json::{Map, Value, json};

/// Seconds a client should wait before retrying a 503.
const RETRY_AFTER_SECS: u64 = 1;

/// An error answer: `{"error": "...", ...details}` with a status.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, one line.
    pub message: String,
    /// Extra fields of the JSON body.
    pub details: Map<String, Value>,
}

impl ApiError {
    /// An error with no extra fields.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            details: Map::new(),
        }
    }

    /// 400: the request is malformed.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404: no such key.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    /// 413: a body, key or value over its limit.
    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, message)
    }

    /// 503: the request's answer did not start within `timeout`.
    /// `admitted` is `None` for a request that cannot write, otherwise
    /// whether its record was handed to the runtime: once it was, the write
    /// may still commit, and a retry should carry a condition.
    pub fn request_timeout(timeout: Duration, admitted: Option<bool>) -> ApiError {
        let error = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("request timeout: timeout_ms={}", timeout.as_millis()),
        );
        match admitted {
            Some(admitted) => error.with("may_have_committed", admitted),
            None => error,
        }
    }

    /// 503: every place for an event stream is taken (see
    /// [`MemoryLimits::max_streams`](crate::limits::MemoryLimits::max_streams)).
    pub fn too_many_streams(max_streams: usize) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("too many streams: max_streams={max_streams}"),
        )
        .with("max_streams", max_streams)
    }

    /// 500: the record at `index` committed, but the machine could not
    /// decode it, so it applied as a no-op. Not worth retrying: the same
    /// request would append the same record.
    pub fn committed_unapplied(index: u64, error: impl std::fmt::Display) -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the service wrote a record it cannot apply: index={index} {error}"),
        )
        .with("index", index)
        .with("committed", true)
        .with("applied", false)
    }

    /// Adds a field to the body.
    pub fn with(mut self, name: &str, value: impl Into<Value>) -> ApiError {
        self.details.insert(name.to_owned(), value.into());
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = Map::new();
        body.insert("error".into(), Value::String(self.message));
        body.extend(self.details);
        let mut response = (self.status, axum::Json(Value::Object(body))).into_response();
        let headers = response.headers_mut();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<Unavailable> for ApiError {
    fn from(unavailable: Unavailable) -> ApiError {
        let error = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, unavailable.to_string());
        match unavailable {
            Unavailable::NotPrimary { role, primary } => {
                let error = error.with("role", role.as_str());
                match primary {
                    Some(primary) => error.with("primary", primary.as_str()),
                    None => error,
                }
            }
            Unavailable::LeaseUncertain => error.with("role", "primary"),
        }
    }
}

impl From<LogError> for ApiError {
    /// Refusals at admission appended nothing; a failure after it may have
    /// committed, and says so.
    fn from(error: LogError) -> ApiError {
        let status = match &error {
            LogError::RecordTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError::new(status, error.to_string())
            .with("may_have_committed", error.may_have_committed())
    }
}

impl From<LogReadError> for ApiError {
    /// Below the floor is 410 with the floor (re-read from there); anything
    /// else is the stores not answering, 503.
    fn from(error: LogReadError) -> ApiError {
        match error {
            LogReadError::Truncated { floor } => {
                ApiError::new(StatusCode::GONE, error.to_string()).with("floor", floor.0)
            }
            LogReadError::Unavailable { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, error.to_string())
            }
        }
    }
}

impl From<CommandError> for ApiError {
    fn from(error: CommandError) -> ApiError {
        match error {
            CommandError::InvalidKey { length } if length > 0 => {
                ApiError::too_large(error.to_string())
            }
            _ => ApiError::bad_request(error.to_string()),
        }
    }
}

impl<E: Into<ApiError>> From<WriteError<E>> for ApiError {
    fn from(error: WriteError<E>) -> ApiError {
        match error {
            WriteError::Rejected(rejected) => rejected.into(),
            WriteError::Unavailable(unavailable) => unavailable.into(),
            WriteError::Log(error) => error.into(),
        }
    }
}

/// 412: a condition on `key` did not hold; `current` is its version, its
/// `mod_revision` (`None`: absent). `appended` names the index of a record
/// that was appended anyway, when the conflict was with a write still in
/// flight at the check.
pub fn condition_failed(key: &[u8], current: Option<i64>, appended: Option<u64>) -> ApiError {
    let mut error = ApiError::new(StatusCode::PRECONDITION_FAILED, "condition failed");
    for (name, value) in crate::encoding::text_or_base64("key", key) {
        error = error.with(&name, value);
    }
    error = error.with("current_version", current.map_or(Value::Null, Value::from));
    if let Some(index) = appended {
        error = error.with("index", index);
    }
    error
}

/// 422: the idempotency key `key` is remembered for a different request
/// (another route, key, body or condition), applied at `original`.
pub fn key_reused(key: &IdempotencyKey, original: u64) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency key reused for a different request",
    )
    .with("idempotency_key", key.as_str())
    .with("original_index", original)
}

/// The JSON body of an error response whose handler wrote none (a route
/// miss, a body limit, a timeout): `{"error": "<reason phrase>"}`.
pub fn reason_body(status: StatusCode) -> Value {
    json!({ "error": status.canonical_reason().unwrap_or("error").to_lowercase() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chorus::lease::HolderId;
    use chorus::log::StopReason;
    use chorus::runtime::Role;

    fn body(error: ApiError) -> (StatusCode, Option<String>, Value) {
        let response = error.into_response();
        let status = response.status();
        let retry = response
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_owned());
        let bytes =
            futures::executor::block_on(axum::body::to_bytes(response.into_body(), 1 << 20))
                .unwrap();
        (status, retry, serde_json::from_slice(&bytes).unwrap())
    }

    #[test]
    fn every_error_maps_to_its_status_and_a_json_body() {
        let holder = HolderId::new("http://a:1").unwrap();
        let cases: Vec<(ApiError, StatusCode, Value)> = vec![
            (
                ApiError::bad_request("x"),
                StatusCode::BAD_REQUEST,
                json!({"error": "x"}),
            ),
            (
                ApiError::not_found("x"),
                StatusCode::NOT_FOUND,
                json!({"error": "x"}),
            ),
            (
                Unavailable::NotPrimary {
                    role: Role::Standby,
                    primary: Some(holder),
                }
                .into(),
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "not the primary: role=standby", "role": "standby", "primary": "http://a:1"}),
            ),
            (
                Unavailable::LeaseUncertain.into(),
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": Unavailable::LeaseUncertain.to_string(), "role": "primary"}),
            ),
            (
                LogError::RecordTooLarge { bytes: 9, max: 8 }.into(),
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({"error": "record too large: bytes=9 max_record_bytes=8", "may_have_committed": false}),
            ),
            (
                LogError::Backpressure {
                    bytes: 1,
                    records: 2,
                }
                .into(),
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "backpressure: in-flight budget full: bytes=1 records=2", "may_have_committed": false}),
            ),
            (
                LogError::Stopped {
                    reason: StopReason::Aborted,
                    may_have_committed: true,
                }
                .into(),
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "writer stopped: aborted", "may_have_committed": true}),
            ),
            (
                LogReadError::Truncated {
                    floor: chorus::ids::RecordIndex(7),
                }
                .into(),
                StatusCode::GONE,
                json!({"error": "log truncated: requested index below floor=7", "floor": 7}),
            ),
            (
                LogReadError::Unavailable {
                    reason: "no quorum".into(),
                }
                .into(),
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "log unavailable: no quorum"}),
            ),
            (
                CommandError::InvalidKey { length: 0 }.into(),
                StatusCode::BAD_REQUEST,
                json!({"error": CommandError::InvalidKey { length: 0 }.to_string()}),
            ),
            (
                CommandError::InvalidKey { length: 2000 }.into(),
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({"error": CommandError::InvalidKey { length: 2000 }.to_string()}),
            ),
            (
                ApiError::request_timeout(Duration::from_secs(2), None),
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "request timeout: timeout_ms=2000"}),
            ),
            (
                ApiError::request_timeout(Duration::from_millis(1500), Some(false)),
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "request timeout: timeout_ms=1500", "may_have_committed": false}),
            ),
            (
                ApiError::request_timeout(Duration::from_secs(1), Some(true)),
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "request timeout: timeout_ms=1000", "may_have_committed": true}),
            ),
            (
                ApiError::too_many_streams(256),
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "too many streams: max_streams=256", "max_streams": 256}),
            ),
            (
                ApiError::committed_unapplied(12, "bad tag"),
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({
                    "error": "the service wrote a record it cannot apply: index=12 bad tag",
                    "index": 12,
                    "committed": true,
                    "applied": false,
                }),
            ),
            (
                condition_failed(b"k", Some(3), None),
                StatusCode::PRECONDITION_FAILED,
                json!({"error": "condition failed", "key": "k", "current_version": 3}),
            ),
            (
                key_reused(&IdempotencyKey::new("op-1").unwrap(), 4),
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({"error": "idempotency key reused for a different request", "idempotency_key": "op-1", "original_index": 4}),
            ),
            (
                CommandError::InvalidIdempotencyKey { length: 0 }.into(),
                StatusCode::BAD_REQUEST,
                json!({"error": CommandError::InvalidIdempotencyKey { length: 0 }.to_string()}),
            ),
            (
                condition_failed(&[0xff], None, Some(9)),
                StatusCode::PRECONDITION_FAILED,
                json!({"error": "condition failed", "key_b64": "/w==", "current_version": null, "index": 9}),
            ),
        ];
        for (error, status, expected) in cases {
            let (found_status, retry, found) = body(error);
            assert_eq!((found_status, &found), (status, &expected));
            assert_eq!(
                retry.is_some(),
                status == StatusCode::SERVICE_UNAVAILABLE,
                "{found}"
            );
        }
    }

    #[test]
    fn a_write_error_maps_through_its_cause() {
        let rejected: WriteError<CommandError> =
            WriteError::Rejected(CommandError::InvalidKey { length: 0 });
        assert_eq!(ApiError::from(rejected).status, StatusCode::BAD_REQUEST);
        let unavailable: WriteError<CommandError> =
            WriteError::Unavailable(Unavailable::LeaseUncertain);
        assert_eq!(
            ApiError::from(unavailable).status,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
