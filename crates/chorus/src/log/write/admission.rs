//! Admission: the synchronous part of `append`, shared between the caller and
//! the pipeline task under one lock. It refuses or admits immediately and
//! assigns the index; a refusal never consumes an index.

use tokio::time::Instant;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::Receipt;
use crate::codec::FRAME_HEADER_BYTES;
use crate::ids::RecordIndex;
use crate::log::config::LogConfig;
use crate::log::error::{LogError, StopReason};
use crate::log::metrics::{self, AppendMetrics};
use crate::register::Manifest;

/// The most bytes one directory entry `id:base:crc32c ` can take.
pub const MAX_DIRECTORY_ENTRY_BYTES: usize = 25 + 1 + 20 + 1 + 8 + 1;

/// An admitted record on its way to the pipeline.
#[derive(Debug)]
pub struct Admitted {
    /// Its index.
    pub index: RecordIndex,
    /// Its bytes.
    pub payload: Bytes,
    /// Where its outcome goes.
    pub completion: oneshot::Sender<Result<Receipt, LogError>>,
    /// When it was admitted, for the commit-latency histogram.
    pub admitted_at: Instant,
}

/// Room left in the register's sealed directory, as the writer knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectoryRoom {
    /// The register's capacity.
    pub max_bytes: usize,
    /// Encoded bytes of the directory as last read from the register.
    pub used_bytes: usize,
    /// Entries as last read from the register.
    pub entries: usize,
    /// Sealed segments not yet folded into the register (0 or 1).
    pub unfolded: usize,
    /// Where in the register's history the last refresh came from.
    pub seen: Option<HistoryPoint>,
}

/// A register record's place in its history as far as the directory goes:
/// every change a live writer sees moves it strictly up (a fold raises
/// `tail_base`, a truncation raises `trunc`, a removal of tombstones drops
/// entries with both unchanged), so reads that answer out of order can be told
/// apart by it.
pub type HistoryPoint = (RecordIndex, RecordIndex, std::cmp::Reverse<usize>);

impl DirectoryRoom {
    /// The room `manifest`'s directory leaves in a register of `max_bytes`.
    pub fn of(manifest: &Manifest, max_bytes: usize) -> DirectoryRoom {
        let mut room = DirectoryRoom {
            max_bytes,
            used_bytes: 0,
            entries: 0,
            unfolded: 0,
            seen: None,
        };
        room.refresh(manifest);
        room
    }

    /// Takes the committed directory from a newer read of the register (after a
    /// fold or a truncation); unfolded seals still count.
    ///
    /// A read older than the last one applied (a slow answer overtaken by a
    /// fold or a truncation) is ignored: it would undo newer room.
    pub fn refresh(&mut self, manifest: &Manifest) {
        let point = (
            manifest.tail_base,
            manifest.trunc,
            std::cmp::Reverse(manifest.segments.len()),
        );
        if self.seen.is_some_and(|seen| point < seen) {
            return;
        }
        self.seen = Some(point);
        self.used_bytes = crate::register::directory_bytes(&manifest.segments);
        self.entries = manifest.segments.len();
    }

    /// Whether `extra` more entries fit, besides the unfolded ones.
    pub fn fits(&self, extra: usize) -> bool {
        self.used_bytes + (self.unfolded + extra) * MAX_DIRECTORY_ENTRY_BYTES <= self.max_bytes
    }
}

/// The admission state.
#[derive(Debug)]
pub struct Admission {
    /// The index the next admitted record gets.
    pub next_index: RecordIndex,
    /// Every index below this one is durable.
    pub durable_end: RecordIndex,
    /// Bytes admitted and not yet durable (or failed).
    pub inflight_bytes: u64,
    /// Records admitted and not yet durable (or failed).
    pub inflight_records: u64,
    /// Bytes admitted into the active segment (cut or queued).
    pub active_bytes: u64,
    /// Set once the writer stops accepting appends.
    pub stopped: Option<StopReason>,
    /// Directory room.
    pub directory: DirectoryRoom,
    /// The pipeline's input.
    pub sender: mpsc::UnboundedSender<Admitted>,
    /// The append counters' handles.
    pub metrics: AppendMetrics,
}

impl Admission {
    /// The admission state of a writer starting at `manifest`'s tail.
    pub fn new(
        manifest: &Manifest,
        max_directory_bytes: usize,
        sender: mpsc::UnboundedSender<Admitted>,
    ) -> Admission {
        Admission {
            next_index: manifest.tail_base,
            durable_end: manifest.tail_base,
            inflight_bytes: 0,
            inflight_records: 0,
            active_bytes: 0,
            stopped: None,
            directory: DirectoryRoom::of(manifest, max_directory_bytes),
            sender,
            metrics: AppendMetrics::registered(),
        }
    }

