//! What a service may learn about the log without reaching into it: a cached
//! view of the register and the replicas' health for status pages, the
//! truncation floor, and committed records from an index.
//!
//! A status page polled every 100 ms must not cost a register read and a
//! listing per replica each time: the view is refreshed at most once per
//! [`LOG_VIEW_MAX_AGE`], in the background, and a caller gets the newest one
//! with its age (only the very first call waits for a refresh).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::ids::{Epoch, RecordIndex, SegmentId};
use crate::log::layout::segment_prefix;
use crate::log::maintenance::Maintenance;
use crate::log::{LogError, LogStores, Reader};

/// How old a cached [`LogView`] may be before a call refreshes it.
pub const LOG_VIEW_MAX_AGE: Duration = Duration::from_secs(1);

/// How long a refresh waits for one replica's listing.
pub const REPLICA_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The register's view of the log and each replica's health, as of one
/// refresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogView {
    /// The register's name (URL and key).
    pub register: String,
    /// The highest epoch granted.
    pub epoch: Epoch,
    /// The truncation floor: the first index still retained.
    pub floor: RecordIndex,
    /// The first index of the active segment.
    pub tail_base: RecordIndex,
    /// Entries of the sealed directory (tombstones included).
    pub directory_entries: usize,
    /// Replicas an append needs.
    pub quorum: usize,
    /// Each replica, in the register's order.
    pub replicas: Vec<ReplicaHealth>,
}

/// One replica as a refresh found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaHealth {
    /// The replica's identity (its URL).
    pub replica: String,
    /// Fragments it holds in the active segment, or why it did not answer.
    pub tail_fragments: Result<usize, String>,
    /// How many fewer than the fullest replica (0 when it did not answer).
    pub lag_fragments: usize,
}

/// The newest view (or why the newest refresh failed) and its age.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The view, or the error of the refresh that failed.
    pub view: Result<LogView, String>,
    /// How long ago the refresh finished.
    pub age: Duration,
}

/// Why committed records could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogReadError {
    /// The index asked for lies below the truncation floor.
    #[error("log truncated: requested index below floor={floor}")]
    Truncated {
        /// The first index still retained.
        floor: RecordIndex,
    },
    /// The stores did not answer as needed; retrying later may succeed.
    #[error("log unavailable: {reason}")]
    Unavailable {
        /// What failed.
        reason: String,
    },
}

impl From<LogError> for LogReadError {
    fn from(error: LogError) -> LogReadError {
        match error {
            LogError::Truncated { floor, .. } => LogReadError::Truncated { floor },
            other => LogReadError::Unavailable {
                reason: other.to_string(),
            },
        }
    }
}

/// Committed records from an index on, read from the replicas.
#[derive(Debug)]
pub struct LogReader {
    reader: Reader,
}

impl LogReader {
    pub(super) fn new(stores: &LogStores, from: RecordIndex) -> LogReader {
        LogReader {
            reader: Reader::new(stores, from),
        }
    }

    /// The next committed record, or `None` when caught up (poll again later).
    pub async fn try_next(&mut self) -> Result<Option<(RecordIndex, Bytes)>, LogReadError> {
        Ok(self.reader.try_next().await?)
    }

    /// The index of the next record this reader returns.
    pub fn position(&self) -> RecordIndex {
        self.reader.position()
    }

    /// Whether it holds records not yet returned, and with them their
    /// fragment or their whole sealed segment (up to `max_segment_bytes`).
    pub fn holds_records(&self) -> bool {
        self.reader.buffered_records() > 0
    }
}

/// The cache behind [`Runtime::log_view`](super::Runtime::log_view).
///
/// A refresh runs in a task of its own and stores its result there, so a
/// caller whose future is dropped (a client that hung up, a request timeout
/// shorter than a slow listing) cancels nothing: callers that wait for the
/// first view wait for that task's answer, never for each other.
#[derive(Debug)]
pub(super) struct LogViewCache {
    /// The newest view and when its refresh finished; `None` until the first.
    newest: watch::Sender<Option<Refreshed>>,
    /// Set while a refresh task runs, so at most one runs at a time.
    refreshing: Arc<AtomicBool>,
}

/// One refresh's outcome and when it finished.
type Refreshed = (Result<LogView, String>, Instant);

