//! The key-value workload: unique puts, compare-and-set increments of one
//! counter, and exactly-once puts stamped with an idempotency key (retried
//! with the same key), as `kv` records, etcd v3 writes (`etcd.rs`), and how
//! their records read back.

use bytes::Bytes;
use chorus::kv::idempotency::{Lookup, MAX_RETAINED_BYTES, MAX_RETENTION_AGE_MS, RequestDigest};
use chorus::kv::{
    Applied, Body, Command, Condition, DEFAULT_MAX_TXN_OPS, EtcdCommand, IdempotencyKey, KvState,
    Operation, Record, Retention, Stamp,
};
use chorus::runtime::{WriteError, Written};

use super::etcd::draw_request;
use crate::trace::label;

/// The counter the increments compare-and-set.
pub(super) const COUNTER: &[u8] = b"counter";

/// A write of the workload.
#[derive(Debug, Clone)]
pub(super) enum WriteKind {
    /// Puts a key no other write uses, if absent.
    Put { key: Bytes, value: Bytes },
    /// Compare-and-sets the counter to its applied value + 1.
    Increment,
    /// One attempt of an exactly-once operation: an unconditional put of
    /// `target` (a key no other operation writes) stamped with `key`.
    /// Every attempt carries the same put, so a retry is the same request.
    Keyed {
        key: IdempotencyKey,
        target: Bytes,
        value: Bytes,
    },
    /// An etcd write on the keys under `etcd::ETCD_PREFIX`, drawn from
    /// `seed` and the applied state at prepare time (`etcd::draw_request`).
    Etcd { seed: u64 },
}

/// The retention keyed writes carry: more keys than a run writes, and
/// longer than a run lasts in virtual time (skews included), so no key is
/// ever forgotten within a run and a second application of any is a
/// violation.
pub(super) const KEYED_RETENTION: Retention = Retention {
    max_keys: 1_000_000,
    max_age_ms: MAX_RETENTION_AGE_MS,
    max_bytes: MAX_RETAINED_BYTES,
};

/// The record a write's prepare appends, decided against the applied
/// `state`: a put or increment whose condition holds, or a keyed put as the
/// service admits one (a key the table remembers answers the remembered
/// outcome, `Applied::Duplicate`, and appends nothing), or an etcd request
/// validated and encoded as the gRPC service does. `at_ms` is the writer's
/// wall clock, stamped into a keyed record.
pub(super) fn prepare(kind: &WriteKind, state: &KvState, at_ms: u64) -> Result<Bytes, Applied> {
    let command = match kind {
        WriteKind::Put { key, value } => put(key, value, Condition::Absent),
        WriteKind::Increment => increment(state),
        WriteKind::Keyed { key, target, value } => {
            return keyed_record(state, key, target, value, at_ms);
        }
        WriteKind::Etcd { seed } => {
            let command = draw_request(*seed, state);
            command
                .validate(state, DEFAULT_MAX_TXN_OPS)
                .map_err(|refusal| Applied::Etcd(Err(refusal)))?;
            return Ok(command.encode());
        }
    };
    state.check(&command)?;
    Ok(command.encode().expect("a valid command"))
}

fn keyed_record(
    state: &KvState,
    key: &IdempotencyKey,
    target: &Bytes,
    value: &Bytes,
    at_ms: u64,
) -> Result<Bytes, Applied> {
    let stamp = Stamp {
        key: key.clone(),
        at_ms,
        retention: KEYED_RETENTION,
    };
    let digest = keyed_digest(target, value);
    match state.idempotency().lookup(key, &digest) {
        Lookup::New => {}
        Lookup::Same(remembered) => {
            return Err(Applied::Duplicate {
                original: remembered.index,
                outcome: remembered.outcome.clone(),
            });
        }
        Lookup::Different(remembered) => {
            return Err(Applied::KeyReused {
                original: remembered.index,
            });
        }
    }
    let record = Record {
        stamp: Some(stamp),
        body: keyed_body(target, value),
    };
    Ok(record.encode().expect("a valid record"))
}

