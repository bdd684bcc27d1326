//! The replay stream of a recovery (docs/protocol.md, Recovering, step 6):
//! every record from a checkpoint to the recovered end, read from sealed
//! segments.
//!
//! Segments are read ahead, in order, while the caller applies the current
//! one: a replay is otherwise one round trip per segment. How far ahead is
//! bounded by bytes ([`READ_AHEAD_BYTES`]), judged by the size of the last
//! segment read, so small segments are fetched many at a time and large ones
//! one at a time.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesOrdered;

use super::error::LogError;
use super::replica::{ReadSealedError, Replica};
use crate::ids::RecordIndex;
use crate::register::{DirectoryEntry, Manifest, ManifestStore};

/// Bytes of segments read ahead of the one being returned, at most (one
/// segment is always read, whatever its size).
pub const READ_AHEAD_BYTES: u64 = 64 << 20;

/// Most segment reads in flight at once, however small the segments.
const MAX_READ_AHEAD: usize = 8;

/// How many segment reads to keep in flight after one of `last_bytes`.
fn read_ahead(last_bytes: u64) -> usize {
    let segments = READ_AHEAD_BYTES / last_bytes.max(1);
    usize::try_from(segments).map_or(MAX_READ_AHEAD, |n| n.clamp(1, MAX_READ_AHEAD))
}

/// One segment's read: its entry and its records.
type SegmentRead =
    Pin<Box<dyn Future<Output = Result<(DirectoryEntry, Vec<Bytes>), LogError>> + Send>>;

/// Records from a checkpoint to the end of the recovered log, in index order.
pub struct Replay {
    replicas: Arc<[Replica]>,
    /// Read again only to tell a truncation from damage.
    register: Arc<dyn ManifestStore>,
    /// Directory entries not yet being read.
    segments: VecDeque<DirectoryEntry>,
    /// Segment reads in flight, in directory order.
    reads: FuturesOrdered<SegmentRead>,
    /// How many reads to keep in flight.
    read_ahead: usize,
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
            // Until a segment's size is known, one read ahead.
            read_ahead: 1,
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
            self.read_ahead = read_ahead(bytes);
            let skip = self.next.0.saturating_sub(entry.base.0) as usize;
            self.buffered = records
                .into_iter()
                .enumerate()
                .skip(skip)
                .map(|(offset, record)| (RecordIndex(entry.base.0 + offset as u64), record))
                .collect();
        }
    }

    /// Starts segment reads until `read_ahead` are in flight.
    fn read_ahead(&mut self) {
        while self.reads.len() < self.read_ahead {
            let Some(entry) = self.segments.pop_front() else {
                return;
            };
            // Where this replay will stand when it reaches the segment: its
            // base, or the checkpoint inside the first one.
            let from = entry.base.max(self.next);
            let replicas = Arc::clone(&self.replicas);
            let register = Arc::clone(&self.register);
            self.reads.push_back(Box::pin(async move {
                let records =
                    read_sealed_or_truncated(&replicas, register.as_ref(), &entry, from).await?;
                Ok((entry, records))
            }));
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
    fn reads_ahead_by_bytes_between_one_and_eight_segments() {
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
