//! The key-value state machine: an ordered map of byte keys to byte values,
//! changed only by applying log records ([`Command`]) in index order. Pure:
//! no I/O, no clock, so every replica of the state that applied the same
//! prefix of the log is the same map.
//!
//! The map is multi-version, with etcd's revisions ([`mvcc`]): a store
//! revision that rises by exactly 1 per record that changes something, and
//! per key `create_revision`, `mod_revision`, `version` and `lease`. Both
//! the HTTP commands ([`Command`]) and etcd's requests ([`EtcdCommand`],
//! their transactions included) apply as transactions in that one revision space. etcd's
//! leases ([`lease`]) are part of the state: granted and revoked by
//! records, a revoke deleting the lease's keys.
//!
//! HTTP conditions are checked at apply time against the state at that
//! index; a record whose condition fails changes nothing (and the service
//! checks conditions before appending, so normally such a record is never
//! written).
//!
//! A record may carry an idempotency key ([`idempotency`]): the machine
//! remembers it with the request's digest and outcome, and applies a later
//! record with the same key as a no-op that answers that outcome.
//!
//! The snapshot encoding, and how earlier formats map onto revisions, is
//! described in the `snapshot` module.

mod command;
pub mod etcd;
mod etcd_codec;
pub mod idempotency;
mod input;
pub mod lease;
pub mod lessor;
pub mod mvcc;
pub mod quota;
mod retained;
mod snapshot;
mod txn;

#[cfg(test)]
mod alarm_tests;
#[cfg(test)]
mod etcd_test_support;
#[cfg(test)]
mod lease_tests;
#[cfg(test)]
mod mvcc_tests;

use std::collections::BTreeSet;
use std::ops::Bound;

use bytes::Bytes;

pub use command::{
    Body, Command, CommandError, Condition, MAX_BATCH_OPERATIONS, MAX_KEY_BYTES, Operation, Record,
};
pub use etcd::{EtcdCommand, EtcdError, EtcdResponse, Revision};
pub use etcd_codec::MAX_TXN_DEPTH;
pub use idempotency::{IdempotencyKey, IdempotencyTable, Outcome, Retention, Stamp};
pub use lease::{Lease, LeaseId, LeaseTable};
pub use txn::DEFAULT_MAX_TXN_OPS;

use crate::ids::RecordIndex;
use crate::runtime::{Checkpoint, RestoreError, StateMachine};

/// A stored value and its metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The value.
    pub value: Bytes,
    /// The index of the record that last set the key.
    pub index: RecordIndex,
    /// The revision that created the key (since its last delete).
    pub create_revision: Revision,
    /// The revision that last set the key.
    pub mod_revision: Revision,
    /// 1 on creation, +1 per put (etcd's `version`).
    pub version: i64,
    /// The etcd lease the key is attached to, 0 for none.
    pub lease: i64,
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
        /// The store revision after the record: the one its changes were
        /// written at, or the unchanged one if it changed nothing.
        revision: Revision,
    },
    /// A condition did not hold; nothing changed.
    ConditionFailed {
        /// The key whose condition failed (the first, in record order).
        key: Bytes,
        /// Its `mod_revision` at that index (`None`: absent).
        current: Option<Revision>,
    },
    /// The record is not a key-value command; nothing changed. The log is
    /// the source of truth, so the machine skips it rather than stop.
    Malformed(CommandError),
    /// The record's idempotency key is remembered for this same request: a
    /// retry (or a concurrent twin). Nothing changed; the write is answered
    /// as the original was.
    Duplicate {
        /// The index of the record that applied the request.
        original: RecordIndex,
        /// How it ended.
        outcome: Outcome,
    },
    /// An etcd request applied (`Ok`, with etcd's answer) or was refused
    /// as etcd refuses it (`Err`, nothing changed).
    Etcd(Result<EtcdResponse, EtcdError>),
    /// The record's idempotency key is remembered for a different request;
    /// nothing changed.
    KeyReused {
        /// The index of the record the key was used with.
        original: RecordIndex,
    },
}

/// A snapshot that does not decode; the message names the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed key-value snapshot: {reason}")]
pub struct SnapshotError {
    reason: String,
}

/// The current entries by key: a persistent B-tree, so that a snapshot's
/// checkpoint (a copy taken while every write waits) shares its nodes
/// instead of copying them; a write after the copy copies only the nodes on
/// its path, once.
pub(crate) type Entries = imbl::OrdMap<Bytes, Entry>;

