//! One replica of a log: the protocol's storage operations on one store.

use std::fmt;

use bytes::Bytes;

use super::layout::{fragment_key, parse_fragment_key, sealed_key, segment_prefix};
use super::offload::offload;
use crate::blob::{BlobError, DynBlobStore, PutPayload, Version};
use crate::codec::{CodecError, Fragment, SealedSegment};
use crate::ids::{Epoch, FragmentIndex, RecordIndex, SegmentId};
use crate::register::DirectoryEntry;

/// A replica: its position in the register's replica list and its store.
#[derive(Clone)]
pub struct Replica {
    /// Position in the replica list (0-based).
    pub position: usize,
    /// The store.
    pub store: DynBlobStore,
}

impl fmt::Debug for Replica {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "replica {} ({})", self.position, self.store.name())
    }
}

/// Why writing a fragment did not succeed.
#[derive(Debug)]
pub enum FragmentWriteError {
    /// A recovering writer fenced this position.
    Fenced {
        /// The fencing epoch.
        by: Epoch,
    },
    /// Other bytes are stored at this position: damage, never a legal state.
    Corrupt(String),
    /// The store failed; retrying may succeed.
    Store(BlobError),
}

/// What placing a fence found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceOutcome {
    /// The fence is now at the position.
    Placed,
    /// Something (data or another fence) was already there.
    Occupied,
}

impl Replica {
    /// The fragment indices present in `segment`, sorted.
    pub async fn list_fragments(
        &self,
        segment: SegmentId,
    ) -> Result<Vec<FragmentIndex>, BlobError> {
        let listed = self.store.list(&segment_prefix(segment)).await?;
        Ok(listed
            .iter()
            .filter_map(|meta| parse_fragment_key(segment, &meta.key))
            .collect())
    }

    /// Reads fragment `index` of `segment`: `None` if absent, `Some(Err)` if the
    /// stored bytes do not decode to that position.
    pub async fn read_fragment(
        &self,
        segment: SegmentId,
        index: FragmentIndex,
    ) -> Result<Option<Result<Fragment, CodecError>>, BlobError> {
        let bytes = match self.store.get(&fragment_key(segment, index)).await {
            Ok(blob) => blob.bytes,
            Err(BlobError::NotFound { .. }) => return Ok(None),
            Err(error) => return Err(error),
        };
        Ok(Some(decode_at(&bytes, index)))
    }

    /// Creates fragment `index` with `bytes` (one attempt). An object already
    /// there is read back: our own bytes mean an earlier attempt landed.
    pub async fn write_fragment(
        &self,
        segment: SegmentId,
        index: FragmentIndex,
        bytes: Bytes,
    ) -> Result<(), FragmentWriteError> {
        let key = fragment_key(segment, index);
        match self.store.create(&key, bytes.clone()).await {
            Ok(_) => return Ok(()),
            Err(BlobError::AlreadyExists { .. }) => {}
            Err(error) => return Err(FragmentWriteError::Store(error)),
        }
        let found = match self.store.get(&key).await {
            Ok(blob) => blob.bytes,
            Err(error) => return Err(FragmentWriteError::Store(error)),
        };
        if found == bytes {
            return Ok(());
        }
        match decode_at(&found, index) {
            Ok(Fragment::Fence { epoch, .. }) => Err(FragmentWriteError::Fenced { by: epoch }),
            Ok(Fragment::Data { .. }) => Err(FragmentWriteError::Corrupt(format!(
                "other data at {key} on {self:?}"
            ))),
            Err(error) => Err(FragmentWriteError::Corrupt(format!(
                "{key} on {self:?}: {error}"
            ))),
        }
    }

    /// Places a fence of `epoch` at `index` unless something is there.
    pub async fn place_fence(
        &self,
        segment: SegmentId,
        index: FragmentIndex,
        epoch: Epoch,
    ) -> Result<FenceOutcome, BlobError> {
        let fence = Fragment::Fence { epoch, index }.encode();
        match self
            .store
            .create(&fragment_key(segment, index), fence)
            .await
        {
            Ok(_) => Ok(FenceOutcome::Placed),
            Err(BlobError::AlreadyExists { .. }) => Ok(FenceOutcome::Occupied),
            Err(error) => Err(error),
        }
    }

    /// Creates the sealed object that `entry` names from `parts`; an object
    /// already under its content-addressed key must be byte-identical.
    pub async fn write_sealed(
        &self,
        entry: &DirectoryEntry,
        parts: PutPayload,
    ) -> Result<(), SealWriteError> {
        let key = sealed_key(entry.id, entry.crc32c);
        match self.store.create_parts(&key, parts.clone()).await {
            Ok(_) => return Ok(()),
            Err(BlobError::AlreadyExists { .. }) => {}
            Err(error) => return Err(SealWriteError::Store(error)),
        }
        let found = self.store.get(&key).await.map_err(SealWriteError::Store)?;
        if same_bytes(&found.bytes, &parts) {
            return Ok(());
        }
        match SealedSegment::decode_verified(&found.bytes, entry.id, entry.base, entry.crc32c) {
            // Valid content with our checksum that is not ours: a CRC32C collision.
            Ok(_) => Err(SealWriteError::Collision(key)),
            // A damaged copy (a torn or rotted earlier write): repair's job.
            Err(error) => Err(SealWriteError::Damaged(format!(
                "{key} on {self:?}: {error}"
            ))),
        }
    }

