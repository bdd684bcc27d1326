//! The key-value state machine: an ordered map of byte keys to byte values,
//! changed only by applying log records ([`Command`]) in index order. Pure:
//! no I/O, no clock, so every replica of the state that applied the same
//! prefix of the log is the same map.
//!
//! A key's version is the index of the record that last set it. Conditions
//! are checked at apply time against the state at that index; a record whose
//! condition fails changes nothing (and the service checks conditions before
//! appending, so normally such a record is never written).
//!
//! Snapshot encoding (little-endian, CRC32C over everything before it):
//! `"CHKS" | format u8 = 1 | applied_end u64 | count u64 | count × (key,
//! version u64, value) | crc32c u32`, keys in order, each key and value a
//! `u32` length then the bytes.

mod command;

use std::collections::BTreeMap;
use std::ops::Bound;

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub use command::{
    Command, CommandError, Condition, MAX_BATCH_OPERATIONS, MAX_KEY_BYTES, Operation,
};

use crate::ids::RecordIndex;
use crate::runtime::{Checkpoint, RestoreError, StateMachine};

const SNAPSHOT_MAGIC: [u8; 4] = *b"CHKS";
const SNAPSHOT_FORMAT: u8 = 1;

/// A stored value and the index of the record that set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The value.
    pub value: Bytes,
    /// The index of the record that last set the key.
    pub version: RecordIndex,
}

/// What applying one record did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Every operation of the record took effect. `unchanged` lists, by
    /// position in the record, the operations that found nothing to change
    /// (a delete of an absent key), so a watcher reports only real changes.
    Done {
        /// Positions of the operations that changed nothing, ascending.
        unchanged: Vec<usize>,
    },
    /// A condition did not hold; nothing changed.
    ConditionFailed {
        /// The key whose condition failed (the first, in record order).
        key: Bytes,
        /// Its version at that index (`None`: absent).
        current: Option<RecordIndex>,
    },
    /// The record is not a key-value command; nothing changed. The log is
    /// the source of truth, so the machine skips it rather than stop.
    Malformed(CommandError),
}

/// A snapshot that does not decode; the message names the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed key-value snapshot: {reason}")]
pub struct SnapshotError {
    reason: String,
}

/// The key-value state: see the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvState {
    entries: BTreeMap<Bytes, Entry>,
    /// The index of the next record to apply.
    applied_end: RecordIndex,
}

impl Applied {
    /// [`Applied::Done`] with every operation changing something.
    pub fn done() -> Applied {
        Applied::Done {
            unchanged: Vec::new(),
        }
    }
}

impl KvState {
    /// The index of the next record to apply: every record below it is reflected.
    pub fn applied_end(&self) -> RecordIndex {
        self.applied_end
    }

