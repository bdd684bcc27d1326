//! The lease and snapshot-publication phase of a run
//! (docs/design/0002-lease-and-snapshots.md).
//!
//! A few processes, each with its own skewed wall clock and its own fault
//! controller, contend for one writer lease and publish snapshots through
//! `HEAD.json` in one fault-injecting in-memory store. Each boot follows the
//! runtime's order: observe HEAD, acquire the lease, claim HEAD. One boot in
//! three takes the holder id every process may share (`shared`), so distinct
//! processes contend under one holder id and only their incarnations tell
//! them apart; the others take a holder id of their own. Processes
//! refresh, publish, release and crash at random; clocks are skewed within
//! the lease's safety margin (or, in one seed in ten, beyond it).
//!
//! Checkers, after every step, reading the raw store:
//!
//! - **L1, exclusivity**: while every two wall clocks are within the safety
//!   margin of each other, at most one holder believes it may write.
//! - **L2, lease history**: the lease document's fencing token never
//!   decreases, and one generation never changes holder or incarnation.
//! - **S1, HEAD history**: every change of HEAD bumps its publication
//!   sequence, and its lease token never decreases.
//! - **S2, HEAD's payload**: HEAD names a payload that exists, with the size
//!   and SHA-256 HEAD records.
//! - **S3, immutability**: a payload, once written, never changes.
//! - **S4, stamps**: a claim or publication that succeeded is stamped with the
//!   caller's lease.
//!
//! Liveness: with faults healed, clocks agreeing and every process crashed,
//! a fresh process must boot (acquire, claim) and publish.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chorus::blob::{DynBlobStore, FaultController};
use chorus::clock::{Clock, DynClock};
use chorus::ids::RecordIndex;
use chorus::lease::{
    Contender, DatabaseKey, FencingToken, Generation, HolderId, Incarnation, LeaseConfig,
    LeaseError, LeaseHolder, LeaseRecord, LeaseStore, Term,
};
use chorus::snapshot::{
    Head, NewSnapshot, PublicationStore, Sha256Digest, SnapshotConfig, SnapshotError,
    SnapshotStore, payload_prefix,
};
use futures::FutureExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::actions::pick;
use crate::control::{ControlStore, ControlView, LeaseTiming, SimClock};
use crate::faults::{RuleLabel, draw_store_rule};
use crate::model::Violation;
use crate::trace::{Trace, label};
use crate::world::raw_bytes;

/// Processes contending for the lease.
const PROCESSES: usize = 3;
/// Boot attempts of the liveness phase, one lease lifetime apart at most.
const LIVENESS_BOOTS: u32 = 20;

/// A boot that acquired the lease: the lease, the publication store and
/// what the claim did.
type Booted = (LeaseHolder, PublicationStore, Result<Head, SnapshotError>);

/// How a process's background operation ended.
#[allow(clippy::large_enum_variant)] // one per operation; boxing buys nothing
enum TaskEnd {
    /// Observe, acquire, claim; `Err` if observing or acquiring failed.
    Booted(Result<Booted, String>),
    Refreshed(Result<(), LeaseError>),
    Published(PublicationStore, Result<Head, SnapshotError>),
    Released(Result<(), LeaseError>),
}

/// One contending process.
struct Process {
    clock: Arc<SimClock>,
    faults: FaultController,
    leases: LeaseStore,
    snapshots: SnapshotStore,
    incarnation: u64,
    lease: Option<Arc<LeaseHolder>>,
    publication: Option<PublicationStore>,
    claimed: bool,
    task: Option<JoinHandle<TaskEnd>>,
}

/// One step of the lease phase's schedule.
#[derive(Debug, Clone, Copy)]
enum Action {
    Boot { process: usize, stale_term: bool },
    Refresh(usize),
    Publish(usize),
    Release(usize),
    Crash(usize),
    Skew { process: usize, skew_ms: i64 },
    Fault { process: Option<usize> },
    Clear(Option<usize>),
    NewTerm,
    Sleep(Duration),
}

