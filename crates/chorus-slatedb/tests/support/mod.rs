//! A SlateDB database whose WAL is a Chorus log over in-memory replicas,
//! each replica behind its own fault controller; and where the test services
//! are, shared with the other crates' tests.

#![allow(dead_code)] // each test binary uses a different subset

#[path = "../../../chorus/tests/support/mod.rs"]
mod shared;

#[path = "../../../chorus/tests/support/moto.rs"]
pub mod moto;

#[allow(unused_imports)] // not every test binary needs the services
pub use shared::*;

use std::sync::Arc;

use chorus::blob::{DynBlobStore, FaultController, FaultyStore, ObjectStoreBlobs};
use chorus::log::LogStores;
use chorus::register::{ManifestStore, MemoryRegister, initialize};
use chorus_slatedb::{ChorusWal, ChorusWalOptions};
use object_store::ObjectStore;
use object_store::memory::InMemory;
use slatedb::{Db, Settings};

/// Where the database lives in its own store.
pub const DB_PATH: &str = "db";

/// The stores of one database: SlateDB's bucket, the WAL's replicas and the
/// log's register. They outlive any `Db` opened on them, as a bucket does.
pub struct Setup {
    /// SlateDB's own store (manifest, SSTs).
    pub bucket: Arc<dyn ObjectStore>,
    /// The WAL's replicas and register.
    pub stores: LogStores,
    /// One fault controller per replica.
    pub faults: Vec<FaultController>,
}

impl Setup {
    /// A new, empty database with a WAL of `replicas` replicas.
    pub async fn new(replicas: usize) -> Setup {
        let register: Arc<dyn ManifestStore> = Arc::new(MemoryRegister::new());
        let mut faults = Vec::new();
        let mut stored = Vec::new();
        for position in 0..replicas {
            let identity = format!("memory://wal-{position}");
            let store: DynBlobStore = Arc::new(ObjectStoreBlobs::new(
                Arc::new(InMemory::new()),
                "",
                identity.clone(),
            ));
            let controller = FaultController::new(position as u64 + 1);
            stored.push((
                identity,
                Arc::new(FaultyStore::new(store, controller.clone())) as DynBlobStore,
            ));
            faults.push(controller);
        }
        let identities = stored
            .iter()
            .map(|(identity, _)| identity.clone())
            .collect();
        initialize(register.as_ref(), identities, 8).await.unwrap();
        Setup {
            bucket: Arc::new(InMemory::new()),
            stores: LogStores {
                replicas: stored,
                register,
            },
            faults,
        }
    }

    /// Opens the database (fencing any earlier writer), without compaction
    /// or garbage collection running behind the test's back.
    pub async fn open(&self) -> Result<Db, slatedb::Error> {
        self.open_with(quiet()).await
    }

    /// Opens the database with `settings`.
    pub async fn open_with(&self, settings: Settings) -> Result<Db, slatedb::Error> {
        self.open_with_wal(settings, ChorusWalOptions::default())
            .await
    }

    /// Opens the database with `settings` and the WAL's `options`.
    pub async fn open_with_wal(
        &self,
        settings: Settings,
        options: ChorusWalOptions,
    ) -> Result<Db, slatedb::Error> {
        Db::builder(DB_PATH, Arc::clone(&self.bucket))
            .with_settings(settings)
            .with_wal_writer(Box::new(ChorusWal::new(self.stores.clone(), options)))
            .build()
            .await
    }

    /// The log's register as it is now.
    pub async fn manifest(&self) -> chorus::register::Manifest {
        let current = self.stores.register.read().await.unwrap().unwrap();
        chorus::register::Manifest::from_fields(&current.fields).unwrap()
    }
}

/// Settings without compaction or garbage collection in the background.
pub fn quiet() -> Settings {
    Settings {
        compactor_options: None,
        garbage_collector_options: None,
        ..Settings::default()
    }
}

/// Waits up to ten seconds for `condition`, polling.
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Key `i`.
pub fn key(i: u32) -> Vec<u8> {
    format!("key-{i:06}").into_bytes()
}

/// Value `i`.
pub fn value(i: u32) -> Vec<u8> {
    format!("value-{i}").into_bytes()
}

/// Puts key/value `i` for each `i` in `range` and waits until each is durable.
pub async fn put_durably(db: &Db, range: std::ops::Range<u32>) {
    for i in range {
        db.put(key(i), value(i))
            .await
            .unwrap()
            .await_durable()
            .await
            .unwrap();
    }
}

/// Asserts that exactly the keys in `present` out of `all` are in `db`, each
/// with its value.
pub async fn assert_exactly(db: &Db, all: std::ops::Range<u32>, present: impl Fn(u32) -> bool) {
    for i in all {
        let found = db.get(key(i)).await.unwrap();
        if present(i) {
            assert_eq!(found.as_deref(), Some(&value(i)[..]), "key {i}");
        } else {
            assert_eq!(found, None, "key {i} must not be there");
        }
    }
}
