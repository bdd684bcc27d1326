//! The simulated cluster: N in-memory replicas and a register. Each replica
//! is layered
//!
//! ```text
//! actor view   FaultyStore (this actor's faults: lost responses, partitions)
//!   replica    FaultyStore (replica-wide faults: outages, slow replica)
//!   recording  RecordingStore (notes every key a write touched; harness only)
//!   raw        ObjectStoreBlobs over object_store::memory::InMemory
//! ```
//!
//! and the register the same way (`FaultyRegister` twice over a
//! `MemoryRegister`). Checkers read the raw layer only, never through a
//! fault-injecting wrapper.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use chorus::blob::{
    Blob, BlobError, BlobStore, DynBlobStore, FaultController, FaultyStore, ObjectMeta,
    ObjectStoreBlobs, PutPayload, Version,
};
use chorus::log::LogStores;
use chorus::register::{
    FaultyRegister, ManifestStore, MemoryRegister, VersionedManifest, initialize,
};
use futures::FutureExt;

use crate::model::Violation;

/// Keys written (created, updated or deleted) on one replica since the
/// checker last looked.
pub type DirtyKeys = Arc<Mutex<BTreeSet<String>>>;

/// Sees every create and update that applies to a recorded store, with its
/// bytes, at the instant it applies: below every fault injector, so lost
/// responses included.
pub trait WriteObserver: Send + Sync + std::fmt::Debug {
    /// `bytes` now stand at `key`.
    fn landed(&self, key: &str, bytes: &Bytes);
}

/// A pass-through store that records the key of every write, so the
/// checkers' mirror of the raw stores only re-reads what changed, and shows
/// what lands to an optional [`WriteObserver`].
#[derive(Debug)]
pub struct RecordingStore {
    inner: DynBlobStore,
    dirty: DirtyKeys,
    observer: Option<Arc<dyn WriteObserver>>,
}

impl RecordingStore {
    /// Wraps `inner`, noting written keys in `dirty` and showing what lands
    /// to `observer`.
    pub fn new(
        inner: DynBlobStore,
        dirty: DirtyKeys,
        observer: Option<Arc<dyn WriteObserver>>,
    ) -> RecordingStore {
        RecordingStore {
            inner,
            dirty,
            observer,
        }
    }

    /// Shows a write that landed to the observer; `bytes` makes what it
    /// wrote only then.
    fn landed<T>(&self, key: &str, outcome: &Result<T, BlobError>, bytes: impl FnOnce() -> Bytes) {
        if let (Ok(_), Some(observer)) = (outcome, &self.observer) {
            observer.landed(key, &bytes());
        }
    }

    fn note(&self, key: &str) {
        self.dirty
            .lock()
            .expect("dirty set poisoned")
            .insert(key.to_owned());
    }
}

#[async_trait]
impl BlobStore for RecordingStore {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn create_parts(&self, key: &str, parts: PutPayload) -> Result<Version, BlobError> {
        let outcome = self.inner.create_parts(key, parts.clone()).await;
        self.note(key);
        // Joined only for an observer, and only once it landed.
        self.landed(key, &outcome, || Bytes::from(parts));
        outcome
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        bytes: Bytes,
    ) -> Result<Version, BlobError> {
        let outcome = self.inner.update(key, expected, bytes.clone()).await;
        self.note(key);
        self.landed(key, &outcome, || bytes);
        outcome
    }

