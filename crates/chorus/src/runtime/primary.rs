//! Booting as primary and serving as one: the lease, the writer, the apply
//! task, snapshots and the way out (shutdown, lost lease, failed writer).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

use super::core::detached;
use super::error::{Phase, Role, RuntimeError};
use super::machine::{Checkpoint, StateMachine, check_restored};
use super::schedule::{self, SinceSnapshot};
use super::{InFlight, Shared, WritePath, Written, boot_backoff, timed};
use crate::ids::RecordIndex;
use crate::lease::{LeaseError, LeaseHolder, LeaseRecord};
use crate::log::{LogError, Recovery, StopReason, Writer};
use crate::snapshot::{Head, NewSnapshot, PublicationStore, SnapshotError};

/// How often the primary checks whether a snapshot is due.
const SNAPSHOT_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// What a boot ended in.
pub(super) enum Boot {
    /// This process holds the lease and the log's writer.
    Primary(Box<Primary>),
    /// Another process holds a live lease: stand by until it expires.
    Held,
}

/// A booted primary's handles.
pub(super) struct Primary {
    writer: Writer,
    lease: Arc<LeaseHolder>,
    keeper: LeaseKeeper,
    publication: PublicationStore,
}

/// Why a primary stopped serving.
pub(super) enum Exit {
    /// A graceful shutdown finished.
    Shutdown,
    /// Another holder took the lease (or it could not be proven in time and
    /// a publication was fenced): never write again with this incarnation.
    LeaseLost,
    /// The lease store failed a refresh in a way retrying does not fix (the
    /// store's error says why: out of descriptors, denied, …). Nobody took
    /// the lease over, but it can no longer be proven: boot again.
    LeaseStoreFailed(String),
    /// The log's writer stopped (poisoned, fenced, a failed append).
    WriterFailed(String),
}

/// Boots as primary: see the module docs of `runtime` for the order.
pub(super) async fn boot<M: StateMachine>(shared: &Arc<Shared<M>>) -> Result<Boot, RuntimeError> {
    shared.set_role(Role::Booting);
    let mut publication = shared.stores.snapshots.publication();
    let head = timed(shared, Phase::ObserveHead, async {
        publication
            .observe_for_boot()
            .await
            .map_err(|e| snapshot_error(Phase::ObserveHead, e))
    })
    .await?;
    shared.info().head = head.clone();
    match &head {
        Some(head) => timed(shared, Phase::Restore, hydrate(shared, head)).await?,
        None => shared.core().mark_known(),
    }
    let lease = match timed(shared, Phase::AcquireLease, acquire(shared)).await? {
        Some(lease) => Arc::new(lease),
        None => return Ok(Boot::Held),
    };
    let keeper = LeaseKeeper::start(Arc::clone(&lease), shared.stores.leases.config().ttl);
    let booted = boot_with_lease(shared, &lease, &mut publication).await;
    match booted {
        Ok(writer) => Ok(Boot::Primary(Box::new(Primary {
            writer,
            lease,
            keeper,
            publication,
        }))),
        Err(error) => {
            // Holding the lease through the retry's backoff would keep a
            // healthy standby out (and this process re-acquires its own lease
            // at once); whoever boots next recovers the log again anyway.
            keeper.stop();
            release(&lease, "after a failed boot").await;
            Err(error)
        }
    }
}

/// Releases the lease, logging the outcome; a failed release expires.
async fn release(lease: &LeaseHolder, when: &str) {
    match lease.release().await {
        Ok(()) => tracing::info!(when, "released the lease"),
        Err(error) => {
            tracing::warn!(%error, when, "releasing the lease failed; it expires on its own")
        }
    }
}

