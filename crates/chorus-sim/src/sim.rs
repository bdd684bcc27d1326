//! The driver: one seeded run of a safety phase (random actions and faults,
//! every checker after every step) followed by a liveness phase (every fault
//! healed; a fresh recovery must succeed, an append must commit and a reader
//! must read everything back).

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use chorus::ids::Epoch;
use futures::FutureExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::actors::{
    CommitNotice, MaintenanceTask, PendingAppend, ReadOutcome, ReaderSlot, RecoveryEnd,
    RecoveryTask, WriterSlot,
};
use crate::check::{RESYNC_EVERY_STEPS, StoreChecker};
use crate::faults::Expiring;
use crate::model::{Model, Violation, WriterId};
use crate::params::Params;
use crate::trace::{Trace, label};
use crate::world::World;

/// Recoveries the liveness phase tries before declaring no progress.
const LIVENESS_RECOVERY_ATTEMPTS: u32 = 3;
/// How long (virtual) one liveness recovery, or the final append, may take.
const LIVENESS_DEADLINE: Duration = Duration::from_secs(600);
/// Records the liveness phase appends and waits for.
const LIVENESS_APPENDS: u64 = 3;
/// The runtime phase runs this fraction of the safety phase's steps.
const RUNTIME_STEPS_DIVISOR: u64 = 4;

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct SimOptions {
    /// The seed: the run is a pure function of it and `steps`.
    pub seed: u64,
    /// Steps of the safety phase.
    pub steps: u64,
    /// Print every trace event to stderr.
    pub verbose: bool,
}

/// Counters of what a run exercised.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct Stats {
    pub admitted: u64,
    pub refused: u64,
    pub acked: u64,
    pub zombie_acks: u64,
    pub ambiguous: u64,
    pub not_committed: u64,
    pub recoveries_started: u64,
    pub recoveries_committed: u64,
    pub recoveries_failed: u64,
    pub recoveries_aborted: u64,
    pub writers_started: u64,
    pub writers_crashed: u64,
    pub reads: u64,
    pub records_read: u64,
    pub read_errors: u64,
    pub faults_added: u64,
    pub outages: u64,
    pub maintenance_passes: u64,
    pub floor_raised: u64,
    pub rotted: u64,
    /// What the runtime phase exercised.
    pub runtime: crate::runtime::RuntimeStats,
}

/// Why a run failed.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The step at which a checker fired.
    pub step: u64,
    /// What broke.
    pub message: String,
    /// The last trace events before it.
    pub recent: Vec<String>,
}

/// The result of one run.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The seed.
    pub seed: u64,
    /// The run's parameters, for the report.
    pub params: String,
    /// Steps executed (safety and liveness).
    pub steps_run: u64,
    /// Digest of the event trace.
    pub digest: [u8; 32],
    /// Events in the trace.
    pub events: u64,
    /// Virtual time the run took.
    pub virtual_time: Duration,
    /// What the run exercised.
    pub stats: Stats,
    /// The first violation, if any.
    pub failure: Option<Failure>,
}

/// What the checkers learned of one committed recovery view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CommittedView {
    epoch: Epoch,
    /// The view's floor: where its replay starts.
    floor: u64,
    /// Where the checked content starts: the floor, unless a truncation
    /// deleted segments of the view before the checkers ever verified them.
    checked_from: u64,
    /// The recovered end.
    end: u64,
}

/// The state of one run.
pub struct Sim {
    pub(crate) options: SimOptions,
    pub(crate) params: Params,
    pub(crate) rng: StdRng,
    pub(crate) world: World,
    pub(crate) model: Model,
    pub(crate) checker: StoreChecker,
    pub(crate) trace: Trace,
    pub(crate) origin: Instant,
    pub(crate) step: u64,
    pub(crate) writers: Vec<WriterSlot>,
    pub(crate) current: Option<WriterId>,
    pub(crate) pending: Vec<PendingAppend>,
    pub(crate) recoveries: Vec<RecoveryTask>,
    pub(crate) notices: mpsc::UnboundedSender<CommitNotice>,
    notice_receiver: mpsc::UnboundedReceiver<CommitNotice>,
    /// Recovery tasks whose view committed.
    committed: BTreeMap<u64, CommittedView>,
    pub(crate) readers: Vec<ReaderSlot>,
    pub(crate) maintenance: Vec<MaintenanceTask>,
    pub(crate) next_id: u64,
    pub(crate) stats: Stats,
    /// Fault rules and replica outages, with the step they end at.
    pub(crate) expiring: Expiring,
    /// The writer the most recent successful start produced, with its task.
    last_started: Option<(u64, WriterId)>,
    /// Virtual time of the phases run so far (each runtime has its own clock).
    virtual_time: Duration,
}

