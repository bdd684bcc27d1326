//! The changes of the newest revisions, taken as each record applies, for
//! the watches whose stream had not run yet when a compaction passed them.
//!
//! etcd hands a synced watcher each revision's events as the revision
//! applies; a Chorus stream reads the retained history when its task next
//! runs. Between the two a compaction may drop revisions a synced watch is
//! still owed, and without the feed that watch would be canceled where
//! etcd's is not. The feed keeps the changes of the newest
//! [`FEED_REVISIONS`] revisions (at most [`FEED_BYTES`] charged bytes; a
//! revision charged more alone is never held); they share their keys and
//! values with the history, so the feed costs little until a compaction
//! makes it the last holder. A watch that fell further
//! behind than the feed reaches is canceled, as etcd cancels a watcher
//! whose send queue overflowed and that could not catch up before a
//! compaction.
//!
//! The feed lives beside the state machine, never in it: snapshots, hashes
//! and every replica's state are the same with or without watches.

use std::collections::VecDeque;
use std::sync::Arc;

use chorus::kv::Revision;
use chorus::kv::mvcc::{Change, History};

/// Most revisions the feed holds.
pub const FEED_REVISIONS: usize = if cfg!(test) { 8 } else { 10_000 };
/// Most bytes the feed's changes are charged ([`Change::charged_bytes`]).
pub const FEED_BYTES: usize = if cfg!(test) { 4 << 10 } else { 64 << 20 };

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct AppliedFeed {
    /// Each revision, ascending, with its changes and what they are
    /// charged.
    revisions: VecDeque<(Revision, Arc<[Change]>, usize)>,
    /// The lowest revision from which every revision's changes are held
    /// (a revision with no changes has no entry).
    from: Revision,
    /// The store revision when the feed last took changes.
    to: Revision,
    /// What the held changes are charged.
    bytes: usize,
    /// Open watch streams: with none, the feed holds nothing.
    streams: usize,
}

impl AppliedFeed {
    /// Takes the changes of the revisions `history` reached since the last
    /// call. Runs under the runtime's state lock after every record.
    pub(crate) fn take(&mut self, history: &History) {
        let current = history.revision();
        if current == self.to {
            return;
        }
        if self.streams == 0 {
            (self.from, self.to) = (current + 1, current);
            return;
        }
        // A state from another past (a restored snapshot): start over from
        // the history's oldest revision, or the newest the feed may hold.
        let compacted = history.compact_revision();
        if current < self.to || self.to + 1 < compacted {
            self.revisions.clear();
            self.bytes = 0;
            let from = compacted.max(current - FEED_REVISIONS as Revision + 1);
            (self.from, self.to) = (from, from - 1);
        }
        for (revision, changes) in history.changes(self.to + 1, current) {
            let bytes = changes.iter().map(Change::charged_bytes).sum::<usize>();
            if bytes > FEED_BYTES {
                // Never held (a delete of a whole large range): not copied
                // under the lock only to be dropped.
                self.revisions.clear();
                self.bytes = 0;
                self.from = revision + 1;
                continue;
            }
            self.bytes += bytes;
            self.revisions.push_back((revision, changes.into(), bytes));
        }
        self.to = current;
        while self.revisions.len() > FEED_REVISIONS || self.bytes > FEED_BYTES {
            let (revision, _, bytes) = self.revisions.pop_front().expect("over a bound");
            self.bytes -= bytes;
            self.from = revision + 1;
        }
    }

    /// The changes of revisions `from..=to`, if the feed holds all of them.
    pub(crate) fn changes(
        &self,
        from: Revision,
        to: Revision,
    ) -> Option<impl Iterator<Item = (Revision, &[Change])>> {
        (from >= self.from && to <= self.to).then(|| {
            let first = self.revisions.partition_point(|(at, ..)| *at < from);
            self.revisions
                .range(first..)
                .take_while(move |(at, ..)| *at <= to)
                .map(|(at, changes, _)| (*at, &changes[..]))
        })
    }

    /// A stream opened: the feed holds the revisions applied from now on.
    pub(crate) fn open_stream(&mut self) {
        self.streams += 1;
    }

