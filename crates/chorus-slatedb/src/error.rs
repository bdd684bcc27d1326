//! Chorus's errors in SlateDB's terms.

use std::sync::Arc;

use chorus::log::{ErrorKind, LogError, StopReason};
use slatedb::wal::WalError;

/// The [`WalError`] SlateDB should see for a log error: a newer epoch is
/// `Fenced` (SlateDB closes the database as fenced), a lost quorum or a
/// transient store failure is `Unavailable`, damage is `DataError`.
pub(crate) fn wal_error(error: LogError) -> WalError {
    if error.fenced_by().is_some() {
        return WalError::Fenced;
    }
    match &error {
        LogError::Stopped {
            reason: StopReason::Shutdown,
            ..
        } => WalError::Closed,
        LogError::Stopped {
            reason: StopReason::Poisoned { .. },
            ..
        } => WalError::Unavailable(Arc::new(error)),
        _ => match error.kind() {
            ErrorKind::Retry => WalError::Unavailable(Arc::new(error)),
            ErrorKind::GiveUp => WalError::DataError(Arc::new(error)),
            ErrorKind::Reopen | ErrorKind::FixInput => WalError::InternalError(Arc::new(error)),
        },
    }
}

/// The [`WalError`] for `what`, which the log gave up on: dropped by a
/// shutdown that reached its deadline, which is no clean close (SlateDB
/// would take `Closed` for one); otherwise as [`wal_error`].
pub(crate) fn shutdown_error(error: LogError, what: &str) -> WalError {
    match error {
        LogError::Stopped {
            reason: StopReason::Shutdown,
            ..
        } => not_durable_at_close(format!(
            "closing reached shutdown_timeout before {what} became durable"
        )),
        error => wal_error(error),
    }
}

/// A [`WalError::Unavailable`] for batches closing left not durable.
pub(crate) fn not_durable_at_close(message: String) -> WalError {
    WalError::Unavailable(Arc::new(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        message,
    )))
}

/// A [`WalError::DataError`] with a message.
pub(crate) fn data_error(message: String) -> WalError {
    WalError::DataError(Arc::new(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        message,
    )))
}

/// A [`WalError::InternalError`] with a message.
pub(crate) fn internal_error(message: String) -> WalError {
    WalError::InternalError(Arc::new(std::io::Error::other(message)))
}
