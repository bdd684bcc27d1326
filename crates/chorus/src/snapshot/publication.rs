//! The writer's publication state machine:
//! Unobserved → Observed → Claimed → Fenced (sticky).
//!
//! Every HEAD write is a CAS (or, on first boot, a create-if-absent) from a
//! version this store observed or wrote itself, so any foreign change in
//! between makes it fail, and the store then fences itself for good. Every
//! attempt of a HEAD write, retries included, is preceded by a lease check: an
//! upload or a retry can outlast the lease, and a successor that has only
//! observed HEAD so far is protected by nothing else. A write
//! whose outcome stayed unknown (transient errors until the read-back resolver
//! gave up) is remembered; if a later write of this store then conflicts and
//! HEAD holds exactly that remembered document, it was ours after all and is
//! followed instead of fencing.

use std::fmt;

use bytes::Bytes;

use super::{
    FenceReason, Head, PayloadId, PublicationSequence, PublisherId, Sha256Digest, SnapshotError,
    SnapshotStore, VersionedHead, error,
};
use crate::blob::{
    BlobError, GuardedWriteError, Version, create_resolving_guarded, update_resolving_guarded,
};
use crate::ids::RecordIndex;
use crate::lease::{DatabaseKey, LeaseHolder};

/// Rounds of one publication's HEAD CAS: the first, plus one after following
/// an earlier write of ours that landed unseen.
const MAX_HEAD_CAS_ROUNDS: u32 = 2;

/// HEAD writes of unknown outcome remembered for settlement. All of them were
/// CASes from one base version, so at most one can have landed; beyond this
/// many the oldest is forgotten (which can only cause a needless fence).
const MAX_UNSETTLED_WRITES: usize = 8;

/// How a HEAD write ended when it did not fail.
enum Written {
    /// Our document is in place.
    Ours(VersionedHead),
    /// HEAD holds an earlier write of this store whose outcome was unknown.
    Earlier(VersionedHead),
}

/// The states of a [`PublicationStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublicationState {
    /// Nothing read yet.
    Unobserved,
    /// HEAD read (possibly absent); its exact version is remembered.
    Observed,
    /// HEAD carries this store's lease stamp; publications may follow.
    Claimed,
    /// HEAD moved away or the lease stopped vouching; sticky.
    Fenced,
}

impl fmt::Display for PublicationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PublicationState::Unobserved => "unobserved",
            PublicationState::Observed => "observed",
            PublicationState::Claimed => "claimed",
            PublicationState::Fenced => "fenced",
        })
    }
}

/// A snapshot to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSnapshot {
    /// The payload.
    pub bytes: Bytes,
    /// Replay resumes here: the payload reflects every log record below it.
    pub wal_index: RecordIndex,
}

/// What [`PublicationStore::claim`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// There was no HEAD: the initial payload was uploaded and HEAD installed.
    Installed(Head),
    /// HEAD existed and now carries our lease stamp and a bumped sequence.
    Adopted(Head),
}

impl ClaimOutcome {
    /// The claimed HEAD.
    pub fn head(&self) -> &Head {
        match self {
            ClaimOutcome::Installed(head) | ClaimOutcome::Adopted(head) => head,
        }
    }
}

#[derive(Debug)]
enum State {
    Unobserved,
    Observed(Option<VersionedHead>),
    Claimed {
        current: VersionedHead,
        /// The highest sequence this store has used for a payload key, so a
        /// failed upload's key is never reused for other bytes.
        reserved: PublicationSequence,
    },
    Fenced(FenceReason),
}

/// A writer's handle on HEAD; see the module docs. Create one per boot with
/// [`SnapshotStore::publication`].
#[derive(Debug)]
pub struct PublicationStore {
    snapshots: SnapshotStore,
    /// Written into every HEAD this store writes (see [`PublisherId`]).
    publisher_id: PublisherId,
    state: State,
    /// HEAD documents this store wrote with unknown outcome, oldest first.
    unsettled: Vec<Head>,
}

impl PublicationStore {
    /// A store in state Unobserved that stamps `publisher_id` into its HEADs.
    pub(crate) fn new(snapshots: SnapshotStore, publisher_id: PublisherId) -> PublicationStore {
        PublicationStore {
            snapshots,
            publisher_id,
            state: State::Unobserved,
            unsettled: Vec::new(),
        }
    }

    /// The current state.
    pub fn state(&self) -> PublicationState {
        match self.state {
            State::Unobserved => PublicationState::Unobserved,
            State::Observed(_) => PublicationState::Observed,
            State::Claimed { .. } => PublicationState::Claimed,
            State::Fenced(_) => PublicationState::Fenced,
        }
    }

