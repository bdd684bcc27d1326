//! Committed records a standby was handed ahead of its state: one
//! contiguous run, waiting until the records before it have been read from
//! the replicas.
//!
//! A standby that follows the primary's stream (see
//! [`Runtime::offer_committed`](super::Runtime::offer_committed)) may be
//! behind it: just started, or back from a snapshot restore. The records
//! the stream hands it past its applied end cannot be applied yet, and
//! dropping them would leave it unable ever to catch up with a stream that
//! keeps moving. So they wait here, bounded: past the bounds the oldest go,
//! which only means the replicas supply those instead.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::ids::RecordIndex;

/// Most records held.
pub(super) const MAX_HELD_RECORDS: usize = 100_000;

/// Most record bytes held (exceeded by less than one record).
pub(super) const MAX_HELD_BYTES: usize = 64 << 20;

/// A contiguous run of committed records; see the module docs.
#[derive(Debug, Default)]
pub(super) struct HeldRun {
    records: VecDeque<(RecordIndex, Bytes)>,
    bytes: usize,
}

impl HeldRun {
    /// Holds record `index`. One that extends the run joins it; one the
    /// run already holds is ignored; any other starts a new run (a new
    /// stream, from another point), since only a contiguous run can ever
    /// be applied whole. Then drops the oldest while over the bounds.
    pub(super) fn hold(&mut self, index: RecordIndex, record: Bytes) {
        match self.span() {
            Some((first, end)) if index.0 >= first.0 && index.0 < end.0 => return,
            Some((_, end)) if index == end => {}
            Some(_) => self.clear(),
            None => {}
        }
        self.bytes += record.len();
        self.records.push_back((index, record));
        while self.records.len() > MAX_HELD_RECORDS
            || (self.bytes > MAX_HELD_BYTES && self.records.len() > 1)
        {
            self.pop_front();
        }
    }

    /// The first held record, if its index is at most `applied_end` (the
    /// next record to apply, or one already applied), removed from the run.
    pub(super) fn take_reached(
        &mut self,
        applied_end: RecordIndex,
    ) -> Option<(RecordIndex, Bytes)> {
        let (first, _) = self.records.front()?;
        if first.0 > applied_end.0 {
            return None;
        }
        self.pop_front()
    }

    /// Drops every held record.
    pub(super) fn clear(&mut self) {
        self.records.clear();
        self.bytes = 0;
    }

    /// How many records are held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.records.len()
    }

    /// The first held index and the index after the last.
    fn span(&self) -> Option<(RecordIndex, RecordIndex)> {
        let (first, _) = self.records.front()?;
        let (last, _) = self.records.back()?;
        Some((*first, RecordIndex(last.0 + 1)))
    }

    fn pop_front(&mut self) -> Option<(RecordIndex, Bytes)> {
        let popped = self.records.pop_front()?;
        self.bytes -= popped.1.len();
        Some(popped)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn record(index: u64) -> Bytes {
        Bytes::from(index.to_le_bytes().to_vec())
    }

    fn indices(run: &HeldRun) -> Vec<u64> {
        run.records.iter().map(|(index, _)| index.0).collect()
    }

    #[test]
    fn a_run_grows_at_its_end_ignores_what_it_holds_and_restarts_on_a_gap() {
        let mut run = HeldRun::default();
        for index in [5, 6, 7, 6, 5] {
            run.hold(RecordIndex(index), record(index));
        }
        assert_eq!(indices(&run), [5, 6, 7]);
        // A gap after the end, or a start before the run: a new run.
        run.hold(RecordIndex(9), record(9));
        assert_eq!(indices(&run), [9]);
        run.hold(RecordIndex(3), record(3));
        assert_eq!(indices(&run), [3]);
    }

    #[test]
    fn records_are_taken_once_the_state_reaches_them() {
        let mut run = HeldRun::default();
        for index in 10..13 {
            run.hold(RecordIndex(index), record(index));
        }
        assert_eq!(run.take_reached(RecordIndex(9)), None);
        assert_eq!(run.take_reached(RecordIndex(10)).map(|r| r.0.0), Some(10));
        // One already applied (the state moved past it) is handed back too,
        // to be checked against what was applied.
        assert_eq!(run.take_reached(RecordIndex(20)).map(|r| r.0.0), Some(11));
        assert_eq!(indices(&run), [12]);
    }

    #[test]
    fn past_its_bounds_the_run_drops_its_oldest() {
        let mut run = HeldRun::default();
        let big = Bytes::from(vec![0u8; MAX_HELD_BYTES / 2 + 1]);
        for index in 0..3 {
            run.hold(RecordIndex(index), big.clone());
        }
        assert_eq!(indices(&run), [2]);
        // A single record larger than the byte bound is still held.
        let huge = Bytes::from(vec![0u8; MAX_HELD_BYTES + 1]);
        run.hold(RecordIndex(3), huge);
        assert_eq!(indices(&run), [3]);
        run.clear();
        for index in 0..(MAX_HELD_RECORDS as u64 + 5) {
            run.hold(RecordIndex(index), Bytes::new());
        }
        assert_eq!(run.len(), MAX_HELD_RECORDS);
        assert_eq!(run.span().map(|(first, _)| first.0), Some(5));
    }

    proptest! {
        /// Whatever is handed over, in whatever order: the run is
        /// contiguous, within its bounds, every record sits at its own
        /// index, and it ends at the last record it took.
        #[test]
        fn the_run_stays_contiguous(offers in proptest::collection::vec(0u64..40, 0..200)) {
            let mut run = HeldRun::default();
            for index in offers {
                run.hold(RecordIndex(index), record(index));
                let held = indices(&run);
                prop_assert!(held.windows(2).all(|pair| pair[1] == pair[0] + 1), "{held:?}");
                prop_assert!(held.contains(&index));
                for (index, bytes) in &run.records {
                    prop_assert_eq!(bytes, &record(index.0));
                }
                prop_assert_eq!(run.bytes, held.len() * 8);
            }
        }
    }
}
