//! What the machine's etcd tests share: byte strings from text, and a
//! request checked as the service checks it, then applied as the next record.

use bytes::Bytes;

use super::{Applied, DEFAULT_MAX_TXN_OPS, EtcdCommand, EtcdError, EtcdResponse, KvState};

/// `text` as bytes.
pub(super) fn b(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

/// Checks `command` as the service does, then applies it as the next record.
pub(super) fn apply(state: &mut KvState, command: EtcdCommand) -> Result<EtcdResponse, EtcdError> {
    command.validate(state, DEFAULT_MAX_TXN_OPS)?;
    match state.apply(state.applied_end(), &command.encode()) {
        Applied::Etcd(answer) => answer,
        other => panic!("not an etcd answer: {other:?}"),
    }
}
