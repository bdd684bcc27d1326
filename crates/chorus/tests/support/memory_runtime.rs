//! Runtimes over fresh in-memory stores: what the service-level tests (the
//! HTTP router's, the etcd gRPC service's, the etcd differential suites)
//! start from, a primary alone or several nodes on the same stores. Included
//! by path from each crate's tests.

#![allow(dead_code)] // each test binary uses a different subset

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chorus::blob::DynBlobStore;
use chorus::clock::SystemClock;
use chorus::kv::KvState;
use chorus::lease::{DatabaseKey, HolderId, LeaseConfig, LeaseStore};
use chorus::log::LogStores;
use chorus::register::{DEFAULT_WINDOW, ManifestStore, MemoryRegister, initialize};
use chorus::runtime::{Runtime, RuntimeConfig, RuntimeStores};
use chorus::snapshot::{SnapshotConfig, SnapshotStore};

/// Bound on every wait (boot, apply): a poll, never a sleep to synchronize.
pub const PATIENCE: Duration = Duration::from_secs(20);
/// Bound on a takeover: the lease released by a clean shutdown, taken by the
/// next node once it notices (a loaded 2-core machine).
pub const TAKEOVER_PATIENCE: Duration = Duration::from_secs(30);

/// A fresh in-memory store: named memory stores are shared within a
/// process, so every call gets a name of its own.
pub fn memory(label: &str) -> DynBlobStore {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let url = format!("memory://{label}-{}-{call}", std::process::id())
        .parse()
        .expect("a memory URL");
    chorus::blob::open_store_unprobed(&url).expect("a memory store")
}

/// The stores of one in-memory database: three replicas (each passed
/// through a wrapper: a fault injector, or none), a memory register and a
/// memory store for leases and snapshots. Runtimes built from the same
/// `MemoryStores` share them: a standby, or a takeover's second node.
pub struct MemoryStores {
    /// The database's name (its lease and snapshot key).
    pub database: String,
    replicas: Vec<(String, DynBlobStore)>,
    register: Arc<dyn ManifestStore>,
    meta: DynBlobStore,
}

impl MemoryStores {
    /// Fresh stores of database `database` holding a new, empty log.
    pub async fn new(database: &str, wrap: impl Fn(DynBlobStore) -> DynBlobStore) -> MemoryStores {
        let replicas: Vec<(String, DynBlobStore)> = (0..3)
            .map(|position| {
                let store = wrap(memory(&format!("{database}-r{position}")));
                (format!("memory://r{position}"), store)
            })
            .collect();
        let register: Arc<dyn ManifestStore> = Arc::new(MemoryRegister::new());
        let identities = replicas.iter().map(|(name, _)| name.clone()).collect();
        initialize(register.as_ref(), identities, DEFAULT_WINDOW)
            .await
            .expect("a new log");
        MemoryStores {
            database: database.to_owned(),
            replicas,
            register,
            meta: memory(&format!("{database}-meta")),
        }
    }

    /// A runtime over these stores as `holder`: it takes the lease once it
    /// can, and until then is a standby.
    pub fn runtime(&self, holder: &str) -> Arc<Runtime<KvState>> {
        self.runtime_with(holder, |_| {})
    }

    /// [`runtime`](Self::runtime), with its config changed by `configure`
    /// first (a shorter standby poll, say).
    pub fn runtime_with(
        &self,
        holder: &str,
        configure: impl FnOnce(&mut RuntimeConfig),
    ) -> Arc<Runtime<KvState>> {
        let key = DatabaseKey::new(&self.database).expect("a valid database key");
        let lease = LeaseConfig {
            ttl: Duration::from_secs(10),
            safety_margin: Duration::from_secs(2),
            store_call_timeout: Duration::from_secs(2),
        };
        let stores = RuntimeStores {
            log: LogStores {
                replicas: self.replicas.clone(),
                register: Arc::clone(&self.register),
            },
            snapshots: SnapshotStore::new(
                self.meta.clone(),
                key.clone(),
                SnapshotConfig::default(),
                SystemClock::shared(),
            ),
            leases: LeaseStore::new(self.meta.clone(), key, lease, SystemClock::shared())
                .expect("a lease config"),
        };
        let mut config = RuntimeConfig::new(HolderId::new(holder).expect("a holder id"));
        configure(&mut config);
        Arc::new(Runtime::start(stores, config).expect("a valid runtime config"))
    }
}

/// A primary of database `database` over three in-memory replicas, each
/// passed through `wrap` (a fault injector, or as is), once it is sure of
/// its lease.
pub async fn primary(
    database: &str,
    wrap: impl Fn(DynBlobStore) -> DynBlobStore,
) -> Arc<Runtime<KvState>> {
    let runtime = MemoryStores::new(database, wrap)
        .await
        .runtime("http://test:1");
    wait_until("primary", || runtime.is_primary_and_sure()).await;
    runtime
}

/// Polls `done` until it holds, failing the test after [`PATIENCE`].
pub async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not {what} within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `next` is the primary and sure of its lease (after the
/// previous one shut down), failing at once if it stopped instead, and after
/// [`TAKEOVER_PATIENCE`]; `what` names it in failures.
pub async fn wait_for_takeover(next: &Runtime<KvState>, what: &str) {
    let deadline = tokio::time::Instant::now() + TAKEOVER_PATIENCE;
    while !next.is_primary_and_sure() {
        if matches!(next.status().role, chorus::runtime::Role::Stopped) {
            panic!(
                "{what} stopped before taking over: {:?}",
                next.finished().await
            );
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not take over within {TAKEOVER_PATIENCE:?}: {:#?}",
            next.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
