//! `/v1/kv`: put, get, delete, list and batch on the key-value machine.
//! Handlers parse, call the runtime once, and map the result.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use chorus::ids::RecordIndex;
use chorus::kv::{Applied, Command, Condition, KvState, Operation};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::encoding::{cursor, field_bytes, insert_bytes, parse_cursor};
use crate::error::{ApiError, condition_failed};
use crate::{AppState, INDEX_HEADER, body_bytes};

/// Most items one list page returns.
pub const MAX_LIST_LIMIT: usize = 1000;
/// Items a list page returns when `limit` is not given.
const DEFAULT_LIST_LIMIT: usize = 100;

/// Which state a read may see.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Consistency {
    /// Every acknowledged write (primary only).
    #[default]
    Strong,
    /// Whatever this process applied (any role), with the index it reflects.
    Stale,
}

/// Query of a single-key read.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadQuery {
    #[serde(default)]
    consistency: Consistency,
}

/// Query of a list.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    prefix: String,
    limit: Option<usize>,
    after: Option<String>,
    #[serde(default)]
    consistency: Consistency,
}

/// Why a write was refused before appending.
enum Refused {
    Condition { key: Bytes, current: Option<u64> },
}

impl From<Refused> for ApiError {
    fn from(refused: Refused) -> ApiError {
        match refused {
            Refused::Condition { key, current } => condition_failed(&key, current, None),
        }
    }
}

/// `PUT /v1/kv/{key}`: the body is the value.
pub async fn put(
    State(app): State<Arc<AppState>>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let value = body_bytes(body)?;
    let condition = condition(&headers)?;
    let key = Bytes::from(key);
    let index = write(
        &app,
        Command::Single(Operation::Put {
            key,
            value,
            condition,
        }),
    )
    .await?;
    Ok(written(index))
}

/// `DELETE /v1/kv/{key}`.
pub async fn delete(
    State(app): State<Arc<AppState>>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let condition = condition(&headers)?;
    let key = Bytes::from(key);
    let index = write(&app, Command::Single(Operation::Delete { key, condition })).await?;
    Ok(written(index))
}

/// `GET /v1/kv/{key}`: the raw value, its version as `ETag`.
pub async fn get(
    State(app): State<Arc<AppState>>,
    Path(key): Path<String>,
    Query(query): Query<ReadQuery>,
) -> Result<Response, ApiError> {
    let (entry, applied) = read(&app, query.consistency, |state| {
        state.get(key.as_bytes()).cloned()
    })?;
    let Some(entry) = entry else {
        return Err(ApiError::not_found("no such key").with("key", key));
    };
    let mut response = entry.value.into_response();
    let headers = response.headers_mut();
    headers.insert(header::ETAG, etag(entry.version));
    headers.insert(INDEX_HEADER, HeaderValue::from(applied.0));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(response)
}

/// `GET /v1/kv?prefix=&limit=&after=`: a page of keys in order.
pub async fn list(
    State(app): State<Arc<AppState>>,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_LIST_LIMIT);
    if !(1..=MAX_LIST_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit: {limit} is outside 1..={MAX_LIST_LIMIT}"
        )));
    }
    let after = query.after.as_deref().map(parse_cursor).transpose()?;
    let prefix = query.prefix.as_bytes();
    let ((items, next), applied) = read(&app, query.consistency, |state| {
        let (page, more) = state.list(prefix, after.as_deref(), limit);
        let next = more
            .then(|| page.last().map(|(key, _)| cursor(key)))
            .flatten();
        let items: Vec<Value> = page
            .into_iter()
            .map(|(key, entry)| {
                let mut item = Map::new();
                insert_bytes(&mut item, "key", key);
                insert_bytes(&mut item, "value", &entry.value);
                item.insert("version".into(), entry.version.0.into());
                Value::Object(item)
            })
            .collect();
        (items, next)
    })?;
    let body = json!({ "items": items, "next": next, "index": applied.0 });
    Ok(([(INDEX_HEADER, HeaderValue::from(applied.0))], Json(body)).into_response())
}

/// One operation of a batch request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchOperation {
    op: BatchOp,
    key: Option<String>,
    key_b64: Option<String>,
    value: Option<String>,
    value_b64: Option<String>,
    /// Applies only if the key is at this version.
    if_version: Option<u64>,
    /// Applies only if the key does not exist.
    #[serde(default)]
    if_absent: bool,
}

/// A batch operation's kind.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum BatchOp {
    Put,
    Delete,
}

/// The body of `POST /v1/kv:batch`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    operations: Vec<BatchOperation>,
}