impl Sim {
    /// Builds the cluster for `options` (inside the paused runtime).
    pub async fn new(options: SimOptions) -> Sim {
        let mut rng = StdRng::seed_from_u64(options.seed);
        let params = Params::draw(&mut rng);
        let world = World::new(params.replicas, params.window, || rng.random()).await;
        let (notices, notice_receiver) = mpsc::unbounded_channel();
        let mut trace = Trace::new(options.verbose);
        trace.event(0, Duration::ZERO, format!("params {params}"));
        Sim {
            checker: StoreChecker::new(params.replicas),
            options,
            params,
            rng,
            world,
            model: Model::default(),
            trace,
            origin: Instant::now(),
            step: 0,
            writers: Vec::new(),
            current: None,
            pending: Vec::new(),
            recoveries: Vec::new(),
            notices,
            notice_receiver,
            committed: BTreeMap::new(),
            readers: Vec::new(),
            maintenance: Vec::new(),
            next_id: 0,
            stats: Stats::default(),
            expiring: Expiring::default(),
            last_started: None,
            virtual_time: Duration::ZERO,
        }
    }

    /// Runs the log phases (safety, then liveness) and then the lease phase,
    /// inside the paused runtime the run was built in. If they pass, the
    /// runner goes on with [`run_runtime_phase`](Sim::run_runtime_phase) on
    /// a runtime of its own, then [`finish`](Sim::finish)es.
    pub async fn run_log_and_lease(&mut self) -> Result<(), Violation> {
        let outcome = match self.safety_phase().await {
            Ok(()) => self.liveness_phase().await,
            Err(violation) => Err(violation),
        };
        let outcome = match outcome {
            Ok(()) => self.lease_phase().await,
            Err(violation) => Err(violation),
        };
        self.virtual_time = self.origin.elapsed();
        outcome
    }

    /// The runtime phase (`runtime/`): key-value runtimes as primaries
    /// and standbys over a fresh database, with its own generator (like the
    /// lease phase). Runs on an `executor::GatedRuntime`, whose scheduler
    /// settings keep the runtime's blocking-pool work deterministic; the log
    /// phases' objects stay idle meanwhile.
    pub async fn run_runtime_phase(&mut self) -> Result<(), Violation> {
        let started = Instant::now();
        let steps = self.options.steps / RUNTIME_STEPS_DIVISOR;
        let phase = crate::runtime::RuntimePhase::new(self.options.seed, &mut self.trace).await;
        let (outcome, stats) = phase.run(steps).await;
        self.stats.runtime = stats;
        self.virtual_time += started.elapsed();
        outcome.map_err(|violation| format!("runtime phase: {violation}"))
    }

    /// The report of a run that ended with `outcome`.
    pub fn finish(mut self, outcome: Result<(), Violation>) -> RunReport {
        let failure = outcome.err().map(|message| Failure {
            step: self.step,
            message,
            recent: self.trace.recent(),
        });
        let virtual_time = self.virtual_time;
        self.trace.event(self.step, virtual_time, "end");
        self.stats.floor_raised = self.checker.floor_raises();
        RunReport {
            seed: self.options.seed,
            params: self.params.to_string(),
            steps_run: self.step,
            digest: self.trace.digest(),
            events: self.trace.events(),
            virtual_time,
            stats: self.stats.clone(),
            failure,
        }
    }

