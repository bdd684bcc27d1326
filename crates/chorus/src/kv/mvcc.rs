//! Revisions and history: what makes the key-value map multi-version.
//!
//! The store revision starts at 1 on an empty store and rises by exactly 1
//! per applied transaction (a record) that changed something; every key
//! written by that transaction gets it as its `mod_revision`. The map
//! itself holds only the current entries; the past lives in
//! [`History`]: for each revision above the compaction point, the keys it
//! changed with their entries before and after. A read at a past revision
//! `r` takes the current entries and undoes, key by key, every change above
//! `r` (the earliest such change of a key holds its entry as of `r`). A
//! watch lists the changes of a revision range directly, with the previous
//! entries.
//!
//! Compaction at `c` forgets the changes below `c`: reads at `c` and above
//! undo only changes above `c`, so they still answer what was current then.

use std::collections::BTreeMap;
use std::ops::Bound;

use bytes::Bytes;

use super::Entry;
use super::etcd::{KeyValue, Revision};
use super::retained::RetainedChanges;

/// The bytes one retained change is charged beyond its key and previous
/// value: the change record, two entries' metadata and the map's node share.
pub const CHANGE_OVERHEAD_BYTES: usize = 160;

/// The most bytes of history the machine retains (see
/// [`Change::charged_bytes`]) before it compacts on its own. A constant of
/// the machine, so every replica running this code drops the same history.
pub const HISTORY_BUDGET_BYTES: usize = 256 * 1024 * 1024;

/// A compaction for the budget trims the history to this share of it
/// (percent), so it runs once per many writes rather than on every one.
pub const HISTORY_TRIM_PERCENT: usize = 75;

/// The compaction revision that brings `history` within `budget_bytes`:
/// `None` while it fits; otherwise the lowest revision whose dropping of
/// everything below it leaves at most [`HISTORY_TRIM_PERCENT`] of the
/// budget, never above the current revision nor at or below the current
/// compaction revision. Pure, so every replica picks the same.
pub fn compaction_for_budget(history: &History, budget_bytes: usize) -> Option<Revision> {
    if history.bytes <= budget_bytes {
        return None;
    }
    let target = budget_bytes / 100 * HISTORY_TRIM_PERCENT;
    let mut remaining = history.bytes;
    let mut revision = history.compacted + 1;
    for (at, changes) in history.changes.iter() {
        if remaining <= target {
            break;
        }
        remaining -= changes.iter().map(Change::charged_bytes).sum::<usize>();
        revision = at + 1;
    }
    let revision = revision.min(history.revision);
    (revision > history.compacted).then_some(revision)
}

/// One key's change at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The key.
    pub key: Bytes,
    /// Its entry before the change (`None`: absent).
    pub before: Option<Entry>,
    /// Its entry after the change (`None`: deleted).
    pub after: Option<Entry>,
}

/// The store revision, the compaction point and the retained changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    /// The current store revision.
    pub(super) revision: Revision,
    /// etcd's compaction revision: -1 until the first compaction (so a
    /// first `Compact(0)` is accepted, as etcd accepts it).
    pub(super) compacted: Revision,
    /// The changes of each retained revision, in the order they applied.
    pub(super) changes: RetainedChanges,
    /// The bytes charged for the retained changes (see [`Change::charged_bytes`]).
    pub(super) bytes: usize,
}

impl Default for History {
    fn default() -> History {
        History {
            revision: 1,
            compacted: -1,
            changes: RetainedChanges::default(),
            bytes: 0,
        }
    }
}

impl Change {
    /// What retaining this change costs, in bytes: the key, the previous
    /// value (the new one is the current entry's or a later change's
    /// previous one, counted there) and [`CHANGE_OVERHEAD_BYTES`].
    pub fn charged_bytes(&self) -> usize {
        let before = self.before.as_ref().map_or(0, |entry| entry.value.len());
        CHANGE_OVERHEAD_BYTES + self.key.len() + before
    }
}

impl History {
    /// The current store revision.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// The compaction revision (0 until the first compaction).
    pub fn compact_revision(&self) -> Revision {
        self.compacted.max(0)
    }

    /// The bytes charged for the retained changes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The retained changes of revisions `from..=to`, in order.
    pub fn changes(
        &self,
        from: Revision,
        to: Revision,
    ) -> impl Iterator<Item = (Revision, &[Change])> {
        let (from, to) = (from.max(0), to.max(from.max(0)));
        self.changes
            .iter_from(from)
            .take_while(move |(revision, _)| *revision <= to)
    }

