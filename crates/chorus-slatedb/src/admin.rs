//! SlateDB's administrative WAL operations on a Chorus log: garbage
//! collection, emptiness, deletion. A [`ChorusWalAdmin`] serves the one
//! database whose WAL it was built on; the `path` SlateDB passes names that
//! database and is not otherwise used.

use std::sync::Arc;

use async_trait::async_trait;
use chorus::ids::RecordIndex;
use chorus::log::maintenance::{Maintenance, NoProgress};
use chorus::log::{LogStores, Reader};
use object_store::path::Path;
use slatedb::VersionedManifest;
use slatedb::wal::{WalAdmin, WalError, WalGc};

use crate::error::{internal_error, wal_error};
use crate::gc::ChorusWalGc;
use crate::ids::{index_after, wal_id};

/// SlateDB's WAL admin on a Chorus log: give it to
/// [`slatedb::admin::AdminBuilder::with_wal_admin`].
#[derive(Debug, Clone)]
pub struct ChorusWalAdmin {
    stores: LogStores,
}

impl ChorusWalAdmin {
    /// An admin of the log in `stores`.
    pub fn new(stores: LogStores) -> ChorusWalAdmin {
        ChorusWalAdmin { stores }
    }
}

/// Whether the records `[first, end)` hold any, given the retained ones
/// `[floor, committed)`. `Err(floor)` when part of a non-empty range lies
/// below the floor: those records are gone, so nobody can tell (as with
/// SlateDB's own WAL, whose deleted files cannot be inspected either).
fn holds_records(
    first: RecordIndex,
    end: RecordIndex,
    floor: RecordIndex,
    committed: RecordIndex,
) -> Result<bool, RecordIndex> {
    if end <= first {
        return Ok(false);
    }
    if first < floor {
        return Err(floor);
    }
    Ok(first < committed)
}

#[async_trait]
impl WalAdmin for ChorusWalAdmin {
    fn garbage_collector(&self, _path: &Path) -> Arc<dyn WalGc> {
        Arc::new(ChorusWalGc::new(self.stores.clone()))
    }

    /// Empties the log: raises its floor to the committed end, which deletes
    /// every sealed segment from every replica. The register stays, bound
    /// to these replicas, and so do the active segment's fragments (below
    /// the floor, never replayed); a new database on these locations needs
    /// a new log (another register).
    async fn delete_wal(&self, _path: &Path, dry_run: bool) -> Result<Vec<String>, WalError> {
        let maintenance = Maintenance::new(&self.stores);
        let manifest = maintenance.manifest().await.map_err(wal_error)?;
        let end = Reader::committed_end(&self.stores)
            .await
            .map_err(wal_error)?;
        if dry_run {
            let mut resources: Vec<String> = manifest
                .segments
                .iter()
                .map(|entry| {
                    format!(
                        "sealed segment {} (records from {}) on every replica",
                        entry.id, entry.base
                    )
                })
                .collect();
            resources.push(format!("records {}..{end} of the log", manifest.trunc));
            return Ok(resources);
        }
        let report = maintenance
            .truncate_before(end, end, &NoProgress)
            .await
            .map_err(wal_error)?;
        let mut resources: Vec<String> = report
            .removed
            .iter()
            .map(|id| format!("sealed segment {id} on every replica"))
            .collect();
        resources.push(format!(
            "records {}..{end} of the log (floor raised to {end})",
            manifest.trunc
        ));
        Ok(resources)
    }

    async fn is_empty(
        &self,
        _path: &Path,
        replay_after_wal_id: u64,
        wal_id_last_seen: u64,
    ) -> Result<bool, WalError> {
        let manifest = Maintenance::new(&self.stores)
            .manifest()
            .await
            .map_err(wal_error)?;
        let committed = Reader::committed_end(&self.stores)
            .await
            .map_err(wal_error)?;
        // WAL files (after, last_seen] are records [after, last_seen).
        holds_records(
            index_after(replay_after_wal_id),
            RecordIndex(wal_id_last_seen),
            manifest.trunc,
            committed,
        )
        .map(|holds| !holds)
        .map_err(|floor| WalError::WalTruncated(wal_id(floor)))
    }

    async fn clone_wal(
        &self,
        _from_path: &Path,
        _from_manifest: VersionedManifest,
        _to_path: &Path,
    ) -> Result<(u64, u64), WalError> {
        Err(internal_error(
            "cloning a database whose WAL is a Chorus log is not supported: a Chorus log has one \
             writer, so a clone needs a log of its own, copied from this one's records"
                .to_owned(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_holds_records_where_it_meets_the_retained_ones() {
        let r = RecordIndex;
        // Retained: [10, 20).
        assert_eq!(holds_records(r(10), r(11), r(10), r(20)), Ok(true));
        assert_eq!(holds_records(r(19), r(25), r(10), r(20)), Ok(true));
        assert_eq!(holds_records(r(20), r(25), r(10), r(20)), Ok(false));
        // An empty range holds nothing, wherever it is.
        assert_eq!(holds_records(r(15), r(15), r(10), r(20)), Ok(false));
        assert_eq!(holds_records(r(5), r(5), r(10), r(20)), Ok(false));
        assert_eq!(holds_records(r(15), r(12), r(10), r(20)), Ok(false));
        // Truncated records cannot be inspected.
        assert_eq!(holds_records(r(0), r(10), r(10), r(20)), Err(r(10)));
        assert_eq!(holds_records(r(9), r(30), r(10), r(20)), Err(r(10)));
        assert_eq!(holds_records(r(0), r(30), r(20), r(20)), Err(r(20)));
        // A log truncated to its end holds nothing from there on.
        assert_eq!(holds_records(r(20), r(30), r(20), r(20)), Ok(false));
    }
}
