//! The serverless runtime (docs/design/0003-runtime-and-service.md): runs a
//! [`StateMachine`] on the replicated log, holding the writer lease as the
//! primary or tailing the log as a warm standby.
//!
//! A primary boots in this order, each phase timed:
//!
//! 1. read `HEAD.json`; 2. download, verify and restore the snapshot it names
//!    (skipped when the state in memory already reflects it);
//! 3. acquire the lease (a live foreign lease makes this process a standby
//!    until it expires); 4. stamp HEAD with the lease (if HEAD moved since it
//!    was read, boot again from the newer snapshot); 5. recover the log from
//!    the snapshot's index, which claims a new epoch and so fences any old
//!    writer; 6. apply the log's tail; 7. start the writer and serve.
//!
//! Steady state: a write is appended, acknowledged by a quorum, applied in
//! index order, and only then answered. Snapshots are published after
//! [`RuntimeConfig::snapshot_every_records`] records once the log since the
//! last holds [`RuntimeConfig::snapshot_min_log_percent`] of its bytes, or
//! every [`RuntimeConfig::snapshot_interval`], then the log is truncated
//! below them.
//! The lease is refreshed every third of its ttl; while the holder cannot be
//! sure of it, the runtime serves neither writes nor current reads, and a
//! holder that finds its lease taken aborts its writer and becomes a standby.

mod config;
mod core;
mod error;
mod held;
mod log_view;
mod machine;
mod primary;
mod schedule;
mod standby;
mod status;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};

pub use self::core::{Change, HistoryGap, RevisionGap};
pub use config::{
    DEFAULT_HISTORY_BYTES, DEFAULT_HISTORY_RECORDS, DEFAULT_SNAPSHOT_MIN_LOG_PERCENT,
    RuntimeConfig, RuntimeStores,
};
pub use error::{Phase, Role, RuntimeError, Unavailable, WriteError};
pub use log_view::{
    LOG_VIEW_MAX_AGE, LogReadError, LogReader, LogView, Observed, REPLICA_CHECK_TIMEOUT,
    ReplicaHealth,
};
pub use machine::{Checkpoint, RestoreError, StateMachine};
pub use status::RuntimeStatus;

use self::core::{Core, Divergence, HistoryBudget};
use crate::ids::RecordIndex;
use crate::lease::{Contender, Incarnation, LeaseHolder};
use crate::log::{Completion, LogError, StopReason, Writer};
use status::Info;

/// A write that was acknowledged by a quorum and applied.
#[derive(Debug, Clone)]
pub struct Written<O> {
    /// The record's index.
    pub index: RecordIndex,
    /// What applying it answered.
    pub output: O,
}

/// An admitted write on its way to being applied.
struct InFlight<O> {
    completion: Completion,
    record: Bytes,
    reply: oneshot::Sender<Result<Written<O>, LogError>>,
}

/// What a primary serves writes through; present only while it may.
struct WritePath<O> {
    writer: Arc<Writer>,
    lease: Arc<LeaseHolder>,
    /// To the apply task, in index order.
    apply: mpsc::UnboundedSender<InFlight<O>>,
}

/// State shared by the runtime handle, its supervisor and its tasks.
struct Shared<M: StateMachine> {
    stores: RuntimeStores,
    config: RuntimeConfig,
    /// This runtime's identity in the lease: the configured holder id and a
    /// random incarnation drawn at start, kept for the runtime's lifetime.
    contender: Contender,
    /// Whether the next acquisition still takes the lease over
    /// ([`RuntimeConfig::force`]); cleared by the first that succeeds.
    force_pending: AtomicBool,
    core: Mutex<Core<M>>,
    write_path: Mutex<Option<WritePath<M::Output>>>,
    info: Mutex<Info>,
    /// The applied end, for waiters (watchers, tests).
    applied: watch::Sender<RecordIndex>,
    /// Set once a graceful shutdown was asked for.
    stop: watch::Sender<bool>,
    /// The supervisor's outcome once it ended.
    finished: watch::Sender<Option<Result<(), RuntimeError>>>,
    /// The newest view of the register and replicas, for status pages.
    log_view: Arc<log_view::LogViewCache>,
}