/// Steps 4 to 7 of the boot, under the lease.
async fn boot_with_lease<M: StateMachine>(
    shared: &Arc<Shared<M>>,
    lease: &LeaseHolder,
    publication: &mut PublicationStore,
) -> Result<Writer, RuntimeError> {
    timed(shared, Phase::ClaimHead, claim(shared, lease, publication)).await?;
    let recovery = timed(shared, Phase::RecoverLog, async {
        // Recovery claims a new epoch and so fences whoever writes the log
        // now: a boot that stalled past its lease (cut off, paused) must not
        // fence the primary that took over meanwhile. This narrows that to a
        // stall between here and the claim; the epoch claim still keeps the
        // log safe (a fenced writer loses nothing it acknowledged).
        if !lease.may_write_now() {
            let message = "the lease could not be proven before recovering the log";
            return Err(RuntimeError::new(Phase::RecoverLog, message, true));
        }
        Recovery::run(shared.stores.log.clone(), shared.config.log.clone())
            .await
            .map_err(|e| log_error(Phase::RecoverLog, e))
    })
    .await?;
    shared.info().epoch = Some(recovery.epoch());
    timed(shared, Phase::Replay, replay(shared, &recovery)).await?;
    timed(shared, Phase::StartWriter, async {
        if !lease.may_write_now() {
            let message = "the lease could not be proven during the boot";
            return Err(RuntimeError::new(Phase::StartWriter, message, true));
        }
        recovery
            .start()
            .await
            .map_err(|e| log_error(Phase::StartWriter, e))
    })
    .await
}

/// Restores the snapshot `head` names, unless the state here already
/// reflects it (a warm standby, or a primary booting again).
pub(super) async fn hydrate<M: StateMachine>(
    shared: &Shared<M>,
    head: &Head,
) -> Result<(), RuntimeError> {
    let (warm, applied_bytes) = {
        let core = shared.core();
        let warm = core.is_known() && head.wal_index <= core.applied_end();
        (warm, core.applied_bytes())
    };
    if warm {
        shared.info().learn_snapshot(head.wal_index, applied_bytes);
        return Ok(());
    }
    restore_head(shared, head).await
}

/// Downloads, verifies and restores the payload `head` names.
pub(super) async fn restore_head<M: StateMachine>(
    shared: &Shared<M>,
    head: &Head,
) -> Result<(), RuntimeError> {
    let bytes = shared
        .stores
        .snapshots
        .download(head)
        .await
        .map_err(|e| snapshot_error(Phase::Restore, e))?;
    let machine = tokio::task::spawn_blocking(move || M::restore(&mut bytes.as_ref()))
        .await
        .map_err(|e| RuntimeError::new(Phase::Restore, e, true))?
        .map_err(|e| {
            let message = format!("{e}: key={}", head.snapshot_key());
            RuntimeError::new(Phase::Restore, message, false)
        })?;
    check_restored(machine.reflected_end(), head.wal_index).map_err(|e| {
        let message = format!("{e}: key={}", head.snapshot_key());
        RuntimeError::new(Phase::Restore, message, false)
    })?;
    shared.restore(machine, head.wal_index);
    let applied_bytes = shared.core().applied_bytes();
    let mut info = shared.info();
    info.last_snapshot_index = Some(head.wal_index);
    info.snapshot_applied_bytes = applied_bytes;
    info.head = Some(head.clone());
    tracing::info!(wal_index = %head.wal_index, key = %head.snapshot_key(), "restored snapshot");
    Ok(())
}

/// Acquires the lease, or `None` while another process's lease is live.
/// `force` takes a live lease over, on this runtime's first acquisition only:
/// a later reboot (after a lost lease or a failed writer) must not fence
/// whichever process took over meanwhile.
async fn acquire<M: StateMachine>(shared: &Shared<M>) -> Result<Option<LeaseHolder>, RuntimeError> {
    let leases = &shared.stores.leases;
    let contender = &shared.contender;
    let forcing = shared.force_pending.load(Ordering::Acquire);
    let acquired = if forcing {
        let previous = leases.read().await.ok().flatten();
        let taken = leases.take_over(contender).await;
        if let Ok(lease) = &taken {
            shared.force_pending.store(false, Ordering::Release);
            let previous = previous.map_or_else(|| "none".to_owned(), |p| describe(&p));
            tracing::warn!(%contender, token = %lease.token(), %previous, "took the lease over (--force); the previous holder is fenced");
        }
        taken
    } else {
        leases.acquire_at_stored_term(contender).await
    };
    match acquired {
        Ok(lease) => {
            shared.info().lease = Some(lease.record());
            Ok(Some(lease))
        }
        Err(LeaseError::Held {
            holder, expires_in, ..
        }) => {
            let expires_in_ms = expires_in.as_millis() as u64;
            if holder == *contender.holder() {
                tracing::warn!(%holder, expires_in_ms, "lease held by another process with this holder id (a second instance, or this host's previous process that did not release it); standing by until it expires");
            } else {
                tracing::info!(%holder, expires_in_ms, "lease held by another process");
            }
            shared.info().lease = leases.read().await.ok().flatten();
            Ok(None)
        }
        Err(LeaseError::LostRace { .. }) => Ok(None),
        Err(error) => Err(lease_error(Phase::AcquireLease, error)),
    }
}

