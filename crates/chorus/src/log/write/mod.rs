//! The write path (docs/protocol.md, Writing): immediate admission, group
//! commit over one lane per replica, in-order completions, rotation.

mod admission;
mod background;
mod hedge;
mod lane;
mod pacer;
mod pipeline;
mod rotation;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};

use admission::Admission;
pub use admission::MAX_DIRECTORY_ENTRY_BYTES;
use pipeline::{Pipeline, Start};

use super::config::LogConfig;
use super::error::{LogError, StopReason};
use super::maintenance::{Maintenance, TruncateReport};
use super::recovery::Recovery;
use crate::ids::{Epoch, RecordIndex};

/// Proof that an append is durable on a quorum of replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    /// The record's index.
    pub index: RecordIndex,
}

/// The outcome of one append: resolves to a [`Receipt`] once the record is
/// durable, or to an error. Completions resolve in index order. Dropping it
/// does not cancel the append.
#[derive(Debug)]
pub struct Completion {
    index: RecordIndex,
    receiver: oneshot::Receiver<Result<Receipt, LogError>>,
}

impl Completion {
    /// The index the record was admitted at.
    pub fn index(&self) -> RecordIndex {
        self.index
    }
}

impl Future for Completion {
    type Output = Result<Receipt, LogError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.receiver).poll(cx).map(|outcome| {
            outcome.unwrap_or(Err(LogError::Stopped {
                reason: StopReason::Aborted,
                may_have_committed: true,
            }))
        })
    }
}

/// State shared by the [`Writer`] handle and its pipeline task.
#[derive(Debug)]
pub(super) struct Shared {
    admission: Mutex<Admission>,
    /// Signalled after a degraded seal: repair should run now.
    repair_wanted: tokio::sync::Notify,
}

impl Shared {
    fn admission(&self) -> MutexGuard<'_, Admission> {
        self.admission.lock().expect("admission lock poisoned")
    }
}

/// Requests from the handle to the pipeline.
#[derive(Debug)]
enum Command {
    Shutdown {
        timeout: Duration,
        reply: oneshot::Sender<Result<(), LogError>>,
    },
    Abort,
}

/// A point-in-time view of a writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterStatus {
    /// The writer's epoch.
    pub epoch: Epoch,
    /// The index the next admitted record gets.
    pub next_index: RecordIndex,
    /// Bytes admitted and not yet durable.
    pub inflight_bytes: u64,
    /// Records admitted and not yet durable.
    pub inflight_records: u64,
    /// Why the writer stopped, if it did.
    pub stopped: Option<StopReason>,
}

/// The single writer of a log, started by [`Recovery::start`].
#[derive(Debug)]
pub struct Writer {
    shared: Arc<Shared>,
    config: LogConfig,
    epoch: Epoch,
    commands: mpsc::UnboundedSender<Command>,
    maintenance: Maintenance,
    truncations: Arc<background::Truncations>,
    /// Turns true once the pipeline task ended, however it ended (a stop
    /// for any reason, or a panic): see [`Writer::stopped`].
    ended: watch::Receiver<bool>,
    /// The background maintenance task; it ends with the writer, so a pass
    /// still running cannot outlive a shutdown (maintenance may stop at any
    /// point).
    background: tokio::task::JoinHandle<()>,
}

impl Writer {
    pub(super) fn spawn(recovery: Recovery) -> Writer {
        let (sender, admitted) = mpsc::unbounded_channel();
        let (commands, command_receiver) = mpsc::unbounded_channel();
        let manifest = recovery.manifest.clone();
        let admission = Admission::new(
            &manifest,
            recovery.stores.register.max_directory_bytes(),
            sender,
        );
        let shared = Arc::new(Shared {
            admission: Mutex::new(admission),
            repair_wanted: tokio::sync::Notify::new(),
        });
        let maintenance = Maintenance::from_parts(
            recovery.replicas.clone(),
            Arc::clone(&recovery.stores.register),
            recovery.config.register_rounds,
        );
        let background = tokio::spawn(background::run(
            Arc::downgrade(&shared),
            maintenance.clone(),
            recovery.config.clone(),
        ));
        let start = Start {
            shared: Arc::clone(&shared),
            config: recovery.config.clone(),
            ownership: recovery.ownership,
            register: Arc::clone(&recovery.stores.register),
            replicas: recovery.replicas.clone(),
            manifest,
        };
        let pipeline = tokio::spawn(Pipeline::run(start, admitted, command_receiver));
        let (end, ended) = watch::channel(false);
        tokio::spawn(async move {
            let _ = pipeline.await;
            end.send_replace(true);
        });
        Writer {
            ended,
            shared,
            config: recovery.config.clone(),
            epoch: recovery.ownership.epoch,
            commands,
            maintenance,
            truncations: Arc::default(),
            background,
        }
    }

    /// Admits `payload` or refuses it immediately; a refusal consumes no index.
    /// The returned [`Completion`] resolves once the record is durable.
    pub fn append(&self, payload: impl Into<Bytes>) -> Result<Completion, LogError> {
        let (index, receiver) = self
            .shared
            .admission()
            .admit(payload.into(), &self.config)?;
        Ok(Completion { index, receiver })
    }

    /// Raises the truncation floor to `floor` (at most the durable end) and
    /// deletes what lies wholly below it, in the caller's task, never on the
    /// append path. Concurrent calls merge into the highest floor.
    pub async fn truncate_before(&self, floor: RecordIndex) -> Result<TruncateReport, LogError> {
        self.truncations
            .truncate(&self.shared, &self.maintenance, floor)
            .await
    }

    /// The writer's epoch.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// A point-in-time view of the writer.
    pub fn status(&self) -> WriterStatus {
        let admission = self.shared.admission();
        WriterStatus {
            epoch: self.epoch,
            next_index: admission.next_index,
            inflight_bytes: admission.inflight_bytes,
            inflight_records: admission.inflight_records,
            stopped: admission.stopped.clone(),
        }
    }

    /// Resolves once the writer stopped, for whatever reason: a shutdown, an
    /// abort, or a failure found in the background (a seal or fold that was
    /// fenced, a register that refused a transition) while nothing was in
    /// flight, which no completion reports. [`status`](Writer::status) then
    /// says why.
    pub async fn stopped(&self) {
        let mut ended = self.ended.clone();
        let _ = ended.wait_for(|ended| *ended).await;
    }

    /// Stops admitting, waits (at most `timeout`) until everything admitted is
    /// durable, then stops. Appends still outstanding at the deadline fail.
    /// `Ok` only if everything admitted became durable; a writer that stopped
    /// for another reason (before or during the drain) reports that reason.
    pub async fn shutdown(self, timeout: Duration) -> Result<(), LogError> {
        let (reply, outcome) = oneshot::channel();
        let answered = match self.commands.send(Command::Shutdown { timeout, reply }) {
            Ok(()) => outcome.await.ok(),
            Err(_) => None,
        };
        // Wait until the maintenance task is gone, not only told to go: a pass
        // still polled while the runtime shuts down would see its store calls
        // cancelled and report them as failures.
        self.background.abort();
        let _ = self.background.await;
        // No answer: the writer had stopped already, or its task is gone.
        answered.unwrap_or_else(|| {
            let reason = self.shared.admission().stopped.clone();
            Err(LogError::Stopped {
                reason: reason.unwrap_or(StopReason::Aborted),
                may_have_committed: false,
            })
        })
    }

    /// Stops at once: outstanding appends fail (those already written to some
    /// replica with `may_have_committed`).
    pub fn abort(self) {
        self.background.abort();
        let _ = self.commands.send(Command::Abort);
    }
}
