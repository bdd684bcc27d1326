//! The key-value workload: unique puts and compare-and-set increments of
//! one counter, as `kv` commands, and how their records read back.

use bytes::Bytes;
use chorus::kv::{Applied, Command, Condition, KvState, Operation};
use chorus::runtime::{WriteError, Written};

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