/// A lease document for a log line: holder, incarnation, token, state.
fn describe(lease: &LeaseRecord) -> String {
    let incarnation = lease
        .incarnation
        .map_or_else(|| "unknown".to_owned(), |i| i.to_string());
    let state = if lease.released { "released" } else { "held" };
    format!(
        "holder={} incarnation={incarnation} token={} {state}",
        lease.holder_id,
        lease.token()
    )
}

/// Stamps HEAD with the lease; on the very first boot installs the current
/// (empty) state as the first snapshot.
async fn claim<M: StateMachine>(
    shared: &Shared<M>,
    lease: &LeaseHolder,
    publication: &mut PublicationStore,
) -> Result<(), RuntimeError> {
    // Only a first boot installs the state as the first snapshot; encoding
    // it on every boot would cost O(state) CPU and memory per takeover.
    let initial = if publication.needs_initial() {
        let (snapshot, _applied_bytes) = checkpoint(shared)
            .await
            .map_err(|e| RuntimeError::new(Phase::ClaimHead, e, false))?;
        Some(snapshot)
    } else {
        None
    };
    let claimed = publication.claim(lease, initial).await.map_err(|e| {
        if e.is_fenced() {
            let message = format!("{e}; booting again from the newer snapshot");
            RuntimeError::new(Phase::ClaimHead, message, true)
        } else {
            snapshot_error(Phase::ClaimHead, e)
        }
    })?;
    let applied_bytes = shared.core().applied_bytes();
    let mut info = shared.info();
    // HEAD's payload is the newest snapshot, whichever process wrote it.
    info.learn_snapshot(claimed.head().wal_index, applied_bytes);
    info.head = Some(claimed.head().clone());
    Ok(())
}

/// Applies the recovered log from the applied end to its end.
async fn replay<M: StateMachine>(
    shared: &Shared<M>,
    recovery: &Recovery,
) -> Result<(), RuntimeError> {
    let from = shared.applied_end();
    if from > recovery.end() {
        let message = format!(
            "the state reflects records up to {from} but the log ends at {}: \
             the snapshot does not belong to this log",
            recovery.end()
        );
        return Err(RuntimeError::new(Phase::Replay, message, false));
    }
    let mut stream = recovery
        .replay(from)
        .map_err(|e| log_error(Phase::Replay, e))?;
    let mut replayed = 0u64;
    while let Some((index, record)) = stream
        .next()
        .await
        .map_err(|e| log_error(Phase::Replay, e))?
    {
        shared.apply(index, detached(record));
        replayed += 1;
    }
    shared.info().replayed_records = replayed;
    tracing::info!(from = %from, records = replayed, "replayed the log");
    Ok(())
}

