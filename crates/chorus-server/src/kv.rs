//! `/v1/kv`: put, get, delete, list and batch on the key-value machine.
//! Handlers parse, call the runtime once, and map the result.
//!
//! Every write takes an optional `Idempotency-Key`: the key travels in the
//! write's record, the machine remembers it with the request's digest and
//! outcome, and a retry with the key is answered that outcome again
//! (`Idempotent-Replayed: true`) without applying twice.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use chorus::ids::RecordIndex;
use chorus::kv::idempotency::{Lookup, RequestDigest};
use chorus::kv::mvcc::HISTORY_BUDGET_BYTES;
use chorus::kv::quota::NoSpace;
use chorus::kv::{
    Applied, Body, Command, Condition, Entry, IdempotencyKey, KvState, Operation, Outcome, Record,
    Revision, Stamp,
};
use chorus::runtime::WriteError;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::deadline::admitting;
use crate::encoding::{Utf8Query, cursor, field_bytes, insert_bytes, parse_cursor, prefix_bytes};
use crate::error::{ApiError, condition_failed, key_reused};
use crate::limits::{held_body, page_has_room};
use crate::{AppState, INDEX_HEADER, REVISION_HEADER, body_bytes};

/// The request header that makes a write exactly-once.
pub const IDEMPOTENCY_KEY_HEADER: HeaderName = HeaderName::from_static("idempotency-key");
/// The answer header of a write answered from a remembered idempotency key.
pub const IDEMPOTENT_REPLAYED_HEADER: HeaderName = HeaderName::from_static("idempotent-replayed");

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

/// Why a write was not appended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refused {
    /// A condition fails against the applied state (a write without a key).
    Condition {
        key: Bytes,
        current: Option<Revision>,
    },
    /// The key is remembered for this request: answer its outcome again.
    Replay {
        original: RecordIndex,
        outcome: Outcome,
    },
    /// The key is remembered for a different request.
    KeyReused {
        key: IdempotencyKey,
        original: RecordIndex,
    },
    /// The write adds data the space quota has no room for.
    NoSpace(NoSpace),
}

impl From<Refused> for ApiError {
    fn from(refused: Refused) -> ApiError {
        match refused {
            Refused::Condition { key, current } => condition_failed(&key, current, None),
            Refused::KeyReused { key, original } => key_reused(&key, original.0),
            Refused::NoSpace(refusal) => no_space(refusal),
            Refused::Replay { .. } => unreachable!("a replay is answered, not refused"),
        }
    }
}

/// `507` for a write the space quota refuses, with how to make room.
fn no_space(refusal: NoSpace) -> ApiError {
    let status = StatusCode::INSUFFICIENT_STORAGE;
    let room = format!(
        "delete keys, compact the history (through the etcd API; it also trims itself past \
         {} MiB) or raise --quota-backend-bytes",
        HISTORY_BUDGET_BYTES >> 20
    );
    match refusal {
        NoSpace::AlarmRaised => ApiError::new(
            status,
            format!(
                "space quota: the NOSPACE alarm is raised, so writes that add data are refused \
                 until it is disarmed through the etcd API (`etcdctl alarm disarm`); to make \
                 room, {room}"
            ),
        ),
        NoSpace::OverQuota { used, cost, quota } => ApiError::new(
            status,
            format!(
                "space quota: the state holds {used} bytes of keys, values and history, and \
                 this write adds {cost} against a quota of {quota}; to make room, {room}"
            ),
        )
        .with("used_bytes", used)
        .with("cost_bytes", cost)
        .with("quota_bytes", quota),
    }
}

/// How a write ended: where and with which outcome, and whether that is
/// the remembered outcome of an earlier request with the same key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answered {
    /// The index of the record that applied the write.
    pub(crate) index: RecordIndex,
    /// What it did.
    pub(crate) outcome: Outcome,
    /// Answered from the idempotency table: nothing applied this time.
    pub(crate) replayed: bool,
}

