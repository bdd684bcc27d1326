//! The applied state: the machine, the index it reflects, and a bounded
//! history of recent changes for watchers that resume from an index.

use std::collections::VecDeque;

use bytes::Bytes;

use super::held::HeldRun;
use super::machine::StateMachine;
use crate::ids::RecordIndex;

/// One applied record and what applying it answered.
#[derive(Debug, Clone)]
pub struct Change<O> {
    /// The record's index.
    pub index: RecordIndex,
    /// The record.
    pub record: Bytes,
    /// The machine's output for it.
    pub output: O,
    /// The machine's revision after it ([`StateMachine::revision`]).
    pub revision: u64,
}

/// A watcher asked for changes the history no longer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("history compacted: requested={requested} oldest={oldest}")]
pub struct HistoryGap {
    /// The index asked for.
    pub requested: RecordIndex,
    /// The oldest index still held.
    pub oldest: RecordIndex,
}

/// A watcher asked for changes from a revision the history no longer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("history compacted: requested_revision={requested} oldest_revision={oldest}")]
pub struct RevisionGap {
    /// The revision asked for.
    pub requested: u64,
    /// The oldest revision whose changes are all still held.
    pub oldest: u64,
}

/// A committed record that differs from the record applied at its index:
/// the state here is not the log's prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the committed record at index {index} differs from the record applied there")]
pub(super) struct Divergence {
    /// The index where the two differ.
    pub(super) index: RecordIndex,
}

/// A caller's function run on the state after each applied record (and each
/// restored snapshot); see [`Runtime::observe_applied`](super::Runtime::observe_applied).
/// It answers whether to keep calling it.
pub(super) type ApplyObserver<M> = Box<dyn FnMut(&M) -> bool + Send>;

/// The machine and what it reflects. Guarded by one lock in the runtime; every
/// method is quick and does no I/O.
pub(super) struct Core<M: StateMachine> {
    pub(super) machine: M,
    /// The next index to apply: every record below it is reflected.
    applied_end: RecordIndex,
    /// Bytes of every record applied by this process, restored snapshots
    /// not counted: what the snapshot schedule measures the log since a
    /// snapshot by.
    applied_bytes: u64,
    /// Whether the state is known to be the log's prefix below `applied_end`:
    /// restored from a snapshot, or started empty on a database that had no
    /// snapshot yet (the first snapshot is that empty state). Until then a
    /// boot must restore HEAD's payload.
    known: bool,
    history: VecDeque<Change<M::Output>>,
    /// Record bytes of the changes in `history`.
    history_bytes: usize,
    budget: HistoryBudget,
    /// The machine's revision before the oldest change `history` holds:
    /// every change that moved it above this is held.
    floor_revision: u64,
    /// The revision of an empty machine, which no change is at.
    initial_revision: u64,
    /// Whether committed records handed over by another node are taken
    /// ([`offer`](Self::offer)): only while a standby tails the log.
    following: bool,
    /// Such records ahead of the applied end.
    held: HeldRun,
    /// Set when a handed-over record turned out to differ from the log's;
    /// the standby stops on it.
    diverged: Option<Divergence>,
    /// Run after every change of the machine.
    observers: Vec<ApplyObserver<M>>,
}

/// How much of the recent past the history keeps: it drops its oldest
/// changes while it holds more than either bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HistoryBudget {
    /// Most changes kept; 0 keeps no history.
    pub(super) max_records: usize,
    /// Most record bytes kept.
    pub(super) max_bytes: usize,
}

impl HistoryBudget {
    /// Whether a history of `records` changes holding `bytes` record bytes
    /// must drop its oldest.
    pub(super) fn exceeded(&self, records: usize, bytes: usize) -> bool {
        records > self.max_records || bytes > self.max_bytes
    }
}

/// Whether a batch of `records` changes holding `bytes` record bytes takes
/// one more under bounds of `max_records` and `max_bytes`. The first change
/// always goes in, so a record larger than `max_bytes` still reaches
/// watchers; a batch thus exceeds `max_bytes` by less than one record.
pub(super) fn batch_has_room(
    records: usize,
    bytes: usize,
    max_records: usize,
    max_bytes: usize,
) -> bool {
    records < max_records && (records == 0 || bytes < max_bytes)
}

