//! The replay stream of a recovery (docs/protocol.md, Recovering, step 6):
//! every record from a checkpoint to the recovered end, read from sealed
//! segments.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;

use super::error::LogError;
use super::replica::Replica;
use crate::ids::RecordIndex;
use crate::register::{DirectoryEntry, Manifest};

/// Records from a checkpoint to the end of the recovered log, in index order.
#[derive(Debug)]
pub struct Replay {
    replicas: Vec<Replica>,
    /// Directory entries still to read, with their ends.
    segments: VecDeque<(DirectoryEntry, RecordIndex)>,
    /// Records of the current segment not yet returned.
    buffered: VecDeque<(RecordIndex, Bytes)>,
    next: RecordIndex,
    end: RecordIndex,
    finished: Arc<AtomicBool>,
}

impl Replay {
    pub(super) fn new(
        replicas: Vec<Replica>,
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
            .map(|(position, entry)| (*entry, manifest.entry_end(position)))
            .filter(|(_, entry_end)| *entry_end > checkpoint)
            .collect();
        Ok(Replay {
            replicas,
            segments,
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
            if let Some((index, record)) = self.buffered.pop_front() {
                self.next = RecordIndex(index.0 + 1);
                return Ok(Some((index, record)));
            }
            let Some((entry, _)) = self.segments.pop_front() else {
                assert_eq!(self.next, self.end, "replay ended before the recovered end");
                self.finished.store(true, Ordering::Release);
                return Ok(None);
            };
            let records = read_sealed_from_any(&self.replicas, &entry).await?;
            let skip = self.next.0.saturating_sub(entry.base.0) as usize;
            self.buffered = records
                .into_iter()
                .enumerate()
                .skip(skip)
                .map(|(offset, record)| (RecordIndex(entry.base.0 + offset as u64), record))
                .collect();
        }
    }
}

/// Reads a sealed segment from the first replica whose copy verifies, falling
/// back to the others in order.
pub(super) async fn read_sealed_from_any(
    replicas: &[Replica],
    entry: &DirectoryEntry,
) -> Result<Vec<Bytes>, LogError> {
    let mut failures = Vec::new();
    for replica in replicas {
        match replica.read_sealed(entry).await {
            Ok(segment) => return Ok(segment.records),
            Err(error) => {
                tracing::warn!(?replica, segment = %entry.id, %error, "sealed copy unusable; trying the next replica");
                failures.push(format!("replica {}: {error}", replica.position));
            }
        }
    }
    Err(LogError::corrupt(
        format!("sealed segment {}", entry.id),
        format!("no replica has a valid copy: {}", failures.join("; ")),
    ))
}
