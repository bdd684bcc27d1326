//! Recovery: opening a writer (docs/protocol.md, Recovering).
//!
//! 1. Claim epoch + 1 with a fresh owner id (CAS), after checking the replica binding.
//! 2. Fence the tail and pending segments on every reachable replica, then read
//!    them; at least Q replicas must be fenced and read ("observed").
//! 3. Choose the committed prefix ([`choose_recovered`]).
//! 4. Seal each non-empty candidate on every replica (needs Q).
//! 5. Commit the view in one CAS guarded by our epoch.
//!
//! Replay and `start` follow on the returned [`Recovery`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};

use super::LogStores;
use super::config::LogConfig;
use super::error::LogError;
use super::gather::gather;
use super::layout::fragment_key;
use super::metrics;
use super::quorum::{Recovered, choose_recovered, copies_needed, quorum};
use super::replay::Replay;
use super::replica::{FenceOutcome, Replica, first_missing};
use super::retry;
use super::seal::{PreparedSeal, write_seal};
use super::transitions::{Ownership, SealedEntry, View, claim, commit_view};
use super::write::Writer;
use crate::blob::BlobError;
use crate::codec::Fragment;
use crate::ids::{Epoch, FragmentIndex, OwnerId, RecordIndex, SegmentId};
use crate::register::{Manifest, check_binding, transform};

/// Fence creates, and fragment reads, in flight per replica and segment
/// while observing it.
const REQUEST_CONCURRENCY: usize = 32;

/// A recovered log, ready to replay and then [`start`](Recovery::start) writing.
#[derive(Debug)]
pub struct Recovery {
    pub(super) stores: LogStores,
    pub(super) config: LogConfig,
    pub(super) ownership: Ownership,
    /// The register as the view commit left it.
    pub(super) manifest: Manifest,
    pub(super) replicas: Vec<Replica>,
    replayed: Arc<std::sync::atomic::AtomicBool>,
}

impl Recovery {
    /// Recovers the log in `stores`: claims a new epoch, fences the previous
    /// writer and commits the recovered view. Racing recoveries: exactly one
    /// ends up writing; the others fail with `Fenced`.
    pub async fn run(stores: LogStores, config: LogConfig) -> Result<Recovery, LogError> {
        Self::run_as(stores, config, OwnerId::random()).await
    }

    /// [`Recovery::run`] with a caller-chosen incarnation id instead of a
    /// random one, so a deterministic simulator can seed it.
    ///
    /// `owner` must be fresh: never used by another recovery of this log, and
    /// not [`OwnerId::NONE`]. The claim treats "the register names our owner"
    /// as "our claim already applied", so a reused id would skip the claim.
    pub async fn run_as(
        stores: LogStores,
        config: LogConfig,
        owner: OwnerId,
    ) -> Result<Recovery, LogError> {
        if owner == OwnerId::NONE {
            return Err(LogError::Transition(
                "a recovery needs a non-zero owner id".into(),
            ));
        }
        config.validate()?;
        let started = Instant::now();
        metrics::recovery_started();
        let outcome = Self::run_steps(stores, config, owner).await;
        metrics::recovery_finished(started.elapsed(), outcome.is_ok());
        outcome
    }

    async fn run_steps(
        stores: LogStores,
        config: LogConfig,
        owner: OwnerId,
    ) -> Result<Recovery, LogError> {
        let identities = stores.identities();
        let claimed = transform(
            stores.register.as_ref(),
            config.register_rounds,
            |current| {
                check_binding(&current.replicas, &identities)?;
                Ok::<_, LogError>(claim(current, owner)?)
            },
        )
        .await?;
        let manifest = claimed.manifest;
        let ownership = Ownership {
            epoch: manifest.epoch,
            owner,
        };
        let replicas = stores.replicas();
        tracing::info!(epoch = %ownership.epoch, tail = %manifest.tail, "recovery claimed epoch");

        let grace = config.lane_stall_timeout;
        let backoff = (config.retry_backoff_min, config.retry_backoff_max);
        let observed = observe_all(&replicas, &manifest, ownership.epoch, grace, backoff).await?;
        let view = build_view(&manifest, ownership.epoch, &observed)?;
        for (seal, _) in &view.seals {
            write_seal(&replicas, seal, quorum(replicas.len()), backoff, grace).await?;
        }
        let committed = transform(
            stores.register.as_ref(),
            config.register_rounds,
            |current| Ok::<_, LogError>(commit_view(current, ownership, &view.view)?),
        )
        .await?;
        tracing::info!(
            epoch = %ownership.epoch,
            end = %committed.manifest.tail_base,
            sealed = view.seals.len(),
            "recovery committed its view"
        );
        // The fragments of the recovered segments stay: they include the
        // fences, and deleting a fence reopens its position to the fenced
        // writer, which could then complete a fragment there and ack a record
        // this view does not hold. Only a sweep that keeps fences may collect them.
        Ok(Recovery {
            stores,
            config,
            ownership,
            manifest: committed.manifest,
            replicas,
            replayed: Arc::default(),
        })
    }

