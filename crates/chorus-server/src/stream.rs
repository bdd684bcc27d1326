//! Resumable streams: `GET /v1/kv/watch` (changes to keys, from the
//! runtime's in-memory history; event id `<revision>.<position>`, the store
//! revision the change was written at and the operation's position in its
//! record) and `GET /v1/log` (committed records, read from the log's
//! replicas; event id = the record index), both as server-sent events; and
//! `POST /v1/log` to append a raw record.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use chorus::ids::RecordIndex;
use chorus::kv::{
    Applied, Body, Command, IdempotencyKey, KvState, MAX_BATCH_OPERATIONS, Operation, Outcome,
    Record, Revision,
};
use chorus::runtime::{Change, LogReader, RevisionGap};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::{OwnedSemaphorePermit, watch};

use crate::deadline::admitting;
use crate::encoding::{Utf8Query, insert_bytes, prefix_bytes};
use crate::error::ApiError;
use crate::limits::{held_body, page_has_room};
use crate::{AppState, body_bytes, kv};

/// Changes fetched from the history per round.
const WATCH_BATCH: usize = 256;
/// Record bytes fetched from the history per round (exceeded by less than
/// one record). A round's changes are rendered into events at once, so this
/// plus one record, rendered, bounds what a watcher that stopped reading
/// holds.
pub const WATCH_BATCH_BYTES: usize = 256 << 10;
/// How often a caught-up log follower polls when nothing was applied here.
const FOLLOW_POLL: Duration = Duration::from_millis(200);
/// Most records one `GET /v1/log` page returns.
pub const MAX_LOG_LIMIT: usize = 10_000;

/// Query of `GET /v1/kv/watch`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    prefix: Option<String>,
    prefix_b64: Option<String>,
    /// First store revision to report (inclusive); default: the next one
    /// written.
    from: Option<u64>,
}

/// `GET /v1/kv/watch?prefix=&from=`: every applied put and delete of a key
/// under `prefix` written through this API, from store revision `from` on.
/// A client resumes with `Last-Event-ID` = the last event's id, which
/// continues right after that event even in the middle of a batch (or with
/// `from` = a revision); a revision the history no longer holds is `410
/// Gone`: re-list, then watch from the list's revision + 1.
pub async fn watch(
    State(app): State<Arc<AppState>>,
    Utf8Query(query): Utf8Query<WatchQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let prefix = prefix_bytes(query.prefix, query.prefix_b64)?;
    let resume = resume_watch(query.from, &headers)?;
    let from = match resume {
        Some(resume) => resume.revision,
        None => app.runtime.read_stale(|state| state.revision()).0 as u64 + 1,
    };
    app.runtime
        .changes_from_revision(from, 0, 0)
        .map_err(gone)?;
    let place = app.permits.stream()?;
    let watcher = Watcher {
        app: Arc::clone(&app),
        prefix,
        next: from,
        seen: resume.and_then(WatchResume::seen),
        ready: VecDeque::new(),
        applied: app.runtime.applied(),
        shutdown: app.shutdown.clone(),
        ended: false,
    };
    let events = futures::stream::unfold(watcher, |mut watcher| async move {
        let event = watcher.next_event().await?;
        Some((Ok::<_, Infallible>(event), watcher))
    });
    Ok(sse(holding(place, events)))
}

/// The state of one watch stream.
struct Watcher {
    app: Arc<AppState>,
    prefix: Bytes,
    /// The next revision to report.
    next: u64,
    /// Events a resumed client already has: at revision `.0`, the
    /// operations up to position `.1`.
    seen: Option<(u64, usize)>,
    ready: VecDeque<Event>,
    applied: watch::Receiver<RecordIndex>,
    shutdown: watch::Receiver<bool>,
    ended: bool,
}