    /// The number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry of `key`.
    pub fn get(&self, key: &[u8]) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// Up to `limit` entries whose key starts with `prefix`, in key order,
    /// after `after` (exclusive) if given, and whether more follow.
    pub fn list(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> (Vec<(&Bytes, &Entry)>, bool) {
        let start = match after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        let mut matching = self
            .entries
            .range::<[u8], _>((start, Bound::Unbounded))
            .take_while(|(key, _)| key.starts_with(prefix));
        let page: Vec<_> = matching.by_ref().take(limit).collect();
        let more = matching.next().is_some();
        (page, more)
    }

    /// Whether every condition of `command` holds now: the check before
    /// appending, so a failed condition appends nothing.
    pub fn check(&self, command: &Command) -> Result<(), Applied> {
        for operation in command.operations() {
            let current = self.entries.get(operation.key()).map(|e| e.version);
            let holds = match operation.condition() {
                Condition::None => true,
                Condition::Absent => current.is_none(),
                Condition::Version(version) => current == Some(version),
            };
            if !holds {
                return Err(Applied::ConditionFailed {
                    key: operation.key().clone(),
                    current,
                });
            }
        }
        Ok(())
    }

    /// Applies record `index`. Records must come in index order from
    /// [`applied_end`](Self::applied_end) on; an index already applied (a
    /// replay overlapping the snapshot) is skipped.
    pub fn apply(&mut self, index: RecordIndex, record: &[u8]) -> Applied {
        if index < self.applied_end {
            return Applied::done();
        }
        self.applied_end = RecordIndex(index.0 + 1);
        let command = match Command::decode(record) {
            Ok(command) => command,
            Err(error) => return Applied::Malformed(error),
        };
        if let Err(failed) = self.check(&command) {
            return failed;
        }
        let mut unchanged = Vec::new();
        for (position, operation) in command.operations().iter().enumerate() {
            match operation {
                Operation::Put { key, value, .. } => {
                    let entry = Entry {
                        value: value.clone(),
                        version: index,
                    };
                    self.entries.insert(key.clone(), entry);
                }
                Operation::Delete { key, .. } => {
                    if self.entries.remove(key).is_none() {
                        unchanged.push(position);
                    }
                }
            }
        }
        Applied::Done { unchanged }
    }

    /// The snapshot bytes (see the module docs).
    pub fn encode_snapshot(&self) -> Bytes {
        let mut out = BytesMut::new();
        out.put_slice(&SNAPSHOT_MAGIC);
        out.put_u8(SNAPSHOT_FORMAT);
        out.put_u64_le(self.applied_end.0);
        out.put_u64_le(self.entries.len() as u64);
        for (key, entry) in &self.entries {
            out.put_u32_le(key.len() as u32);
            out.put_slice(key);
            out.put_u64_le(entry.version.0);
            out.put_u32_le(entry.value.len() as u32);
            out.put_slice(&entry.value);
        }
        let crc = crc32c::crc32c(&out);
        out.put_u32_le(crc);
        out.freeze()
    }

    /// Restores a state from [`encode_snapshot`](Self::encode_snapshot)'s bytes.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<KvState, SnapshotError> {
        let fail = |reason: &str| SnapshotError {
            reason: reason.to_owned(),
        };
        let mut input =
            command::open_envelope(bytes, &SNAPSHOT_MAGIC, SNAPSHOT_FORMAT, 16).map_err(fail)?;
        let applied_end = RecordIndex(input.get_u64_le());
        let count = input.get_u64_le();
        let mut entries = BTreeMap::new();
        let mut previous: Option<Bytes> = None;
        for _ in 0..count {
            let key = take_sized(&mut input).ok_or_else(|| fail("truncated key"))?;
            if input.len() < 8 {
                return Err(fail("truncated version"));
            }
            let version = RecordIndex(input.get_u64_le());
            let value = take_sized(&mut input).ok_or_else(|| fail("truncated value"))?;
            if previous.as_ref().is_some_and(|previous| *previous >= key) {
                return Err(fail("keys out of order"));
            }
            if version >= applied_end {
                return Err(fail("a version at or past the applied end"));
            }
            previous = Some(key.clone());
            entries.insert(key, Entry { value, version });
        }
        if !input.is_empty() {
            return Err(fail("trailing bytes"));
        }
        Ok(KvState {
            entries,
            applied_end,
        })
    }
}

impl StateMachine for KvState {
    type Output = Applied;
    /// A clone: the map's keys and values are reference-counted, so this
    /// copies the tree's nodes, not the data.
    type Checkpoint = KvState;

    fn apply(&mut self, index: RecordIndex, record: &[u8]) -> Applied {
        KvState::apply(self, index, record)
    }

    fn checkpoint(&self) -> KvState {
        self.clone()
    }

    fn restore(source: &mut dyn std::io::Read) -> Result<KvState, RestoreError> {
        let mut bytes = Vec::new();
        source
            .read_to_end(&mut bytes)
            .map_err(|e| RestoreError(e.to_string()))?;
        KvState::decode_snapshot(&bytes).map_err(|e| RestoreError(e.to_string()))
    }

    fn reflected_end(&self) -> Option<RecordIndex> {
        Some(self.applied_end)
    }
}

