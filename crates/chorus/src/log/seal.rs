//! Sealing: writing a segment's consolidated, content-addressed object to every
//! replica. Shared by rotation and recovery.

use std::time::Duration;

use bytes::Bytes;

use super::error::LogError;
use super::gather::gather;
use super::replica::{Replica, SealWriteError};
use super::retry::retrying;
use super::transitions::SealedEntry;
use crate::blob::PutPayload;
use crate::codec::{CodecError, FramedSegment, SealedSegment};
use crate::ids::{RecordIndex, SegmentId};
use crate::register::{DirectoryEntry, SealDigest, SealHasher};

/// Attempts per replica for one sealed object before that replica counts as failed.
const MAX_SEAL_ATTEMPTS: u32 = 6;

/// A sealed object ready to write.
#[derive(Debug, Clone)]
pub struct PreparedSeal {
    /// The encoded object, as parts written back to back.
    pub parts: PutPayload,
    /// Its directory entry and digest.
    pub sealed: SealedEntry,
}

impl PreparedSeal {
    /// Encodes `records` as the sealed object of `segment` at `base`
    /// (recovery, which has the records it read). Refused (`Corrupt`) where
    /// the sealed format cannot hold them (no records, over its size limit),
    /// which no validated configuration produces.
    pub fn new(
        segment: SegmentId,
        base: RecordIndex,
        records: Vec<Bytes>,
    ) -> Result<PreparedSeal, LogError> {
        let (bytes, crc32c) = SealedSegment {
            id: segment,
            base,
            records,
        }
        .encode_keyed()
        .map_err(|error| cannot_seal(segment, error))?;
        let digest = SealDigest::of_sealed_object(&bytes);
        Ok(PreparedSeal::of(segment, base, vec![bytes], crc32c, digest))
    }

    /// The sealed object of frames a writer already encoded into its
    /// fragments: their buffers become the object's parts, not a copy.
    /// `digest` is the frames' [`SealDigest`], which the writer hashed as it
    /// cut them. Refused as [`PreparedSeal::new`] is.
    pub fn framed(framed: FramedSegment, digest: SealDigest) -> Result<PreparedSeal, LogError> {
        debug_assert_eq!(digest, {
            let mut hasher = SealHasher::new();
            framed
                .frames
                .iter()
                .for_each(|frames| hasher.update(frames));
            hasher.finish()
        });
        let (segment, base) = (framed.id, framed.base);
        let (parts, crc32c) = framed
            .encode()
            .map_err(|error| cannot_seal(segment, error))?;
        Ok(PreparedSeal::of(segment, base, parts, crc32c, digest))
    }

    fn of(
        segment: SegmentId,
        base: RecordIndex,
        parts: Vec<Bytes>,
        crc32c: u32,
        digest: SealDigest,
    ) -> PreparedSeal {
        let entry = DirectoryEntry {
            id: segment,
            base,
            crc32c,
        };
        PreparedSeal {
            parts: parts.into_iter().collect(),
            sealed: SealedEntry { entry, digest },
        }
    }

    /// The object's size in bytes.
    pub fn len(&self) -> usize {
        self.parts.content_length()
    }
}

fn cannot_seal(segment: SegmentId, error: CodecError) -> LogError {
    LogError::corrupt(format!("cannot seal segment={segment}"), error)
}

/// Which replicas hold the sealed object after [`write_seal`].
#[derive(Debug, Clone, Default)]
pub struct SealReport {
    /// Positions of replicas that hold a verified copy.
    pub written: Vec<usize>,
    /// Replicas that do not, with why.
    pub failed: Vec<(usize, String)>,
}

impl SealReport {
    /// Whether some replica lacks a copy (repair should run).
    pub fn degraded(&self) -> bool {
        !self.failed.is_empty()
    }
}

/// Writes `seal` to every replica, retrying transient failures, and succeeds
/// once at least `quorum` replicas hold it. Once a quorum holds it, the other
/// replicas get at most `grace` more (a hung replica must not hold up the
/// fold); a replica still writing then counts as failed, and repair copies it.
pub async fn write_seal(
    replicas: &[Replica],
    seal: &PreparedSeal,
    quorum: usize,
    backoff: (Duration, Duration),
    grace: Duration,
) -> Result<SealReport, LogError> {
    let writes = replicas
        .iter()
        .map(|replica| async move { (replica.position, write_one(replica, seal, backoff).await) });
    let outcomes = gather(writes, grace, |done| {
        done.iter().filter(|(_, outcome)| outcome.is_ok()).count() >= quorum
    })
    .await;
    let mut report = SealReport::default();
    for (position, outcome) in outcomes {
        match outcome {
            Ok(()) => report.written.push(position),
            Err(SealWriteError::Collision(key)) => {
                return Err(LogError::corrupt(
                    key,
                    "another valid sealed object has the same key (CRC32C collision); refusing to guess",
                ));
            }
            Err(SealWriteError::Damaged(detail)) => report.failed.push((position, detail)),
            Err(SealWriteError::Store(error)) => report.failed.push((position, error.to_string())),
        }
    }
    for replica in replicas {
        let answered = report.written.contains(&replica.position)
            || report
                .failed
                .iter()
                .any(|(position, _)| *position == replica.position);
        if !answered {
            report
                .failed
                .push((replica.position, format!("still writing after {grace:?}")));
        }
    }
    report.written.sort_unstable();
    if report.written.len() < quorum {
        let detail = report
            .failed
            .iter()
            .map(|(position, why)| format!("replica {position}: {why}"))
            .collect::<Vec<_>>()
            .join("; ");
        return Err(LogError::NoQuorum {
            observed: report.written.len(),
            quorum,
            detail: format!("sealing {}: {detail}", seal.sealed.entry.id),
        });
    }
    Ok(report)
}

async fn write_one(
    replica: &Replica,
    seal: &PreparedSeal,
    backoff: (Duration, Duration),
) -> Result<(), SealWriteError> {
    let transient =
        |error: &SealWriteError| matches!(error, SealWriteError::Store(e) if e.is_transient());
    retrying(MAX_SEAL_ATTEMPTS, backoff, transient, || {
        replica.write_sealed(&seal.sealed.entry, seal.parts.clone())
    })
    .await
}
