//! SlateDB's WAL writer on a Chorus log.
//!
//! Each write batch becomes one record the moment SlateDB appends it, so the
//! log's group commit decides when bytes go out, not a flush timer: under
//! light load a batch is on its way to the replicas at once and durable one
//! quorum round trip later. A flush only waits for what was appended before
//! it. Acknowledgements arrive in record order; each one marks its WAL file
//! (and every earlier one) flushed and tells SlateDB, which then releases the
//! puts waiting for durability.
//!
//! `append` never waits. Batches go through a queue to a submitting task,
//! which holds them while the log's in-flight budget is spent; the queued
//! bytes count in [`WalStatus::estimated_bytes`], which is what SlateDB's own
//! backpressure (`max_unflushed_bytes`) reads. (Waiting in `append` instead
//! would stall SlateDB's write loop while its callers' batches pile up
//! uncounted in front of it.)

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chorus::log::{Completion, LogError, Writer};
use futures::FutureExt;
use slatedb::RowEntry;
use slatedb::wal::{WalError, WalFlushResult, WalObserver, WalStatus, WalWriter};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::batch;
use crate::error::{internal_error, not_durable_at_close, shutdown_error, wal_error};
use crate::ids::wal_id;
use crate::options::ChorusWalOptions;
use crate::status::{Observer, SharedStatus};

/// The longest a batch refused for room waits before asking again. Room in
/// the in-flight budget comes with an acknowledgement, which wakes it
/// sooner; a full active segment empties when its fold lands, which nothing
/// here is told of.
const REFUSED_RETRY: Duration = Duration::from_millis(10);

/// What the submitting task is asked to do, in order.
enum Submission {
    /// Append a batch's record, which must become WAL file `wal_id`.
    Batch {
        wal_id: u64,
        seq: u64,
        record: Bytes,
    },
    /// Everything before was submitted: shut the log writer down, draining
    /// until the deadline `close` set.
    Close { reply: CloseReply },
}

/// Where the submitting task answers a close: the log writer's shutdown.
type CloseReply = oneshot::Sender<Result<(), LogError>>;

/// An appended record on its way to durability.
struct Pending {
    wal_id: u64,
    /// The highest sequence number among its rows.
    seq: u64,
    bytes: usize,
    completion: Completion,
}

/// Durable bytes after a given WAL file: what a restart would replay.
///
/// Only acknowledged files count. SlateDB asks with the replay point of its
/// newest frozen memtable, which is at most the last acknowledged file; were
/// files still in flight counted too, a backlog above the bound would make
/// every write freeze a memtable of its own.
#[derive(Debug, Default)]
pub(crate) struct Unflushed {
    /// `(wal_id, bytes)` of each durable record not yet known to be in L0.
    records: VecDeque<(u64, u64)>,
    bytes: u64,
}

impl Unflushed {
    /// Counts a record.
    pub(crate) fn push(&mut self, wal_id: u64, bytes: u64) {
        self.records.push_back((wal_id, bytes));
        self.bytes += bytes;
    }

    /// Bytes in files after `replay_after_wal_id`; forgets the ones before.
    fn after(&mut self, replay_after_wal_id: u64) -> u64 {
        while let Some(&(id, bytes)) = self.records.front() {
            if id > replay_after_wal_id {
                break;
            }
            self.records.pop_front();
            self.bytes -= bytes;
        }
        self.bytes
    }
}

/// The [`WalWriter`] SlateDB appends to, over a started Chorus [`Writer`].
pub(crate) struct ChorusWalWriter {
    status: Arc<SharedStatus>,
    /// `None` once closed.
    submissions: Option<mpsc::UnboundedSender<Submission>>,
    ack_task: Option<JoinHandle<()>>,
    /// The id the next appended batch gets. Records are appended one at a
    /// time, in order, by one task, and a refused append consumes no index,
    /// so ids are known before the log assigns the indices.
    next_wal_id: u64,
    /// Filled by the acknowledging task.
    unflushed: Arc<Mutex<Unflushed>>,
    /// When closing gives up on batches not yet durable; set by `close`.
    closing: Arc<OnceLock<Instant>>,
    options: ChorusWalOptions,
}

impl ChorusWalWriter {
    /// A WAL writer appending with `writer`, whose files up to `status`'s
    /// last flushed id are durable, `unflushed` of them not yet in L0.
    pub(crate) fn start(
        writer: Writer,
        status: Arc<SharedStatus>,
        unflushed: Unflushed,
        options: ChorusWalOptions,
    ) -> ChorusWalWriter {
        let (acks, pending) = mpsc::unbounded_channel();
        let (submissions, submitted) = mpsc::unbounded_channel();
        let unflushed = Arc::new(Mutex::new(unflushed));
        let ack_task = tokio::spawn(acknowledge(
            pending,
            Arc::clone(&status),
            Arc::clone(&unflushed),
        ));
        let closing = Arc::new(OnceLock::new());
        tokio::spawn(submit(
            writer,
            submitted,
            acks,
            Arc::clone(&status),
            Arc::clone(&closing),
        ));
        let next_wal_id = status.watch().borrow().last_flushed_wal_id + 1;
        ChorusWalWriter {
            status,
            submissions: Some(submissions),
            ack_task: Some(ack_task),
            next_wal_id,
            unflushed,
            closing,
            options,
        }
    }

