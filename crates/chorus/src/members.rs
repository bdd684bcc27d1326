//! Which processes serve a database: each announces itself, with the
//! endpoints clients reach it on, in the database's snapshot store, and
//! every process lists the announcements that are fresh.
//!
//! The writer lease names only the primary; standbys are known to no one.
//! An announcement is one small JSON object per process,
//! `<database>/members/<member>.json`, written only by its process (create,
//! then compare-and-swap on the version it wrote) and refreshed every
//! [`REFRESH_INTERVAL`]; a listing leaves out announcements older than
//! [`FRESH_FOR`] by the lister's wall clock, so a process that stopped drops
//! out of the list within that time (clocks more than `FRESH_FOR -
//! REFRESH_INTERVAL` apart make a live process look stale). Nothing in the
//! protocol depends on it: it is a directory for tools (etcd's MemberList).
//!
//! ```text
//! {"format": 1, "holder": "<holder id>", "endpoints": {"etcd": ["http://…"]},
//!  "refreshed_ms": <wall clock ms>}
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::blob::{BlobError, DynBlobStore, Version};
use crate::clock::DynClock;
use crate::lease::{DatabaseKey, HolderId};

/// How often a process rewrites its announcement.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(10);

/// How long an announcement counts as a live process.
pub const FRESH_FOR: Duration = Duration::from_secs(30);

/// The announcement format this build writes and reads.
const FORMAT: u32 = 1;

/// One process's announcement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The announcement format: always 1.
    pub format: u32,
    /// The process's holder id (the name the writer lease knows it by).
    pub holder: String,
    /// The URLs it serves each protocol on, by protocol name (`"etcd"`).
    pub endpoints: BTreeMap<String, Vec<String>>,
    /// When it was last written, in the writer's wall-clock milliseconds.
    pub refreshed_ms: u64,
}

/// Why an announcement could not be written or the list read.
#[derive(Debug, thiserror::Error)]
pub enum MembersError {
    /// The store failed.
    #[error("member directory: {0}")]
    Store(#[from] BlobError),
}

/// The announcements of one database; see the module docs.
#[derive(Debug)]
pub struct Directory {
    store: DynBlobStore,
    /// The directory holding the announcements.
    prefix: String,
    clock: DynClock,
    /// The version of this process's announcement as last written.
    written: Option<(String, Version)>,
}

impl Directory {
    /// The directory of `database` in `store` (the snapshot store).
    pub fn new(store: DynBlobStore, database: &DatabaseKey, clock: DynClock) -> Directory {
        Directory {
            store,
            prefix: database.child("members"),
            clock,
            written: None,
        }
    }

    /// The object key of `holder`'s announcement: a hash of the holder id,
    /// which may hold characters no object key allows.
    pub fn key_of(&self, holder: &HolderId) -> String {
        let digest = crc32c::crc32c(holder.as_str().as_bytes());
        let length = holder.as_str().len();
        format!("{}/{digest:08x}-{length}.json", self.prefix)
    }

    /// Writes (or rewrites) `holder`'s announcement with `endpoints`, now.
    pub async fn announce(
        &mut self,
        holder: &HolderId,
        endpoints: &BTreeMap<String, Vec<String>>,
    ) -> Result<(), MembersError> {
        let member = Member {
            format: FORMAT,
            holder: holder.as_str().to_owned(),
            endpoints: endpoints.clone(),
            refreshed_ms: self.clock.wall_ms(),
        };
        let bytes = Bytes::from(serde_json::to_vec(&member).expect("a member encodes"));
        let key = self.key_of(holder);
        let written = match self.written.take() {
            Some((written_key, version)) if written_key == key => {
                match self.store.update(&key, &version, bytes.clone()).await {
                    Err(BlobError::Conflict { .. } | BlobError::NotFound { .. }) => {
                        self.replace(&key, bytes).await
                    }
                    other => other,
                }
            }
            _ => match self.store.create(&key, bytes.clone()).await {
                Err(BlobError::AlreadyExists { .. }) => self.replace(&key, bytes).await,
                other => other,
            },
        }?;
        self.written = Some((key, written));
        Ok(())
    }

