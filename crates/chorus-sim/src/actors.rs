//! The simulated application's processes: writers, recoveries, readers and
//! maintenance passes, and the task bodies the driver spawns for them.

use std::time::Duration;

use bytes::Bytes;
use chorus::ids::{Epoch, OwnerId, RecordIndex};
use chorus::log::maintenance::{Maintenance, NoProgress};
use chorus::log::{Completion, LogConfig, LogError, LogStores, Reader, Recovery, Writer};
use chorus::register::Manifest;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::model::WriterId;
use crate::world::ActorFaults;

/// Replay attempts of one recovery before it gives up (a replay fails when
/// every replica's copy of a sealed segment reads corrupt or unavailable).
const REPLAY_ATTEMPTS: u32 = 4;

/// One writer incarnation. `writer` is `None` once it crashed.
#[derive(Debug)]
pub struct WriterSlot {
    /// Its id in the simulation.
    pub id: WriterId,
    /// Its epoch.
    pub epoch: Epoch,
    /// The handle, while the process lives.
    pub writer: Option<Writer>,
    /// Faults only this writer sees.
    pub faults: ActorFaults,
    /// Payloads appended so far (names the next payload).
    pub sequence: u64,
}

/// An admitted append whose completion has not resolved.
#[derive(Debug)]
pub struct PendingAppend {
    /// Who admitted it.
    pub writer: WriterId,
    /// Its index.
    pub index: u64,
    /// Its payload.
    pub bytes: Bytes,
    /// Its completion.
    pub completion: Completion,
}

/// Sent by a recovery task as soon as its view is committed, so the checkers
/// learn of it even if the task is aborted during replay.
#[derive(Debug)]
pub struct CommitNotice {
    /// The recovery task.
    pub task: u64,
    /// The epoch it claimed.
    pub epoch: Epoch,
    /// The register as its view commit left it.
    pub manifest: Manifest,
}

/// How a recovery task ended.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per recovery task; boxing buys nothing
pub enum RecoveryEnd {
    /// `Recovery::run` failed.
    Failed(LogError),
    /// The view was committed, but replay failed every attempt.
    ReplayFailed {
        /// The epoch.
        epoch: Epoch,
        /// The last replay error.
        error: LogError,
    },
    /// Replayed to the end; `writer` is what `start` returned.
    Replayed {
        /// The epoch.
        epoch: Epoch,
        /// The recovered end.
        end: u64,
        /// Every replayed record.
        records: Vec<(RecordIndex, Bytes)>,
        /// The started writer, or why it did not start.
        writer: Result<Writer, LogError>,
    },
}

/// A running recovery.
#[derive(Debug)]
pub struct RecoveryTask {
    /// Its id.
    pub id: u64,
    /// When it was spawned (virtual time since the run began).
    pub started_at: Duration,
    /// Faults only it (and the writer it starts) sees.
    pub faults: ActorFaults,
    /// The task.
    pub handle: JoinHandle<RecoveryEnd>,
}