impl Checkpoint for KvState {
    fn write_to(&self, sink: &mut dyn std::io::Write) -> std::io::Result<()> {
        sink.write_all(&self.encode_snapshot())
    }
}

fn take_sized(input: &mut &[u8]) -> Option<Bytes> {
    if input.len() < 4 {
        return None;
    }
    let length = input.get_u32_le() as usize;
    if input.len() < length {
        return None;
    }
    let bytes = Bytes::copy_from_slice(&input[..length]);
    input.advance(length);
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str, condition: Condition) -> Bytes {
        Command::Single(Operation::Put {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::copy_from_slice(value.as_bytes()),
            condition,
        })
        .encode()
        .unwrap()
    }

    fn delete(key: &str, condition: Condition) -> Bytes {
        Command::Single(Operation::Delete {
            key: Bytes::copy_from_slice(key.as_bytes()),
            condition,
        })
        .encode()
        .unwrap()
    }

    fn value(state: &KvState, key: &str) -> Option<(String, u64)> {
        state.get(key.as_bytes()).map(|entry| {
            (
                String::from_utf8(entry.value.to_vec()).unwrap(),
                entry.version.0,
            )
        })
    }

    #[test]
    fn versions_are_the_index_that_last_set_the_key() {
        let mut state = KvState::default();
        assert_eq!(
            state.apply(RecordIndex(0), &put("a", "1", Condition::None)),
            Applied::done()
        );
        assert_eq!(
            state.apply(RecordIndex(1), &put("b", "2", Condition::Absent)),
            Applied::done()
        );
        let cas = put("a", "3", Condition::Version(RecordIndex(0)));
        assert_eq!(state.apply(RecordIndex(2), &cas), Applied::done());
        assert_eq!(value(&state, "a"), Some(("3".into(), 2)));
        assert_eq!(value(&state, "b"), Some(("2".into(), 1)));
        assert_eq!(state.applied_end(), RecordIndex(3));
    }

    #[test]
    fn a_failed_condition_changes_nothing() {
        let mut state = KvState::default();
        state.apply(RecordIndex(0), &put("a", "1", Condition::None));
        let before = state.clone();
        let stale = put("a", "2", Condition::Version(RecordIndex(7)));
        assert_eq!(
            state.check(&Command::decode(&stale).unwrap()),
            Err(Applied::ConditionFailed {
                key: Bytes::from_static(b"a"),
                current: Some(RecordIndex(0)),
            })
        );
        assert!(matches!(
            state.apply(RecordIndex(1), &stale),
            Applied::ConditionFailed { .. }
        ));
        let create = put("a", "2", Condition::Absent);
        assert!(matches!(
            state.apply(RecordIndex(2), &create),
            Applied::ConditionFailed { .. }
        ));
        assert_eq!(state.entries, before.entries);
        assert_eq!(state.applied_end(), RecordIndex(3));
    }

    #[test]
    fn a_batch_applies_all_or_nothing() {
        let mut state = KvState::default();
        state.apply(RecordIndex(0), &put("a", "1", Condition::None));
        let batch = |condition| {
            Command::Batch(vec![
                Operation::Put {
                    key: Bytes::from_static(b"b"),
                    value: Bytes::from_static(b"2"),
                    condition: Condition::Absent,
                },
                Operation::Delete {
                    key: Bytes::from_static(b"a"),
                    condition,
                },
            ])
            .encode()
            .unwrap()
        };
        let failing = batch(Condition::Version(RecordIndex(5)));
        assert!(matches!(
            state.apply(RecordIndex(1), &failing),
            Applied::ConditionFailed { .. }
        ));
        assert_eq!(value(&state, "b"), None);
        assert_eq!(
            state.apply(RecordIndex(2), &batch(Condition::Version(RecordIndex(0)))),
            Applied::done()
        );
        assert_eq!(value(&state, "a"), None);
        assert_eq!(value(&state, "b"), Some(("2".into(), 2)));
    }

    #[test]
    fn deleting_an_absent_key_reports_that_nothing_changed() {
        let mut state = KvState::default();
        state.apply(RecordIndex(0), &put("a", "1", Condition::None));
        assert_eq!(
            state.apply(RecordIndex(1), &delete("b", Condition::None)),
            Applied::Done { unchanged: vec![0] }
        );
        assert_eq!(
            state.apply(RecordIndex(2), &delete("a", Condition::None)),
            Applied::done()
        );
        let batch = Command::Batch(vec![
            Operation::Put {
                key: Bytes::from_static(b"c"),
                value: Bytes::from_static(b"3"),
                condition: Condition::None,
            },
            Operation::Delete {
                key: Bytes::from_static(b"a"),
                condition: Condition::Absent,
            },
            Operation::Delete {
                key: Bytes::from_static(b"d"),
                condition: Condition::Absent,
            },
            Operation::Delete {
                key: Bytes::from_static(b"z"),
                condition: Condition::None,
            },
        ])
        .encode()
        .unwrap();
        assert_eq!(
            state.apply(RecordIndex(3), &batch),
            Applied::Done {
                unchanged: vec![1, 2, 3]
            }
        );
        assert_eq!(value(&state, "c"), Some(("3".into(), 3)));
    }

    #[test]
    fn a_record_that_is_not_a_command_is_skipped() {
        let mut state = KvState::default();
        assert!(matches!(
            state.apply(RecordIndex(0), b"raw log record"),
            Applied::Malformed(_)
        ));
        assert!(state.is_empty());
        assert_eq!(state.applied_end(), RecordIndex(1));
        // A replay overlapping what is applied changes nothing.
        state.apply(RecordIndex(1), &put("a", "1", Condition::None));
        state.apply(RecordIndex(1), &put("a", "other", Condition::None));
        assert_eq!(value(&state, "a"), Some(("1".into(), 1)));
    }

    #[test]
    fn list_pages_by_prefix_and_cursor() {
        let mut state = KvState::default();
        for (index, key) in ["a/1", "a/2", "a/3", "b/1"].into_iter().enumerate() {
            state.apply(RecordIndex(index as u64), &put(key, "v", Condition::None));
        }
        let keys = |page: Vec<(&Bytes, &Entry)>| -> Vec<String> {
            page.into_iter()
                .map(|(key, _)| String::from_utf8(key.to_vec()).unwrap())
                .collect()
        };
        let (page, more) = state.list(b"a/", None, 2);
        assert_eq!((keys(page), more), (vec!["a/1".into(), "a/2".into()], true));
        let (page, more) = state.list(b"a/", Some(b"a/2"), 2);
        assert_eq!((keys(page), more), (vec!["a/3".into()], false));
        let (page, more) = state.list(b"", None, 10);
        assert_eq!((keys(page).len(), more), (4, false));
        state.apply(RecordIndex(4), &delete("a/2", Condition::None));
        let (page, _) = state.list(b"a/", None, 10);
        assert_eq!(keys(page), vec!["a/1".to_owned(), "a/3".to_owned()]);
    }

    #[test]
    fn snapshots_round_trip_and_damage_is_refused() {
        let mut state = KvState::default();
        for index in 0..20u64 {
            let key = format!("key-{:02}", index % 7);
            state.apply(
                RecordIndex(index),
                &put(&key, &index.to_string(), Condition::None),
            );
        }
        let encoded = state.encode_snapshot();
        assert_eq!(KvState::decode_snapshot(&encoded).unwrap(), state);
        for bit in 0..encoded.len() * 8 {
            let mut damaged = encoded.to_vec();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(KvState::decode_snapshot(&damaged).is_err(), "bit {bit}");
        }
        for cut in 0..encoded.len() {
            assert!(
                KvState::decode_snapshot(&encoded[..cut]).is_err(),
                "cut {cut}"
            );
        }
        let empty = KvState::default().encode_snapshot();
        assert_eq!(
            KvState::decode_snapshot(&empty).unwrap(),
            KvState::default()
        );
    }
}