/// The key-value state: see the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvState {
    entries: Entries,
    /// The index of the next record to apply.
    applied_end: RecordIndex,
    /// The remembered idempotency keys.
    idempotency: IdempotencyTable,
    /// The store revision, the compaction point and the retained changes.
    history: mvcc::History,
    /// etcd's leases and the keys attached to each.
    leases: LeaseTable,
    /// etcd's raised alarms.
    alarms: BTreeSet<etcd::AlarmMember>,
    /// The bytes of the current keys and values.
    size_bytes: usize,
}

impl Applied {
    /// [`Applied::Done`] with no operation reported unchanged, the store
    /// revision then being `revision`.
    pub fn done(revision: Revision) -> Applied {
        Applied::Done {
            unchanged: Vec::new(),
            revision,
        }
    }
}

impl KvState {
    /// The index of the next record to apply: every record below it is reflected.
    pub fn applied_end(&self) -> RecordIndex {
        self.applied_end
    }

    /// The remembered idempotency keys.
    pub fn idempotency(&self) -> &IdempotencyTable {
        &self.idempotency
    }

    /// etcd's leases.
    pub fn leases(&self) -> &LeaseTable {
        &self.leases
    }

    /// etcd's raised alarms, by member then kind.
    pub fn alarms(&self) -> &BTreeSet<etcd::AlarmMember> {
        &self.alarms
    }

    /// The bytes of the current keys and values (what etcd's space quota
    /// weighs, with [`history_bytes`](Self::history_bytes)).
    pub fn size_bytes(&self) -> usize {
        self.size_bytes
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
            .range::<_, [u8]>((start, Bound::Unbounded))
            .take_while(|(key, _)| key.starts_with(prefix));
        let page: Vec<_> = matching.by_ref().take(limit).collect();
        let more = matching.next().is_some();
        (page, more)
    }

    /// Whether every condition of `command` holds now: the check before
    /// appending, so a failed condition appends nothing.
    pub fn check(&self, command: &Command) -> Result<(), Applied> {
        for operation in command.operations() {
            let entry = || self.entries.get(operation.key());
            let holds = match operation.condition() {
                // Most writes carry no condition: no lookup for them.
                Condition::None => continue,
                Condition::Absent => entry().is_none(),
                Condition::Version(index) => entry().is_some_and(|entry| entry.index == index),
                Condition::ModRevision(revision) => {
                    entry().is_some_and(|entry| entry.mod_revision == revision)
                }
            };
            if !holds {
                return Err(Applied::ConditionFailed {
                    key: operation.key().clone(),
                    current: entry().map(|entry| entry.mod_revision),
                });
            }
        }
        Ok(())
    }

    /// Applies record `index`. Records must come in index order from
    /// [`applied_end`](Self::applied_end) on; an index already applied (a
    /// replay overlapping the snapshot) is skipped.
    ///
    /// A stamped record first moves the idempotency table's clock and
    /// forgets expired keys; a remembered key makes it a no-op
    /// ([`Applied::Duplicate`], [`Applied::KeyReused`]); otherwise it
    /// applies and its key is remembered with the outcome.
    ///
    /// The state keeps slices of `record` rather than copies where they are
    /// most of it (a put's value; see `input::Input`), so `record` should be
    /// a buffer of its own, not a slice of a larger one it would keep alive
    /// (the runtime hands records read back from the log over as copies of
    /// their own).
    pub fn apply(&mut self, index: RecordIndex, record: &Bytes) -> Applied {
        if index < self.applied_end {
            return Applied::done(self.revision());
        }
        self.applied_end = RecordIndex(index.0 + 1);
        let record = match Record::decode_shared(record) {
            Ok(record) => record,
            Err(error) => return Applied::Malformed(error),
        };
        let Some(stamp) = &record.stamp else {
            return self.apply_body(index, &record.body);
        };
        let digest = record.digest().expect("a decoded record encodes");
        self.idempotency.advance(stamp);
        match self.idempotency.lookup(&stamp.key, &digest) {
            idempotency::Lookup::Same(remembered) => {
                return Applied::Duplicate {
                    original: remembered.index,
                    outcome: remembered.outcome.clone(),
                };
            }
            idempotency::Lookup::Different(remembered) => {
                return Applied::KeyReused {
                    original: remembered.index,
                };
            }
            idempotency::Lookup::New => {}
        }
        let applied = self.apply_body(index, &record.body);
        let outcome = match &applied {
            Applied::Done { revision, .. } => Outcome::Done {
                revision: *revision,
            },
            Applied::ConditionFailed { key, current } => Outcome::ConditionFailed {
                key: key.clone(),
                current: *current,
            },
            other => unreachable!("a decoded body applies or fails a condition: {other:?}"),
        };
        let key = stamp.key.clone();
        self.idempotency
            .record(key, digest, index, outcome, &stamp.retention);
        applied
    }