/// A copy of `record` in a buffer of its own. A record read back from the
/// log is a slice of a whole fragment or sealed segment, and what is applied
/// stays alive (in the history, and in the state where the machine keeps
/// slices of it), so it must not keep those buffers alive with it. One copy
/// of the record replaces the copies of its larger parts (a put's value) a
/// machine would otherwise make.
pub(super) fn detached(record: Bytes) -> Bytes {
    Bytes::copy_from_slice(&record)
}

impl<M: StateMachine> Core<M> {
    pub(super) fn new(budget: HistoryBudget) -> Core<M> {
        let machine = M::default();
        let initial_revision = machine.revision();
        Core {
            machine,
            applied_end: RecordIndex(0),
            applied_bytes: 0,
            known: false,
            history: VecDeque::new(),
            history_bytes: 0,
            budget,
            floor_revision: initial_revision,
            initial_revision,
            following: false,
            held: HeldRun::default(),
            diverged: None,
            observers: Vec::new(),
        }
    }

    pub(super) fn applied_end(&self) -> RecordIndex {
        self.applied_end
    }

    /// Bytes of every record this process applied (never reset).
    pub(super) fn applied_bytes(&self) -> u64 {
        self.applied_bytes
    }

    /// Whether the state is a known prefix of the log (see `known`).
    pub(super) fn is_known(&self) -> bool {
        self.known
    }

    /// Marks the (still empty) state as the prefix below index 0 of a
    /// database that has no snapshot yet.
    pub(super) fn mark_known(&mut self) {
        self.known = true;
    }

    /// Replaces the state with one restored from a snapshot taken at `at`.
    pub(super) fn restore(&mut self, machine: M, at: RecordIndex) {
        self.floor_revision = machine.revision();
        self.machine = machine;
        self.applied_end = at;
        self.known = true;
        self.history.clear();
        self.history_bytes = 0;
        self.notify_observers();
    }

    /// Runs `observer` after every change of the machine from now on.
    pub(super) fn observe(&mut self, observer: ApplyObserver<M>) {
        self.observers.push(observer);
    }

    fn notify_observers(&mut self) {
        let machine = &self.machine;
        self.observers.retain_mut(|observer| observer(machine));
    }

    /// Applies record `index`, which must be the next one. The history and
    /// the machine may keep `record`: it should be a buffer of its own (see
    /// [`detached`]).
    pub(super) fn apply(&mut self, index: RecordIndex, record: Bytes) -> M::Output {
        assert_eq!(
            index, self.applied_end,
            "records are applied in index order, each once"
        );
        let output = self.machine.apply(index, &record);
        self.notify_observers();
        self.applied_end = RecordIndex(index.0 + 1);
        self.applied_bytes += record.len() as u64;
        self.history_bytes += record.len();
        self.history.push_back(Change {
            index,
            record,
            output: output.clone(),
            revision: self.machine.revision(),
        });
        while self.budget.exceeded(self.history.len(), self.history_bytes) {
            let dropped = self
                .history
                .pop_front()
                .expect("over budget means not empty");
            self.history_bytes -= dropped.record.len();
            self.floor_revision = dropped.revision;
        }
        output
    }

    /// Starts or stops taking records handed over by another node; stopping
    /// drops those held.
    pub(super) fn set_following(&mut self, following: bool) {
        self.following = following;
        if !following {
            self.held.clear();
        }
    }

    /// The divergence a handed-over record caused, once.
    pub(super) fn take_divergence(&mut self) -> Option<Divergence> {
        self.diverged.take()
    }

    /// Takes a committed record another node handed over, while following
    /// (else ignores it): see [`take_committed`](Self::take_committed). A
    /// divergence stops the following and is kept for the standby to stop
    /// on. Returns how many records were applied.
    pub(super) fn offer(&mut self, index: RecordIndex, record: Bytes) -> usize {
        if !self.following {
            return 0;
        }
        match self.take_committed(index, record) {
            Ok(applied) => applied,
            Err(divergence) => {
                self.diverged = Some(divergence);
                self.set_following(false);
                0
            }
        }
    }

