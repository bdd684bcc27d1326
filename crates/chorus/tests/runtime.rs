//! The runtime (docs/design/0003-runtime-and-service.md) running the key-value
//! state machine over in-memory stores, in real time with a short lease:
//! booting as primary, serving writes and reads, graceful shutdown and
//! restart, takeover after a crashed primary's lease expires, a warm standby
//! and its takeover, and a standby that lagged past a truncation.
//!
//! Every process ("node") opens its own view of the shared stores, behind two
//! fault controllers of its own: one for its log (replicas and register), one
//! for its lease and snapshot store. An outage on both is a crashed or
//! partitioned process: it can no longer change anything the others see.

#[path = "support/log.rs"]
mod log_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use chorus::blob::{
    DynBlobStore, Fault, FaultController, FaultRule, FaultyStore, KeyMatch, ObjectStoreBlobs, Op,
    OpSet,
};
use chorus::clock::SystemClock;
use chorus::ids::RecordIndex;
use chorus::kv::{Applied, Command, Condition, KvState, Operation};
use chorus::lease::{
    Contender, DatabaseKey, HolderId, Incarnation, LeaseConfig, LeaseRecord, LeaseStore,
};
use chorus::log::{LogConfig, LogError, LogStores, Reader};
use chorus::register::{FaultyRegister, ManifestStore};
use chorus::runtime::{
    Checkpoint, LOG_VIEW_MAX_AGE, RestoreError, Role, Runtime, RuntimeConfig, RuntimeStores,
    StateMachine, Unavailable, WriteError, Written,
};
use chorus::snapshot::{Head, SnapshotConfig, SnapshotStore};
use log_support::{Cluster, test_config, wait_until};
use tokio::time::Instant;

/// The lease timing: short, so takeovers happen within a test.
const TTL: Duration = Duration::from_millis(600);
const MARGIN: Duration = Duration::from_millis(150);
const STORE_CALL_TIMEOUT: Duration = Duration::from_millis(100);
/// Standby polls, lease checks and retry pauses.
const POLL: Duration = Duration::from_millis(50);
/// The most any awaited condition may take (boot, takeover, catching up);
/// normally a fraction of it.
const PATIENCE: Duration = Duration::from_secs(5);

type Kv = Runtime<KvState>;

fn holder(id: &str) -> HolderId {
    HolderId::new(id).unwrap()
}

fn database() -> DatabaseKey {
    DatabaseKey::new("runtime-test").unwrap()
}

fn memory_store(name: &str) -> DynBlobStore {
    Arc::new(ObjectStoreBlobs::new(
        Arc::new(object_store::memory::InMemory::new()),
        "",
        format!("memory://{name}"),
    ))
}

fn lease_config() -> LeaseConfig {
    LeaseConfig {
        ttl: TTL,
        safety_margin: MARGIN,
        store_call_timeout: STORE_CALL_TIMEOUT,
    }
}

fn snapshot_config() -> SnapshotConfig {
    SnapshotConfig {
        head_call_timeout: Duration::from_secs(1),
        payload_call_timeout: Duration::from_secs(2),
    }
}

/// A runtime configuration for `holder` that snapshots every
/// `snapshot_every_records` records (by count alone, whatever the
/// snapshots' size, and not by time within a test).
fn config(holder_id: &str, snapshot_every_records: u64) -> RuntimeConfig {
    RuntimeConfig {
        log: test_config(),
        snapshot_every_records,
        snapshot_min_log_percent: 0,
        snapshot_interval: Duration::from_secs(60),
        standby_poll_interval: POLL,
        lease_check_interval: POLL,
        drain_timeout: Duration::from_secs(2),
        retry_backoff: POLL,
        ..RuntimeConfig::new(holder(holder_id))
    }
}

/// One database: a log of three in-memory replicas and a memory register,
/// and one in-memory store for its lease and snapshots.
struct Db {
    cluster: Cluster,
    meta: DynBlobStore,
}

/// One process's view of a [`Db`], with its own fault controllers.
struct Node {
    stores: RuntimeStores,
    /// Its log replicas and register.
    log_faults: FaultController,
    /// Its lease and snapshot store.
    meta_faults: FaultController,
}

impl Node {
    /// A crash, as far as anyone else can tell: no call of this process
    /// reaches any store any more.
    fn isolate(&self) {
        self.log_faults.set_outage(true);
        self.meta_faults.set_outage(true);
    }

    fn heal(&self) {
        self.log_faults.clear();
        self.meta_faults.clear();
    }

    fn start(&self, config: RuntimeConfig) -> Kv {
        Runtime::start(self.stores.clone(), config).expect("valid runtime config")
    }
}

impl Db {
    async fn new() -> Db {
        Db {
            cluster: Cluster::new(3, 4).await,
            meta: memory_store("meta"),
        }
    }

    /// A process's view: every store behind fault controllers seeded from `seed`.
    fn node(&self, seed: u64) -> Node {
        self.node_with_snapshots(seed, snapshot_config())
    }

    /// [`node`](Db::node) with its own snapshot store settings.
    fn node_with_snapshots(&self, seed: u64, snapshots: SnapshotConfig) -> Node {
        let log_faults = FaultController::new(seed);
        let meta_faults = FaultController::new(seed + 1000);
        let replicas = self
            .cluster
            .stores
            .replicas
            .iter()
            .zip(&self.cluster.raw)
            .map(|((identity, _), raw)| {
                let store: DynBlobStore =
                    Arc::new(FaultyStore::new(raw.clone(), log_faults.clone()));
                (identity.clone(), store)
            })
            .collect();
        let register: Arc<dyn ManifestStore> = Arc::new(FaultyRegister::new(
            Arc::clone(&self.cluster.stores.register),
            log_faults.clone(),
        ));
        let meta: DynBlobStore = Arc::new(FaultyStore::new(self.meta.clone(), meta_faults.clone()));
        let stores = RuntimeStores {
            log: LogStores { replicas, register },
            snapshots: SnapshotStore::new(
                meta.clone(),
                database(),
                snapshots,
                SystemClock::shared(),
            ),
            leases: LeaseStore::new(meta, database(), lease_config(), SystemClock::shared())
                .expect("valid lease config"),
        };
        Node {
            stores,
            log_faults,
            meta_faults,
        }
    }

    /// The lease as stored.
    async fn lease(&self) -> LeaseRecord {
        let leases = LeaseStore::new(
            self.meta.clone(),
            database(),
            lease_config(),
            SystemClock::shared(),
        )
        .unwrap();
        leases.read().await.unwrap().expect("a lease was taken")
    }

    fn snapshots(&self) -> SnapshotStore {
        SnapshotStore::new(
            self.meta.clone(),
            database(),
            snapshot_config(),
            SystemClock::shared(),
        )
    }

    /// `HEAD.json` as stored.
    async fn head(&self) -> Option<Head> {
        self.snapshots()
            .read_head()
            .await
            .unwrap()
            .map(|versioned| versioned.head)
    }