    /// Overwrites an announcement this process did not write last (an
    /// earlier run of it): read its version, then swap.
    async fn replace(&self, key: &str, bytes: Bytes) -> Result<Version, BlobError> {
        let current = self.store.get(key).await?;
        self.store.update(key, &current.version, bytes).await
    }

    /// The fresh announcements, by key; one that does not decode is
    /// skipped with a warning (it names no process this build can list).
    pub async fn list(&self) -> Result<Vec<Member>, MembersError> {
        let now = self.clock.wall_ms();
        let fresh_for = FRESH_FOR.as_millis() as u64;
        let mut members = Vec::new();
        for object in self.store.list(&self.prefix).await? {
            let bytes = match self.store.get(&object.key).await {
                Ok(blob) => blob.bytes,
                Err(BlobError::NotFound { .. }) => continue,
                Err(error) => return Err(error.into()),
            };
            match serde_json::from_slice::<Member>(&bytes) {
                Ok(member) if member.format == FORMAT => {
                    if now.saturating_sub(member.refreshed_ms) <= fresh_for {
                        members.push(member);
                    }
                }
                Ok(member) => tracing::warn!(
                    key = %object.key,
                    format = member.format,
                    "member announcement written by a newer Chorus: skipped"
                ),
                Err(error) => {
                    tracing::warn!(key = %object.key, %error, "malformed member announcement: skipped")
                }
            }
        }
        Ok(members)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;

    use super::*;
    use crate::blob::ObjectStoreBlobs;
    use crate::clock::ManualClock;

    fn memory() -> DynBlobStore {
        Arc::new(ObjectStoreBlobs::new(
            Arc::new(InMemory::new()),
            "",
            "memory",
        ))
    }

    fn directory(store: &DynBlobStore, clock: &Arc<ManualClock>) -> Directory {
        let database = DatabaseKey::new("db").unwrap();
        Directory::new(store.clone(), &database, clock.clone())
    }

    fn etcd(url: &str) -> BTreeMap<String, Vec<String>> {
        BTreeMap::from([("etcd".to_owned(), vec![url.to_owned()])])
    }

    #[tokio::test]
    async fn announcements_are_listed_while_fresh_and_rewritten_in_place() {
        let store = memory();
        let clock = ManualClock::shared(1_000_000);
        let mut a = directory(&store, &clock);
        let mut b = directory(&store, &clock);
        let (holder_a, holder_b) = (HolderId::new("a").unwrap(), HolderId::new("b").unwrap());
        a.announce(&holder_a, &etcd("http://a:2379")).await.unwrap();
        b.announce(&holder_b, &etcd("http://b:2379")).await.unwrap();
        let holders = |members: Vec<Member>| -> Vec<String> {
            members.into_iter().map(|m| m.holder).collect()
        };
        assert_eq!(holders(a.list().await.unwrap()).len(), 2);
        // b stops; a refreshes; past FRESH_FOR only a is listed.
        clock.advance(FRESH_FOR);
        a.announce(&holder_a, &etcd("http://a:2379")).await.unwrap();
        clock.advance(Duration::from_millis(1));
        assert_eq!(holders(b.list().await.unwrap()), vec!["a".to_owned()]);
        // A restarted b (no version in memory) overwrites its old announcement.
        let mut restarted = directory(&store, &clock);
        restarted
            .announce(&holder_b, &etcd("http://b:2380"))
            .await
            .unwrap();
        let listed = a.list().await.unwrap();
        let b_listed = listed.iter().find(|m| m.holder == "b").unwrap();
        assert_eq!(b_listed.endpoints, etcd("http://b:2380"));
        assert_eq!(store.list("db/members").await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_malformed_announcement_is_skipped() {
        let store = memory();
        let clock = ManualClock::shared(1_000_000);
        let mut a = directory(&store, &clock);
        a.announce(&HolderId::new("a").unwrap(), &etcd("http://a"))
            .await
            .unwrap();
        store
            .create("db/members/junk.json", Bytes::from_static(b"{not json"))
            .await
            .unwrap();
        assert_eq!(a.list().await.unwrap().len(), 1);
    }
}