/// The `Idempotency-Key` header, if given: once, 1 to 255 printable ASCII
/// characters.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, ApiError> {
    let mut values = headers.get_all(&IDEMPOTENCY_KEY_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::bad_request("Idempotency-Key: give it once"));
    }
    IdempotencyKey::new(Bytes::copy_from_slice(value.as_bytes()))
        .map(Some)
        .map_err(|e| ApiError::bad_request(format!("Idempotency-Key: {e}")))
}

/// Whether to append a write, decided against the applied state. With a
/// key, a remembered key answers (same request) or refuses (another
/// request). A new write that adds data must fit the space quota (`quota`
/// bytes). A new keyed write is then appended even if a condition fails, so
/// its `412` is remembered too; without a key, a failed condition appends
/// nothing.
fn admit(
    state: &KvState,
    body: &Body,
    keyed: Option<(&IdempotencyKey, &RequestDigest)>,
    quota: usize,
) -> Result<(), Refused> {
    if let Some((key, digest)) = keyed {
        match state.idempotency().lookup(key, digest) {
            Lookup::New => {}
            Lookup::Same(remembered) => {
                return Err(Refused::Replay {
                    original: remembered.index,
                    outcome: remembered.outcome.clone(),
                });
            }
            Lookup::Different(remembered) => {
                return Err(Refused::KeyReused {
                    key: key.clone(),
                    original: remembered.index,
                });
            }
        }
    }
    let Body::Command(command) = body else {
        return Ok(());
    };
    state
        .check_space(command.quota_cost(), quota)
        .map_err(Refused::NoSpace)?;
    if keyed.is_some() {
        return Ok(());
    }
    match state.check(command) {
        Ok(()) => Ok(()),
        Err(Applied::ConditionFailed { key, current }) => Err(Refused::Condition { key, current }),
        Err(other) => unreachable!("check reports only conditions, found {other:?}"),
    }
}

/// How the machine's output for a written record answers its writer.
fn answer(
    index: RecordIndex,
    output: Applied,
    key: Option<&IdempotencyKey>,
) -> Result<Answered, ApiError> {
    let fresh = |outcome| Answered {
        index,
        outcome,
        replayed: false,
    };
    match output {
        Applied::Done { revision, .. } => Ok(fresh(Outcome::Done { revision })),
        Applied::ConditionFailed { key, current } => {
            Ok(fresh(Outcome::ConditionFailed { key, current }))
        }
        // A twin with the same key was appended first (a concurrent retry).
        Applied::Duplicate { original, outcome } => Ok(Answered {
            index: original,
            outcome,
            replayed: true,
        }),
        Applied::KeyReused { original } => match key {
            Some(key) => Err(key_reused(key, original.0)),
            None => unreachable!("only a stamped record reuses a key"),
        },
        Applied::Malformed(error) => {
            let error = ApiError::committed_unapplied(index.0, error);
            tracing::error!(message = %error.message);
            Err(error)
        }
        // The HTTP API appends no etcd request; an answer of one here means
        // the record at this index is not the one it wrote.
        Applied::Etcd(_) => Err(ApiError::committed_unapplied(
            index.0,
            "an etcd answer to an HTTP write",
        )),
    }
}

/// Appends `body`, stamped with `key` if given, once `admit` lets it, and
/// answers how it ended once it applied.
pub(crate) async fn submit(
    app: &AppState,
    body: Body,
    key: Option<IdempotencyKey>,
) -> Result<Answered, ApiError> {
    let stamp = key.map(|key| Stamp {
        key,
        // The primary's wall clock: the only time the machine ever sees.
        at_ms: app.runtime.wall_ms(),
        retention: app.config.idempotency,
    });
    let record = Record { stamp, body };
    let encoded = record.encode()?;
    let key = record.stamp.as_ref().map(|stamp| &stamp.key);
    // Only a keyed request is told apart from others by its digest.
    let digest = key.map(|_| record.digest()).transpose()?;
    let keyed = key.zip(digest.as_ref());
    let written = app
        .runtime
        .write(|state: &KvState| {
            admit(state, &record.body, keyed, app.config.quota_bytes).map(|()| admitting(encoded))
        })
        .await;
    let written = match written {
        Err(WriteError::Rejected(Refused::Replay { original, outcome })) => {
            return Ok(Answered {
                index: original,
                outcome,
                replayed: true,
            });
        }
        other => other.map_err(ApiError::from)?,
    };
    answer(written.index, written.output, key)
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
    let idempotency = idempotency_key(&headers)?;
    let key = Bytes::from(path_key(key)?);
    let command = Command::Single(Operation::Put {
        key,
        value,
        condition,
    });
    write(&app, command, idempotency).await
}

