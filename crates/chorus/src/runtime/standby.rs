//! The standby: tails the log to keep a warm copy of the state, and returns
//! to the boot once the primary's lease is free (expired or released).
//!
//! While it tails, it also takes the committed records another node hands
//! it ([`Runtime::offer_committed`](super::Runtime::offer_committed)); the
//! records it reads from the replicas then only confirm those.

use std::sync::Arc;

use super::core::Divergence;
use super::error::{Phase, Role, RuntimeError};
use super::machine::StateMachine;
use super::primary::hydrate;
use super::{Shared, boot_backoff, pause};
use crate::log::{LogError, Reader};

/// Tails the log until the lease is free or a shutdown is asked for; fails
/// only when the state here turns out not to be the log's.
pub(super) async fn run<M: StateMachine>(shared: &Arc<Shared<M>>) -> Result<(), RuntimeError> {
    shared.set_role(Role::Standby);
    let _following = Following::start(shared);
    let config = &shared.config;
    let mut reader = reader_at_applied_end(shared);
    let mut next_check = tokio::time::Instant::now() + config.lease_check_interval;
    let mut stop = shared.stop.subscribe();
    // Consecutive rounds that could not get this standby past the floor.
    let mut stuck = 0u32;
    while !shared.stop_requested() {
        if let Some(divergence) = shared.core().take_divergence() {
            return Err(diverged(divergence));
        }
        if tokio::time::Instant::now() >= next_check {
            if lease_is_free(shared).await {
                return Ok(());
            }
            next_check = tokio::time::Instant::now() + config.lease_check_interval;
        }
        match reader.try_next().await {
            Ok(Some((index, record))) => {
                shared.info().caught_up = false;
                shared.take_committed(index, record).map_err(diverged)?;
            }
            Ok(None) => {
                shared.info().caught_up = true;
                let wait = config
                    .standby_poll_interval
                    .min(config.lease_check_interval);
                let _ = tokio::time::timeout(wait, stop.wait_for(|stop| *stop)).await;
            }
            Err(LogError::Truncated { floor, .. }) => {
                tracing::info!(%floor, applied = %shared.applied_end(), "the log was truncated past this standby; restoring the newest snapshot");
                let problem = match rehydrate(shared).await {
                    Err(error) => Some(format!(
                        "standby could not restore the newest snapshot: {error}"
                    )),
                    // HEAD itself lies below the floor (the log was truncated
                    // by hand past it): downloading it again cannot help.
                    Ok(()) if shared.applied_end() < floor => Some(format!(
                        "the log is truncated at {floor} but the newest snapshot covers only \
                         the records below {}: this standby cannot catch up until a newer \
                         snapshot is published",
                        shared.applied_end()
                    )),
                    Ok(()) => None,
                };
                if let Some(problem) = problem {
                    tracing::warn!(%problem, "standby cannot catch up; retrying");
                    shared.info().last_error = Some(problem);
                    pause(shared, boot_backoff(config.retry_backoff, stuck)).await;
                    stuck = stuck.saturating_add(1);
                } else {
                    stuck = 0;
                }
                reader = reader_at_applied_end(shared);
            }
            Err(error) => {
                tracing::warn!(%error, "standby could not read the log; retrying");
                pause(shared, config.retry_backoff).await;
                reader = reader_at_applied_end(shared);
            }
        }
    }
    Ok(())
}

/// Records handed over by other nodes are taken while this lives.
struct Following<'a, M: StateMachine>(&'a Shared<M>);

impl<'a, M: StateMachine> Following<'a, M> {
    fn start(shared: &'a Shared<M>) -> Following<'a, M> {
        shared.core().set_following(true);
        Following(shared)
    }
}

impl<M: StateMachine> Drop for Following<'_, M> {
    fn drop(&mut self) {
        self.0.core().set_following(false);
    }
}

/// The standby's end when its state is found not to be the log's: serving
/// it further would answer with records no quorum holds.
fn diverged(divergence: Divergence) -> RuntimeError {
    RuntimeError::new(
        Phase::Standby,
        format!(
            "{divergence}: the state here is not the log's prefix, so this standby stops rather \
             than serve it; a restart rebuilds it from the newest snapshot and the log"
        ),
        false,
    )
}

/// A reader from the applied end, which is committed: every applied record
/// was acknowledged or read as committed.
fn reader_at_applied_end<M: StateMachine>(shared: &Shared<M>) -> Reader {
    Reader::resuming(&shared.stores.log, shared.applied_end())
        .with_poll_interval(shared.config.standby_poll_interval)
}

/// Reads the lease: free when absent, released or expired by this node's
/// clock. A read that fails counts as not free.
async fn lease_is_free<M: StateMachine>(shared: &Shared<M>) -> bool {
    let leases = &shared.stores.leases;
    match leases.read().await {
        Ok(None) => true,
        Ok(Some(record)) => {
            let free = !record.is_live(leases.clock().wall_ms());
            shared.info().lease = Some(record);
            free
        }
        Err(error) => {
            tracing::warn!(%error, "standby could not read the lease");
            false
        }
    }
}

/// Restores the snapshot HEAD names now, unless the state here already
/// reflects it.
async fn rehydrate<M: StateMachine>(shared: &Shared<M>) -> Result<(), RuntimeError> {
    let head = shared
        .stores
        .snapshots
        .read_head()
        .await
        .map_err(|e| RuntimeError::new(Phase::Standby, e, true))?
        .ok_or_else(|| RuntimeError::new(Phase::Standby, "no HEAD to restore from", true))?;
    hydrate(shared, &head.head).await
}