    /// A stream ended; the last one empties the feed.
    pub(crate) fn close_stream(&mut self) {
        self.streams -= 1;
        if self.streams == 0 {
            self.revisions.clear();
            self.bytes = 0;
            self.from = self.to + 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use chorus::ids::RecordIndex;
    use chorus::kv::etcd::{CompactionRequest, PutRequest};
    use chorus::kv::{EtcdCommand, KvState};

    use super::*;

    /// A store applying etcd requests, one record each.
    #[derive(Default)]
    struct Store {
        state: KvState,
        applied: u64,
    }

    impl Store {
        fn apply(&mut self, command: EtcdCommand) -> &History {
            self.state
                .apply(RecordIndex(self.applied), &command.encode());
            self.applied += 1;
            self.state.history()
        }

        /// Puts until the store is at `revision`.
        fn put_to(&mut self, revision: Revision) -> &History {
            while self.state.history().revision() < revision {
                self.apply(EtcdCommand::Put(PutRequest {
                    key: Bytes::from_static(b"k"),
                    ..PutRequest::default()
                }));
            }
            self.state.history()
        }

        fn compact(&mut self, revision: Revision) -> &History {
            self.apply(EtcdCommand::Compact(CompactionRequest {
                revision,
                physical: false,
            }))
        }
    }

    fn held(feed: &AppliedFeed, from: Revision, to: Revision) -> Option<Vec<Revision>> {
        feed.changes(from, to)
            .map(|changes| changes.map(|(revision, _)| revision).collect())
    }

    #[test]
    fn holds_nothing_without_a_stream_then_each_revision_applied_after_one_opened() {
        let mut store = Store::default();
        let mut feed = AppliedFeed::default();
        feed.take(store.put_to(3));
        assert_eq!(held(&feed, 3, 3), None);
        feed.open_stream();
        feed.take(store.put_to(4));
        feed.take(store.put_to(5));
        feed.take(store.compact(5));
        feed.take(store.put_to(6));
        assert_eq!(held(&feed, 4, 6), Some(vec![4, 5, 6]));
        assert_eq!(held(&feed, 5, 5), Some(vec![5]));
        assert_eq!(held(&feed, 3, 6), None, "revision 3 applied before");
        assert_eq!(held(&feed, 4, 7), None, "revision 7 is not applied");
        feed.close_stream();
        assert_eq!(held(&feed, 6, 6), None, "emptied");
        feed.take(store.put_to(7));
        assert_eq!(held(&feed, 7, 7), None);
    }

    #[test]
    fn keeps_the_newest_revisions_within_its_bound() {
        let mut store = Store::default();
        let mut feed = AppliedFeed::default();
        feed.open_stream();
        for revision in 2..=21 {
            feed.take(store.put_to(revision));
        }
        let oldest = 21 - FEED_REVISIONS as Revision + 1;
        assert_eq!(held(&feed, oldest - 1, 21), None);
        assert_eq!(
            held(&feed, oldest, 21),
            Some((oldest..=21).collect::<Vec<_>>())
        );
    }

    #[test]
    fn a_revision_larger_than_its_bound_is_never_held_nor_anything_before_it() {
        let mut store = Store::default();
        let mut feed = AppliedFeed::default();
        feed.open_stream();
        feed.take(store.put_to(3));
        let large = PutRequest {
            key: Bytes::from_static(b"k"),
            value: Bytes::from(vec![b'v'; FEED_BYTES]),
            ..PutRequest::default()
        };
        feed.take(store.apply(EtcdCommand::Put(large)));
        feed.take(store.put_to(5));
        // Revision 5's change is charged the large value it replaced.
        assert_eq!(held(&feed, 4, 5), None);
        feed.take(store.put_to(7));
        assert_eq!(held(&feed, 6, 7), Some(vec![6, 7]));
        assert_eq!(held(&feed, 5, 7), None);
    }

    #[test]
    fn a_state_from_another_past_restarts_it_from_the_newest_revisions_it_may_hold() {
        let mut feed = AppliedFeed::default();
        feed.open_stream();
        let mut store = Store::default();
        feed.take(store.put_to(2));
        feed.take(store.put_to(3));
        // A restored snapshot far ahead, compacted above what was taken.
        let mut ahead = Store::default();
        ahead.put_to(10);
        feed.take(ahead.compact(8));
        assert_eq!(held(&feed, 3, 10), None);
        assert_eq!(held(&feed, 8, 10), Some(vec![8, 9, 10]));
        // Then one behind what was taken, never compacted: the feed takes
        // only the newest revisions it may hold.
        let mut behind = Store::default();
        feed.take(behind.put_to(9));
        assert_eq!(held(&feed, 1, 9), None);
        assert_eq!(held(&feed, 2, 9), Some((2..=9).collect::<Vec<_>>()));
    }
}
