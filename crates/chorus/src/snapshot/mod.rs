//! Fenced snapshot publication (docs/design/0002-lease-and-snapshots.md).
//!
//! Layout of one database in a store:
//!
//! ```text
//! <db>/HEAD.json                                  the only mutable object, moved by CAS
//! <db>/snapshots/g<generation>-s<sequence>        immutable payloads (create-if-absent)
//! <db>/lease.json                                 the writer lease (crate::lease)
//! ```
//!
//! [`SnapshotStore`] holds the read-side operations: the stable HEAD read,
//! listing, verified download and [retention](SnapshotStore::retain).
//! [`PublicationStore`] is the writer's state machine, Unobserved → Observed →
//! Claimed → Fenced (sticky): it moves HEAD only by CAS from a version it
//! observed or wrote itself, stamped with a lease that can still vouch for it,
//! so a process whose lease was superseded can never make its payload current.

mod error;
mod head;
mod publication;
mod retention;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::blob::{Blob, BlobError, DynBlobStore, TimeoutStore, Version, create_resolving};
use crate::clock::DynClock;
use crate::lease::DatabaseKey;

pub use error::{FenceReason, SnapshotError};
pub use head::{
    HEAD_FORMAT, Head, PayloadId, PublicationSequence, PublisherId, Sha256Digest, head_key,
    payload_prefix,
};
pub use publication::{ClaimOutcome, NewSnapshot, PublicationState, PublicationStore};
pub use retention::{DEFAULT_KEEP_PAYLOADS, RetentionReport};

/// Rounds of a stable HEAD read before giving up on a HEAD that keeps moving.
pub const MAX_STABLE_READ_ROUNDS: u32 = 8;

/// Timeouts of snapshot store calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotConfig {
    /// Bound on each HEAD read or write. HEAD is tiny; a slow call is a sick
    /// store, and failing fast lets the caller retry or step down.
    pub head_call_timeout: Duration,
    /// Bound on each payload upload, download, listing or delete. Payloads can
    /// be large: set it above `payload size / store bandwidth`.
    pub payload_call_timeout: Duration,
}

impl Default for SnapshotConfig {
    fn default() -> SnapshotConfig {
        SnapshotConfig {
            head_call_timeout: Duration::from_secs(5),
            payload_call_timeout: Duration::from_secs(300),
        }
    }
}

/// HEAD as read, with the version a CAS must name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionedHead {
    /// The decoded document.
    pub head: Head,
    /// Its version in the store.
    pub version: Version,
}

/// A payload found by [`SnapshotStore::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPayload {
    /// The payload's id.
    pub id: PayloadId,
    /// Its object key.
    pub key: String,
    /// Its size.
    pub size_bytes: u64,
}

/// The outcome of one stable-read round.
enum HeadRead {
    /// The versions agreed; the body (`None`: no HEAD) is the one they name.
    Stable(Option<Blob>),
    /// HEAD changed during the round.
    Moved,
}

/// The snapshots of one database in one store; cheap to clone.
#[derive(Debug, Clone)]
pub struct SnapshotStore {
    /// The store with the HEAD timeout.
    heads: DynBlobStore,
    /// The store with the payload timeout.
    payloads: DynBlobStore,
    database: DatabaseKey,
    head_key: String,
    clock: DynClock,
}

impl SnapshotStore {
    /// The snapshots of `database` in `store` (which must enforce conditional
    /// writes: open it with [`open_store`](crate::blob::open_store)).
    pub fn new(
        store: DynBlobStore,
        database: DatabaseKey,
        config: SnapshotConfig,
        clock: DynClock,
    ) -> SnapshotStore {
        SnapshotStore {
            heads: Arc::new(TimeoutStore::new(store.clone(), config.head_call_timeout)),
            payloads: Arc::new(TimeoutStore::new(store, config.payload_call_timeout)),
            head_key: head_key(&database),
            database,
            clock,
        }
    }

    /// The database.
    pub fn database(&self) -> &DatabaseKey {
        &self.database
    }

    /// The store the snapshots are in (with the HEAD timeout), for small
    /// documents kept beside them.
    pub fn store(&self) -> &DynBlobStore {
        &self.heads
    }

    /// The clock the store's documents are stamped with.
    pub fn clock(&self) -> &DynClock {
        &self.clock
    }

    /// The HEAD document's key, `<db>/HEAD.json`.
    pub fn head_key(&self) -> &str {
        &self.head_key
    }

    /// A fresh publication store (state Unobserved) over these snapshots.
    pub fn publication(&self) -> PublicationStore {
        PublicationStore::new(self.clone(), PublisherId::random())
    }

    /// A fresh publication store that stamps `publisher_id` into its HEADs
    /// instead of a random id: for deterministic simulation. Two boots must
    /// never share an id (see [`PublisherId`]).
    pub fn publication_as(&self, publisher_id: PublisherId) -> PublicationStore {
        PublicationStore::new(self.clone(), publisher_id)
    }

