//! The runtime phase of a run (docs/design/0003-runtime-and-service.md):
//! two or three `Runtime<KvState>` processes ("nodes") over one database —
//! log replicas and a register (a [`World`]) plus one store for the lease,
//! `HEAD.json` and snapshot payloads — each node with its own skewed
//! [`SimClock`] and its own fault controllers over the shared stores, as in
//! `crates/chorus/tests/runtime.rs`.
//!
//! The schedule: key-value writes through `Runtime::write` (puts of unique
//! keys with `Condition::Absent`, compare-and-set increments of one
//! counter key prepared with `KvState::check` against the applied state,
//! exactly-once puts stamped with an idempotency key, admitted against
//! the applied idempotency table as the service admits them and retried
//! with the same key: at once, as concurrent twins, and long after, from
//! any process, so retries meet tables restored from snapshots, and etcd
//! v3 writes — puts, range deletes, transactions with compares and nested
//! branches, compactions — on keys of their own, drawn against the applied
//! state and validated as the gRPC service validates them, `etcd.rs`, and
//! the requests of an etcd lease client: grants, puts naming a lease,
//! revokes; its keep-alives and every process's lease expiry tick run
//! after every step, `leases.rs`),
//! one process's applied records handed to another as a standby's Follow
//! stream hands them over (`Runtime::offer_committed`: from any process, a
//! deposed primary's too, behind or ahead of the receiver, in two parts),
//! crashes (`Runtime::abort`) and fresh processes (a new holder id, the
//! crashed one's: a restart, or the holder id of a process alive on another
//! node: two processes that share one, told apart only by the random
//! incarnation each writes into the lease), graceful shutdowns (`Runtime::shutdown`, of
//! primaries with writes in flight too), zombies (a node cut off
//! from its log, its lease store or both, for a while, then healed), store
//! faults on any view or on the shared stores, replica outages, clock skew
//! and sleeps. Snapshots (every few records) and the log truncation below
//! them are the runtime's own. The phase runs on a tokio runtime of its own
//! whose scheduler settings keep the runtime's blocking-pool work
//! deterministic (`executor::GatedRuntime`).
//!
//! Checkers, after every step (`check.rs`; R5 in `fencing.rs`, R10 in
//! `revisions.rs`, R11 and R12 in `mvcc.rs`, R13 in `etcd_model.rs`, R14 in
//! `leases.rs`):
//!
//! - **R1, agreement**: every record any process applied (its change history,
//!   polled every step, and for a few steps after it stopped) is the record every
//!   other process applied at that index and the record acknowledged there;
//!   a unique key is applied at one index only; a put whose write failed with
//!   `may_have_committed() == false` (or was refused before the log) is never
//!   applied.
//! - **R2, acknowledged writes**: an acknowledged put applied `Done`; two
//!   acknowledged increments never wrote the same counter value (a lost
//!   update); no two writes are acknowledged at one index; `prepare` never
//!   refuses a write it built from the applied state.
//! - **R3, exclusivity**: while every two clocks are within the safety
//!   margin, at most one process answers `Runtime::read` (a current read).
//! - **R4, current reads are current**: while the clocks agree, a process
//!   that answers a current read has applied every acknowledged index, its
//!   counter is at least every acknowledged increment, and (every 16 steps)
//!   its state holds every acknowledged put with its value and version (the
//!   index it was acknowledged at) and no put that did not commit.
//! - **R5, HEAD writes are fenced**: every write of `HEAD.json` that lands
//!   (seen by a layer under every fault injector, at the instant it lands)
//!   bumps the publication sequence, never lowers the lease token, and is
//!   stamped with the lease document's token at that instant — or, while the
//!   clocks agree, with a token that stopped being the live lease less than
//!   `head_call_timeout` earlier (a write sent while the lease vouched, still
//!   in flight when it expired).
//! - **R6, snapshots are prefixes**: each new HEAD's payload decodes, is
//!   taken at HEAD's `wal_index`, and holds exactly the acknowledged puts
//!   below it, every value set by the record applied at its version, and a
//!   counter at least every acknowledged increment below it.
//! - **R8, only a shutdown stops a runtime**: every fault passes, so a
//!   process whose boot step fails must retry, with no error however
//!   damaged a read was; `Runtime::finished` may only report a shutdown
//!   asked for.
//! - **R9, exactly-once**: no idempotency key's put applies twice: every
//!   process applies a keyed record either as the first application of its
//!   key or as a no-op that names that first index (`Applied::Duplicate`),
//!   and every answer to an attempt (acknowledged, or answered from the
//!   table without appending) names that index too; every state checked by
//!   R4 and R6 (snapshots included) remembers each key applied below its
//!   end at that index, with its put at that version.
//! - **R10, revisions**: every process is at the same store revision after
//!   each record, and a record moves it by exactly 1 when its output
//!   reports a change, by 0 otherwise.
//! - **R11, etcd answers agree**: every process answers an etcd record
//!   alike (the whole response: header revision, `prev_kv`s, `succeeded`,
//!   nested answers), the acknowledged answer is that one, and its header
//!   revision is the store revision after the record.
//! - **R12, replicas hold one history**: every state seen at one applied
//!   end (a process's, whenever its end moved, and each new HEAD's payload)
//!   has the same store and compaction revisions, retained history and key
//!   map (fingerprints over every change and every key's metadata), and its
//!   history keeps etcd's per-key rules (a put's `mod_revision`, `version`,
//!   `create_revision`; each change starting where the key's previous one
//!   ended) and ends in the map the state holds.
//! - **R13, etcd answers follow a model**: a model of the etcd keys written
//!   from etcd's rules apart from the machine replays every etcd record in
//!   index order and expects each answer (header revisions, `prev_kv`s,
//!   deleted counts, `succeeded`, the taken branch's answers, current-revision
//!   ranges in full), each `Compacted` refusal and the store revision after;
//!   leases too (grants, puts naming a missing lease refused, a revoke
//!   deleting exactly its attached keys at one revision).
//! - **R14, leases expire only when due**: while the clocks agree, no lease
//!   is handed out as expired, nor its revoke applied unless the client
//!   asked, before its TTL passed since its grant request or last
//!   acknowledged keep-alive (virtual time); no keep-alive is acknowledged
//!   after its lease's revoke applied; every state keeps keys and leases
//!   naming each other; no lessor of a process that is not a sure primary
//!   hands out an expiry.
//! - The lease phase's L2 and S1–S3 on the same store, and the log phases'
//!   register checkers (5, 6) on the runtime's register.
//!
//! Liveness (`liveness.rs`): every fault healed and every clock agreeing, a
//! process must become primary, every write must resolve, a new write must
//! be acknowledged, the primary's state must hold every acknowledged put and
//! a counter between the acknowledged and the acknowledged-or-ambiguous
//! increments (**R7**), and every other process must converge on its state.
//!
//! The workload is in `workload.rs`.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chorus::blob::FaultController;
use chorus::ids::RecordIndex;
use chorus::kv::lessor::Lessor;
use chorus::kv::{IdempotencyKey, KvState};
use chorus::lease::{DatabaseKey, HolderId, Incarnation};
use chorus::runtime::{Role, Runtime, RuntimeConfig, RuntimeStores};
use chorus::snapshot::{Head, SnapshotConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::actions::pick;
use crate::check::StoreChecker;
use crate::control::{ControlStore, ControlView, LeaseTiming, SimClock};
use crate::faults::{Expiring, RuleLabel, draw_register_rule, draw_store_rule};
use crate::lease::LeaseChecker;
use crate::model::Violation;
use crate::params::Params;
use crate::trace::Trace;
use crate::world::{ActorFaults, World};

use check::{KeyedOp, PutState};
use fencing::{Audit, Reign};
use workload::{WriteEnd, WriteKind, prepare};

mod check;
mod etcd;
mod etcd_model;
mod fencing;
mod leases;
mod liveness;
mod mvcc;
mod revisions;
#[cfg(test)]
mod tests;
mod workload;

type Kv = Runtime<KvState>;

/// Writes in flight at most; more are not started.
const MAX_PENDING_WRITES: usize = 48;
/// Stopped processes whose history is still polled (late applies).
const RETIRED_KEPT: usize = 4;
/// The least virtual time between two steps. The runtime encodes and
/// restores snapshots on tokio's blocking pool, in real time; while a
/// blocking task runs, the paused clock does not advance, so a driver that
/// always sleeps a little acts only after it finished, never in a race
/// with it at one virtual instant.
const SETTLE_MIN_MS: u64 = 1;

/// What the runtime phase exercised.
#[derive(Debug, Clone, Default)]
pub struct RuntimeStats {
    /// Writes started.
    pub writes: u64,
    /// Writes acknowledged.
    pub acked: u64,
    /// Writes that failed with `may_have_committed`.
    pub ambiguous: u64,
    /// Writes refused or failed without committing.
    pub not_committed: u64,
    /// Acknowledged increments that lost their compare-and-set at apply time.
    pub cas_lost: u64,
    /// Acknowledgements by a process whose lease was no longer the lease.
    pub zombie_acks: u64,
    /// Lease acquisitions by another holder than the last.
    pub takeovers: u64,
    /// HEAD writes that landed (claims and publications).
    pub head_writes: u64,
    /// HEAD writes that landed after their lease stopped being the lease.
    pub late_head_writes: u64,
    /// Times the log's floor rose (truncation below a snapshot).
    pub floor_raises: u64,
    /// Processes started.
    pub boots: u64,
    /// Processes aborted.
    pub crashes: u64,
    /// Graceful shutdowns asked for.
    pub shutdowns: u64,
    /// Of those, of a process serving as primary at the time.
    pub primary_shutdowns: u64,
    /// Nodes healed after being cut off while another took the lease over.
    pub zombies: u64,
    /// Current reads answered.
    pub current_reads: u64,
    /// Attempts of exactly-once (keyed) writes, first attempts and retries.
    pub keyed_attempts: u64,
    /// Of those, retries (the same key and put again).
    pub keyed_retries: u64,
    /// Attempts answered from the idempotency table, nothing appended.
    pub keyed_replayed: u64,
    /// Attempts appended after another attempt of their key (concurrent
    /// twins), applied as no-ops.
    pub keyed_duplicates: u64,
    /// Retries answered (from the table, or as a no-op) by a process whose
    /// own history does not hold their key's first application: it came
    /// through a snapshot the process restored.
    pub keyed_restored: u64,
    /// etcd writes started.
    pub etcd_writes: u64,
    /// etcd writes acknowledged with etcd's answer.
    pub etcd_acked: u64,
    /// etcd writes acknowledged as refused at apply time: a compaction, or
    /// a transaction reading at a revision, that another compaction
    /// applied first made refer to compacted history.
    pub etcd_compacted: u64,
    /// etcd answers compared with another process's or the acknowledged
    /// one (R11).
    pub etcd_answers_compared: u64,
    /// States compared with another seen at their applied end (R12).
    pub states_compared: u64,
    /// etcd answers checked against the model (R13).
    pub etcd_model_checked: u64,
    /// Leases granted (grants acknowledged).
    pub lease_grants: u64,
    /// Keep-alives acknowledged (renewed by a primary sure of its lease).
    pub lease_keep_alives_acked: u64,
    /// Keep-alives refused: sent to a process that is not a primary sure
    /// of its lease.
    pub lease_keep_alives_refused: u64,
    /// Leases whose keep-alives were acknowledged by two primacies (kept
    /// alive across a takeover).
    pub lease_kept_across_takeovers: u64,
    /// Records handed from one process to another (the Follow action).
    pub records_handed_over: u64,
    /// Records the receivers applied from them (held ones included).
    pub records_applied_from_peers: u64,
    /// Leases revoked by their expiry (expiry revokes acknowledged).
    pub lease_expiries: u64,
    /// Leases revoked by the client (its revokes acknowledged).
    pub lease_revokes: u64,
    /// Keys those revokes deleted.
    pub lease_keys_deleted: u64,
}

/// The settings of one run of the phase, drawn from its seed.
#[derive(Debug, Clone)]
struct Settings {
    nodes: usize,
    timing: LeaseTiming,
    snapshot: SnapshotConfig,
    /// Every node's runtime settings; the holder is replaced per process.
    runtime: RuntimeConfig,
    replicas: usize,
    window: u32,
    fault_intensity: u32,
}

fn millis(rng: &mut StdRng, range: std::ops::RangeInclusive<u64>) -> Duration {
    Duration::from_millis(rng.random_range(range))
}

impl Settings {
    fn draw(rng: &mut StdRng) -> Settings {
        let params = Params::draw(rng);
        let timing = LeaseTiming::draw(rng, 1000..=5000);
        let store_call_timeout = timing.config.store_call_timeout;
        let snapshot = SnapshotConfig {
            head_call_timeout: store_call_timeout,
            payload_call_timeout: store_call_timeout * 2,
        };
        let placeholder = HolderId::new("unset").expect("a valid holder id");
        let runtime = RuntimeConfig {
            log: params.config.clone(),
            snapshot_every_records: rng.random_range(2..=24),
            snapshot_min_log_percent: [0, 50, 100][rng.random_range(0..3)],
            snapshot_interval: millis(rng, 1000..=20_000),
            keep_payloads: NonZeroUsize::new(rng.random_range(1..=3)).expect("non-zero"),
            force: false,
            standby_poll_interval: millis(rng, 50..=500),
            lease_check_interval: millis(rng, 50..=500),
            drain_timeout: millis(rng, 100..=2000),
            history_records: 100_000,
            retry_backoff: millis(rng, 50..=1000),
            ..RuntimeConfig::new(placeholder)
        };
        runtime
            .validate()
            .expect("the simulator draws valid runtime settings");
        Settings {
            nodes: rng.random_range(2..=3),
            timing,
            snapshot,
            runtime,
            replicas: params.replicas,
            window: params.window,
            fault_intensity: params.fault_intensity,
        }
    }
}

impl std::fmt::Display for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (l, r) = (&self.timing.config, &self.runtime);
        write!(
            f,
            "nodes={} replicas={} window={} ttl={:?} safety_margin={:?} store_call_timeout={:?} \
             max_skew_ms={} snapshot_every_records={} snapshot_min_log_percent={} \
             snapshot_interval={:?} keep_payloads={} \
             standby_poll={:?} lease_check={:?} drain={:?} retry_backoff={:?} \
             max_segment_bytes={} max_inflight_records={} fault_intensity={}",
            self.nodes,
            self.replicas,
            self.window,
            l.ttl,
            l.safety_margin,
            l.store_call_timeout,
            self.timing.max_skew_ms,
            r.snapshot_every_records,
            r.snapshot_min_log_percent,
            r.snapshot_interval,
            r.keep_payloads,
            r.standby_poll_interval,
            r.lease_check_interval,
            r.drain_timeout,
            r.retry_backoff,
            r.log.max_segment_bytes,
            r.log.max_inflight_records,
            self.fault_intensity,
        )
    }
}