    /// Records a trace event now.
    pub(crate) fn event(&mut self, what: impl std::fmt::Display) {
        let now = self.origin.elapsed();
        self.trace.event(self.step, now, what);
    }

    /// A fresh id for a writer, recovery or reader.
    pub(crate) fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    async fn safety_phase(&mut self) -> Result<(), Violation> {
        for _ in 0..self.options.steps {
            self.step += 1;
            self.expiring.expire(self.step, &self.world.replica_faults);
            self.act().await?;
            let settle = if self.rng.random_bool(0.9) {
                self.rng.random_range(0..=5)
            } else {
                self.rng.random_range(5..=200)
            };
            tokio::time::sleep(Duration::from_millis(settle)).await;
            self.observe()?;
        }
        Ok(())
    }

    /// Collects everything that happened and runs every checker.
    pub(crate) fn observe(&mut self) -> Result<(), Violation> {
        self.checker.refresh(&self.world)?;
        while let Ok(notice) = self.notice_receiver.try_recv() {
            self.on_commit(notice)?;
        }
        self.poll_completions()?;
        self.poll_readers()?;
        self.poll_recoveries()?;
        self.poll_maintenance()?;
        let panics = crate::runner::take_panics();
        if let Some(panic) = panics.first() {
            return Err(format!("panic in the system under test: {panic}"));
        }
        let manifest = self.checker.check_register(&self.world)?;
        let fresh = self.model.take_fresh();
        self.checker
            .check_durability(&manifest, &self.model, &fresh)?;
        if self.step.is_multiple_of(RESYNC_EVERY_STEPS) {
            self.checker.resync(&self.world)?;
        }
        Ok(())
    }

    fn on_commit(&mut self, notice: CommitNotice) -> Result<(), Violation> {
        let started_at = self
            .recoveries
            .iter()
            .find(|task| task.id == notice.task)
            .map(|task| task.started_at)
            .expect("commit notices come from known tasks");
        let floor = notice.manifest.trunc.0;
        let end = notice.manifest.tail_base.0;
        if floor > end {
            return Err(format!(
                "truncation: the view of epoch {} ends at {end}, below its floor {floor}",
                notice.epoch
            ));
        }
        let current = self.checker.check_register(&self.world)?;
        let (checked_from, content) = self.checker.content(&notice.manifest, current.trunc.0)?;
        self.event(format!(
            "recovery {} committed epoch {} floor {floor} end {end} tail {}",
            notice.task, notice.epoch, notice.manifest.tail
        ));
        self.stats.recoveries_committed += 1;
        let view = CommittedView {
            epoch: notice.epoch,
            floor,
            checked_from,
            end,
        };
        self.committed.insert(notice.task, view);
        self.model
            .recovered(notice.epoch, checked_from, &content, started_at)
    }

    fn poll_completions(&mut self) -> Result<(), Violation> {
        let mut unresolved = std::collections::BTreeSet::new();
        for mut append in std::mem::take(&mut self.pending) {
            let Some(outcome) = (&mut append.completion).now_or_never() else {
                unresolved.insert(append.writer);
                self.pending.push(append);
                continue;
            };
            self.on_outcome(&append, outcome, unresolved.contains(&append.writer))?;
        }
        Ok(())
    }

    fn on_outcome(
        &mut self,
        append: &PendingAppend,
        outcome: Result<chorus::log::Receipt, chorus::log::LogError>,
        earlier_unresolved: bool,
    ) -> Result<(), Violation> {
        let (writer, index, bytes) = (append.writer, append.index, &append.bytes);
        match outcome {
            Ok(receipt) => {
                if earlier_unresolved {
                    return Err(format!(
                        "order: writer {writer} acknowledged index {index} while an earlier \
                         append of it is unresolved"
                    ));
                }
                let superseded = self.is_superseded(writer);
                self.event(format!("ack w{writer} i{index} {}", label(bytes)));
                self.stats.acked += 1;
                self.stats.zombie_acks += u64::from(superseded);
                self.model.acked(writer, index, receipt.index.0, bytes)
            }
            Err(error) => {
                let may = error.may_have_committed();
                self.event(format!("fail w{writer} i{index} may={may} {error}"));
                if may {
                    self.stats.ambiguous += 1;
                } else {
                    self.stats.not_committed += 1;
                }
                self.model.failed(writer, index, bytes, may)
            }
        }
    }