/// Serves as primary until a shutdown, a lost lease or a failed writer.
pub(super) async fn serve<M: StateMachine>(shared: &Arc<Shared<M>>, primary: Box<Primary>) -> Exit {
    let Primary {
        writer,
        lease,
        keeper,
        publication,
    } = *primary;
    let writer = Arc::new(writer);
    let (apply, applying) = mpsc::unbounded_channel();
    let failed = Arc::new(Notify::new());
    let apply_task = tokio::spawn(apply_in_order(
        Arc::clone(shared),
        applying,
        Arc::clone(&failed),
    ));
    *shared.write_path() = Some(WritePath {
        writer: Arc::clone(&writer),
        lease: Arc::clone(&lease),
        apply,
    });
    shared.set_role(Role::Primary);
    shared.info().last_error = None;
    let mut stop = shared.stop.subscribe();
    let mut since = tokio::time::Instant::now();
    // A publication (up to minutes of upload) runs beside the loop, not in
    // it, so a shutdown, a lost lease or a stopped writer is acted on at once.
    // The publication store while no publication runs; one that runs owns it.
    let mut idle = Some(publication);
    let mut publishing = None;
    // After a failed publication the next waits (doubling per failure):
    // one that fails at once (a damaged HEAD read, a store refusing) must
    // not be retried as fast as the store answers.
    let mut failed_publications = 0u32;
    let mut next_publication = tokio::time::Instant::now();
    let exit = loop {
        // `biased`: a shutdown wins over a tick that is ready at the same
        // time, so a run replays exactly under the deterministic simulator.
        tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => break Exit::Shutdown,
            _ = keeper.lost.notified() => break keeper.exit(),
            _ = failed.notified() => break writer_failed(&writer),
            // A writer can stop from the background (a fenced seal or fold)
            // with nothing in flight, which no completion would report.
            _ = writer.stopped() => break writer_failed(&writer),
            (store, outcome) = until_published(&mut publishing) => {
                publishing = None;
                let fenced = store.fence_reason().is_some();
                idle = Some(store);
                if let Err(error) = outcome {
                    tracing::warn!(%error, "snapshot failed");
                    if fenced {
                        break Exit::LeaseLost;
                    }
                    let pause = boot_backoff(shared.config.retry_backoff, failed_publications);
                    next_publication = tokio::time::Instant::now() + pause;
                    failed_publications = failed_publications.saturating_add(1);
                } else {
                    failed_publications = 0;
                }
            }
            _ = tokio::time::sleep(SNAPSHOT_CHECK_INTERVAL) => {}
        }
        // A publication needs the lease to vouch for it; while a refresh is
        // overdue, wait rather than have the publication store fence itself.
        if publishing.is_some()
            || tokio::time::Instant::now() < next_publication
            || !snapshot_due(shared, since)
            || !lease.may_write_now()
        {
            continue;
        }
        since = tokio::time::Instant::now();
        let store = idle
            .take()
            .expect("no publication runs, so the store is idle");
        let running = publish_owned(Arc::clone(shared), Arc::clone(&lease), store);
        publishing = Some(Box::pin(running));
    };
    // Close the write path first, so nothing new is admitted.
    drop(shared.write_path().take());
    let writer = Arc::try_unwrap(writer).ok();
    match &exit {
        Exit::Shutdown => {
            shared.set_role(Role::Stopped);
            let deadline = tokio::time::Instant::now() + shared.config.drain_timeout;
            let publication = match publishing.take() {
                // The lease must not wait behind an upload (its store call may
                // take minutes): the next primary publishes its own snapshot.
                Some(_abandoned) => {
                    tracing::warn!(
                        "shutdown abandons the snapshot upload in flight; the next primary publishes its own snapshot"
                    );
                    None
                }
                None => idle.take(),
            };
            if let Some(writer) = writer
                && let Err(error) = writer.shutdown(shared.config.drain_timeout).await
            {
                tracing::warn!(%error, "draining the writer failed");
            }
            let _ = apply_task.await;
            if let Some(mut publication) = publication {
                final_snapshot(shared, &lease, &mut publication, deadline).await;
            }
            keeper.stop();
            release(&lease, "at shutdown").await;
        }
        Exit::LeaseLost | Exit::LeaseStoreFailed(_) | Exit::WriterFailed(_) => {
            // Any publication in flight is abandoned with the lease or the
            // writer.
            shared.set_role(Role::Booting);
            if let Some(writer) = writer {
                writer.abort();
            }
            let _ = apply_task.await;
            keeper.stop();
        }
    }
    exit
}