impl<M: StateMachine> Shared<M> {
    fn core(&self) -> MutexGuard<'_, Core<M>> {
        self.core.lock().expect("runtime state lock poisoned")
    }

    fn info(&self) -> MutexGuard<'_, Info> {
        self.info.lock().expect("runtime info lock poisoned")
    }

    fn write_path(&self) -> MutexGuard<'_, Option<WritePath<M::Output>>> {
        self.write_path
            .lock()
            .expect("runtime write path lock poisoned")
    }

    fn applied_end(&self) -> RecordIndex {
        self.core().applied_end()
    }

    fn stop_requested(&self) -> bool {
        *self.stop.borrow()
    }

    /// Applies the next record and tells waiters.
    fn apply(&self, index: RecordIndex, record: Bytes) -> M::Output {
        self.advance(|core| core.apply(index, record))
    }

    /// Takes a committed record read from the replicas (a standby's):
    /// applies it, or checks it against the one applied
    /// ([`Core::take_committed`](self::core::Core::take_committed)).
    fn take_committed(&self, index: RecordIndex, record: Bytes) -> Result<(), Divergence> {
        self.advance(|core| core.take_committed(index, record))
            .map(drop)
    }

    /// Runs `step` on the state under its lock, then tells waiters if the
    /// applied end moved.
    fn advance<T>(&self, step: impl FnOnce(&mut Core<M>) -> T) -> T {
        let (outcome, before, end) = {
            let mut core = self.core();
            let before = core.applied_end();
            (step(&mut core), before, core.applied_end())
        };
        if end != before {
            self.applied_to(end);
        }
        outcome
    }

    /// Tells waiters the state now reflects every record below `end`.
    fn applied_to(&self, end: RecordIndex) {
        self.applied.send_replace(end);
        metrics::gauge!("chorus_runtime_applied_index").set(end.0 as f64);
    }

    /// Replaces the state with a restored snapshot taken at `at`.
    fn restore(&self, machine: M, at: RecordIndex) {
        self.core().restore(machine, at);
        self.applied_to(at);
    }

    fn set_role(&self, role: Role) {
        let mut info = self.info();
        if info.role != role {
            tracing::info!(%role, "runtime role");
            for other in [Role::Booting, Role::Primary, Role::Standby, Role::Stopped] {
                let value = if other == role { 1.0 } else { 0.0 };
                metrics::gauge!("chorus_runtime_role", "role" => other.as_str()).set(value);
            }
        }
        info.role = role;
    }
}

/// Runs a [`StateMachine`] on a database's stores; see the module docs.
/// Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Runtime<M: StateMachine> {
    shared: Arc<Shared<M>>,
    supervisor: tokio::task::AbortHandle,
}

impl<M: StateMachine> std::fmt::Debug for Runtime<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("holder", &self.shared.config.holder)
            .field("role", &self.shared.info().role)
            .finish()
    }
}

impl<M: StateMachine> Runtime<M> {
    /// Starts the runtime in the background: it boots, then serves as primary
    /// or standby until [`shutdown`](Runtime::shutdown) or a fatal error
    /// ([`finished`](Runtime::finished) reports which).
    pub fn start(stores: RuntimeStores, config: RuntimeConfig) -> Result<Runtime<M>, RuntimeError> {
        config.validate().map_err(|e| {
            RuntimeError::new(Phase::ObserveHead, format!("invalid config: {e}"), false)
        })?;
        let incarnation = config.incarnation.unwrap_or_else(Incarnation::random);
        let contender = Contender::with_incarnation(config.holder.clone(), incarnation);
        let shared = Arc::new(Shared {
            core: Mutex::new(Core::new(HistoryBudget {
                max_records: config.history_records,
                max_bytes: config.history_bytes,
            })),
            info: Mutex::new(Info::new(contender.clone())),
            force_pending: AtomicBool::new(config.force),
            contender,
            write_path: Mutex::new(None),
            applied: watch::Sender::new(RecordIndex(0)),
            stop: watch::Sender::new(false),
            finished: watch::Sender::new(None),
            log_view: Arc::default(),
            stores,
            config,
        });
        let supervisor = tokio::spawn(supervise(Arc::clone(&shared))).abort_handle();
        Ok(Runtime { shared, supervisor })
    }

    /// Appends the record `prepare` makes from the applied state, waits until
    /// a quorum acknowledged it and it was applied, and returns its index and
    /// output. `prepare` runs under the state lock: it should only check and
    /// encode. A refusal by `prepare` appends nothing. The record it returns
    /// is applied as it is, and the history and the state may keep it: a
    /// slice of a larger buffer would keep all of that alive.
    pub async fn write<E>(
        &self,
        prepare: impl FnOnce(&M) -> Result<Bytes, E>,
    ) -> Result<Written<M::Output>, WriteError<E>> {
        let reply = {
            let path = self.shared.write_path();
            let Some(path) = path.as_ref() else {
                return Err(self.not_primary().into());
            };
            // Appending only while the lease is sure: a standby may take over
            // the moment it could have expired.
            if !path.lease.may_write_now() {
                return Err(Unavailable::LeaseUncertain.into());
            }
            let record = prepare(&self.shared.core().machine).map_err(WriteError::Rejected)?;
            let completion = path
                .writer
                .append(record.clone())
                .map_err(WriteError::Log)?;
            let (reply, answer) = oneshot::channel();
            let in_flight = InFlight {
                completion,
                record,
                reply,
            };
            if path.apply.send(in_flight).is_err() {
                return Err(WriteError::Log(stopped_after_admission()));
            }
            answer
        };
        match reply.await {
            Ok(outcome) => outcome.map_err(WriteError::Log),
            Err(_) => Err(WriteError::Log(stopped_after_admission())),
        }
    }