    /// Whether a recovery of a higher epoch than `writer`'s has committed.
    fn is_superseded(&self, writer: WriterId) -> bool {
        let epoch = self.writer_slot(writer).epoch;
        self.model.last_recovered().is_some_and(|last| last > epoch)
    }

    pub(crate) fn writer_slot(&self, writer: WriterId) -> &WriterSlot {
        self.writers
            .iter()
            .find(|slot| slot.id == writer)
            .expect("known writer")
    }

    fn poll_readers(&mut self) -> Result<(), Violation> {
        for slot in 0..self.readers.len() {
            let Some(task) = self.readers[slot].task.as_mut() else {
                continue;
            };
            let Some(joined) = task.now_or_never() else {
                continue;
            };
            self.readers[slot].task = None;
            match joined {
                Ok(outcome) => self.on_read(slot, outcome)?,
                Err(error) if error.is_cancelled() => self.event(format!("read r{slot} aborted")),
                Err(error) => return Err(format!("reader task panicked: {error}")),
            }
        }
        Ok(())
    }

    fn on_read(&mut self, slot: usize, outcome: ReadOutcome) -> Result<(), Violation> {
        let ReadOutcome {
            reader,
            from,
            records,
            error,
            finished_at,
        } = outcome;
        // Stored bytes are damaged only where more than a quorum of valid
        // copies remain, and a segment deleted under the read by truncation
        // must come back as `Truncated`: a read that met no injected fault
        // has no reason to report corruption.
        if let Some(chorus::log::LogError::Corrupt { .. }) = &error {
            let injected = self.readers[slot].faults.injected_with(&self.world);
            if injected == self.readers[slot].injected_at_start {
                return Err(format!(
                    "reader r{slot} reported corruption at {} with no fault injected: {}",
                    reader.position(),
                    error.as_ref().map(ToString::to_string).unwrap_or_default()
                ));
            }
        }
        // A reader left behind by truncation moves up to the floor, as an
        // application restoring from a newer snapshot would.
        let reader = match &error {
            Some(chorus::log::LogError::Truncated { floor, .. }) => {
                self.event(format!("reader r{slot} truncated: moves to {floor}"));
                chorus::log::Reader::new(&self.readers[slot].stores, *floor)
            }
            _ => reader,
        };
        self.readers[slot].reader = Some(reader);
        self.stats.reads += 1;
        self.stats.records_read += records.len() as u64;
        for (offset, (index, bytes)) in records.iter().enumerate() {
            if index.0 != from + offset as u64 {
                return Err(format!(
                    "reader r{slot} returned index {index} at position {offset} of a read from {from}"
                ));
            }
            self.model.read(index.0, bytes, finished_at)?;
        }
        let error = error.map(|e| {
            self.stats.read_errors += 1;
            format!(" error: {e}")
        });
        self.event(format!(
            "read r{slot} from {from}: {} records{}",
            records.len(),
            error.unwrap_or_default()
        ));
        Ok(())
    }

    fn poll_recoveries(&mut self) -> Result<(), Violation> {
        for (task, joined) in take_finished(&mut self.recoveries, |task| &mut task.handle) {
            match joined {
                Ok(end) => self.on_recovery_end(&task, end)?,
                Err(error) if error.is_cancelled() => {
                    self.stats.recoveries_aborted += 1;
                    self.event(format!("recovery {} aborted", task.id));
                }
                Err(error) => return Err(format!("recovery task panicked: {error}")),
            }
        }
        Ok(())
    }

    fn poll_maintenance(&mut self) -> Result<(), Violation> {
        for (task, joined) in take_finished(&mut self.maintenance, |task| &mut task.handle) {
            match joined {
                Ok(outcome) => self.event(format!("maintenance m{} ended: {outcome}", task.id)),
                Err(error) if error.is_cancelled() => {
                    self.event(format!("maintenance m{} aborted", task.id));
                }
                Err(error) => return Err(format!("maintenance task panicked: {error}")),
            }
        }
        Ok(())
    }

