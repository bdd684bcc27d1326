//! The schedule: choosing the next action of the safety phase from the
//! seeded generator, and performing it. Every action is a decision of the
//! simulated application or of the environment; none waits, except `Sleep`.
//!
//! Extension points: new actors become more [`Action`] variants here, with
//! their checkers in `check.rs` / `model.rs`.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use chorus::blob::{FaultController, FaultRule};
use chorus::ids::OwnerId;
use chorus::log::{LogError, Reader};
use rand::Rng;

use crate::actors::{
    MaintenanceTask, Pass, PendingAppend, ReaderSlot, RecoveryTask, floor_between, maintain,
    read_some, recover,
};
use crate::faults::{RuleLabel, draw_register_rule, draw_store_rule};
use crate::model::{Violation, WriterId};
use crate::sim::Sim;
use crate::world::ActorFaults;

/// Readers the simulation runs at most.
const MAX_READERS: usize = 3;
/// Recoveries running at once at most.
const MAX_RECOVERIES: usize = 3;
/// Maintenance passes running at once at most.
const MAX_MAINTENANCE: usize = 2;

/// One step of the schedule.
#[derive(Debug, Clone)]
enum Action {
    /// Append a burst to a writer (the current one or a zombie).
    Append { writer: WriterId, count: u64 },
    /// Start a recovery (a new writer incarnation).
    Recover,
    /// Start two recoveries at once.
    RacingRecoveries,
    /// Kill a recovery at whatever await point it is at.
    AbortRecovery(usize),
    /// Crash a writer: abort it, or drop its handle.
    CrashWriter { writer: WriterId, abort: bool },
    /// Shut a writer down gracefully, with a deadline.
    Shutdown { writer: WriterId, timeout: Duration },
    /// Let a reader read up to `max` records.
    Read { slot: usize, max: usize },
    /// Start another reader (or replace one) at a known index.
    NewReader,
    /// Add a fault rule to a replica, or to one actor's view of it.
    StoreFault,
    /// Add a fault rule to the register, everyone's or one actor's.
    RegisterFault,
    /// Toggle an outage of one replica.
    Outage(usize),
    /// Remove the rules of one controller.
    Clear,
    /// The application drops some completions without awaiting them.
    DropCompletions,
    /// Ask a writer to truncate `fraction` of the way from the floor to the
    /// known-committed end, giving up after `timeout`.
    Truncate {
        writer: WriterId,
        fraction: f64,
        timeout: Duration,
    },
    /// Start a maintenance pass as a process of its own.
    Maintain(Pass),
    /// Kill a maintenance pass at whatever await point it is at.
    AbortMaintenance(usize),
    /// Damage one stored sealed copy that more than Q replicas hold validly:
    /// flip a bit of it, or delete it.
    Rot { delete: bool },
    /// Let time pass.
    Sleep(Duration),
}

impl Sim {
    /// Chooses and performs the next action.
    pub(crate) async fn act(&mut self) -> Result<(), Violation> {
        let action = self.choose();
        self.event(format!("do {action:?}"));
        self.perform(action).await
    }

    fn alive_writers(&self) -> Vec<WriterId> {
        self.writers
            .iter()
            .filter(|slot| slot.writer.is_some())
            .map(|slot| slot.id)
            .collect()
    }

    fn choose(&mut self) -> Action {
        let alive = self.alive_writers();
        let zombies: Vec<WriterId> = alive
            .iter()
            .copied()
            .filter(|w| Some(*w) != self.current)
            .collect();
        let current = self.current.filter(|w| alive.contains(w));
        let recovering = self.recoveries.len();
        let idle = current.is_none() && recovering == 0;
        let mut options: Vec<(u32, Action)> = Vec::new();
        let count = self.draw_burst();
        if let Some(writer) = current {
            options.push((30, Action::Append { writer, count }));
        }
        if !zombies.is_empty() {
            let writer = zombies[self.rng.random_range(0..zombies.len())];
            options.push((6, Action::Append { writer, count }));
        }
        if recovering < MAX_RECOVERIES {
            options.push((if idle { 20 } else { 3 }, Action::Recover));
        }
        if recovering + 1 < MAX_RECOVERIES {
            options.push((2, Action::RacingRecoveries));
        }
        if recovering > 0 {
            let task = self.rng.random_range(0..recovering);
            options.push((3, Action::AbortRecovery(task)));
        }
        if !alive.is_empty() {
            let writer = current.unwrap_or(alive[0]);
            let fraction = self.draw_floor_fraction();
            let timeout = Duration::from_millis(self.rng.random_range(10..=3000));
            options.push((
                2,
                Action::Truncate {
                    writer,
                    fraction,
                    timeout,
                },
            ));
            let abort = self.rng.random_bool(0.5);
            options.push((3, Action::CrashWriter { writer, abort }));
            let timeout = Duration::from_millis(self.rng.random_range(1..=2000));
            options.push((1, Action::Shutdown { writer, timeout }));
        }
        self.push_environment_options(&mut options);
        pick(&mut self.rng, options)
    }