    /// Reads the current state: only on a primary sure of its lease, so the
    /// answer reflects every acknowledged write. Returns the applied end too.
    pub fn read<T>(&self, read: impl FnOnce(&M) -> T) -> Result<(T, RecordIndex), Unavailable> {
        let (value, applied) = self.read_stale(read);
        // Checked after reading: the lease was sure at least until now.
        match self.shared.write_path().as_ref() {
            Some(path) if path.lease.may_write_now() => Ok((value, applied)),
            Some(_) => Err(Unavailable::LeaseUncertain),
            None => Err(self.not_primary()),
        }
    }

    /// Reads the state as applied here, whatever the role; it reflects every
    /// record below the returned index and may lag the primary.
    pub fn read_stale<T>(&self, read: impl FnOnce(&M) -> T) -> (T, RecordIndex) {
        let core = self.shared.core();
        (read(&core.machine), core.applied_end())
    }

    /// Up to `limit` applied records from `from` on, from the in-memory
    /// history ([`RuntimeConfig::history_records`],
    /// [`RuntimeConfig::history_bytes`]).
    pub fn changes_since(
        &self,
        from: RecordIndex,
        limit: usize,
    ) -> Result<Vec<Change<M::Output>>, HistoryGap> {
        self.changes_within(from, limit, usize::MAX)
    }