    fn on_recovery_end(&mut self, task: &RecoveryTask, end: RecoveryEnd) -> Result<(), Violation> {
        match end {
            RecoveryEnd::Failed(error) => {
                self.stats.recoveries_failed += 1;
                self.event(format!("recovery {} failed: {error}", task.id));
                Ok(())
            }
            RecoveryEnd::ReplayFailed { epoch, error } => {
                self.event(format!(
                    "recovery {} epoch {epoch} replay failed: {error}",
                    task.id
                ));
                Ok(())
            }
            RecoveryEnd::Replayed {
                epoch,
                end,
                records,
                writer,
            } => {
                self.check_replay(task.id, epoch, end, &records)?;
                match writer {
                    Ok(writer) => self.adopt_writer(task, epoch, end, writer),
                    Err(error) => {
                        self.event(format!(
                            "recovery {} epoch {epoch} start failed: {error}",
                            task.id
                        ));
                    }
                }
                Ok(())
            }
        }
    }

    /// Checker 2 on the replay stream itself: dense from the view's floor and
    /// identical to the content the checkers derived from the raw stores (and
    /// below where that starts, to every record known there).
    fn check_replay(
        &mut self,
        task: u64,
        epoch: Epoch,
        end: u64,
        records: &[(chorus::ids::RecordIndex, Bytes)],
    ) -> Result<(), Violation> {
        let committed = self.committed.get(&task).copied();
        let Some(view) = committed.filter(|view| {
            view.epoch == epoch && view.end == end && view.floor + records.len() as u64 == end
        }) else {
            return Err(format!(
                "replay of epoch {epoch} returned {} records, end {end}, committed {committed:?}",
                records.len()
            ));
        };
        for (position, (index, bytes)) in records.iter().enumerate() {
            let known = self.model.committed_at(index.0);
            let agrees = known == Some(bytes) || (index.0 < view.checked_from && known.is_none());
            if index.0 != view.floor + position as u64 || !agrees {
                return Err(format!(
                    "replay of epoch {epoch} returned index {index} ({}) at position {position}, \
                     the recovered content differs",
                    label(bytes)
                ));
            }
        }
        self.event(format!(
            "recovery {task} epoch {epoch} replayed {end} records"
        ));
        Ok(())
    }

    fn adopt_writer(
        &mut self,
        task: &RecoveryTask,
        epoch: Epoch,
        end: u64,
        writer: chorus::log::Writer,
    ) {
        let id = self.fresh_id();
        self.model.writer_started(id, epoch, end);
        self.writers.push(WriterSlot {
            id,
            epoch,
            writer: Some(writer),
            faults: task.faults.clone(),
            sequence: 0,
        });
        self.stats.writers_started += 1;
        self.event(format!("writer w{id} started epoch {epoch} at {end}"));
        self.current = Some(id);
        self.last_started = Some((task.id, id));
        self.retire_zombies();
    }

    /// Keeps at most three superseded writers alive; older ones are dropped
    /// (a dropped writer drains briefly, then stops).
    fn retire_zombies(&mut self) {
        let current = self.current;
        let mut alive: Vec<usize> = (0..self.writers.len())
            .filter(|slot| {
                self.writers[*slot].writer.is_some() && Some(self.writers[*slot].id) != current
            })
            .collect();
        while alive.len() > 3 {
            let slot = alive.remove(0);
            self.writers[slot].writer = None;
            let id = self.writers[slot].id;
            self.event(format!("zombie w{id} dropped"));
        }
    }

    async fn liveness_phase(&mut self) -> Result<(), Violation> {
        self.event("liveness: healing every fault");
        self.heal_everything();
        for task in &self.recoveries {
            task.handle.abort();
        }
        for task in &self.maintenance {
            task.handle.abort();
        }
        for slot in &self.readers {
            if let Some(task) = &slot.task {
                task.abort();
            }
        }
        self.advance(Duration::from_secs(5)).await?;
        let writer = self.liveness_recovery().await?;
        self.liveness_append(writer).await?;
        self.liveness_read().await?;
        self.liveness_repair().await?;
        self.liveness_sweep().await?;
        self.checker.resync(&self.world)?;
        Ok(())
    }