/// `DELETE /v1/kv/{key}`.
pub async fn delete(
    State(app): State<Arc<AppState>>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let condition = condition(&headers)?;
    let idempotency = idempotency_key(&headers)?;
    let key = Bytes::from(path_key(key)?);
    let command = Command::Single(Operation::Delete { key, condition });
    write(&app, command, idempotency).await
}

/// `GET /v1/kv/{key}`: the raw value, its version (`mod_revision`) as `ETag`.
pub async fn get(
    State(app): State<Arc<AppState>>,
    Path(key): Path<String>,
    Query(query): Query<ReadQuery>,
) -> Result<Response, ApiError> {
    let key = path_key(key)?;
    let ((entry, revision), applied) = read(&app, query.consistency, |state| {
        (state.get(key.as_bytes()).cloned(), state.revision())
    })?;
    let Some(entry) = entry else {
        return Err(ApiError::not_found("no such key").with("key", key));
    };
    let mut response = entry.value.into_response();
    let headers = response.headers_mut();
    headers.insert(header::ETAG, etag(entry.mod_revision));
    headers.insert(INDEX_HEADER, HeaderValue::from(applied.0));
    headers.insert(REVISION_HEADER, HeaderValue::from(revision));
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

/// `GET /v1/kv?prefix=&limit=&after=`: a page of keys in order, at most
/// `limit` items and cut once its JSON reaches
/// [`MemoryLimits::list_page_bytes`](crate::limits::MemoryLimits); `next`
/// (a cursor for `after`) is set whenever more may follow. At most
/// `max_list_pages` pages are built and sent at once, the others wait.
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
    let place = app.permits.list_page().await;
    let max_bytes = app.permits.limits().list_page_bytes;
    // Only the copy runs under the state lock; rendering up to a page of
    // values into JSON there would stall every apply and `/readyz`.
    let (copied, applied) = read(&app, query.consistency, |state| {
        copy_page(state, &prefix, after.as_deref(), limit, max_bytes)
    })?;
    let revision = copied.revision;
    let body = render_list(copied, applied, max_bytes);
    let headers = [
        (INDEX_HEADER, HeaderValue::from(applied.0)),
        (REVISION_HEADER, HeaderValue::from(revision)),
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        ),
    ];
    Ok((headers, held_body(body, place)).into_response())
}

/// The entries a list page may render, copied out of the state (keys and
/// values are `Bytes`: a copy is a reference count), and whether more
/// follow them.
#[derive(Debug)]
struct CopiedPage {
    entries: Vec<(Bytes, Entry)>,
    more: bool,
    /// The store revision the page reflects.
    revision: Revision,
}

/// Copies up to `limit` entries of the page, stopping once their raw bytes
/// reach `max_bytes`: an item renders into at least its raw bytes, so the
/// rendering stops at or before the end of the copy.
fn copy_page(
    state: &KvState,
    prefix: &[u8],
    after: Option<&[u8]>,
    limit: usize,
    max_bytes: usize,
) -> CopiedPage {
    let (page, more) = state.list(prefix, after, limit);
    let mut entries = Vec::new();
    let mut raw_bytes = 0;
    for (key, entry) in &page {
        if !page_has_room(entries.len(), raw_bytes, limit, max_bytes) {
            return CopiedPage {
                entries,
                more: true,
                revision: state.revision(),
            };
        }
        raw_bytes += key.len() + entry.value.len();
        entries.push(((*key).clone(), (*entry).clone()));
    }
    CopiedPage {
        entries,
        more,
        revision: state.revision(),
    }
}