impl Watcher {
    /// The next event, waiting for changes; `None` ends the stream.
    async fn next_event(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(event);
            }
            if self.ended || *self.shutdown.borrow() {
                return None;
            }
            match self.batch() {
                Ok(changes) if changes.is_empty() => {
                    tokio::select! {
                        changed = self.applied.changed() => if changed.is_err() { return None },
                        _ = self.shutdown.changed() => return None,
                    }
                }
                Ok(changes) => {
                    // Records after the last at its revision changed nothing.
                    self.next = changes.last().expect("non-empty").revision + 1;
                    for change in &changes {
                        let seen = self
                            .seen
                            .filter(|(revision, _)| *revision == change.revision)
                            .map(|(_, position)| position);
                        self.ready.extend(change_events(change, &self.prefix, seen));
                    }
                    self.seen = None;
                }
                Err(gap) => {
                    self.ended = true;
                    let body = json!({"error": gap.to_string(), "oldest": gap.oldest});
                    return Some(Event::default().event("error").data(body.to_string()));
                }
            }
        }
    }
}

impl Watcher {
    /// The next round's changes, within [`WATCH_BATCH`] and
    /// [`WATCH_BATCH_BYTES`].
    fn batch(&self) -> Result<Vec<Change<Applied>>, RevisionGap> {
        let runtime = &self.app.runtime;
        runtime.changes_from_revision(self.next, WATCH_BATCH, WATCH_BATCH_BYTES)
    }
}

/// The events of one applied record: its puts and deletes under `prefix`,
/// after position `seen` if given (a client resumed there). An operation
/// that changed nothing (a delete of an absent key) is no event, so every
/// event's revision is the one its record wrote.
fn change_events(change: &Change<Applied>, prefix: &[u8], seen: Option<usize>) -> Vec<Event> {
    let Applied::Done {
        unchanged,
        revision,
    } = &change.output
    else {
        return Vec::new();
    };
    let Ok(command) = Command::decode(&change.record) else {
        return Vec::new();
    };
    command
        .operations()
        .iter()
        .enumerate()
        .filter(|(position, operation)| {
            operation.key().starts_with(prefix)
                && !unchanged.contains(position)
                && seen.is_none_or(|seen| *position > seen)
        })
        .map(|(position, operation)| {
            let mut body = Map::new();
            body.insert("revision".into(), (*revision).into());
            body.insert("index".into(), change.index.0.into());
            body.insert("position".into(), position.into());
            let kind = match operation {
                Operation::Put { key, value, .. } => {
                    insert_bytes(&mut body, "key", key);
                    insert_bytes(&mut body, "value", value);
                    "put"
                }
                Operation::Delete { key, .. } => {
                    insert_bytes(&mut body, "key", key);
                    "delete"
                }
            };
            body.insert("op".into(), kind.into());
            Event::default()
                .id(WatchResume::event_id(*revision, position))
                .event(kind)
                .data(Value::Object(body).to_string())
        })
        .collect()
}

/// Query of `GET /v1/log`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    /// First index (inclusive); default: the truncation floor.
    from: Option<u64>,
    /// Most records in a page (not with `follow`).
    limit: Option<usize>,
    /// Stream records as server-sent events as they commit.
    #[serde(default)]
    follow: bool,
}

/// `GET /v1/log?from=&limit=` (a JSON page) or `?from=&follow=true` (events).
/// Reads committed records from the replicas, on any role. A page holds at
/// most `limit` records and stops once its JSON reaches
/// [`MemoryLimits::log_page_bytes`](crate::limits::MemoryLimits), so a
/// client continues from `next` until a page comes back empty; at most
/// `max_log_pages` pages are built and sent at once, the others wait.
pub async fn read_log(
    State(app): State<Arc<AppState>>,
    Query(query): Query<LogQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let from = match resume_index(query.from, &headers)? {
        Some(from) => from,
        None => app.runtime.log_floor().await?,
    };
    let mut reader = app.runtime.log_reader(from);
    if query.follow {
        if query.limit.is_some() {
            return Err(ApiError::bad_request("limit does not go with follow"));
        }
        let place = app.permits.stream()?;
        return Ok(follow(app, reader, place));
    }
    let limit = query.limit.unwrap_or(1000);
    if !(1..=MAX_LOG_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit: {limit} is outside 1..={MAX_LOG_LIMIT}"
        )));
    }
    let place = app.permits.log_page().await;
    let mut page = LogPage::new();
    let max_bytes = app.permits.limits().log_page_bytes;
    while page_has_room(page.records, page.body.len(), limit, max_bytes) {
        match reader.try_next().await? {
            Some((index, record)) => page.push(index, &record),
            None => break,
        }
    }
    // The reader's buffer (up to a sealed segment) goes before the page is sent.
    let next = reader.position();
    drop(reader);
    Ok(page.finish(next, place))
}

