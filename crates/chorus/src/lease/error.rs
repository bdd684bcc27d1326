//! Errors of the lease layer.

use std::time::Duration;

use super::{DatabaseKey, DocumentError, Generation, HolderId, Term};
use crate::blob::BlobError;

/// Why a lease operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Another holder's lease is live; wait for it to expire or be released.
    #[error(
        "lease held by another holder: database={database} holder={holder} expires_in_ms={}",
        expires_in.as_millis()
    )]
    Held {
        /// The database.
        database: DatabaseKey,
        /// The current holder.
        holder: HolderId,
        /// Time left by this contender's wall clock.
        expires_in: Duration,
    },
    /// A concurrent contender changed the lease between our read and our write;
    /// re-read to see who won.
    #[error("lease race lost: database={database}")]
    LostRace {
        /// The database.
        database: DatabaseKey,
    },
    /// The holder's lease was taken over or released: it must stop writing.
    #[error("lease lost: database={database} holder={holder} generation={generation}")]
    Stale {
        /// The database.
        database: DatabaseKey,
        /// The holder that lost its lease.
        holder: HolderId,
        /// The generation it held.
        generation: Generation,
    },
    /// The stored lease carries a higher term; this contender may never hold it.
    #[error(
        "lease fenced by a higher term: database={database} term={term} stored_term={stored_term}"
    )]
    Fenced {
        /// The database.
        database: DatabaseKey,
        /// The contender's term.
        term: Term,
        /// The stored lease's term.
        stored_term: Term,
    },
    /// The stored lease document is malformed; nothing was written.
    #[error(transparent)]
    Document(#[from] DocumentError),
    /// A store call failed terminally, or transiently on every attempt.
    #[error(transparent)]
    Store(#[from] BlobError),
}

impl LeaseError {
    /// Whether retrying the same call later may succeed (a transient store
    /// failure or a lost race); `Held` resolves by waiting, the rest never.
    pub fn is_transient(&self) -> bool {
        match self {
            LeaseError::LostRace { .. } => true,
            LeaseError::Store(error) => error.is_transient(),
            LeaseError::Held { .. }
            | LeaseError::Stale { .. }
            | LeaseError::Fenced { .. }
            | LeaseError::Document(_) => false,
        }
    }
}

impl LeaseError {
    /// A short label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            LeaseError::Held { .. } => "held",
            LeaseError::LostRace { .. } => "lost_race",
            LeaseError::Stale { .. } => "stale",
            LeaseError::Fenced { .. } => "fenced",
            LeaseError::Document(_) => "invalid_document",
            LeaseError::Store(_) => "store",
        }
    }
}

/// Counts the outcome of one lease `operation`.
pub(crate) fn record<T>(operation: &'static str, result: &Result<T, LeaseError>) {
    let outcome = result.as_ref().map_or_else(LeaseError::label, |_| "ok");
    metrics::counter!(
        "chorus_lease_operations_total",
        "operation" => operation,
        "outcome" => outcome
    )
    .increment(1);
}
