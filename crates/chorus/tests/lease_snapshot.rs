//! The writer lease and fenced snapshot publication, run against every
//! backend: `memory::*`, `local::*` (a directory) and `s3::*` (an S3-compatible
//! server from the test services). Time is simulated with manual clocks, so
//! expiry and clock skew are exact and the tests never sleep for a lease.

#[path = "support/stores.rs"]
mod stores;
mod support;

use std::num::NonZeroUsize;
use std::ops::Range;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chorus::blob::{
    Blob, BlobError, BlobStore, DynBlobStore, Fault, FaultController, FaultRule, FaultyStore,
    KeyMatch, ObjectMeta, Op, OpSet, PutPayload, Version,
};
use chorus::clock::ManualClock;
use chorus::ids::RecordIndex;
use chorus::lease::{
    Contender, DatabaseKey, Generation, HolderId, Incarnation, LeaseConfig, LeaseError,
    LeaseHolder, LeaseStore, Term,
};
use chorus::snapshot::{
    ClaimOutcome, FenceReason, NewSnapshot, PublicationSequence, PublicationStore, SnapshotConfig,
    SnapshotError, SnapshotStore,
};
use stores::{local, memory, s3};
use tokio::sync::Notify;

/// Wall-clock start of every simulated clock.
const START_MS: u64 = 1_700_000_000_000;
/// Lease timing of the tests.
const TTL: Duration = Duration::from_secs(10);
const MARGIN: Duration = Duration::from_secs(2);
/// Contenders in the acquisition race, and its rounds.
const RACERS: usize = 16;
const RACE_ROUNDS: u64 = 3;

fn db() -> DatabaseKey {
    DatabaseKey::new("orders").unwrap()
}

fn holder(id: &str) -> HolderId {
    HolderId::new(id).unwrap()
}

/// The process named `id`: the same incarnation on every call.
fn contender(id: &str) -> Contender {
    let incarnation = id.bytes().fold(1u128, |sum, b| sum * 131 + u128::from(b));
    Contender::with_incarnation(holder(id), Incarnation(incarnation))
}

fn clock() -> Arc<ManualClock> {
    ManualClock::shared(START_MS)
}

fn leases(store: &DynBlobStore, clock: &Arc<ManualClock>) -> LeaseStore {
    let config = LeaseConfig {
        ttl: TTL,
        safety_margin: MARGIN,
        store_call_timeout: Duration::from_secs(5),
    };
    LeaseStore::new(store.clone(), db(), config, clock.clone()).unwrap()
}

async fn acquire(store: &DynBlobStore, clock: &Arc<ManualClock>, id: &str) -> LeaseHolder {
    leases(store, clock)
        .acquire(&contender(id), Term(1))
        .await
        .unwrap()
}

fn snapshots(store: &DynBlobStore, clock: &Arc<ManualClock>) -> SnapshotStore {
    SnapshotStore::new(
        store.clone(),
        db(),
        SnapshotConfig::default(),
        clock.clone(),
    )
}

fn payload(text: &str, wal_index: u64) -> NewSnapshot {
    NewSnapshot {
        bytes: Bytes::copy_from_slice(text.as_bytes()),
        wal_index: RecordIndex(wal_index),
    }
}

/// Observes HEAD and claims it, as a booting node does.
async fn boot(snapshots: &SnapshotStore, lease: &LeaseHolder, initial: &str) -> PublicationStore {
    let mut publication = snapshots.publication();
    publication.observe_for_boot().await.unwrap();
    publication
        .claim(lease, Some(payload(initial, 0)))
        .await
        .unwrap();
    publication
}

fn assert_fenced(result: Result<impl std::fmt::Debug, SnapshotError>, reason: FenceReason) {
    match result {
        Err(SnapshotError::Fenced { reason: found, .. }) => assert_eq!(found, reason),
        other => panic!("expected fenced ({reason}), got {other:?}"),
    }
}

/// Holds the next write (create or update) of a key containing the armed
/// fragment until released: a writer delayed mid-operation (a GC pause, a
/// slow network, a long upload).
#[derive(Debug)]
struct GatedStore {
    inner: DynBlobStore,
    armed: Mutex<Option<&'static str>>,
    entered: Notify,
    release: Notify,
}

impl GatedStore {
    fn new(inner: DynBlobStore) -> Arc<GatedStore> {
        Arc::new(GatedStore {
            inner,
            armed: Mutex::new(None),
            entered: Notify::new(),
            release: Notify::new(),
        })
    }