/// A `GET /v1/log` page being rendered: `{"records": [...], "next": N}`,
/// written record by record so that its size is known as it grows.
struct LogPage {
    body: Vec<u8>,
    records: usize,
}

impl LogPage {
    const OPEN: &'static [u8] = br#"{"records":["#;

    fn new() -> LogPage {
        LogPage {
            body: LogPage::OPEN.to_vec(),
            records: 0,
        }
    }

    fn push(&mut self, index: RecordIndex, record: &[u8]) {
        if self.records > 0 {
            self.body.push(b',');
        }
        serde_json::to_writer(&mut self.body, &record_json(index, record))
            .expect("a JSON value renders into a Vec");
        self.records += 1;
    }

    /// The page as a response whose body holds `place` until it was sent.
    fn finish(mut self, next: RecordIndex, place: OwnedSemaphorePermit) -> Response {
        self.body
            .extend_from_slice(format!(r#"],"next":{}}}"#, next.0).as_bytes());
        (
            [(header::CONTENT_TYPE, "application/json")],
            held_body(self.body, place),
        )
            .into_response()
    }
}

/// `events`, holding `place` until the stream is dropped: when it ended
/// and was sent, or its connection closed.
fn holding<S: Stream>(place: OwnedSemaphorePermit, events: S) -> impl Stream<Item = S::Item> {
    events.map(move |event| {
        let _held = &place;
        event
    })
}

/// Committed records as events, polling the log while caught up.
fn follow(app: Arc<AppState>, reader: LogReader, place: OwnedSemaphorePermit) -> Response {
    let follower = Follower {
        applied: app.runtime.applied(),
        shutdown: app.shutdown.clone(),
        app,
        reader,
        slot: None,
        ended: false,
    };
    let events = futures::stream::unfold(follower, |mut follower| async move {
        let event = follower.next_event().await?;
        Some((Ok::<_, Infallible>(event), follower))
    });
    sse(holding(place, events))
}

/// The state of one `follow` stream.
struct Follower {
    app: Arc<AppState>,
    reader: LogReader,
    /// A reader slot ([`Permits::follow_reader`](crate::limits::Permits)),
    /// held from before the reader reads until it holds no record: a reader
    /// may hold a whole sealed segment, and the slots bound how many do.
    slot: Option<OwnedSemaphorePermit>,
    applied: watch::Receiver<RecordIndex>,
    shutdown: watch::Receiver<bool>,
    ended: bool,
}

impl Follower {
    /// The next event, waiting for records; `None` ends the stream.
    async fn next_event(&mut self) -> Option<Event> {
        loop {
            if self.ended || *self.shutdown.borrow() {
                return None;
            }
            if self.slot.is_none() {
                self.slot = tokio::select! {
                    slot = self.app.permits.follow_reader() => Some(slot),
                    _ = self.shutdown.changed() => return None,
                };
            }
            let next = self.reader.try_next().await;
            let event = match next {
                Ok(Some((index, record))) => Some(
                    Event::default()
                        .id(index.0.to_string())
                        .data(record_json(index, &record).to_string()),
                ),
                Ok(None) => None,
                Err(error) => {
                    self.ended = true;
                    let body = ApiError::from(error);
                    let data = json!({"error": body.message, "details": body.details});
                    Some(Event::default().event("error").data(data.to_string()))
                }
            };
            if !self.reader.holds_records() {
                self.slot = None;
            }
            if event.is_some() {
                return event;
            }
            tokio::select! {
                _ = self.applied.changed() => {}
                _ = self.shutdown.changed() => {}
                _ = tokio::time::sleep(FOLLOW_POLL) => {}
            }
        }
    }
}

/// `POST /v1/log`: appends the body as one raw record → `{"index": N}`.
/// The key-value machine applies records that are not its own as no-ops,
/// and a body it would read as its own is refused (`refuse_machine_record`).
/// With an `Idempotency-Key`, the body travels as the payload of a stamped
/// key-value record (so the machine remembers the key), and a retry is
/// answered the original index.
pub async fn append_log(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let key = kv::idempotency_key(&headers)?;
    let record = body_bytes(body)?;
    refuse_machine_record(&record)?;
    if let Some(key) = key {
        let answered = kv::submit(&app, Body::Raw(record), Some(key)).await?;
        if !matches!(answered.outcome, Outcome::Done { .. }) {
            let message = format!("a raw append answered {:?}", answered.outcome);
            return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message));
        }
        let mut response = Json(json!({ "index": answered.index.0 })).into_response();
        if answered.replayed {
            kv::mark_replayed(&mut response);
        }
        return Ok(response);
    }
    // The body is usually a slice of the connection's read buffer, which the
    // runtime's history would keep alive with the record: a copy of its own.
    let record = Bytes::copy_from_slice(&record);
    let written = app
        .runtime
        .write(|_: &KvState| Ok::<_, ApiError>(admitting(record)))
        .await?;
    Ok(Json(json!({ "index": written.index.0 })).into_response())
}

