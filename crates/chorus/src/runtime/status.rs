//! What a runtime reports about itself.

use std::time::Duration;

use super::config::RuntimeConfig;
use super::error::{Phase, Role};
use crate::ids::{Epoch, RecordIndex};
use crate::lease::{Contender, HolderId, Incarnation, LeaseRecord};
use crate::log::WriterStatus;
use crate::snapshot::Head;

/// A point-in-time view of a runtime.
#[derive(Debug, Clone)]
pub struct RuntimeStatus {
    /// Primary, standby, booting or stopped.
    pub role: Role,
    /// This process's holder id.
    pub holder: HolderId,
    /// This process's incarnation (random, drawn at start).
    pub incarnation: Incarnation,
    /// Every record below this index is applied here.
    pub applied_index: RecordIndex,
    /// The primary's writer: epoch, next index and what is in flight.
    pub writer: Option<WriterStatus>,
    /// The lease document as last read or written here.
    pub lease: Option<LeaseRecord>,
    /// On a primary: how long it may still write without another refresh.
    pub lease_remaining: Option<Duration>,
    /// `HEAD.json` as last read or written here.
    pub head: Option<Head>,
    /// The index of the newest snapshot this process published or restored.
    pub last_snapshot_index: Option<RecordIndex>,
    /// On a standby: whether it had applied everything committed at its
    /// last poll.
    pub caught_up: bool,
    /// The log epoch of the last recovery here.
    pub epoch: Option<Epoch>,
    /// Records applied from the log by the last boot's replay.
    pub replayed_records: u64,
    /// How long each phase of the last boot took.
    pub phases: Vec<(Phase, Duration)>,
    /// The last error that stopped a boot step, if any.
    pub last_error: Option<String>,
    /// Snapshot every this many records…
    pub snapshot_every_records: u64,
    /// …once the log since the last holds this percentage of its bytes…
    pub snapshot_min_log_percent: u32,
    /// …or this often.
    pub snapshot_interval: Duration,
}

/// What the supervisor records as it goes; see [`RuntimeStatus`].
#[derive(Debug)]
pub(super) struct Info {
    pub(super) role: Role,
    pub(super) contender: Contender,
    pub(super) lease: Option<LeaseRecord>,
    pub(super) head: Option<Head>,
    pub(super) last_snapshot_index: Option<RecordIndex>,
    /// The core's applied bytes when its state was the newest snapshot's,
    /// or when this process learned of a newer snapshot than its own (the
    /// log between that snapshot and the state here then goes uncounted).
    pub(super) snapshot_applied_bytes: u64,
    pub(super) caught_up: bool,
    pub(super) epoch: Option<Epoch>,
    pub(super) replayed_records: u64,
    pub(super) phases: Vec<(Phase, Duration)>,
    pub(super) last_error: Option<String>,
}

impl Info {
    /// Notes a snapshot of the log below `index` that this process learned
    /// of (rather than took), if newer than the newest it knew: the log
    /// since it is counted from here, `applied_bytes` into the core's count.
    pub(super) fn learn_snapshot(&mut self, index: RecordIndex, applied_bytes: u64) {
        if self.last_snapshot_index.is_none_or(|last| index > last) {
            self.last_snapshot_index = Some(index);
            self.snapshot_applied_bytes = applied_bytes;
        }
    }

    pub(super) fn new(contender: Contender) -> Info {
        Info {
            role: Role::Booting,
            contender,
            lease: None,
            head: None,
            last_snapshot_index: None,
            snapshot_applied_bytes: 0,
            caught_up: false,
            epoch: None,
            replayed_records: 0,
            phases: Vec::new(),
            last_error: None,
        }
    }

    /// The lease holder as last seen, unless the lease was released.
    pub(super) fn primary(&self) -> Option<HolderId> {
        self.lease
            .as_ref()
            .filter(|lease| !lease.released)
            .map(|lease| lease.holder_id.clone())
    }

    /// Records a phase of the current boot (a new boot starts at ObserveHead).
    pub(super) fn record_phase(&mut self, phase: Phase, elapsed: Duration) {
        if phase == Phase::ObserveHead {
            self.phases.clear();
        }
        self.phases.retain(|(recorded, _)| *recorded != phase);
        self.phases.push((phase, elapsed));
    }

    pub(super) fn status(
        &self,
        applied_index: RecordIndex,
        writer: Option<WriterStatus>,
        lease_remaining: Option<Duration>,
        config: &RuntimeConfig,
    ) -> RuntimeStatus {
        RuntimeStatus {
            role: self.role,
            holder: self.contender.holder().clone(),
            incarnation: self.contender.incarnation(),
            applied_index,
            writer,
            lease: self.lease.clone(),
            lease_remaining,
            head: self.head.clone(),
            last_snapshot_index: self.last_snapshot_index,
            caught_up: self.caught_up,
            epoch: self.epoch,
            replayed_records: self.replayed_records,
            phases: self.phases.clone(),
            last_error: self.last_error.clone(),
            snapshot_every_records: config.snapshot_every_records,
            snapshot_min_log_percent: config.snapshot_min_log_percent,
            snapshot_interval: config.snapshot_interval,
        }
    }
}