/// The state of the lease phase.
pub struct LeasePhase<'a> {
    rng: StdRng,
    trace: &'a mut Trace,
    origin: Instant,
    step: u64,
    timing: LeaseTiming,
    database: DatabaseKey,
    control: ControlStore,
    processes: Vec<Process>,
    term: Term,
    checker: LeaseChecker,
    /// The last publication that succeeded.
    published: Option<Head>,
}

impl<'a> LeasePhase<'a> {
    /// A phase for `seed`, tracing into `trace`.
    pub fn new(seed: u64, trace: &'a mut Trace) -> LeasePhase<'a> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x1ea5_e5a9_5107_0000);
        let timing = LeaseTiming::draw(&mut rng, 500..=10_000);
        let control = ControlStore::new("memory://sim-control", rng.random(), None);
        let database = DatabaseKey::new("simdb").expect("a valid database key");
        let origin = Instant::now();
        let checker = LeaseChecker::new(&control.raw, &database, timing.config, origin);
        let mut phase = LeasePhase {
            rng,
            trace,
            origin,
            step: 0,
            timing,
            database,
            control,
            processes: Vec::new(),
            term: Term::FIRST,
            checker,
            published: None,
        };
        phase.processes = (0..PROCESSES).map(|_| phase.new_process()).collect();
        let LeaseConfig {
            ttl,
            safety_margin,
            store_call_timeout,
        } = timing.config;
        let max_skew_ms = timing.max_skew_ms;
        phase.event(format!(
            "lease phase: ttl={ttl:?} safety_margin={safety_margin:?} \
             store_call_timeout={store_call_timeout:?} max_skew_ms={max_skew_ms}"
        ));
        phase
    }

    fn new_process(&mut self) -> Process {
        let config = self.timing.config;
        let snapshot_config = SnapshotConfig {
            head_call_timeout: config.store_call_timeout,
            payload_call_timeout: config.store_call_timeout,
        };
        let ControlView {
            clock,
            faults,
            leases,
            snapshots,
        } = self.control.view(
            self.origin,
            &self.database,
            config,
            snapshot_config,
            self.rng.random(),
        );
        Process {
            clock,
            faults,
            leases,
            snapshots,
            incarnation: 0,
            lease: None,
            publication: None,
            claimed: false,
            task: None,
        }
    }

    fn event(&mut self, what: impl std::fmt::Display) {
        let now = self.origin.elapsed();
        self.trace.event(self.step, now, what);
    }

    /// Runs `steps` steps and then the liveness check.
    pub async fn run(mut self, steps: u64) -> Result<(), Violation> {
        for _ in 0..steps {
            self.step += 1;
            let action = self.choose();
            self.event(format!("lease do {action:?}"));
            self.perform(action).await;
            let settle = self.rng.random_range(0..=50);
            tokio::time::sleep(Duration::from_millis(settle)).await;
            self.observe()?;
        }
        self.liveness().await
    }

    fn choose(&mut self) -> Action {
        let process = self.rng.random_range(0..PROCESSES);
        let idle = self.processes[process].task.is_none();
        let holds = self.processes[process].lease.is_some();
        let claimed = self.processes[process].claimed;
        let mut options: Vec<(u32, Action)> = vec![
            (2, Action::Crash(process)),
            (
                2,
                Action::Fault {
                    process: self.rng.random_bool(0.5).then_some(process),
                },
            ),
            (
                2,
                Action::Clear(self.rng.random_bool(0.5).then_some(process)),
            ),
            (1, Action::NewTerm),
        ];
        let skew_ms = self.timing.draw_skew(&mut self.rng);
        options.push((2, Action::Skew { process, skew_ms }));
        let sleep = self.timing.draw_sleep(&mut self.rng);
        options.push((4, Action::Sleep(sleep)));
        if idle && !holds {
            let stale_term = self.rng.random_bool(0.05);
            options.push((
                8,
                Action::Boot {
                    process,
                    stale_term,
                },
            ));
        }
        if idle && holds {
            options.push((8, Action::Refresh(process)));
            options.push((1, Action::Release(process)));
        }
        if idle && holds && claimed {
            options.push((8, Action::Publish(process)));
        }
        pick(&mut self.rng, options)
    }

    async fn perform(&mut self, action: Action) {
        match action {
            Action::Boot {
                process,
                stale_term,
            } => self.boot(process, stale_term),
            Action::Refresh(process) => {
                let lease = self.processes[process].lease.clone().expect("holds");
                self.spawn(
                    process,
                    async move { TaskEnd::Refreshed(lease.refresh().await) },
                );
            }
            Action::Publish(process) => self.publish(process),
            Action::Release(process) => {
                let lease = self.processes[process].lease.clone().expect("holds");
                self.spawn(
                    process,
                    async move { TaskEnd::Released(lease.release().await) },
                );
            }
            Action::Crash(process) => self.crash(process),
            Action::Skew { process, skew_ms } => self.processes[process].clock.set_skew(skew_ms),
            Action::Fault { process } => self.fault(process),
            Action::Clear(Some(process)) => self.processes[process].faults.clear(),
            Action::Clear(None) => self.control.faults.clear(),
            Action::NewTerm => self.term = Term(self.term.0 + 1),
            Action::Sleep(duration) => tokio::time::sleep(duration).await,
        }
    }

    fn spawn(&mut self, process: usize, task: impl Future<Output = TaskEnd> + Send + 'static) {
        self.processes[process].task = Some(tokio::spawn(task));
    }

    /// A new incarnation of `process`: observe HEAD, acquire, claim.
    fn boot(&mut self, process: usize, stale_term: bool) {
        let term = if stale_term && self.term.0 > 1 {
            Term(self.term.0 - 1)
        } else {
            self.term
        };
        let slot = &mut self.processes[process];
        slot.incarnation += 1;
        let name = if self.rng.random_ratio(1, 3) {
            "shared".to_owned()
        } else {
            format!("p{process}-{}", slot.incarnation)
        };
        let holder = HolderId::new(&name).expect("a valid holder id");
        let contender = Contender::with_incarnation(holder, Incarnation(self.rng.random()));
        let (leases, snapshots) = (slot.leases.clone(), slot.snapshots.clone());
        let initial = self.snapshot_bytes(process);
        let publisher = chorus::snapshot::PublisherId(self.rng.random());
        self.spawn(process, async move {
            let mut publication = snapshots.publication_as(publisher);
            if let Err(error) = publication.observe_for_boot().await {
                return TaskEnd::Booted(Err(format!("observe: {error}")));
            }
            let lease = match leases.acquire(&contender, term).await {
                Ok(lease) => lease,
                Err(error) => return TaskEnd::Booted(Err(format!("acquire: {error}"))),
            };
            let claimed = publication
                .claim(&lease, Some(initial))
                .await
                .map(|outcome| outcome.head().clone());
            TaskEnd::Booted(Ok((lease, publication, claimed)))
        });
    }

    fn snapshot_bytes(&mut self, process: usize) -> NewSnapshot {
        let length = self.rng.random_range(0..=256);
        let mut bytes = format!("p{process}.s{}.", self.step).into_bytes();
        bytes.resize(bytes.len() + length, self.rng.random());
        NewSnapshot {
            bytes: Bytes::from(bytes),
            wal_index: RecordIndex(self.step),
        }
    }

    fn publish(&mut self, process: usize) {
        let snapshot = self.snapshot_bytes(process);
        let slot = &mut self.processes[process];
        let lease = slot.lease.clone().expect("holds");
        let Some(mut publication) = slot.publication.take() else {
            return;
        };
        self.spawn(process, async move {
            let outcome = publication.publish(&lease, snapshot).await;
            TaskEnd::Published(publication, outcome)
        });
    }

    fn crash(&mut self, process: usize) {
        let slot = &mut self.processes[process];
        if let Some(task) = slot.task.take() {
            task.abort();
        }
        slot.lease = None;
        slot.publication = None;
        slot.claimed = false;
    }

    /// Adds a fault rule to the shared store or one process's view of it.
    /// Corruption hits payloads, `HEAD.json` and `lease.json` alike (the
    /// documents' checksums turn a flipped bit into a clear error).
    fn fault(&mut self, process: Option<usize>) {
        let rule = draw_store_rule(&mut self.rng);
        let text = RuleLabel(&rule).to_string();
        match process {
            Some(process) => {
                self.processes[process].faults.add(rule.times(20));
                self.event(format!("lease fault p{process}: {text}"));
            }
            None => {
                self.control.faults.add(rule.times(20));
                self.event(format!("lease fault store: {text}"));
            }
        }
    }

    /// Collects finished operations and runs every checker.
    fn observe(&mut self) -> Result<(), Violation> {
        for process in 0..PROCESSES {
            let finished = self.processes[process]
                .task
                .as_mut()
                .and_then(|task| task.now_or_never());
            if let Some(joined) = finished {
                self.processes[process].task = None;
                match joined {
                    Ok(end) => self.on_end(process, end)?,
                    Err(error) if error.is_cancelled() => {}
                    Err(error) => return Err(format!("lease task panicked: {error}")),
                }
            }
        }
        if let Some(panic) = crate::runner::take_panics().first() {
            return Err(format!("panic in the system under test: {panic}"));
        }
        self.check_exclusivity()?;
        self.checker
            .check(&self.control.raw, self.control.take_dirty())
    }

    fn on_end(&mut self, process: usize, end: TaskEnd) -> Result<(), Violation> {
        match end {
            TaskEnd::Booted(Ok((lease, publication, claimed))) => {
                self.on_boot(process, lease, publication, claimed)
            }
            TaskEnd::Booted(Err(error)) => {
                self.event(format!("lease p{process} boot: {error}"));
                Ok(())
            }
            TaskEnd::Refreshed(outcome) | TaskEnd::Released(outcome) => {
                self.event(format!(
                    "lease p{process} refresh/release: {}",
                    outcome_text(&outcome)
                ));
                // A lost or released lease steps the process down.
                let slot = &mut self.processes[process];
                if slot
                    .lease
                    .as_ref()
                    .is_some_and(|lease| !lease.may_write(slot.clock.now()))
                {
                    slot.lease = None;
                    slot.publication = None;
                    slot.claimed = false;
                }
                Ok(())
            }
            TaskEnd::Published(publication, outcome) => {
                self.processes[process].publication = Some(publication);
                let lease = self.processes[process].lease.clone().expect("holds");
                if let Ok(head) = &outcome {
                    self.published = Some(head.clone());
                }
                let head = outcome.as_ref().ok();
                self.on_stamped(
                    process,
                    "publish",
                    &lease,
                    outcome.as_ref().map(|_| ()),
                    head,
                )
            }
        }
    }

    fn on_boot(
        &mut self,
        process: usize,
        lease: LeaseHolder,
        publication: PublicationStore,
        claimed: Result<Head, SnapshotError>,
    ) -> Result<(), Violation> {
        let lease = Arc::new(lease);
        self.event(format!("lease p{process} acquired {}", lease.token()));
        self.checker.acquired(lease.token())?;
        let head = claimed.as_ref().ok();
        self.on_stamped(process, "claim", &lease, claimed.as_ref().map(|_| ()), head)?;
        let slot = &mut self.processes[process];
        slot.claimed = head.is_some();
        slot.publication = Some(publication);
        slot.lease = Some(lease);
        Ok(())
    }

    /// S4: a successful claim or publication is stamped with `lease`.
    fn on_stamped(
        &mut self,
        process: usize,
        what: &str,
        lease: &LeaseHolder,
        outcome: Result<(), &SnapshotError>,
        head: Option<&Head>,
    ) -> Result<(), Violation> {
        match (outcome, head) {
            (Ok(()), Some(head)) => {
                self.event(format!(
                    "lease p{process} {what} ok: sequence {} token {} payload {}",
                    head.publication_sequence.0,
                    head.lease_token(),
                    head.snapshot_key()
                ));
                if head.lease_token() != lease.token() {
                    return Err(format!(
                        "stamp: p{process}'s {what} succeeded with HEAD stamped {} but its lease is {}",
                        head.lease_token(),
                        lease.token()
                    ));
                }
                Ok(())
            }
            (Err(error), _) => {
                self.event(format!("lease p{process} {what}: {error}"));
                Ok(())
            }
            (Ok(()), None) => unreachable!("a success carries its HEAD"),
        }
    }

    /// L1: at most one holder may write while the clocks agree.
    fn check_exclusivity(&self) -> Result<(), Violation> {
        if !self.timing.clocks_agree() {
            return Ok(());
        }
        let writers: Vec<String> = self
            .processes
            .iter()
            .enumerate()
            .filter_map(|(process, slot)| {
                let lease = slot.lease.as_ref()?;
                lease
                    .may_write(slot.clock.now())
                    .then(|| format!("p{process} {}", lease.token()))
            })
            .collect();
        if writers.len() > 1 {
            return Err(format!(
                "exclusivity: {} holders may write at once with clocks within the safety \
                 margin: {}",
                writers.len(),
                writers.join(", ")
            ));
        }
        Ok(())
    }

    async fn liveness(&mut self) -> Result<(), Violation> {
        self.event("lease liveness: healing, clocks agree, every process crashed");
        self.control.faults.clear();
        for process in 0..PROCESSES {
            self.crash(process);
            self.processes[process].faults.clear();
            self.processes[process].clock.set_skew(0);
        }
        for _ in 0..LIVENESS_BOOTS {
            self.step += 1;
            self.boot(0, false);
            while self.processes[0].task.is_some() {
                tokio::time::sleep(Duration::from_millis(10)).await;
                self.observe()?;
            }
            if self.processes[0].claimed {
                return self.liveness_publish().await;
            }
            tokio::time::sleep(self.timing.config.ttl / 2).await;
        }
        Err(format!(
            "lease liveness: no boot acquired and claimed in {LIVENESS_BOOTS} attempts after healing"
        ))
    }

    async fn liveness_publish(&mut self) -> Result<(), Violation> {
        self.published = None;
        self.publish(0);
        while self.processes[0].task.is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
            self.observe()?;
        }
        match (&self.published, &self.checker.head) {
            (Some(published), Some(head)) if published == head => Ok(()),
            (published, head) => Err(format!(
                "lease liveness: after healing, a publication did not become HEAD: \
                 published {:?}, HEAD {:?}",
                published
                    .as_ref()
                    .map(|h| (h.lease_token(), h.publication_sequence)),
                head.as_ref()
                    .map(|h| (h.lease_token(), h.publication_sequence))
            )),
        }
    }
}

