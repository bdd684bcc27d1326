//! The replay stream of a recovery (docs/protocol.md, Recovering, step 6):
//! every record from a checkpoint to the recovered end, read from sealed
//! segments.
//!
//! Segments are read ahead, in order, each read a task of its own, so they
//! proceed while the caller applies the current segment: a replay is
//! otherwise one round trip per segment. How far ahead is bounded by bytes
//! ([`READ_AHEAD_BYTES`]), judged by the larger of the configured segment
//! size and the largest segment read so far, so small segments are fetched
//! many at a time and large ones one at a time.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesOrdered;
use tokio::task::JoinHandle;

use super::error::LogError;
use super::replica::{ReadSealedError, Replica};
use crate::ids::RecordIndex;
use crate::register::{DirectoryEntry, Manifest, ManifestStore};

/// Bytes of segments read ahead of the one being returned, at most while no
/// segment is larger than the log's configured segment size (one segment is
/// always read ahead, whatever its size).
pub const READ_AHEAD_BYTES: u64 = 64 << 20;

/// Most segment reads in flight at once, however small the segments.
const MAX_READ_AHEAD: usize = 8;

/// How many segment reads to keep in flight when segments may be as large
/// as `segment_bytes`.
fn read_ahead(segment_bytes: u64) -> usize {
    let segments = READ_AHEAD_BYTES / segment_bytes.max(1);
    usize::try_from(segments).map_or(MAX_READ_AHEAD, |n| n.clamp(1, MAX_READ_AHEAD))
}

/// What one segment's read yields: its entry and its records.
type SegmentRecords = Result<(DirectoryEntry, Vec<Bytes>), LogError>;

/// A segment read running as a task; aborted when dropped, so a replay
/// dropped midway leaves no reads behind.
struct SegmentRead(JoinHandle<SegmentRecords>);

impl Future for SegmentRead {
    type Output = SegmentRecords;

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<SegmentRecords> {
        // A read is aborted only when dropped, so a join error is a panic
        // in the read: raise it here, as an unspawned read would have.
        Pin::new(&mut self.0).poll(cx).map(|joined| {
            joined.unwrap_or_else(|error| std::panic::resume_unwind(error.into_panic()))
        })
    }
}

impl Drop for SegmentRead {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Records from a checkpoint to the end of the recovered log, in index order.
pub struct Replay {
    replicas: Arc<[Replica]>,
    /// Read again only to tell a truncation from damage.
    register: Arc<dyn ManifestStore>,
    /// Directory entries not yet being read.
    segments: VecDeque<DirectoryEntry>,
    /// Segment reads in flight, in directory order.
    reads: FuturesOrdered<SegmentRead>,
    /// The largest segment the reads may bring: the configured segment size
    /// or the largest read so far, whichever is larger.
    segment_bytes: u64,
    /// Records of the current segment not yet returned.
    buffered: VecDeque<(RecordIndex, Bytes)>,
    next: RecordIndex,
    end: RecordIndex,
    finished: Arc<AtomicBool>,
}

impl fmt::Debug for Replay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replay")
            .field("next", &self.next)
            .field("end", &self.end)
            .field("reads_in_flight", &self.reads.len())
            .field("segments_left", &self.segments.len())
            .finish()
    }
}

impl Replay {
    pub(super) fn new(
        replicas: Vec<Replica>,
        register: Arc<dyn ManifestStore>,
        manifest: &Manifest,
        checkpoint: RecordIndex,
        max_segment_bytes: u64,
        finished: Arc<AtomicBool>,
    ) -> Result<Replay, LogError> {
        let end = manifest.tail_base;
        if checkpoint < manifest.trunc || checkpoint > end {
            return Err(LogError::InvalidCheckpoint {
                checkpoint,
                floor: manifest.trunc,
                end,
            });
        }
        let segments = manifest
            .segments
            .iter()
            .enumerate()
            .filter(|(position, _)| manifest.entry_end(*position) > checkpoint)
            .map(|(_, entry)| *entry)
            .collect();
        Ok(Replay {
            replicas: replicas.into(),
            register,
            segments,
            reads: FuturesOrdered::new(),
            segment_bytes: max_segment_bytes,
            buffered: VecDeque::new(),
            next: checkpoint,
            end,
            finished,
        })
    }

    /// The index of the next record to return.
    pub fn position(&self) -> RecordIndex {
        self.next
    }