/// A write in flight.
struct PendingWrite {
    id: u64,
    node: usize,
    holder: HolderId,
    /// The process it was sent to.
    runtime: Arc<Kv>,
    kind: WriteKind,
    handle: JoinHandle<WriteEnd>,
}

/// A running (or stopping) process.
struct Process {
    runtime: Arc<Kv>,
    holder: HolderId,
    /// The next index of its change history not yet checked.
    seen: RecordIndex,
    /// The applied end its state was last checked at by R12.
    digested: Option<RecordIndex>,
    role: Role,
    /// A graceful shutdown in progress.
    shutdown: Option<JoinHandle<()>>,
    /// Its etcd lease deadlines (`leases.rs`).
    lessor: Lessor,
    /// When its last expiry tick ran (virtual ms since the phase began).
    last_expiry_ms: Option<u64>,
}

/// What part of its world a cut-off node cannot reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Log,
    Lease,
    Both,
}

/// A node cut off until a step.
#[derive(Debug, Clone)]
struct Isolation {
    until: u64,
    scope: Scope,
    /// The lease holder when it began.
    holder_at_start: Option<HolderId>,
}

/// One machine: its clock, its views of the stores, and the process on it.
struct Node {
    clock: Arc<SimClock>,
    log_faults: ActorFaults,
    lease_faults: FaultController,
    stores: RuntimeStores,
    incarnation: u64,
    /// The holder id of its last process, if that process is gone (crashed
    /// or shut down), so a restart may reuse it.
    restartable: Option<HolderId>,
    process: Option<Process>,
    isolated: Option<Isolation>,
}