    /// Classifies this replica's copy of the sealed object `entry` names, which
    /// must hold exactly the records `entry.base..end`.
    pub async fn inspect_sealed(
        &self,
        entry: &DirectoryEntry,
        end: RecordIndex,
    ) -> Result<SealedCopy, BlobError> {
        let key = sealed_key(entry.id, entry.crc32c);
        let blob = match self.store.get(&key).await {
            Ok(blob) => blob,
            Err(BlobError::NotFound { .. }) => return Ok(SealedCopy::Missing),
            Err(error) => return Err(error),
        };
        let (entry, bytes) = (*entry, blob.bytes.clone());
        let verdict = offload(move || {
            let segment =
                SealedSegment::decode_verified(&bytes, entry.id, entry.base, entry.crc32c)
                    .map_err(|error| error.to_string())?;
            if segment.end() == end {
                Ok(())
            } else {
                Err(format!(
                    "holds records up to {}, the directory says {end}",
                    segment.end()
                ))
            }
        })
        .await;
        Ok(match verdict {
            Ok(()) => SealedCopy::Healthy(blob.bytes),
            Err(detail) => SealedCopy::Corrupt {
                version: blob.version,
                detail,
            },
        })
    }

    /// Reads and verifies the sealed object `entry` names.
    pub async fn read_sealed(
        &self,
        entry: &DirectoryEntry,
    ) -> Result<SealedSegment, ReadSealedError> {
        let key = sealed_key(entry.id, entry.crc32c);
        let blob = self.store.get(&key).await.map_err(ReadSealedError::Store)?;
        let entry = *entry;
        offload(move || {
            SealedSegment::decode_verified(&blob.bytes, entry.id, entry.base, entry.crc32c)
        })
        .await
        .map_err(|error| ReadSealedError::Corrupt(format!("{key} on {self:?}: {error}")))
    }
}

/// Whether `bytes` is the concatenation of `parts`.
fn same_bytes(bytes: &[u8], parts: &PutPayload) -> bool {
    let mut rest = bytes;
    for part in parts {
        match rest.split_at_checked(part.len()) {
            Some((head, tail)) if head == &part[..] => rest = tail,
            _ => return false,
        }
    }
    rest.is_empty()
}

/// Why writing a sealed object failed.
#[derive(Debug)]
pub enum SealWriteError {
    /// Different valid content under the same key: two contents share a CRC32C.
    Collision(String),
    /// A damaged object occupies the key.
    Damaged(String),
    /// The store failed.
    Store(BlobError),
}

/// A replica's copy of a sealed object.
#[derive(Debug)]
pub enum SealedCopy {
    /// Present and verified; its bytes.
    Healthy(Bytes),
    /// Absent.
    Missing,
    /// Present but failing verification.
    Corrupt {
        /// The damaged object's version, for a CAS replacement.
        version: Version,
        /// What is wrong.
        detail: String,
    },
}

/// Why reading a sealed object failed.
#[derive(Debug)]
pub enum ReadSealedError {
    /// The store failed (including not found).
    Store(BlobError),
    /// The copy does not verify against its directory entry.
    Corrupt(String),
}

impl fmt::Display for ReadSealedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadSealedError::Store(error) => write!(f, "{error}"),
            ReadSealedError::Corrupt(detail) => write!(f, "corrupt sealed copy: {detail}"),
        }
    }
}

/// Decodes a fragment and checks it sits at the position its key names.
fn decode_at(bytes: &Bytes, index: FragmentIndex) -> Result<Fragment, CodecError> {
    let fragment = Fragment::decode(bytes)?;
    if fragment.index() != index {
        return Err(CodecError::Inconsistent {
            format: crate::codec::Format::Fragment,
            reason: format!(
                "fragment index {} stored at position {index}",
                fragment.index()
            ),
        });
    }
    Ok(fragment)
}

/// The first index missing from a sorted list of present fragment indices.
pub fn first_missing(present: &[FragmentIndex]) -> FragmentIndex {
    let mut expected = 0u64;
    for index in present {
        if index.0 != expected {
            break;
        }
        expected += 1;
    }
    FragmentIndex(expected)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_match_parts_only_when_they_are_the_whole_concatenation() {
        let parts: PutPayload = [&b"ab"[..], b"", b"cde"]
            .into_iter()
            .map(Bytes::from_static)
            .collect();
        assert!(same_bytes(b"abcde", &parts));
        for other in [&b"abcd"[..], b"abcdef", b"abXde", b""] {
            assert!(!same_bytes(other, &parts), "{other:?}");
        }
        assert!(same_bytes(b"", &PutPayload::new()));
    }
}