    /// The epoch this recovery claimed.
    pub fn epoch(&self) -> Epoch {
        self.ownership.epoch
    }

    /// The index after the last recovered record: where appends continue.
    pub fn end(&self) -> RecordIndex {
        self.manifest.tail_base
    }

    /// The truncation floor: the first retained index.
    pub fn floor(&self) -> RecordIndex {
        self.manifest.trunc
    }

    /// The register record after recovery.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Replays the records from `checkpoint` (at least the floor) to the end.
    /// [`start`](Recovery::start) is refused until this stream was consumed.
    pub fn replay(&self, checkpoint: RecordIndex) -> Result<Replay, LogError> {
        Replay::new(
            self.replicas.clone(),
            Arc::clone(&self.stores.register),
            &self.manifest,
            checkpoint,
            self.config.max_segment_bytes,
            Arc::clone(&self.replayed),
        )
    }

    /// Begins appending, after the replay reached its end and the register
    /// still names us.
    ///
    /// It consumes the recovery, so one recovery starts at most one writer:
    /// two pipelines of one `(epoch, owner)` would write different bytes at
    /// the same fragment positions. A refused start consumes it too; recover
    /// again (a new epoch) to retry.
    ///
    /// ```compile_fail,E0382
    /// # async fn twice(recovery: chorus::log::Recovery) {
    /// let first = recovery.start().await;
    /// let second = recovery.start().await; // error: use of moved value
    /// # }
    /// ```
    pub async fn start(self) -> Result<Writer, LogError> {
        if !self.replayed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(LogError::RecoveryIncomplete { end: self.end() });
        }
        let current = self
            .stores
            .register
            .read()
            .await?
            .ok_or_else(|| LogError::Transition("register vanished".into()))?;
        let current = Manifest::from_fields(&current.fields)?;
        self.ownership.check(&current)?;
        Ok(Writer::spawn(self))
    }
}

/// One replica's view of one segment after fencing: the valid data copy at
/// each position, or `None` where a damaged object sits (fences and empty
/// positions are left out).
type SegmentCopies = BTreeMap<FragmentIndex, Option<Fragment>>;

/// What one observed replica holds of the tail and pending segments.
#[derive(Debug)]
struct Observation {
    tail: SegmentCopies,
    pending: SegmentCopies,
}