/// Recovers, announces the committed view, replays everything and starts.
pub async fn recover(
    task: u64,
    stores: LogStores,
    config: LogConfig,
    owner: OwnerId,
    notices: mpsc::UnboundedSender<CommitNotice>,
) -> RecoveryEnd {
    let recovery = match Recovery::run_as(stores, config, owner).await {
        Ok(recovery) => recovery,
        Err(error) => return RecoveryEnd::Failed(error),
    };
    let epoch = recovery.epoch();
    let _ = notices.send(CommitNotice {
        task,
        epoch,
        manifest: recovery.manifest().clone(),
    });
    let mut attempt = 0;
    let records = loop {
        attempt += 1;
        match replay_all(&recovery).await {
            Ok(records) => break records,
            Err(error) if attempt >= REPLAY_ATTEMPTS => {
                return RecoveryEnd::ReplayFailed { epoch, error };
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    RecoveryEnd::Replayed {
        epoch,
        end: recovery.end().0,
        records,
        writer: recovery.start().await,
    }
}

async fn replay_all(recovery: &Recovery) -> Result<Vec<(RecordIndex, Bytes)>, LogError> {
    let mut replay = recovery.replay(recovery.floor())?;
    let mut records = Vec::new();
    while let Some(record) = replay.next().await? {
        records.push(record);
    }
    Ok(records)
}

/// A reader process: its stores, faults, and the reader while idle.
#[derive(Debug)]
pub struct ReaderSlot {
    /// What it reads through.
    pub stores: LogStores,
    /// Faults only it sees.
    pub faults: ActorFaults,
    /// The reader, while no read is running.
    pub reader: Option<Reader>,
    /// The running read.
    pub task: Option<JoinHandle<ReadOutcome>>,
    /// `ActorFaults::injected_with` when the running read began.
    pub injected_at_start: u64,
}

/// What one read returned.
#[derive(Debug)]
pub struct ReadOutcome {
    /// The reader, for the next read.
    pub reader: Reader,
    /// Where the read started.
    pub from: u64,
    /// The records, in order.
    pub records: Vec<(RecordIndex, Bytes)>,
    /// The error that ended the read early, if any.
    pub error: Option<LogError>,
    /// When the read returned (virtual time since the run began).
    pub finished_at: Duration,
}

/// Reads up to `max` committed records, stopping early when caught up.
pub async fn read_some(mut reader: Reader, max: usize, origin: Instant) -> ReadOutcome {
    let from = reader.position().0;
    let mut records = Vec::new();
    let mut error = None;
    while records.len() < max {
        match reader.try_next().await {
            Ok(Some(record)) => records.push(record),
            Ok(None) => break,
            Err(failed) => {
                error = Some(failed);
                break;
            }
        }
    }
    ReadOutcome {
        reader,
        from,
        records,
        error,
        finished_at: origin.elapsed(),
    }
}

/// One maintenance pass, run as its own process against the log (what
/// `chorus log truncate|repair` would do), concurrently with everything else.
#[derive(Debug, Clone, Copy)]
pub enum Pass {
    /// Raise the floor `fraction` of the way from the committed floor to the
    /// committed end (read from the stores, as the CLI does), then delete.
    Truncate {
        /// Where in `[floor, end]` the new floor lies.
        fraction: f64,
    },
    /// Delete the objects of the current tombstones, raising nothing.
    Tombstones,
    /// Heal missing and damaged sealed copies.
    Repair,
    /// Delete orphans.
    Sweep,
}

/// A running maintenance pass.
#[derive(Debug)]
pub struct MaintenanceTask {
    /// Its id.
    pub id: u64,
    /// What it does.
    pub pass: Pass,
    /// Faults only it sees.
    pub faults: ActorFaults,
    /// The task; it returns a one-line outcome for the trace.
    pub handle: JoinHandle<String>,
}

/// Runs `pass` and describes how it ended.
pub async fn maintain(stores: LogStores, pass: Pass) -> String {
    run_pass(&stores, pass)
        .await
        .unwrap_or_else(|error| format!("failed: {error}"))
}

async fn run_pass(stores: &LogStores, pass: Pass) -> Result<String, LogError> {
    let maintenance = Maintenance::new(stores);
    Ok(match pass {
        Pass::Truncate { fraction } => {
            let end = Reader::committed_end(stores).await?;
            let floor = maintenance.manifest().await?.trunc;
            let target = floor_between(floor.0, end.0, fraction);
            let report = maintenance
                .truncate_before(RecordIndex(target), end, &NoProgress)
                .await?;
            format!("floor {target} (end {end}): {report:?}")
        }
        Pass::Tombstones => {
            let manifest = maintenance.manifest().await?;
            let report = maintenance.sweep_tombstones(&manifest, &NoProgress).await?;
            format!("{report:?}")
        }
        Pass::Repair => format!("{:?}", maintenance.repair(&NoProgress).await?),
        Pass::Sweep => format!("{:?}", maintenance.sweep_orphans(&NoProgress).await?),
    })
}

/// The index `fraction` of the way from `floor` to `end` (`floor` itself when
/// the end lies below it).
pub fn floor_between(floor: u64, end: u64, fraction: f64) -> u64 {
    floor + (end.saturating_sub(floor) as f64 * fraction) as u64
}
