//! The holder's side of a lease: its own deadline, refresh and release.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::blob::{BlobError, Version};

use super::{
    DatabaseKey, FencingToken, Generation, HolderId, Incarnation, LeaseError, LeaseRecord,
    LeaseStore, Term, error,
};

/// Rounds of one refresh or release: a round is one CAS (itself retried on
/// transient errors by the read-back resolver) plus, after a conflict, one read.
pub const MAX_REFRESH_ROUNDS: u32 = 3;

/// Pause before the second round; doubles per round.
const ROUND_BACKOFF: Duration = Duration::from_millis(100);

/// What a CAS round writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    Refresh,
    Release,
}

/// A lease this process holds, with its own view of how long it may write.
///
/// Shareable (`&self` everywhere): a refresh loop and the writers asking
/// [`may_write`](LeaseHolder::may_write) can use one holder concurrently;
/// refresh and release are serialized internally.
#[derive(Debug)]
pub struct LeaseHolder {
    leases: LeaseStore,
    /// The acquisition: what this holder's documents all share.
    holder_id: HolderId,
    incarnation: Incarnation,
    term: Term,
    generation: Generation,
    state: Mutex<HeldState>,
    /// Serializes store operations, so two refreshes never race each other.
    operation: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct HeldState {
    /// The document as we last wrote it.
    record: LeaseRecord,
    /// Its version in the store.
    version: Version,
    /// When this holder must stop writing, on its monotonic clock.
    deadline: Instant,
    /// Set once a takeover (or a release by someone else) was seen.
    lost: bool,
    /// Set when this holder starts releasing: it stops writing first.
    releasing: bool,
}

impl LeaseHolder {
    pub(super) fn new(
        leases: LeaseStore,
        record: LeaseRecord,
        version: Version,
        started: Instant,
    ) -> LeaseHolder {
        let deadline = started + leases.config().write_window();
        LeaseHolder {
            holder_id: record.holder_id.clone(),
            incarnation: record
                .incarnation
                .expect("an acquisition writes its incarnation"),
            term: record.term,
            generation: record.generation,
            leases,
            state: Mutex::new(HeldState {
                record,
                version,
                deadline,
                lost: false,
                releasing: false,
            }),
            operation: tokio::sync::Mutex::new(()),
        }
    }

    fn state(&self) -> MutexGuard<'_, HeldState> {
        self.state.lock().expect("lease holder state poisoned")
    }

    /// The database this lease guards.
    pub fn database(&self) -> &DatabaseKey {
        self.leases.database()
    }

    /// Who holds it.
    pub fn holder_id(&self) -> &HolderId {
        &self.holder_id
    }

    /// The incarnation of the process that acquired it.
    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    /// The holder's term.
    pub fn term(&self) -> Term {
        self.term
    }

    /// This acquisition's generation.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The fencing token `(term, generation)`.
    pub fn token(&self) -> FencingToken {
        FencingToken {
            term: self.term,
            generation: self.generation,
        }
    }

    /// The lease document as this holder last wrote it.
    pub fn record(&self) -> LeaseRecord {
        self.state().record.clone()
    }

    /// Whether this holder may still write at monotonic instant `now`: it has
    /// not lost or released the lease, and `now` is before its deadline (the
    /// last successful acquire or refresh's send time + ttl − safety margin).
    pub fn may_write(&self, now: Instant) -> bool {
        let state = self.state();
        !state.lost && !state.releasing && now < state.deadline
    }

    /// [`may_write`](LeaseHolder::may_write) at the clock's current instant.
    pub fn may_write_now(&self) -> bool {
        self.may_write(self.leases.clock().now())
    }

    /// How long this holder may still write after `now` (zero once it may not).
    pub fn remaining(&self, now: Instant) -> Duration {
        let state = self.state();
        if state.lost || state.releasing {
            return Duration::ZERO;
        }
        state.deadline.saturating_duration_since(now)
    }

    /// Extends the lease by one ttl from now, keeping the generation. Retries
    /// transient errors for up to [`MAX_REFRESH_ROUNDS`]; on failure the old
    /// deadline stands, so the holder stops writing in time on its own.
    /// [`LeaseError::Stale`] if the lease was taken over or released.
    pub async fn refresh(&self) -> Result<(), LeaseError> {
        let result = self.write_successor(Purpose::Refresh).await;
        error::record("refresh", &result);
        result
    }