    /// Admits `payload` or refuses it, without waiting.
    pub fn admit(
        &mut self,
        payload: Bytes,
        config: &LogConfig,
    ) -> Result<(RecordIndex, oneshot::Receiver<Result<Receipt, LogError>>), LogError> {
        let refused = self.check(payload.len() as u64, config);
        if let Err(error) = &refused {
            metrics::append_failed(refusal_label(error));
        }
        refused?;
        let index = self.next_index;
        let (completion, receiver) = oneshot::channel();
        let bytes = payload.len();
        let admitted = Admitted {
            index,
            payload,
            completion,
            admitted_at: Instant::now(),
        };
        if self.sender.send(admitted).is_err() {
            // The pipeline is gone without having set `stopped`: it panicked.
            let reason = StopReason::Aborted;
            self.stopped = Some(reason.clone());
            return Err(LogError::Stopped {
                reason,
                may_have_committed: false,
            });
        }
        self.next_index = RecordIndex(index.0 + 1);
        self.inflight_bytes += bytes as u64;
        self.inflight_records += 1;
        self.active_bytes += framed_bytes(bytes as u64);
        self.metrics.admitted(bytes);
        Ok((index, receiver))
    }

    fn check(&self, bytes: u64, config: &LogConfig) -> Result<(), LogError> {
        if let Some(reason) = &self.stopped {
            return Err(LogError::Stopped {
                reason: reason.clone(),
                may_have_committed: false,
            });
        }
        if bytes > config.max_record_bytes {
            return Err(LogError::RecordTooLarge {
                bytes,
                max: config.max_record_bytes,
            });
        }
        // A full active segment rotates only with room for two more entries;
        // without it, it would grow to `max_active_segment_bytes` and then
        // report `ActiveSegmentFull`, hiding that truncation is what helps.
        let rotation_blocked =
            self.active_bytes >= config.max_segment_bytes && !self.directory.fits(2);
        if !self.directory.fits(1) || rotation_blocked {
            return Err(LogError::SegmentDirectoryFull {
                entries: self.directory.entries + self.directory.unfolded,
                max: self.directory.max_bytes,
            });
        }
        // A segment below its rotation threshold always takes the record: it
        // rotates once it crosses the threshold. Refusing there could be
        // permanent, since records larger than the room left would never fit
        // and the segment would never reach the threshold (found by the
        // simulator, seed 1013). So the active segment holds at most
        // max(max_active_segment_bytes, max_segment_bytes + max_record_bytes).
        let below_threshold = self.active_bytes < config.max_segment_bytes;
        let over_active = self.active_bytes + framed_bytes(bytes) > config.max_active_segment_bytes;
        if !below_threshold && over_active {
            return Err(LogError::ActiveSegmentFull {
                bytes: self.active_bytes,
                max: config.max_active_segment_bytes,
            });
        }
        let over_bytes = self.inflight_bytes + bytes > config.max_inflight_bytes;
        let over_records = self.inflight_records + 1 > config.max_inflight_records;
        if over_bytes || over_records {
            return Err(LogError::Backpressure {
                bytes: self.inflight_bytes,
                records: self.inflight_records,
            });
        }
        Ok(())
    }

    /// Accounts for `records` records of `bytes` bytes leaving flight.
    pub fn release(&mut self, records: u64, bytes: u64) {
        self.inflight_records -= records;
        self.inflight_bytes -= bytes;
    }
}

/// What a record of `payload_bytes` adds to its segment: the payload and its
/// length prefix. Segments are measured in frames, so a stream of empty
/// records still fills (and rotates) its segment, and the sealed object's
/// size is bounded by the segment limits.
pub fn framed_bytes(payload_bytes: u64) -> u64 {
    FRAME_HEADER_BYTES as u64 + payload_bytes
}

