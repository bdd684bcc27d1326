//! SlateDB's WAL writer on a Chorus log.
//!
//! Each write batch becomes one record the moment SlateDB appends it, so the
//! log's group commit decides when bytes go out, not a flush timer: under
//! light load a batch is on its way to the replicas at once and durable one
//! quorum round trip later. A flush only waits for what was appended before
//! it. Acknowledgements arrive in record order; each one marks its WAL file
//! (and every earlier one) flushed and tells SlateDB, which then releases the
//! puts waiting for durability.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chorus::log::{Completion, LogError, Writer};
use futures::FutureExt;
use slatedb::RowEntry;
use slatedb::wal::{WalError, WalFlushResult, WalObserver, WalStatus, WalWriter};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::batch;
use crate::error::wal_error;
use crate::ids::wal_id;
use crate::options::ChorusWalOptions;
use crate::status::{Observer, SharedStatus};

/// How long an append refused for backpressure waits before asking again.
const BACKPRESSURE_PAUSE: Duration = Duration::from_millis(1);

/// An appended record on its way to durability.
struct Pending {
    wal_id: u64,
    /// The highest sequence number among its rows.
    seq: u64,
    bytes: usize,
    completion: Completion,
}

/// Bytes appended after a given WAL file: what a restart would replay.
#[derive(Debug, Default)]
pub(crate) struct Unflushed {
    /// `(wal_id, bytes)` of each record not yet known to be in L0.
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
    /// `None` once closed.
    writer: Option<Writer>,
    status: Arc<SharedStatus>,
    acks: Option<mpsc::UnboundedSender<Pending>>,
    ack_task: Option<JoinHandle<()>>,
    /// The id of the newest WAL file appended, or the newest durable one at
    /// start.
    last_appended: u64,
    unflushed: Mutex<Unflushed>,
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
        let ack_task = tokio::spawn(acknowledge(pending, Arc::clone(&status)));
        let last_appended = status.watch().borrow().last_flushed_wal_id;
        ChorusWalWriter {
            writer: Some(writer),
            status,
            acks: Some(acks),
            ack_task: Some(ack_task),
            last_appended,
            unflushed: Mutex::new(unflushed),
            options,
        }
    }

    /// The open writer, or why there is none.
    fn writer(&self) -> Result<&Writer, WalError> {
        self.status.get().map_err(WalError::from)?;
        self.writer.as_ref().ok_or(WalError::Closed)
    }

    /// Closes the WAL for `error` and returns it.
    fn fail(&self, error: WalError) -> WalError {
        self.status.close(error.clone());
        error
    }
}

/// Resolves appends in record order, marking each one's WAL file flushed;
/// the first failure closes the WAL.
async fn acknowledge(mut pending: mpsc::UnboundedReceiver<Pending>, status: Arc<SharedStatus>) {
    while let Some(record) = pending.recv().await {
        match record.completion.await {
            Ok(_) => status.flushed(record.wal_id, record.seq, record.bytes),
            Err(error) => {
                status.close(wal_error(error));
                return;
            }
        }
    }
}

#[async_trait]
impl WalWriter for ChorusWalWriter {
    async fn append(&mut self, write_batch: &[RowEntry]) -> Result<(), WalError> {
        let record = batch::encode(write_batch)
            .map_err(|error| self.fail(WalError::InternalError(Arc::new(error))))?;
        let seq = write_batch.iter().map(|row| row.seq).max().unwrap_or(0);
        let completion = loop {
            match self.writer()?.append(record.clone()) {
                Ok(completion) => break completion,
                // The in-flight budget is spent, or the active segment is
                // full until a rotation lands: nothing was taken, and acks or
                // the fold will make room.
                Err(LogError::Backpressure { .. } | LogError::ActiveSegmentFull { .. }) => {
                    tokio::time::sleep(BACKPRESSURE_PAUSE).await;
                }
                Err(error) => return Err(self.fail(wal_error(error))),
            }
        };
        let wal_id = wal_id(completion.index());
        self.status.admitted(record.len());
        self.unflushed
            .lock()
            .expect("unflushed lock poisoned")
            .push(wal_id, record.len() as u64);
        self.last_appended = wal_id;
        let pending = Pending {
            wal_id,
            seq,
            bytes: record.len(),
            completion,
        };
        match self.acks.as_ref().map(|acks| acks.send(pending)) {
            Some(Ok(())) => Ok(()),
            _ => Err(WalError::Closed),
        }
    }

    async fn flush(&mut self) -> Result<WalFlushResult, WalError> {
        self.status.get().map_err(WalError::from)?;
        let wal_id = self.last_appended;
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
        let Some(writer) = self.writer.take() else {
            return self
                .status
                .get()
                .map(drop)
                .or_else(|status| match status.closed_reason {
                    Some(WalError::Closed) | None => Ok(()),
                    Some(reason) => Err(reason),
                });
        };
        let drained = writer.shutdown(self.options.shutdown_timeout).await;
        // Every admitted record has resolved now: let the acknowledgements
        // finish before reporting the final status.
        self.acks = None;
        if let Some(task) = self.ack_task.take() {
            let _ = task.await;
        }
        match drained {
            Ok(()) => {
                self.status.close(WalError::Closed);
                Ok(())
            }
            Err(error) => Err(self.fail(wal_error(error))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
