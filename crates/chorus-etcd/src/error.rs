//! Every way a request fails, as the gRPC status an etcd client acts on.
//!
//! - A refusal by the state machine ([`EtcdError`]): etcd's code and exact
//!   message (clients match on the message).
//! - The runtime cannot serve now (this node is not the primary, or the
//!   primary is not sure of its lease): `Unavailable`, which etcd's clients
//!   treat as "try another endpoint" for reads and never retry blindly for
//!   writes. Nothing was written.
//! - The log refused the append without writing it: `ResourceExhausted`
//!   with etcd's "too many requests" for backpressure, "request is too
//!   large" for a record over the log's limit, `Unavailable` otherwise.
//! - The write's outcome is unknown (the writer stopped after the record was
//!   handed to it): `Unavailable` too, as etcd answers a proposal whose
//!   leader failed ("request timed out, possibly due to previous leader
//!   failure"), with a message saying the write may have been applied.

use chorus::kv::etcd::{EtcdError, EtcdErrorCode};
use chorus::log::LogError;
use chorus::runtime::{Unavailable, WriteError};
use tonic::{Code, Status};

/// etcd's answer when the server cannot take more proposals now.
pub const TOO_MANY_REQUESTS: &str = "etcdserver: too many requests";

/// What a Watch or LeaseKeepAlive stream ends with when its node shuts
/// down: `Unavailable`, on which etcd clients resume on another endpoint.
pub const SHUTTING_DOWN: &str = "chorus: this node is shutting down; resume on another node";

/// The status a stream ends with when its node shuts down.
pub fn shutting_down() -> Status {
    Status::unavailable(SHUTTING_DOWN)
}

/// Resolves once `closing` turns true (or its sender is gone).
pub(crate) async fn closed(closing: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = closing.wait_for(|closing| *closing).await;
}

/// etcd's code and message for a refusal.
pub fn refused(error: &EtcdError) -> Status {
    let code = match error.code() {
        EtcdErrorCode::InvalidArgument => Code::InvalidArgument,
        EtcdErrorCode::OutOfRange => Code::OutOfRange,
        EtcdErrorCode::NotFound => Code::NotFound,
        EtcdErrorCode::FailedPrecondition => Code::FailedPrecondition,
        EtcdErrorCode::ResourceExhausted => Code::ResourceExhausted,
    };
    Status::new(code, error.to_string())
}

/// `Unavailable`, naming why and, on a standby, the primary.
pub fn unavailable(error: &Unavailable) -> Status {
    let message = match error {
        Unavailable::NotPrimary {
            primary: Some(primary),
            ..
        } => format!("chorus: {error}; the primary is {primary}"),
        _ => format!("chorus: {error}"),
    };
    Status::unavailable(message)
}

/// A write that did not return an answer from the state machine.
pub fn write_failed(error: WriteError<EtcdError>) -> Status {
    match error {
        WriteError::Rejected(refusal) => refused(&refusal),
        WriteError::Unavailable(unavailable_now) => unavailable(&unavailable_now),
        WriteError::Log(error) => log_failed(&error),
    }
}

fn log_failed(error: &LogError) -> Status {
    if error.may_have_committed() {
        return Status::unavailable(format!(
            "etcdserver: request timed out, possibly due to previous leader failure \
             (chorus: the write may have been applied; read before retrying: {error})"
        ));
    }
    match error {
        LogError::Backpressure { .. } => Status::resource_exhausted(TOO_MANY_REQUESTS),
        LogError::RecordTooLarge { .. } => refused(&EtcdError::RequestTooLarge),
        _ => Status::unavailable(format!("chorus: write not appended: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use chorus::lease::HolderId;
    use chorus::runtime::Role;

    use super::*;

    #[test]
    fn refusals_answer_etcds_code_and_message() {
        let cases = [
            (EtcdError::Compacted, Code::OutOfRange),
            (EtcdError::FutureRevision, Code::OutOfRange),
            (EtcdError::EmptyKey, Code::InvalidArgument),
            (EtcdError::DuplicateKey, Code::InvalidArgument),
            (EtcdError::TooManyOps, Code::InvalidArgument),
            (EtcdError::KeyNotFound, Code::InvalidArgument),
            (EtcdError::ValueProvided, Code::InvalidArgument),
            (EtcdError::LeaseProvided, Code::InvalidArgument),
            (EtcdError::LeaseNotFound, Code::NotFound),
            (EtcdError::RequestTooLarge, Code::InvalidArgument),
            (EtcdError::LeaseExists, Code::FailedPrecondition),
            (EtcdError::LeaseTtlTooLarge, Code::OutOfRange),
            (EtcdError::NoSpace, Code::ResourceExhausted),
        ];
        for (error, code) in cases {
            let status = refused(&error);
            assert_eq!(status.code(), code, "{error}");
            assert_eq!(status.message(), error.to_string());
        }
    }

    #[test]
    fn a_standby_names_the_primary() {
        let primary = HolderId::new("http://10.0.0.1:7070").unwrap();
        let status = unavailable(&Unavailable::NotPrimary {
            role: Role::Standby,
            primary: Some(primary),
        });
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(
            status.message(),
            "chorus: not the primary: role=standby; the primary is http://10.0.0.1:7070"
        );
        let status = unavailable(&Unavailable::LeaseUncertain);
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().starts_with("chorus: lease uncertain"));
    }

    #[test]
    fn log_failures_say_whether_the_write_may_have_applied() {
        let unknown: WriteError<EtcdError> = WriteError::Log(LogError::Stopped {
            reason: chorus::log::StopReason::Aborted,
            may_have_committed: true,
        });
        let status = write_failed(unknown);
        assert_eq!(status.code(), Code::Unavailable);
        assert!(
            status.message().contains("may have been applied"),
            "{}",
            status.message()
        );
        let large: WriteError<EtcdError> =
            WriteError::Log(LogError::RecordTooLarge { bytes: 9, max: 8 });
        let status = write_failed(large);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "etcdserver: request is too large");
        let rejected: WriteError<EtcdError> = WriteError::Rejected(EtcdError::DuplicateKey);
        assert_eq!(
            write_failed(rejected).message(),
            "etcdserver: duplicate key given in txn request"
        );
    }
}