    /// Compacts to stay within `budget_bytes` (see [`compaction_for_budget`]).
    pub(super) fn keep_within(&mut self, budget_bytes: usize) {
        if let Some(revision) = compaction_for_budget(self, budget_bytes) {
            self.compact(revision);
        }
    }

    /// Records `change` at `revision` (the revision being written).
    pub(super) fn record(&mut self, revision: Revision, change: Change) {
        self.bytes += change.charged_bytes();
        self.changes.push(revision, change);
    }

    /// Forgets the changes below `revision` and makes it the compaction
    /// revision. The caller checked etcd's bounds.
    pub(super) fn compact(&mut self, revision: Revision) {
        let mut freed = 0;
        self.changes
            .forget_below(revision, |change| freed += change.charged_bytes());
        self.bytes -= freed;
        self.compacted = revision;
    }

    /// The entries as of `revision` of the keys in `[start, end)` that
    /// changed after it: each key's entry before its earliest later change.
    pub(super) fn undo_after(
        &self,
        revision: Revision,
        start: &Bytes,
        end: &Bound<Bytes>,
    ) -> BTreeMap<Bytes, Option<Entry>> {
        let mut past = BTreeMap::new();
        let later = self.changes.iter_from(revision.saturating_add(1));
        for change in later.flat_map(|(_, changes)| changes) {
            if key_in(&change.key, start, end) && !past.contains_key(&change.key) {
                past.insert(change.key.clone(), change.before.clone());
            }
        }
        past
    }
}

/// Whether `key` lies in `[start, end)`.
pub(super) fn key_in(key: &Bytes, start: &Bytes, end: &Bound<Bytes>) -> bool {
    key >= start
        && match end {
            Bound::Unbounded => true,
            Bound::Excluded(end) => key < end,
            Bound::Included(end) => key <= end,
        }
}

/// etcd's key range of a request: an empty `range_end` is the single key,
/// `"\0"` every key from `key` on, otherwise `[key, range_end)`.
pub(super) fn key_range(key: &Bytes, range_end: &Bytes) -> Bound<Bytes> {
    match range_end.as_ref() {
        [] => Bound::Included(key.clone()),
        [0] => Bound::Unbounded,
        _ => Bound::Excluded(range_end.clone()),
    }
}

impl Entry {
    /// The entry as etcd's `KeyValue` of `key`.
    pub fn key_value(&self, key: &Bytes) -> KeyValue {
        KeyValue {
            key: key.clone(),
            value: self.value.clone(),
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            version: self.version,
            lease: self.lease,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::RecordIndex;

    fn change(value_bytes: usize) -> Change {
        let entry = Entry {
            value: Bytes::from(vec![0; value_bytes]),
            index: RecordIndex(0),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 0,
        };
        Change {
            key: Bytes::from_static(b"k"),
            before: Some(entry),
            after: None,
        }
    }

    #[test]
    fn the_budget_compacts_the_oldest_revisions_to_three_quarters() {
        let mut history = History::default();
        for revision in 2..=11 {
            history.record(revision, change(1000 - CHANGE_OVERHEAD_BYTES - 1));
            history.revision = revision;
        }
        assert_eq!(history.bytes(), 10_000);
        assert_eq!(compaction_for_budget(&history, 10_000), None);
        // Over 8,000: keep at most 6,000, so drop revisions 2 to 5.
        assert_eq!(compaction_for_budget(&history, 8_000), Some(6));
        history.keep_within(8_000);
        assert_eq!((history.bytes(), history.compact_revision()), (6_000, 6));
        // Never past the current revision, nor at or below the compaction.
        assert_eq!(compaction_for_budget(&history, 0), Some(11));
        history.compact(11);
        history.record(11, change(100));
        assert_eq!(compaction_for_budget(&history, 0), None);
    }

    #[test]
    fn key_ranges_follow_etcds_conventions() {
        let a = Bytes::from_static(b"a");
        let single = key_range(&a, &Bytes::new());
        assert!(key_in(&a, &a, &single));
        assert!(!key_in(&Bytes::from_static(b"a\0"), &a, &single));
        let from = key_range(&a, &Bytes::from_static(b"\0"));
        assert!(key_in(&Bytes::from_static(b"zzz"), &a, &from));
        assert!(!key_in(&Bytes::from_static(b"\0"), &a, &from));
        let half_open = key_range(&a, &Bytes::from_static(b"c"));
        assert!(key_in(&Bytes::from_static(b"b"), &a, &half_open));
        assert!(!key_in(&Bytes::from_static(b"c"), &a, &half_open));
    }
}
