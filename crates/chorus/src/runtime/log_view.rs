//! What a service may learn about the log without reaching into it: a cached
//! view of the register and the replicas' health for status pages, the
//! truncation floor, and committed records from an index.
//!
//! A status page polled every 100 ms must not cost a register read and a
//! listing per replica each time: the view is refreshed at most once per
//! [`LOG_VIEW_MAX_AGE`], in the background, and a caller gets the newest one
//! with its age (only the very first call waits for a refresh).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
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
#[derive(Debug, Default)]
pub(super) struct LogViewCache {
    state: Mutex<CacheState>,
    /// Serializes refreshes, so concurrent callers share one.
    refreshing: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct CacheState {
    newest: Option<(Result<LogView, String>, Instant)>,
}

impl LogViewCache {
    /// The newest view: a fresh one as is, a stale one with a refresh
    /// started in the background, none yet after a refresh awaited here.
    pub(super) async fn get(self: &Arc<Self>, stores: &LogStores) -> Observed {
        let newest = self.state().newest.clone();
        match newest {
            Some((view, at)) => {
                if at.elapsed() >= LOG_VIEW_MAX_AGE {
                    let (cache, stores) = (Arc::clone(self), stores.clone());
                    tokio::spawn(async move { cache.refresh(&stores).await });
                }
                Observed {
                    view,
                    age: at.elapsed(),
                }
            }
            None => {
                self.refresh(stores).await;
                let (view, at) = self.state().newest.clone().expect("just refreshed");
                Observed {
                    view,
                    age: at.elapsed(),
                }
            }
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, CacheState> {
        self.state.lock().expect("log view cache poisoned")
    }

    /// Refreshes unless another refresh is running or one finished within
    /// the max age (callers that queued behind it share its result).
    async fn refresh(&self, stores: &LogStores) {
        let Ok(_only) = self.refreshing.try_lock() else {
            // One is running: wait for it rather than start another.
            let _wait = self.refreshing.lock().await;
            return;
        };
        let view = observe(stores).await.map_err(|e| e.to_string());
        self.state().newest = Some((view, Instant::now()));
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