fn refusal_label(error: &LogError) -> &'static str {
    match error {
        LogError::RecordTooLarge { .. } => "too_large",
        LogError::SegmentDirectoryFull { .. } => "directory_full",
        LogError::ActiveSegmentFull { .. } => "active_segment_full",
        LogError::Backpressure { .. } => "backpressure",
        _ => "stopped",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(config: &LogConfig) -> (Admission, mpsc::UnboundedReceiver<Admitted>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let admission = Admission {
            next_index: RecordIndex(10),
            durable_end: RecordIndex(10),
            inflight_bytes: 0,
            inflight_records: 0,
            active_bytes: 0,
            stopped: None,
            directory: DirectoryRoom {
                max_bytes: 1024,
                used_bytes: 0,
                entries: 0,
                unfolded: 0,
                seen: None,
            },
            sender,
            metrics: AppendMetrics::registered(),
        };
        let _ = config;
        (admission, receiver)
    }

    #[test]
    fn refusals_consume_no_index() {
        let config = LogConfig {
            max_record_bytes: 8,
            max_inflight_bytes: 16,
            max_active_segment_bytes: 64,
            max_segment_bytes: 32,
            ..LogConfig::default()
        };
        let (mut admission, mut pipeline) = admission(&config);
        assert!(matches!(
            admission.admit(Bytes::from(vec![0; 9]), &config),
            Err(LogError::RecordTooLarge { bytes: 9, max: 8 })
        ));
        let (index, _) = admission.admit(Bytes::from(vec![0; 8]), &config).unwrap();
        assert_eq!(index, RecordIndex(10));
        admission.admit(Bytes::from(vec![0; 8]), &config).unwrap();
        assert!(matches!(
            admission.admit(Bytes::from(vec![0; 1]), &config),
            Err(LogError::Backpressure {
                bytes: 16,
                records: 2
            })
        ));
        admission.release(2, 16);
        admission.directory.used_bytes = 1024;
        assert!(matches!(
            admission.admit(Bytes::new(), &config),
            Err(LogError::SegmentDirectoryFull { .. })
        ));
        // A full segment that cannot rotate (no room for two entries) refuses too.
        admission.directory.used_bytes = 1024 - MAX_DIRECTORY_ENTRY_BYTES;
        admission.active_bytes = 32;
        assert!(matches!(
            admission.admit(Bytes::new(), &config),
            Err(LogError::SegmentDirectoryFull { .. })
        ));
        admission.directory.used_bytes = 0;
        admission.active_bytes = 64;
        assert!(matches!(
            admission.admit(Bytes::from(vec![0; 1]), &config),
            Err(LogError::ActiveSegmentFull { .. })
        ));
        admission.stopped = Some(StopReason::Shutdown);
        assert!(matches!(
            admission.admit(Bytes::new(), &config),
            Err(LogError::Stopped {
                may_have_committed: false,
                ..
            })
        ));
        assert_eq!(admission.next_index, RecordIndex(12));
        assert_eq!(pipeline.try_recv().unwrap().index, RecordIndex(10));
        assert_eq!(pipeline.try_recv().unwrap().index, RecordIndex(11));
        assert!(pipeline.try_recv().is_err());
    }

    #[test]
    fn directory_room_counts_whole_entries() {
        let room = DirectoryRoom {
            max_bytes: 2 * MAX_DIRECTORY_ENTRY_BYTES,
            used_bytes: MAX_DIRECTORY_ENTRY_BYTES,
            entries: 1,
            unfolded: 0,
            seen: None,
        };
        assert!(room.fits(1));
        assert!(!room.fits(2));
        let sealing = DirectoryRoom {
            unfolded: 1,
            ..room
        };
        assert!(!sealing.fits(1));
    }

    #[test]
    fn an_older_read_does_not_undo_newer_room() {
        use crate::ids::{Epoch, SegmentId};
        use crate::register::DirectoryEntry;
        let entry = |counter: u32, base: u64| DirectoryEntry {
            id: SegmentId::new(Epoch(1), counter),
            base: RecordIndex(base),
            crc32c: 0,
        };
        let mut full = Manifest::initial(vec!["a".into()], 4);
        full.segments = vec![entry(0, 0), entry(1, 10), entry(2, 20)];
        full.tail_base = RecordIndex(30);
        let mut raised = full.clone();
        raised.trunc = RecordIndex(20);
        let mut swept = raised.clone();
        swept.segments.drain(..2);
        let mut folded = swept.clone();
        folded.segments.push(entry(3, 30));
        folded.tail_base = RecordIndex(40);

        let mut room = DirectoryRoom::of(&full, 1024);
        room.refresh(&swept);
        assert_eq!(room.entries, 1);
        for stale in [&full, &raised] {
            room.refresh(stale);
            assert_eq!(room.entries, 1, "a stale read was applied");
        }
        room.refresh(&folded);
        assert_eq!(room.entries, 2);
        room.refresh(&swept);
        assert_eq!(room.entries, 2, "a stale read was applied");
        room.refresh(&folded);
        assert_eq!(room.entries, 2);
    }
}