impl Node {
    fn cut(&self, scope: Scope, outage: bool) {
        if scope != Scope::Lease {
            for controller in &self.log_faults.replicas {
                controller.set_outage(outage);
            }
            self.log_faults.register.set_outage(outage);
        }
        if scope != Scope::Log {
            self.lease_faults.set_outage(outage);
        }
    }

    fn clear(&self) {
        self.log_faults.clear();
        self.lease_faults.clear();
    }
}

/// One step of the schedule.
#[derive(Debug, Clone)]
enum Action {
    Write {
        node: usize,
        count: u32,
    },
    Boot {
        node: usize,
        restart: bool,
        /// Take the holder id of a process alive on another node.
        share: bool,
    },
    Crash(usize),
    Shutdown(usize),
    Isolate {
        node: usize,
        scope: Scope,
        steps: u64,
    },
    Heal(usize),
    Skew {
        node: usize,
        skew_ms: i64,
    },
    LogFault,
    LeaseStoreFault,
    Outage {
        replica: usize,
        steps: u64,
    },
    Clear,
    Sleep(Duration),
    /// One action of the lease client (`leases.rs`).
    Lease,
    /// `from`'s applied records handed to `to` as a standby's Follow
    /// stream hands them over (`Runtime::offer_committed`).
    Follow {
        from: usize,
        to: usize,
    },
}

