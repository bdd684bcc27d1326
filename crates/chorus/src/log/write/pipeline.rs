//! The pipeline task: group commit, lanes, the commit tracker and rotation
//! (docs/protocol.md, Writing). One task owns all of it, so no protocol state
//! is shared except admission; store requests run in their own tasks and report
//! back as events.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::admission::{Admitted, framed_bytes};
use super::hedge::{WriteLatencies, hedged};
use super::lane::Lane;
use super::pacer::Pacer;
use super::rotation::{Rotated, seal_and_fold};
use super::{Command, Receipt, Shared};
use crate::codec::{CrcRun, FRAGMENT_HEADER_BYTES, Fragment, FramedSegment};
use crate::ids::{FragmentIndex, RecordIndex, SegmentId};
use crate::log::config::LogConfig;
use crate::log::error::{LogError, StopReason};
use crate::log::metrics;
use crate::log::replica::{FragmentWriteError, Replica};
use crate::log::retry::backoff_delay;
use crate::log::transitions::{Fenced, Ownership};
use crate::register::{Manifest, ManifestStore, SealHasher};

/// How long a writer dropped without `shutdown` keeps draining.
const DROP_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a `shutdown` caller waits for the outcome.
type ShutdownReply = oneshot::Sender<Result<(), LogError>>;

/// Where rotation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rotation {
    /// Appending to the active segment.
    Idle,
    /// The active segment is full: no more cuts until all its fragments commit.
    Draining,
    /// The previous segment is being sealed and folded in the background.
    Sealing,
}

/// The segment fragments are being cut into.
#[derive(Debug)]
struct ActiveSegment {
    id: SegmentId,
    base: RecordIndex,
    /// Fragments cut so far.
    cut: u64,
    /// Index of the next record to cut.
    next_record: RecordIndex,
    /// Framed record bytes cut so far (see `framed_bytes`).
    bytes: u64,
    /// The committed fragments' payloads (their records' frames), which
    /// become the sealed object's parts: the seal copies no record.
    committed_frames: Vec<Bytes>,
    /// How many records `committed_frames` hold.
    committed_records: u64,
    /// The checksum of `committed_frames`' concatenation, combined fragment
    /// by fragment so the seal need not read them again.
    committed_crc: CrcRun,
    /// The seal digest of every fragment's frames cut so far, fed as each is
    /// cut, while its bytes are still in cache. Every fragment cut commits
    /// before the seal, in the order cut, so at the seal this is the digest
    /// of `committed_frames`.
    frames_digest: SealHasher,
}

impl ActiveSegment {
    fn new(id: SegmentId, base: RecordIndex) -> ActiveSegment {
        ActiveSegment {
            id,
            base,
            cut: 0,
            next_record: base,
            bytes: 0,
            committed_frames: Vec::new(),
            committed_records: 0,
            committed_crc: CrcRun::default(),
            frames_digest: SealHasher::new(),
        }
    }
}

/// A cut fragment, kept until it is committed and every live lane has it.
#[derive(Debug)]
struct Slot {
    encoded: Bytes,
    /// The checksum of the fragment's payload (its records' frames).
    payload_crc: CrcRun,
    cut_at: Instant,
    /// How many records the fragment holds.
    records: u64,
    payload_bytes: u64,
    acks: usize,
    committed: bool,
}

/// A cut record awaiting its fragment's commit.
#[derive(Debug)]
struct Waiter {
    index: RecordIndex,
    completion: oneshot::Sender<Result<Receipt, LogError>>,
    admitted_at: Instant,
}

/// A store request's outcome, reported by its task.
#[derive(Debug)]
struct LaneEvent {
    segment: SegmentId,
    lane: usize,
    fragment: u64,
    outcome: Result<(), LaneFailure>,
    /// How long the write that succeeded took, hedge included.
    latency: Option<Duration>,
}

#[derive(Debug)]
enum LaneFailure {
    Fenced(Fenced),
    Failed(String),
}