    /// Why the WAL closed (`Closed` if it has not).
    fn closed_reason(&self) -> WalError {
        self.status
            .get()
            .err()
            .and_then(|status| status.closed_reason)
            .unwrap_or(WalError::Closed)
    }

    /// Closes the WAL for `error` and returns it.
    fn fail(&self, error: WalError) -> WalError {
        self.status.close(error.clone());
        error
    }
}

/// The submitting task: feeds the submitted batches to the log writer, then
/// shuts the writer down when asked to close (draining until the deadline
/// `close` set), or aborts it when the WAL must stop.
async fn submit(
    writer: Writer,
    submissions: mpsc::UnboundedReceiver<Submission>,
    acks: mpsc::UnboundedSender<Pending>,
    status: Arc<SharedStatus>,
    closing: Arc<OnceLock<Instant>>,
) {
    match feed(&writer, submissions, acks, &status, &closing).await {
        Some(reply) => {
            let deadline = *closing
                .get()
                .expect("close sets its deadline before asking");
            let timeout = deadline.saturating_duration_since(Instant::now());
            let _ = reply.send(writer.shutdown(timeout).await);
        }
        None => writer.abort(),
    }
}

/// Appends the submitted batches in order, holding each while the log's
/// in-flight budget is spent, and hands their completions to the
/// acknowledging task. Returns the reply channel of a close request, or
/// `None` when the WAL must stop: it closed, closing reached its deadline,
/// the log refused a batch, or the WAL writer is gone without closing (a
/// crash).
async fn feed(
    writer: &Writer,
    mut submissions: mpsc::UnboundedReceiver<Submission>,
    acks: mpsc::UnboundedSender<Pending>,
    status: &SharedStatus,
    closing: &OnceLock<Instant>,
) -> Option<CloseReply> {
    let mut acked = status.watch();
    while let Some(submission) = submissions.recv().await {
        let (expected, seq, record) = match submission {
            Submission::Batch {
                wal_id,
                seq,
                record,
            } => (wal_id, seq, record),
            Submission::Close { reply } => return Some(reply),
        };
        let completion = loop {
            if status.get().is_err() {
                return None;
            }
            // Closing waits for the queue only until its deadline: behind
            // slow replicas, draining it could take far longer.
            if closing
                .get()
                .is_some_and(|deadline| Instant::now() >= *deadline)
            {
                status.close(not_durable_at_close(format!(
                    "closing reached shutdown_timeout with WAL file {expected} and the \
                     batches after it still queued; they are not durable"
                )));
                return None;
            }
            // Read before asking, so an ack landing in between still wakes us.
            let flushed = acked.borrow().last_flushed_wal_id;
            match writer.append(record.clone()) {
                Ok(completion) => break completion,
                // Nothing was taken; acks or the fold will make room.
                Err(LogError::Backpressure { .. } | LogError::ActiveSegmentFull { .. }) => {
                    let more_acked = acked
                        .wait_for(|s| s.closed_reason.is_some() || s.last_flushed_wal_id > flushed);
                    let _ = tokio::time::timeout(REFUSED_RETRY, more_acked).await;
                }
                Err(error) => {
                    status.close(wal_error(error));
                    return None;
                }
            }
        };
        let appended = wal_id(completion.index());
        if appended != expected {
            status.close(internal_error(format!(
                "WAL file {expected} was appended as record {}: another appender on this log?",
                completion.index()
            )));
            return None;
        }
        let pending = Pending {
            wal_id: appended,
            seq,
            bytes: record.len(),
            completion,
        };
        acks.send(pending).ok()?;
    }
    None
}

/// Resolves appends in record order, counting each one's WAL file toward the
/// replay bound and then marking it flushed; the first failure closes the WAL.
async fn acknowledge(
    mut pending: mpsc::UnboundedReceiver<Pending>,
    status: Arc<SharedStatus>,
    unflushed: Arc<Mutex<Unflushed>>,
) {
    while let Some(record) = pending.recv().await {
        match record.completion.await {
            Ok(_) => {
                unflushed
                    .lock()
                    .expect("unflushed lock poisoned")
                    .push(record.wal_id, record.bytes as u64);
                status.flushed(record.wal_id, record.seq, record.bytes);
            }
            Err(error) => {
                let what = format!("WAL file {}", record.wal_id);
                status.close(shutdown_error(error, &what));
                return;
            }
        }
    }
}