    /// Why the store is fenced, if it is.
    pub fn fence_reason(&self) -> Option<&FenceReason> {
        match &self.state {
            State::Fenced(reason) => Some(reason),
            _ => None,
        }
    }

    /// The HEAD this store observed or last wrote.
    pub fn head(&self) -> Option<&Head> {
        match &self.state {
            State::Observed(Some(observed)) => Some(&observed.head),
            State::Claimed { current, .. } => Some(&current.head),
            _ => None,
        }
    }

    /// Reads HEAD stably and remembers the exact version, which the boot then
    /// hydrates from and [`claim`](PublicationStore::claim) CASes from. May be
    /// repeated while Observed (each time replacing the remembered version).
    pub async fn observe_for_boot(&mut self) -> Result<Option<Head>, SnapshotError> {
        if !matches!(self.state, State::Unobserved | State::Observed(_)) {
            return Err(self.refuse("observe_for_boot"));
        }
        let observed = self.snapshots.read_head().await?;
        let head = observed.as_ref().map(|observed| observed.head.clone());
        self.state = State::Observed(observed);
        Ok(head)
    }

    /// Whether the observation found no HEAD: the claim then installs the
    /// first snapshot, and needs its `initial` payload. A caller that encodes
    /// the payload only when this is true saves an encoding of its whole
    /// state on every later boot.
    pub fn needs_initial(&self) -> bool {
        matches!(self.state, State::Observed(None))
    }

    /// Stamps HEAD with `lease`. With no HEAD (first boot) it uploads
    /// `initial` under `g<generation>-s1` and installs HEAD by create-if-absent
    /// (refused, changing nothing, when `initial` is `None`); otherwise it
    /// CASes the observed version to a HEAD naming the same payload with our
    /// stamp and the next sequence (`initial` is unused). Fenced if HEAD
    /// moved since observation, if HEAD carries a newer fencing token, or if the
    /// lease can no longer vouch for us (checked first, and again before every
    /// HEAD write attempt, since the upload may be long). A transient failure
    /// leaves the store Observed; claiming again settles whether the first
    /// attempt landed.
    pub async fn claim(
        &mut self,
        lease: &LeaseHolder,
        initial: Option<NewSnapshot>,
    ) -> Result<ClaimOutcome, SnapshotError> {
        let result = self.try_claim(lease, initial).await;
        error::record("claim", &result);
        result
    }

    async fn try_claim(
        &mut self,
        lease: &LeaseHolder,
        initial: Option<NewSnapshot>,
    ) -> Result<ClaimOutcome, SnapshotError> {
        let State::Observed(observed) = &self.state else {
            return Err(self.refuse("claim"));
        };
        let observed = observed.clone();
        self.vouch(lease)?;
        match (observed, initial) {
            (None, Some(initial)) => self.install(lease, initial).await,
            (None, None) => Err(self.refuse("claim without an initial snapshot on a first boot")),
            (Some(base), _) if base.head.lease_token() > lease.token() => {
                Err(self.fence(FenceReason::Superseded))
            }
            (Some(base), _) => self.adopt(lease, base).await,
        }
    }

    /// First boot: upload the initial payload, then create HEAD.
    async fn install(
        &mut self,
        lease: &LeaseHolder,
        initial: NewSnapshot,
    ) -> Result<ClaimOutcome, SnapshotError> {
        let id = PayloadId {
            generation: lease.generation(),
            sequence: PublicationSequence::FIRST,
        };
        let payload = self.upload_digested(id, &initial.bytes).await?;
        let wall_ms = self.snapshots.wall_ms();
        let wal_index = initial.wal_index;
        let head = Head::for_payload(lease, self.publisher_id, id, payload, wal_index, wall_ms);
        let (Written::Ours(current) | Written::Earlier(current)) =
            self.write_head(lease, None, &head).await?;
        let outcome = ClaimOutcome::Installed(current.head.clone());
        self.set_claimed(current);
        Ok(outcome)
    }

    /// Later boots: CAS the observed HEAD to our stamp and the next sequence.
    async fn adopt(
        &mut self,
        lease: &LeaseHolder,
        base: VersionedHead,
    ) -> Result<ClaimOutcome, SnapshotError> {
        let head = base
            .head
            .restamped(lease, self.publisher_id, self.snapshots.wall_ms());
        let (Written::Ours(current) | Written::Earlier(current)) =
            self.write_head(lease, Some(&base.version), &head).await?;
        let outcome = ClaimOutcome::Adopted(current.head.clone());
        self.set_claimed(current);
        Ok(outcome)
    }