    /// Holds the next write of a key containing `fragment`.
    fn arm(&self, fragment: &'static str) {
        *self.armed.lock().unwrap() = Some(fragment);
    }

    /// Waits for the release if this write is the armed one.
    async fn pass(&self, key: &str) {
        let held = {
            let mut armed = self.armed.lock().unwrap();
            let held = armed.is_some_and(|fragment| key.contains(fragment));
            if held {
                *armed = None;
            }
            held
        };
        if held {
            self.entered.notify_one();
            self.release.notified().await;
        }
    }
}

#[async_trait]
impl BlobStore for GatedStore {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn create_parts(&self, key: &str, parts: PutPayload) -> Result<Version, BlobError> {
        self.pass(key).await;
        self.inner.create_parts(key, parts).await
    }
    async fn update(
        &self,
        key: &str,
        expected: &Version,
        bytes: Bytes,
    ) -> Result<Version, BlobError> {
        self.pass(key).await;
        self.inner.update(key, expected, bytes).await
    }
    async fn get(&self, key: &str) -> Result<Blob, BlobError> {
        self.inner.get(key).await
    }
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BlobError> {
        self.inner.get_range(key, range).await
    }
    async fn head(&self, key: &str) -> Result<ObjectMeta, BlobError> {
        self.inner.head(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, BlobError> {
        self.inner.list(prefix).await
    }
    async fn delete(&self, key: &str) -> Result<(), BlobError> {
        self.inner.delete(key).await
    }
}

mod lease_cases {
    use super::*;

    pub async fn concurrent_acquirers_exactly_one_wins(store: DynBlobStore) {
        let clock = clock();
        for round in 0..RACE_ROUNDS {
            let tasks: Vec<_> = (0..RACERS)
                .map(|racer| {
                    let leases = leases(&store, &clock);
                    let id = contender(&format!("racer-{round}-{racer}"));
                    tokio::spawn(async move { leases.acquire(&id, Term(1)).await })
                })
                .collect();
            let mut winners = Vec::new();
            for task in tasks {
                match task.await.unwrap() {
                    Ok(lease) => winners.push(lease),
                    Err(LeaseError::Held { .. } | LeaseError::LostRace { .. }) => {}
                    Err(other) => panic!("unexpected acquire error: {other}"),
                }
            }
            assert_eq!(winners.len(), 1, "round {round}: {} winners", winners.len());
            let winner = winners.pop().unwrap();
            assert_eq!(winner.generation(), Generation(round + 1));
            let stored = leases(&store, &clock).read().await.unwrap().unwrap();
            assert_eq!(stored, winner.record());
            winner.release().await.unwrap();
        }
    }

    pub async fn expired_lease_is_taken_over_with_next_generation(store: DynBlobStore) {
        let clock = clock();
        let a = acquire(&store, &clock, "a").await;
        clock.advance(TTL - Duration::from_millis(1));
        let early = leases(&store, &clock)
            .acquire(&contender("b"), Term(1))
            .await;
        assert!(matches!(early, Err(LeaseError::Held { .. })), "{early:?}");
        clock.advance(Duration::from_millis(1));
        let b = acquire(&store, &clock, "b").await;
        assert_eq!(b.generation(), a.generation().next().unwrap());
        assert!(!a.may_write_now() && b.may_write_now());
        let stored = leases(&store, &clock).read().await.unwrap().unwrap();
        assert_eq!(
            (stored.holder_id.as_str(), stored.generation),
            ("b", Generation(2))
        );
    }

    /// Two processes started under one holder id (a copied config, two
    /// containers listening on 0.0.0.0): however they race, one holds the
    /// lease and the other waits for it to expire; the holder's refreshes
    /// keep working.
    pub async fn one_holder_id_in_two_processes_never_both_hold(store: DynBlobStore) {
        let clock = clock();
        for round in 0..RACE_ROUNDS {
            let id = holder(&format!("shared-{round}"));
            let racers: Vec<Contender> = (0..RACERS).map(|_| Contender::new(id.clone())).collect();
            let tasks: Vec<_> = racers
                .iter()
                .map(|racer| {
                    let (leases, racer) = (leases(&store, &clock), racer.clone());
                    tokio::spawn(async move { leases.acquire_at_stored_term(&racer).await })
                })
                .collect();
            let mut winners = Vec::new();
            for task in tasks {
                match task.await.unwrap() {
                    Ok(lease) => winners.push(lease),
                    Err(LeaseError::Held { .. } | LeaseError::LostRace { .. }) => {}
                    Err(other) => panic!("unexpected acquire error: {other}"),
                }
            }
            assert_eq!(winners.len(), 1, "round {round}: {} winners", winners.len());
            let winner = winners.pop().unwrap();
            for racer in racers
                .iter()
                .filter(|r| r.incarnation() != winner.incarnation())
            {
                let late = leases(&store, &clock).acquire_at_stored_term(racer).await;
                assert!(matches!(late, Err(LeaseError::Held { .. })), "{late:?}");
            }
            winner.refresh().await.unwrap();
            let winning = racers
                .iter()
                .find(|r| r.incarnation() == winner.incarnation());
            let again = leases(&store, &clock)
                .acquire_at_stored_term(winning.unwrap())
                .await
                .expect("the winning process re-acquires its own live lease");
            assert!(again.generation() > winner.generation());
            again.release().await.unwrap();
        }
    }

    pub async fn release_keeps_generations_increasing(store: DynBlobStore) {
        let clock = clock();
        let leases = leases(&store, &clock);
        let mut last = Generation(0);
        for (turn, id) in ["a", "b", "a", "a"].into_iter().enumerate() {
            let lease = leases.acquire(&contender(id), Term(1)).await.unwrap();
            assert!(
                lease.generation() > last,
                "turn {turn}: generation went back"
            );
            last = lease.generation();
            lease.release().await.unwrap();
            let stored = leases.read().await.unwrap().unwrap();
            assert!(stored.released, "turn {turn}");
            assert_eq!(stored.generation, last, "release keeps the generation");
        }
        assert_eq!(last, Generation(4));
    }

    pub async fn lower_term_is_fenced_even_after_expiry(store: DynBlobStore) {
        let clock = clock();
        let leases = leases(&store, &clock);
        let _newer = leases.acquire(&contender("a"), Term(2)).await.unwrap();
        clock.advance(TTL * 3);
        let fenced = leases.acquire(&contender("b"), Term(1)).await;
        assert!(
            matches!(
                fenced,
                Err(LeaseError::Fenced {
                    term: Term(1),
                    stored_term: Term(2),
                    ..
                })
            ),
            "{fenced:?}"
        );
        let same_holder_lower_term = leases.acquire(&contender("a"), Term(1)).await;
        assert!(matches!(
            same_holder_lower_term,
            Err(LeaseError::Fenced { .. })
        ));
        let higher = leases.acquire(&contender("c"), Term(3)).await.unwrap();
        assert_eq!(higher.generation(), Generation(2));
        higher.release().await.unwrap();
        let after_release = leases.acquire(&contender("b"), Term(2)).await;
        assert!(
            matches!(after_release, Err(LeaseError::Fenced { .. })),
            "{after_release:?}"
        );
    }

    pub async fn refresh_after_takeover_is_stale(store: DynBlobStore) {
        let clock = clock();
        let a = acquire(&store, &clock, "a").await;
        clock.advance(TTL + Duration::from_secs(1));
        let b = acquire(&store, &clock, "b").await;
        let refresh = a.refresh().await;
        assert!(
            matches!(refresh, Err(LeaseError::Stale { .. })),
            "{refresh:?}"
        );
        assert!(!a.may_write_now());
        assert!(matches!(a.release().await, Err(LeaseError::Stale { .. })));
        b.refresh().await.unwrap();
        let stored = leases(&store, &clock).read().await.unwrap().unwrap();
        assert_eq!(stored, b.record());
    }

    /// `take_over` does not wait for a live lease: it writes the next term and
    /// generation, so the previous holder's refresh finds the lease changed,
    /// it stops believing it may write, it can no longer publish, and its term
    /// can never acquire again.
    pub async fn take_over_fences_a_live_holder(store: DynBlobStore) {
        let clock = clock();
        let leases = leases(&store, &clock);
        let a = leases.acquire(&contender("a"), Term(1)).await.unwrap();
        let snapshots = snapshots(&store, &clock);
        let mut a_publication = boot(&snapshots, &a, "a-initial").await;
        let refused = leases.acquire(&contender("b"), Term(1)).await;
        assert!(
            matches!(refused, Err(LeaseError::Held { .. })),
            "{refused:?}"
        );

        let b = leases.take_over(&contender("b")).await.unwrap();
        assert_eq!(b.term(), Term(2), "a take-over bumps the term");
        assert_eq!(b.generation(), a.generation().next().unwrap());
        assert!(b.may_write_now());
        let stored = leases.read().await.unwrap().unwrap();
        assert_eq!(stored, b.record());
        assert_eq!(
            (stored.holder_id.as_str(), stored.term, stored.generation),
            ("b", Term(2), Generation(2))
        );
        assert!(!stored.released);

        let refresh = a.refresh().await;
        assert!(
            matches!(refresh, Err(LeaseError::Stale { .. })),
            "{refresh:?}"
        );
        assert!(
            !a.may_write_now(),
            "a stale holder still believes it may write"
        );
        assert!(matches!(a.release().await, Err(LeaseError::Stale { .. })));
        assert_fenced(
            a_publication.publish(&a, payload("a-late", 5)).await,
            FenceReason::LeaseExpired,
        );
        // The new holder claims HEAD over the old holder's stamp and publishes.
        let mut b_publication = boot(&snapshots, &b, "unused").await;
        b_publication.publish(&b, payload("b", 7)).await.unwrap();
        b.refresh().await.unwrap();

        // Even once the take-over's lease expired, the old term stays fenced.
        clock.advance(TTL * 2);
        let old_term = leases.acquire(&contender("a"), Term(1)).await;
        assert!(
            matches!(
                old_term,
                Err(LeaseError::Fenced {
                    term: Term(1),
                    stored_term: Term(2),
                    ..
                })
            ),
            "{old_term:?}"
        );
        let next = leases.acquire(&contender("a"), Term(2)).await.unwrap();
        assert_eq!(next.generation(), Generation(3));

        // On a database without a lease, a take-over is a first acquisition.
        let fresh = LeaseStore::new(
            store.clone(),
            DatabaseKey::new("fresh").unwrap(),
            *leases.config(),
            clock.clone(),
        )
        .unwrap();
        let first = fresh.take_over(&contender("c")).await.unwrap();
        assert_eq!((first.term(), first.generation()), (Term(1), Generation(1)));
    }

    /// The contender's wall clock runs ahead of the holder's by up to the
    /// safety margin; both clocks advance in lockstep. At no instant may both
    /// believe they may write, and the contender does take over eventually.
    pub async fn clock_skew_within_margin_never_gives_two_writers(store: DynBlobStore) {
        let step = Duration::from_millis(250);
        for (round, skew) in [Duration::ZERO, MARGIN / 2, MARGIN].into_iter().enumerate() {
            let holder_clock = ManualClock::shared(START_MS);
            let contender_clock = ManualClock::shared(START_MS + skew.as_millis() as u64);
            let holder_leases = leases(&store, &holder_clock);
            let contender_leases = leases(&store, &contender_clock);
            let term = Term(1);
            let a = holder_leases
                .acquire(&contender(&format!("holder-{round}")), term)
                .await
                .unwrap();
            let mut b = None;
            for tick in 0..(3 * TTL.as_millis() / step.as_millis()) {
                // The holder refreshes for the first two seconds, then goes quiet.
                if tick < 8 {
                    a.refresh().await.unwrap();
                }
                if b.is_none() {
                    match contender_leases
                        .acquire(&contender(&format!("contender-{round}")), term)
                        .await
                    {
                        Ok(lease) => b = Some(lease),
                        Err(LeaseError::Held { .. }) => {}
                        Err(other) => panic!("unexpected: {other}"),
                    }
                }
                let both = a.may_write_now() && b.as_ref().is_some_and(|b| b.may_write_now());
                assert!(!both, "skew {skew:?}, tick {tick}: two writers");
                holder_clock.advance(step);
                contender_clock.advance(step);
            }
            let b = b.expect("the contender takes over once the lease expires");
            b.release().await.unwrap();
        }
    }
}

mod snapshot_cases {
    use super::*;

    pub async fn publish_and_restore_round_trip(store: DynBlobStore) {
        let clock = clock();
        let lease = acquire(&store, &clock, "a").await;
        let snapshots = snapshots(&store, &clock);
        let mut publication = snapshots.publication();
        assert_eq!(publication.observe_for_boot().await.unwrap(), None);
        let claimed = publication
            .claim(&lease, Some(payload("zero", 0)))
            .await
            .unwrap();
        let ClaimOutcome::Installed(first) = claimed else {
            panic!("first boot installs HEAD");
        };
        assert_eq!(first.publication_sequence, PublicationSequence::FIRST);
        for (index, text) in ["one", "two", "three"].into_iter().enumerate() {
            let head = publication
                .publish(&lease, payload(text, 10 * (index as u64 + 1)))
                .await
                .unwrap();
            assert_eq!(
                head.publication_sequence,
                PublicationSequence(index as u64 + 2)
            );
        }
        let (head, bytes) = snapshots.restore().await.unwrap().unwrap();
        assert_eq!(bytes, Bytes::from_static(b"three"));
        assert_eq!(head.wal_index, RecordIndex(30));
        assert_eq!(head.holder_id.as_str(), "a");
        assert_eq!(head.lease_generation, lease.generation());
        assert_eq!(snapshots.list().await.unwrap().len(), 4);
    }

    /// Reference scenario 1: the old writer passed its lease check, then was
    /// delayed mid-publication (its own clock frozen, so it still believes in
    /// its lease). A successor acquires and claims. The old writer's HEAD CAS
    /// then fails, fencing it for good; HEAD ends on the successor's payload.
    pub async fn successor_claim_fences_delayed_publication(store: DynBlobStore) {
        let (old_clock, new_clock) = (clock(), clock());
        let gated = GatedStore::new(store.clone());
        let gated_store: DynBlobStore = gated.clone();
        let old = Arc::new(acquire(&gated_store, &old_clock, "old").await);
        let mut old_publication = boot(&snapshots(&gated_store, &old_clock), &old, "zero").await;
        old_publication
            .publish(&old, payload("one", 1))
            .await
            .unwrap();

        gated.arm("/snapshots/");
        let delayed_lease = old.clone();
        let delayed = tokio::spawn(async move {
            let result = old_publication
                .publish(&delayed_lease, payload("stale", 2))
                .await;
            (old_publication, result)
        });
        gated.entered.notified().await;

        new_clock.advance(TTL + Duration::from_secs(1));
        let new = acquire(&store, &new_clock, "new").await;
        let new_snapshots = snapshots(&store, &new_clock);
        let mut new_publication = boot(&new_snapshots, &new, "unused").await;
        assert!(
            old.may_write_now(),
            "the delayed writer still believes in its lease"
        );

        gated.release.notify_one();
        let (mut old_publication, result) = delayed.await.unwrap();
        assert_fenced(result, FenceReason::HeadMoved);
        assert_fenced(
            old_publication.publish(&old, payload("later", 3)).await,
            FenceReason::HeadMoved,
        );

        let head = new_publication
            .publish(&new, payload("successor", 4))
            .await
            .unwrap();
        let (current, bytes) = new_snapshots.restore().await.unwrap().unwrap();
        assert_eq!(current, head);
        assert_eq!(bytes, Bytes::from_static(b"successor"));
        assert_eq!(current.snapshot.generation, new.generation());
        assert_eq!(current.holder_id.as_str(), "new");
    }

    /// Reference scenario 2 (ABA): one lease identity (same holder, term and
    /// generation) boots twice on a frozen clock. The second claim bumps the
    /// sequence, so HEAD's bytes differ and so does its version, even on stores
    /// whose version is a content hash (S3's ETag); a zombie boot that observed
    /// the first claim's version can never CAS over it again, and neither can
    /// a raw CAS naming that version.
    pub async fn reused_lease_identity_cannot_restore_an_old_head_version(store: DynBlobStore) {
        let clock = clock();
        let lease = acquire(&store, &clock, "node").await;
        let snapshots = snapshots(&store, &clock);
        let first = boot(&snapshots, &lease, "zero").await;
        let first_read = snapshots.read_head().await.unwrap().unwrap();
        let first_bytes = store.get("orders/HEAD.json").await.unwrap().bytes;
        let mut zombie = snapshots.publication();
        zombie.observe_for_boot().await.unwrap();
        drop(first); // a clean shutdown; the same identity boots again

        let second = boot(&snapshots, &lease, "unused").await;
        let second_head = second.head().unwrap().clone();
        let second_read = snapshots.read_head().await.unwrap().unwrap();
        assert_eq!(
            second_head.publication_sequence,
            first_read.head.publication_sequence.next()
        );
        assert_eq!(
            second_head.updated_at_ms, first_read.head.updated_at_ms,
            "clock frozen"
        );
        assert_ne!(
            store.get("orders/HEAD.json").await.unwrap().bytes,
            first_bytes
        );
        assert_ne!(second_read.version, first_read.version);

        assert_fenced(
            zombie.claim(&lease, Some(payload("x", 0))).await,
            FenceReason::HeadMoved,
        );
        let raw = store
            .update("orders/HEAD.json", &first_read.version, first_bytes)
            .await;
        assert!(matches!(raw, Err(BlobError::Conflict { .. })), "{raw:?}");
        assert_eq!(snapshots.read_head().await.unwrap().unwrap(), second_read);
    }

    /// Reference scenario 3: a node observes HEAD and hydrates from it; HEAD
    /// advances meanwhile. Its boot claim must fail, and a fresh boot from the
    /// newer HEAD succeeds.
    pub async fn boot_claim_fails_when_head_advanced_during_hydration(store: DynBlobStore) {
        let (old_clock, new_clock) = (clock(), clock());
        let old = acquire(&store, &old_clock, "old").await;
        let mut old_publication = boot(&snapshots(&store, &old_clock), &old, "zero").await;

        let new_snapshots = snapshots(&store, &new_clock);
        let mut booting = new_snapshots.publication();
        let observed = booting.observe_for_boot().await.unwrap().unwrap();
        let hydrated = new_snapshots.download(&observed).await.unwrap();
        assert_eq!(hydrated, Bytes::from_static(b"zero"));

        let advanced = old_publication
            .publish(&old, payload("one", 7))
            .await
            .unwrap();
        old_clock.advance(TTL + Duration::from_secs(1));
        new_clock.advance(TTL + Duration::from_secs(1));
        let new = acquire(&store, &new_clock, "new").await;
        assert_fenced(
            booting.claim(&new, Some(payload("x", 0))).await,
            FenceReason::HeadMoved,
        );
        let current = new_snapshots.read_head().await.unwrap().unwrap();
        assert_eq!(current.head, advanced, "the failed claim changed nothing");

        let mut retry = new_snapshots.publication();
        let observed = retry.observe_for_boot().await.unwrap().unwrap();
        assert_eq!(observed, advanced);
        let claimed = retry.claim(&new, Some(payload("x", 0))).await.unwrap();
        assert!(matches!(claimed, ClaimOutcome::Adopted(_)));
        assert_eq!(claimed.head().snapshot, advanced.snapshot);
        assert_eq!(claimed.head().wal_index, RecordIndex(7));
    }

    pub async fn publish_after_losing_the_lease_is_fenced_and_head_unchanged(store: DynBlobStore) {
        let clock = clock();
        let lease = acquire(&store, &clock, "a").await;
        let snapshots = snapshots(&store, &clock);
        let mut publication = boot(&snapshots, &lease, "zero").await;
        clock.advance(TTL + Duration::from_secs(1));
        let _successor = acquire(&store, &clock, "b").await;
        let before = snapshots.read_head().await.unwrap().unwrap();
        let listed_before = snapshots.list().await.unwrap();
        assert_fenced(
            publication.publish(&lease, payload("late", 1)).await,
            FenceReason::LeaseExpired,
        );
        assert_eq!(snapshots.read_head().await.unwrap().unwrap(), before);
        assert_eq!(
            snapshots.list().await.unwrap(),
            listed_before,
            "nothing uploaded"
        );
    }

    /// What the stale publisher is doing when its lease runs out.
    #[derive(Debug, Clone, Copy)]
    enum Late {
        /// The first-boot claim: upload the initial payload, create HEAD.
        Install,
        /// A publication after a claim: upload, then CAS HEAD.
        Publish,
    }

    /// Where the stale publisher is held while its lease runs out.
    #[derive(Debug, Clone, Copy)]
    enum Held {
        /// In its payload upload.
        Upload,
        /// In its first HEAD write attempt, which then fails transiently, so
        /// the resolver retries it.
        FailingHeadWrite,
    }

    /// A publisher whose lease runs out (on its own monotonic clock) while it
    /// is held at `held`; meanwhile a successor acquires the lease and observes
    /// HEAD, but claims only afterwards, so no CAS protects HEAD from the stale
    /// write: only the lease check immediately before each HEAD write attempt
    /// does. The stale operation must fence with `lease-expired` and leave HEAD
    /// as the successor observed it, and the successor's claim must succeed.
    async fn late_head_write_is_fenced(store: DynBlobStore, late: Late, held: Held) {
        let clock = clock();
        let controller = FaultController::new(17);
        let faulty: DynBlobStore = Arc::new(FaultyStore::new(store.clone(), controller.clone()));
        let gated = GatedStore::new(faulty);
        let gated_store: DynBlobStore = gated.clone();
        let stale = Arc::new(acquire(&gated_store, &clock, "stale").await);
        let mut publication = snapshots(&gated_store, &clock).publication();
        publication.observe_for_boot().await.unwrap();
        if let Late::Publish = late {
            publication
                .claim(&stale, Some(payload("zero", 0)))
                .await
                .unwrap();
        }
        match held {
            Held::Upload => gated.arm("/snapshots/"),
            Held::FailingHeadWrite => {
                gated.arm("/HEAD.json");
                controller.add(
                    FaultRule::new(Fault::FailBefore)
                        .ops(OpSet::of(&[Op::Create, Op::Update]))
                        .keys(KeyMatch::Exact("orders/HEAD.json".into()))
                        .times(1),
                );
            }
        }
        let lease = stale.clone();
        let task = tokio::spawn(async move {
            let result = match late {
                Late::Install => publication
                    .claim(&lease, Some(payload("stale", 1)))
                    .await
                    .map(|claimed| claimed.head().clone()),
                Late::Publish => publication.publish(&lease, payload("stale", 1)).await,
            };
            (publication, result)
        });
        gated.entered.notified().await;

        clock.advance(TTL + Duration::from_secs(1));
        assert!(!stale.may_write_now());
        let successor = acquire(&store, &clock, "successor").await;
        let successor_snapshots = snapshots(&store, &clock);
        let mut successor_publication = successor_snapshots.publication();
        let observed = successor_publication.observe_for_boot().await.unwrap();

        gated.release.notify_one();
        let (mut publication, result) = task.await.unwrap();
        assert_fenced(result, FenceReason::LeaseExpired);
        let current = successor_snapshots.read_head().await.unwrap();
        assert_eq!(
            current.map(|current| current.head),
            observed,
            "the stale publisher moved HEAD"
        );
        assert_fenced(
            publication.publish(&stale, payload("later", 2)).await,
            FenceReason::LeaseExpired,
        );

        let claimed = successor_publication
            .claim(&successor, Some(payload("successor", 0)))
            .await
            .unwrap();
        let (head, bytes) = successor_snapshots.restore().await.unwrap().unwrap();
        assert_eq!(&head, claimed.head());
        let expected = match late {
            Late::Install => "successor",
            Late::Publish => "zero",
        };
        assert_eq!(bytes, Bytes::from(expected));
    }

    pub async fn install_rechecks_the_lease_after_a_long_upload(store: DynBlobStore) {
        late_head_write_is_fenced(store, Late::Install, Held::Upload).await;
    }

    pub async fn publish_rechecks_the_lease_after_a_long_upload(store: DynBlobStore) {
        late_head_write_is_fenced(store, Late::Publish, Held::Upload).await;
    }

    pub async fn install_head_retry_rechecks_the_lease(store: DynBlobStore) {
        late_head_write_is_fenced(store, Late::Install, Held::FailingHeadWrite).await;
    }

    pub async fn publish_head_retry_rechecks_the_lease(store: DynBlobStore) {
        late_head_write_is_fenced(store, Late::Publish, Held::FailingHeadWrite).await;
    }

    pub async fn payload_key_is_never_overwritten(store: DynBlobStore) {
        let clock = clock();
        let lease = acquire(&store, &clock, "a").await;
        let snapshots = snapshots(&store, &clock);
        let mut publication = boot(&snapshots, &lease, "zero").await;
        let first = publication
            .publish(&lease, payload("one", 1))
            .await
            .unwrap();
        let first_key = first.snapshot_key();
        // Someone else's bytes already sit at the key the next publication uses.
        let next_key = first_key.replace("-s00000000000000000002", "-s00000000000000000003");
        assert_ne!(next_key, first_key);
        store
            .create(&next_key, Bytes::from_static(b"squatter"))
            .await
            .unwrap();
        let before = snapshots.read_head().await.unwrap().unwrap();
        let result = publication.publish(&lease, payload("two", 2)).await;
        assert_fenced(
            result,
            FenceReason::PayloadExists {
                key: next_key.clone(),
            },
        );
        assert_eq!(
            store.get(&next_key).await.unwrap().bytes,
            Bytes::from_static(b"squatter")
        );
        assert_eq!(
            store.get(&first_key).await.unwrap().bytes,
            Bytes::from_static(b"one")
        );
        assert_eq!(snapshots.read_head().await.unwrap().unwrap(), before);
    }

    pub async fn corrupted_payload_fails_restore_with_checksum_error(store: DynBlobStore) {
        let clock = clock();
        let lease = acquire(&store, &clock, "a").await;
        let mut publication = boot(&snapshots(&store, &clock), &lease, "zero").await;
        let head = publication
            .publish(&lease, payload("precious", 1))
            .await
            .unwrap();
        let controller = FaultController::new(99);
        controller.add(
            FaultRule::new(Fault::Corrupt)
                .ops(OpSet::READS)
                .keys(KeyMatch::Prefix("orders/snapshots/".into())),
        );
        let corrupting: DynBlobStore = Arc::new(FaultyStore::new(store.clone(), controller));
        let error = snapshots(&corrupting, &clock).restore().await.unwrap_err();
        let SnapshotError::Checksum {
            ref key, expected, ..
        } = error
        else {
            panic!("expected a checksum error, got {error}");
        };
        assert_eq!((key, expected), (&head.snapshot_key(), head.payload_sha256));
        assert!(
            error
                .to_string()
                .contains(&format!("key={}", head.snapshot_key())),
            "{error}"
        );
        let clean = snapshots(&store, &clock).restore().await.unwrap().unwrap();
        assert_eq!(clean.1, Bytes::from_static(b"precious"));
    }

    pub async fn retention_keeps_the_newest_and_what_head_names(store: DynBlobStore) {
        let clock = clock();
        let first = acquire(&store, &clock, "a").await;
        let snapshots = snapshots(&store, &clock);
        let mut publication = boot(&snapshots, &first, "zero").await;
        for n in 1..=5 {
            publication
                .publish(&first, payload(&format!("p{n}"), n))
                .await
                .unwrap();
        }
        first.release().await.unwrap();
        // A restart re-stamps HEAD over the same payload with a higher sequence.
        let second = acquire(&store, &clock, "b").await;
        let claimed = boot(&snapshots, &second, "unused").await;
        let head = claimed.head().unwrap().clone();
        let keep = NonZeroUsize::new(2).unwrap();
        let report = snapshots.retain(keep).await.unwrap();
        let sequences = |ids: &[chorus::snapshot::PayloadId]| {
            ids.iter().map(|id| id.sequence.0).collect::<Vec<_>>()
        };
        assert_eq!(sequences(&report.deleted), [1, 2, 3, 4]);
        assert_eq!(sequences(&report.kept), [5, 6]);
        assert!(report.kept.contains(&head.snapshot));
        let listed: Vec<_> = snapshots
            .list()
            .await
            .unwrap()
            .into_iter()
            .map(|p| p.id)
            .collect();
        assert_eq!(listed, report.kept);
        let (_, bytes) = snapshots.restore().await.unwrap().unwrap();
        assert_eq!(bytes, Bytes::from_static(b"p5"));
        assert_eq!(snapshots.retain(keep).await.unwrap().deleted, []);
    }
}

macro_rules! backend {
    ($backend:ident) => {
        mod $backend {
            use super::*;

            macro_rules! case {
                ($module:ident, $name:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                    async fn $name() {
                        if let Some(fixture) = super::$backend().await {
                            $module::$name(fixture.store.clone()).await;
                        }
                    }
                };
            }

            case!(lease_cases, concurrent_acquirers_exactly_one_wins);
            case!(
                lease_cases,
                expired_lease_is_taken_over_with_next_generation
            );
            case!(lease_cases, release_keeps_generations_increasing);
            case!(lease_cases, one_holder_id_in_two_processes_never_both_hold);
            case!(lease_cases, lower_term_is_fenced_even_after_expiry);
            case!(lease_cases, refresh_after_takeover_is_stale);
            case!(lease_cases, take_over_fences_a_live_holder);
            case!(
                lease_cases,
                clock_skew_within_margin_never_gives_two_writers
            );
            case!(snapshot_cases, publish_and_restore_round_trip);
            case!(snapshot_cases, successor_claim_fences_delayed_publication);
            case!(
                snapshot_cases,
                reused_lease_identity_cannot_restore_an_old_head_version
            );
            case!(
                snapshot_cases,
                boot_claim_fails_when_head_advanced_during_hydration
            );
            case!(
                snapshot_cases,
                publish_after_losing_the_lease_is_fenced_and_head_unchanged
            );
            case!(
                snapshot_cases,
                install_rechecks_the_lease_after_a_long_upload
            );
            case!(
                snapshot_cases,
                publish_rechecks_the_lease_after_a_long_upload
            );
            case!(snapshot_cases, install_head_retry_rechecks_the_lease);
            case!(snapshot_cases, publish_head_retry_rechecks_the_lease);
            case!(snapshot_cases, payload_key_is_never_overwritten);
            case!(
                snapshot_cases,
                corrupted_payload_fails_restore_with_checksum_error
            );
            case!(
                snapshot_cases,
                retention_keeps_the_newest_and_what_head_names
            );
        }
    };
}

backend!(memory);
backend!(local);
backend!(s3);