    /// The state the snapshot HEAD names encodes.
    async fn head_state(&self) -> KvState {
        let head = self.head().await.expect("HEAD installed");
        let bytes = self.snapshots().download(&head).await.unwrap();
        KvState::decode_snapshot(&bytes).unwrap()
    }

    /// The log's committed end, read from the stores.
    async fn log_end(&self) -> RecordIndex {
        Reader::committed_end(&self.cluster.stores).await.unwrap()
    }
}

fn put_command(key: &str, value: &str, condition: Condition) -> Command {
    Command::Single(Operation::Put {
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value.as_bytes()),
        condition,
    })
}

fn delete_command(key: &str) -> Command {
    Command::Single(Operation::Delete {
        key: Bytes::copy_from_slice(key.as_bytes()),
        condition: Condition::None,
    })
}

/// Writes `command` as a client of the runtime does: its conditions checked
/// against the applied state, so a failed condition appends nothing. A
/// moment of lease uncertainty (a refresh late on a loaded machine) is
/// waited out; every other answer is returned.
async fn write(runtime: &Kv, command: &Command) -> Result<Written<Applied>, WriteError<Applied>> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let outcome = runtime
            .write(|state: &KvState| -> Result<Bytes, Applied> {
                state.check(command)?;
                Ok(command.encode().expect("a valid command"))
            })
            .await;
        match outcome {
            Err(WriteError::Unavailable(Unavailable::LeaseUncertain))
                if Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => return other,
        }
    }
}

/// Puts `key` = `value` unconditionally; returns the record's index.
async fn put(runtime: &Kv, key: &str, value: &str) -> RecordIndex {
    let written = write(runtime, &put_command(key, value, Condition::None))
        .await
        .unwrap_or_else(|error| panic!("put {key}: {error:?}"));
    assert!(
        matches!(written.output, Applied::Done { ref unchanged, .. } if unchanged.is_empty()),
        "put {key}: {:?}",
        written.output
    );
    written.index
}

/// A current read (on a primary sure of its lease), waiting out a moment of
/// lease uncertainty.
async fn read<T>(runtime: &Kv, read: impl Fn(&KvState) -> T) -> (T, RecordIndex) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match runtime.read(&read) {
            Ok(answer) => return answer,
            Err(Unavailable::LeaseUncertain) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(other) => panic!("current read refused: {other}"),
        }
    }
}

/// The value of `key` in `state`, as text.
fn value(state: &KvState, key: &str) -> Option<String> {
    state
        .get(key.as_bytes())
        .map(|entry| String::from_utf8(entry.value.to_vec()).unwrap())
}

/// The whole applied state and its end, whatever the role.
fn state_of(runtime: &Kv) -> (KvState, RecordIndex) {
    runtime.read_stale(KvState::clone)
}

async fn wait_primary<M: StateMachine>(runtime: &Runtime<M>) {
    let what = format!("{} is a primary sure of its lease", runtime.config().holder);
    wait_until(&what, PATIENCE, || async { runtime.is_primary_and_sure() }).await;
}

async fn wait_role(runtime: &Kv, role: Role) {
    let what = format!("{} is {role}", runtime.config().holder);
    wait_until(&what, PATIENCE, || async { runtime.status().role == role }).await;
}

/// Waits until `follower` holds exactly `leader`'s applied state.
async fn wait_same_state(follower: &Kv, leader: &Kv) {
    let what = format!(
        "{} holds {}'s state",
        follower.config().holder,
        leader.config().holder
    );
    wait_until(&what, PATIENCE, || async {
        state_of(follower) == state_of(leader)
    })
    .await;
}