/// `POST /v1/kv:batch`: puts and deletes with per-key conditions, as one
/// record: all apply or none does.
pub async fn batch(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(body)?;
    let request: BatchRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("malformed batch: {e}")))?;
    let operations = request
        .operations
        .into_iter()
        .enumerate()
        .map(|(position, operation)| {
            batch_operation(operation).map_err(|e| e.with("operation", position))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let index = write(&app, Command::Batch(operations)).await?;
    Ok(written(index))
}

fn batch_operation(operation: BatchOperation) -> Result<Operation, ApiError> {
    let key = field_bytes("key", operation.key, operation.key_b64)?
        .ok_or_else(|| ApiError::bad_request("an operation needs key or key_b64"))?;
    let condition = match (operation.if_version, operation.if_absent) {
        (Some(_), true) => {
            return Err(ApiError::bad_request(
                "give if_version or if_absent, not both",
            ));
        }
        (Some(version), false) => Condition::Version(RecordIndex(version)),
        (None, true) => Condition::Absent,
        (None, false) => Condition::None,
    };
    let value = field_bytes("value", operation.value, operation.value_b64)?;
    match (operation.op, value) {
        (BatchOp::Put, Some(value)) => Ok(Operation::Put {
            key,
            value,
            condition,
        }),
        (BatchOp::Put, None) => Err(ApiError::bad_request("a put needs value or value_b64")),
        (BatchOp::Delete, None) => Ok(Operation::Delete { key, condition }),
        (BatchOp::Delete, Some(_)) => Err(ApiError::bad_request("a delete takes no value")),
    }
}

/// Appends `command` if its conditions hold against the applied state, and
/// answers once it is applied. A condition that a write still in flight
/// breaks is caught when the record applies: 412, with the index of the
/// (no-op) record.
async fn write(app: &AppState, command: Command) -> Result<u64, ApiError> {
    let record = command.encode()?;
    let written = app
        .runtime
        .write(|state: &KvState| match state.check(&command) {
            Ok(()) => Ok(record),
            Err(Applied::ConditionFailed { key, current }) => Err(Refused::Condition {
                key,
                current: current.map(|version| version.0),
            }),
            Err(other) => unreachable!("check reports only conditions, found {other:?}"),
        })
        .await?;
    match written.output {
        Applied::Done { .. } => Ok(written.index.0),
        Applied::ConditionFailed { key, current } => Err(condition_failed(
            &key,
            current.map(|version| version.0),
            Some(written.index.0),
        )),
        other @ (Applied::Malformed(_) | Applied::Duplicate { .. } | Applied::KeyReused { .. }) => {
            let message = format!("the service wrote a record it cannot apply: {other:?}");
            tracing::error!(index = written.index.0, %message);
            Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message))
        }
    }
}

/// Reads with the consistency asked for.
fn read<T>(
    app: &AppState,
    consistency: Consistency,
    read: impl FnOnce(&KvState) -> T,
) -> Result<(T, RecordIndex), ApiError> {
    match consistency {
        Consistency::Strong => Ok(app.runtime.read(read)?),
        Consistency::Stale => Ok(app.runtime.read_stale(read)),
    }
}

/// `If-Match: "N"` (compare-and-set) or `If-None-Match: *` (create).
fn condition(headers: &HeaderMap) -> Result<Condition, ApiError> {
    let if_match = headers.get(header::IF_MATCH);
    let if_none_match = headers.get(header::IF_NONE_MATCH);
    match (if_match, if_none_match) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "give If-Match or If-None-Match, not both",
        )),
        (Some(value), None) => {
            parse_etag(value).map(|version| Condition::Version(RecordIndex(version)))
        }
        (None, Some(value)) if value.as_bytes() == b"*" => Ok(Condition::Absent),
        (None, Some(_)) => Err(ApiError::bad_request("If-None-Match: only * is supported")),
        (None, None) => Ok(Condition::None),
    }
}

/// A version as an entity tag: `"N"`.
fn etag(version: RecordIndex) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{}\"", version.0))
        .expect("digits and quotes are a valid header")
}

fn parse_etag(value: &HeaderValue) -> Result<u64, ApiError> {
    let malformed = || ApiError::bad_request("If-Match: expected a version as \"N\"");
    let text = value.to_str().map_err(|_| malformed())?.trim();
    let digits = text
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
        .ok_or_else(malformed)?;
    digits.parse().map_err(|_| malformed())
}

/// `{"index": N}` with the new version as `ETag` and `X-Chorus-Index`.
fn written(index: u64) -> Response {
    let headers = [
        (header::ETAG, etag(RecordIndex(index))),
        (INDEX_HEADER, HeaderValue::from(index + 1)),
    ];
    (headers, Json(json!({ "index": index }))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn conditions_come_from_if_match_and_if_none_match() {
        assert_eq!(condition(&headers(&[])).unwrap(), Condition::None);
        assert_eq!(
            condition(&headers(&[("if-match", "\"7\"")])).unwrap(),
            Condition::Version(RecordIndex(7))
        );
        assert_eq!(
            condition(&headers(&[("if-none-match", "*")])).unwrap(),
            Condition::Absent
        );
        for bad in [
            vec![("if-match", "7")],
            vec![("if-match", "\"x\"")],
            vec![("if-none-match", "\"3\"")],
            vec![("if-match", "\"1\""), ("if-none-match", "*")],
        ] {
            let error = condition(&headers(&bad)).unwrap_err();
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{bad:?}");
        }
    }

    #[test]
    fn batch_operations_are_checked_field_by_field() {
        let parse = |json: Value| {
            let operation: BatchOperation = serde_json::from_value(json).unwrap();
            batch_operation(operation)
        };
        assert_eq!(
            parse(json!({"op": "put", "key": "a", "value": "1", "if_version": 4})).unwrap(),
            Operation::Put {
                key: Bytes::from_static(b"a"),
                value: Bytes::from_static(b"1"),
                condition: Condition::Version(RecordIndex(4)),
            }
        );
        assert_eq!(
            parse(json!({"op": "delete", "key_b64": "/w==", "if_absent": true})).unwrap(),
            Operation::Delete {
                key: Bytes::from_static(&[0xff]),
                condition: Condition::Absent,
            }
        );
        for bad in [
            json!({"op": "put", "key": "a"}),
            json!({"op": "delete", "key": "a", "value": "1"}),
            json!({"op": "put", "value": "1"}),
            json!({"op": "put", "key": "a", "value": "1", "if_version": 1, "if_absent": true}),
        ] {
            assert_eq!(
                parse(bad.clone()).unwrap_err().status,
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
    }
}