/// A list page's JSON, `{"items": [...], "next": cursor, "index": N,
/// "revision": R}`,
/// rendered item by item until it reaches `max_bytes` (the first item
/// always goes in); `next` names the last item rendered when more follow.
fn render_list(page: CopiedPage, applied: RecordIndex, max_bytes: usize) -> Vec<u8> {
    let mut body = br#"{"items":["#.to_vec();
    let mut rendered = 0;
    for (key, entry) in &page.entries {
        if !page_has_room(rendered, body.len(), usize::MAX, max_bytes) {
            break;
        }
        if rendered > 0 {
            body.push(b',');
        }
        serde_json::to_writer(&mut body, &list_item(key, entry))
            .expect("a JSON value renders into a Vec");
        rendered += 1;
    }
    let more = page.more || rendered < page.entries.len();
    let next = more
        .then(|| page.entries[..rendered].last().map(|(key, _)| cursor(key)))
        .flatten();
    let end = format!(
        r#"],"next":{},"index":{},"revision":{}}}"#,
        json!(next),
        applied.0,
        page.revision
    );
    body.extend_from_slice(end.as_bytes());
    body
}

/// One item of a list page: `{"key", "value", "version"}`, the version
/// being the key's `mod_revision`.
fn list_item(key: &[u8], entry: &Entry) -> Value {
    let mut item = Map::new();
    insert_bytes(&mut item, "key", key);
    insert_bytes(&mut item, "value", &entry.value);
    item.insert("version".into(), entry.mod_revision.into());
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
    /// Applies only if the key exists at this version (`mod_revision`).
    if_version: Option<Revision>,
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
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let idempotency = idempotency_key(&headers)?;
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
    write(&app, Command::Batch(operations), idempotency).await
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
        (Some(version), false) if version < 0 => {
            return Err(ApiError::bad_request(format!(
                "if_version: {version} is not a version (versions are revisions, 1 or more)"
            )));
        }
        (Some(version), false) => Condition::ModRevision(version),
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

/// Appends `command` (see [`admit`] for when) and answers once it is
/// applied: `200` with its index and revision, or `412` for a condition that failed at
/// the record (with a key, or when a write still in flight at the check
/// broke it) carrying the index of the (no-op) record. A replay answers the
/// same, with `Idempotent-Replayed: true`.
async fn write(
    app: &AppState,
    command: Command,
    key: Option<IdempotencyKey>,
) -> Result<Response, ApiError> {
    let answered = submit(app, Body::Command(command), key).await?;
    let mut response = match answered.outcome {
        Outcome::Done { revision } => written(answered.index, revision),
        Outcome::ConditionFailed { key, current } => {
            condition_failed(&key, current, Some(answered.index.0)).into_response()
        }
    };
    if answered.replayed {
        mark_replayed(&mut response);
    }
    Ok(response)
}

/// Marks an answer as the remembered outcome of an earlier request.
pub(crate) fn mark_replayed(response: &mut Response) {
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED_HEADER, HeaderValue::from_static("true"));
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
        (Some(value), None) => parse_etag(value).map(Condition::ModRevision),
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

/// A version (a `mod_revision`) as an entity tag: `"N"`.
fn etag(version: Revision) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{version}\"")).expect("digits and quotes are a valid header")
}

/// The version of `If-Match: "N"`: decimal digits, at most `i64::MAX`.
fn parse_etag(value: &HeaderValue) -> Result<Revision, ApiError> {
    let malformed = || ApiError::bad_request("If-Match: expected a version as \"N\"");
    let text = value.to_str().map_err(|_| malformed())?.trim();
    let digits = text
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
        .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(malformed)?;
    digits.parse().map_err(|_| malformed())
}