    /// [`changes_since`](Runtime::changes_since), also stopping once the
    /// changes hold `max_bytes` of records: a batch exceeds it by less than
    /// one record, and always holds one change if there is any. The changes
    /// share their records' bytes with the history, so a batch costs little
    /// memory until it is rendered.
    pub fn changes_within(
        &self,
        from: RecordIndex,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<Change<M::Output>>, HistoryGap> {
        self.shared
            .core()
            .changes_since(from, max_records, max_bytes)
    }

    /// [`changes_within`](Runtime::changes_within) from the first record
    /// that left the machine at revision `from` or above
    /// ([`StateMachine::revision`]); a revision some change no longer held
    /// moved to is a [`RevisionGap`].
    pub fn changes_from_revision(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<Change<M::Output>>, RevisionGap> {
        self.shared
            .core()
            .changes_from_revision(from, max_records, max_bytes)
    }

    /// Calls `observer` with the state after every record applied here from
    /// now on, and after a snapshot replaced the state, until it answers
    /// false. It runs under the state's lock, between one record and the
    /// next: it must be quick and must not call the runtime. What a service
    /// uses to take something of each record's effect before a later
    /// record changes it (the etcd API's watch feed), where waiting for
    /// [`applied`](Runtime::applied) could see several records at once.
    pub fn observe_applied(&self, observer: impl FnMut(&M) -> bool + Send + 'static) {
        self.shared.core().observe(Box::new(observer));
    }

    /// The applied end, updated after every applied record.
    pub fn applied(&self) -> watch::Receiver<RecordIndex> {
        self.shared.applied.subscribe()
    }

    /// Whether writes and current reads are served now: a primary sure of its lease.
    pub fn is_primary_and_sure(&self) -> bool {
        self.shared
            .write_path()
            .as_ref()
            .is_some_and(|path| path.lease.may_write_now())
    }

    /// A point-in-time view for status pages and readiness.
    pub fn status(&self) -> RuntimeStatus {
        let (writer, lease_remaining, lease) = match self.shared.write_path().as_ref() {
            Some(path) => (
                Some(path.writer.status()),
                Some(
                    path.lease
                        .remaining(self.shared.stores.leases.clock().now()),
                ),
                // The document as the last refresh wrote it, not as acquired.
                Some(path.lease.record()),
            ),
            None => (None, None, None),
        };
        let applied = self.shared.applied_end();
        let mut status =
            self.shared
                .info()
                .status(applied, writer, lease_remaining, &self.shared.config);
        if lease.is_some() {
            status.lease = lease;
        }
        status
    }

    /// The stores this runtime runs on.
    pub fn stores(&self) -> &RuntimeStores {
        &self.shared.stores
    }

    /// The newest view of the register and the replicas' health, at most
    /// [`LOG_VIEW_MAX_AGE`] old plus one refresh: a stale one starts a
    /// refresh in the background, so a status page costs store requests at
    /// most once per max age however often it is asked for.
    pub async fn log_view(&self) -> Observed {
        self.shared.log_view.get(&self.shared.stores.log).await
    }

    /// The log's truncation floor, read from the register now.
    pub async fn log_floor(&self) -> Result<RecordIndex, LogReadError> {
        log_view::floor(&self.shared.stores.log).await
    }

    /// Committed records from `from` on, read from the replicas (any role).
    pub fn log_reader(&self, from: RecordIndex) -> LogReader {
        LogReader::new(&self.shared.stores.log, from)
    }

    /// This runtime's wall clock, in ms since the Unix epoch (the clock its
    /// lease expiries are judged by).
    pub fn wall_ms(&self) -> u64 {
        self.shared.stores.leases.clock().wall_ms()
    }

    /// The directory of the processes serving this database, in its
    /// snapshot store (see [`members`](crate::members)).
    pub fn member_directory(&self) -> crate::members::Directory {
        let snapshots = &self.shared.stores.snapshots;
        crate::members::Directory::new(
            snapshots.store().clone(),
            snapshots.database(),
            snapshots.clock().clone(),
        )
    }

    /// Hands this runtime committed records another node applied (its
    /// [`changes_since`](Runtime::changes_since)), so a standby need not
    /// wait for the replicas to serve them: while it tails the log, it
    /// applies each that is its next record at once and holds those ahead
    /// (bounded) until the replicas supply the records before them. In any
    /// other role the records are ignored.
    ///
    /// Only records that are committed may be handed over: every record a
    /// runtime applied is (a primary applies a record once a quorum holds
    /// it; a standby, once it read it as committed). The standby still
    /// reads every record from the replicas and checks each against the
    /// one it applied; a record that differs stops it with an error rather
    /// than let it serve a state the log does not hold. Returns how many
    /// records it applied now (held ones included).
    pub fn offer_committed(
        &self,
        records: impl IntoIterator<Item = (RecordIndex, Bytes)>,
    ) -> usize {
        let applied: usize = self.shared.advance(|core| {
            records
                .into_iter()
                .map(|(index, record)| core.offer(index, record))
                .sum()
        });
        if applied > 0 {
            metrics::counter!("chorus_runtime_records_taken_from_peer_total")
                .increment(applied as u64);
        }
        applied
    }

    /// Applied records from `from` on, as another runtime's
    /// [`offer_committed`](Runtime::offer_committed) takes them: within
    /// the bounds of [`changes_within`](Runtime::changes_within), and from
    /// the oldest the history holds when it no longer holds `from` (the
    /// receiver reads the gap from the replicas). Empty until `from` is
    /// applied.
    pub fn committed_records(
        &self,
        from: RecordIndex,
        max_records: usize,
        max_bytes: usize,
    ) -> Vec<(RecordIndex, Bytes)> {
        let core = self.shared.core();
        core.changes_since(from, max_records, max_bytes)
            .or_else(|gap| core.changes_since(gap.oldest, max_records, max_bytes))
            .unwrap_or_default()
            .into_iter()
            .map(|change| (change.index, change.record))
            .collect()
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &RuntimeConfig {
        &self.shared.config
    }

    /// Shuts down gracefully: a primary stops admitting, drains what it
    /// admitted, publishes a final snapshot and releases the lease; a standby
    /// just stops. Returns the supervisor's outcome.
    pub async fn shutdown(&self) -> Result<(), RuntimeError> {
        self.shared.stop.send_replace(true);
        self.finished().await
    }

    /// Stops at once, as a crash would: nothing is drained, published or
    /// released, so another process takes over only when the lease expires.
    /// Writes in flight fail (those already admitted with
    /// `may_have_committed`). For tests, simulations and a last resort.
    pub fn abort(&self) {
        self.supervisor.abort();
        drop(self.shared.write_path().take());
        self.shared.set_role(Role::Stopped);
        self.shared.finished.send_if_modified(|finished| {
            let first = finished.is_none();
            if first {
                *finished = Some(Ok(()));
            }
            first
        });
    }

    /// Waits until the runtime stopped (after a shutdown or a fatal error).
    pub async fn finished(&self) -> Result<(), RuntimeError> {
        let mut finished = self.shared.finished.subscribe();
        let outcome = finished
            .wait_for(Option::is_some)
            .await
            .map(|outcome| outcome.clone());
        match outcome {
            Ok(outcome) => outcome.expect("waited for Some"),
            Err(_) => Ok(()),
        }
    }

    fn not_primary(&self) -> Unavailable {
        let info = self.shared.info();
        Unavailable::NotPrimary {
            role: info.role,
            primary: info.primary(),
        }
    }
}

fn stopped_after_admission() -> LogError {
    LogError::Stopped {
        reason: StopReason::Aborted,
        may_have_committed: true,
    }
}

/// Boots and serves until a shutdown or a fatal error, stepping between
/// primary and standby as the lease dictates.
async fn supervise<M: StateMachine>(shared: Arc<Shared<M>>) {
    let outcome = supervise_loop(&shared).await;
    if let Err(error) = &outcome {
        tracing::error!(%error, "runtime stopped");
        shared.info().last_error = Some(error.to_string());
    }
    shared.set_role(Role::Stopped);
    shared.finished.send_replace(Some(outcome));
}

async fn supervise_loop<M: StateMachine>(shared: &Arc<Shared<M>>) -> Result<(), RuntimeError> {
    let mut failed_boots = 0u32;
    while !shared.stop_requested() {
        let booted = primary::boot(shared).await;
        if booted.is_ok() {
            failed_boots = 0;
        }
        match booted {
            Ok(primary::Boot::Primary(primary)) => match primary::serve(shared, primary).await {
                primary::Exit::Shutdown => return Ok(()),
                primary::Exit::LeaseLost => {
                    tracing::warn!("the lease was taken over; this process becomes a standby");
                }
                primary::Exit::LeaseStoreFailed(error) => {
                    tracing::warn!(
                        %error,
                        "the lease store failed a refresh (not a takeover); booting again"
                    );
                }
                primary::Exit::WriterFailed(reason) => {
                    tracing::warn!(%reason, "the log writer stopped; recovering the log again");
                }
            },
            Ok(primary::Boot::Held) => standby::run(shared).await?,
            Err(error) if error.transient => {
                let backoff = boot_backoff(shared.config.retry_backoff, failed_boots);
                failed_boots = failed_boots.saturating_add(1);
                tracing::warn!(%error, backoff_ms = backoff.as_millis() as u64, "boot step failed; retrying");
                shared.info().last_error = Some(error.to_string());
                pause(shared, backoff).await;
            }
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// The pause after `failed` consecutive failed boots (or snapshot
/// publications): `base`, doubling per failure up to [`MAX_BOOT_BACKOFF`]
/// (or `base`, if that is larger), so a lasting problem (a damaged HEAD, an
/// unreachable quorum) neither spins nor rewrites the lease and HEAD on
/// every attempt.
fn boot_backoff(base: Duration, failed: u32) -> Duration {
    let doubled = base.saturating_mul(1 << failed.min(16));
    doubled.min(MAX_BOOT_BACKOFF.max(base))
}

/// The longest pause between boot attempts.
const MAX_BOOT_BACKOFF: Duration = Duration::from_secs(30);

/// Sleeps `duration`, or less if a shutdown is asked for.
async fn pause<M: StateMachine>(shared: &Shared<M>, duration: Duration) {
    let mut stop = shared.stop.subscribe();
    let _ = tokio::time::timeout(duration, stop.wait_for(|stop| *stop)).await;
}

/// Runs one boot phase, timing it for the status page, metrics and the log.
async fn timed<M: StateMachine, T>(
    shared: &Shared<M>,
    phase: Phase,
    step: impl Future<Output = Result<T, RuntimeError>>,
) -> Result<T, RuntimeError> {
    let started = Instant::now();
    let outcome = step.await;
    let elapsed = started.elapsed();
    metrics::histogram!("chorus_runtime_phase_seconds", "phase" => phase.as_str())
        .record(elapsed.as_secs_f64());
    tracing::info!(%phase, elapsed_ms = elapsed.as_millis() as u64, ok = outcome.is_ok(), "runtime phase");
    shared.info().record_phase(phase, elapsed);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_backoff_doubles_per_failure_up_to_its_cap() {
        let base = Duration::from_secs(1);
        let pauses: Vec<u64> = (0..8)
            .map(|failed| boot_backoff(base, failed).as_secs())
            .collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(boot_backoff(base, u32::MAX), MAX_BOOT_BACKOFF);
        // A base above the cap is kept, never shortened.
        let long = Duration::from_secs(60);
        assert_eq!(boot_backoff(long, 0), long);
        assert_eq!(boot_backoff(long, 5), long);
    }
}