/// The state of the runtime phase.
pub struct RuntimePhase<'a> {
    rng: StdRng,
    trace: &'a mut Trace,
    origin: Instant,
    step: u64,
    settings: Settings,
    database: DatabaseKey,
    world: World,
    register_checker: StoreChecker,
    /// The store of the lease, HEAD and payloads.
    control: ControlStore,
    /// What landed on it since the last step (R5).
    audit: Arc<Audit>,
    lease_checker: LeaseChecker,
    nodes: Vec<Node>,
    retired: Vec<(usize, Process)>,
    writes: Vec<PendingWrite>,
    next_write: u64,
    /// Every put by key.
    puts: BTreeMap<Bytes, PutState>,
    /// The value of every put, by key.
    put_values: BTreeMap<Bytes, Bytes>,
    /// Where each key's put was applied.
    put_index: BTreeMap<Bytes, u64>,
    /// Every exactly-once operation by its idempotency key (R9).
    keyed: BTreeMap<IdempotencyKey, KeyedOp>,
    /// Acknowledged increments: the counter value written → the index.
    acked_increments: BTreeMap<u64, u64>,
    ambiguous_increments: u64,
    /// Acknowledged records by index.
    acked: BTreeMap<u64, Bytes>,
    /// Applied records by index (R1).
    applied: BTreeMap<u64, Bytes>,
    /// The revision after each applied record (R10).
    revisions: revisions::Revisions,
    /// The answer to each applied etcd record (R11).
    answers: mvcc::Answers,
    /// The digest of the state at each applied end (R12).
    digests: mvcc::Digests,
    /// The etcd keys as etcd's rules make them (R13).
    etcd_model: etcd_model::EtcdModel,
    /// The lease client's leases (R14).
    leases: leases::LeaseLedger,
    reigns: Vec<Reign>,
    last_head_write: Option<Head>,
    /// The HEAD payload last checked by R6.
    checked_payload: Option<String>,
    /// Fault rules and replica outages, with the step they end at.
    expiring: Expiring,
    floor: u64,
    stats: RuntimeStats,
}

