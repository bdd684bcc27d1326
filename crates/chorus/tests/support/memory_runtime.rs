//! A primary runtime over fresh in-memory stores: what the service-level
//! tests (the HTTP router's, the etcd gRPC service's) start from. Included
//! by path from each crate's tests/support.

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

/// A primary of database `database` over three in-memory replicas, each
/// passed through `wrap` (a fault injector, or as is), once it is sure of
/// its lease.
pub async fn primary(
    database: &str,
    wrap: impl Fn(DynBlobStore) -> DynBlobStore,
) -> Arc<Runtime<KvState>> {
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
    let meta = memory(&format!("{database}-meta"));
    let key = DatabaseKey::new(database).expect("a valid database key");
    let lease = LeaseConfig {
        ttl: Duration::from_secs(10),
        safety_margin: Duration::from_secs(2),
        store_call_timeout: Duration::from_secs(2),
    };
    let stores = RuntimeStores {
        log: LogStores { replicas, register },
        snapshots: SnapshotStore::new(
            meta.clone(),
            key.clone(),
            SnapshotConfig::default(),
            SystemClock::shared(),
        ),
        leases: LeaseStore::new(meta, key, lease, SystemClock::shared()).expect("a lease config"),
    };
    let config = RuntimeConfig::new(HolderId::new("http://test:1").expect("a holder id"));
    let runtime = Arc::new(Runtime::start(stores, config).expect("a valid config"));
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
