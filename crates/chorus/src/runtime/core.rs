//! The applied state: the machine, the index it reflects, and a bounded
//! history of recent changes for watchers that resume from an index.

use std::collections::VecDeque;

use bytes::Bytes;

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

/// The machine and what it reflects. Guarded by one lock in the runtime; every
/// method is quick and does no I/O.
#[derive(Debug)]
pub(super) struct Core<M: StateMachine> {
    pub(super) machine: M,
    /// The next index to apply: every record below it is reflected.
    applied_end: RecordIndex,
    /// Whether the state is known to be the log's prefix below `applied_end`:
    /// restored from a snapshot, or started empty on a database that had no
    /// snapshot yet (the first snapshot is that empty state). Until then a
    /// boot must restore HEAD's payload.
    known: bool,
    history: VecDeque<Change<M::Output>>,
    capacity: usize,
}

impl<M: StateMachine> Core<M> {
    pub(super) fn new(capacity: usize) -> Core<M> {
        Core {
            machine: M::default(),
            applied_end: RecordIndex(0),
            known: false,
            history: VecDeque::new(),
            capacity,
        }
    }

    pub(super) fn applied_end(&self) -> RecordIndex {
        self.applied_end
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
        self.machine = machine;
        self.applied_end = at;
        self.known = true;
        self.history.clear();
    }

    /// Applies record `index`, which must be the next one.
    pub(super) fn apply(&mut self, index: RecordIndex, record: Bytes) -> M::Output {
        assert_eq!(
            index, self.applied_end,
            "records are applied in index order, each once"
        );
        let output = self.machine.apply(index, &record);
        self.applied_end = RecordIndex(index.0 + 1);
        if self.capacity > 0 {
            if self.history.len() == self.capacity {
                self.history.pop_front();
            }
            self.history.push_back(Change {
                index,
                record,
                output: output.clone(),
            });
        }
        output
    }

    /// Up to `limit` changes from index `from` on. Asking for an index the
    /// history dropped (or never held: below the snapshot this state was
    /// restored from) is a [`HistoryGap`].
    pub(super) fn changes_since(
        &self,
        from: RecordIndex,
        limit: usize,
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
        Ok(self
            .history
            .iter()
            .skip(skip)
            .take(limit)
            .cloned()
            .collect())
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
        fn apply(&mut self, _: RecordIndex, record: &[u8]) -> u64 {
            self.0 += u64::from(record[0]);
            self.0
        }
        fn checkpoint(&self) -> u64 {
            self.0
        }
        fn restore(_: &mut dyn std::io::Read) -> Result<Sum, RestoreError> {
            Ok(Sum::default())
        }
    }

    #[test]
    fn history_keeps_the_newest_changes_and_names_the_gap() {
        let mut core = Core::<Sum>::new(3);
        assert_eq!(core.changes_since(RecordIndex(0), 10).unwrap().len(), 0);
        for index in 0..5u64 {
            core.apply(RecordIndex(index), Bytes::from(vec![1]));
        }
        let indices = |changes: Vec<Change<u64>>| -> Vec<u64> {
            changes.iter().map(|change| change.index.0).collect()
        };
        assert_eq!(
            indices(core.changes_since(RecordIndex(2), 10).unwrap()),
            [2, 3, 4]
        );
        assert_eq!(indices(core.changes_since(RecordIndex(3), 1).unwrap()), [3]);
        assert_eq!(
            indices(core.changes_since(RecordIndex(5), 10).unwrap()),
            [] as [u64; 0]
        );
        assert_eq!(
            core.changes_since(RecordIndex(1), 10).unwrap_err(),
            HistoryGap {
                requested: RecordIndex(1),
                oldest: RecordIndex(2)
            }
        );
        core.restore(Sum(7), RecordIndex(40));
        assert_eq!(core.applied_end(), RecordIndex(40));
        assert!(core.changes_since(RecordIndex(39), 10).is_err());
        assert!(core.changes_since(RecordIndex(40), 10).unwrap().is_empty());
    }

    #[test]
    #[should_panic(expected = "index order")]
    fn applying_out_of_order_stops() {
        let mut core = Core::<Sum>::new(3);
        core.apply(RecordIndex(1), Bytes::from(vec![1]));
    }
}