fn outcome_text(outcome: &Result<(), LeaseError>) -> String {
    match outcome {
        Ok(()) => "ok".into(),
        Err(error) => error.to_string(),
    }
}

/// Checkers L2, S1–S3 over the raw store; see the module docs. The runtime
/// phase runs them too.
pub(crate) struct LeaseChecker {
    leases: LeaseStore,
    snapshots: SnapshotStore,
    payloads: String,
    lease: Option<LeaseRecord>,
    generations: BTreeMap<Generation, (HolderId, Option<Incarnation>)>,
    head: Option<Head>,
    payload_bytes: BTreeMap<String, Bytes>,
    acquired: Vec<FencingToken>,
}

impl LeaseChecker {
    /// A checker of `database` in `raw`.
    pub(crate) fn new(
        raw: &DynBlobStore,
        database: &DatabaseKey,
        config: LeaseConfig,
        origin: Instant,
    ) -> Self {
        let clock: DynClock = Arc::new(SimClock::new(origin));
        let leases = LeaseStore::new(raw.clone(), database.clone(), config, clock.clone())
            .expect("valid lease settings");
        let snapshots = SnapshotStore::new(
            raw.clone(),
            database.clone(),
            SnapshotConfig::default(),
            clock,
        );
        LeaseChecker {
            leases,
            snapshots,
            payloads: payload_prefix(database),
            lease: None,
            generations: BTreeMap::new(),
            head: None,
            payload_bytes: BTreeMap::new(),
            acquired: Vec::new(),
        }
    }