    /// Releases the lease, keeping its generation, so any contender may acquire
    /// it at once. The holder stops writing before the release is sent; if the
    /// release fails, calling it again retries, or the lease simply expires.
    /// Releasing a released lease is a no-op.
    pub async fn release(&self) -> Result<(), LeaseError> {
        let result = self.write_successor(Purpose::Release).await;
        error::record("release", &result);
        result
    }

    /// Checks that `purpose` is still possible, then runs its CAS rounds.
    /// Serialized, so a refresh and a release never race each other.
    async fn write_successor(&self, purpose: Purpose) -> Result<(), LeaseError> {
        let _serial = self.operation.lock().await;
        let (record, version) = {
            let mut state = self.state();
            match purpose {
                Purpose::Release if state.record.released => return Ok(()),
                // The holder stops writing before the release is even sent.
                Purpose::Release if !state.lost => state.releasing = true,
                Purpose::Refresh if !state.lost && !state.releasing => {}
                Purpose::Release | Purpose::Refresh => return Err(self.stale()),
            }
            (state.record.clone(), state.version.clone())
        };
        self.cas_rounds(purpose, record, version).await
    }

    /// Writes the `purpose` successor of `record` by CAS for up to
    /// [`MAX_REFRESH_ROUNDS`]. After a conflict it re-reads: a live document of
    /// this incarnation means an earlier write of ours landed unseen, so the
    /// next round follows its version; anything else means the lease is lost.
    async fn cas_rounds(
        &self,
        purpose: Purpose,
        mut record: LeaseRecord,
        mut version: Version,
    ) -> Result<(), LeaseError> {
        let mut last_transient = None;
        for round in 0..MAX_REFRESH_ROUNDS {
            if round > 0 {
                tokio::time::sleep(ROUND_BACKOFF * 2u32.pow(round - 1)).await;
            }
            let (written, deadline) = self.successor(purpose, &record);
            let failure = match self.leases.write(&version, &written).await {
                Ok(new_version) => {
                    self.settle(written, new_version, deadline);
                    return Ok(());
                }
                Err(failure) => failure,
            };
            if !matches!(failure, BlobError::Conflict { .. }) {
                if !failure.is_transient() {
                    return Err(failure.into());
                }
                last_transient = Some(failure.into());
                continue;
            }
            match self.leases.read_versioned().await {
                Ok(Some((found, found_version))) if self.is_incarnation(&found) => {
                    if found.released && purpose == Purpose::Release {
                        // An earlier release attempt of ours landed unseen.
                        self.settle(found, found_version, deadline);
                        return Ok(());
                    }
                    if found.released {
                        return Err(self.lose());
                    }
                    (record, version) = (found, found_version);
                }
                Ok(_) => return Err(self.lose()),
                Err(failure) if failure.is_transient() => last_transient = Some(failure),
                Err(failure) => return Err(failure),
            }
        }
        Err(last_transient.unwrap_or(LeaseError::LostRace {
            database: self.database().clone(),
        }))
    }

    /// The document a refresh or release writes over `record`, and the deadline
    /// it buys (measured from before the wall-clock reading it embeds).
    fn successor(&self, purpose: Purpose, record: &LeaseRecord) -> (LeaseRecord, Instant) {
        let clock = self.leases.clock();
        let config = self.leases.config();
        let started = clock.now();
        match purpose {
            Purpose::Refresh => (
                record.refreshed(clock.wall_ms(), config.ttl),
                started + config.write_window(),
            ),
            Purpose::Release => (record.released_at(clock.wall_ms()), started),
        }
    }

    /// Whether `found` was written by this acquisition (live or released).
    fn is_incarnation(&self, found: &LeaseRecord) -> bool {
        found.is_held_by(&self.holder_id, self.incarnation)
            && found.term == self.term
            && found.generation == self.generation
    }

    /// Records a successful write. A refresh moves the deadline; after a
    /// release `releasing` is set, so the deadline no longer matters.
    fn settle(&self, record: LeaseRecord, version: Version, deadline: Instant) {
        let mut state = self.state();
        if !record.released {
            state.deadline = deadline;
        }
        state.record = record;
        state.version = version;
    }

    /// Marks the lease lost and returns the error that says so.
    fn lose(&self) -> LeaseError {
        self.state().lost = true;
        self.stale()
    }

    fn stale(&self) -> LeaseError {
        LeaseError::Stale {
            database: self.database().clone(),
            holder: self.holder_id.clone(),
            generation: self.generation,
        }
    }
}