/// Publishes the final snapshot of a graceful shutdown if records were
/// applied since the last one, abandoning it at `deadline` (the drain bound,
/// after which the lease is released whatever is left).
async fn final_snapshot<M: StateMachine>(
    shared: &Shared<M>,
    lease: &LeaseHolder,
    publication: &mut PublicationStore,
    deadline: tokio::time::Instant,
) {
    if !snapshot_pending(shared) {
        return;
    }
    match tokio::time::timeout_at(deadline, publish(shared, lease, publication)).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::warn!(%error, "final snapshot failed"),
        Err(_) => {
            let drain_timeout_ms = shared.config.drain_timeout.as_millis() as u64;
            tracing::warn!(
                drain_timeout_ms,
                "shutdown abandons the final snapshot at the drain bound; the next primary publishes its own snapshot"
            );
        }
    }
}

/// The exit for a writer that stopped, with its reason.
fn writer_failed(writer: &Writer) -> Exit {
    let reason = writer
        .status()
        .stopped
        .map_or_else(|| "a write failed".to_owned(), |reason| reason.to_string());
    Exit::WriterFailed(reason)
}

/// Waits for the publication in flight, if any; pending forever otherwise.
async fn until_published<F: Future<Output = Published>>(
    publishing: &mut Option<std::pin::Pin<Box<F>>>,
) -> Published {
    match publishing {
        Some(publication) => publication.await,
        None => std::future::pending().await,
    }
}

/// Whether records were applied since the last snapshot.
fn snapshot_pending<M: StateMachine>(shared: &Shared<M>) -> bool {
    let last = shared.info().last_snapshot_index;
    last.is_none_or(|last| shared.applied_end() > last)
}

/// Whether a snapshot is due (see [`schedule`](super::schedule)), the last
/// publication having started at `since`.
fn snapshot_due<M: StateMachine>(shared: &Shared<M>, since: tokio::time::Instant) -> bool {
    let (last, snapshot_applied_bytes, snapshot_bytes) = {
        let info = shared.info();
        let snapshot_bytes = info.head.as_ref().map_or(0, |head| head.payload_size_bytes);
        (
            info.last_snapshot_index,
            info.snapshot_applied_bytes,
            snapshot_bytes,
        )
    };
    let (applied_end, applied_bytes) = {
        let core = shared.core();
        (core.applied_end(), core.applied_bytes())
    };
    let since = SinceSnapshot {
        records: applied_end
            .0
            .saturating_sub(last.unwrap_or(RecordIndex(0)).0),
        log_bytes: applied_bytes.saturating_sub(snapshot_applied_bytes),
        snapshot_bytes,
        elapsed: since.elapsed(),
    };
    schedule::snapshot_due(&shared.config, &since)
}

/// A consistent copy of the state, encoded off the state lock, and the
/// core's applied bytes when it was taken.
async fn checkpoint<M: StateMachine>(shared: &Shared<M>) -> Result<(NewSnapshot, u64), String> {
    let (checkpoint, wal_index, applied_bytes) = {
        let core = shared.core();
        (
            core.machine.checkpoint(),
            core.applied_end(),
            core.applied_bytes(),
        )
    };
    let bytes = tokio::task::spawn_blocking(move || checkpoint.to_bytes())
        .await
        .map_err(|e| format!("encoding the snapshot: {e}"))?
        .map_err(|e| format!("encoding the snapshot: {e}"))?;
    Ok((NewSnapshot { bytes, wal_index }, applied_bytes))
}

/// A finished publication: the store it ran on, and how it went.
type Published = (PublicationStore, Result<(), RuntimeError>);

/// [`publish`] on a store it owns until it ends, so it can run beside the
/// serve loop.
async fn publish_owned<M: StateMachine>(
    shared: Arc<Shared<M>>,
    lease: Arc<LeaseHolder>,
    mut publication: PublicationStore,
) -> Published {
    let outcome = publish(&shared, &lease, &mut publication).await;
    (publication, outcome)
}