impl Default for LogViewCache {
    fn default() -> LogViewCache {
        LogViewCache {
            newest: watch::Sender::new(None),
            refreshing: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl LogViewCache {
    /// The newest view: a fresh one as is, a stale one with a refresh
    /// started in the background, and before the first refresh finished,
    /// that refresh's answer once it has one.
    pub(super) async fn get(&self, stores: &LogStores) -> Observed {
        if self.newest.borrow().as_ref().is_none_or(is_stale) {
            self.start_refresh(stores);
        }
        let mut newest = self.newest.subscribe();
        let refreshed = match newest.wait_for(Option::is_some).await {
            Ok(newest) => newest.clone(),
            // Unreachable while `self` holds the sender; said, not panicked.
            Err(_) => None,
        };
        match refreshed {
            Some((view, at)) => Observed {
                view,
                age: at.elapsed(),
            },
            None => Observed {
                view: Err("log view cache closed".to_owned()),
                age: Duration::ZERO,
            },
        }
    }

    /// Spawns a refresh unless one is running or the newest view became
    /// fresh meanwhile: at most one refresh per [`LOG_VIEW_MAX_AGE`].
    fn start_refresh(&self, stores: &LogStores) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let slot = RefreshSlot {
            newest: self.newest.clone(),
            refreshing: Arc::clone(&self.refreshing),
        };
        // Checked again while holding the slot: a refresh that finished
        // between the caller's look and the swap above is fresh enough.
        if !self.newest.borrow().as_ref().is_none_or(is_stale) {
            return;
        }
        let stores = stores.clone();
        tokio::spawn(async move {
            let view = observe(&stores).await.map_err(|e| e.to_string());
            slot.newest.send_replace(Some((view, Instant::now())));
        });
    }
}

fn is_stale((_, at): &Refreshed) -> bool {
    at.elapsed() >= LOG_VIEW_MAX_AGE
}

/// The right to run the one refresh, released when the refresh task ends
/// however it ends (finished, panicked, or dropped with the tokio runtime):
/// a refresh that stored nothing leaves an error for the first callers
/// rather than leaving them waiting.
struct RefreshSlot {
    newest: watch::Sender<Option<Refreshed>>,
    refreshing: Arc<AtomicBool>,
}

impl Drop for RefreshSlot {
    fn drop(&mut self) {
        self.newest.send_if_modified(|newest| {
            let first = newest.is_none();
            if first {
                let reason = "the log view refresh ended without an answer".to_owned();
                *newest = Some((Err(reason), Instant::now()));
            }
            first
        });
        self.refreshing.store(false, Ordering::Release);
    }
}

/// One register read and one listing of the active segment per replica.
async fn observe(stores: &LogStores) -> Result<LogView, LogError> {
    let manifest = Maintenance::new(stores).manifest().await?;
    Ok(LogView {
        register: stores.register.name().to_owned(),
        epoch: manifest.epoch,
        floor: manifest.trunc,
        tail_base: manifest.tail_base,
        directory_entries: manifest.segments.len(),
        quorum: manifest.quorum(),
        replicas: replica_health(stores, manifest.tail).await,
    })
}

/// Per replica: whether it answers a listing of the active segment, how many
/// fragments it holds there, and how many fewer than the fullest replica.
async fn replica_health(stores: &LogStores, tail: SegmentId) -> Vec<ReplicaHealth> {
    let prefix = segment_prefix(tail);
    let listings = futures::future::join_all(stores.replicas.iter().map(|(_, store)| {
        let prefix = prefix.clone();
        async move {
            match tokio::time::timeout(REPLICA_CHECK_TIMEOUT, store.list(&prefix)).await {
                Ok(Ok(objects)) => Ok(objects.len()),
                Ok(Err(error)) => Err(error.to_string()),
                Err(_) => Err(format!("no answer within {REPLICA_CHECK_TIMEOUT:?}")),
            }
        }
    }))
    .await;
    let fullest = listings.iter().flatten().max().copied().unwrap_or(0);
    stores
        .replicas
        .iter()
        .zip(listings)
        .map(|((identity, _), tail_fragments)| ReplicaHealth {
            replica: identity.to_string(),
            lag_fragments: tail_fragments.as_ref().map_or(0, |count| fullest - count),
            tail_fragments,
        })
        .collect()
}

/// The truncation floor, read from the register now.
pub(super) async fn floor(stores: &LogStores) -> Result<RecordIndex, LogReadError> {
    Ok(Maintenance::new(stores).manifest().await?.trunc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_errors_keep_the_floor_and_name_the_rest() {
        let truncated = LogError::Truncated {
            requested: RecordIndex(3),
            floor: RecordIndex(9),
        };
        assert_eq!(
            LogReadError::from(truncated),
            LogReadError::Truncated {
                floor: RecordIndex(9)
            }
        );
        let other = LogReadError::from(LogError::Transition("register not initialized".into()));
        assert!(
            matches!(&other, LogReadError::Unavailable { reason } if reason.contains("register not initialized")),
            "{other}"
        );
    }
}
