//! WAL file ids and Chorus record indices: WAL file `n` is record `n - 1`.
//!
//! One write batch is one record and one WAL file, so the mapping is a shift
//! by one: SlateDB counts WAL files from 1 and uses 0 for "none" (a new
//! database replays everything after file 0), while record indices start at
//! 0. Indices never go back (a new epoch continues where the recovered log
//! ends), so ids never do either, across restarts and fail-overs.

use std::ops::Bound;

use chorus::ids::RecordIndex;

/// The WAL file id of the record at `index`.
pub fn wal_id(index: RecordIndex) -> u64 {
    index.0 + 1
}

/// The index of the first record after WAL file `wal_id`, which is also the
/// number of records up to and including it.
pub fn index_after(wal_id: u64) -> RecordIndex {
    RecordIndex(wal_id)
}

/// The first record of a range of WAL files that starts at `start`, or
/// `None` for a range without a start.
pub fn first_index(start: Bound<u64>) -> Option<RecordIndex> {
    match start {
        Bound::Included(id) => Some(RecordIndex(id.saturating_sub(1))),
        Bound::Excluded(id) => Some(index_after(id)),
        Bound::Unbounded => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_of_files_starts_at_its_first_files_record() {
        assert_eq!(first_index(Bound::Included(3)), Some(RecordIndex(2)));
        assert_eq!(first_index(Bound::Excluded(3)), Some(RecordIndex(3)));
        // There is no file 0: a range from it starts at record 0.
        assert_eq!(first_index(Bound::Included(0)), Some(RecordIndex(0)));
        assert_eq!(first_index(Bound::Unbounded), None);
    }

    #[test]
    fn file_n_is_record_n_minus_one() {
        assert_eq!(wal_id(RecordIndex(0)), 1);
        assert_eq!(index_after(0), RecordIndex(0));
        for index in [0, 1, 41, u64::MAX - 1] {
            assert_eq!(
                index_after(wal_id(RecordIndex(index))),
                RecordIndex(index + 1)
            );
        }
    }
}
