//! Garbage collection of the WAL: SlateDB's collector names the WAL files
//! some manifest or checkpoint still references, and everything below the
//! lowest of them is truncated from the Chorus log (the floor is committed
//! in the register first, then sealed segments wholly below it are deleted
//! from every replica).
//!
//! Chorus records carry no timestamps, so `min_age` cannot be the age of a
//! file. It is honoured as the time a floor has been a candidate: a floor is
//! applied only once collections have proposed it (or a higher one) for at
//! least `min_age`. That is at least as careful, since a file unreferenced
//! for `min_age` was written at least that long ago.
//!
//! The proposals live in the collector, so a collector made for a single
//! pass (SlateDB's `Admin::run_gc_once` builds a new one per call) has none
//! and, with `min_age` above zero, truncates nothing: run one-off passes
//! with `min_age` zero, or rely on the database's own collector, which
//! lives as long as the database.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chorus::ids::RecordIndex;
use chorus::log::maintenance::{Maintenance, NoProgress};
use chorus::log::{LogStores, Reader};
use slatedb::wal::{WalError, WalFileRange, WalGc};
use tracing::{info, warn};

use crate::error::wal_error;
use crate::ids::{first_index, wal_id};

/// The lowest record any of `ranges` references: the floor a truncation may
/// raise to. `None` when nothing is referenced (then nothing is collected:
/// SlateDB always references the files after its replay point, so an empty
/// list means it has not said what it needs).
pub(crate) fn lowest_referenced(ranges: &[WalFileRange]) -> Option<RecordIndex> {
    ranges
        .iter()
        .map(|range| first_index(range.0).unwrap_or(RecordIndex(0)))
        .min()
}

/// Floors proposed by collections, with when each was first proposed.
#[derive(Debug, Default)]
pub(crate) struct Candidates(VecDeque<(RecordIndex, Instant)>);

impl Candidates {
    /// Records `floor` as proposed at `now` and returns the highest floor
    /// proposed at least `min_age` ago and not above `floor`, if any.
    pub(crate) fn ripe(
        &mut self,
        floor: RecordIndex,
        now: Instant,
        min_age: Duration,
    ) -> Option<RecordIndex> {
        // A lower proposal (a new checkpoint) withdraws the higher ones.
        while self.0.back().is_some_and(|(proposed, _)| *proposed > floor) {
            self.0.pop_back();
        }
        if self.0.back().is_none_or(|(proposed, _)| *proposed < floor) {
            self.0.push_back((floor, now));
        }
        let mut ripe = None;
        while let Some(&(proposed, since)) = self.0.front() {
            if now.saturating_duration_since(since) < min_age {
                break;
            }
            ripe = Some(proposed);
            if self.0.len() == 1 {
                break;
            }
            self.0.pop_front();
        }
        ripe
    }
}

/// SlateDB's WAL garbage collector on a Chorus log: give it to
/// [`slatedb::GarbageCollectorBuilder::with_wal_gc`] or
/// `DbBuilder::with_wal_gc`.
#[derive(Debug)]
pub struct ChorusWalGc {
    stores: LogStores,
    candidates: Mutex<Candidates>,
}

impl ChorusWalGc {
    /// A collector for the log in `stores`.
    pub fn new(stores: LogStores) -> ChorusWalGc {
        ChorusWalGc {
            stores,
            candidates: Mutex::default(),
        }
    }

    /// Whether every record below `floor` is committed, so the floor may be
    /// raised to it: always below the sealed end; in the active segment, by
    /// finding the record just below it committed.
    async fn committed_below(
        &self,
        floor: RecordIndex,
        sealed_end: RecordIndex,
    ) -> Result<bool, WalError> {
        if floor <= sealed_end {
            return Ok(true);
        }
        let below = RecordIndex(floor.0 - 1);
        let mut reader = Reader::resuming(&self.stores, below);
        let found = reader.try_next().await.map_err(wal_error)?;
        Ok(found.is_some_and(|(index, _)| index == below))
    }
}

#[async_trait]
impl WalGc for ChorusWalGc {
    async fn collect(
        &self,
        referenced_ranges: Vec<WalFileRange>,
        min_age: Duration,
        dry_run: bool,
    ) -> Result<(), WalError> {
        let Some(lowest) = lowest_referenced(&referenced_ranges) else {
            return Ok(());
        };
        let maintenance = Maintenance::new(&self.stores);
        let manifest = maintenance.manifest().await.map_err(wal_error)?;
        if lowest <= manifest.trunc {
            return Ok(());
        }
        let ripe = self
            .candidates
            .lock()
            .expect("candidates lock poisoned")
            .ripe(lowest, Instant::now(), min_age);
        let Some(floor) = ripe.filter(|floor| *floor > manifest.trunc) else {
            return Ok(());
        };
        if !self.committed_below(floor, manifest.tail_base).await? {
            warn!(
                floor = floor.0,
                "WAL GC: SlateDB references WAL files beyond the committed log; not truncating"
            );
            return Ok(());
        }
        if dry_run {
            info!(
                below_wal_file = wal_id(floor),
                "WAL GC (dry run): would truncate the Chorus log"
            );
            return Ok(());
        }
        let report = maintenance
            .truncate_before(floor, floor, &NoProgress)
            .await
            .map_err(wal_error)?;
        info!(
            below_wal_file = wal_id(floor),
            removed_segments = report.removed.len(),
            deleted_objects = report.deleted_objects,
            "WAL GC truncated the Chorus log"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_the_lowest_referenced_file() {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        assert_eq!(lowest_referenced(&[]), None);
        let ranges = [
            WalFileRange(Excluded(9), Unbounded),
            WalFileRange(Included(4), Included(6)),
        ];
        // File 4 is record 3: records 0, 1 and 2 may go.
        assert_eq!(lowest_referenced(&ranges), Some(RecordIndex(3)));
        assert_eq!(
            lowest_referenced(&[WalFileRange(Excluded(9), Unbounded)]),
            Some(RecordIndex(9))
        );
        assert_eq!(
            lowest_referenced(&[WalFileRange(Unbounded, Unbounded)]),
            Some(RecordIndex(0))
        );
    }

    #[test]
    fn a_floor_ripens_after_min_age() {
        let start = Instant::now();
        let age = Duration::from_secs(60);
        let mut candidates = Candidates::default();
        assert_eq!(candidates.ripe(RecordIndex(10), start, age), None);
        assert_eq!(candidates.ripe(RecordIndex(20), start + age / 2, age), None);
        assert_eq!(
            candidates.ripe(RecordIndex(20), start + age, age),
            Some(RecordIndex(10))
        );
        assert_eq!(
            candidates.ripe(RecordIndex(30), start + age * 3 / 2, age),
            Some(RecordIndex(20))
        );
        // A lower proposal withdraws the higher pending one and starts anew.
        assert_eq!(candidates.ripe(RecordIndex(25), start + age * 2, age), None);
        assert_eq!(
            candidates.ripe(RecordIndex(25), start + age * 3, age),
            Some(RecordIndex(25))
        );
    }

    #[test]
    fn no_min_age_applies_at_once() {
        let mut candidates = Candidates::default();
        let now = Instant::now();
        assert_eq!(
            candidates.ripe(RecordIndex(5), now, Duration::ZERO),
            Some(RecordIndex(5))
        );
    }
}