    /// Takes a committed record (read from the replicas, or handed over by
    /// another node that applied it): applies it if it is the next, checks
    /// it against the one applied if it is behind, holds it if it is ahead;
    /// then does the same with the held records the state has reached.
    /// Returns how many records were applied.
    pub(super) fn take_committed(
        &mut self,
        index: RecordIndex,
        record: Bytes,
    ) -> Result<usize, Divergence> {
        let mut applied = self.place(index, record)?;
        while let Some((index, record)) = self.held.take_reached(self.applied_end) {
            applied += self.place(index, record)?;
        }
        Ok(applied)
    }

    fn place(&mut self, index: RecordIndex, record: Bytes) -> Result<usize, Divergence> {
        match index.0.cmp(&self.applied_end.0) {
            std::cmp::Ordering::Less => self.check_applied(index, &record).map(|()| 0),
            std::cmp::Ordering::Equal => {
                self.apply(index, detached(record));
                Ok(1)
            }
            std::cmp::Ordering::Greater => {
                self.held.hold(index, record);
                Ok(0)
            }
        }
    }

    /// Whether `record` is the record applied at `index` (below the applied
    /// end), as far as the history still holds it: one it dropped, or
    /// never held (below a restored snapshot), cannot be checked.
    fn check_applied(&self, index: RecordIndex, record: &Bytes) -> Result<(), Divergence> {
        let Some(oldest) = self.history.front().map(|change| change.index) else {
            return Ok(());
        };
        let Some(position) = index.0.checked_sub(oldest.0) else {
            return Ok(());
        };
        match self.history.get(position as usize) {
            Some(change) if change.record != *record => Err(Divergence { index }),
            _ => Ok(()),
        }
    }