#[async_trait]
impl WalWriter for ChorusWalWriter {
    async fn append(&mut self, write_batch: &[RowEntry]) -> Result<(), WalError> {
        self.status.get().map_err(WalError::from)?;
        let record = batch::encode(write_batch)
            .map_err(|error| self.fail(WalError::InternalError(Arc::new(error))))?;
        let max = self.options.log.max_record_bytes;
        if record.len() as u64 > max {
            // Refused before it is queued and without closing the WAL, so
            // the batches before it still drain when SlateDB, which stops
            // on any append error, closes the WAL.
            return Err(internal_error(format!(
                "a write batch of {} bytes (encoded) is larger than the largest Chorus \
                 record, {max} bytes (ChorusWalOptions::log.max_record_bytes; up to 64 MiB \
                 with max_fragment_bytes above it); the database stops writing, and the \
                 batches before this one are kept",
                record.len()
            )));
        }
        let seq = write_batch.iter().map(|row| row.seq).max().unwrap_or(0);
        let wal_id = self.next_wal_id;
        let bytes = record.len();
        let submission = Submission::Batch {
            wal_id,
            seq,
            record,
        };
        // Counted before it is sent: its acknowledgement, which uncounts it,
        // may arrive before `send` returns.
        self.status.admitted(bytes);
        match &self.submissions {
            Some(submissions) if submissions.send(submission).is_ok() => {}
            _ => return Err(WalError::Closed),
        }
        self.next_wal_id += 1;
        Ok(())
    }

    async fn flush(&mut self) -> Result<WalFlushResult, WalError> {
        self.status.get().map_err(WalError::from)?;
        let wal_id = self.next_wal_id - 1;
        let mut watch = self.status.watch();
        let completion = async move {
            let status = watch
                .wait_for(|s| s.closed_reason.is_some() || s.last_flushed_wal_id >= wal_id)
                .await
                .map_err(|_| WalError::Closed)?
                .clone();
            match status.closed_reason {
                Some(reason) if status.last_flushed_wal_id < wal_id => Err(reason),
                _ => Ok(()),
            }
        }
        .boxed();
        Ok(WalFlushResult { wal_id, completion })
    }

    fn should_flush_memtable(&self, replay_after_wal_id: u64) -> bool {
        self.unflushed
            .lock()
            .expect("unflushed lock poisoned")
            .after(replay_after_wal_id)
            >= self.options.max_unflushed_bytes
    }

    fn observer(&self) -> Box<dyn WalObserver> {
        Box::new(Observer(Arc::clone(&self.status)))
    }

    fn status(&self) -> Result<WalStatus, WalStatus> {
        self.status.get()
    }