/// The pipeline's state; see the module docs.
pub(super) struct Pipeline {
    shared: Arc<Shared>,
    config: LogConfig,
    ownership: Ownership,
    register: Arc<dyn ManifestStore>,
    replicas: Vec<Replica>,
    quorum: usize,
    window: u64,
    segment: ActiveSegment,
    /// The registered successor segment, if any.
    pending: Option<SegmentId>,
    /// Counter for the next pending id of our epoch.
    next_counter: u32,
    rotation: Rotation,
    queue: VecDeque<Admitted>,
    queued_bytes: u64,
    slots: BTreeMap<u64, Slot>,
    /// Fragments `0..committed` of the active segment are committed and completed.
    committed: u64,
    waiting: VecDeque<Waiter>,
    lanes: Vec<Lane>,
    /// Each replica's recent write latencies, which set its hedge delay.
    latencies: Vec<WriteLatencies>,
    pacer: Pacer,
    events: mpsc::UnboundedSender<LaneEvent>,
    rotated: Option<oneshot::Receiver<Result<Rotated, LogError>>>,
    rotation_task: Option<JoinHandle<()>>,
    draining: Option<(Instant, Option<ShutdownReply>)>,
    stopped: Option<StopReason>,
}

/// What the pipeline starts from.
pub(super) struct Start {
    pub shared: Arc<Shared>,
    pub config: LogConfig,
    pub ownership: Ownership,
    pub register: Arc<dyn ManifestStore>,
    pub replicas: Vec<Replica>,
    pub manifest: Manifest,
}

impl Pipeline {
    /// Runs the pipeline until it stops.
    pub(super) async fn run(
        start: Start,
        admitted: mpsc::UnboundedReceiver<Admitted>,
        commands: mpsc::UnboundedReceiver<Command>,
    ) {
        let (events, event_receiver) = mpsc::unbounded_channel();
        let mut pipeline = Pipeline::new(start, events);
        pipeline
            .event_loop(admitted, commands, event_receiver)
            .await;
    }

    fn new(start: Start, events: mpsc::UnboundedSender<LaneEvent>) -> Pipeline {
        let manifest = &start.manifest;
        let now = Instant::now();
        let pending = manifest.pending;
        let next_counter = pending.map_or(manifest.tail.counter, |p| p.counter) + 1;
        Pipeline {
            quorum: manifest.quorum(),
            window: u64::from(manifest.window),
            pacer: Pacer::new(start.config.pace_fragments, u64::from(manifest.window)),
            segment: ActiveSegment::new(manifest.tail, manifest.tail_base),
            pending,
            next_counter,
            rotation: Rotation::Idle,
            queue: VecDeque::new(),
            queued_bytes: 0,
            slots: BTreeMap::new(),
            committed: 0,
            waiting: VecDeque::new(),
            lanes: start
                .replicas
                .iter()
                .map(|r| Lane::new(r.clone(), now))
                .collect(),
            latencies: vec![WriteLatencies::default(); start.replicas.len()],
            events,
            rotated: None,
            rotation_task: None,
            draining: None,
            stopped: None,
            shared: start.shared,
            config: start.config,
            ownership: start.ownership,
            register: start.register,
            replicas: start.replicas,
        }
    }

    async fn event_loop(
        &mut self,
        mut admitted: mpsc::UnboundedReceiver<Admitted>,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut events: mpsc::UnboundedReceiver<LaneEvent>,
    ) {
        let tick = (self.config.lane_stall_timeout / 4).max(Duration::from_millis(10));
        let mut stall_check = tokio::time::interval(tick);
        let mut commands_open = true;
        while self.stopped.is_none() {
            self.cut_fragments();
            self.finish_drain_if_done();
            if self.stopped.is_some() {
                break;
            }
            // Only a future linger deadline is worth a timer: once it has
            // passed, `cut_fragments` cuts as soon as the window allows, and
            // lane events wake the loop. A past one would make the timer
            // branch ready on every round: a busy loop that, under paused
            // time, also stops the clock (found by the simulator, seed 14).
            // The drain deadline always gets its timer, since nothing else
            // may wake the loop when nothing commits; once it has passed,
            // the next round ends the drain, so it cannot spin.
            // The pacing deadline likewise, and only while records wait.
            let now = Instant::now();
            let linger = self.linger_deadline().filter(|deadline| *deadline > now);
            let pace = self.pace_deadline().filter(|deadline| *deadline > now);
            let wake = linger
                .into_iter()
                .chain(pace)
                .chain(self.drain_deadline())
                .min();
            // `biased`: branches are tried in order rather than at random, so a
            // run replays exactly under the deterministic simulator. Every
            // source is bounded (admission budget, one event per request), so
            // no branch can starve the ones after it for long.
            tokio::select! {
                biased;
                Some(record) = admitted.recv() => self.enqueue(record),
                Some(event) = events.recv() => self.on_lane_event(event),
                outcome = wait_rotated(&mut self.rotated) => self.on_rotated(outcome),
                command = commands.recv(), if commands_open => match command {
                    Some(command) => self.on_command(command),
                    None => {
                        commands_open = false;
                        self.begin_drain(Instant::now() + DROP_DRAIN_TIMEOUT, None);
                    }
                },
                _ = stall_check.tick() => self.on_tick(),
                _ = sleep_until(wake) => {}
            }
        }
        self.cancel_background();
    }