/// Fences and reads every replica; fails with `NoQuorum` if fewer than Q succeed.
///
/// Once a quorum is observed, the other replicas get at most `grace` more: a
/// hung replica must not hold recovery up, and an unobserved replica is what
/// the Q − (N − k) rule is for (a half-fenced one is simply unobserved).
async fn observe_all(
    replicas: &[Replica],
    manifest: &Manifest,
    epoch: Epoch,
    grace: Duration,
    backoff: (Duration, Duration),
) -> Result<Vec<Observation>, LogError> {
    let window = u64::from(manifest.window);
    let needed = quorum(replicas.len());
    let observations = replicas.iter().map(|replica| async move {
        // The two segments are fenced independently, so side by side.
        let observed = async {
            let tail = observe_segment(replica, manifest.tail, epoch, window, backoff);
            let pending = async {
                match manifest.pending {
                    Some(pending) => {
                        observe_segment(replica, pending, epoch, window, backoff).await
                    }
                    None => Ok(SegmentCopies::new()),
                }
            };
            let (tail, pending) = futures::try_join!(tail, pending)?;
            Ok::<_, BlobError>(Observation { tail, pending })
        };
        (replica, observed.await)
    });
    let outcomes = gather(observations, grace, |done| {
        done.iter().filter(|(_, outcome)| outcome.is_ok()).count() >= needed
    })
    .await;
    let mut observed = Vec::new();
    let mut failures = Vec::new();
    for (replica, outcome) in outcomes {
        match outcome {
            Ok(observation) => observed.push(observation),
            Err(error) => {
                tracing::warn!(?replica, %error, "recovery could not observe replica");
                failures.push(format!("{replica:?}: {error}"));
            }
        }
    }
    if observed.len() < needed {
        return Err(LogError::NoQuorum {
            observed: observed.len(),
            quorum: needed,
            detail: failures.join("; "),
        });
    }
    Ok(observed)
}

