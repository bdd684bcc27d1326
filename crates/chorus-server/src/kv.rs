//! `/v1/kv`: put, get, delete, list and batch on the key-value machine.
//! Handlers parse, call the runtime once, and map the result.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use chorus::ids::RecordIndex;
use chorus::kv::{Applied, Command, Condition, Entry, KvState, Operation};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::deadline::admitting;
use crate::encoding::{Utf8Query, cursor, field_bytes, insert_bytes, parse_cursor, prefix_bytes};
use crate::error::{ApiError, condition_failed};
use crate::{AppState, INDEX_HEADER, body_bytes};

/// Most items one list page returns.
pub const MAX_LIST_LIMIT: usize = 1000;
/// Items a list page returns when `limit` is not given.
const DEFAULT_LIST_LIMIT: usize = 100;
/// The key `GET /v1/kv/watch` takes from the key route: refused there in
/// every spelling, so `/v1/kv/wat%63h` cannot reach it either.
pub const RESERVED_KEY: &str = "watch";

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
    prefix: Option<String>,
    prefix_b64: Option<String>,
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
    let key = Bytes::from(path_key(key)?);
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
    let key = Bytes::from(path_key(key)?);
    let index = write(&app, Command::Single(Operation::Delete { key, condition })).await?;
    Ok(written(index))
}

/// `GET /v1/kv/{key}`: the raw value, its version as `ETag`.
pub async fn get(
    State(app): State<Arc<AppState>>,
    Path(key): Path<String>,
    Query(query): Query<ReadQuery>,
) -> Result<Response, ApiError> {
    let key = path_key(key)?;
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

/// `/v1/kv/` (any method): the empty key is malformed, not a missing route.
pub async fn empty_key() -> ApiError {
    ApiError::bad_request("empty key: the key is the rest of the path after /v1/kv/")
}

/// The key a path names, refused when it is the reserved key.
fn path_key(key: String) -> Result<String, ApiError> {
    if key == RESERVED_KEY {
        return Err(ApiError::bad_request(format!(
            "reserved key: key={RESERVED_KEY} is the watch route; use the batch and the list for it"
        )));
    }
    Ok(key)
}

/// `GET /v1/kv?prefix=&limit=&after=`: a page of keys in order.
pub async fn list(
    State(app): State<Arc<AppState>>,
    Utf8Query(query): Utf8Query<ListQuery>,
) -> Result<Response, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_LIST_LIMIT);
    if !(1..=MAX_LIST_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit: {limit} is outside 1..={MAX_LIST_LIMIT}"
        )));
    }
    let after = query.after.as_deref().map(parse_cursor).transpose()?;
    let prefix = prefix_bytes(query.prefix, query.prefix_b64)?;
    // Only the copy runs under the state lock (keys and values are `Bytes`:
    // a clone is a reference count); rendering up to a page of values into
    // JSON there would stall every apply and `/readyz` meanwhile.
    let ((page, more), applied) = read(&app, query.consistency, |state| {
        let (page, more) = state.list(&prefix, after.as_deref(), limit);
        let page: Vec<(Bytes, Entry)> = page
            .into_iter()
            .map(|(key, entry)| (key.clone(), entry.clone()))
            .collect();
        (page, more)
    })?;
    let next = more
        .then(|| page.last().map(|(key, _)| cursor(key)))
        .flatten();
    let items: Vec<Value> = page
        .iter()
        .map(|(key, entry)| list_item(key, entry))
        .collect();
    let body = json!({ "items": items, "next": next, "index": applied.0 });
    Ok(([(INDEX_HEADER, HeaderValue::from(applied.0))], Json(body)).into_response())
}

/// One item of a list page: `{"key", "value", "version"}`.
fn list_item(key: &[u8], entry: &Entry) -> Value {
    let mut item = Map::new();
    insert_bytes(&mut item, "key", key);
    insert_bytes(&mut item, "value", &entry.value);
    item.insert("version".into(), entry.version.0.into());
    Value::Object(item)
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
            Ok(()) => Ok(admitting(record)),
            Err(Applied::ConditionFailed { key, current }) => Err(Refused::Condition {
                key,
                current: current.map(|version| version.0),
            }),
            Err(other) => unreachable!("check reports only conditions, found {other:?}"),
        })
        .await?;
    match written.output {
        Applied::Done => Ok(written.index.0),
        Applied::ConditionFailed { key, current } => Err(condition_failed(
            &key,
            current.map(|version| version.0),
            Some(written.index.0),
        )),
        Applied::Malformed(error) => {
            let error = ApiError::committed_unapplied(written.index.0, error);
            tracing::error!(message = %error.message);
            Err(error)
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

/// `If-Match: "N"` (compare-and-set) or `If-None-Match: *` (create). Each
/// at most once: a second header is a list, and lists are refused.
fn condition(headers: &HeaderMap) -> Result<Condition, ApiError> {
    let if_match = single_header(headers, header::IF_MATCH)?;
    let if_none_match = single_header(headers, header::IF_NONE_MATCH)?;
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

/// The value of `name`, refused when the header is given more than once.
fn single_header(
    headers: &HeaderMap,
    name: header::HeaderName,
) -> Result<Option<&HeaderValue>, ApiError> {
    let mut values = headers.get_all(&name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(ApiError::bad_request(format!(
            "{name}: give one version, in one header"
        )));
    }
    Ok(first)
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
    use axum::http::StatusCode;

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
            vec![("if-match", "\"1\", \"2\"")],
        ] {
            let error = condition(&headers(&bad)).unwrap_err();
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{bad:?}");
        }
        // A second header is the same list as two versions in one.
        for name in [header::IF_MATCH, header::IF_NONE_MATCH] {
            let mut twice = HeaderMap::new();
            twice.append(&name, HeaderValue::from_static("\"1\""));
            twice.append(&name, HeaderValue::from_static("*"));
            let error = condition(&twice).unwrap_err();
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{name}");
        }
    }

    #[test]
    fn the_reserved_key_is_refused_in_the_key_route() {
        assert_eq!(path_key("watch/1".into()).unwrap(), "watch/1");
        assert_eq!(path_key("a".into()).unwrap(), "a");
        let error = path_key(RESERVED_KEY.into()).unwrap_err();
        assert_eq!(error.status, StatusCode::BAD_REQUEST);
        assert!(error.message.contains("key=watch"), "{}", error.message);
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