    fn enqueue(&mut self, record: Admitted) {
        self.queued_bytes += record.payload.len() as u64;
        self.queue.push_back(record);
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Shutdown { timeout, reply } => {
                self.begin_drain(Instant::now() + timeout, Some(reply));
            }
            Command::Abort => self.stop(StopReason::Aborted),
        }
    }

    /// Stops admitting; the loop ends once everything admitted is durable, or at
    /// `deadline`.
    fn begin_drain(&mut self, deadline: Instant, reply: Option<ShutdownReply>) {
        self.shared
            .admission()
            .stopped
            .get_or_insert(StopReason::Shutdown);
        self.draining = Some((deadline, reply));
    }

    fn drain_deadline(&self) -> Option<Instant> {
        self.draining.as_ref().map(|(deadline, _)| *deadline)
    }

    fn finish_drain_if_done(&mut self) {
        let Some((deadline, _)) = &self.draining else {
            return;
        };
        // Durable by the in-flight count, not by the queue: a record admitted
        // before the drain began may still sit in the admission channel, and
        // reporting success then would drop it.
        let durable = self.shared.admission().inflight_records == 0;
        // Until the deadline, the live lanes also finish what they owe, and a
        // segment rotated during the drain finishes sealing (the switch
        // abandoned its slow lanes; the seal puts it on every replica), so a
        // clean shutdown leaves every reachable replica complete rather than
        // just a quorum (verify reports fragments a replica lacks).
        let lanes_done = self.lanes.iter().all(|lane| lane.shed || !lane.busy());
        let sealed = self.rotation_task.is_none();
        let past_deadline = Instant::now() >= *deadline;
        if durable && ((lanes_done && sealed) || past_deadline) {
            let (_, reply) = self.draining.take().expect("draining");
            self.stop(StopReason::Shutdown);
            if let Some(reply) = reply {
                let _ = reply.send(Ok(()));
            }
        } else if past_deadline {
            // `stop` fails what is outstanding and answers the drain.
            self.stop(StopReason::Shutdown);
        }
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        let timeout = self.config.lane_stall_timeout;
        let stalled: Vec<usize> = (0..self.lanes.len())
            .filter(|lane| self.lanes[*lane].stalled(now, timeout))
            .collect();
        for lane in stalled {
            self.shed(lane, "stall");
        }
    }

    /// When the oldest queued record must be cut despite a small batch.
    fn linger_deadline(&self) -> Option<Instant> {
        if self.config.linger.is_zero() || self.queued_bytes >= self.config.max_fragment_bytes {
            return None;
        }
        self.queue
            .front()
            .map(|oldest| oldest.admitted_at + self.config.linger)
    }

    /// When the pacer lets the next fragment be cut, while records wait.
    fn pace_deadline(&self) -> Option<Instant> {
        if self.queue.is_empty() {
            return None;
        }
        let in_flight = self.segment.cut > self.committed;
        let full_fragment_queued = self.queued_bytes >= self.config.max_fragment_bytes;
        self.pacer.not_before(in_flight, full_fragment_queued)
    }

    /// Cuts fragments while a quorum of lanes has window room.
    fn cut_fragments(&mut self) {
        loop {
            if self.rotation == Rotation::Idle && self.should_rotate() {
                self.rotation = Rotation::Draining;
                metrics::rotation_state(1);
            }
            if self.rotation == Rotation::Draining {
                if self.committed == self.segment.cut {
                    self.switch_segment();
                    continue;
                }
                return;
            }
            if self.queue.is_empty() || self.stopped.is_some() {
                return;
            }
            if self
                .linger_deadline()
                .is_some_and(|deadline| Instant::now() < deadline)
            {
                return;
            }
            if self
                .pace_deadline()
                .is_some_and(|deadline| Instant::now() < deadline)
            {
                return;
            }
            let next = self.segment.cut;
            let room = self
                .lanes
                .iter()
                .filter(|l| l.has_room(next, self.window))
                .count();
            if room < self.quorum {
                return;
            }
            self.cut_one();
        }
    }

    fn should_rotate(&self) -> bool {
        self.segment.bytes >= self.config.max_segment_bytes
            && self.pending.is_some()
            && self.shared.admission().directory.fits(2)
    }

    /// Cuts the next fragment from the queue and hands it to every live lane.
    fn cut_one(&mut self) {
        let index = self.segment.cut;
        let first = self.segment.next_record;
        let mut records = Vec::new();
        let mut payload_bytes = 0u64;
        let mut framed = 0u64;
        while let Some(front) = self.queue.front() {
            let size = framed_bytes(front.payload.len() as u64);
            if !records.is_empty() && framed + size > self.config.max_fragment_bytes {
                break;
            }
            let record = self.queue.pop_front().expect("front exists");
            debug_assert_eq!(record.index.0, first.0 + records.len() as u64);
            framed += size;
            payload_bytes += record.payload.len() as u64;
            self.waiting.push_back(Waiter {
                index: record.index,
                completion: record.completion,
                admitted_at: record.admitted_at,
            });
            records.push(record.payload);
        }
        self.queued_bytes -= payload_bytes;
        let count = records.len() as u64;
        let (encoded, payload_crc) = Fragment::Data {
            epoch: self.ownership.epoch,
            index: FragmentIndex(index),
            first,
            records,
        }
        .encode_with_payload();
        self.segment
            .frames_digest
            .update(&encoded[FRAGMENT_HEADER_BYTES..]);
        self.segment.cut += 1;
        self.segment.next_record = RecordIndex(first.0 + count);
        self.segment.bytes += framed;
        let now = Instant::now();
        self.pacer.cut(now);
        let length = encoded.len() as u64;
        self.slots.insert(
            index,
            Slot {
                encoded,
                payload_crc,
                cut_at: now,
                records: count,
                payload_bytes,
                acks: 0,
                committed: false,
            },
        );
        let live: Vec<usize> = (0..self.lanes.len())
            .filter(|lane| !self.lanes[*lane].shed)
            .collect();
        for lane in &live {
            self.lanes[*lane].owe(length, now);
        }
        // Lag is measured behind the quorum's slowest member, not in absolute
        // bytes owed: lanes that keep pace with the quorum all owe the same
        // in-flight window, which may exceed `max_replica_lag_bytes` under
        // load (up to `window` full fragments). Shedding on absolute lag shed
        // every healthy lane at once and poisoned the writer (found by the
        // simulator, seed 9). At least Q lanes are never behind themselves,
        // so lag alone can never poison the writer.
        let reference = self.quorum_lag_bytes(&live);
        for lane in live {
            let behind = self.lanes[lane].lag_bytes().saturating_sub(reference);
            if behind > self.config.max_replica_lag_bytes {
                self.shed(lane, "lag");
            } else {
                self.issue_ready(lane);
            }
        }
    }

    /// The Q-th smallest lag among the `live` lanes: how much the quorum owes.
    fn quorum_lag_bytes(&self, live: &[usize]) -> u64 {
        let mut lags: Vec<u64> = live.iter().map(|l| self.lanes[*l].lag_bytes()).collect();
        lags.sort_unstable();
        lags.get(self.quorum - 1).copied().unwrap_or(0)
    }

    /// Issues every fragment lane `lane` may issue now.
    fn issue_ready(&mut self, lane: usize) {
        while let Some(fragment) = self.lanes[lane].next_to_issue(self.segment.cut, self.window) {
            let encoded = self.slots[&fragment].encoded.clone();
            let request = self.spawn_request(lane, fragment, encoded);
            self.lanes[lane].issued(fragment, request);
        }
    }

    /// Writes one fragment to one replica, retrying transient errors with
    /// backoff until it succeeds, fails for good, or is cancelled.
    fn spawn_request(
        &self,
        lane: usize,
        fragment: u64,
        encoded: Bytes,
    ) -> tokio::task::AbortHandle {
        let replica = self.replicas[lane].clone();
        let segment = self.segment.id;
        let events = self.events.clone();
        let epoch = self.ownership.epoch;
        let (min, max) = (self.config.retry_backoff_min, self.config.retry_backoff_max);
        let hedge_after = self
            .config
            .hedge_after_percentile
            .and_then(|percentile| self.latencies[lane].hedge_delay(percentile));
        let settles = |outcome: &Result<(), FragmentWriteError>| !matches!(outcome, Err(FragmentWriteError::Store(error)) if error.is_transient());
        let task = tokio::spawn(async move {
            let mut attempt = 0;
            let mut latency = None;
            let outcome = loop {
                attempt += 1;
                let started = Instant::now();
                let (outcome, hedged) = hedged(hedge_after, settles, || {
                    replica.write_fragment(segment, FragmentIndex(fragment), encoded.clone())
                })
                .await;
                if hedged {
                    metrics::lane_hedge(lane);
                }
                match outcome {
                    Ok(()) => {
                        latency = Some(started.elapsed());
                        break Ok(());
                    }
                    Err(FragmentWriteError::Fenced { by }) => {
                        break Err(LaneFailure::Fenced(Fenced {
                            ours: epoch,
                            current: by,
                        }));
                    }
                    Err(FragmentWriteError::Corrupt(detail)) => {
                        break Err(LaneFailure::Failed(detail));
                    }
                    Err(FragmentWriteError::Store(error)) if error.is_transient() => {
                        metrics::lane_retry(lane);
                        tokio::time::sleep(backoff_delay(attempt, min, max)).await;
                    }
                    Err(FragmentWriteError::Store(error)) => {
                        break Err(LaneFailure::Failed(error.to_string()));
                    }
                }
            };
            if outcome.is_ok() {
                metrics::fragment_written(lane, encoded.len());
            }
            let _ = events.send(LaneEvent {
                segment,
                lane,
                fragment,
                outcome,
                latency,
            });
        });
        task.abort_handle()
    }

    fn on_lane_event(&mut self, event: LaneEvent) {
        if let Some(latency) = event.latency {
            self.latencies[event.lane].record(latency);
        }
        if event.segment != self.segment.id || self.lanes[event.lane].shed {
            return;
        }
        match event.outcome {
            Ok(()) => self.on_ack(event.lane, event.fragment),
            Err(LaneFailure::Fenced(fenced)) => self.stop(StopReason::Fenced(fenced)),
            Err(LaneFailure::Failed(detail)) => {
                tracing::warn!(replica = event.lane, %detail, "lane failed; shedding it");
                self.shed(event.lane, "error");
            }
        }
    }

    fn on_ack(&mut self, lane: usize, fragment: u64) {
        let slot = self
            .slots
            .get_mut(&fragment)
            .expect("acked fragments have slots");
        let now = Instant::now();
        self.lanes[lane].acked(fragment, slot.encoded.len() as u64, now);
        slot.acks += 1;
        if slot.acks >= self.quorum && !slot.committed {
            slot.committed = true;
            self.pacer.committed(slot.cut_at, now);
        }
        self.complete_committed();
        self.issue_ready(lane);
        self.release_slots();
    }

    /// Completes fragments in order while the next one is committed.
    fn complete_committed(&mut self) {
        let now = Instant::now();
        while let Some(slot) = self.slots.get_mut(&self.committed).filter(|s| s.committed) {
            let (records, bytes) = (slot.records, slot.payload_bytes);
            {
                let mut admission = self.shared.admission();
                admission.release(records, bytes);
                admission.durable_end = RecordIndex(admission.durable_end.0 + records);
            }
            let commit_latency = metrics::commit_latency();
            for _ in 0..records {
                let waiter = self.waiting.pop_front().expect("a waiter per cut record");
                commit_latency.record(now.duration_since(waiter.admitted_at).as_secs_f64());
                let _ = waiter.completion.send(Ok(Receipt {
                    index: waiter.index,
                }));
            }
            let frames = slot.encoded.slice(FRAGMENT_HEADER_BYTES..);
            self.segment.committed_frames.push(frames);
            self.segment.committed_records += records;
            self.segment.committed_crc = self.segment.committed_crc.then(slot.payload_crc);
            self.committed += 1;
        }
    }

    /// Drops slots that are committed and held by every live lane.
    fn release_slots(&mut self) {
        while let Some((&fragment, slot)) = self.slots.first_key_value() {
            let everyone_has_it = self
                .lanes
                .iter()
                .all(|lane| lane.shed || lane.has_acked(fragment));
            if !(slot.committed && everyone_has_it && fragment < self.committed) {
                return;
            }
            self.slots.pop_first();
        }
    }

    fn shed(&mut self, lane: usize, reason: &'static str) {
        tracing::warn!(replica = lane, segment = %self.segment.id, reason, "shedding lane for the rest of the segment");
        metrics::lane_shed(lane, reason);
        self.lanes[lane].shed();
        let live = self.lanes.iter().filter(|l| !l.shed).count();
        if live < self.quorum {
            self.stop(StopReason::Poisoned {
                live,
                quorum: self.quorum,
            });
            return;
        }
        self.release_slots();
    }

    /// Switches to the pending segment with no storage call, and seals and
    /// folds the full one in the background.
    fn switch_segment(&mut self) {
        let next_id = self
            .pending
            .take()
            .expect("rotation needs a registered pending segment");
        let base = self.segment.next_record;
        let full = std::mem::replace(&mut self.segment, ActiveSegment::new(next_id, base));
        debug_assert!(self.waiting.is_empty() && self.committed == full.cut);
        let now = Instant::now();
        for lane in &mut self.lanes {
            lane.cancel();
            *lane = Lane::new(lane.replica.clone(), now);
        }
        self.slots.clear();
        self.committed = 0;
        {
            let mut admission = self.shared.admission();
            admission.active_bytes -= full.bytes;
            admission.directory.unfolded += 1;
        }
        let new_pending = SegmentId::new(self.ownership.epoch, self.next_counter);
        self.next_counter += 1;
        self.rotation = Rotation::Sealing;
        metrics::rotation_state(2);
        tracing::info!(sealing = %full.id, active = %next_id, base = %base, "rotated");
        let (sender, receiver) = oneshot::channel();
        let task = tokio::spawn(seal_and_fold(
            self.replicas.clone(),
            Arc::clone(&self.register),
            self.config.clone(),
            self.ownership,
            (
                FramedSegment {
                    id: full.id,
                    base: full.base,
                    count: full.committed_records,
                    frames: full.committed_frames,
                    checksum: full.committed_crc,
                },
                full.frames_digest.finish(),
            ),
            (base, new_pending),
            sender,
        ));
        self.rotated = Some(receiver);
        self.rotation_task = Some(task);
    }

    fn on_rotated(&mut self, outcome: Result<Rotated, LogError>) {
        self.rotated = None;
        self.rotation_task = None;
        match outcome {
            Ok(rotated) => {
                if rotated.degraded {
                    self.shared.repair_wanted.notify_one();
                }
                self.pending = rotated.manifest.pending;
                self.rotation = Rotation::Idle;
                metrics::rotation_state(0);
                let directory = &mut self.shared.admission().directory;
                directory.refresh(&rotated.manifest);
                directory.unfolded -= 1;
            }
            Err(LogError::Fenced(fenced)) => self.stop(StopReason::Fenced(fenced)),
            Err(error) => self.stop(StopReason::Register(error.to_string())),
        }
    }

    /// Stops the writer: refuses new appends and fails every outstanding one.
    fn stop(&mut self, reason: StopReason) {
        if self.stopped.is_some() {
            return;
        }
        tracing::info!(%reason, "writer stopped");
        let mut admission = self.shared.admission();
        admission.stopped = Some(reason.clone());
        let failed = |may_have_committed| LogError::Stopped {
            reason: reason.clone(),
            may_have_committed,
        };
        let written_unacknowledged = !self.waiting.is_empty();
        for waiter in self.waiting.drain(..) {
            let _ = waiter.completion.send(Err(failed(true)));
            metrics::append_failed("stopped");
        }
        for record in self.queue.drain(..) {
            let _ = record.completion.send(Err(failed(false)));
            metrics::append_failed("stopped");
        }
        // A shutdown still draining (past its deadline, or cut short) ends
        // with this stop, not with success: what was written but not
        // acknowledged may or may not be durable.
        if let Some((_, Some(reply))) = self.draining.take() {
            let _ = reply.send(Err(failed(written_unacknowledged)));
        }
        admission.inflight_bytes = 0;
        admission.inflight_records = 0;
        drop(admission);
        self.stopped = Some(reason);
    }

    fn cancel_background(&mut self) {
        for lane in &mut self.lanes {
            lane.cancel();
        }
        if let Some(task) = self.rotation_task.take() {
            task.abort();
        }
    }
}