    /// With every fault healed, one repair pass must leave every retained
    /// sealed segment valid on every replica, as verify then confirms, however
    /// the safety phase left them (rot, degraded seals, interrupted passes).
    async fn liveness_repair(&mut self) -> Result<(), Violation> {
        use chorus::log::maintenance::{Maintenance, NoProgress};
        let (stores, _faults) = self.world.view(|| 0);
        let maintenance = Maintenance::new(&stores);
        let repaired = maintenance
            .repair(&NoProgress)
            .await
            .map_err(|error| format!("liveness: repair failed after healing: {error}"))?;
        if !repaired.failures.is_empty() {
            return Err(format!(
                "liveness: repair after healing left failures: {:?}",
                repaired.failures
            ));
        }
        self.event(format!("liveness: {repaired:?}"));
        let verified = maintenance
            .verify(&NoProgress)
            .await
            .map_err(|error| format!("liveness: verify failed after healing: {error}"))?;
        if let Some(replica) = verified.replicas.iter().find(|r| r.has_problems()) {
            return Err(format!(
                "liveness: verify after a repair with every fault healed: {replica:?}"
            ));
        }
        self.observe()
    }

    /// With every writer stopped, an orphan sweep must leave only sealed
    /// objects the directory names (or a seal of the tail or pending
    /// segment): nothing a losing recovery, a late seal write or a repair
    /// that raced a truncation left behind may stay forever.
    async fn liveness_sweep(&mut self) -> Result<(), Violation> {
        use chorus::log::maintenance::{Maintenance, NoProgress};
        for slot in &mut self.writers {
            if let Some(writer) = slot.writer.take() {
                writer.abort();
            }
        }
        // Writes still in flight (delayed calls, seal copies past their
        // quorum) land meanwhile; the first sweep may miss them.
        self.advance(Duration::from_secs(30)).await?;
        let (stores, _faults) = self.world.view(|| 0);
        let maintenance = Maintenance::new(&stores);
        for _ in 0..2 {
            maintenance
                .sweep_orphans(&NoProgress)
                .await
                .map_err(|error| format!("liveness: sweep failed after healing: {error}"))?;
        }
        let manifest = maintenance
            .manifest()
            .await
            .map_err(|error| format!("liveness: {error}"))?;
        for (replica, store) in self.world.raw.iter().enumerate() {
            let listed = store
                .list(chorus::log::layout::SEALED_PREFIX)
                .await
                .map_err(|error| format!("liveness: {error}"))?;
            for meta in listed {
                let name = meta.key.rsplit('/').next().unwrap_or_default();
                let Ok((id, crc32c)) = chorus::codec::parse_sealed_key_name(name) else {
                    continue;
                };
                let named = manifest
                    .segments
                    .iter()
                    .any(|entry| entry.id == id && entry.crc32c == crc32c);
                let in_flight = id == manifest.tail || Some(id) == manifest.pending;
                if !named && !in_flight {
                    return Err(format!(
                        "liveness: {} on replica {replica} outlived the orphan sweep, \
                         but nothing names it",
                        meta.key
                    ));
                }
            }
        }
        self.observe()
    }

    /// The lease and snapshot phase (`lease.rs`), after every writer of the
    /// log phases was stopped. It draws from its own generator, so the log
    /// phases' schedule does not depend on it.
    async fn lease_phase(&mut self) -> Result<(), Violation> {
        for slot in &mut self.writers {
            if let Some(writer) = slot.writer.take() {
                writer.abort();
            }
        }
        let steps = self.options.steps / 2;
        crate::lease::LeasePhase::new(self.options.seed, &mut self.trace)
            .run(steps)
            .await
            .map_err(|violation| format!("lease phase: {violation}"))
    }

