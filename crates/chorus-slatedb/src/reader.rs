//! SlateDB readers on a Chorus WAL: a `DbReader` replays and tails the WAL
//! through a Chorus [`Reader`], which returns committed records only, so a
//! reader never sees a write that could later vanish.

use std::ops::Bound;
use std::time::Duration;

use async_trait::async_trait;
use chorus::ids::RecordIndex;
use chorus::log::{LogError, LogStores, Reader};
use slatedb::wal::{WalError, WalFileRange, WalIterator, WalReader, WalRows};

use crate::batch;
use crate::error::{internal_error, wal_error};
use crate::ids::{first_index, index_after, wal_id};

/// How often a tailing iterator looks for new records once caught up.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// The WAL as SlateDB's readers see it: give it to
/// [`slatedb::DbReaderBuilder::with_wal_reader`]. It never claims, fences or
/// writes anything.
#[derive(Debug, Clone)]
pub struct ChorusWalReader {
    stores: LogStores,
    poll_interval: Duration,
}

impl ChorusWalReader {
    /// A reader of the log in `stores`.
    pub fn new(stores: LogStores) -> ChorusWalReader {
        ChorusWalReader {
            stores,
            poll_interval: DEFAULT_POLL_INTERVAL,
        }
    }

    /// Sets how often a tailing iterator polls once caught up.
    pub fn with_poll_interval(mut self, interval: Duration) -> ChorusWalReader {
        self.poll_interval = interval;
        self
    }
}

/// The records a range of WAL files covers: from the first index, up to an
/// exclusive end index (`None`: no end, follow the log).
fn record_range(range: &WalFileRange) -> Result<(RecordIndex, Option<RecordIndex>), WalError> {
    let start = first_index(range.0)
        .ok_or_else(|| internal_error("a WAL file range must have a start".to_owned()))?;
    let end = match range.1 {
        Bound::Included(id) => Some(index_after(id)),
        Bound::Excluded(id) => Some(RecordIndex(id.saturating_sub(1))),
        Bound::Unbounded => None,
    };
    Ok((start, end))
}

#[async_trait]
impl WalReader for ChorusWalReader {
    async fn iterator(
        &self,
        wal_file_id_range: WalFileRange,
    ) -> Result<Box<dyn WalIterator>, WalError> {
        let (start, end) = record_range(&wal_file_id_range)?;
        Ok(Box::new(Tail {
            reader: Reader::new(&self.stores, start).with_poll_interval(self.poll_interval),
            end,
        }))
    }

    async fn last_wal_file_id(&self, replay_after_wal_id: u64) -> Result<u64, WalError> {
        let end = Reader::committed_end(&self.stores)
            .await
            .map_err(read_error)?;
        // The last committed record is `end - 1`, WAL file `end`.
        Ok(end.0.max(replay_after_wal_id))
    }
}

/// Committed records of a range of WAL files, in order.
struct Tail {
    reader: Reader,
    end: Option<RecordIndex>,
}

#[async_trait]
impl WalIterator for Tail {
    async fn next(&mut self) -> Result<Option<WalRows>, WalError> {
        let record = match self.end {
            Some(end) if self.reader.position() >= end => return Ok(None),
            // A bounded range ends early where the committed log does.
            Some(_) => self.reader.try_next().await.map_err(read_error)?,
            None => Some(self.reader.next().await.map_err(read_error)?),
        };
        let Some((index, bytes)) = record else {
            return Ok(None);
        };
        batch::wal_file(index, &bytes).map(Some)
    }
}

/// A truncated log in SlateDB's terms: the first missing WAL file.
fn read_error(error: LogError) -> WalError {
    match error {
        LogError::Truncated { requested, .. } => WalError::WalTruncated(wal_id(requested)),
        error => wal_error(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: Bound<u64>, end: Bound<u64>) -> (RecordIndex, Option<RecordIndex>) {
        record_range(&WalFileRange(start, end)).unwrap()
    }

    #[test]
    fn wal_file_ranges_map_onto_record_indices() {
        use Bound::{Excluded, Included, Unbounded};
        // Files 3..=5 are records 2, 3 and 4.
        assert_eq!(
            range(Included(3), Included(5)),
            (RecordIndex(2), Some(RecordIndex(5)))
        );
        assert_eq!(
            range(Excluded(2), Excluded(6)),
            (RecordIndex(2), Some(RecordIndex(5)))
        );
        // After file 0: everything.
        assert_eq!(range(Excluded(0), Unbounded), (RecordIndex(0), None));
        assert_eq!(range(Included(0), Unbounded), (RecordIndex(0), None));
        assert!(record_range(&WalFileRange(Unbounded, Unbounded)).is_err());
    }
}