    /// HEAD as the last check saw it.
    pub(crate) fn head(&self) -> Option<&Head> {
        self.head.as_ref()
    }

    /// Fencing tokens of successful acquisitions never repeat.
    fn acquired(&mut self, token: FencingToken) -> Result<(), Violation> {
        if self.acquired.contains(&token) {
            return Err(format!("lease history: token {token} was acquired twice"));
        }
        self.acquired.push(token);
        Ok(())
    }

    /// L2 and S1–S3 after a step; `dirty` are the keys written since the
    /// last check.
    pub(crate) fn check(
        &mut self,
        raw: &DynBlobStore,
        dirty: std::collections::BTreeSet<String>,
    ) -> Result<(), Violation> {
        self.check_lease()?;
        self.check_head(raw)?;
        let payloads = self.payloads.clone();
        for key in dirty.into_iter().filter(|key| key.starts_with(&payloads)) {
            self.check_payload(raw, key)?;
        }
        Ok(())
    }

    /// L2.
    fn check_lease(&mut self) -> Result<(), Violation> {
        let read = self
            .leases
            .read()
            .now_or_never()
            .expect("raw stores answer at once");
        let record = read.map_err(|error| format!("lease document: {error}"))?;
        let Some(record) = record else { return Ok(()) };
        if let Some(last) = &self.lease
            && record.token() < last.token()
        {
            return Err(format!(
                "lease history: token went from {} to {}",
                last.token(),
                record.token()
            ));
        }
        let acquirer = (record.holder_id.clone(), record.incarnation);
        let first = self
            .generations
            .entry(record.generation)
            .or_insert_with(|| acquirer.clone());
        if *first != acquirer {
            return Err(format!(
                "lease history: generation {} changed hands from {} ({:?}) to {} ({:?})",
                record.generation, first.0, first.1, acquirer.0, acquirer.1
            ));
        }
        self.lease = Some(record);
        Ok(())
    }