    fn push_environment_options(&mut self, options: &mut Vec<(u32, Action)>) {
        let slot = self.rng.random_range(0..MAX_READERS);
        let max = if self.rng.random_bool(0.8) {
            self.rng.random_range(1..=16)
        } else {
            self.rng.random_range(16..=256)
        };
        options.push((10, Action::Read { slot, max }));
        options.push((1, Action::NewReader));
        let intensity = self.params.fault_intensity;
        options.push((2 * intensity, Action::StoreFault));
        options.push((intensity, Action::RegisterFault));
        let replica = self.draw_outage_replica();
        options.push((intensity, Action::Outage(replica)));
        options.push((4, Action::Clear));
        if !self.pending.is_empty() {
            options.push((1, Action::DropCompletions));
        }
        self.push_maintenance_options(options);
        let sleep = if self.rng.random_bool(0.7) {
            self.rng.random_range(10..=500)
        } else {
            self.rng.random_range(500..=10_000)
        };
        options.push((4, Action::Sleep(Duration::from_millis(sleep))));
    }

    /// Where between the floor and the committed end a truncation aims:
    /// mostly low (the cube of a uniform draw, median 1/8), so floors creep up
    /// and most of the log stays under the checkers, sometimes up to the end.
    fn draw_floor_fraction(&mut self) -> f64 {
        self.rng.random::<f64>().powi(3)
    }

    fn push_maintenance_options(&mut self, options: &mut Vec<(u32, Action)>) {
        let running = self.maintenance.len();
        if running < MAX_MAINTENANCE {
            let pass = match self.rng.random_range(0..4) {
                0 => Pass::Truncate {
                    fraction: self.draw_floor_fraction(),
                },
                1 => Pass::Tombstones,
                2 => Pass::Repair,
                _ => Pass::Sweep,
            };
            options.push((3, Action::Maintain(pass)));
        }
        if running > 0 {
            let task = self.rng.random_range(0..running);
            options.push((1, Action::AbortMaintenance(task)));
        }
        let delete = self.rng.random_bool(0.5);
        options.push((self.params.fault_intensity, Action::Rot { delete }));
    }

    /// A replica to toggle: with more than N − Q replicas out, mostly one
    /// that is out, so that quorums come back often enough to make progress.
    fn draw_outage_replica(&mut self) -> usize {
        let out: Vec<usize> = (0..self.params.replicas)
            .filter(|r| self.world.replica_faults[*r].outage())
            .collect();
        let tolerated = self.params.replicas - chorus::log::quorum::quorum(self.params.replicas);
        if out.len() > tolerated && self.rng.random_bool(0.7) {
            out[self.rng.random_range(0..out.len())]
        } else {
            self.rng.random_range(0..self.params.replicas)
        }
    }

    fn draw_burst(&mut self) -> u64 {
        match self.rng.random_range(0..10) {
            0..=5 => self.rng.random_range(1..=3),
            6..=8 => self.rng.random_range(4..=16),
            _ => self.rng.random_range(16..=64),
        }
    }

    async fn perform(&mut self, action: Action) -> Result<(), Violation> {
        match action {
            Action::Append { writer, count } => {
                self.append(writer, count, true)?;
            }
            Action::Recover => {
                let id = self.start_recovery();
                self.split_views(id);
            }
            Action::RacingRecoveries => {
                for _ in 0..2 {
                    let id = self.start_recovery();
                    self.split_views(id);
                }
            }
            Action::AbortRecovery(task) => self.recoveries[task].handle.abort(),
            Action::CrashWriter { writer, abort } => self.crash(writer, abort),
            Action::Shutdown { writer, timeout } => self.shutdown(writer, timeout),
            Action::Read { slot, max } => self.read(slot, max),
            Action::NewReader => self.new_reader(),
            Action::StoreFault => self.store_fault(),
            Action::RegisterFault => self.register_fault(),
            Action::Outage(replica) => self.toggle_outage(replica),
            Action::Clear => self.clear_faults(),
            Action::DropCompletions => self.drop_completions()?,
            Action::Truncate {
                writer,
                fraction,
                timeout,
            } => self.truncate(writer, fraction, timeout).await,
            Action::Maintain(pass) => self.start_maintenance(pass),
            Action::AbortMaintenance(task) => self.maintenance[task].handle.abort(),
            Action::Rot { delete } => self.rot(delete),
            Action::Sleep(duration) => tokio::time::sleep(duration).await,
        }
        Ok(())
    }