    /// Reads HEAD stably: its version, its body, its version again, repeated
    /// until the three agree (at most [`MAX_STABLE_READ_ROUNDS`]), so the body
    /// returned is exactly the one the returned version names. `None` if no
    /// HEAD was ever installed.
    pub async fn read_head(&self) -> Result<Option<VersionedHead>, SnapshotError> {
        let mut last_transient = None;
        for _ in 0..MAX_STABLE_READ_ROUNDS {
            match self.read_head_once().await {
                Ok(HeadRead::Stable(None)) => return Ok(None),
                Ok(HeadRead::Stable(Some(blob))) => {
                    let head = Head::decode(&self.database, &self.head_key, &blob.bytes)?;
                    let version = blob.version;
                    return Ok(Some(VersionedHead { head, version }));
                }
                Ok(HeadRead::Moved) => last_transient = None,
                Err(error) if error.is_transient() => last_transient = Some(error),
                Err(error) => return Err(error.into()),
            }
        }
        Err(match last_transient {
            Some(error) => error.into(),
            None => SnapshotError::Unstable {
                key: self.head_key.clone(),
                rounds: MAX_STABLE_READ_ROUNDS,
            },
        })
    }

    /// One round of the stable read.
    async fn read_head_once(&self) -> Result<HeadRead, BlobError> {
        let before = self.head_version().await?;
        let body = match self.heads.get(&self.head_key).await {
            Ok(blob) => Some(blob),
            Err(BlobError::NotFound { .. }) => None,
            Err(error) => return Err(error),
        };
        let after = self.head_version().await?;
        let body_version = body.as_ref().map(|blob| &blob.version);
        if before.as_ref() == body_version && body_version == after.as_ref() {
            Ok(HeadRead::Stable(body))
        } else {
            Ok(HeadRead::Moved)
        }
    }

    async fn head_version(&self) -> Result<Option<Version>, BlobError> {
        match self.heads.head(&self.head_key).await {
            Ok(meta) => Ok(Some(meta.version)),
            Err(BlobError::NotFound { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Every payload in the store, oldest first. Keys that are not payload
    /// names are not ours: they are skipped here and never deleted.
    pub async fn list(&self) -> Result<Vec<StoredPayload>, SnapshotError> {
        let listed = self.payloads.list(&payload_prefix(&self.database)).await?;
        let mut payloads: Vec<StoredPayload> = listed
            .into_iter()
            .filter_map(|meta| {
                let id = PayloadId::from_key(&self.database, &meta.key)?;
                Some(StoredPayload {
                    id,
                    key: meta.key,
                    size_bytes: meta.size,
                })
            })
            .collect();
        payloads.sort_by_key(|payload| payload.id);
        Ok(payloads)
    }

    /// Whether a listed payload can be read back (its metadata, one small
    /// request): `Err` names why not, for listings that flag damage.
    pub async fn check_payload(&self, payload: &StoredPayload) -> Result<(), SnapshotError> {
        self.payloads.head(&payload.key).await.map(drop)?;
        Ok(())
    }

    /// Downloads the payload `head` names and verifies its size and SHA-256.
    pub async fn download(&self, head: &Head) -> Result<Bytes, SnapshotError> {
        let key = head.snapshot_key();
        let bytes = match self.payloads.get(&key).await {
            Ok(blob) => blob.bytes,
            Err(BlobError::NotFound { .. }) => return Err(SnapshotError::PayloadMissing { key }),
            Err(error) => return Err(error.into()),
        };
        if bytes.len() as u64 != head.payload_size_bytes {
            return Err(SnapshotError::Size {
                key,
                expected: head.payload_size_bytes,
                found: bytes.len() as u64,
            });
        }
        let found = Sha256Digest::of_payload(&bytes).await;
        if found != head.payload_sha256 {
            return Err(SnapshotError::Checksum {
                key,
                expected: head.payload_sha256,
                found,
            });
        }
        Ok(bytes)
    }

    /// Reads HEAD stably and downloads (and verifies) its payload; `None` if
    /// no HEAD was ever installed.
    pub async fn restore(&self) -> Result<Option<(Head, Bytes)>, SnapshotError> {
        let Some(current) = self.read_head().await? else {
            return Ok(None);
        };
        let bytes = self.download(&current.head).await?;
        Ok(Some((current.head, bytes)))
    }

    /// Keeps the newest `keep` payloads and whatever HEAD names, and deletes
    /// the other payloads whose sequence is below HEAD's. Payloads at or above
    /// HEAD's sequence may belong to a publication in flight and are kept; with
    /// no HEAD at all nothing is deleted.
    pub async fn retain(&self, keep: NonZeroUsize) -> Result<RetentionReport, SnapshotError> {
        let head = self.read_head().await?.map(|current| current.head);
        let payloads = self.list().await?;
        let ids: Vec<PayloadId> = payloads.iter().map(|payload| payload.id).collect();
        let report = retention::plan(&ids, head.as_ref(), keep);
        for id in &report.deleted {
            self.payloads.delete(&id.key(&self.database)).await?;
            metrics::counter!("chorus_snapshot_payloads_deleted_total").increment(1);
        }
        Ok(report)
    }

    /// Uploads a payload under its fresh key, settling unknown outcomes by
    /// comparing bytes. `AlreadyExists` means the key holds other bytes.
    async fn upload(&self, id: PayloadId, bytes: Bytes) -> Result<(), BlobError> {
        create_resolving(self.payloads.as_ref(), &id.key(&self.database), bytes)
            .await
            .map(drop)
    }

    fn wall_ms(&self) -> u64 {
        self.clock.wall_ms()
    }
}

#[cfg(test)]
mod tests;