    /// S1 and S2.
    fn check_head(&mut self, raw: &DynBlobStore) -> Result<(), Violation> {
        let read = self
            .snapshots
            .read_head()
            .now_or_never()
            .expect("raw stores answer at once");
        let head = read.map_err(|error| format!("HEAD: {error}"))?;
        let Some(head) = head.map(|versioned| versioned.head) else {
            return Ok(());
        };
        if self.head.as_ref() == Some(&head) {
            return Ok(());
        }
        if let Some(last) = &self.head {
            let moved_on = head.publication_sequence > last.publication_sequence
                && head.lease_token() >= last.lease_token();
            if !moved_on {
                return Err(format!(
                    "HEAD history: sequence {} token {} after sequence {} token {}",
                    head.publication_sequence.0,
                    head.lease_token(),
                    last.publication_sequence.0,
                    last.lease_token()
                ));
            }
        }
        let payload = raw_bytes(raw, &head.snapshot_key())?;
        let intact = payload.as_ref().is_some_and(|bytes| {
            bytes.len() as u64 == head.payload_size_bytes
                && Sha256Digest::of(bytes) == head.payload_sha256
        });
        if !intact {
            return Err(format!(
                "HEAD names {} but the payload is {}",
                head.snapshot_key(),
                payload.map_or("missing".into(), |bytes| label(&bytes))
            ));
        }
        self.head = Some(head);
        Ok(())
    }

    /// S3.
    fn check_payload(&mut self, raw: &DynBlobStore, key: String) -> Result<(), Violation> {
        let Some(bytes) = raw_bytes(raw, &key)? else {
            return Ok(());
        };
        match self.payload_bytes.get(&key) {
            Some(first) if *first != bytes => Err(format!(
                "payload {key} was overwritten: {} became {}",
                label(first),
                label(&bytes)
            )),
            Some(_) => Ok(()),
            None => {
                self.payload_bytes.insert(key, bytes);
                Ok(())
            }
        }
    }
}