/// Publishes a snapshot of the applied state, then truncates the log below
/// it and applies retention. Only the publication can fail the call: the
/// clean-up is retried by the next snapshot.
async fn publish<M: StateMachine>(
    shared: &Shared<M>,
    lease: &LeaseHolder,
    publication: &mut PublicationStore,
) -> Result<(), RuntimeError> {
    timed(shared, Phase::Snapshot, async {
        let (snapshot, applied_bytes) = checkpoint(shared)
            .await
            .map_err(|e| RuntimeError::new(Phase::Snapshot, e, true))?;
        let wal_index = snapshot.wal_index;
        let head = publication
            .publish(lease, snapshot)
            .await
            .map_err(|e| snapshot_error(Phase::Snapshot, e))?;
        tracing::info!(%wal_index, key = %head.snapshot_key(), "published snapshot");
        metrics::counter!("chorus_runtime_snapshots_total").increment(1);
        {
            let mut info = shared.info();
            info.head = Some(head);
            info.last_snapshot_index = Some(wal_index);
            info.snapshot_applied_bytes = applied_bytes;
        }
        let maintenance = crate::log::maintenance::Maintenance::new(&shared.stores.log);
        let progress = crate::log::maintenance::NoProgress;
        if let Err(error) = maintenance
            .truncate_before(wal_index, wal_index, &progress)
            .await
        {
            tracing::warn!(%error, %wal_index, "truncating the log below the snapshot failed");
        }
        if let Err(error) = shared
            .stores
            .snapshots
            .retain(shared.config.keep_payloads)
            .await
        {
            tracing::warn!(%error, "snapshot retention failed");
        }
        Ok(())
    })
    .await
}

/// Applies acknowledged writes in index order and answers their writers.
/// After the first failure nothing more is applied: a later record may still
/// have committed, and the next recovery's replay applies it in order.
async fn apply_in_order<M: StateMachine>(
    shared: Arc<Shared<M>>,
    mut admitted: mpsc::UnboundedReceiver<InFlight<M::Output>>,
    failed: Arc<Notify>,
) {
    let mut broken = false;
    while let Some(in_flight) = admitted.recv().await {
        let outcome = match in_flight.completion.await {
            Ok(receipt) if !broken => {
                let output = shared.apply(receipt.index, in_flight.record);
                Ok(Written {
                    index: receipt.index,
                    output,
                })
            }
            Ok(_) => Err(LogError::Stopped {
                reason: StopReason::Aborted,
                may_have_committed: true,
            }),
            Err(error) => {
                if !broken {
                    failed.notify_one();
                }
                broken = true;
                Err(error)
            }
        };
        let _ = in_flight.reply.send(outcome);
    }
}

/// Refreshes the lease every third of its ttl and tells the primary when it
/// is lost. A failed refresh is retried sooner; meanwhile the holder's own
/// deadline stops writes if the lease cannot be proven in time.
struct LeaseKeeper {
    task: JoinHandle<()>,
    lost: Arc<Notify>,
    /// Set before `lost` is notified when the cause was the store's, not
    /// another holder's.
    store_failure: Arc<std::sync::Mutex<Option<String>>>,
}

/// What a failed refresh means for the keeper.
#[derive(Debug, PartialEq, Eq)]
enum RefreshFailure {
    /// Transient: try again sooner.
    Retry,
    /// Another holder took the lease, or it was released or fenced.
    Lost,
    /// The store failed terminally: the lease is not proven, but not lost
    /// to anyone either.
    Store,
}

impl RefreshFailure {
    fn of(error: &LeaseError) -> RefreshFailure {
        match error {
            _ if error.is_transient() => RefreshFailure::Retry,
            LeaseError::Store(_) => RefreshFailure::Store,
            LeaseError::Document(_)
            | LeaseError::Held { .. }
            | LeaseError::LostRace { .. }
            | LeaseError::Stale { .. }
            | LeaseError::Fenced { .. } => RefreshFailure::Lost,
        }
    }
}