    /// Appends up to `count` records to `writer`, stopping at the first
    /// refusal; with `may_drop`, the application sometimes drops a completion
    /// instead of keeping it. Returns how many were admitted.
    pub(crate) fn append(
        &mut self,
        writer: WriterId,
        count: u64,
        may_drop: bool,
    ) -> Result<u64, Violation> {
        for admitted in 0..count {
            let bytes = self.payload(writer);
            let slot = self
                .writers
                .iter()
                .position(|s| s.id == writer)
                .expect("known");
            let Some(handle) = self.writers[slot].writer.as_ref() else {
                return Ok(admitted);
            };
            match handle.append(bytes.clone()) {
                Ok(completion) => {
                    let index = completion.index().0;
                    self.model.admitted(writer, index, &bytes)?;
                    self.stats.admitted += 1;
                    self.pending.push(PendingAppend {
                        writer,
                        index,
                        bytes,
                        completion,
                    });
                    if may_drop && self.rng.random_bool(0.02) {
                        self.pending.pop();
                        self.model.dropped(writer, index);
                    }
                }
                Err(error) => return self.refused(writer, &error).map(|()| admitted),
            }
        }
        Ok(count)
    }

    fn refused(&mut self, writer: WriterId, error: &LogError) -> Result<(), Violation> {
        self.stats.refused += 1;
        self.event(format!("refused w{writer}: {error}"));
        if error.may_have_committed() {
            return Err(format!(
                "ambiguity: an admission refusal of writer {writer} says may_have_committed: {error}"
            ));
        }
        Ok(())
    }

    /// A unique payload naming its writer and sequence number, padded to a
    /// random length.
    fn payload(&mut self, writer: WriterId) -> Bytes {
        let slot = self
            .writers
            .iter_mut()
            .find(|s| s.id == writer)
            .expect("known");
        slot.sequence += 1;
        let name = format!("w{writer}.{}.", slot.sequence);
        let max = self.params.max_payload_bytes.max(name.len());
        let length = self.rng.random_range(name.len()..=max);
        let fill = self.rng.random::<u8>();
        let mut bytes = BytesMut::with_capacity(length);
        bytes.put_slice(name.as_bytes());
        bytes.put_bytes(fill, length - name.len());
        bytes.freeze()
    }

    /// Spawns a recovery with a fresh owner id and a view of its own.
    pub(crate) fn start_recovery(&mut self) -> u64 {
        let id = self.fresh_id();
        let rng = &mut self.rng;
        let (stores, faults) = self.world.view(|| rng.random());
        let owner = OwnerId(self.rng.random::<u128>().max(1));
        let handle = tokio::spawn(recover(
            id,
            stores,
            self.params.config.clone(),
            owner,
            self.notices.clone(),
        ));
        self.stats.recoveries_started += 1;
        self.recoveries.push(RecoveryTask {
            id,
            started_at: self.origin.elapsed(),
            faults,
            handle,
        });
        id
    }

    /// Sometimes gives the new recovery `task` and the writers it is about
    /// to supersede different views of the replicas: the recovery cannot
    /// reach one replica, and the current writer's requests to another land
    /// late. That is the race the window fences exist for: the old writer
    /// completing fragments the recovery could not see.
    fn split_views(&mut self, task: u64) {
        let replicas = self.params.replicas;
        if replicas == 1 || !self.rng.random_bool(0.3) {
            return;
        }
        let unreachable = self.rng.random_range(0..replicas);
        let recovery = &self.recoveries.last().expect("just started").faults;
        let controller = recovery.replicas[unreachable].clone();
        let cut = FaultRule::new(chorus::blob::Fault::FailBefore);
        self.add_expiring(
            &format!("recovery {task} replica {unreachable}"),
            controller,
            cut,
        );
        let Some(writer) = self.current else { return };
        let slow = (unreachable + self.rng.random_range(1..replicas)) % replicas;
        let controller = self.writer_slot(writer).faults.replicas[slow].clone();
        let delay = Duration::from_millis(self.rng.random_range(50..=2000));
        let rule = FaultRule::new(chorus::blob::Fault::DelayUpTo(delay))
            .ops(chorus::blob::OpSet::of(&[chorus::blob::Op::Create]));
        self.add_expiring(&format!("w{writer} replica {slow}"), controller, rule);
    }

