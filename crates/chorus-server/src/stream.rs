//! Streams resumable by index: `GET /v1/kv/watch` (changes to keys, from the
//! runtime's in-memory history) and `GET /v1/log` (committed records, read
//! from the log's replicas), both as server-sent events with the record
//! index as the event id; and `POST /v1/log` to append a raw record.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use chorus::ids::RecordIndex;
use chorus::kv::{Applied, Command, KvState, Operation};
use chorus::log::{LogError, Reader};
use chorus::runtime::{Change, HistoryGap};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::{OwnedSemaphorePermit, watch};

use crate::deadline::admitting;
use crate::encoding::{Utf8Query, insert_bytes, prefix_bytes};
use crate::error::ApiError;
use crate::limits::{LOG_PAGE_CHUNK_BYTES, page_has_room};
use crate::{AppState, body_bytes};

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
    /// First index to report (inclusive); default: the next one applied.
    from: Option<u64>,
}

/// `GET /v1/kv/watch?prefix=&from=`: every applied put and delete of a key
/// under `prefix`, from index `from` on. A client resumes with `from` (or
/// `Last-Event-ID`) = last id + 1; an index the history no longer holds is
/// `410 Gone`: re-list, then watch from the list's index.
pub async fn watch(
    State(app): State<Arc<AppState>>,
    Utf8Query(query): Utf8Query<WatchQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let prefix = prefix_bytes(query.prefix, query.prefix_b64)?;
    let from = match resume_index(query.from, &headers)? {
        Some(from) => from,
        None => *app.runtime.applied().borrow(),
    };
    app.runtime.changes_since(from, 0).map_err(gone)?;
    let place = app.permits.stream()?;
    let watcher = Watcher {
        app: Arc::clone(&app),
        prefix,
        next: from,
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
    next: RecordIndex,
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
                    self.next = RecordIndex(changes.last().expect("non-empty").index.0 + 1);
                    self.ready
                        .extend(changes.iter().flat_map(|c| change_events(c, &self.prefix)));
                }
                Err(gap) => {
                    self.ended = true;
                    let body = json!({"error": gap.to_string(), "oldest": gap.oldest.0});
                    return Some(Event::default().event("error").data(body.to_string()));
                }
            }
        }
    }
}

impl Watcher {
    /// The next round's changes, within [`WATCH_BATCH`] and
    /// [`WATCH_BATCH_BYTES`].
    fn batch(&self) -> Result<Vec<Change<Applied>>, HistoryGap> {
        let runtime = &self.app.runtime;
        runtime.changes_within(self.next, WATCH_BATCH, WATCH_BATCH_BYTES)
    }
}

/// The events of one applied record: its puts and deletes under `prefix`.
fn change_events(change: &Change<Applied>, prefix: &[u8]) -> Vec<Event> {
    if change.output != Applied::Done {
        return Vec::new();
    }
    let Ok(command) = Command::decode(&change.record) else {
        return Vec::new();
    };
    command
        .operations()
        .iter()
        .filter(|operation| operation.key().starts_with(prefix))
        .map(|operation| {
            let mut body = Map::new();
            body.insert("index".into(), change.index.0.into());
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
                .id(change.index.0.to_string())
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
        None => floor(&app).await?,
    };
    let mut reader = Reader::new(&app.runtime.stores().log, from);
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
        match reader.try_next().await.map_err(log_read_error)? {
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
        let body = Bytes::from(self.body);
        let pieces: Vec<Bytes> = (0..body.len())
            .step_by(LOG_PAGE_CHUNK_BYTES)
            .map(|start| body.slice(start..body.len().min(start + LOG_PAGE_CHUNK_BYTES)))
            .collect();
        let pieces = holding(
            place,
            futures::stream::iter(pieces).map(Ok::<_, Infallible>),
        );
        (
            [(header::CONTENT_TYPE, "application/json")],
            Body::from_stream(pieces),
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
fn follow(app: Arc<AppState>, reader: Reader, place: OwnedSemaphorePermit) -> Response {
    let state = (reader, app.runtime.applied(), app.shutdown.clone(), false);
    let events = futures::stream::unfold(
        state,
        |(mut reader, mut applied, mut shutdown, ended)| async move {
            if ended {
                return None;
            }
            loop {
                if *shutdown.borrow() {
                    return None;
                }
                match reader.try_next().await {
                    Ok(Some((index, record))) => {
                        let event = Event::default()
                            .id(index.0.to_string())
                            .data(record_json(index, &record).to_string());
                        return Some((
                            Ok::<_, Infallible>(event),
                            (reader, applied, shutdown, false),
                        ));
                    }
                    Ok(None) => {
                        tokio::select! {
                            _ = applied.changed() => {}
                            _ = shutdown.changed() => {}
                            _ = tokio::time::sleep(FOLLOW_POLL) => {}
                        }
                    }
                    Err(error) => {
                        let body = log_read_error(error);
                        let data =
                            json!({"error": body.message, "details": body.details}).to_string();
                        let event = Event::default().event("error").data(data);
                        return Some((Ok(event), (reader, applied, shutdown, true)));
                    }
                }
            }
        },
    );
    sse(holding(place, events))
}

/// `POST /v1/log`: appends the body as one raw record → `{"index": N}`.
/// The key-value machine applies records that are not its commands as no-ops.
pub async fn append_log(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let record = body_bytes(body)?;
    let written = app
        .runtime
        .write(|_: &KvState| Ok::<_, ApiError>(admitting(record)))
        .await?;
    Ok(Json(json!({ "index": written.index.0 })).into_response())
}

fn record_json(index: RecordIndex, record: &[u8]) -> Value {
    let mut body = Map::new();
    body.insert("index".into(), index.0.into());
    insert_bytes(&mut body, "data", record);
    Value::Object(body)
}

async fn floor(app: &AppState) -> Result<RecordIndex, ApiError> {
    let maintenance = chorus::log::maintenance::Maintenance::new(&app.runtime.stores().log);
    let manifest = maintenance.manifest().await.map_err(log_read_error)?;
    Ok(manifest.trunc)
}

fn log_read_error(error: LogError) -> ApiError {
    match error {
        LogError::Truncated { floor, .. } => {
            ApiError::new(StatusCode::GONE, error.to_string()).with("floor", floor.0)
        }
        other => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, other.to_string()),
    }
}

fn gone(gap: HistoryGap) -> ApiError {
    ApiError::new(
        StatusCode::GONE,
        format!("{gap}: re-list, then watch from the list's index"),
    )
    .with("oldest", gap.oldest.0)
}

/// Where a stream starts: `from`, else the event after `Last-Event-ID`,
/// else `None` (the route's default).
fn resume_index(from: Option<u64>, headers: &HeaderMap) -> Result<Option<RecordIndex>, ApiError> {
    if let Some(from) = from {
        return Ok(Some(RecordIndex(from)));
    }
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().ok();
    text.and_then(|text| text.trim().parse::<u64>().ok())
        .map(|last| Some(RecordIndex(last + 1)))
        .ok_or_else(|| ApiError::bad_request("Last-Event-ID: expected an index"))
}

fn sse(events: impl Stream<Item = Result<Event, Infallible>> + Send + 'static) -> Response {
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{MemoryLimits, Permits};

    /// Renders `records` into one page the way `read_log` does, under a
    /// budget of `max_bytes`; returns the parsed page and its body size.
    fn page_of(records: &[Vec<u8>], max_bytes: usize) -> (Value, usize) {
        let permits = Permits::new(MemoryLimits::default());
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