impl LeaseKeeper {
    fn start(lease: Arc<LeaseHolder>, ttl: Duration) -> LeaseKeeper {
        let lost = Arc::new(Notify::new());
        let store_failure = Arc::new(std::sync::Mutex::new(None));
        let signal = Arc::clone(&lost);
        let failure = Arc::clone(&store_failure);
        let task = tokio::spawn(async move {
            let mut wait = ttl / 3;
            loop {
                tokio::time::sleep(wait).await;
                let Err(error) = lease.refresh().await else {
                    wait = ttl / 3;
                    continue;
                };
                match RefreshFailure::of(&error) {
                    RefreshFailure::Retry => {
                        tracing::warn!(%error, "lease refresh failed; retrying");
                        wait = ttl / 10;
                        continue;
                    }
                    RefreshFailure::Lost => tracing::warn!(%error, "lease lost"),
                    RefreshFailure::Store => {
                        tracing::warn!(%error, "lease refresh failed with a store error");
                        *failure.lock().expect("not poisoned") = Some(error.to_string());
                    }
                }
                signal.notify_one();
                return;
            }
        });
        LeaseKeeper {
            task,
            lost,
            store_failure,
        }
    }

    /// The exit its notification stands for.
    fn exit(&self) -> Exit {
        match self.store_failure.lock().expect("not poisoned").take() {
            Some(error) => Exit::LeaseStoreFailed(error),
            None => Exit::LeaseLost,
        }
    }

    fn stop(self) {
        drop(self);
    }
}

impl Drop for LeaseKeeper {
    /// The refresh task ends with its primary, however that ends (an
    /// aborted supervisor drops it mid-await).
    fn drop(&mut self) {
        self.task.abort();
    }
}

// A boot step is retried unless waiting cannot help. Damaged or unreadable
// data counts as retryable: a corrupt read may be corruption in transit that
// the next read does not see, a HEAD may name a payload that retention just
// removed, and an operator's repair must not need a restart. The supervisor
// backs off exponentially, so a lasting problem costs little while it lasts.

fn snapshot_error(phase: Phase, error: SnapshotError) -> RuntimeError {
    let transient = !matches!(
        error,
        SnapshotError::WrongState { .. } | SnapshotError::Rewind { .. }
    );
    RuntimeError::new(phase, error, transient)
}

fn lease_error(phase: Phase, error: LeaseError) -> RuntimeError {
    let transient = error.is_transient() || matches!(error, LeaseError::Document(_));
    RuntimeError::new(phase, error, transient)
}

// `InvalidCheckpoint` is retried too: a replay from a state the log was
// truncated past (another primary snapshotted and truncated while this boot
// stalled) succeeds on the next boot, which restores the newer HEAD.
fn log_error(phase: Phase, error: LogError) -> RuntimeError {
    let transient = !matches!(
        error,
        LogError::RecordTooLarge { .. }
            | LogError::InvalidFloor { .. }
            | LogError::Config(_)
            | LogError::EpochExhausted(_)
    );
    RuntimeError::new(phase, error, transient)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blob::{BlobError, Op};
    use crate::lease::{DatabaseKey, Generation, HolderId};

    #[test]
    fn a_refresh_failing_in_the_store_is_not_a_takeover() {
        let database = DatabaseKey::new("db").unwrap();
        let failed = BlobError::backend(
            "file:///s",
            Op::Update,
            "db/lease.json",
            "Too many open files",
        );
        let unavailable =
            BlobError::unavailable("file:///s", Op::Update, "db/lease.json", "timeout");
        let stale = LeaseError::Stale {
            database: database.clone(),
            holder: HolderId::new("a").unwrap(),
            generation: Generation(1),
        };
        assert_eq!(
            RefreshFailure::of(&LeaseError::Store(failed)),
            RefreshFailure::Store
        );
        assert_eq!(
            RefreshFailure::of(&LeaseError::Store(unavailable)),
            RefreshFailure::Retry
        );
        assert_eq!(RefreshFailure::of(&stale), RefreshFailure::Lost);
        assert_eq!(
            RefreshFailure::of(&LeaseError::LostRace { database }),
            RefreshFailure::Retry
        );
    }
}