/// Fences `segment` on `replica` and reads what it holds.
///
/// At the first missing index p a fence goes in (an object found there is taken
/// as existing, and the scan moves on); once a fence is placed at p, every
/// missing index in [p, p + window) is fenced too. The old writer can then never
/// complete p here, so it can never issue p + window or later: after a re-list
/// this replica's content of the segment is frozen.
///
/// Each request is retried while it fails transiently ([`retrying`]): one lost
/// answer among the dozens a segment takes must not cost the replica. A fence
/// whose create applied but whose answer was lost comes back `Occupied` on the
/// retry; the scan then fences the next index as well, which only adds fences.
async fn observe_segment(
    replica: &Replica,
    segment: SegmentId,
    epoch: Epoch,
    window: u64,
    backoff: (Duration, Duration),
) -> Result<SegmentCopies, BlobError> {
    let mut present = retrying(backoff, || replica.list_fragments(segment)).await?;
    let fenced_at = loop {
        let missing = first_missing(&present);
        match retrying(backoff, || replica.place_fence(segment, missing, epoch)).await? {
            FenceOutcome::Placed => break missing,
            FenceOutcome::Occupied => {
                present.push(missing);
                present.sort_unstable();
            }
        }
    };
    // The rest of the window concurrently: each fence's outcome (placed, or
    // an object found) is final on its own, and the re-list below waits for
    // all. Bounded like the reads, since a window may be 64 wide.
    let missing = ((fenced_at.0 + 1)..(fenced_at.0 + window))
        .map(FragmentIndex)
        .filter(|index| present.binary_search(index).is_err());
    futures::stream::iter(missing)
        .map(|index| retrying(backoff, move || replica.place_fence(segment, index, epoch)))
        .buffer_unordered(REQUEST_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    let present = retrying(backoff, || replica.list_fragments(segment)).await?;
    read_data(replica, segment, &present, backoff).await
}

/// Attempts per recovery request before its replica counts as unobserved.
const MAX_OBSERVE_ATTEMPTS: u32 = 4;

/// Runs a recovery request again while it fails transiently, at most
/// [`MAX_OBSERVE_ATTEMPTS`] times in all. Only for requests that are safe to
/// repeat: reads, and creates whose repeat reports what the first did.
async fn retrying<T, Fut>(
    backoff: (Duration, Duration),
    request: impl FnMut() -> Fut,
) -> Result<T, BlobError>
where
    Fut: Future<Output = Result<T, BlobError>>,
{
    retry::retrying(
        MAX_OBSERVE_ATTEMPTS,
        backoff,
        BlobError::is_transient,
        request,
    )
    .await
}

/// Reads the data fragments among `present`; fences are left out, and damaged
/// copies are kept as `None`: such a replica cannot vouch either way for
/// that position (see [`vouching_copies`]).
async fn read_data(
    replica: &Replica,
    segment: SegmentId,
    present: &[FragmentIndex],
    backoff: (Duration, Duration),
) -> Result<SegmentCopies, BlobError> {
    let reads = futures::stream::iter(present.iter().copied())
        .map(|index| async move {
            let read = retrying(backoff, || replica.read_fragment(segment, index)).await;
            (index, read)
        })
        .buffered(REQUEST_CONCURRENCY);
    let mut reads = std::pin::pin!(reads);
    let mut copies = SegmentCopies::new();
    while let Some((index, read)) = reads.next().await {
        match read? {
            Some(Ok(fragment @ Fragment::Data { .. })) if fragment.epoch() == segment.epoch => {
                copies.insert(index, Some(fragment));
            }
            Some(Ok(Fragment::Data { epoch, .. })) => {
                tracing::warn!(
                    ?replica, key = fragment_key(segment, index), %epoch,
                    "data fragment from a foreign epoch counts as damaged"
                );
                copies.insert(index, None);
            }
            Some(Ok(Fragment::Fence { .. })) | None => {}
            Some(Err(error)) => {
                tracing::warn!(
                    ?replica, key = fragment_key(segment, index), %error,
                    "damaged fragment copy: this replica cannot vouch for the position"
                );
                copies.insert(index, None);
            }
        }
    }
    Ok(copies)
}

/// The view to commit and the seals it needs.
struct PlannedView {
    view: View,
    seals: Vec<(PreparedSeal, RecordIndex)>,
}

/// Chooses the committed prefix and builds the view (pure).
fn build_view(
    manifest: &Manifest,
    epoch: Epoch,
    observed: &[Observation],
) -> Result<PlannedView, LogError> {
    let tail = merge_copies(manifest.tail, observed.iter().map(|o| &o.tail))?;
    let pending = match manifest.pending {
        Some(id) => merge_copies(id, observed.iter().map(|o| &o.pending))?,
        None => Merged::default(),
    };
    let (tail_vouching, pending_vouching) = (vouching_copies(&tail), vouching_copies(&pending));
    let Recovered {
        tail: tail_len,
        pending: pending_len,
    } = choose_recovered(
        manifest.replica_count(),
        observed.len(),
        &tail_vouching,
        &pending_vouching,
    );
    let needed = copies_needed(manifest.replica_count(), observed.len());
    check_decidable(manifest.tail, &tail, tail_len, needed)?;
    let tail_has_gap = tail_vouching[tail_len..].iter().any(|c| *c > 0);
    if let Some(pending_id) = manifest.pending.filter(|_| !tail_has_gap) {
        check_decidable(pending_id, &pending, pending_len, needed)?;
    }
    let mut seals = Vec::new();
    let mut end = manifest.tail_base;
    let candidates = [
        (manifest.tail, &tail, tail_len),
        (
            manifest.pending.unwrap_or(manifest.tail),
            &pending,
            pending_len,
        ),
    ];
    for (segment, merged, keep) in candidates {
        let records = chain_records(segment, end, &merged.fragments[..keep])?;
        if records.is_empty() {
            continue;
        }
        let base = end;
        end = RecordIndex(base.0 + records.len() as u64);
        seals.push((PreparedSeal::new(segment, base, records)?, end));
    }
    let view = View {
        recovered_from: (manifest.tail, manifest.pending),
        sealed: seals
            .iter()
            .map(|(seal, _)| seal.sealed)
            .collect::<Vec<SealedEntry>>(),
        tail: SegmentId::new(epoch, 0),
        pending: SegmentId::new(epoch, 1),
        tail_base: end,
    };
    Ok(PlannedView { view, seals })
}

/// Per-position valid and damaged copy counts of one segment across observed
/// replicas, and one copy of each position (positions 0.. up to the highest
/// with data or damage).
#[derive(Debug, Default)]
struct Merged {
    copies: Vec<usize>,
    damaged: Vec<usize>,
    fragments: Vec<Option<Fragment>>,
}

/// The copy counts the committed-prefix rule judges, per position.
///
/// A replica holding a damaged object at a position is treated as
/// unobserved *for that position*, not as observed-and-absent: the object may
/// have been one of the acknowledging copies. Unobserved replicas lower the
/// threshold one for one (Q − (N − k)), so each damaged copy counts like a
/// copy — but only where at least one valid copy exists to take the content
/// from. The result stays 0 exactly where no valid copy exists, so the
/// tail-gap rule still looks at valid data only (a damaged fence is no gap).
fn vouching_copies(merged: &Merged) -> Vec<usize> {
    merged
        .copies
        .iter()
        .zip(&merged.damaged)
        .map(|(valid, damaged)| if *valid == 0 { 0 } else { valid + damaged })
        .collect()
}

fn merge_copies<'a>(
    segment: SegmentId,
    observations: impl Iterator<Item = &'a SegmentCopies>,
) -> Result<Merged, LogError> {
    let mut merged = Merged::default();
    let mut damaged = Vec::new();
    for copies in observations {
        for (index, fragment) in copies {
            let position = index.0 as usize;
            let Some(fragment) = fragment else {
                damaged.push(position);
                continue;
            };
            if merged.copies.len() <= position {
                merged.copies.resize(position + 1, 0);
                merged.damaged.resize(position + 1, 0);
                merged.fragments.resize(position + 1, None);
            }
            match &merged.fragments[position] {
                Some(first) if first != fragment => {
                    return Err(LogError::corrupt(
                        fragment_key(segment, *index),
                        "two valid data copies differ; only one writer ever writes a position",
                    ));
                }
                Some(_) => {}
                None => merged.fragments[position] = Some(fragment.clone()),
            }
            merged.copies[position] += 1;
        }
    }
    for position in damaged {
        if merged.damaged.len() <= position {
            merged.copies.resize(position + 1, 0);
            merged.damaged.resize(position + 1, 0);
            merged.fragments.resize(position + 1, None);
        }
        merged.damaged[position] += 1;
    }
    Ok(merged)
}

