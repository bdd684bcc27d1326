//! Errors of the log, in two tiers: the rich [`LogError`] for code and messages,
//! and the small [`ErrorKind`] that tells a caller what to do.

use std::sync::Arc;

use crate::blob::BlobError;
use crate::codec::CodecError;
use crate::ids::{Epoch, RecordIndex};
use crate::register::{ManifestError, RegisterError, TransformError};

use super::config::ConfigError;
use super::transitions::{EpochExhausted, Fenced};

/// What a caller should do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Transient or backpressure: try the same call again later.
    Retry,
    /// This writer is finished (fenced, poisoned, closed): recover a new one.
    Reopen,
    /// The request or configuration is wrong: fix it.
    FixInput,
    /// Data or storage is damaged or inconsistent: an operator must look.
    GiveUp,
}

/// Why a writer stopped accepting and completing appends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// A newer epoch recovered the log.
    Fenced(Fenced),
    /// Fewer than a quorum of replicas could keep up.
    Poisoned {
        /// Lanes still live.
        live: usize,
        /// Lanes needed.
        quorum: usize,
    },
    /// `shutdown` was called.
    Shutdown,
    /// `abort` was called, or the writer was dropped.
    Aborted,
    /// A register transition failed for good.
    Register(String),
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::Fenced(fenced) => write!(f, "{fenced}"),
            StopReason::Poisoned { live, quorum } => {
                write!(f, "poisoned: live_replicas={live} quorum={quorum}")
            }
            StopReason::Shutdown => f.write_str("shut down"),
            StopReason::Aborted => f.write_str("aborted"),
            StopReason::Register(error) => write!(f, "register failed: {error}"),
        }
    }
}