    /// Publishes `snapshot`: uploads it under the fresh key
    /// `g<generation>-s<sequence>` (create-if-absent), then CASes HEAD from the
    /// version this store holds. Requires state Claimed, a claimed HEAD stamped
    /// by `lease`'s incarnation, and a lease that may still write (checked before
    /// the upload and again before every HEAD write attempt). Any CAS failure
    /// fences the store.
    /// A transient failure leaves it Claimed; the next publication settles it.
    ///
    /// A `wal_index` below the current HEAD's is [`SnapshotError::Rewind`]
    /// (nothing written): see [`publish_rewinding`](Self::publish_rewinding).
    pub async fn publish(
        &mut self,
        lease: &LeaseHolder,
        snapshot: NewSnapshot,
    ) -> Result<Head, SnapshotError> {
        self.publish_checked(lease, snapshot, false).await
    }

    /// [`publish`](Self::publish) that may move HEAD's `wal_index` backwards:
    /// for an operator who replaces the state on purpose and knows the log
    /// from that index on still holds what the payload lacks.
    pub async fn publish_rewinding(
        &mut self,
        lease: &LeaseHolder,
        snapshot: NewSnapshot,
    ) -> Result<Head, SnapshotError> {
        self.publish_checked(lease, snapshot, true).await
    }

    async fn publish_checked(
        &mut self,
        lease: &LeaseHolder,
        snapshot: NewSnapshot,
        allow_rewind: bool,
    ) -> Result<Head, SnapshotError> {
        let bytes = snapshot.bytes.len() as u64;
        let result = self.try_publish(lease, snapshot, allow_rewind).await;
        error::record("publish", &result);
        if result.is_ok() {
            metrics::counter!("chorus_snapshot_published_bytes_total").increment(bytes);
        }
        result
    }

    async fn try_publish(
        &mut self,
        lease: &LeaseHolder,
        snapshot: NewSnapshot,
        allow_rewind: bool,
    ) -> Result<Head, SnapshotError> {
        let State::Claimed { current, reserved } = &mut self.state else {
            return Err(self.refuse("publish"));
        };
        if !allow_rewind && snapshot.wal_index < current.head.wal_index {
            return Err(SnapshotError::Rewind {
                key: self.snapshots.head_key().to_owned(),
                head_wal_index: current.head.wal_index,
                requested: snapshot.wal_index,
            });
        }
        let base = current.clone();
        let sequence = base.head.publication_sequence.max(*reserved).next();
        *reserved = sequence;
        if !base.head.is_stamped_by(lease) {
            return Err(self.fence(FenceReason::LeaseMismatch));
        }
        self.vouch(lease)?;
        let id = PayloadId {
            generation: lease.generation(),
            sequence,
        };
        let payload = self.upload_digested(id, &snapshot.bytes).await?;
        let wall_ms = self.snapshots.wall_ms();
        let wal_index = snapshot.wal_index;
        let head = Head::for_payload(lease, self.publisher_id, id, payload, wal_index, wall_ms);
        self.advance(lease, base, head).await
    }

    /// CASes HEAD from `base` to `head`, following an earlier write of ours
    /// first if one landed unseen.
    async fn advance(
        &mut self,
        lease: &LeaseHolder,
        mut base: VersionedHead,
        head: Head,
    ) -> Result<Head, SnapshotError> {
        for _ in 0..MAX_HEAD_CAS_ROUNDS {
            match self.write_head(lease, Some(&base.version), &head).await? {
                Written::Ours(current) => {
                    self.set_claimed(current);
                    return Ok(head);
                }
                Written::Earlier(earlier) => {
                    self.set_claimed(earlier.clone());
                    base = earlier;
                }
            }
        }
        Err(self.fence(FenceReason::HeadMoved))
    }