    /// The application asks `writer` to truncate and waits up to `timeout`
    /// (then drops the request, cancelling it at whatever point it is).
    async fn truncate(&mut self, writer: WriterId, fraction: f64, timeout: Duration) {
        let floor = floor_between(self.floor(), self.model.committed_end(), fraction);
        let slot = self.writer_slot(writer);
        let Some(handle) = slot.writer.as_ref() else {
            return;
        };
        let outcome = tokio::time::timeout(
            timeout,
            handle.truncate_before(chorus::ids::RecordIndex(floor)),
        )
        .await;
        let outcome = match outcome {
            Ok(Ok(report)) => format!("{report:?}"),
            Ok(Err(error)) => format!("failed: {error}"),
            Err(_) => "gave up".to_owned(),
        };
        self.event(format!("truncate w{writer} to {floor}: {outcome}"));
    }

    /// The committed floor as the checkers last read it.
    pub(crate) fn floor(&self) -> u64 {
        self.checker.last_manifest().map_or(0, |m| m.trunc.0)
    }

    /// Spawns `pass` with a view of its own.
    fn start_maintenance(&mut self, pass: Pass) {
        let id = self.fresh_id();
        let rng = &mut self.rng;
        let (stores, faults) = self.world.view(|| rng.random());
        let handle = tokio::spawn(maintain(stores, pass));
        self.event(format!("maintenance m{id} starts {pass:?}"));
        self.stats.maintenance_passes += 1;
        self.maintenance.push(MaintenanceTask {
            id,
            pass,
            faults,
            handle,
        });
    }

    /// Damages a spare sealed copy, if there is one.
    fn rot(&mut self, delete: bool) {
        let Some(manifest) = self.checker.last_manifest() else {
            return;
        };
        let spare = self.checker.spare_sealed_copies(manifest);
        if spare.is_empty() {
            return;
        }
        let (replica, key) = &spare[self.rng.random_range(0..spare.len())];
        let bit = (!delete).then(|| self.rng.random::<u64>());
        self.world.rot(*replica, key, bit);
        self.stats.rotted += 1;
        let how = if delete {
            "deleted"
        } else {
            "flipped a bit of"
        };
        self.event(format!("rot: {how} {key} on replica {replica}"));
    }

    fn crash(&mut self, writer: WriterId, abort: bool) {
        let slot = self
            .writers
            .iter_mut()
            .find(|s| s.id == writer)
            .expect("known");
        if let Some(handle) = slot.writer.take().filter(|_| abort) {
            handle.abort();
        }
        if self.current == Some(writer) {
            self.current = None;
        }
        self.stats.writers_crashed += 1;
    }

    fn shutdown(&mut self, writer: WriterId, timeout: Duration) {
        let slot = self
            .writers
            .iter_mut()
            .find(|s| s.id == writer)
            .expect("known");
        if let Some(handle) = slot.writer.take() {
            tokio::spawn(handle.shutdown(timeout));
        }
        if self.current == Some(writer) {
            self.current = None;
        }
    }

    fn reader_slot(&mut self, slot: usize) -> usize {
        while self.readers.len() <= slot {
            let rng = &mut self.rng;
            let (stores, faults) = self.world.view(|| rng.random());
            let reader = Reader::new(&stores, chorus::ids::RecordIndex(0));
            self.readers.push(ReaderSlot {
                stores,
                faults,
                reader: Some(reader),
                task: None,
                injected_at_start: 0,
            });
        }
        slot
    }

    fn read(&mut self, slot: usize, max: usize) {
        let slot = self.reader_slot(slot);
        let Some(reader) = self.readers[slot].reader.take() else {
            return; // a read is running
        };
        let task = tokio::spawn(read_some(reader, max, self.origin));
        let injected = self.readers[slot].faults.injected_with(&self.world);
        self.readers[slot].task = Some(task);
        self.readers[slot].injected_at_start = injected;
    }

    fn new_reader(&mut self) {
        let slot = self.rng.random_range(0..MAX_READERS);
        let slot = self.reader_slot(slot);
        if self.readers[slot].task.is_some() {
            return;
        }
        // Mostly at or above the floor; sometimes below it (`Truncated`).
        let floor = self.floor();
        let end = self.model.log_end().max(floor);
        let from = if self.rng.random_bool(0.9) {
            self.rng.random_range(floor..=end)
        } else {
            self.rng.random_range(0..=end)
        };
        let reader = Reader::new(&self.readers[slot].stores, chorus::ids::RecordIndex(from));
        self.readers[slot].reader = Some(reader);
        self.event(format!("reader r{slot} restarts at {from}"));
    }

