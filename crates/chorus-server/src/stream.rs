//! Streams resumable by index: `GET /v1/kv/watch` (changes to keys, from the
//! runtime's in-memory history) and `GET /v1/log` (committed records, read
//! from the log's replicas), both as server-sent events with the record
//! index as the event id; and `POST /v1/log` to append a raw record.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use chorus::ids::RecordIndex;
use chorus::kv::{Applied, Command, KvState, Operation};
use chorus::log::{LogError, Reader};
use chorus::runtime::{Change, HistoryGap};
use futures::Stream;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::encoding::insert_bytes;
use crate::error::ApiError;
use crate::{AppState, body_bytes};

/// Changes fetched from the history per round.
const WATCH_BATCH: usize = 256;
/// How often a caught-up log follower polls when nothing was applied here.
const FOLLOW_POLL: Duration = Duration::from_millis(200);
/// Most records one `GET /v1/log` page returns.
pub const MAX_LOG_LIMIT: usize = 10_000;

/// Query of `GET /v1/kv/watch`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    #[serde(default)]
    prefix: String,
    /// First index to report (inclusive); default: the next one applied.
    from: Option<u64>,
}

/// `GET /v1/kv/watch?prefix=&from=`: every applied put and delete of a key
/// under `prefix`, from index `from` on. A client resumes with `from` (or
/// `Last-Event-ID`) = last id + 1; an index the history no longer holds is
/// `410 Gone`: re-list, then watch from the list's index.
pub async fn watch(
    State(app): State<Arc<AppState>>,
    Query(query): Query<WatchQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let from = match resume_index(query.from, &headers)? {
        Some(from) => from,
        None => *app.runtime.applied().borrow(),
    };
    app.runtime.changes_since(from, 0).map_err(gone)?;
    let watcher = Watcher {
        app: Arc::clone(&app),
        prefix: Bytes::from(query.prefix),
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
    Ok(sse(events))
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
            match self.app.runtime.changes_since(self.next, WATCH_BATCH) {
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

/// The events of one applied record: its puts and deletes under `prefix`.
/// An operation that changed nothing (a delete of an absent key) is no event.
fn change_events(change: &Change<Applied>, prefix: &[u8]) -> Vec<Event> {
    let Applied::Done { unchanged } = &change.output else {
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
            operation.key().starts_with(prefix) && !unchanged.contains(position)
        })
        .map(|(_, operation)| {
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
/// Reads committed records from the replicas, on any role.
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
        return Ok(follow(app, reader));
    }
    let limit = query.limit.unwrap_or(1000);
    if !(1..=MAX_LOG_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit: {limit} is outside 1..={MAX_LOG_LIMIT}"
        )));
    }
    let mut records = Vec::new();
    while records.len() < limit {
        match reader.try_next().await.map_err(log_read_error)? {
            Some((index, record)) => records.push(record_json(index, &record)),
            None => break,
        }
    }
    let body = json!({ "records": records, "next": reader.position().0 });
    Ok(Json(body).into_response())
}

/// Committed records as events, polling the log while caught up.
fn follow(app: Arc<AppState>, reader: Reader) -> Response {
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
    sse(events)
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
        .write(|_: &KvState| Ok::<_, ApiError>(record))
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