    /// Writes `head` over `base` (create-if-absent when `None`), settling
    /// unknown outcomes by comparing bytes. Each attempt, the resolver's
    /// retries included, goes only while `lease` vouches; otherwise the store
    /// fences. A precondition failure either finds one of our unsettled writes
    /// in place or fences; an error that leaves the outcome unknown remembers
    /// `head` as unsettled and is returned as is.
    async fn write_head(
        &mut self,
        lease: &LeaseHolder,
        base: Option<&Version>,
        head: &Head,
    ) -> Result<Written, SnapshotError> {
        let bytes = head.encode();
        let ours = bytes.clone();
        let heads = self.snapshots.heads.as_ref();
        let key = self.snapshots.head_key.as_str();
        let database = self.snapshots.database();
        let vouches = || lease_vouches(database, lease);
        let written = match base {
            None => create_resolving_guarded(heads, key, bytes, vouches).await,
            Some(version) => {
                let is_ours = |found: &Bytes| found == &ours;
                update_resolving_guarded(heads, key, version, bytes, is_ours, vouches).await
            }
        };
        match written {
            Ok(version) => {
                self.unsettled.clear();
                let head = head.clone();
                Ok(Written::Ours(VersionedHead { head, version }))
            }
            // An earlier attempt's outcome may be unknown: no need to settle it,
            // since the store is fenced for good.
            Err(GuardedWriteError::Refused(reason)) => Err(self.fence(reason)),
            Err(GuardedWriteError::Store(
                BlobError::AlreadyExists { .. } | BlobError::Conflict { .. },
            )) => self.follow_unsettled().await.map(Written::Earlier),
            Err(GuardedWriteError::Store(error)) => {
                if self.unsettled.len() == MAX_UNSETTLED_WRITES {
                    self.unsettled.remove(0);
                }
                self.unsettled.push(head.clone());
                Err(error.into())
            }
        }
    }

    /// After a lost HEAD write: HEAD moved. If it holds exactly a document this
    /// store wrote with unknown outcome, that write landed; anything else was
    /// written by someone else, and the store fences.
    async fn follow_unsettled(&mut self) -> Result<VersionedHead, SnapshotError> {
        match self.snapshots.read_head().await? {
            Some(found) if self.unsettled.contains(&found.head) => {
                self.unsettled.clear();
                Ok(found)
            }
            _ => Err(self.fence(FenceReason::HeadMoved)),
        }
    }

    /// Uploads a payload; a key holding other bytes fences the store (someone
    /// else writes under our generation, or a payload was about to be overwritten).
    /// Uploads `bytes` as payload `id` while their digest is computed off
    /// the async workers; returns their size and digest.
    async fn upload_digested(
        &mut self,
        id: PayloadId,
        bytes: &Bytes,
    ) -> Result<(u64, Sha256Digest), SnapshotError> {
        let (uploaded, digest) = tokio::join!(
            self.upload(id, bytes.clone()),
            Sha256Digest::of_payload(bytes)
        );
        uploaded?;
        Ok((bytes.len() as u64, digest))
    }

    async fn upload(&mut self, id: PayloadId, bytes: Bytes) -> Result<(), SnapshotError> {
        match self.snapshots.upload(id, bytes).await {
            Ok(()) => Ok(()),
            Err(BlobError::AlreadyExists { key, .. }) => {
                Err(self.fence(FenceReason::PayloadExists { key }))
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Fences unless `lease` guards this database and may still write.
    fn vouch(&mut self, lease: &LeaseHolder) -> Result<(), SnapshotError> {
        lease_vouches(self.snapshots.database(), lease).map_err(|reason| self.fence(reason))
    }

    fn set_claimed(&mut self, current: VersionedHead) {
        let reserved = match &self.state {
            State::Claimed { reserved, .. } => *reserved,
            _ => current.head.publication_sequence,
        };
        let reserved = reserved.max(current.head.publication_sequence);
        self.state = State::Claimed { current, reserved };
    }

    fn fence(&mut self, reason: FenceReason) -> SnapshotError {
        self.state = State::Fenced(reason.clone());
        SnapshotError::Fenced {
            database: self.snapshots.database().clone(),
            reason,
        }
    }

    /// The error for `operation` in the current state: the fence if fenced.
    fn refuse(&self, operation: &'static str) -> SnapshotError {
        match &self.state {
            State::Fenced(reason) => SnapshotError::Fenced {
                database: self.snapshots.database().clone(),
                reason: reason.clone(),
            },
            _ => SnapshotError::WrongState {
                database: self.snapshots.database().clone(),
                operation,
                state: self.state(),
            },
        }
    }
}

/// Why `lease` cannot vouch for a write to `database` right now, if it cannot:
/// it guards another database, or it may no longer write (its holder's own
/// deadline passed, or the lease was lost or released).
fn lease_vouches(database: &DatabaseKey, lease: &LeaseHolder) -> Result<(), FenceReason> {
    if lease.database() != database {
        return Err(FenceReason::LeaseMismatch);
    }
    if !lease.may_write_now() {
        return Err(FenceReason::LeaseExpired);
    }
    Ok(())
}
