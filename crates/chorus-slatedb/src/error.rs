//! Chorus's errors in SlateDB's terms.

use std::sync::Arc;

use chorus::log::{ErrorKind, LogError, StopReason};
use slatedb::wal::WalError;

/// The [`WalError`] SlateDB should see for a log error: a newer epoch is
/// `Fenced` (SlateDB closes the database as fenced); a lost quorum, a
/// writer poisoned by it, or a store or register error the log returns
/// directly is `Unavailable` (as SlateDB's own WAL reports its object
/// store's errors); damage is `DataError`, which SlateDB takes for
/// corruption; the rest is `InternalError`.
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
        LogError::Corrupt { .. } | LogError::Manifest(_) => WalError::DataError(Arc::new(error)),
        LogError::Store(_) | LogError::Register(_) => WalError::Unavailable(Arc::new(error)),
        _ if error.kind() == ErrorKind::Retry => WalError::Unavailable(Arc::new(error)),
        _ => WalError::InternalError(Arc::new(error)),
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

#[cfg(test)]
mod tests {
    use chorus::blob::{BlobError, Op};

    use super::*;

    fn kind(error: LogError) -> &'static str {
        match wal_error(error) {
            WalError::Fenced => "fenced",
            WalError::Closed => "closed",
            WalError::Unavailable(_) => "unavailable",
            WalError::DataError(_) => "data",
            WalError::InternalError(_) => "internal",
            _ => "other",
        }
    }

    #[test]
    fn only_damage_reads_as_corruption() {
        let backend = BlobError::Backend {
            store: "s3://bucket".into(),
            op: Op::Get,
            key: "k".into(),
            source: "access denied".into(),
        };
        assert_eq!(kind(LogError::Store(Arc::new(backend))), "unavailable");
        let corrupt = LogError::Corrupt {
            what: "sealed segment 1-0".into(),
            detail: "crc32c mismatch".into(),
        };
        assert_eq!(kind(corrupt), "data");
        assert_eq!(
            kind(LogError::NoQuorum {
                observed: 1,
                quorum: 2,
                detail: String::new()
            }),
            "unavailable"
        );
        assert_eq!(
            kind(LogError::Transition("register contended".into())),
            "internal"
        );
    }
}