/// `422` for a raw record the key-value machine would read as one of its
/// own: appended as is, it would apply as a key-value write with the
/// sender's keys, values, time and retention (changing keys, evicting or
/// pre-registering idempotency keys). The machine reads a record as its own
/// only if it begins with its prefix (`Record::decode` checks that first, a
/// property test in the codec defends it), so the prefix alone decides,
/// whatever follows: a format only a later build reads is refused today.
/// Refused with a key too, so that one body is accepted or refused whatever
/// the headers.
fn refuse_machine_record(record: &[u8]) -> Result<(), ApiError> {
    if !Record::is_reserved(record) {
        return Ok(());
    }
    let prefix = String::from_utf8_lossy(Record::PREFIX);
    let message = format!(
        "reserved record: a raw record cannot be appended: it begins with {prefix:?}, the \
         prefix of the key-value machine's own records, so it would apply as a key-value \
         write; write keys through /v1/kv, or change the record's first bytes"
    );
    Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, message).with("reserved_prefix", prefix))
}

/// A record as JSON: its index and bytes, and for a key-value record that
/// carries an idempotency key, the key (and the payload of a raw append).
fn record_json(index: RecordIndex, record: &[u8]) -> Value {
    let mut body = Map::new();
    body.insert("index".into(), index.0.into());
    insert_bytes(&mut body, "data", record);
    if let Some((key, payload)) = stamped(record) {
        body.insert("idempotency_key".into(), key.as_str().into());
        if let Some(payload) = payload {
            insert_bytes(&mut body, "payload", &payload);
        }
    }
    Value::Object(body)
}

/// The idempotency key of a stamped key-value record, and its payload if
/// it is a raw append.
fn stamped(record: &[u8]) -> Option<(IdempotencyKey, Option<Bytes>)> {
    // Only a stamped record (format 2, or 3 since byte budgets) is worth
    // decoding.
    if !(record.starts_with(b"CHKV\x02") || record.starts_with(b"CHKV\x03")) {
        return None;
    }
    let decoded = Record::decode(record).ok()?;
    let payload = match decoded.body {
        Body::Raw(payload) => Some(payload),
        Body::Command(_) | Body::Etcd(_) => None,
    };
    Some((decoded.stamp?.key, payload))
}