/// Refuses to decide the first failing position `position` of `segment` when
/// it has no valid copy but enough damaged ones that, were they valid, it
/// would pass: the damage may hide an acknowledged fragment (a copy that
/// reads corrupt now may read back fine, and its twin may sit on an
/// unobserved replica). Discarding it could lose an ack, so recovery fails
/// with a retryable `NoQuorum` instead. (Found by the simulator, seed 3.)
fn check_decidable(
    segment: SegmentId,
    merged: &Merged,
    position: usize,
    needed: usize,
) -> Result<(), LogError> {
    let valid = merged.copies.get(position).copied().unwrap_or(0);
    let damaged = merged.damaged.get(position).copied().unwrap_or(0);
    if valid == 0 && damaged >= needed {
        return Err(LogError::NoQuorum {
            observed: valid,
            quorum: needed,
            detail: format!(
                "{}: no valid copy and {damaged} damaged copies: the damage may hide an \
                 acknowledged fragment; retry once the copies read back",
                fragment_key(segment, FragmentIndex(position as u64))
            ),
        });
    }
    Ok(())
}

/// Concatenates the kept fragments' records, checking that they continue
/// densely from `base`.
fn chain_records(
    segment: SegmentId,
    base: RecordIndex,
    kept: &[Option<Fragment>],
) -> Result<Vec<Bytes>, LogError> {
    let mut records = Vec::new();
    let mut next = base;
    for (position, fragment) in kept.iter().enumerate() {
        let Some(Fragment::Data {
            first,
            records: batch,
            ..
        }) = fragment
        else {
            unreachable!("kept positions have data copies");
        };
        if *first != next {
            return Err(LogError::corrupt(
                fragment_key(segment, FragmentIndex(position as u64)),
                format!("fragment starts at record {first}, expected {next}"),
            ));
        }
        next = RecordIndex(next.0 + batch.len() as u64);
        records.extend(batch.iter().cloned());
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Epoch;

    fn data(index: u64, first: u64, records: &[&str]) -> Fragment {
        Fragment::Data {
            epoch: Epoch(1),
            index: FragmentIndex(index),
            first: RecordIndex(first),
            records: records
                .iter()
                .map(|r| Bytes::copy_from_slice(r.as_bytes()))
                .collect(),
        }
    }

    fn copies(fragments: &[Fragment]) -> SegmentCopies {
        fragments
            .iter()
            .map(|f| (f.index(), Some(f.clone())))
            .collect()
    }

    #[test]
    fn build_view_keeps_the_quorum_prefix_and_chains_pending() {
        let mut manifest = Manifest::initial(vec!["a".into(), "b".into(), "c".into()], 4);
        manifest.epoch = Epoch(2);
        manifest.owner = OwnerId(5);
        manifest.tail = SegmentId::new(Epoch(1), 0);
        manifest.pending = Some(SegmentId::new(Epoch(1), 1));
        let f0 = data(0, 0, &["a", "b"]);
        let f1 = data(1, 2, &["c"]);
        let p0 = data(0, 3, &["d"]);
        let observed = vec![
            Observation {
                tail: copies(&[f0.clone(), f1.clone()]),
                pending: copies(std::slice::from_ref(&p0)),
            },
            Observation {
                tail: copies(&[f0.clone(), f1.clone()]),
                pending: copies(std::slice::from_ref(&p0)),
            },
            Observation {
                tail: copies(std::slice::from_ref(&f0)),
                pending: SegmentCopies::new(),
            },
        ];
        let planned = build_view(&manifest, Epoch(2), &observed).unwrap();
        assert_eq!(planned.view.tail_base, RecordIndex(4));
        assert_eq!(planned.seals.len(), 2);
        assert_eq!(planned.view.sealed[1].entry.base, RecordIndex(3));
        assert_eq!(planned.view.tail, SegmentId::new(Epoch(2), 0));
    }

    /// Regression: a damaged copy used to count as observed-and-absent, so a
    /// fragment acknowledged by exactly two of three replicas, one of whose
    /// copies later rotted, was discarded although a valid copy survived.
    #[test]
    fn a_damaged_copy_counts_as_an_unobserved_replica_for_its_position() {
        let mut manifest = Manifest::initial(vec!["a".into(), "b".into(), "c".into()], 4);
        manifest.epoch = Epoch(2);
        manifest.tail = SegmentId::new(Epoch(1), 0);
        manifest.pending = Some(SegmentId::new(Epoch(1), 1));
        let f0 = data(0, 0, &["a"]);
        let p0 = data(0, 1, &["b"]);
        let mut damaged = copies(&[]);
        damaged.insert(FragmentIndex(0), None);
        // A damaged object past the tail's end (a rotted fence) is no gap.
        let mut damaged_fence = copies(&[]);
        damaged_fence.insert(FragmentIndex(1), None);
        let observed = vec![
            Observation {
                tail: copies(std::slice::from_ref(&f0)),
                pending: copies(std::slice::from_ref(&p0)),
            },
            Observation {
                tail: damaged,
                pending: copies(std::slice::from_ref(&p0)),
            },
            Observation {
                tail: damaged_fence,
                pending: SegmentCopies::new(),
            },
        ];
        let planned = build_view(&manifest, Epoch(2), &observed).unwrap();
        assert_eq!(planned.view.tail_base, RecordIndex(2));
        // Without a valid copy, enough damaged ones may hide an acknowledged
        // fragment (its twin on the unobserved replica): recovery refuses to
        // decide rather than discard it (see `check_decidable`).
        let observed = vec![
            Observation {
                tail: copies(&[]),
                pending: SegmentCopies::new(),
            },
            Observation {
                tail: [(FragmentIndex(0), None)].into_iter().collect(),
                pending: SegmentCopies::new(),
            },
        ];
        let Err(error) = build_view(&manifest, Epoch(2), &observed) else {
            panic!("recovery decided a position hidden by damage");
        };
        assert!(matches!(error, LogError::NoQuorum { .. }), "{error}");
    }

    #[test]
    fn divergent_valid_copies_are_refused() {
        let a = data(0, 0, &["a"]);
        let b = data(0, 0, &["b"]);
        let error = merge_copies(
            SegmentId::new(Epoch(1), 0),
            [copies(&[a]), copies(&[b])].iter(),
        )
        .unwrap_err();
        assert!(error.to_string().contains("differ"), "{error}");
    }

    #[test]
    fn a_broken_record_chain_is_refused() {
        let kept = vec![Some(data(0, 0, &["a"])), Some(data(1, 5, &["b"]))];
        let error = chain_records(SegmentId::new(Epoch(1), 0), RecordIndex(0), &kept).unwrap_err();
        assert!(error.to_string().contains("expected 1"), "{error}");
    }
}
