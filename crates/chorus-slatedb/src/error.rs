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