fn gone(gap: RevisionGap) -> ApiError {
    ApiError::new(
        StatusCode::GONE,
        format!("{gap}: re-list, then watch from the list's revision + 1"),
    )
    .with("oldest", gap.oldest)
}

/// Where a log stream starts: `from`, else the record after `Last-Event-ID`,
/// else `None` (the route's default).
fn resume_index(from: Option<u64>, headers: &HeaderMap) -> Result<Option<RecordIndex>, ApiError> {
    if let Some(from) = from {
        return Ok(Some(RecordIndex(from)));
    }
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let malformed = || ApiError::bad_request("Last-Event-ID: expected an index");
    let last = value
        .to_str()
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok());
    let last = last.ok_or_else(malformed)?;
    next_index(last).map(Some)
}

/// The record after `last`; none follows the largest index.
fn next_index(last: u64) -> Result<RecordIndex, ApiError> {
    last.checked_add(1).map(RecordIndex).ok_or_else(|| {
        ApiError::bad_request(format!("Last-Event-ID: no record follows index={last}"))
    })
}

/// Where a watch resumes: at store revision `revision`, after the
/// operation at `after_position` in it when given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WatchResume {
    revision: u64,
    after_position: Option<usize>,
}

impl WatchResume {
    /// A watch event's id: `<revision>.<position>`.
    fn event_id(revision: Revision, position: usize) -> String {
        format!("{revision}.{position}")
    }

    /// What a client that resumes here already has: `(revision, position)`.
    fn seen(self) -> Option<(u64, usize)> {
        self.after_position
            .map(|position| (self.revision, position))
    }

    /// Parses a `Last-Event-ID`: a watch event id `<revision>.<position>`
    /// continues after that operation; a bare revision continues at the
    /// next one.
    fn after_event(text: &str) -> Result<WatchResume, ApiError> {
        let malformed = || {
            ApiError::bad_request(format!(
                "Last-Event-ID: expected <revision>.<position> or <revision>: found={text:?}"
            ))
        };
        let (revision, position) = match text.trim().split_once('.') {
            Some((revision, position)) => (revision, Some(position)),
            None => (text.trim(), None),
        };
        let revision: u64 = parse_digits(revision).ok_or_else(malformed)?;
        let Some(position) = position else {
            let next = revision.checked_add(1).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "Last-Event-ID: no revision follows revision={revision}"
                ))
            })?;
            return Ok(WatchResume {
                revision: next,
                after_position: None,
            });
        };
        let position: usize = parse_digits(position).ok_or_else(malformed)?;
        if position >= MAX_BATCH_OPERATIONS {
            return Err(ApiError::bad_request(format!(
                "Last-Event-ID: position={position} max_position={}",
                MAX_BATCH_OPERATIONS - 1
            )));
        }
        Ok(WatchResume {
            revision,
            after_position: Some(position),
        })
    }
}