/// An error of the log layer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LogError {
    /// The record exceeds `max_record_bytes`. Consumes no index.
    #[error("record too large: bytes={bytes} max_record_bytes={max}")]
    RecordTooLarge {
        /// The record's size.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// In-flight byte or record budget exhausted. Consumes no index; retry.
    #[error("backpressure: in-flight budget full: bytes={bytes} records={records}")]
    Backpressure {
        /// Bytes in flight.
        bytes: u64,
        /// Records in flight.
        records: u64,
    },
    /// The active segment reached `max_active_segment_bytes` while the previous
    /// one is still being sealed. Consumes no index; retry.
    #[error("active segment full: bytes={bytes} max_active_segment_bytes={max}")]
    ActiveSegmentFull {
        /// Bytes in the active segment.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// The register's sealed directory has no room for another entry. Consumes
    /// no index; truncate the log, then retry.
    #[error("segment directory full: entries={entries} max_directory_bytes={max}")]
    SegmentDirectoryFull {
        /// Entries in the directory.
        entries: usize,
        /// The register's capacity.
        max: usize,
    },
    /// The writer no longer accepts appends, or stopped before this append was
    /// known durable. `may_have_committed` tells whether it may reappear in replay.
    #[error("writer stopped: {reason}")]
    Stopped {
        /// Why.
        reason: StopReason,
        /// Whether the append may still be durable (it was written to some replicas).
        may_have_committed: bool,
    },
    /// Fewer than a quorum of replicas could be fenced and read during recovery.
    #[error("no quorum: observed={observed} quorum={quorum}: {detail}")]
    NoQuorum {
        /// Replicas observed.
        observed: usize,
        /// Replicas needed.
        quorum: usize,
        /// The failures, one per unobserved replica.
        detail: String,
    },
    /// Replay was asked to start below the truncation floor (or past the end).
    #[error("invalid checkpoint: checkpoint={checkpoint} floor={floor} end={end}")]
    InvalidCheckpoint {
        /// The requested start.
        checkpoint: RecordIndex,
        /// The first retained index.
        floor: RecordIndex,
        /// The recovered end.
        end: RecordIndex,
    },
    /// `start` was called before the replay stream was consumed to its end.
    #[error("recovery incomplete: replay not consumed to end={end}")]
    RecoveryIncomplete {
        /// Where replay has to reach.
        end: RecordIndex,
    },
    /// A truncation floor below the committed one, or beyond the durable end.
    #[error("invalid truncation floor: requested={requested}: {reason}")]
    InvalidFloor {
        /// The floor asked for.
        requested: RecordIndex,
        /// Why it is refused.
        reason: String,
    },
    /// A reader asked for an index below the truncation floor.
    #[error("truncated: requested={requested} floor={floor}")]
    Truncated {
        /// The requested index.
        requested: RecordIndex,
        /// The first retained index.
        floor: RecordIndex,
    },
    /// This writer was fenced by a newer epoch (during recovery or later).
    #[error(transparent)]
    Fenced(#[from] Fenced),
    /// The configuration or the replica list is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The register is malformed or bound to other replicas.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// A register call failed.
    #[error("register: {0}")]
    Register(Arc<RegisterError>),
    /// The register could not be changed.
    #[error("register transition failed: {0}")]
    Transition(String),
    /// A store call failed.
    #[error(transparent)]
    Store(Arc<BlobError>),
    /// Stored data is damaged or inconsistent beyond what replication heals.
    #[error("corrupt data: {what}: {detail}")]
    Corrupt {
        /// Which object or position.
        what: String,
        /// What is wrong.
        detail: String,
    },
    /// The epoch space is exhausted.
    #[error(transparent)]
    EpochExhausted(#[from] EpochExhausted),
}

impl LogError {
    /// Whether an append that failed with this error may still be durable and
    /// reappear in replay (at-least-once). Admission errors never are.
    pub fn may_have_committed(&self) -> bool {
        match self {
            LogError::Stopped {
                may_have_committed, ..
            } => *may_have_committed,
            _ => false,
        }
    }

    /// What the caller should do.
    pub fn kind(&self) -> ErrorKind {
        match self {
            LogError::Backpressure { .. }
            | LogError::ActiveSegmentFull { .. }
            | LogError::SegmentDirectoryFull { .. }
            | LogError::NoQuorum { .. } => ErrorKind::Retry,
            LogError::Stopped { .. }
            | LogError::Fenced(_)
            | LogError::RecoveryIncomplete { .. } => ErrorKind::Reopen,
            LogError::RecordTooLarge { .. }
            | LogError::InvalidCheckpoint { .. }
            | LogError::InvalidFloor { .. }
            | LogError::Truncated { .. }
            | LogError::Config(_) => ErrorKind::FixInput,
            LogError::Register(error) if error.is_transient() => ErrorKind::Retry,
            LogError::Store(error) if error.is_transient() => ErrorKind::Retry,
            LogError::Manifest(_)
            | LogError::Register(_)
            | LogError::Transition(_)
            | LogError::Store(_)
            | LogError::Corrupt { .. }
            | LogError::EpochExhausted(_) => ErrorKind::GiveUp,
        }
    }

    pub(crate) fn corrupt(what: impl Into<String>, detail: impl std::fmt::Display) -> LogError {
        LogError::Corrupt {
            what: what.into(),
            detail: detail.to_string(),
        }
    }

    /// The epoch that fenced us, if this is a fencing error.
    pub fn fenced_by(&self) -> Option<Epoch> {
        match self {
            LogError::Fenced(fenced)
            | LogError::Stopped {
                reason: StopReason::Fenced(fenced),
                ..
            } => Some(fenced.current),
            _ => None,
        }
    }
}

impl From<BlobError> for LogError {
    fn from(error: BlobError) -> Self {
        LogError::Store(Arc::new(error))
    }
}

impl From<RegisterError> for LogError {
    fn from(error: RegisterError) -> Self {
        LogError::Register(Arc::new(error))
    }
}

impl From<CodecError> for LogError {
    fn from(error: CodecError) -> Self {
        LogError::corrupt("object", error)
    }
}

impl<E: Into<LogError>> From<TransformError<E>> for LogError {
    fn from(error: TransformError<E>) -> Self {
        match error {
            TransformError::Rejected(error) => error.into(),
            TransformError::Invalid(error) => LogError::Manifest(error),
            TransformError::Store(error) => error.into(),
            TransformError::NotInitialized { register } => {
                LogError::Transition(format!("register not initialized: register={register}"))
            }
            TransformError::Contended { rounds, register } => LogError::Transition(format!(
                "register contended: gave up after {rounds} rounds: register={register}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_errors_never_may_have_committed() {
        let admission = [
            LogError::RecordTooLarge { bytes: 2, max: 1 },
            LogError::Backpressure {
                bytes: 1,
                records: 1,
            },
            LogError::ActiveSegmentFull { bytes: 1, max: 1 },
            LogError::SegmentDirectoryFull { entries: 1, max: 1 },
        ];
        for error in admission {
            assert!(!error.may_have_committed(), "{error}");
        }
        let stopped = |may_have_committed| LogError::Stopped {
            reason: StopReason::Aborted,
            may_have_committed,
        };
        assert!(stopped(true).may_have_committed());
        assert!(!stopped(false).may_have_committed());
        assert_eq!(stopped(true).kind(), ErrorKind::Reopen);
    }
}