    /// Applies a decoded body: a command's operations if its conditions
    /// hold, nothing for a raw payload.
    fn apply_body(&mut self, index: RecordIndex, body: &Body) -> Applied {
        let command = match body {
            Body::Command(command) => command,
            Body::Raw(_) => return Applied::done(self.revision()),
            Body::Etcd(command) => return Applied::Etcd(self.apply_etcd(index, command)),
        };
        if let Err(failed) = self.check(command) {
            return failed;
        }
        let mut unchanged = Vec::new();
        let mut write = self.begin_write(index);
        for (position, operation) in command.operations().iter().enumerate() {
            match operation {
                Operation::Put { key, value, .. } => {
                    self.put_key(&mut write, key, value.clone(), 0);
                }
                Operation::Delete { key, .. } => {
                    if self.delete_key(&mut write, key).is_none() {
                        unchanged.push(position);
                    }
                }
            }
        }
        self.finish_write(write);
        Applied::Done {
            unchanged,
            revision: self.revision(),
        }
    }

    /// The snapshot bytes, in the newest snapshot format (5).
    pub fn encode_snapshot(&self) -> Bytes {
        snapshot::encode(self)
    }

    /// Restores a state from [`encode_snapshot`](Self::encode_snapshot)'s
    /// bytes, or from a snapshot of an earlier format.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<KvState, SnapshotError> {
        snapshot::decode(bytes)
    }
}

impl StateMachine for KvState {
    type Output = Applied;
    /// A clone: the map's keys and values are reference-counted, so this
    /// copies the tree's nodes, not the data.
    type Checkpoint = KvState;

    fn apply(&mut self, index: RecordIndex, record: &Bytes) -> Applied {
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

    /// The store revision (at least 1).
    fn revision(&self) -> u64 {
        KvState::revision(self) as u64
    }
}

impl Checkpoint for KvState {
    fn write_to(&self, sink: &mut dyn std::io::Write) -> std::io::Result<()> {
        sink.write_all(&self.encode_snapshot())
    }

    fn to_bytes(&self) -> std::io::Result<Bytes> {
        Ok(self.encode_snapshot())
    }
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

    /// The value of `key` and its version (`mod_revision`).
    fn value(state: &KvState, key: &str) -> Option<(String, Revision)> {
        state.get(key.as_bytes()).map(|entry| {
            (
                String::from_utf8(entry.value.to_vec()).unwrap(),
                entry.mod_revision,
            )
        })
    }

    /// A put's value is a slice of the record applied, not a copy; its key,
    /// a small part of the record, is a copy, so that a key overwritten by
    /// later puts never keeps its first record alive.
    #[test]
    fn a_put_keeps_a_slice_of_its_record_for_its_value() {
        let mut state = KvState::default();
        let value = "v".repeat(1024);
        let record = put("key", &value, Condition::None);
        state.apply(RecordIndex(0), &record);
        let entry = state.get(b"key").expect("put");
        assert_eq!(entry.value, value.as_bytes());
        assert!(record.as_ptr_range().contains(&entry.value.as_ptr()));
        let (key, _) = state.entries.get_key_value(&b"key"[..]).unwrap();
        assert!(!record.as_ptr_range().contains(&key.as_ptr()));
    }