/// Decimal digits only (no sign, no spaces) as a number.
fn parse_digits<T: std::str::FromStr>(text: &str) -> Option<T> {
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Where a watch starts: `from` (a revision), else right after the event
/// `Last-Event-ID` names, else `None` (the next change).
fn resume_watch(from: Option<u64>, headers: &HeaderMap) -> Result<Option<WatchResume>, ApiError> {
    if let Some(from) = from {
        return Ok(Some(WatchResume {
            revision: from,
            after_position: None,
        }));
    }
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .map_err(|_| ApiError::bad_request("Last-Event-ID: not text"))?;
    WatchResume::after_event(text).map(Some)
}

fn sse(events: impl Stream<Item = Result<Event, Infallible>> + Send + 'static) -> Response {
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_event_id(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("last-event-id", value.parse().unwrap());
        headers
    }

    fn resume(revision: u64, after_position: Option<usize>) -> Option<WatchResume> {
        Some(WatchResume {
            revision,
            after_position,
        })
    }

    #[test]
    fn a_watch_resumes_right_after_the_last_event_even_inside_a_batch() {
        let resumed = |value: &str| resume_watch(None, &last_event_id(value));
        assert_eq!(resumed("7.0").unwrap(), resume(7, Some(0)));
        assert_eq!(resumed(" 7.1023 ").unwrap(), resume(7, Some(1023)));
        // A bare revision: every event of it was delivered.
        assert_eq!(resumed("7").unwrap(), resume(8, None));
        // `from` names a record and wins over the header.
        assert_eq!(
            resume_watch(Some(3), &last_event_id("7.2")).unwrap(),
            resume(3, None)
        );
        assert_eq!(resume_watch(None, &HeaderMap::new()).unwrap(), None);
        assert_eq!(WatchResume::event_id(7, 2), "7.2", "the id a resume parses");
        for bad in [
            "",
            "x",
            "7.",
            ".1",
            "7.x",
            "7.1.2",
            "-1",
            "+7",
            "7.-1",
            "7.1024",
            "18446744073709551615",
            "18446744073709551616.0",
        ] {
            let error = resumed(bad).unwrap_err();
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{bad:?}");
        }
        // The last revision itself, as a watch id, is a position in it.
        assert_eq!(
            resumed("18446744073709551615.0").unwrap(),
            resume(u64::MAX, Some(0))
        );
    }

    #[test]
    fn a_log_stream_resumes_at_the_next_index_without_overflow() {
        assert_eq!(
            resume_index(None, &last_event_id("41")).unwrap(),
            Some(RecordIndex(42))
        );
        let error = resume_index(None, &last_event_id("18446744073709551615")).unwrap_err();
        assert_eq!(error.status, StatusCode::BAD_REQUEST);
        assert!(
            error.message.contains("index=18446744073709551615"),
            "{}",
            error.message
        );
        assert_eq!(
            resume_index(Some(5), &last_event_id("x")).unwrap(),
            Some(RecordIndex(5))
        );
    }

    use crate::limits::{MemoryLimits, Permits};

    /// Renders `records` into one page the way `read_log` does, under a
    /// budget of `max_bytes`; returns the parsed page and its body size.
    fn page_of(records: &[Vec<u8>], max_bytes: usize) -> (Value, usize) {
        let permits = Permits::new(MemoryLimits::default(), 64 << 20);
        let place = futures::executor::block_on(permits.log_page());
        let mut page = LogPage::new();
        let mut next = RecordIndex(0);
        for record in records {
            if !page_has_room(page.records, page.body.len(), MAX_LOG_LIMIT, max_bytes) {
                break;
            }
            page.push(next, record);
            next = RecordIndex(next.0 + 1);
        }
        let response = page.finish(next, place);
        let bytes =
            futures::executor::block_on(axum::body::to_bytes(response.into_body(), 1 << 30))
                .unwrap();
        (serde_json::from_slice(&bytes).unwrap(), bytes.len())
    }

    #[test]
    fn a_page_is_cut_by_its_rendered_bytes_and_says_where_to_continue() {
        // Not UTF-8, so rendered as base64: 4 bytes per 3.
        let records = vec![vec![0xff; 3000]; 10];
        let (page, bytes) = page_of(&records, 10_000);
        let rendered = page["records"].as_array().unwrap();
        assert_eq!(
            rendered.len(),
            3,
            "4,000 bytes each: the third reaches 10,000"
        );
        assert_eq!(page["next"], 3);
        assert_eq!(rendered[2]["index"], 2);
        assert_eq!(rendered[0]["data_b64"].as_str().unwrap().len(), 4000);
        assert!(
            bytes < 10_000 + 4100,
            "over the budget by less than a record"
        );
        let (page, _) = page_of(&records, usize::MAX);
        assert_eq!(page["records"].as_array().unwrap().len(), 10);
        assert_eq!(page["next"], 10);
        let (page, _) = page_of(&records, 1);
        assert_eq!(
            page["records"].as_array().unwrap().len(),
            1,
            "one always fits"
        );
        let (page, _) = page_of(&[], 1);
        assert_eq!(page, json!({"records": [], "next": 0}));
    }
}