    /// Every live actor's private fault controllers.
    fn actor_faults(&self) -> Vec<(String, ActorFaults)> {
        let writers = self
            .writers
            .iter()
            .filter(|slot| slot.writer.is_some())
            .map(|slot| (format!("w{}", slot.id), slot.faults.clone()));
        let recoveries = self
            .recoveries
            .iter()
            .map(|task| (format!("recovery {}", task.id), task.faults.clone()));
        let readers = self
            .readers
            .iter()
            .enumerate()
            .map(|(slot, reader)| (format!("r{slot}"), reader.faults.clone()));
        let maintenance = self
            .maintenance
            .iter()
            .map(|task| (format!("m{}", task.id), task.faults.clone()));
        writers
            .chain(recoveries)
            .chain(readers)
            .chain(maintenance)
            .collect()
    }

    fn store_fault(&mut self) {
        let rule = draw_store_rule(&mut self.rng);
        let replica = self.rng.random_range(0..self.params.replicas);
        let actors = self.actor_faults();
        let (name, controller) = if actors.is_empty() || self.rng.random_bool(0.6) {
            let controller = self.world.replica_faults[replica].clone();
            (format!("replica {replica}"), controller)
        } else {
            let (name, faults) = &actors[self.rng.random_range(0..actors.len())];
            (
                format!("{name} replica {replica}"),
                faults.replicas[replica].clone(),
            )
        };
        self.add_expiring(&name, controller, rule);
    }

    /// Installs `rule` on `controller` for a random number of steps.
    fn add_expiring(&mut self, name: &str, controller: FaultController, rule: FaultRule) {
        let text = RuleLabel(&rule).to_string();
        let lasts = self.rng.random_range(10..=400);
        self.expiring.add_rule(self.step + lasts, controller, rule);
        self.event(format!("fault {name} for {lasts} steps: {text}"));
        self.stats.faults_added += 1;
    }

    fn register_fault(&mut self) {
        let rule = draw_register_rule(&mut self.rng);
        let actors = self.actor_faults();
        let (name, controller) = if actors.is_empty() || self.rng.random_bool(0.5) {
            ("register".to_owned(), self.world.register_faults.clone())
        } else {
            let (name, faults) = &actors[self.rng.random_range(0..actors.len())];
            (format!("{name} register"), faults.register.clone())
        };
        self.add_expiring(&name, controller, rule);
    }

    /// Starts an outage of `replica` for a random number of steps, or ends
    /// its current one.
    fn toggle_outage(&mut self, replica: usize) {
        let controller = self.world.replica_faults[replica].clone();
        if !controller.outage() {
            let lasts = self.rng.random_range(5..=300);
            self.expiring
                .add_outage(self.step + lasts, replica, &controller);
            self.stats.outages += 1;
            self.event(format!("outage replica {replica} on for {lasts} steps"));
        } else {
            controller.set_outage(false);
            self.expiring.forget_outages(replica);
            self.event(format!("outage replica {replica} off"));
        }
    }

    fn clear_faults(&mut self) {
        let actors = self.actor_faults();
        match self.rng.random_range(0..3) {
            0 => {
                let replica = self.rng.random_range(0..self.params.replicas);
                self.world.replica_faults[replica].clear();
                self.event(format!("clear replica {replica}"));
            }
            1 => {
                self.world.register_faults.clear();
                self.event("clear register");
            }
            _ if !actors.is_empty() => {
                let (name, faults) = &actors[self.rng.random_range(0..actors.len())];
                faults.clear();
                self.event(format!("clear {name}"));
            }
            _ => {}
        }
    }

    fn drop_completions(&mut self) -> Result<(), Violation> {
        let keep = self.rng.random_range(0..self.pending.len());
        for append in self.pending.split_off(keep) {
            self.model.dropped(append.writer, append.index);
        }
        Ok(())
    }
}

/// Picks one option with probability proportional to its weight (the log
/// phases' and the lease phase's schedules alike).
pub(crate) fn pick<A>(rng: &mut rand::rngs::StdRng, options: Vec<(u32, A)>) -> A {
    let total: u32 = options.iter().map(|(weight, _)| weight).sum();
    let mut draw = rng.random_range(0..total);
    for (weight, action) in options {
        if draw < weight {
            return action;
        }
        draw -= weight;
    }
    unreachable!("the draw is below the total weight")
}