async fn wait_rotated(
    receiver: &mut Option<oneshot::Receiver<Result<Rotated, LogError>>>,
) -> Result<Rotated, LogError> {
    match receiver {
        Some(receiver) => receiver.await.unwrap_or_else(|_| {
            Err(LogError::Transition(
                "rotation task ended without a result".into(),
            ))
        }),
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::ids::{Epoch, OwnerId};
    use crate::log::write::admission::Admission;
    use crate::register::MemoryRegister;

    /// A pipeline with no replicas (nothing here reaches a store), and the
    /// receiving end of its admission channel.
    fn pipeline(config: &LogConfig) -> (Pipeline, mpsc::UnboundedReceiver<Admitted>) {
        let replicas = (0..3).map(|i| format!("memory://zone-{i}")).collect();
        let manifest = Manifest::initial(replicas, 4);
        let (sender, admitted) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            admission: Mutex::new(Admission::new(&manifest, 1 << 20, sender)),
            repair_wanted: tokio::sync::Notify::new(),
        });
        let start = Start {
            shared,
            config: config.clone(),
            ownership: Ownership {
                epoch: Epoch(1),
                owner: OwnerId::random(),
            },
            register: Arc::new(MemoryRegister::new()),
            replicas: Vec::new(),
            manifest,
        };
        let (events, _) = mpsc::unbounded_channel();
        (Pipeline::new(start, events), admitted)
    }

    #[tokio::test]
    async fn a_drain_is_not_done_while_an_admitted_record_is_still_in_the_channel() {
        let config = LogConfig::default();
        let (mut pipeline, mut admitted) = pipeline(&config);
        let (_, _completion) = pipeline
            .shared
            .admission()
            .admit(Bytes::from_static(b"admitted"), &config)
            .unwrap();
        let (reply, mut outcome) = oneshot::channel();
        pipeline.begin_drain(Instant::now() + Duration::from_secs(60), Some(reply));

        // The record is still in the admission channel: not idle.
        pipeline.finish_drain_if_done();
        assert!(pipeline.stopped.is_none(), "the drain ended early");
        assert!(outcome.try_recv().is_err(), "the drain was answered early");

        // Queued, it is still in flight.
        pipeline.enqueue(admitted.try_recv().unwrap());
        pipeline.finish_drain_if_done();
        assert!(pipeline.stopped.is_none(), "the drain ended early");

        // Durable (released by the commit), the drain ends with success.
        pipeline.queue.clear();
        pipeline.shared.admission().release(1, 8);
        pipeline.finish_drain_if_done();
        assert_eq!(pipeline.stopped, Some(StopReason::Shutdown));
        assert!(matches!(outcome.try_recv(), Ok(Ok(()))));
    }

    #[tokio::test]
    async fn a_drain_waits_for_the_seal_of_a_segment_rotated_during_it() {
        let (mut pipeline, _admitted) = pipeline(&LogConfig::default());
        // Everything is durable, but the full segment is still being sealed:
        // its slowest replica may lack its last fragments until the seal.
        pipeline.rotation_task = Some(tokio::spawn(std::future::pending()));
        let (reply, mut outcome) = oneshot::channel();
        pipeline.begin_drain(Instant::now() + Duration::from_secs(60), Some(reply));
        pipeline.finish_drain_if_done();
        assert!(
            pipeline.stopped.is_none(),
            "the drain ended before the seal"
        );
        assert!(outcome.try_recv().is_err(), "the drain was answered early");

        pipeline.rotation_task.take().unwrap().abort();
        pipeline.finish_drain_if_done();
        assert_eq!(pipeline.stopped, Some(StopReason::Shutdown));
        assert!(matches!(outcome.try_recv(), Ok(Ok(()))));
    }
}
