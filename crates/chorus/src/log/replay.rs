//! The replay stream of a recovery (docs/protocol.md, Recovering, step 6):
//! every record from a checkpoint to the recovered end, read from sealed
//! segments.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;

use super::error::LogError;
use super::replica::{ReadSealedError, Replica};
use crate::ids::RecordIndex;
use crate::register::{DirectoryEntry, Manifest, ManifestStore};

/// Records from a checkpoint to the end of the recovered log, in index order.
#[derive(Debug)]
pub struct Replay {
    replicas: Vec<Replica>,
    /// Read again only to tell a truncation from damage.
    register: Arc<dyn ManifestStore>,
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
            .map(|(position, entry)| (*entry, manifest.entry_end(position)))
            .filter(|(_, entry_end)| *entry_end > checkpoint)
            .collect();
        Ok(Replay {
            replicas,
            register,
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
            let records =
                read_sealed_or_truncated(&self.replicas, self.register.as_ref(), &entry, self.next)
                    .await?;
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
