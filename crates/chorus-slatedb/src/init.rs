//! Fencing and recovering the WAL when SlateDB opens a writer.
//!
//! SlateDB has bumped its manifest's writer epoch before it calls
//! [`WriterInit::fence_and_init`]. Chorus recovery then claims a new log
//! epoch in the register: from that compare-and-swap on, every append of an
//! older writer fails (`Fenced`), and the recovered end includes every
//! record an older writer had acknowledged. The records after the
//! manifest's `replay_after_wal_id` are read back for SlateDB to replay
//! before the writer starts.

use std::collections::VecDeque;
use std::time::Duration;

use async_trait::async_trait;
use chorus::log::{ErrorKind, LogStores, Recovery};
use slatedb::wal::{WalError, WalIterator, WalRows, WriterInit, WriterInitResult, WriterManifest};

use crate::batch;
use crate::error::{data_error, wal_error};
use crate::ids::{index_after, wal_id};
use crate::options::ChorusWalOptions;
use crate::status::SharedStatus;
use crate::writer::{ChorusWalWriter, Unflushed};

/// Recoveries tried when one fails transiently (a replica or the register
/// unavailable), each claiming a new epoch, before the open fails.
const RECOVERY_ATTEMPTS: u32 = 5;

/// The pause after the first transiently failed recovery; doubles.
const RECOVERY_BACKOFF: Duration = Duration::from_millis(50);

/// SlateDB's write-ahead log on a Chorus log: give it to
/// [`slatedb::DbBuilder::with_wal_writer`]. Each open fences the previous
/// writer of the log and replays what SlateDB has not yet flushed to L0.
#[derive(Debug, Clone)]
pub struct ChorusWal {
    stores: LogStores,
    options: ChorusWalOptions,
}

impl ChorusWal {
    /// A WAL on the log in `stores`, which must exist (see
    /// [`chorus::register::initialize`]).
    pub fn new(stores: LogStores, options: ChorusWalOptions) -> ChorusWal {
        ChorusWal { stores, options }
    }

    /// Runs recovery, again after a transient failure: one unavailable
    /// replica answer too many fails a recovery, and a database open should
    /// not fail for that.
    ///
    /// Before each attempt SlateDB's manifest is read again: every attempt
    /// claims a new Chorus epoch, and a stale opener must not claim the log,
    /// since whoever wrote a newer manifest epoch may be serving on it and
    /// the claim would fence it. (SlateDB refreshes again after
    /// `fence_and_init`, but by then the harm would be done.)
    async fn recover(&self, manifest: &mut WriterManifest) -> Result<Recovery, WalError> {
        let mut backoff = RECOVERY_BACKOFF;
        let mut attempt = 1;
        loop {
            manifest.refresh().await?;
            match Recovery::run(self.stores.clone(), self.options.log.clone()).await {
                Err(error) if error.kind() == ErrorKind::Retry && attempt < RECOVERY_ATTEMPTS => {
                    tracing::warn!(attempt, %error, "WAL recovery failed transiently; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                    attempt += 1;
                }
                outcome => return outcome.map_err(wal_error),
            }
        }
    }
}

#[async_trait]
impl WriterInit for ChorusWal {
    async fn fence_and_init(
        &self,
        manifest: &mut WriterManifest,
    ) -> Result<WriterInitResult, WalError> {
        let recovery = self.recover(manifest).await?;
        let replay_after = manifest.replay_after_wal_id();
        let from = index_after(replay_after);
        if from < recovery.floor() {
            return Err(data_error(format!(
                "the database replays WAL files after {replay_after}, but the Chorus log \
                 is truncated below record {} (WAL file {}): WAL files it still needs are gone",
                recovery.floor(),
                wal_id(recovery.floor()),
            )));
        }
        if from > recovery.end() {
            return Err(data_error(format!(
                "the database has flushed WAL files up to {replay_after}, but the Chorus \
                 log ends at WAL file {}: is this the database's WAL?",
                recovery.end().0,
            )));
        }
        let mut replay = recovery.replay(from).map_err(wal_error)?;
        let mut batches = VecDeque::new();
        let mut unflushed = Unflushed::default();
        let mut last_seq = None;
        while let Some((index, record)) = replay.next().await.map_err(wal_error)? {
            let file = batch::wal_file(index, &record)?;
            unflushed.push(file.last_consumed_wal_file_id, record.len() as u64);
            last_seq = file.rows.iter().map(|row| row.seq).max().or(last_seq);
            batches.push_back(file);
        }
        // The recovered end is durable: every WAL file up to it is flushed.
        let status = SharedStatus::new(recovery.end().0, last_seq);
        let writer = recovery.start().await.map_err(wal_error)?;
        Ok(WriterInitResult {
            replay_iterator: Box::new(Replayed(batches)),
            wal_writer: Box::new(ChorusWalWriter::start(
                writer,
                status,
                unflushed,
                self.options.clone(),
            )),
        })
    }
}

/// The batches read during recovery, handed to SlateDB in order.
struct Replayed(VecDeque<WalRows>);

#[async_trait]
impl WalIterator for Replayed {
    async fn next(&mut self) -> Result<Option<WalRows>, WalError> {
        Ok(self.0.pop_front())
    }
}