    async fn get(&self, key: &str) -> Result<Blob, BlobError> {
        self.inner.get(key).await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BlobError> {
        self.inner.get_range(key, range).await
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, BlobError> {
        self.inner.head(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, BlobError> {
        self.inner.list(prefix).await
    }

    async fn delete(&self, key: &str) -> Result<(), BlobError> {
        let outcome = self.inner.delete(key).await;
        self.note(key);
        outcome
    }
}

/// A fresh in-memory store as the checkers see it (`raw`) and as everything
/// above sees it (`store`, which notes written keys in `dirty`).
#[derive(Debug)]
pub struct RecordedStore {
    /// The raw store: what the checkers read.
    pub raw: DynBlobStore,
    /// The keys written since the checker last looked.
    pub dirty: DirtyKeys,
    /// The recording layer over `raw`.
    pub store: DynBlobStore,
}

impl RecordedStore {
    /// An empty store named `identity`, whose writes `observer` sees land.
    pub fn new(identity: &str, observer: Option<Arc<dyn WriteObserver>>) -> RecordedStore {
        let memory = Arc::new(object_store::memory::InMemory::new());
        let raw: DynBlobStore = Arc::new(ObjectStoreBlobs::new(memory, "", identity));
        let dirty = DirtyKeys::default();
        let store = Arc::new(RecordingStore::new(raw.clone(), dirty.clone(), observer));
        RecordedStore { raw, dirty, store }
    }
}

/// The bytes at `key` in a raw store (`None` if absent), read at once: the
/// checkers' view, never through a fault-injecting layer.
pub fn raw_bytes(raw: &DynBlobStore, key: &str) -> Result<Option<Bytes>, Violation> {
    match raw
        .get(key)
        .now_or_never()
        .expect("raw stores answer at once")
    {
        Ok(blob) => Ok(Some(blob.bytes)),
        Err(BlobError::NotFound { .. }) => Ok(None),
        Err(error) => Err(format!("raw get {key} on {}: {error}", raw.name())),
    }
}

/// The fault controllers private to one actor (a writer's recovery, a reader).
#[derive(Debug, Clone)]
pub struct ActorFaults {
    /// One per replica, in replica order.
    pub replicas: Vec<FaultController>,
    /// The actor's register faults.
    pub register: FaultController,
}

impl ActorFaults {
    /// Faults injected so far into calls through `self` or any
    /// replica-wide controller of `world` (which other actors share, so an
    /// unchanged total proves a stretch of calls saw no fault, not the reverse).
    pub fn injected_with(&self, world: &World) -> u64 {
        self.replicas
            .iter()
            .chain(&world.replica_faults)
            .chain([&self.register, &world.register_faults])
            .map(FaultController::injected)
            .sum()
    }

    /// Removes every rule.
    pub fn clear(&self) {
        for controller in &self.replicas {
            controller.clear();
        }
        self.register.clear();
    }
}

/// The simulated replicas and register.
#[derive(Debug)]
pub struct World {
    /// Replica identities, in register order.
    pub identities: Vec<String>,
    /// The raw replicas: what the checkers read.
    pub raw: Vec<DynBlobStore>,
    /// Per replica, the keys written since the checker last looked.
    pub dirty: Vec<DirtyKeys>,
    /// Replica-wide faults (every actor sees them): outages, slow replicas.
    pub replica_faults: Vec<FaultController>,
    replica_stores: Vec<DynBlobStore>,
    /// The raw register: what the checkers read.
    pub raw_register: Arc<MemoryRegister>,
    /// Register faults every actor sees.
    pub register_faults: FaultController,
    register: Arc<dyn ManifestStore>,
}

impl World {
    /// A fresh log of `replicas` replicas with `window`; `seeds` seeds the
    /// fault controllers' random choices.
    pub async fn new(replicas: usize, window: u32, mut seeds: impl FnMut() -> u64) -> World {
        let mut world = World {
            identities: Vec::new(),
            raw: Vec::new(),
            dirty: Vec::new(),
            replica_faults: Vec::new(),
            replica_stores: Vec::new(),
            raw_register: Arc::new(MemoryRegister::new()),
            register_faults: FaultController::new(seeds()),
            register: Arc::new(MemoryRegister::new()),
        };
        for position in 0..replicas {
            let identity = format!("memory://sim-r{position}");
            let recorded = RecordedStore::new(&identity, None);
            let controller = FaultController::new(seeds());
            world.replica_stores.push(Arc::new(FaultyStore::new(
                recorded.store,
                controller.clone(),
            )));
            world.identities.push(identity);
            world.raw.push(recorded.raw);
            world.dirty.push(recorded.dirty);
            world.replica_faults.push(controller);
        }
        world.register = Arc::new(FaultyRegister::new(
            world.raw_register.clone(),
            world.register_faults.clone(),
        ));
        initialize(
            world.raw_register.as_ref(),
            world.identities.clone(),
            window,
        )
        .await
        .expect("initializing an in-memory register cannot fail");
        world
    }

    /// Damages the stored copy of `key` on `replica` behind every actor's
    /// back (bit rot, or an operator's mistake): flips bit `bit` of it, or
    /// deletes it when `bit` is `None`.
    pub fn rot(&self, replica: usize, key: &str, bit: Option<u64>) {
        let store = &self.raw[replica];
        let answer = "in-memory stores answer at once";
        let result = match bit {
            None => store.delete(key).now_or_never().expect(answer),
            Some(bit) => {
                let blob = store.get(key).now_or_never().expect(answer);
                blob.and_then(|blob| {
                    let mut bytes = blob.bytes.to_vec();
                    let at = (bit / 8) as usize % bytes.len();
                    bytes[at] ^= 1 << (bit % 8);
                    store
                        .update(key, &blob.version, Bytes::from(bytes))
                        .now_or_never()
                        .expect(answer)
                        .map(|_| ())
                })
            }
        };
        result.expect("the raw store holds what the mirror says");
        self.dirty[replica]
            .lock()
            .expect("dirty set")
            .insert(key.to_owned());
    }

    /// The raw register as it stands, read at once: the checkers' view.
    pub fn register_now(&self) -> Result<VersionedManifest, Violation> {
        self.raw_register
            .read()
            .now_or_never()
            .expect("the in-memory register answers at once")
            .map_err(|error| format!("raw register read failed: {error}"))?
            .ok_or_else(|| "the register vanished".to_owned())
    }

    /// The number of replicas.
    pub fn replica_count(&self) -> usize {
        self.raw.len()
    }

    /// Stores for one actor, with fault controllers of its own on top of the
    /// replica-wide ones.
    pub fn view(&self, mut seeds: impl FnMut() -> u64) -> (LogStores, ActorFaults) {
        let faults = ActorFaults {
            replicas: (0..self.raw.len())
                .map(|_| FaultController::new(seeds()))
                .collect(),
            register: FaultController::new(seeds()),
        };
        let replicas = self
            .identities
            .iter()
            .zip(&self.replica_stores)
            .zip(&faults.replicas)
            .map(|((identity, store), controller)| {
                let store: DynBlobStore =
                    Arc::new(FaultyStore::new(store.clone(), controller.clone()));
                (identity.clone(), store)
            })
            .collect();
        let register: Arc<dyn ManifestStore> = Arc::new(FaultyRegister::new(
            self.register.clone(),
            faults.register.clone(),
        ));
        (LogStores { replicas, register }, faults)
    }

    /// Ends every replica-wide and register-wide fault.
    pub fn heal(&self) {
        for controller in &self.replica_faults {
            controller.clear();
        }
        self.register_faults.clear();
    }
}