    #[test]
    fn a_checkpoint_keeps_its_state_while_the_original_moves_on() {
        let mut state = KvState::default();
        // Enough revisions to fill blocks of the retained history.
        for i in 0..40u64 {
            let key = format!("k{}", i % 7);
            state.apply(RecordIndex(i), &put(&key, &i.to_string(), Condition::None));
        }
        let copy = state.checkpoint();
        let encoded = copy.encode_snapshot();
        for i in 40..80u64 {
            let key = format!("k{}", i % 9);
            state.apply(RecordIndex(i), &put(&key, "later", Condition::None));
        }
        state.apply(RecordIndex(80), &delete("k0", Condition::None));
        assert_eq!(copy.encode_snapshot(), encoded);
        assert_eq!(value(&copy, "k0"), Some(("35".into(), 37)));
        assert_eq!(value(&state, "k0"), None);
        assert_eq!(KvState::decode_snapshot(&encoded).unwrap(), copy);
    }

    #[test]
    fn versions_are_the_revision_that_last_set_the_key() {
        let mut state = KvState::default();
        state.apply(RecordIndex(0), &Bytes::from_static(b"not a command"));
        assert_eq!(
            state.apply(RecordIndex(1), &put("a", "1", Condition::None)),
            Applied::done(2)
        );
        assert_eq!(
            state.apply(RecordIndex(2), &put("b", "2", Condition::Absent)),
            Applied::done(3)
        );
        // If-Match compares the revision, not the index that set the key.
        let by_index = put("a", "3", Condition::ModRevision(1));
        assert!(matches!(
            state.apply(RecordIndex(3), &by_index),
            Applied::ConditionFailed {
                current: Some(2),
                ..
            }
        ));
        let cas = put("a", "3", Condition::ModRevision(2));
        assert_eq!(state.apply(RecordIndex(4), &cas), Applied::done(4));
        assert_eq!(value(&state, "a"), Some(("3".into(), 4)));
        assert_eq!(value(&state, "b"), Some(("2".into(), 3)));
        assert_eq!(state.applied_end(), RecordIndex(5));
    }

    #[test]
    fn a_condition_of_an_earlier_version_still_compares_the_index() {
        // Records written before revisions hold the index that last set the
        // key; they apply as they did then.
        let mut state = KvState::default();
        state.apply(RecordIndex(0), &Bytes::from_static(b"not a command"));
        state.apply(RecordIndex(1), &put("a", "1", Condition::None));
        let stale = put("a", "2", Condition::Version(RecordIndex(2)));
        assert!(matches!(
            state.apply(RecordIndex(2), &stale),
            Applied::ConditionFailed {
                current: Some(2),
                ..
            }
        ));
        let cas = put("a", "2", Condition::Version(RecordIndex(1)));
        assert_eq!(state.apply(RecordIndex(3), &cas), Applied::done(3));
        assert_eq!(value(&state, "a"), Some(("2".into(), 3)));
    }