    fn heal_everything(&mut self) {
        self.world.heal();
        for slot in &self.writers {
            slot.faults.clear();
        }
        for task in &self.recoveries {
            task.faults.clear();
        }
        for task in &self.maintenance {
            task.faults.clear();
        }
        for slot in &self.readers {
            slot.faults.clear();
        }
    }

    /// Lets `duration` of virtual time pass in small steps, observing each.
    async fn advance(&mut self, duration: Duration) -> Result<(), Violation> {
        let step = Duration::from_millis(100);
        let deadline = Instant::now() + duration;
        while Instant::now() < deadline {
            self.step += 1;
            tokio::time::sleep(step).await;
            self.observe()?;
        }
        Ok(())
    }

    async fn liveness_recovery(&mut self) -> Result<WriterId, Violation> {
        for attempt in 1..=LIVENESS_RECOVERY_ATTEMPTS {
            let task = self.start_recovery();
            let deadline = Instant::now() + LIVENESS_DEADLINE;
            while self.recoveries.iter().any(|t| t.id == task) && Instant::now() < deadline {
                self.step += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                self.observe()?;
            }
            if let Some((started_by, writer)) = self.last_started
                && started_by == task
            {
                return Ok(writer);
            }
            self.event(format!(
                "liveness: recovery attempt {attempt} made no writer"
            ));
        }
        Err(format!(
            "liveness: no recovery started a writer in {LIVENESS_RECOVERY_ATTEMPTS} attempts \
             after every fault was healed"
        ))
    }

    /// Appends must be admitted (refusals are retried: after healing, every
    /// refusal is backpressure that has to clear) and then committed.
    async fn liveness_append(&mut self, writer: WriterId) -> Result<(), Violation> {
        let deadline = Instant::now() + LIVENESS_DEADLINE;
        let mut admitted = 0;
        while admitted < LIVENESS_APPENDS || self.pending.iter().any(|p| p.writer == writer) {
            if admitted < LIVENESS_APPENDS {
                admitted += self.append(writer, LIVENESS_APPENDS - admitted, false)?;
            }
            if Instant::now() >= deadline {
                break;
            }
            self.step += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            self.observe()?;
        }
        let acked = self.model.acked_by(writer);
        if acked < LIVENESS_APPENDS {
            return Err(format!(
                "liveness: {admitted} of {LIVENESS_APPENDS} appends admitted and {acked} \
                 committed within {LIVENESS_DEADLINE:?} after every fault was healed"
            ));
        }
        Ok(())
    }

    /// A fresh reader must read every record back, from the floor to the
    /// last ack.
    async fn liveness_read(&mut self) -> Result<(), Violation> {
        let (stores, _faults) = self.world.view(|| 0);
        let floor = self.floor();
        let reader = chorus::log::Reader::new(&stores, chorus::ids::RecordIndex(floor));
        let outcome = crate::actors::read_some(reader, usize::MAX, self.origin).await;
        if let Some(error) = &outcome.error {
            return Err(format!("liveness: a reader failed after healing: {error}"));
        }
        let read = floor + outcome.records.len() as u64;
        let needed = self.model.committed_end();
        if read < needed {
            return Err(format!(
                "liveness: a reader from the floor {floor} read up to {read}, {needed} are committed"
            ));
        }
        self.readers.push(ReaderSlot {
            stores,
            faults: _faults,
            reader: None,
            task: None,
            injected_at_start: 0,
        });
        let slot = self.readers.len() - 1;
        self.on_read(slot, outcome)?;
        self.observe()
    }
}

/// Removes the tasks whose handle has finished, in order, with how each ended.
fn take_finished<T, R>(
    tasks: &mut Vec<T>,
    handle: impl Fn(&mut T) -> &mut tokio::task::JoinHandle<R>,
) -> Vec<(T, Result<R, tokio::task::JoinError>)> {
    let mut finished = Vec::new();
    let mut index = 0;
    while index < tasks.len() {
        match handle(&mut tasks[index]).now_or_never() {
            Some(joined) => finished.push((tasks.remove(index), joined)),
            None => index += 1,
        }
    }
    finished
}