fn keyed_body(target: &Bytes, value: &Bytes) -> Body {
    Body::Command(put(target, value, Condition::None))
}

/// The request digest every attempt of a keyed put shares.
pub(super) fn keyed_digest(target: &Bytes, value: &Bytes) -> RequestDigest {
    let record = Record {
        stamp: None,
        body: keyed_body(target, value),
    };
    record.digest().expect("a valid command")
}

/// The idempotency key of a stamped record (`None`: not stamped).
pub(super) fn stamp_key(record: &Bytes) -> Option<IdempotencyKey> {
    Some(Record::decode(record).ok()?.stamp?.key)
}

/// The record a write's `prepare` encoded (`None`: it never ran), and how
/// the write ended.
pub(super) type WriteEnd = (Option<Bytes>, Result<Written<Applied>, WriteError<Applied>>);

pub(super) fn put(key: &Bytes, value: &Bytes, condition: Condition) -> Command {
    Command::Single(Operation::Put {
        key: key.clone(),
        value: value.clone(),
        condition,
    })
}

/// The increment of the counter as `state` has it: a compare-and-set on
/// its version (or its absence).
pub(super) fn increment(state: &KvState) -> Command {
    let key = Bytes::from_static(COUNTER);
    let (next, condition) = match state.get(COUNTER) {
        Some(entry) => (
            counter_value(&entry.value).unwrap_or(0) + 1,
            Condition::Version(entry.index),
        ),
        None => (1, Condition::Absent),
    };
    put(&key, &Bytes::from(next.to_string()), condition)
}

pub(super) fn counter_value(value: &Bytes) -> Option<u64> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// The value a single-put record sets.
pub(super) fn put_value(record: &Bytes) -> Option<Bytes> {
    match Command::decode(record).ok()? {
        Command::Single(Operation::Put { value, .. }) => Some(value),
        _ => None,
    }
}

/// A record in trace form: what it sets, under which condition. (The CRC32C
/// `label` of the log phases is the same for every record here: a command
/// ends with its own CRC32C, and the CRC of data followed by its CRC is a
/// constant.)
pub(super) fn record_label(record: &Bytes) -> String {
    let label = command_label(record);
    match stamp_key(record) {
        Some(key) => format!("{label} key={key}"),
        None => label,
    }
}

fn command_label(record: &Bytes) -> String {
    if let Ok(command) = EtcdCommand::decode(record) {
        return etcd_label(&command);
    }
    match Command::decode(record) {
        Ok(Command::Single(Operation::Put {
            key,
            value,
            condition,
        })) if key.as_ref() == COUNTER => format!(
            "counter={} if {condition:?}",
            String::from_utf8_lossy(&value)
        ),
        Ok(Command::Single(Operation::Put { key, value, .. })) => {
            format!("{}={}", String::from_utf8_lossy(&key), label(&value))
        }
        _ => label(record),
    }
}

/// An etcd request in trace form: its kind and first key.
fn etcd_label(command: &EtcdCommand) -> String {
    let (kind, key) = match command {
        EtcdCommand::Put(put) => ("put", &put.key),
        EtcdCommand::DeleteRange(delete) => ("delete", &delete.key),
        EtcdCommand::Txn(txn) => {
            let ops = txn.success.len() + txn.failure.len();
            return format!("etcd txn compares={} ops={ops}", txn.compare.len());
        }
        EtcdCommand::Compact(compaction) => {
            return format!("etcd compact {}", compaction.revision);
        }
        other => return format!("etcd {other:?}"),
    };
    format!("etcd {kind} {}", String::from_utf8_lossy(key))
}

/// Whether `record` holds an etcd request.
pub(super) fn is_etcd(record: &Bytes) -> bool {
    EtcdCommand::decode(record).is_ok()
}