    #[test]
    fn a_failed_condition_changes_nothing() {
        let mut state = KvState::default();
        state.apply(RecordIndex(0), &put("a", "1", Condition::None));
        let before = state.clone();
        let stale = put("a", "2", Condition::ModRevision(7));
        assert_eq!(
            state.check(&Command::decode(&stale).unwrap()),
            Err(Applied::ConditionFailed {
                key: Bytes::from_static(b"a"),
                current: Some(2),
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
        let failing = batch(Condition::ModRevision(5));
        assert!(matches!(
            state.apply(RecordIndex(1), &failing),
            Applied::ConditionFailed { .. }
        ));
        assert_eq!(value(&state, "b"), None);
        // One record, one revision for every key it writes.
        assert_eq!(
            state.apply(RecordIndex(2), &batch(Condition::ModRevision(2))),
            Applied::done(3)
        );
        assert_eq!(value(&state, "a"), None);
        assert_eq!(value(&state, "b"), Some(("2".into(), 3)));
    }

    #[test]
    fn deleting_an_absent_key_reports_that_nothing_changed() {
        let mut state = KvState::default();
        state.apply(RecordIndex(0), &put("a", "1", Condition::None));
        // A delete of nothing moves no revision.
        assert_eq!(
            state.apply(RecordIndex(1), &delete("b", Condition::None)),
            Applied::Done {
                unchanged: vec![0],
                revision: 2
            }
        );
        assert_eq!(
            state.apply(RecordIndex(2), &delete("a", Condition::None)),
            Applied::done(3)
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
                unchanged: vec![1, 2, 3],
                revision: 4
            }
        );
        assert_eq!(value(&state, "c"), Some(("3".into(), 4)));
    }

    #[test]
    fn a_record_that_is_not_a_command_is_skipped() {
        let mut state = KvState::default();
        assert!(matches!(
            state.apply(RecordIndex(0), &Bytes::from_static(b"raw log record")),
            Applied::Malformed(_)
        ));
        assert!(state.is_empty());
        assert_eq!(state.applied_end(), RecordIndex(1));
        // A replay overlapping what is applied changes nothing.
        state.apply(RecordIndex(1), &put("a", "1", Condition::None));
        state.apply(RecordIndex(1), &put("a", "other", Condition::None));
        assert_eq!(value(&state, "a"), Some(("1".into(), 2)));
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

    const RETAIN: Retention = Retention {
        max_keys: 100,
        max_age_ms: 60_000,
        max_bytes: idempotency::DEFAULT_RETAINED_BYTES,
    };

    fn stamped(body: Body, key: &str, at_ms: u64, retention: Retention) -> Bytes {
        Record {
            stamp: Some(Stamp {
                key: IdempotencyKey::new(key.to_owned()).unwrap(),
                at_ms,
                retention,
            }),
            body,
        }
        .encode()
        .unwrap()
    }

    fn stamped_put(key: &str, value: &str, condition: Condition, idempotency_key: &str) -> Bytes {
        let command = Command::decode(&put(key, value, condition)).unwrap();
        stamped(Body::Command(command), idempotency_key, 1000, RETAIN)
    }

    #[test]
    fn a_snapshot_fits_the_room_reserved_for_it() {
        let mut state = KvState::default();
        let mut index = 0;
        let mut apply = |state: &mut KvState, record: Bytes| {
            state.apply(RecordIndex(index), &record);
            index += 1;
        };
        for n in 0..2000 {
            let key = format!("key/{}", n % 37);
            let value = "v".repeat(n % 500);
            apply(&mut state, put(&key, &value, Condition::None));
            apply(
                &mut state,
                stamped_put(&key, &value, Condition::Absent, &format!("op-{n}")),
            );
            if n % 3 == 0 {
                apply(&mut state, delete(&key, Condition::None));
            }
        }
        assert!(!state.idempotency().is_empty() && state.history.bytes() > 0);
        let encoded = state.encode_snapshot();
        let hint = snapshot::encoded_bytes_hint(&state);
        assert!(
            encoded.len() <= hint,
            "{} bytes, {hint} reserved",
            encoded.len()
        );
    }

    #[test]
    fn a_duplicate_record_is_a_no_op_that_answers_the_original_outcome() {
        let mut state = KvState::default();
        let first = stamped_put("a", "1", Condition::None, "op-1");
        assert_eq!(state.apply(RecordIndex(0), &first), Applied::done(2));
        state.apply(RecordIndex(1), &put("a", "2", Condition::None));
        // The retry (or a concurrent twin) of op-1 applies nothing: a stays 2,
        // and it answers the revision op-1 wrote.
        assert_eq!(
            state.apply(RecordIndex(2), &first),
            Applied::Duplicate {
                original: RecordIndex(0),
                outcome: Outcome::Done { revision: 2 }
            }
        );
        assert_eq!(value(&state, "a"), Some(("2".into(), 3)));
        // A failed condition is an outcome too, answered again as it was.
        let stale = stamped_put("a", "3", Condition::ModRevision(2), "op-2");
        let failed = Applied::ConditionFailed {
            key: Bytes::from_static(b"a"),
            current: Some(3),
        };
        assert_eq!(state.apply(RecordIndex(3), &stale), failed);
        state.apply(RecordIndex(4), &delete("a", Condition::None));
        assert_eq!(
            state.apply(RecordIndex(5), &stale),
            Applied::Duplicate {
                original: RecordIndex(3),
                outcome: Outcome::ConditionFailed {
                    key: Bytes::from_static(b"a"),
                    current: Some(3),
                }
            }
        );
        assert_eq!(value(&state, "a"), None);
        assert_eq!(state.idempotency().len(), 2);
        assert_eq!(state.applied_end(), RecordIndex(6));
    }

    #[test]
    fn a_key_reused_for_a_different_request_changes_nothing() {
        let mut state = KvState::default();
        state.apply(RecordIndex(0), &stamped_put("a", "1", Condition::None, "k"));
        let before = state.clone();
        let other_value = stamped_put("a", "2", Condition::None, "k");
        let other_key = stamped_put("b", "1", Condition::None, "k");
        let conditional = stamped_put("a", "1", Condition::Absent, "k");
        let raw = stamped(Body::Raw(Bytes::from_static(b"x")), "k", 1000, RETAIN);
        for (index, record) in [other_value, other_key, conditional, raw]
            .iter()
            .enumerate()
        {
            let index = RecordIndex(index as u64 + 1);
            assert_eq!(
                state.apply(index, record),
                Applied::KeyReused {
                    original: RecordIndex(0)
                },
                "{index}"
            );
        }
        assert_eq!(state.entries, before.entries);
        assert_eq!(state.idempotency(), before.idempotency());
    }

    #[test]
    fn a_raw_payload_with_a_key_changes_no_key_but_is_remembered() {
        let mut state = KvState::default();
        let raw = stamped(Body::Raw(Bytes::from_static(b"event")), "r", 5, RETAIN);
        assert_eq!(state.apply(RecordIndex(0), &raw), Applied::done(1));
        assert!(state.is_empty());
        assert_eq!(
            state.apply(RecordIndex(1), &raw),
            Applied::Duplicate {
                original: RecordIndex(0),
                outcome: Outcome::Done { revision: 1 }
            }
        );
    }

    #[test]
    fn retention_is_judged_from_the_records_by_count_and_by_age() {
        let mut state = KvState::default();
        let by_count = Retention {
            max_keys: 2,
            max_age_ms: 60_000,
            max_bytes: idempotency::DEFAULT_RETAINED_BYTES,
        };
        let record = |key: &str, at_ms: u64, retention: Retention| {
            let command = Command::decode(&put(key, "v", Condition::None)).unwrap();
            stamped(Body::Command(command), key, at_ms, retention)
        };
        for (index, key) in ["a", "b", "c"].into_iter().enumerate() {
            state.apply(RecordIndex(index as u64), &record(key, 1000, by_count));
        }
        // a was forgotten: its retry is a new write, and applies again.
        assert_eq!(state.idempotency().len(), 2);
        assert_eq!(
            state.apply(RecordIndex(3), &record("a", 1000, by_count)),
            Applied::done(5)
        );
        assert_eq!(value(&state, "a"), Some(("v".into(), 5)));
        // By age: the stamps' times, never the applying process's clock.
        let by_age = Retention {
            max_keys: 100,
            max_age_ms: 500,
            max_bytes: idempotency::DEFAULT_RETAINED_BYTES,
        };
        assert!(matches!(
            state.apply(RecordIndex(4), &record("c", 1499, by_age)),
            Applied::Duplicate { .. }
        ));
        state.apply(RecordIndex(5), &record("d", 1500, by_age));
        let (oldest, remembered) = state.idempotency().oldest().unwrap();
        assert_eq!((oldest.as_str(), remembered.index), ("d", RecordIndex(5)));
        assert_eq!(
            state.apply(RecordIndex(6), &record("c", 1500, by_age)),
            Applied::done(7)
        );
    }

    /// A format-1 snapshot, as written before idempotency keys: applied_end
    /// 3, a = "1" set by record 0, b = "22" by record 2.
    pub(super) fn format_one_snapshot() -> Vec<u8> {
        let mut bytes = b"CHKS\x01".to_vec();
        bytes.extend_from_slice(&3u64.to_le_bytes());
        bytes.extend_from_slice(&2u64.to_le_bytes());
        bytes.extend_from_slice(b"\x01\0\0\0a\0\0\0\0\0\0\0\0\x01\0\0\x001");
        bytes.extend_from_slice(b"\x01\0\0\0b\x02\0\0\0\0\0\0\0\x02\0\0\x0022");
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    #[test]
    fn a_previous_format_snapshot_decodes_with_no_remembered_keys() {
        let bytes = format_one_snapshot();
        let state = KvState::decode_snapshot(&bytes).unwrap();
        assert_eq!(state.applied_end(), RecordIndex(3));
        // Index versions map to revisions: index i is revision i + 1.
        assert_eq!(value(&state, "a"), Some(("1".into(), 1)));
        assert_eq!(value(&state, "b"), Some(("22".into(), 3)));
        assert!(state.idempotency().is_empty());
        // It is written back in the current format, which keeps the same state.
        let encoded = state.encode_snapshot();
        assert_eq!(encoded[4], snapshot::FORMAT_LEASES);
        assert_eq!(KvState::decode_snapshot(&encoded).unwrap(), state);
        // A format-1 snapshot followed by an idempotency part is refused.
        let mut longer = bytes[..bytes.len() - 4].to_vec();
        longer.extend_from_slice(&[0; 16]);
        let crc = crc32c::crc32c(&longer);
        longer.extend_from_slice(&crc.to_le_bytes());
        assert!(KvState::decode_snapshot(&longer).is_err());
    }

    /// A format-2 snapshot: applied_end 3, a = "1" set at index 1, and two
    /// remembered keys: `done` (record 1, done) and `failed` (record 2, a
    /// failed condition on a, then at version 1).
    fn format_two_snapshot() -> Vec<u8> {
        let mut bytes = b"CHKS\x02".to_vec();
        bytes.extend_from_slice(&3u64.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(b"\x01\0\0\0a\x01\0\0\0\0\0\0\0\x01\0\0\x001");
        bytes.extend_from_slice(&50u64.to_le_bytes()); // clock_ms
        bytes.extend_from_slice(&2u64.to_le_bytes());
        for (key, index) in [("done", 1u64), ("failed", 2)] {
            bytes.push(key.len() as u8);
            bytes.extend_from_slice(key.as_bytes());
            bytes.extend_from_slice(&[7; 32]);
            bytes.extend_from_slice(&index.to_le_bytes());
            bytes.extend_from_slice(&10u64.to_le_bytes()); // recorded_ms
            match key {
                "done" => bytes.push(0),
                _ => {
                    bytes.extend_from_slice(b"\x01\x01\0\0\0a\x01");
                    bytes.extend_from_slice(&1u64.to_le_bytes());
                }
            }
        }
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    #[test]
    fn a_format_two_table_answers_revisions_mapped_as_its_entries_are() {
        let state = KvState::decode_snapshot(&format_two_snapshot()).unwrap();
        assert_eq!(value(&state, "a"), Some(("1".into(), 2)));
        let outcome = |key: &str| {
            let key = IdempotencyKey::new(key.to_owned()).unwrap();
            match state.idempotency().lookup(&key, &[7; 32]) {
                idempotency::Lookup::Same(remembered) => remembered.outcome.clone(),
                other => panic!("{key}: {other:?}"),
            }
        };
        // The write at record 1 answers revision 2, the key's mod_revision.
        assert_eq!(outcome("done"), Outcome::Done { revision: 2 });
        // The failed condition saw a at index 1: revision 2, as a's entry.
        assert_eq!(
            outcome("failed"),
            Outcome::ConditionFailed {
                key: Bytes::from_static(b"a"),
                current: Some(2),
            }
        );
        let encoded = state.encode_snapshot();
        assert_eq!(encoded[4], snapshot::FORMAT_LEASES);
        assert_eq!(KvState::decode_snapshot(&encoded).unwrap(), state);
    }

    #[test]
    fn format_three_and_four_snapshots_still_decode() {
        // Format 4 is format 5 without the lease and alarm counts (none),
        // format 3 differs from 4 only in its table; with no remembered key,
        // lease or alarm the bytes are the same but for the format and those.
        let mut state = KvState::default();
        state.apply(RecordIndex(0), &put("a", "1", Condition::None));
        for format in [3, 4] {
            let mut bytes = state.encode_snapshot()[..].to_vec();
            bytes.truncate(bytes.len() - 4 - 8 - 8);
            bytes[4] = format;
            let crc = crc32c::crc32c(&bytes);
            bytes.extend_from_slice(&crc.to_le_bytes());
            assert_eq!(KvState::decode_snapshot(&bytes).unwrap(), state);
        }
    }

    #[test]
    fn snapshots_round_trip_and_damage_is_refused() {
        let mut state = KvState::default();
        for index in 0..20u64 {
            let key = format!("key-{:02}", index % 7);
            let record = if index % 3 == 0 {
                stamped_put(
                    &key,
                    &index.to_string(),
                    Condition::None,
                    &format!("op-{index}"),
                )
            } else {
                put(&key, &index.to_string(), Condition::None)
            };
            state.apply(RecordIndex(index), &record);
        }
        let failing = stamped_put("key-00", "x", Condition::Absent, "failing");
        state.apply(RecordIndex(20), &failing);
        assert_eq!(state.idempotency().len(), 8);
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
