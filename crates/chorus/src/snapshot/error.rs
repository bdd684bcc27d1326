//! Errors of the snapshot layer.

use std::fmt;

use super::{PublicationState, Sha256Digest};
use crate::blob::BlobError;
use crate::ids::RecordIndex;
use crate::lease::{DatabaseKey, DocumentError};

/// Why a publication store fenced itself; once fenced it stays fenced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceReason {
    /// The lease could no longer vouch for this holder: its own deadline
    /// passed, or it was lost or released.
    LeaseExpired,
    /// The lease is for another database, or (on `publish`) the claimed HEAD is
    /// stamped with another lease incarnation than the one given.
    LeaseMismatch,
    /// The observed HEAD is stamped with a newer fencing token than the lease's.
    Superseded,
    /// HEAD is no longer at the version this store observed or wrote.
    HeadMoved,
    /// The fresh payload key already holds other bytes.
    PayloadExists {
        /// The payload key.
        key: String,
    },
}

impl fmt::Display for FenceReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FenceReason::LeaseExpired => f.write_str("lease-expired"),
            FenceReason::LeaseMismatch => f.write_str("lease-mismatch"),
            FenceReason::Superseded => f.write_str("superseded"),
            FenceReason::HeadMoved => f.write_str("head-moved"),
            FenceReason::PayloadExists { key } => write!(f, "payload-exists key={key}"),
        }
    }
}

/// Why a snapshot operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// This publication store may never write HEAD again; boot again from the
    /// current HEAD with a new store.
    #[error("snapshot publication fenced: database={database} reason={reason}")]
    Fenced {
        /// The database.
        database: DatabaseKey,
        /// Why.
        reason: FenceReason,
    },
    /// The operation is not allowed in the store's current state.
    #[error("snapshot publication cannot {operation} in state={state}: database={database}")]
    WrongState {
        /// The database.
        database: DatabaseKey,
        /// The refused operation.
        operation: &'static str,
        /// The store's state.
        state: PublicationState,
    },
    /// A downloaded payload does not match the checksum HEAD recorded.
    #[error(
        "snapshot payload checksum mismatch: key={key} expected_sha256={expected} found_sha256={found}"
    )]
    Checksum {
        /// The payload key.
        key: String,
        /// The checksum HEAD records.
        expected: Sha256Digest,
        /// The checksum of the bytes read.
        found: Sha256Digest,
    },
    /// A downloaded payload does not have the size HEAD recorded.
    #[error(
        "snapshot payload size mismatch: key={key} expected_bytes={expected} found_bytes={found}"
    )]
    Size {
        /// The payload key.
        key: String,
        /// The size HEAD records.
        expected: u64,
        /// The size read.
        found: u64,
    },
    /// HEAD names a payload that is not in the store.
    #[error("snapshot payload missing: key={key}")]
    PayloadMissing {
        /// The payload key.
        key: String,
    },
    /// HEAD changed during every round of a stable read.
    #[error("HEAD kept changing while being read: key={key} rounds={rounds}")]
    Unstable {
        /// The HEAD key.
        key: String,
        /// Rounds tried.
        rounds: u32,
    },
    /// The snapshot would move HEAD's `wal_index` backwards: replay would
    /// resume below what the current state already reflects. Nothing was
    /// written.
    #[error(
        "snapshot would rewind HEAD: key={key} head_wal_index={head_wal_index} requested_wal_index={requested}"
    )]
    Rewind {
        /// The HEAD key.
        key: String,
        /// HEAD's current `wal_index`.
        head_wal_index: RecordIndex,
        /// The publication's `wal_index`.
        requested: RecordIndex,
    },
    /// HEAD is malformed; nothing was written.
    #[error(transparent)]
    Document(#[from] DocumentError),
    /// A store call failed terminally, or transiently on every attempt.
    #[error(transparent)]
    Store(#[from] BlobError),
}

impl SnapshotError {
    /// Whether the publication store is fenced for good.
    pub fn is_fenced(&self) -> bool {
        matches!(self, SnapshotError::Fenced { .. })
    }

    /// Whether retrying the same call later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            SnapshotError::Store(error) => error.is_transient(),
            SnapshotError::Unstable { .. } => true,
            SnapshotError::Fenced { .. }
            | SnapshotError::WrongState { .. }
            | SnapshotError::Checksum { .. }
            | SnapshotError::Size { .. }
            | SnapshotError::PayloadMissing { .. }
            | SnapshotError::Rewind { .. }
            | SnapshotError::Document(_) => false,
        }
    }
}

impl SnapshotError {
    /// A short label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            SnapshotError::Fenced { .. } => "fenced",
            SnapshotError::WrongState { .. } => "wrong_state",
            SnapshotError::Checksum { .. } => "checksum",
            SnapshotError::Size { .. } => "size",
            SnapshotError::PayloadMissing { .. } => "payload_missing",
            SnapshotError::Unstable { .. } => "unstable",
            SnapshotError::Rewind { .. } => "rewind",
            SnapshotError::Document(_) => "invalid_document",
            SnapshotError::Store(_) => "store",
        }
    }
}

/// Counts the outcome of one publication-store `operation`.
pub(crate) fn record<T>(operation: &'static str, result: &Result<T, SnapshotError>) {
    let outcome = result.as_ref().map_or_else(SnapshotError::label, |_| "ok");
    metrics::counter!(
        "chorus_snapshot_operations_total",
        "operation" => operation,
        "outcome" => outcome
    )
    .increment(1);
}