impl<'a> RuntimePhase<'a> {
    /// A phase for `seed`, tracing into `trace`, built inside the paused runtime.
    pub async fn new(seed: u64, trace: &'a mut Trace) -> RuntimePhase<'a> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x0c0f_fee5_7a7e_0000);
        let settings = Settings::draw(&mut rng);
        let world = World::new(settings.replicas, settings.window, || rng.random()).await;
        let origin = Instant::now();
        let database = DatabaseKey::new("simkv").expect("a valid database key");
        let audit = Arc::new(Audit::new(&database, origin));
        let control = ControlStore::new("memory://sim-runtime", rng.random(), Some(audit.clone()));
        let lease_checker =
            LeaseChecker::new(&control.raw, &database, settings.timing.config, origin);
        let mut phase = RuntimePhase {
            rng,
            trace,
            origin,
            step: 0,
            register_checker: StoreChecker::new(settings.replicas),
            settings,
            database,
            world,
            control,
            audit,
            lease_checker,
            nodes: Vec::new(),
            retired: Vec::new(),
            writes: Vec::new(),
            next_write: 0,
            puts: BTreeMap::new(),
            put_values: BTreeMap::new(),
            put_index: BTreeMap::new(),
            keyed: BTreeMap::new(),
            acked_increments: BTreeMap::new(),
            ambiguous_increments: 0,
            acked: BTreeMap::new(),
            applied: BTreeMap::new(),
            revisions: Default::default(),
            answers: Default::default(),
            digests: Default::default(),
            etcd_model: Default::default(),
            leases: Default::default(),
            reigns: Vec::new(),
            last_head_write: None,
            checked_payload: None,
            expiring: Expiring::default(),
            floor: 0,
            stats: RuntimeStats::default(),
        };
        for _ in 0..phase.settings.nodes {
            let node = phase.new_node();
            phase.nodes.push(node);
        }
        let settings = phase.settings.to_string();
        phase.event(format!("runtime phase: {settings}"));
        phase
    }

    fn new_node(&mut self) -> Node {
        let (log, log_faults) = self.world.view(|| self.rng.random());
        let ControlView {
            clock,
            faults: lease_faults,
            leases,
            snapshots,
        } = self.control.view(
            self.origin,
            &self.database,
            self.settings.timing.config,
            self.settings.snapshot,
            self.rng.random(),
        );
        Node {
            clock,
            log_faults,
            lease_faults,
            stores: RuntimeStores {
                log,
                snapshots,
                leases,
            },
            incarnation: 0,
            restartable: None,
            process: None,
            isolated: None,
        }
    }

    fn event(&mut self, what: impl std::fmt::Display) {
        let now = self.origin.elapsed();
        self.trace.event(self.step, now, what);
    }

    /// Records an event that happened at `at` (since the phase began).
    fn event_at(&mut self, at: Duration, what: impl std::fmt::Display) {
        self.trace.event(self.step, at, what);
    }

    /// Whether every two clocks stay within the safety margin of each other
    /// for the whole phase (nine seeds in ten), so that R3, R4 and the
    /// timing part of R5 apply.
    fn clocks_agree(&self) -> bool {
        self.settings.timing.clocks_agree()
    }

    /// Runs `steps` steps and the liveness stages; returns what it exercised.
    pub async fn run(mut self, steps: u64) -> (Result<(), Violation>, RuntimeStats) {
        let outcome = self.run_steps(steps).await;
        let outcome = match outcome {
            Ok(()) => self.liveness().await,
            Err(violation) => Err(violation),
        };
        let step = self.step;
        let outcome = outcome.map_err(|violation| format!("step {step}: {violation}"));
        self.stats.etcd_answers_compared = self.answers.compared;
        self.stats.states_compared = self.digests.compared;
        self.stats.etcd_model_checked = self.etcd_model.checked;
        let stats = format!("runtime stats {:?}", self.stats);
        self.event(stats);
        self.stop_everything();
        (outcome, self.stats.clone())
    }

    async fn run_steps(&mut self, steps: u64) -> Result<(), Violation> {
        for _ in 0..steps {
            self.step += 1;
            self.expire();
            let action = self.choose();
            self.event(format!("runtime do {action:?}"));
            self.perform(action).await;
            // At least 1 ms: see `SETTLE_MIN_MS`.
            let settle = if self.rng.random_bool(0.9) {
                self.rng.random_range(SETTLE_MIN_MS..=20)
            } else {
                self.rng.random_range(20..=500)
            };
            tokio::time::sleep(Duration::from_millis(settle)).await;
            self.drive_leases()?;
            self.observe()?;
        }
        Ok(())
    }

    /// The node whose process answers current reads now, if one does.
    fn primary(&self) -> Option<usize> {
        (0..self.nodes.len()).find(|node| {
            self.nodes[*node]
                .process
                .as_ref()
                .is_some_and(|process| process.runtime.is_primary_and_sure())
        })
    }

    fn choose(&mut self) -> Action {
        let nodes = self.nodes.len();
        let node = self.rng.random_range(0..nodes);
        let primary = self.primary();
        let alive = self.nodes[node].process.is_some();
        let intensity = self.settings.fault_intensity;
        let write_to = match primary {
            Some(primary) if self.rng.random_bool(0.9) => primary,
            _ => node,
        };
        let mut options: Vec<(u32, Action)> = vec![
            (
                14,
                Action::Write {
                    node: write_to,
                    count: self.rng.random_range(1..=6),
                },
            ),
            (2, Action::LogFault),
            (intensity, Action::LogFault),
            (intensity, Action::LeaseStoreFault),
            (
                intensity.div_ceil(2),
                Action::Outage {
                    replica: self.rng.random_range(0..self.settings.replicas),
                    steps: self.rng.random_range(5..=100),
                },
            ),
            (1, Action::Clear),
        ];
        let skew_ms = self.settings.timing.draw_skew(&mut self.rng);
        options.push((1, Action::Skew { node, skew_ms }));
        let sleep = self.settings.timing.draw_sleep(&mut self.rng);
        options.push((5, Action::Sleep(sleep)));
        options.push((6, Action::Lease));
        let living: Vec<usize> = (0..nodes)
            .filter(|node| self.nodes[*node].process.is_some())
            .collect();
        if living.len() >= 2 {
            let from = living[self.rng.random_range(0..living.len())];
            let to = living[self.rng.random_range(0..living.len())];
            if from != to {
                options.push((8, Action::Follow { from, to }));
            }
        }
        // Graceful shutdowns go to the primary half the time: its way out
        // (drain, final snapshot, release) is the one worth exercising.
        let stopping = primary
            .filter(|_| self.rng.random_bool(0.5))
            .unwrap_or(node);
        if self.may_shut_down(stopping) {
            options.push((1, Action::Shutdown(stopping)));
        }
        if alive {
            options.push((2, Action::Crash(node)));
        } else {
            let restart = self.rng.random_bool(0.3);
            let share = !restart && self.rng.random_bool(0.2);
            options.push((
                10,
                Action::Boot {
                    node,
                    restart,
                    share,
                },
            ));
        }
        if self.nodes[node].isolated.is_some() {
            options.push((2, Action::Heal(node)));
        } else {
            // Zombies are made of primaries mostly.
            let target = primary
                .filter(|_| self.rng.random_bool(0.8))
                .unwrap_or(node);
            let scope = match self.rng.random_range(0..4) {
                0 => Scope::Log,
                1 => Scope::Lease,
                _ => Scope::Both,
            };
            let steps = self.rng.random_range(5..=80);
            if self.nodes[target].isolated.is_none() {
                options.push((
                    2,
                    Action::Isolate {
                        node: target,
                        scope,
                        steps,
                    },
                ));
            }
        }
        pick(&mut self.rng, options)
    }

    async fn perform(&mut self, action: Action) {
        match action {
            Action::Write { node, count } => {
                for _ in 0..count {
                    self.write(node);
                }
            }
            Action::Boot {
                node,
                restart,
                share,
            } => self.boot(node, restart, share),
            Action::Crash(node) => self.crash(node),
            Action::Shutdown(node) => self.shutdown(node),
            Action::Isolate { node, scope, steps } => {
                let holder = self.lease_holder();
                self.nodes[node].cut(scope, true);
                self.nodes[node].isolated = Some(Isolation {
                    until: self.step + steps,
                    scope,
                    holder_at_start: holder,
                });
            }
            Action::Heal(node) => self.heal(node),
            Action::Skew { node, skew_ms } => self.nodes[node].clock.set_skew(skew_ms),
            Action::LogFault => self.log_fault(),
            Action::LeaseStoreFault => self.lease_store_fault(),
            Action::Outage { replica, steps } => {
                let controller = &self.world.replica_faults[replica];
                self.expiring
                    .add_outage(self.step + steps, replica, controller);
            }
            Action::Clear => self.clear(),
            Action::Sleep(duration) => tokio::time::sleep(duration).await,
            Action::Lease => self.lease_action(),
            Action::Follow { from, to } => self.follow(from, to),
        }
    }

    /// Hands `to` records `from` applied, as a Follow stream would: from
    /// a few records before `to`'s applied end (which it checks against
    /// what it applied) or a few after it (which it holds), all at once
    /// or the later part first. `from` may be any process, a deposed
    /// primary too: every record a process applied is committed, so R1
    /// and R8 must hold whatever is handed over.
    fn follow(&mut self, from: usize, to: usize) {
        let (Some(source), Some(target)) = (&self.nodes[from].process, &self.nodes[to].process)
        else {
            return;
        };
        let end = *target.runtime.applied().borrow();
        let start = if self.rng.random_bool(0.3) {
            end.0 + self.rng.random_range(1..=5)
        } else {
            end.0.saturating_sub(self.rng.random_range(0..=3))
        };
        let records = source
            .runtime
            .committed_records(RecordIndex(start), 64, usize::MAX);
        self.stats.records_handed_over += records.len() as u64;
        let mut applied = 0;
        if records.len() > 1 && self.rng.random_bool(0.3) {
            let split = self.rng.random_range(1..records.len());
            applied += target.runtime.offer_committed(records[split..].to_vec());
        }
        applied += target.runtime.offer_committed(records);
        self.stats.records_applied_from_peers += applied as u64;
    }

    /// The holder of the lease document as it last landed.
    fn lease_holder(&self) -> Option<HolderId> {
        self.reigns
            .last()
            .filter(|reign| reign.live)
            .map(|reign| reign.holder.clone())
    }

    /// Starts a process on `node`: under the last crashed process's holder
    /// id (a restart: a new process all the same, so it waits out its
    /// predecessor's lease), under the holder id of a process alive on
    /// another node (`share`), or under a new one. Its incarnation is drawn
    /// from the run's seed.
    fn boot(&mut self, node: usize, restart: bool, share: bool) {
        if self.nodes[node].process.is_some() {
            return;
        }
        let shared = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(other, _)| share && *other != node)
            .find_map(|(_, other)| other.process.as_ref().map(|p| p.holder.clone()));
        let incarnation = Incarnation(self.rng.random());
        let slot = &mut self.nodes[node];
        let holder = match (slot.restartable.clone().filter(|_| restart), shared) {
            (Some(holder), _) | (None, Some(holder)) => holder,
            (None, None) => {
                slot.incarnation += 1;
                HolderId::new(&format!("n{node}-{}", slot.incarnation)).expect("a valid holder id")
            }
        };
        let config = RuntimeConfig {
            holder: holder.clone(),
            incarnation: Some(incarnation),
            ..self.settings.runtime.clone()
        };
        let runtime = Kv::start(slot.stores.clone(), config).expect("valid runtime settings");
        slot.restartable = None;
        slot.process = Some(Process {
            runtime: Arc::new(runtime),
            holder: holder.clone(),
            seen: RecordIndex(0),
            digested: None,
            role: Role::Booting,
            shutdown: None,
            lessor: Lessor::default(),
            last_expiry_ms: None,
        });
        self.stats.boots += 1;
        self.event(format!("runtime n{node} boots as {holder}"));
    }

    fn crash(&mut self, node: usize) {
        let Some(process) = self.nodes[node].process.take() else {
            return;
        };
        process.runtime.abort();
        self.nodes[node].restartable = Some(process.holder.clone());
        self.stats.crashes += 1;
        self.retire(node, process);
    }

    /// Whether `node` has a process that is not shutting down yet, in any
    /// role: a serving primary too, since its serve loop lets a shutdown
    /// win over a failure ready at the same instant (`biased`), so either
    /// way out replays exactly.
    fn may_shut_down(&self, node: usize) -> bool {
        self.nodes[node]
            .process
            .as_ref()
            .is_some_and(|process| process.shutdown.is_none())
    }

    fn shutdown(&mut self, node: usize) {
        let Some(process) = self.nodes[node].process.as_mut() else {
            return;
        };
        if process.shutdown.is_some() {
            return;
        }
        let runtime = Arc::clone(&process.runtime);
        let serving = runtime.status().role == Role::Primary;
        process.shutdown = Some(tokio::spawn(async move {
            let _ = runtime.shutdown().await;
        }));
        self.stats.shutdowns += 1;
        self.stats.primary_shutdowns += u64::from(serving);
    }

    /// Keeps a stopped process around to poll its history a while longer
    /// (its apply task may still apply writes that were in flight).
    fn retire(&mut self, node: usize, process: Process) {
        self.retired.push((node, process));
        if self.retired.len() > RETIRED_KEPT {
            self.retired.remove(0);
        }
    }

    fn heal(&mut self, node: usize) {
        let Some(isolation) = self.nodes[node].isolated.take() else {
            return;
        };
        self.nodes[node].cut(isolation.scope, false);
        let now = self.lease_holder();
        let was_primary = isolation.holder_at_start.as_ref().is_some_and(|holder| {
            self.nodes[node]
                .process
                .as_ref()
                .is_some_and(|process| process.holder == *holder)
        });
        let zombie = was_primary && now != isolation.holder_at_start;
        self.stats.zombies += u64::from(zombie);
        self.event(format!(
            "runtime n{node} healed ({:?}){}",
            isolation.scope,
            if zombie {
                " after its lease was taken over"
            } else {
                ""
            }
        ));
    }

    /// Starts a write of the workload's kinds on `node`'s process.
    fn write(&mut self, node: usize) {
        if self.nodes[node].process.is_none() || self.writes.len() >= MAX_PENDING_WRITES {
            return;
        }
        // The id `start_write` gives it.
        let id = self.next_write + 1;
        let kind = match self.rng.random_range(0..100) {
            0..=21 => WriteKind::Increment,
            22..=30 => self.new_keyed_op(id),
            31..=39 if !self.keyed.is_empty() => self.retry_keyed_op(),
            40..=69 => {
                self.stats.etcd_writes += 1;
                WriteKind::Etcd {
                    seed: self.rng.random(),
                }
            }
            _ => WriteKind::Put {
                key: Bytes::from(format!("k{id:06}")),
                value: self.random_value(&format!("w{id}.")),
            },
        };
        if let WriteKind::Put { key, value } = &kind {
            self.puts.insert(key.clone(), PutState::Pending);
            self.put_values.insert(key.clone(), value.clone());
        }
        self.start_write(node, kind);
    }

    /// Starts a write of `kind` on `node`'s process; its id, or `None` if
    /// there is no process or too many writes are in flight.
    fn start_write(&mut self, node: usize, kind: WriteKind) -> Option<u64> {
        let process = self.nodes[node].process.as_ref()?;
        if self.writes.len() >= MAX_PENDING_WRITES {
            return None;
        }
        let runtime = Arc::clone(&process.runtime);
        let holder = process.holder.clone();
        self.next_write += 1;
        let id = self.next_write;
        let prepared = kind.clone();
        let writer = Arc::clone(&runtime);
        // The writer's clock, as the service stamps a keyed write.
        let at_ms = runtime.wall_ms();
        let handle = tokio::spawn(async move {
            let mut record = None;
            let result = writer
                .write(|state: &KvState| {
                    let bytes = prepare(&prepared, state, at_ms)?;
                    record = Some(bytes.clone());
                    Ok(bytes)
                })
                .await;
            (record, result)
        });
        self.stats.writes += 1;
        self.writes.push(PendingWrite {
            id,
            node,
            holder,
            runtime,
            kind,
            handle,
        });
        Some(id)
    }

    /// A value: `tag`, then up to 48 random bytes.
    fn random_value(&mut self, tag: &str) -> Bytes {
        let length = self.rng.random_range(0..=48);
        let mut value = tag.as_bytes().to_vec();
        value.extend((0..length).map(|_| self.rng.random::<u8>()));
        Bytes::from(value)
    }

    /// The first attempt of a new exactly-once operation.
    fn new_keyed_op(&mut self, id: u64) -> WriteKind {
        let number = self.keyed.len() + 1;
        let key = IdempotencyKey::new(format!("op-{number:06}")).expect("a valid key");
        let op = KeyedOp {
            target: Bytes::from(format!("x{number:06}")),
            value: self.random_value(&format!("o{number}.w{id}.")),
            first: None,
        };
        self.stats.keyed_attempts += 1;
        let kind = op.attempt(&key);
        self.keyed.insert(key, op);
        kind
    }

    /// Another attempt of an operation: the newest half the time (often
    /// still in flight: a concurrent twin), else any earlier one (often
    /// long applied, by processes restored from snapshots since).
    fn retry_keyed_op(&mut self) -> WriteKind {
        let count = self.keyed.len();
        let number = if self.rng.random_bool(0.5) {
            count
        } else {
            self.rng.random_range(1..=count)
        };
        let key = IdempotencyKey::new(format!("op-{number:06}")).expect("a valid key");
        self.stats.keyed_attempts += 1;
        self.stats.keyed_retries += 1;
        self.keyed[&key].attempt(&key)
    }

    fn log_fault(&mut self) {
        let replica = self.rng.random_range(0..self.settings.replicas);
        let node = self.rng.random_range(0..self.nodes.len());
        let (name, controller, rule) = match self.rng.random_range(0..4) {
            0 => (
                format!("replica {replica}"),
                self.world.replica_faults[replica].clone(),
                draw_store_rule(&mut self.rng),
            ),
            1 => (
                "register".to_owned(),
                self.world.register_faults.clone(),
                draw_register_rule(&mut self.rng),
            ),
            2 => (
                format!("n{node} register"),
                self.nodes[node].log_faults.register.clone(),
                draw_register_rule(&mut self.rng),
            ),
            _ => (
                format!("n{node} replica {replica}"),
                self.nodes[node].log_faults.replicas[replica].clone(),
                draw_store_rule(&mut self.rng),
            ),
        };
        self.add_expiring(&name, controller, rule);
    }

    /// A rule on the shared control store or one node's view of it;
    /// corruption hits payloads, `HEAD.json` and `lease.json` alike.
    fn lease_store_fault(&mut self) {
        let node = self.rng.random_range(0..self.nodes.len());
        let rule = draw_store_rule(&mut self.rng);
        let (name, controller) = if self.rng.random_bool(0.5) {
            ("control store".to_owned(), self.control.faults.clone())
        } else {
            (
                format!("n{node} control store"),
                self.nodes[node].lease_faults.clone(),
            )
        };
        self.add_expiring(&name, controller, rule);
    }

    fn add_expiring(
        &mut self,
        name: &str,
        controller: FaultController,
        rule: chorus::blob::FaultRule,
    ) {
        let text = RuleLabel(&rule).to_string();
        let lasts = self.rng.random_range(5..=150);
        self.expiring.add_rule(self.step + lasts, controller, rule);
        self.event(format!("runtime fault {name} for {lasts} steps: {text}"));
    }

    /// Clears one shared controller (the nodes' own rules expire).
    fn clear(&mut self) {
        match self.rng.random_range(0..3) {
            0 => {
                let replica = self.rng.random_range(0..self.settings.replicas);
                self.world.replica_faults[replica].clear();
                self.expiring.forget_outages(replica);
            }
            1 => self.world.register_faults.clear(),
            _ => self.control.faults.clear(),
        }
    }

    /// Removes the rules, outages and isolations whose time is up.
    fn expire(&mut self) {
        let step = self.step;
        self.expiring.expire(step, &self.world.replica_faults);
        for node in 0..self.nodes.len() {
            if self.nodes[node]
                .isolated
                .as_ref()
                .is_some_and(|isolation| isolation.until <= step)
            {
                self.heal(node);
            }
        }
    }

    /// Aborts every process, so nothing runs on after the phase.
    fn stop_everything(&mut self) {
        for node in &mut self.nodes {
            if let Some(process) = node.process.take() {
                process.runtime.abort();
            }
        }
        for write in &self.writes {
            write.handle.abort();
        }
    }
}