    /// The next record, or `None` at the end (which allows `start`).
    pub async fn next(&mut self) -> Result<Option<(RecordIndex, Bytes)>, LogError> {
        loop {
            self.read_ahead();
            if let Some((index, record)) = self.buffered.pop_front() {
                self.next = RecordIndex(index.0 + 1);
                return Ok(Some((index, record)));
            }
            let Some(read) = self.reads.next().await else {
                if self.next != self.end {
                    return Err(LogError::corrupt(
                        "replay",
                        format!(
                            "the segments end before the recovered end: next={} end={}",
                            self.next, self.end
                        ),
                    ));
                }
                self.finished.store(true, Ordering::Release);
                return Ok(None);
            };
            let (entry, records) = read?;
            let bytes = records.iter().map(|record| record.len() as u64).sum();
            self.segment_bytes = self.segment_bytes.max(bytes);
            let skip = self.next.0.saturating_sub(entry.base.0) as usize;
            self.buffered = records
                .into_iter()
                .enumerate()
                .skip(skip)
                .map(|(offset, record)| (RecordIndex(entry.base.0 + offset as u64), record))
                .collect();
        }
    }

    /// Starts segment reads until as many are in flight as the read-ahead
    /// budget allows.
    fn read_ahead(&mut self) {
        while self.reads.len() < read_ahead(self.segment_bytes) {
            let Some(entry) = self.segments.pop_front() else {
                return;
            };
            // Where this replay will stand when it reaches the segment: its
            // base, or the checkpoint inside the first one.
            let from = entry.base.max(self.next);
            let replicas = Arc::clone(&self.replicas);
            let register = Arc::clone(&self.register);
            self.reads.push_back(SegmentRead(tokio::spawn(async move {
                let records =
                    read_sealed_or_truncated(&replicas, register.as_ref(), &entry, from).await?;
                Ok((entry, records))
            })));
        }
    }
}

/// [`read_sealed_from_any`] for a reader positioned at `next`: when no copy
/// is usable, the register is read again, and if the floor has meanwhile
/// passed `next` the answer is `Truncated` (a truncation deleted the
/// segment under the read), not corruption.
pub(super) async fn read_sealed_or_truncated(
    replicas: &[Replica],
    register: &dyn ManifestStore,
    entry: &DirectoryEntry,
    next: RecordIndex,
) -> Result<Vec<Bytes>, LogError> {
    let error = match read_sealed_from_any(replicas, entry).await {
        Ok(records) => return Ok(records),
        Err(error) => error,
    };
    if !matches!(error, LogError::Corrupt { .. }) {
        return Err(error);
    }
    // Unsure whether it was a truncation, say what stopped us finding out.
    let current = register
        .read()
        .await?
        .ok_or_else(|| LogError::Transition("register vanished".into()))?;
    let floor = Manifest::from_fields(&current.fields)?.trunc;
    if next < floor {
        return Err(LogError::Truncated {
            requested: next,
            floor,
        });
    }
    Err(error)
}

/// Reads a sealed segment from the first replica whose copy verifies, falling
/// back to the others in order.
pub(super) async fn read_sealed_from_any(
    replicas: &[Replica],
    entry: &DirectoryEntry,
) -> Result<Vec<Bytes>, LogError> {
    let mut failures = Vec::new();
    let mut unreachable = None;
    for replica in replicas {
        match replica.read_sealed(entry).await {
            Ok(segment) => return Ok(segment.records),
            Err(error) => {
                tracing::warn!(?replica, segment = %entry.id, %error, "sealed copy unusable; trying the next replica");
                failures.push(format!("replica {}: {error}", replica.position));
                if let ReadSealedError::Store(store) = error
                    && store.is_transient()
                {
                    unreachable.get_or_insert(store);
                }
            }
        }
    }
    // A copy we could not reach may be fine: that is worth a retry, not a
    // verdict of damage.
    if let Some(store) = unreachable {
        return Err(store.into());
    }
    Err(LogError::corrupt(
        format!("sealed segment {}", entry.id),
        format!("no replica has a valid copy: {}", failures.join("; ")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ahead_by_segment_size_between_one_and_eight_segments() {
        const MIB: u64 = 1 << 20;
        assert_eq!(read_ahead(64 * MIB), 1);
        assert_eq!(
            read_ahead(1024 * MIB),
            1,
            "a segment is read whatever its size"
        );
        assert_eq!(read_ahead(32 * MIB), 2);
        assert_eq!(read_ahead(16 * MIB), 4);
        assert_eq!(read_ahead(8 * MIB), 8);
        assert_eq!(read_ahead(MIB), 8);
        assert_eq!(
            read_ahead(0),
            8,
            "an empty segment says nothing about the next"
        );
    }
}