fn assert_not_primary(
    outcome: Result<Written<Applied>, WriteError<Applied>>,
    role: Role,
    primary: &str,
) {
    match outcome {
        Err(WriteError::Unavailable(Unavailable::NotPrimary {
            role: found,
            primary: Some(named),
        })) => {
            assert_eq!(found, role);
            assert_eq!(named.as_str(), primary, "the refusal names the primary");
        }
        other => panic!("expected NotPrimary naming {primary}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_boots_on_empty_stores_installs_head_and_serves_writes_and_reads() {
    let db = Db::new().await;
    let node = db.node(1);
    let runtime = node.start(config("a", 1000));
    wait_primary(&runtime).await;

    let status = runtime.status();
    assert_eq!(status.role, Role::Primary);
    assert_eq!(status.applied_index, RecordIndex(0));
    assert_eq!(status.replayed_records, 0);
    assert_eq!(status.writer.as_ref().unwrap().next_index, RecordIndex(0));

    // The first boot installed HEAD: the empty state at index 0, stamped with
    // the lease this primary holds.
    let lease = db.lease().await;
    assert_eq!(lease.holder_id.as_str(), "a");
    assert!(!lease.released);
    let head = db.head().await.expect("the first boot installs HEAD");
    assert_eq!(head.wal_index, RecordIndex(0));
    assert_eq!(head.holder_id.as_str(), "a");
    assert_eq!(
        (head.term, head.lease_generation),
        (lease.term, lease.generation)
    );
    assert_eq!(db.head_state().await, KvState::default());

    // Writes are applied in index order and answered with their index.
    assert_eq!(put(&runtime, "a", "1").await, RecordIndex(0));
    assert_eq!(put(&runtime, "b", "2").await, RecordIndex(1));
    let cas = put_command("a", "3", Condition::ModRevision(2));
    let written = write(&runtime, &cas).await.unwrap();
    assert_eq!(
        (written.index, written.output),
        (RecordIndex(2), Applied::done(4))
    );

    let ((a, b, missing), applied) = read(&runtime, |state| {
        (value(state, "a"), value(state, "b"), value(state, "zz"))
    })
    .await;
    assert_eq!(a.as_deref(), Some("3"));
    assert_eq!(b.as_deref(), Some("2"));
    assert_eq!(missing, None);
    assert_eq!(applied, RecordIndex(3));
    let (version, _) = read(&runtime, |state| state.get(b"a").unwrap().mod_revision).await;
    assert_eq!(version, 4, "a key's version is the revision that set it");

    // Writes whose prepare refuses append nothing.
    let end_before = db.log_end().await;
    assert_eq!(end_before, RecordIndex(3));
    let next_before = runtime.status().writer.unwrap().next_index;
    let refused = [
        put_command("a", "create", Condition::Absent),
        put_command("a", "stale", Condition::ModRevision(2)),
    ];
    for command in &refused {
        match write(&runtime, command).await {
            Err(WriteError::Rejected(Applied::ConditionFailed { key, current })) => {
                assert_eq!(key, Bytes::from_static(b"a"));
                assert_eq!(current, Some(4));
            }
            other => panic!("expected a rejection, got {other:?}"),
        }
    }
    assert_eq!(db.log_end().await, end_before, "a refused write appended");
    let status = runtime.status();
    assert_eq!(status.writer.unwrap().next_index, next_before);
    assert_eq!(status.applied_index, RecordIndex(3));
    // The next write takes the very next index: nothing was skipped either.
    assert_eq!(put(&runtime, "c", "4").await, RecordIndex(3));
    assert_eq!(db.log_end().await, RecordIndex(4));
    let (current, _) = read(&runtime, KvState::clone).await;
    assert_eq!(state_of(&runtime), (current, RecordIndex(4)));

    runtime.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_publishes_a_final_snapshot_releases_the_lease_and_restart_replays_nothing()
 {
    let db = Db::new().await;
    let keys: Vec<String> = (0..10).map(|key| format!("key-{key:02}")).collect();
    // Snapshots only at shutdown: the final one is the only one that covers the writes.
    let runtime = db.node(1).start(config("a", 1000));
    wait_primary(&runtime).await;
    for key in &keys {
        put(&runtime, key, &format!("value of {key}")).await;
    }
    let (state, applied) = state_of(&runtime);
    assert_eq!(applied, RecordIndex(10));
    assert_eq!(db.head().await.unwrap().wal_index, RecordIndex(0));
    let generation = db.lease().await.generation;

    runtime.shutdown().await.unwrap();
    assert_eq!(runtime.status().role, Role::Stopped);
    assert_eq!(state_of(&runtime), (state.clone(), applied));

    let head = db.head().await.unwrap();
    assert_eq!(
        head.wal_index, applied,
        "the final snapshot is at the applied end"
    );
    assert_eq!(head.holder_id.as_str(), "a");
    assert_eq!(db.head_state().await, state);
    let lease = db.lease().await;
    assert!(lease.released, "shutdown releases the lease: {lease:?}");
    assert_eq!(lease.holder_id.as_str(), "a");
    assert_eq!(
        db.cluster.manifest().await.trunc,
        applied,
        "the log is truncated below the final snapshot"
    );

    // A restart (same holder, fresh process) restores the final snapshot and
    // has nothing left to replay.
    let restarted = db.node(2).start(config("a", 1000));
    wait_primary(&restarted).await;
    let status = restarted.status();
    assert_eq!(status.replayed_records, 0, "{status:?}");
    assert_eq!(status.applied_index, applied);
    assert_eq!(status.last_snapshot_index, Some(applied));
    assert!(db.lease().await.generation > generation);
    let (restored, at) = read(&restarted, KvState::clone).await;
    assert_eq!((restored, at), (state, applied));
    let (values, _) = read(&restarted, |state| {
        keys.iter().map(|key| value(state, key)).collect::<Vec<_>>()
    })
    .await;
    for (key, found) in keys.iter().zip(values) {
        assert_eq!(found, Some(format!("value of {key}")), "{key}");
    }
    assert_eq!(put(&restarted, "after", "restart").await, applied);
    restarted.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_reads_of_the_snapshot_during_a_boot_are_retried_not_fatal() {
    let db = Db::new().await;
    let runtime = db.node(1).start(config("a", 1000));
    wait_primary(&runtime).await;
    for key in 0..5 {
        put(&runtime, &format!("key-{key}"), "value").await;
    }
    runtime.shutdown().await.unwrap();
    let (state, applied) = state_of(&runtime);
    let head = db.head().await.unwrap();
    assert_eq!(head.wal_index, applied);

    // The next boot reads the payload corrupted three times in a row (a bit
    // flipped in transit): each attempt fails its checksum and is retried.
    let node = db.node(2);
    node.meta_faults.add(
        FaultRule::new(Fault::Corrupt)
            .keys(KeyMatch::Exact(head.snapshot_key()))
            .times(3),
    );
    let restarted = node.start(config("a", 1000));
    wait_primary(&restarted).await;
    assert_eq!(node.meta_faults.injected(), 3);
    let status = restarted.status();
    assert_eq!(status.replayed_records, 0, "{status:?}");
    assert_eq!(state_of(&restarted), (state, applied));
    restarted.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_primary_is_replaced_once_its_lease_expires_and_every_acked_write_survives() {
    let db = Db::new().await;
    let first_node = db.node(1);
    let first = first_node.start(config("a", 1000));
    wait_primary(&first).await;
    let mut acked = Vec::new();
    for sequence in 0..6 {
        let key = format!("first-{sequence}");
        put(&first, &key, "acked by a").await;
        acked.push((key, "acked by a"));
    }

    // The crash: from now on nothing of "a" reaches any store.
    first_node.isolate();
    let last_seen = db.lease().await;
    assert_eq!(last_seen.holder_id.as_str(), "a");

    let second = db.node(2).start(config("b", 1000));
    // The second process stands by while the lease is live, then takes over.
    // At no moment do both believe they may write.
    let deadline = Instant::now() + PATIENCE;
    while !second.is_primary_and_sure() {
        assert!(
            !first.is_primary_and_sure() || !second.is_primary_and_sure(),
            "two primaries sure of the lease at once"
        );
        assert!(
            Instant::now() < deadline,
            "b did not take over: {:?}",
            second.status()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        !first.is_primary_and_sure(),
        "the crashed primary still serves"
    );
    let taken = db.lease().await;
    assert_eq!(taken.holder_id.as_str(), "b");
    assert!(
        taken.acquired_at_ms >= last_seen.expires_at_ms,
        "taken over at {} before the lease expired at {}",
        taken.acquired_at_ms,
        last_seen.expires_at_ms
    );
    assert!(taken.generation > last_seen.generation);

    // Every write acked by the crashed primary is served by its successor.
    let (values, applied) = read(&second, |state| {
        acked
            .iter()
            .map(|(key, _)| value(state, key))
            .collect::<Vec<_>>()
    })
    .await;
    assert_eq!(applied, RecordIndex(6));
    for ((key, expected), found) in acked.iter().zip(values) {
        assert_eq!(found.as_deref(), Some(*expected), "{key}");
    }
    for sequence in 0..4 {
        let key = format!("second-{sequence}");
        put(&second, &key, "acked by b").await;
        acked.push((key, "acked by b"));
    }

    // The old primary comes back: it finds its lease taken, steps down to a
    // standby and converges on the successor's state.
    first_node.heal();
    wait_role(&first, Role::Standby).await;
    wait_same_state(&first, &second).await;
    let (state, applied) = state_of(&first);
    assert_eq!(applied, RecordIndex(10));
    for (key, expected) in &acked {
        assert_eq!(value(&state, key).as_deref(), Some(*expected), "{key}");
    }
    assert_not_primary(
        write(&first, &put_command("late", "a", Condition::None)).await,
        Role::Standby,
        "b",
    );

    first.shutdown().await.unwrap();
    second.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_tails_the_primary_refuses_writes_and_takes_over_warm_after_shutdown() {
    let db = Db::new().await;
    // No snapshot before the primary's shutdown: HEAD stays at 0, so the
    // standby builds its state from the log alone.
    let primary = db.node(1).start(config("a", 1000));
    wait_primary(&primary).await;
    for sequence in 0..3 {
        put(&primary, &format!("early-{sequence}"), "v").await;
    }

    let standby = db.node(2).start(config("b", 1000));
    wait_role(&standby, Role::Standby).await;
    assert_not_primary(
        write(&standby, &put_command("x", "y", Condition::None)).await,
        Role::Standby,
        "a",
    );
    match standby.read(|state| state.len()) {
        Err(Unavailable::NotPrimary { role, primary }) => {
            assert_eq!(role, Role::Standby);
            assert_eq!(primary.as_ref().map(HolderId::as_str), Some("a"));
        }
        other => panic!("a standby served a current read: {other:?}"),
    }
    assert!(!standby.is_primary_and_sure());
    assert!(standby.status().writer.is_none());

    // Its stale reads catch up with the primary's writes.
    wait_same_state(&standby, &primary).await;
    for sequence in 0..5 {
        put(&primary, &format!("late-{sequence}"), "w").await;
    }
    wait_same_state(&standby, &primary).await;
    let (state, applied) = state_of(&primary);
    assert_eq!(applied, RecordIndex(8));
    wait_until("the standby reports caught up", PATIENCE, || async {
        standby.status().caught_up
    })
    .await;
    assert_eq!(db.head().await.unwrap().wal_index, RecordIndex(0));

    // The primary shuts down and releases the lease; the standby takes over
    // from the state it holds.
    primary.shutdown().await.unwrap();
    assert!(db.lease().await.released);
    assert_eq!(db.head().await.unwrap().wal_index, applied);
    wait_primary(&standby).await;
    let status = standby.status();
    assert_eq!(status.replayed_records, 0, "{status:?}");
    assert_eq!(status.applied_index, applied);
    assert_eq!(
        status.lease.as_ref().map(|lease| lease.holder_id.as_str()),
        Some("b")
    );
    // Warm: the records it applied while standing by are still its history,
    // which a restore from the snapshot would have dropped.
    let history = standby
        .changes_since(RecordIndex(0), usize::MAX)
        .expect("the standby kept the history it tailed");
    assert_eq!(history.len() as u64, applied.0);
    let (current, _) = read(&standby, KvState::clone).await;
    assert_eq!(current, state);

    assert_eq!(put(&standby, "after", "takeover").await, applied);
    assert_eq!(db.lease().await.holder_id.as_str(), "b");
    standby.shutdown().await.unwrap();
}

/// A publication that fails at once is retried after a pause that
/// doubles, not as fast as the store answers; once the store is healthy
/// again, the snapshot is published. Found by the simulator (seed 884):
/// a HEAD write that landed but reported failure makes every later attempt
/// conflict and read HEAD back, and while those reads come back damaged
/// each attempt failed at once; the busy retry stopped its virtual clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_that_fails_at_once_is_retried_after_a_pause() {
    let db = Db::new().await;
    let node = db.node(1);
    let primary = node.start(config("a", 1));
    wait_primary(&primary).await;
    let published = db.head().await.expect("the boot's HEAD").wal_index;
    let head_key = || KeyMatch::Exact("runtime-test/HEAD.json".to_owned());
    let lost_answer = node.meta_faults.add(
        FaultRule::new(Fault::FailAfter)
            .ops(OpSet::of(&[Op::Update]))
            .keys(head_key())
            .times(1),
    );
    let damaged = node.meta_faults.add(
        FaultRule::new(Fault::Corrupt)
            .ops(OpSet::of(&[Op::Get]))
            .keys(head_key()),
    );
    put(&primary, "k", "v").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Pauses of 50, 100, 200, 400, 800 ms: a handful of attempts, each
    // reading HEAD once, where a busy retry makes thousands.
    let injected = node.meta_faults.injected();
    assert!((2..=20).contains(&injected), "{injected} faults in 1.5 s");
    node.meta_faults.remove(lost_answer);
    node.meta_faults.remove(damaged);
    wait_until("a snapshot past the damage", PATIENCE, || async {
        db.head()
            .await
            .is_some_and(|head| head.wal_index > published)
    })
    .await;
    primary.shutdown().await.unwrap();
}

/// A standby that would not read the log again for an hour.
fn sleepy_standby(holder_id: &str) -> RuntimeConfig {
    let hour = Duration::from_secs(3600);
    RuntimeConfig {
        standby_poll_interval: hour,
        lease_check_interval: hour,
        ..config(holder_id, 1000)
    }
}

/// A primary "a" with one put, and a standby "b" started with
/// `standby_config` that has caught up with it.
async fn primary_and_caught_up_standby(db: &Db, standby_config: RuntimeConfig) -> (Kv, Kv) {
    let primary = db.node(1).start(config("a", 1000));
    wait_primary(&primary).await;
    put(&primary, "early", "v").await;
    let standby = db.node(2).start(standby_config);
    wait_role(&standby, Role::Standby).await;
    wait_same_state(&standby, &primary).await;
    (primary, standby)
}

/// A record no correct node ever hands over: a put the log never held.
fn forged_record() -> Bytes {
    put_command("forged", "x", Condition::None)
        .encode()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_applies_committed_records_handed_over_without_waiting_for_the_log() {
    let db = Db::new().await;
    let (primary, standby) = primary_and_caught_up_standby(&db, sleepy_standby("b")).await;
    let (_, caught_up) = state_of(&standby);

    // Written now, while the standby polls the log only hourly.
    for sequence in 0..3 {
        put(&primary, &format!("late-{sequence}"), "w").await;
    }
    let records = primary.committed_records(caught_up, usize::MAX, usize::MAX);
    assert_eq!(records.len(), 3);
    assert_eq!(records[0].0, caught_up, "held in the history");
    // Ahead of the standby's state: held, not applied.
    standby.offer_committed(records[1..].to_vec());
    assert_eq!(state_of(&standby).1, caught_up);
    // The next record, with the rest again: all applied, in order, once.
    standby.offer_committed(records.clone());
    assert_eq!(state_of(&standby), state_of(&primary));
    standby.offer_committed(records);
    assert_eq!(state_of(&standby), state_of(&primary));

    // A primary takes nothing handed over, not even a record at its end.
    let (before, end) = state_of(&primary);
    primary.offer_committed([(end, forged_record())]);
    assert_eq!(state_of(&primary), (before, end));

    standby.shutdown().await.unwrap();
    primary.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_handed_a_record_the_log_does_not_hold_stops_when_it_reads_the_log() {
    let db = Db::new().await;
    let (primary, standby) = primary_and_caught_up_standby(&db, config("b", 1000)).await;

    // A forged record at the standby's next index: applied, as only the
    // replicas can tell.
    let (_, end) = state_of(&standby);
    standby.offer_committed([(end, forged_record())]);
    let (state, _) = state_of(&standby);
    assert!(state.get(b"forged").is_some());

    // The log's record at that index differs: the standby stops on it.
    assert_eq!(put(&primary, "real", "v").await, end);
    let error = tokio::time::timeout(PATIENCE, standby.finished())
        .await
        .expect("the standby stops")
        .expect_err("on an error");
    let message = error.to_string();
    assert!(
        message.contains(&format!("committed record at index {end} differs")),
        "{message}"
    );
    assert_eq!(standby.status().role, Role::Stopped);
    primary.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_standby_restores_the_newest_snapshot_after_the_log_was_truncated_under_it() {
    let db = Db::new().await;
    // Small segments, so the truncation deletes sealed segments, and a
    // snapshot every few records.
    let small_segments = |holder_id| RuntimeConfig {
        log: LogConfig {
            max_segment_bytes: 256,
            ..test_config()
        },
        ..config(holder_id, 4)
    };
    let primary = db.node(1).start(small_segments("a"));
    wait_primary(&primary).await;
    for sequence in 0..3 {
        put(&primary, &format!("key-{sequence}"), "first").await;
    }
    let standby_node = db.node(2);
    let standby = standby_node.start(small_segments("b"));
    wait_role(&standby, Role::Standby).await;
    wait_same_state(&standby, &primary).await;
    let lagging_at = state_of(&standby).1;
    assert_eq!(lagging_at, RecordIndex(3));

    // The standby loses its log; the primary goes on, snapshots and truncates.
    standby_node.log_faults.set_outage(true);
    for sequence in 0..24u64 {
        let key = format!("key-{}", sequence % 7);
        put(&primary, &key, &format!("second-{sequence}")).await;
        if sequence % 5 == 4 {
            let written = write(&primary, &delete_command(&format!("key-{}", sequence % 3)))
                .await
                .unwrap();
            assert!(matches!(written.output, Applied::Done { .. }));
        }
    }
    wait_until(
        "the log is truncated past the standby",
        PATIENCE,
        || async { db.cluster.manifest().await.trunc > lagging_at },
    )
    .await;
    let mut reader = Reader::new(&db.cluster.stores, lagging_at);
    match reader.try_next().await {
        Err(LogError::Truncated { requested, floor }) => {
            assert_eq!(requested, lagging_at);
            assert!(floor > lagging_at);
        }
        other => panic!("the standby's next record should be truncated: {other:?}"),
    }
    assert_eq!(state_of(&standby).1, lagging_at, "the standby was cut off");
    assert_eq!(standby.status().role, Role::Standby);

    // Healed, it cannot tail from where it was: it restores the newest
    // snapshot, tails from there, and ends with the primary's state.
    standby_node.heal();
    wait_same_state(&standby, &primary).await;
    let status = standby.status();
    assert_eq!(status.role, Role::Standby);
    let restored_at = status
        .last_snapshot_index
        .expect("the standby restored a snapshot");
    assert!(restored_at > lagging_at, "{status:?}");
    assert!(
        standby.changes_since(lagging_at, usize::MAX).is_err(),
        "the records below the snapshot were never applied here"
    );

    // And it keeps tailing after the restore.
    for sequence in 0..3 {
        put(&primary, &format!("third-{sequence}"), "after heal").await;
    }
    wait_same_state(&standby, &primary).await;
    let (state, applied) = state_of(&standby);
    assert_eq!(value(&state, "third-2").as_deref(), Some("after heal"));
    assert_eq!(applied, state_of(&primary).1);

    standby.shutdown().await.unwrap();
    primary.shutdown().await.unwrap();
}

/// How long the primary takes to notice a snapshot is due, at most (its
/// check interval is 500 ms), with room to spare.
const SNAPSHOT_CHECKS: Duration = Duration::from_millis(1300);

/// With `snapshot_min_log_percent`, a snapshot due by record count waits
/// until the log since the last snapshot holds that share of its bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_snapshot_waits_until_the_log_since_holds_as_many_bytes() {
    let db = Db::new().await;
    let sized = RuntimeConfig {
        snapshot_min_log_percent: 100,
        ..config("a", 2)
    };
    let primary = db.node(1).start(sized);
    wait_primary(&primary).await;
    // Two records, 10 KB of log against the first boot's empty snapshot:
    // due, and the snapshot holds the large value.
    put(&primary, "large", &"x".repeat(10_000)).await;
    let first = RecordIndex(put(&primary, "small-0", "v").await.0 + 1);
    let snapshot_at = |runtime: &Kv| runtime.status().last_snapshot_index;
    wait_until("the first snapshot", PATIENCE, || async {
        snapshot_at(&primary) == Some(first)
    })
    .await;
    let snapshot_bytes = db.head().await.unwrap().payload_size_bytes;
    assert!(
        (10_000..16_000).contains(&snapshot_bytes),
        "{snapshot_bytes}"
    );

    // Enough records, fewer bytes than the snapshot: not due. (An absence,
    // so this waits out a fixed window of snapshot checks.)
    for sequence in 1..=10 {
        put(&primary, &format!("small-{sequence}"), "v").await;
    }
    put(&primary, "large-2", &"y".repeat(8_000)).await;
    tokio::time::sleep(SNAPSHOT_CHECKS).await;
    assert_eq!(snapshot_at(&primary), Some(first));

    // More bytes than the snapshot: due.
    let end = RecordIndex(put(&primary, "large-3", &"z".repeat(8_000)).await.0 + 1);
    wait_until("the second snapshot", PATIENCE, || async {
        snapshot_at(&primary) == Some(end)
    })
    .await;
    primary.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_takeover_does_not_republish_the_snapshot_head_already_names() {
    let db = Db::new().await;
    let primary = db.node(1).start(config("a", 4));
    wait_primary(&primary).await;
    let standby = db.node(2).start(config("b", 4));
    wait_role(&standby, Role::Standby).await;
    for sequence in 0..6 {
        put(&primary, &format!("key-{sequence}"), "v").await;
    }
    wait_same_state(&standby, &primary).await;
    let applied = state_of(&primary).1;
    primary.shutdown().await.unwrap();
    assert_eq!(db.head().await.unwrap().wal_index, applied);

    wait_primary(&standby).await;
    assert_eq!(standby.status().applied_index, applied);
    let adopted = db.head().await.unwrap();
    assert_eq!(adopted.holder_id.as_str(), "b");
    assert_eq!(adopted.wal_index, applied);
    let payloads = db.snapshots().list().await.unwrap().len();
    // No record was applied since the snapshot HEAD names, so no snapshot is
    // due. (An absence, so this waits out a fixed window of snapshot checks.)
    tokio::time::sleep(SNAPSHOT_CHECKS).await;
    let head = db.head().await.unwrap();
    assert_eq!(
        (head.snapshot, head.wal_index),
        (adopted.snapshot, adopted.wal_index),
        "the new primary uploaded another snapshot of the state HEAD already holds; \
         status: {:?}",
        standby.status()
    );
    assert_eq!(db.snapshots().list().await.unwrap().len(), payloads);
    assert_eq!(standby.status().last_snapshot_index, Some(applied));
    standby.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_that_booted_before_the_first_head_takes_over_warm() {
    let db = Db::new().await;
    let primary_node = db.node(1);
    // "a" holds the lease and its first boot has not installed HEAD yet.
    let incarnation = Incarnation::random();
    let booting = primary_node
        .stores
        .leases
        .acquire(
            &Contender::with_incarnation(holder("a"), incarnation),
            chorus::lease::Term::FIRST,
        )
        .await
        .unwrap();
    let standby = db.node(2).start(config("b", 1000));
    wait_role(&standby, Role::Standby).await;
    assert!(db.head().await.is_none());

    // "a" boots (the same process, over its own lease) and serves; the
    // standby tails its log from the empty state.
    let primary = primary_node.start(RuntimeConfig {
        incarnation: Some(incarnation),
        ..config("a", 1000)
    });
    wait_primary(&primary).await;
    drop(booting);
    for sequence in 0..6 {
        put(&primary, &format!("key-{sequence}"), "v").await;
    }
    wait_same_state(&standby, &primary).await;
    let (state, applied) = state_of(&primary);
    assert_eq!(applied, RecordIndex(6));
    assert_eq!(
        standby
            .changes_since(RecordIndex(0), usize::MAX)
            .unwrap()
            .len(),
        6
    );

    primary.shutdown().await.unwrap();
    wait_primary(&standby).await;
    assert_eq!(state_of(&standby), (state, applied));
    // Its state reflected every record HEAD's snapshot does: a warm standby
    // keeps it, as one that booted after HEAD does.
    let history = standby.changes_since(RecordIndex(0), usize::MAX);
    assert!(
        history.as_ref().is_ok_and(|changes| changes.len() == 6),
        "the standby threw its tailed state away and restored the snapshot: {:?}; status: {:?}",
        history.map(|changes| changes.len()),
        standby.status()
    );
    standby.shutdown().await.unwrap();
}

/// Regression: a second process under the holder id of a live primary took
/// its lease at once (the same holder id counted as "own"), and the first
/// kept answering current reads with what the second had overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_the_same_holder_id_stands_by_until_the_first_releases() {
    let db = Db::new().await;
    let first = db.node(1).start(config("shared-host", 1000));
    wait_primary(&first).await;
    put(&first, "k", "one").await;
    let first_incarnation = first.status().incarnation;

    let second = db.node(2).start(config("shared-host", 1000));
    wait_role(&second, Role::Standby).await;
    assert_ne!(second.status().incarnation, first_incarnation);
    assert_not_primary(
        write(&second, &put_command("k", "two", Condition::None)).await,
        Role::Standby,
        "shared-host",
    );
    // Several lease lifetimes later the first still holds it, unchanged.
    let generation = db.lease().await.generation;
    tokio::time::sleep(TTL * 2).await;
    assert!(first.is_primary_and_sure(), "{:?}", first.status());
    assert_eq!(second.status().role, Role::Standby);
    let lease = db.lease().await;
    assert_eq!(lease.incarnation, Some(first_incarnation));
    assert_eq!(lease.generation, generation, "the lease changed hands");
    let (value, _) = read(&first, |state| state.get(b"k").cloned()).await;
    assert_eq!(value.unwrap().value, Bytes::from_static(b"one"));

    first.shutdown().await.unwrap();
    wait_primary(&second).await;
    assert_eq!(
        db.lease().await.incarnation,
        Some(second.status().incarnation)
    );
    put(&second, "k", "two").await;
    second.shutdown().await.unwrap();
}

/// `force` takes a live lease over on the first boot only: a later reboot
/// of the same runtime (here after its lease was taken over in turn) waits
/// like any contender instead of fencing the new holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_takes_a_live_lease_over_on_the_first_boot_only() {
    let db = Db::new().await;
    let first = db.node(1).start(config("a", 1000));
    wait_primary(&first).await;
    let forced = db.node(2).start(RuntimeConfig {
        force: true,
        ..config("b", 1000)
    });
    wait_primary(&forced).await;
    let taken = db.lease().await;
    assert_eq!(taken.holder_id.as_str(), "b");
    assert_eq!(taken.term.0, 2, "a take-over bumps the term");
    // "a" finds its lease gone and stands by; then "a" is forced back in by a
    // third process, and "b", which lost the lease, must not force again.
    wait_role(&first, Role::Standby).await;
    first.shutdown().await.unwrap();
    let third = db.node(3).start(RuntimeConfig {
        force: true,
        ..config("c", 1000)
    });
    wait_primary(&third).await;
    wait_role(&forced, Role::Standby).await;
    tokio::time::sleep(TTL).await;
    assert_eq!(forced.status().role, Role::Standby, "{:?}", forced.status());
    let lease = db.lease().await;
    assert_eq!((lease.holder_id.as_str(), lease.term.0), ("c", 3));
    third.shutdown().await.unwrap();
    wait_primary(&forced).await;
    forced.shutdown().await.unwrap();
}

/// Regression: a writer that stopped from the background while nothing was
/// in flight (here its fold CAS is fenced by another recovery of the log,
/// as when an operator runs `chorus log append` on the live log) left the
/// primary serving 503 "writer stopped" forever, with its lease refreshed
/// and no standby let in. The runtime now notices the stop and reboots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_stopped_in_the_background_while_idle_is_recovered_again() {
    let db = Db::new().await;
    let node = db.node(1);
    let small_segments = LogConfig {
        max_segment_bytes: 32 * 1024,
        ..test_config()
    };
    let primary = node.start(RuntimeConfig {
        log: small_segments,
        ..config("a", 1000)
    });
    wait_primary(&primary).await;
    let epoch = primary.status().epoch.expect("a primary recovered the log");
    // Its seals take a while, so the other recovery lands before the fold.
    node.log_faults.add(
        FaultRule::new(Fault::Delay(Duration::from_millis(1500)))
            .ops(OpSet::of(&[Op::Create]))
            .keys(KeyMatch::Prefix("sealed/".into())),
    );
    let value = "v".repeat(4096);
    for sequence in 0..12 {
        put(&primary, &format!("key-{sequence}"), &value).await;
    }
    let other = chorus::log::Recovery::run(db.cluster.stores.clone(), test_config())
        .await
        .expect("another recovery of the log");
    let other_epoch = other.epoch();
    assert!(other_epoch > epoch);
    drop(other);
    node.log_faults.clear();

    // Nothing is written meanwhile: only the background fold finds the fence.
    wait_until("the primary recovered the log again", PATIENCE, || async {
        primary.status().epoch.is_some_and(|now| now > other_epoch)
    })
    .await;
    wait_primary(&primary).await;
    put(&primary, "after", "reboot").await;
    let (state, _) = state_of(&primary);
    assert_eq!(state.len(), 13);
    primary.shutdown().await.unwrap();
}

/// Regression: a publication ran inline in the serve loop, so while its
/// upload lasted (up to minutes) a lost lease, a stopped writer or a
/// shutdown was not acted on. Here the lease is taken over while a payload
/// upload is stalled: the primary steps down long before the upload ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_during_a_long_publication_is_acted_on_at_once() {
    const STALL: Duration = Duration::from_secs(4);
    let db = Db::new().await;
    let node = db.node(1);
    let primary = node.start(config("a", 3));
    wait_primary(&primary).await;
    node.meta_faults.add(
        FaultRule::new(Fault::Delay(STALL))
            .ops(OpSet::of(&[Op::Create]))
            .keys(KeyMatch::Prefix(format!("{}/snapshots/", database()))),
    );
    for sequence in 0..3 {
        put(&primary, &format!("key-{sequence}"), "v").await;
    }
    // The snapshot check runs every 500 ms: by now the upload has started.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let taken = Instant::now();
    let other = db.node(2);
    let _taker = other
        .stores
        .leases
        .take_over(&Contender::new(holder("b")))
        .await
        .unwrap();
    wait_until("the primary stepped down", STALL / 2, || async {
        primary.status().role != Role::Primary
    })
    .await;
    assert!(taken.elapsed() < STALL, "{:?}", taken.elapsed());
    node.meta_faults.clear();
    primary.abort();
}

/// Regression: a graceful shutdown awaited a snapshot upload in flight (up
/// to the payload timeout, minutes in production) and then published a
/// final snapshot before it released the lease, so a standby waited behind a
/// stalled snapshot store. Now the upload is abandoned and the lease
/// released within the drain bound; the next primary serves every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_abandons_a_stalled_snapshot_upload_and_releases_the_lease() {
    const STALL: Duration = Duration::from_secs(30);
    let db = Db::new().await;
    let patient_uploads = SnapshotConfig {
        payload_call_timeout: STALL * 2,
        ..snapshot_config()
    };
    let node = db.node_with_snapshots(1, patient_uploads);
    let primary = node.start(config("a", 3));
    wait_primary(&primary).await;
    node.meta_faults.add(
        FaultRule::new(Fault::Delay(STALL))
            .ops(OpSet::of(&[Op::Create]))
            .keys(KeyMatch::Prefix(format!("{}/snapshots/", database()))),
    );
    let uploads = node.meta_faults.calls(Op::Create);
    for sequence in 0..3 {
        put(&primary, &format!("key-{sequence}"), "v").await;
    }
    wait_until("a snapshot upload started", PATIENCE, || async {
        node.meta_faults.calls(Op::Create) > uploads
    })
    .await;
    let stopping = Instant::now();
    tokio::time::timeout(PATIENCE, primary.shutdown())
        .await
        .expect("the shutdown does not wait for the stalled upload")
        .unwrap();
    assert!(stopping.elapsed() < STALL, "{:?}", stopping.elapsed());
    let lease = db.lease().await;
    assert!(lease.released, "shutdown releases the lease: {lease:?}");

    let next = db.node(2).start(config("b", 1000));
    wait_primary(&next).await;
    let (values, _) = read(&next, |state| value(state, "key-2")).await;
    assert_eq!(values.as_deref(), Some("v"));
    put(&next, "after", "takeover").await;
    next.shutdown().await.unwrap();
}

/// Regression: a boot that failed after acquiring the lease kept it (and
/// re-acquired it on every retry), holding a healthy standby out. Now a
/// failed boot releases the lease before it backs off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_that_fails_after_acquiring_releases_the_lease_for_a_healthy_standby() {
    let db = Db::new().await;
    let broken = db.node(1);
    // Its log is unreachable: every boot fails at the log recovery, after
    // the lease and HEAD steps succeeded.
    broken.log_faults.set_outage(true);
    let failing = broken.start(config("a", 1000));
    // The recovery retries the outage for a few seconds before it fails.
    let patience = PATIENCE * 3;
    wait_until("the failing boot released the lease", patience, || async {
        let leases = &db.node(9).stores.leases;
        leases
            .read()
            .await
            .ok()
            .flatten()
            .is_some_and(|lease| lease.holder_id.as_str() == "a" && lease.released)
    })
    .await;
    let healthy = db.node(2).start(config("b", 1000));
    wait_primary(&healthy).await;
    put(&healthy, "k", "v").await;
    assert_eq!(db.lease().await.holder_id.as_str(), "b");
    healthy.shutdown().await.unwrap();
    failing.abort();
}

/// Regression: a standby whose newest snapshot lies below the truncation
/// floor (the log truncated by hand past HEAD) downloaded that snapshot
/// again in a tight loop. Now it says why it cannot catch up and backs off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_below_the_floor_with_no_newer_snapshot_backs_off() {
    let db = Db::new().await;
    let primary = db.node(1).start(config("a", 1000));
    wait_primary(&primary).await;
    for sequence in 0..10 {
        put(&primary, &format!("key-{sequence}"), "v").await;
    }
    assert_eq!(db.head().await.unwrap().wal_index, RecordIndex(0));
    let maintenance = chorus::log::maintenance::Maintenance::new(&db.cluster.stores);
    let progress = chorus::log::maintenance::NoProgress;
    maintenance
        .truncate_before(RecordIndex(8), RecordIndex(10), &progress)
        .await
        .unwrap();

    let node = db.node(2);
    let standby = node.start(config("b", 1000));
    wait_role(&standby, Role::Standby).await;
    let gets = node.meta_faults.calls(Op::Get);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let downloads = node.meta_faults.calls(Op::Get) - gets;
    assert!(
        downloads < 20,
        "{downloads} reads of HEAD and its payload in 2 s"
    );
    let status = standby.status();
    let error = status.last_error.clone().unwrap_or_default();
    assert!(error.contains("cannot catch up"), "{status:?}");
    standby.abort();
    primary.shutdown().await.unwrap();
}

/// `Runtime::log_view` serves status pages from a cache: fifty calls in a
/// burst cost at most one refresh (a register read and a listing per
/// replica) beyond the first, and the view names every replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_pages_read_a_cached_log_view() {
    let db = Db::new().await;
    let node = db.node(1);
    let primary = node.start(config("a", 1000));
    wait_primary(&primary).await;
    put(&primary, "k", "v").await;
    let first = primary.log_view().await;
    let view = first.view.expect("the stores answer");
    assert_eq!(view.replicas.len(), 3);
    assert!(view.replicas.iter().all(|r| r.tail_fragments.is_ok()));
    assert_eq!(view.quorum, 2);
    let listings = node.log_faults.calls(Op::List);
    for _ in 0..50 {
        let observed = primary.log_view().await;
        assert!(observed.view.is_ok());
    }
    let spent = node.log_faults.calls(Op::List) - listings;
    assert!(spent <= 3, "{spent} replica listings for 50 status calls");
    let floor = primary.log_floor().await.unwrap();
    assert_eq!(floor, RecordIndex(0));
    primary.shutdown().await.unwrap();
}

/// Regression: a first status call whose future was dropped mid-refresh (a
/// client that hung up during a slow replica listing) left the view cache
/// empty; a second first call queued behind it then panicked on the empty
/// cache while holding the cache's lock, and every later status call
/// panicked on the poisoned lock. A refresh is now a task of its own that
/// neither caller can cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_first_status_call_leaves_status_answering() {
    /// How long each replica listing takes: a slow replica.
    const SLOW_LISTING: Duration = Duration::from_millis(800);
    let db = Db::new().await;
    let node = db.node(1);
    let primary = Arc::new(node.start(config("a", 1000)));
    wait_primary(&primary).await;
    let slow = node
        .log_faults
        .add(FaultRule::new(Fault::Delay(SLOW_LISTING)).ops(OpSet::of(&[Op::List])));
    let status_call = |primary: &Arc<Kv>| {
        let primary = Arc::clone(primary);
        tokio::spawn(async move { primary.log_view().await })
    };
    let cancelled = status_call(&primary);
    tokio::time::sleep(SLOW_LISTING / 4).await;
    let waiting = status_call(&primary);
    tokio::time::sleep(SLOW_LISTING / 4).await;
    cancelled.abort();
    let observed = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the waiting status call answers")
        .expect("the waiting status call does not panic");
    let view = observed.view.expect("the stores answer, slowly");
    assert!(view.replicas.iter().all(|r| r.tail_fragments.is_ok()));
    node.log_faults.remove(slow);
    tokio::time::sleep(LOG_VIEW_MAX_AGE).await;
    for _ in 0..3 {
        let later = tokio::time::timeout(PATIENCE, status_call(&primary))
            .await
            .expect("a later status call answers")
            .expect("a later status call does not panic");
        assert!(later.view.is_ok(), "{later:?}");
    }
    primary.shutdown().await.unwrap();
}

/// Regression: the status's lease was the document as acquired, so on a
/// healthy primary its expiry lay in the past after one ttl (status pages
/// showed `expires_in_ms: 0` beside seconds of `lease_remaining_ms`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_lease_follows_the_refreshes() {
    let db = Db::new().await;
    let primary = db.node(1).start(config("a", 1000));
    wait_primary(&primary).await;
    let acquired = primary.status().lease.expect("a primary has a lease");
    tokio::time::sleep(TTL * 2).await;
    wait_primary(&primary).await;
    let refreshed = primary.status().lease.expect("a primary has a lease");
    assert_eq!(refreshed.generation, acquired.generation);
    assert!(
        refreshed.expires_at_ms > acquired.expires_at_ms,
        "{refreshed:?} vs {acquired:?}"
    );
    primary.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_whose_state_disagrees_with_its_head_wal_index_is_refused() {
    let db = Db::new().await;
    let node = db.node(1);
    // A payload whose state reflects records 0 and 1, installed as HEAD at
    // wal_index 0: restoring it and replaying from 0 would apply them twice
    // (or, the other way round, skip records).
    let mut ahead = KvState::default();
    for (index, key) in ["a", "b"].into_iter().enumerate() {
        let record = put_command(key, "1", Condition::None).encode().unwrap();
        ahead.apply(RecordIndex(index as u64), &record);
    }
    let forger = node
        .stores
        .leases
        .acquire(
            &Contender::new(holder("forger")),
            chorus::lease::Term::FIRST,
        )
        .await
        .unwrap();
    let mut publication = node.stores.snapshots.publication();
    publication.observe_for_boot().await.unwrap();
    let initial = chorus::snapshot::NewSnapshot {
        bytes: ahead.encode_snapshot(),
        wal_index: RecordIndex(0),
    };
    publication.claim(&forger, Some(initial)).await.unwrap();
    forger.release().await.unwrap();

    let runtime = node.start(config("a", 1000));
    let outcome = tokio::time::timeout(PATIENCE, runtime.finished())
        .await
        .expect("the boot gives up rather than retry a snapshot that cannot be right");
    let error = outcome.expect_err("the snapshot is refused").to_string();
    assert!(
        error.contains("payload_applied_end=2 head_wal_index=0"),
        "{error}"
    );
    assert_eq!(runtime.status().role, Role::Stopped);
    assert_eq!(state_of(&runtime).1, RecordIndex(0));
}

/// How many checkpoints of a [`CountingMachine`] were taken in this test
/// binary (only `a_boot_that_finds_a_head_encodes_no_checkpoint` runs one).
static CHECKPOINTS_TAKEN: AtomicU64 = AtomicU64::new(0);

/// A state machine that counts its records and every checkpoint taken of it.
#[derive(Debug, Default)]
struct CountingMachine {
    records: u64,
}

/// A [`CountingMachine`]'s record count, as its snapshot payload.
struct RecordCount(u64);

impl Checkpoint for RecordCount {
    fn write_to(&self, sink: &mut dyn std::io::Write) -> std::io::Result<()> {
        sink.write_all(&self.0.to_le_bytes())
    }
}

impl StateMachine for CountingMachine {
    type Output = ();
    type Checkpoint = RecordCount;

    fn apply(&mut self, _index: RecordIndex, _record: &Bytes) {
        self.records += 1;
    }

    fn checkpoint(&self) -> RecordCount {
        CHECKPOINTS_TAKEN.fetch_add(1, Ordering::SeqCst);
        RecordCount(self.records)
    }

    fn restore(source: &mut dyn std::io::Read) -> Result<Self, RestoreError> {
        let mut count = [0; 8];
        source
            .read_exact(&mut count)
            .map_err(|e| RestoreError(e.to_string()))?;
        Ok(CountingMachine {
            records: u64::from_le_bytes(count),
        })
    }
}

/// Regression guard: every boot's claim used to encode the whole state as a
/// checkpoint (O(state) CPU and memory per takeover) although only a first
/// boot, which finds no HEAD, installs one. A boot that finds a HEAD, after
/// a graceful stop or a crash, takes no checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_that_finds_a_head_encodes_no_checkpoint() {
    let db = Db::new().await;
    let start = |node: &Node, holder_id: &str| {
        Runtime::<CountingMachine>::start(node.stores.clone(), config(holder_id, 1000))
            .expect("valid runtime config")
    };
    let first_node = db.node(1);
    let first = start(&first_node, "a");
    wait_primary(&first).await;
    assert!(db.head().await.is_some(), "the first boot installed HEAD");
    assert_eq!(
        CHECKPOINTS_TAKEN.load(Ordering::SeqCst),
        1,
        "a first boot installs its state as the first snapshot"
    );
    first.shutdown().await.unwrap();

    // A restart after a graceful stop.
    let before = CHECKPOINTS_TAKEN.load(Ordering::SeqCst);
    let second_node = db.node(2);
    let second = start(&second_node, "b");
    wait_primary(&second).await;
    assert_eq!(
        CHECKPOINTS_TAKEN.load(Ordering::SeqCst),
        before,
        "a boot that found HEAD encoded a checkpoint"
    );

    // A takeover after a crash: the lease expires, nothing is released.
    second_node.isolate();
    second.abort();
    let third_node = db.node(3);
    let third = start(&third_node, "c");
    wait_primary(&third).await;
    assert_eq!(
        CHECKPOINTS_TAKEN.load(Ordering::SeqCst),
        before,
        "a takeover that found HEAD encoded a checkpoint"
    );
    third.abort();
}