    async fn close(&mut self) -> Result<(), WalError> {
        let Some(submissions) = self.submissions.take() else {
            return self
                .status
                .get()
                .map(drop)
                .or_else(|status| match status.closed_reason {
                    Some(WalError::Closed) | None => Ok(()),
                    Some(reason) => Err(reason),
                });
        };
        let (reply, drained) = oneshot::channel();
        let _ = self
            .closing
            .set(Instant::now() + self.options.shutdown_timeout);
        let drained = match submissions.send(Submission::Close { reply }) {
            Ok(()) => drained.await.ok(),
            Err(_) => None,
        };
        // Every admitted record has resolved now: let the acknowledgements
        // finish before reporting the final status.
        if let Some(task) = self.ack_task.take()
            && let Err(error) = task.await
        {
            self.status.close(internal_error(format!(
                "the WAL's acknowledging task failed: {error}"
            )));
        }
        match drained {
            // Everything drained; unless something closed the WAL first.
            Some(Ok(())) => {
                self.status.close(WalError::Closed);
                match self.closed_reason() {
                    WalError::Closed => Ok(()),
                    reason => Err(reason),
                }
            }
            Some(Err(error)) => {
                self.status
                    .close(shutdown_error(error, "the batches appended before it"));
                Err(self.closed_reason())
            }
            // The submitting task stopped first: the status says why.
            None => Err(self.closed_reason()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chorus::blob::ObjectStoreBlobs;
    use chorus::blob::{DynBlobStore, Fault, FaultController, FaultRule, FaultyStore};
    use chorus::log::{LogConfig, LogStores, Recovery};
    use chorus::register::{ManifestStore, MemoryRegister, initialize};
    use object_store::memory::InMemory;
    use slatedb::ValueDeletable;

    use super::*;

    /// A started WAL writer on a new log of three in-memory replicas, all
    /// behind the returned fault controller.
    async fn writer_on_new_log(options: ChorusWalOptions) -> (ChorusWalWriter, FaultController) {
        let register: Arc<dyn ManifestStore> = Arc::new(MemoryRegister::new());
        let faults = FaultController::new(1);
        let replicas: Vec<(String, DynBlobStore)> = (0..3)
            .map(|position| {
                let identity = format!("memory://replica-{position}");
                let store: DynBlobStore = Arc::new(ObjectStoreBlobs::new(
                    Arc::new(InMemory::new()),
                    "",
                    identity.clone(),
                ));
                let faulty: DynBlobStore = Arc::new(FaultyStore::new(store, faults.clone()));
                (identity, faulty)
            })
            .collect();
        let identities = replicas
            .iter()
            .map(|(identity, _)| identity.clone())
            .collect();
        initialize(register.as_ref(), identities, 8).await.unwrap();
        let stores = LogStores { replicas, register };
        let recovery = Recovery::run(stores, options.log.clone()).await.unwrap();
        let mut replay = recovery.replay(recovery.floor()).unwrap();
        assert!(replay.next().await.unwrap().is_none(), "a new log is empty");
        let writer = recovery.start().await.unwrap();
        let status = SharedStatus::new(0, None);
        let wal = ChorusWalWriter::start(writer, status, Unflushed::default(), options);
        (wal, faults)
    }

    fn rows(bytes: usize) -> Vec<RowEntry> {
        vec![RowEntry {
            key: Bytes::from_static(b"k"),
            value: ValueDeletable::Value(Bytes::from(vec![0; bytes])),
            seq: 1,
            create_ts: None,
            expire_ts: None,
        }]
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_acknowledged_bytes_ask_for_a_memtable_flush() {
        let options = ChorusWalOptions {
            max_unflushed_bytes: 4096,
            ..ChorusWalOptions::default()
        };
        let (mut wal, replicas) = writer_on_new_log(options).await;
        // Every request fails (and is retried) until the outage ends, so
        // nothing can be acknowledged meanwhile, however slow the machine.
        replicas.set_outage(true);
        for _ in 0..8 {
            wal.append(&rows(1024)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        // 8 KiB appended, none of it durable: a restart would replay none
        // of it, and freezing a memtable per write would not help.
        assert_eq!(
            wal.status().unwrap().last_flushed_wal_id,
            0,
            "still in flight"
        );
        assert!(!wal.should_flush_memtable(0));

        let flushed = wal.flush().await.unwrap();
        replicas.set_outage(false);
        tokio::time::timeout(Duration::from_secs(30), flushed.completion)
            .await
            .expect("the batches become durable once the replicas answer")
            .unwrap();
        assert!(wal.should_flush_memtable(0));
        assert!(!wal.should_flush_memtable(flushed.wal_id));
        wal.close().await.unwrap();
    }

    #[test]
    fn unflushed_bytes_count_only_files_after_the_replay_point() {
        let mut unflushed = Unflushed::default();
        for id in 1..=4 {
            unflushed.push(id, 10 * id);
        }
        assert_eq!(unflushed.after(0), 100);
        assert_eq!(unflushed.after(2), 70);
        // Forgotten files stay forgotten; an older replay point changes nothing.
        assert_eq!(unflushed.after(1), 70);
        assert_eq!(unflushed.after(4), 0);
        unflushed.push(5, 1);
        assert_eq!(unflushed.after(4), 1);
    }

    /// SlateDB flushes before it closes the WAL, so this bound matters when
    /// that flush failed or the WAL is closed on its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn closing_gives_up_on_queued_batches_at_shutdown_timeout() {
        let options = ChorusWalOptions {
            log: LogConfig {
                max_inflight_bytes: 2048,
                max_record_bytes: 2048,
                ..LogConfig::default()
            },
            shutdown_timeout: Duration::from_secs(1),
            ..ChorusWalOptions::default()
        };
        let (mut wal, replicas) = writer_on_new_log(options).await;
        // A second per answer: the lanes live (below lane_stall_timeout),
        // and with room for one batch in flight (an encoded batch is a
        // little over 1 KiB) the queue drains at about one a second.
        replicas.add(FaultRule::new(Fault::Delay(Duration::from_secs(1))));
        for _ in 0..30 {
            wal.append(&rows(1024)).await.unwrap();
        }
        let error = tokio::time::timeout(Duration::from_secs(10), wal.close())
            .await
            .expect("close returns at its deadline, not when the queue drains")
            .expect_err("batches were dropped: no clean close");
        assert!(
            error.to_string().contains("shutdown_timeout"),
            "the error should say closing gave up: {error}"
        );
        // About one batch became durable in the second closing waited.
        assert!(wal.status().unwrap_err().last_flushed_wal_id <= 5);
    }
}