/// `{"index": N, "revision": R}`: the record's index (and the next one as
/// `X-Chorus-Index`) and the store revision after it, which is the
/// written key's new version (`ETag`, `X-Chorus-Revision`).
fn written(index: RecordIndex, revision: Revision) -> Response {
    let headers = [
        (header::ETAG, etag(revision)),
        (INDEX_HEADER, HeaderValue::from(index.0 + 1)),
        (REVISION_HEADER, HeaderValue::from(revision)),
    ];
    let body = json!({ "index": index.0, "revision": revision });
    (headers, Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chorus::kv::quota::{DEFAULT_QUOTA_BYTES, put_cost};

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
            Condition::ModRevision(7)
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
            vec![("if-match", "\"-1\"")],
            vec![("if-match", "\"+1\"")],
            vec![("if-match", "\"9223372036854775808\"")],
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
    fn the_idempotency_key_header_is_checked() {
        assert_eq!(idempotency_key(&headers(&[])).unwrap(), None);
        let key = idempotency_key(&headers(&[("idempotency-key", "op-7f3a")])).unwrap();
        assert_eq!(key.unwrap().as_str(), "op-7f3a");
        let longest = "k".repeat(255);
        assert!(idempotency_key(&headers(&[("idempotency-key", &longest)])).is_ok());
        for bad in ["", "with space", "tab\tinside", &"k".repeat(256)] {
            let error = idempotency_key(&headers(&[("idempotency-key", bad)])).unwrap_err();
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{bad:?}");
            assert!(
                error.message.starts_with("Idempotency-Key: "),
                "{}",
                error.message
            );
        }
        let mut twice = headers(&[("idempotency-key", "a")]);
        twice.append("idempotency-key", HeaderValue::from_static("b"));
        assert_eq!(
            idempotency_key(&twice).unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
        let mut not_ascii = HeaderMap::new();
        not_ascii.insert(
            "idempotency-key",
            HeaderValue::from_bytes("clé".as_bytes()).unwrap(),
        );
        assert!(idempotency_key(&not_ascii).is_err());
    }

    fn stamped(state: &mut KvState, index: u64, body: &Body, key: &str) {
        let record = Record {
            stamp: Some(Stamp {
                key: IdempotencyKey::new(key.to_owned()).unwrap(),
                at_ms: 1,
                retention: Default::default(),
            }),
            body: body.clone(),
        };
        state.apply(RecordIndex(index), &record.encode().unwrap());
    }

    fn put_body(key: &str, condition: Condition) -> Body {
        Body::Command(Command::Single(Operation::Put {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::from_static(b"v"),
            condition,
        }))
    }

    fn digest(body: &Body) -> RequestDigest {
        Record {
            stamp: None,
            body: body.clone(),
        }
        .digest()
        .unwrap()
    }

    #[test]
    fn admission_answers_remembered_keys_and_checks_conditions_only_without_a_key() {
        let mut state = KvState::default();
        let first = put_body("a", Condition::None);
        stamped(&mut state, 0, &first, "k");
        let key = IdempotencyKey::new("k").unwrap();
        let other = IdempotencyKey::new("other").unwrap();
        // The same request with its key: answered, not appended.
        assert_eq!(
            admit(
                &state,
                &first,
                Some((&key, &digest(&first))),
                DEFAULT_QUOTA_BYTES
            ),
            Err(Refused::Replay {
                original: RecordIndex(0),
                outcome: Outcome::Done { revision: 2 }
            })
        );
        // Another request with the key: refused.
        let create = put_body("a", Condition::Absent);
        assert_eq!(
            admit(
                &state,
                &create,
                Some((&key, &digest(&create))),
                DEFAULT_QUOTA_BYTES
            ),
            Err(Refused::KeyReused {
                key: key.clone(),
                original: RecordIndex(0)
            })
        );
        // A failed condition: refused without a key, appended with a new one
        // (so that the 412 is remembered).
        assert_eq!(
            admit(&state, &create, None, DEFAULT_QUOTA_BYTES),
            Err(Refused::Condition {
                key: Bytes::from_static(b"a"),
                current: Some(2)
            })
        );
        assert_eq!(
            admit(
                &state,
                &create,
                Some((&other, &digest(&create))),
                DEFAULT_QUOTA_BYTES
            ),
            Ok(())
        );
        let raw = Body::Raw(Bytes::from_static(b"x"));
        assert_eq!(admit(&state, &raw, None, DEFAULT_QUOTA_BYTES), Ok(()));
        assert!(matches!(
            admit(
                &state,
                &raw,
                Some((&key, &digest(&raw))),
                DEFAULT_QUOTA_BYTES
            ),
            Err(Refused::KeyReused { .. })
        ));
    }

    #[test]
    fn admission_refuses_what_the_quota_has_no_room_for_but_answers_replays() {
        let mut state = KvState::default();
        let first = put_body("a", Condition::None);
        stamped(&mut state, 0, &first, "k");
        let key = IdempotencyKey::new("k").unwrap();
        let other = IdempotencyKey::new("other").unwrap();
        let quota = state.space_bytes() + 1;
        let refused = Err(Refused::NoSpace(NoSpace::OverQuota {
            used: state.space_bytes(),
            cost: put_cost(b"a", b"v"),
            quota,
        }));
        // Checked before conditions, with or without a key.
        let create = put_body("a", Condition::Absent);
        assert_eq!(admit(&state, &create, None, quota), refused);
        assert_eq!(
            admit(&state, &create, Some((&other, &digest(&create))), quota),
            refused
        );
        // A remembered request appends nothing: answered as before.
        assert!(matches!(
            admit(&state, &first, Some((&key, &digest(&first))), quota),
            Err(Refused::Replay { .. })
        ));
        // What adds nothing fits.
        let delete = Body::Command(Command::Single(Operation::Delete {
            key: Bytes::from_static(b"a"),
            condition: Condition::None,
        }));
        assert_eq!(admit(&state, &delete, None, quota), Ok(()));
        let raw = Body::Raw(Bytes::from_static(b"x"));
        assert_eq!(admit(&state, &raw, None, quota), Ok(()));
    }

    #[test]
    fn every_output_of_a_written_record_answers_its_writer() {
        let key = IdempotencyKey::new("k").unwrap();
        let at = RecordIndex(9);
        let fresh = |outcome| Answered {
            index: at,
            outcome,
            replayed: false,
        };
        let done = Outcome::Done { revision: 5 };
        assert_eq!(answer(at, Applied::done(5), None), Ok(fresh(done.clone())));
        let unchanged = Applied::Done {
            unchanged: vec![0],
            revision: 5,
        };
        assert_eq!(answer(at, unchanged, None), Ok(fresh(done)));
        let failed = Outcome::ConditionFailed {
            key: Bytes::from_static(b"a"),
            current: None,
        };
        let output = Applied::ConditionFailed {
            key: Bytes::from_static(b"a"),
            current: None,
        };
        assert_eq!(answer(at, output, Some(&key)), Ok(fresh(failed.clone())));
        let duplicate = Applied::Duplicate {
            original: RecordIndex(3),
            outcome: failed.clone(),
        };
        assert_eq!(
            answer(at, duplicate, Some(&key)),
            Ok(Answered {
                index: RecordIndex(3),
                outcome: failed,
                replayed: true
            })
        );
        let reused = Applied::KeyReused {
            original: RecordIndex(3),
        };
        let error = answer(at, reused, Some(&key)).unwrap_err();
        assert_eq!(error.status, StatusCode::UNPROCESSABLE_ENTITY);
        let malformed = Applied::Malformed(chorus::kv::CommandError::UnstampedRaw);
        let error = answer(at, malformed, None).unwrap_err();
        assert_eq!(error.status, StatusCode::INTERNAL_SERVER_ERROR);
    }

    /// A state of `count` keys `k00`, `k01`, … whose values are
    /// `value_bytes` bytes that are not UTF-8 (rendered as base64).
    fn state_with_values(count: usize, value_bytes: usize) -> KvState {
        let mut state = KvState::default();
        for number in 0..count {
            let record = Record {
                stamp: None,
                body: Body::Command(Command::Single(Operation::Put {
                    key: Bytes::from(format!("k{number:02}")),
                    value: Bytes::from(vec![0xff; value_bytes]),
                    condition: Condition::None,
                })),
            };
            state.apply(RecordIndex(number as u64), &record.encode().unwrap());
        }
        state
    }

    /// A list page as `list` renders it, parsed, and its size.
    fn list_page(
        state: &KvState,
        after: Option<&str>,
        limit: usize,
        max_bytes: usize,
    ) -> (Value, usize) {
        let after = after.map(|next| parse_cursor(next).unwrap());
        let copied = copy_page(state, b"", after.as_deref(), limit, max_bytes);
        let body = render_list(copied, RecordIndex(7), max_bytes);
        (serde_json::from_slice(&body).unwrap(), body.len())
    }

    fn keys(page: &Value) -> Vec<&str> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| item["key"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn a_list_page_is_cut_by_its_rendered_bytes_and_says_where_to_continue() {
        // 3,000 bytes each, rendered as 4,000 bytes of base64.
        let state = state_with_values(10, 3000);
        let (page, bytes) = list_page(&state, None, 1000, 10_000);
        assert_eq!(
            keys(&page),
            ["k00", "k01", "k02"],
            "the third reaches 10,000"
        );
        assert_eq!(page["next"], cursor(b"k02"));
        assert_eq!(page["index"], 7);
        // Versions and the page's revision are revisions, not indices.
        assert_eq!(page["revision"], 11);
        assert_eq!(page["items"][0]["version"], 2);
        assert!(
            bytes < 10_000 + 4100,
            "over the budget by less than an item"
        );
        // Walking on from `next` sees every key once.
        let mut walked = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let (page, _) = list_page(&state, after.as_deref(), 1000, 10_000);
            walked.extend(keys(&page).into_iter().map(str::to_owned));
            match page["next"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => break,
            }
        }
        let expected: Vec<String> = (0..10).map(|n| format!("k{n:02}")).collect();
        assert_eq!(walked, expected);
        // The count limit still cuts, and a page without a cut has no next.
        let (page, _) = list_page(&state, None, 2, usize::MAX);
        assert_eq!(keys(&page), ["k00", "k01"]);
        assert_eq!(page["next"], cursor(b"k01"));
        let (page, _) = list_page(&state, None, 1000, usize::MAX);
        assert_eq!(keys(&page).len(), 10);
        assert_eq!(page["next"], Value::Null);
        let (page, _) = list_page(&state, None, 1000, 1);
        assert_eq!(keys(&page), ["k00"], "one item always fits");
        let (page, _) = list_page(&state, Some(&cursor(b"k09")), 1000, 1);
        assert_eq!(
            page,
            json!({"items": [], "next": null, "index": 7, "revision": 11})
        );
    }

    #[test]
    fn a_list_copies_no_more_than_its_byte_budget_can_render() {
        let state = state_with_values(10, 3000);
        let copied = copy_page(&state, b"", None, 1000, 10_000);
        // 3,003 raw bytes each: the fourth reaches 10,000.
        assert_eq!(copied.entries.len(), 4);
        assert!(copied.more);
        let copied = copy_page(&state, b"", None, 1000, usize::MAX);
        assert_eq!(copied.entries.len(), 10);
        assert!(!copied.more);
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
                condition: Condition::ModRevision(4),
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
            json!({"op": "put", "key": "a", "value": "1", "if_version": -1}),
        ] {
            assert_eq!(
                parse(bad.clone()).unwrap_err().status,
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
    }
}