    /// Changes from the first that left the machine at revision `from` or
    /// above on (see [`changes_since`](Self::changes_since) for the
    /// bounds): every change that moved the revision to `from` or beyond,
    /// and the records after them. Asking for a revision some dropped (or
    /// never held) change moved to is a [`RevisionGap`].
    pub(super) fn changes_from_revision(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<Change<M::Output>>, RevisionGap> {
        // At or below the initial revision there is no change to miss.
        if from <= self.floor_revision && self.floor_revision > self.initial_revision {
            return Err(RevisionGap {
                requested: from,
                oldest: self.floor_revision + 1,
            });
        }
        let start = self
            .history
            .partition_point(|change| change.revision < from);
        Ok(self.batch(start, max_records, max_bytes))
    }

    /// Changes from index `from` on, at most `max_records` of them and
    /// about `max_bytes` of records (see [`batch_has_room`]). Asking for an
    /// index the history dropped (or never held: below the snapshot this
    /// state was restored from) is a [`HistoryGap`].
    pub(super) fn changes_since(
        &self,
        from: RecordIndex,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<Change<M::Output>>, HistoryGap> {
        let oldest = self
            .history
            .front()
            .map_or(self.applied_end, |change| change.index);
        if from < oldest {
            return Err(HistoryGap {
                requested: from,
                oldest,
            });
        }
        let skip = (from.0 - oldest.0) as usize;
        Ok(self.batch(skip, max_records, max_bytes))
    }

    /// The held changes from position `skip` on, within the bounds.
    fn batch(&self, skip: usize, max_records: usize, max_bytes: usize) -> Vec<Change<M::Output>> {
        let mut batch = Vec::new();
        let mut bytes = 0;
        for change in self.history.iter().skip(skip) {
            if !batch_has_room(batch.len(), bytes, max_records, max_bytes) {
                break;
            }
            bytes += change.record.len();
            // A clone shares the record's bytes with the history.
            batch.push(change.clone());
        }
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::machine::{Checkpoint, RestoreError};

    /// Sums the first byte of every record.
    #[derive(Debug, Default)]
    struct Sum(u64);

    impl Checkpoint for u64 {
        fn write_to(&self, sink: &mut dyn std::io::Write) -> std::io::Result<()> {
            sink.write_all(&self.to_le_bytes())
        }
    }

    impl StateMachine for Sum {
        type Output = u64;
        type Checkpoint = u64;
        fn apply(&mut self, _: RecordIndex, record: &Bytes) -> u64 {
            self.0 += u64::from(record[0]);
            self.0
        }
        fn checkpoint(&self) -> u64 {
            self.0
        }
        fn restore(_: &mut dyn std::io::Read) -> Result<Sum, RestoreError> {
            Ok(Sum::default())
        }
        /// The sum: a record of zero changes nothing.
        fn revision(&self) -> u64 {
            self.0
        }
    }

    fn revisions(changes: Vec<Change<u64>>) -> Vec<(u64, u64)> {
        changes
            .iter()
            .map(|change| (change.index.0, change.revision))
            .collect()
    }

    #[test]
    fn changes_are_found_by_revision_and_a_dropped_one_is_a_gap() {
        let mut core = Core::<Sum>::new(records_only(3));
        assert!(
            core.changes_from_revision(0, 10, usize::MAX)
                .unwrap()
                .is_empty()
        );
        // Revisions after each record: 1, 1, 3, 3, 4.
        for (index, add) in [1u8, 0, 2, 0, 1].into_iter().enumerate() {
            core.apply(RecordIndex(index as u64), Bytes::from(vec![add]));
        }
        // Held: records 2 (moved to 3), 3 (changed nothing), 4 (moved to 4).
        let from = |revision| core.changes_from_revision(revision, 10, usize::MAX);
        assert_eq!(revisions(from(2).unwrap()), [(2, 3), (3, 3), (4, 4)]);
        assert_eq!(revisions(from(3).unwrap()), [(2, 3), (3, 3), (4, 4)]);
        assert_eq!(revisions(from(4).unwrap()), [(4, 4)]);
        assert!(from(5).unwrap().is_empty());
        // Record 1 moved to 1, dropped with record 0: revision 1 is gone.
        let gap = RevisionGap {
            requested: 1,
            oldest: 2,
        };
        assert_eq!(from(1).unwrap_err(), gap);
        assert_eq!(from(0).unwrap_err().oldest, 2);
        // A restored state's own revision is not held either.
        core.restore(Sum(9), RecordIndex(40));
        let from = |revision| core.changes_from_revision(revision, 10, usize::MAX);
        assert_eq!(from(9).unwrap_err().oldest, 10);
        assert!(from(10).unwrap().is_empty());
    }

    #[test]
    fn observers_see_the_state_after_each_record_and_each_restore_until_they_stop() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut core = Core::<Sum>::new(records_only(3));
        let all = std::sync::Arc::clone(&seen);
        core.observe(Box::new(move |sum: &Sum| {
            all.lock().unwrap().push(sum.0);
            true
        }));
        let first_two = std::sync::Arc::clone(&seen);
        core.observe(Box::new(move |sum: &Sum| {
            first_two.lock().unwrap().push(100 + sum.0);
            sum.0 < 3
        }));
        core.apply(RecordIndex(0), Bytes::from(vec![1]));
        core.apply(RecordIndex(1), Bytes::from(vec![2]));
        core.restore(Sum(7), RecordIndex(5));
        core.apply(RecordIndex(5), Bytes::from(vec![1]));
        // The second answered false after seeing 3, and was not run again.
        assert_eq!(*seen.lock().unwrap(), [1, 101, 3, 103, 7, 8]);
    }

    fn records_only(max_records: usize) -> HistoryBudget {
        HistoryBudget {
            max_records,
            max_bytes: usize::MAX,
        }
    }

    fn indices(changes: Vec<Change<u64>>) -> Vec<u64> {
        changes.iter().map(|change| change.index.0).collect()
    }

    fn byte(value: u8) -> Bytes {
        Bytes::from(vec![value])
    }

    /// A record read back from the log is a slice of a fragment or segment:
    /// what the history keeps of it is a copy, which keeps none of it alive.
    /// A writer's own record is kept as it was appended.
    #[test]
    fn records_read_back_are_kept_as_copies_of_their_own() {
        let mut core = Core::<Sum>::new(records_only(100));
        let fragment = Bytes::from(vec![1u8; 64]);
        assert_eq!(
            core.take_committed(RecordIndex(0), fragment.slice(8..9)),
            Ok(1)
        );
        let appended = byte(2);
        core.apply(RecordIndex(1), appended.clone());
        let kept = core.changes_since(RecordIndex(0), 10, 1 << 20).unwrap();
        assert!(!fragment.as_ptr_range().contains(&kept[0].record.as_ptr()));
        assert_eq!(kept[0].record, fragment.slice(8..9));
        assert_eq!(kept[1].record.as_ptr(), appended.as_ptr());
    }

    #[test]
    fn committed_records_apply_in_order_whichever_source_comes_first() {
        let mut core = Core::<Sum>::new(records_only(100));
        core.set_following(true);
        // Handed over ahead of the state: held, nothing applied.
        assert_eq!(core.offer(RecordIndex(2), byte(4)), 0);
        assert_eq!(core.offer(RecordIndex(3), byte(8)), 0);
        assert_eq!(core.applied_end(), RecordIndex(0));
        // The replicas supply 0 and 1; at 1 the held run follows.
        assert_eq!(core.take_committed(RecordIndex(0), byte(1)), Ok(1));
        assert_eq!(core.take_committed(RecordIndex(1), byte(2)), Ok(3));
        assert_eq!((core.applied_end(), core.machine.0), (RecordIndex(4), 15));
        // The replicas' copies of records already applied are checked.
        assert_eq!(core.take_committed(RecordIndex(2), byte(4)), Ok(0));
        assert_eq!(core.offer(RecordIndex(4), byte(16)), 1);
        assert_eq!(core.take_divergence(), None);
        assert_eq!(core.machine.0, 31);
    }

    #[test]
    fn a_record_unlike_the_one_applied_is_a_divergence() {
        let mut core = Core::<Sum>::new(records_only(100));
        core.set_following(true);
        assert_eq!(core.offer(RecordIndex(0), byte(1)), 1);
        // Read from the replicas: reported at once.
        assert_eq!(
            core.take_committed(RecordIndex(0), byte(2)),
            Err(Divergence {
                index: RecordIndex(0)
            })
        );
        // Handed over: kept for the standby, and following stops.
        assert_eq!(core.offer(RecordIndex(0), byte(3)), 0);
        assert_eq!(
            core.take_divergence(),
            Some(Divergence {
                index: RecordIndex(0)
            })
        );
        assert_eq!(core.take_divergence(), None);
        assert_eq!(core.offer(RecordIndex(1), byte(1)), 0);
        assert_eq!(core.applied_end(), RecordIndex(1));
    }

    #[test]
    fn offers_are_ignored_unless_following_and_records_the_history_dropped_pass() {
        let mut core = Core::<Sum>::new(records_only(1));
        assert_eq!(core.offer(RecordIndex(0), byte(1)), 0);
        core.set_following(true);
        core.offer(RecordIndex(2), byte(1));
        core.set_following(false);
        // Stopping dropped the held record: the state does not jump to it.
        for index in 0..2 {
            assert_eq!(core.take_committed(RecordIndex(index), byte(1)), Ok(1));
        }
        assert_eq!(core.applied_end(), RecordIndex(2));
        // Record 0 left the one-record history: it can no longer be checked.
        assert_eq!(core.take_committed(RecordIndex(0), byte(9)), Ok(0));
        assert!(core.take_committed(RecordIndex(1), byte(9)).is_err());
    }

    #[test]
    fn history_keeps_the_newest_changes_and_names_the_gap() {
        let mut core = Core::<Sum>::new(records_only(3));
        assert_eq!(
            core.changes_since(RecordIndex(0), 10, usize::MAX)
                .unwrap()
                .len(),
            0
        );
        for index in 0..5u64 {
            core.apply(RecordIndex(index), Bytes::from(vec![1]));
        }
        assert_eq!(
            indices(core.changes_since(RecordIndex(2), 10, usize::MAX).unwrap()),
            [2, 3, 4]
        );
        assert_eq!(
            indices(core.changes_since(RecordIndex(3), 1, usize::MAX).unwrap()),
            [3]
        );
        assert_eq!(
            indices(core.changes_since(RecordIndex(5), 10, usize::MAX).unwrap()),
            [] as [u64; 0]
        );
        assert_eq!(
            core.changes_since(RecordIndex(1), 10, usize::MAX)
                .unwrap_err(),
            HistoryGap {
                requested: RecordIndex(1),
                oldest: RecordIndex(2)
            }
        );
        core.restore(Sum(7), RecordIndex(40));
        assert_eq!(core.applied_end(), RecordIndex(40));
        assert!(core.changes_since(RecordIndex(39), 10, usize::MAX).is_err());
        assert!(
            core.changes_since(RecordIndex(40), 10, usize::MAX)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn history_drops_its_oldest_changes_over_either_bound() {
        let budget = HistoryBudget {
            max_records: 3,
            max_bytes: 10,
        };
        assert!(!budget.exceeded(3, 10));
        assert!(budget.exceeded(4, 0));
        assert!(budget.exceeded(1, 11));
        let mut core = Core::<Sum>::new(budget);
        // Four-byte records: the byte bound (10) holds two of them.
        for index in 0..3u64 {
            core.apply(RecordIndex(index), Bytes::from(vec![1; 4]));
        }
        assert_eq!(
            indices(core.changes_since(RecordIndex(1), 10, usize::MAX).unwrap()),
            [1, 2]
        );
        assert_eq!(core.history_bytes, 8);
        // One-byte records: the count bound (3) holds.
        for index in 3..8u64 {
            core.apply(RecordIndex(index), Bytes::from(vec![1]));
        }
        assert_eq!(
            indices(core.changes_since(RecordIndex(5), 10, usize::MAX).unwrap()),
            [5, 6, 7]
        );
        assert_eq!(core.history_bytes, 3);
        // A record larger than the whole budget is not kept, nor what it
        // pushed out; the history goes on from the next one.
        core.apply(RecordIndex(8), Bytes::from(vec![1; 11]));
        assert_eq!(core.history_bytes, 0);
        assert!(core.changes_since(RecordIndex(8), 10, usize::MAX).is_err());
        assert!(
            core.changes_since(RecordIndex(9), 10, usize::MAX)
                .unwrap()
                .is_empty()
        );
        core.apply(RecordIndex(9), Bytes::from(vec![1; 2]));
        assert_eq!(
            indices(core.changes_since(RecordIndex(9), 10, usize::MAX).unwrap()),
            [9]
        );
        core.restore(Sum(0), RecordIndex(20));
        assert_eq!(core.history_bytes, 0);
    }

    #[test]
    fn a_batch_stops_at_its_byte_bound_but_always_takes_one_change() {
        assert!(
            batch_has_room(0, 0, 5, 0),
            "the first change always goes in"
        );
        assert!(batch_has_room(1, 9, 5, 10));
        assert!(!batch_has_room(1, 10, 5, 10));
        assert!(!batch_has_room(5, 0, 5, 10));
        assert!(!batch_has_room(0, 0, 0, 10), "no room in a batch of none");
        let mut core = Core::<Sum>::new(records_only(100));
        for (index, length) in [3, 3, 3, 20, 1].into_iter().enumerate() {
            core.apply(RecordIndex(index as u64), Bytes::from(vec![1; length]));
        }
        let batch = |from: u64, max_bytes: usize| {
            indices(
                core.changes_since(RecordIndex(from), 100, max_bytes)
                    .unwrap(),
            )
        };
        assert_eq!(batch(0, 6), [0, 1]);
        assert_eq!(batch(0, 7), [0, 1, 2]);
        assert_eq!(batch(3, 6), [3], "a record over the bound comes alone");
        assert_eq!(batch(2, 1), [2]);
        assert_eq!(batch(0, usize::MAX), [0, 1, 2, 3, 4]);
        assert_eq!(
            indices(core.changes_since(RecordIndex(0), 2, usize::MAX).unwrap()),
            [0, 1]
        );
    }

    #[test]
    #[should_panic(expected = "index order")]
    fn applying_out_of_order_stops() {
        let mut core = Core::<Sum>::new(records_only(3));
        core.apply(RecordIndex(1), Bytes::from(vec![1]));
    }
}
