//! Unit tests of snapshot publication over an in-memory store: the stable
//! read, the state machine's refusals, settling lost responses, and payload
//! verification. The cross-backend contract and the reference scenarios are in
//! `tests/lease_snapshot.rs`.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use super::*;
use crate::blob::{
    Blob, BlobStore, Fault, FaultController, FaultRule, FaultyStore, KeyMatch, ObjectMeta, Op,
    OpSet, PutPayload, RuleId, StoreUrl, open_store,
};
use crate::clock::ManualClock;
use crate::ids::RecordIndex;
use crate::lease::{Contender, HolderId, Incarnation, LeaseConfig, LeaseHolder, LeaseStore, Term};

const START_MS: u64 = 1_700_000_000_000;

async fn memory() -> DynBlobStore {
    let url = format!("memory://snapshot-unit-{:x}", rand::random::<u64>());
    open_store(&url.parse::<StoreUrl>().unwrap()).await.unwrap()
}

fn db() -> DatabaseKey {
    DatabaseKey::new("db").unwrap()
}

fn snapshots(store: &DynBlobStore, clock: &Arc<ManualClock>) -> SnapshotStore {
    SnapshotStore::new(
        store.clone(),
        db(),
        SnapshotConfig::default(),
        clock.clone(),
    )
}

/// The process named `id`: the same incarnation on every call, so a second
/// acquisition is that process re-acquiring its own live lease.
fn contender(id: &str) -> Contender {
    let incarnation = id.bytes().fold(1u128, |sum, b| sum * 131 + u128::from(b));
    Contender::with_incarnation(HolderId::new(id).unwrap(), Incarnation(incarnation))
}

async fn acquire(store: &DynBlobStore, clock: &Arc<ManualClock>, id: &str) -> LeaseHolder {
    LeaseStore::new(store.clone(), db(), LeaseConfig::default(), clock.clone())
        .unwrap()
        .acquire(&contender(id), Term(1))
        .await
        .unwrap()
}

fn snapshot(text: &str, wal_index: u64) -> NewSnapshot {
    NewSnapshot {
        bytes: Bytes::copy_from_slice(text.as_bytes()),
        wal_index: RecordIndex(wal_index),
    }
}

/// Boots a publication store: observe, then claim with `initial`.
async fn boot(snapshots: &SnapshotStore, lease: &LeaseHolder, initial: &str) -> PublicationStore {
    let mut publication = snapshots.publication();
    publication.observe_for_boot().await.unwrap();
    publication
        .claim(lease, Some(snapshot(initial, 0)))
        .await
        .unwrap();
    publication
}

/// Rewrites HEAD (same bytes, new version) just before the first `moves` HEAD
/// reads, as a concurrent writer would.
#[derive(Debug)]
struct MovingHead {
    inner: DynBlobStore,
    moves: AtomicU32,
}

#[async_trait]
impl BlobStore for MovingHead {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn create_parts(&self, key: &str, parts: PutPayload) -> Result<Version, BlobError> {
        self.inner.create_parts(key, parts).await
    }
    async fn update(
        &self,
        key: &str,
        expected: &Version,
        bytes: Bytes,
    ) -> Result<Version, BlobError> {
        self.inner.update(key, expected, bytes).await
    }
    async fn get(&self, key: &str) -> Result<Blob, BlobError> {
        let moving = self
            .moves
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if moving && key.ends_with("HEAD.json") {
            let current = self.inner.get(key).await?;
            self.inner
                .update(key, &current.version, current.bytes)
                .await?;
        }
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

#[tokio::test]
async fn the_stable_read_retries_while_head_moves_and_gives_up_eventually() {
    let clock = ManualClock::shared(START_MS);
    let inner = memory().await;
    let lease = acquire(&inner, &clock, "a").await;
    boot(&snapshots(&inner, &clock), &lease, "zero").await;

    let moving = Arc::new(MovingHead {
        inner: inner.clone(),
        moves: AtomicU32::new(2),
    });
    let store: DynBlobStore = moving.clone();
    let read = snapshots(&store, &clock)
        .read_head()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        read.version,
        inner.head("db/HEAD.json").await.unwrap().version
    );
    assert_eq!(moving.moves.load(Ordering::SeqCst), 0);

    moving.moves.store(u32::MAX, Ordering::SeqCst);
    let error = snapshots(&store, &clock).read_head().await.unwrap_err();
    assert!(
        matches!(
            error,
            SnapshotError::Unstable {
                rounds: MAX_STABLE_READ_ROUNDS,
                ..
            }
        ),
        "{error}"
    );
    assert!(error.is_transient());
}

#[tokio::test]
async fn operations_out_of_order_are_refused_and_the_fence_is_sticky() {
    let clock = ManualClock::shared(START_MS);
    let store = memory().await;
    let lease = acquire(&store, &clock, "a").await;
    let snapshots = snapshots(&store, &clock);
    let mut publication = snapshots.publication();
    let early = publication
        .publish(&lease, snapshot("x", 1))
        .await
        .unwrap_err();
    assert_eq!(
        early.to_string(),
        "snapshot publication cannot publish in state=unobserved: database=db"
    );
    assert!(
        publication
            .claim(&lease, Some(snapshot("x", 1)))
            .await
            .is_err()
    );
    publication.observe_for_boot().await.unwrap();
    publication
        .claim(&lease, Some(snapshot("zero", 0)))
        .await
        .unwrap();
    assert!(matches!(
        publication.observe_for_boot().await,
        Err(SnapshotError::WrongState {
            state: PublicationState::Claimed,
            ..
        })
    ));

    lease.release().await.unwrap();
    let fenced = publication
        .publish(&lease, snapshot("one", 1))
        .await
        .unwrap_err();
    assert!(fenced.is_fenced(), "{fenced}");
    assert_eq!(publication.fence_reason(), Some(&FenceReason::LeaseExpired));
    for _ in 0..2 {
        assert!(
            publication
                .observe_for_boot()
                .await
                .unwrap_err()
                .is_fenced()
        );
    }
}

#[tokio::test]
async fn a_claim_over_a_newer_fencing_token_is_superseded() {
    let clock = ManualClock::shared(START_MS);
    let store = memory().await;
    let snapshots = snapshots(&store, &clock);
    let old = acquire(&store, &clock, "a").await;
    // The successor's wall clock is past the old lease; the old holder's own
    // clock says it may still write (a frozen process).
    let later = ManualClock::shared(START_MS + 60_000);
    let new = acquire(&store, &later, "b").await;
    assert!(old.may_write_now());
    let _claimed = boot(&snapshots, &new, "zero").await;
    let mut late = snapshots.publication();
    late.observe_for_boot().await.unwrap();
    let error = late.claim(&old, Some(snapshot("x", 0))).await.unwrap_err();
    assert_eq!(
        late.fence_reason(),
        Some(&FenceReason::Superseded),
        "{error}"
    );
}

#[tokio::test]
async fn publish_with_another_incarnation_is_a_lease_mismatch() {
    let clock = ManualClock::shared(START_MS);
    let store = memory().await;
    let snapshots = snapshots(&store, &clock);
    let first = acquire(&store, &clock, "a").await;
    let mut publication = boot(&snapshots, &first, "zero").await;
    let second = acquire(&store, &clock, "a").await;
    let error = publication
        .publish(&second, snapshot("x", 1))
        .await
        .unwrap_err();
    assert_eq!(
        publication.fence_reason(),
        Some(&FenceReason::LeaseMismatch),
        "{error}"
    );
}

#[tokio::test]
async fn a_publication_below_heads_wal_index_is_refused_unless_rewinding() {
    let clock = ManualClock::shared(START_MS);
    let store = memory().await;
    let snapshots = snapshots(&store, &clock);
    let lease = acquire(&store, &clock, "a").await;
    let mut publication = boot(&snapshots, &lease, "zero").await;
    publication
        .publish(&lease, snapshot("five", 5))
        .await
        .unwrap();
    let before = snapshots.read_head().await.unwrap().unwrap();
    let error = publication
        .publish(&lease, snapshot("three", 3))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            SnapshotError::Rewind {
                head_wal_index: RecordIndex(5),
                requested: RecordIndex(3),
                ..
            }
        ),
        "{error}"
    );
    // Nothing was written, and the store may still publish.
    assert_eq!(snapshots.read_head().await.unwrap().unwrap(), before);
    assert_eq!(snapshots.list().await.unwrap().len(), 2);
    publication
        .publish(&lease, snapshot("five again", 5))
        .await
        .unwrap();
    let rewound = publication
        .publish_rewinding(&lease, snapshot("three", 3))
        .await
        .unwrap();
    assert_eq!(rewound.wal_index, RecordIndex(3));
}

/// Adds faults under which the next write of `key` lands but its response is
/// lost, and reading it back fails until the rules are cleared: the outcome
/// stays unknown.
fn lose_next_write(controller: &FaultController, key: KeyMatch, ops: &[Op]) {
    controller.add(
        FaultRule::new(Fault::FailAfter)
            .ops(OpSet::of(ops))
            .keys(key.clone())
            .times(1),
    );
    controller.add(
        FaultRule::new(Fault::FailBefore)
            .ops(OpSet::of(&[Op::Get]))
            .keys(key),
    );
}

/// HEAD writes whose outcome stayed unknown are found and followed by the
/// next claim or publication, instead of fencing the store.
#[tokio::test(start_paused = true)]
async fn lost_head_responses_are_followed_not_fenced() {
    let clock = ManualClock::shared(START_MS);
    let controller = FaultController::new(3);
    let store: DynBlobStore = Arc::new(FaultyStore::new(memory().await, controller.clone()));
    let lease = acquire(&store, &clock, "a").await;
    let snapshots = snapshots(&store, &clock);
    let head_key = || KeyMatch::Exact("db/HEAD.json".into());

    let mut publication = snapshots.publication();
    publication.observe_for_boot().await.unwrap();
    lose_next_write(&controller, head_key(), &[Op::Create]);
    let unknown = publication
        .claim(&lease, Some(snapshot("zero", 0)))
        .await
        .unwrap_err();
    assert!(unknown.is_transient(), "{unknown}");
    assert_eq!(publication.state(), PublicationState::Observed);
    controller.clear();
    // A later attempt writes different bytes (a later timestamp), finds ours.
    clock.advance(Duration::from_secs(1));
    let claimed = publication
        .claim(&lease, Some(snapshot("zero", 0)))
        .await
        .unwrap();
    assert!(matches!(claimed, ClaimOutcome::Installed(_)));
    assert_eq!(
        claimed.head().updated_at_ms,
        START_MS,
        "the first attempt's HEAD"
    );

    lose_next_write(&controller, head_key(), &[Op::Update]);
    let unknown = publication
        .publish(&lease, snapshot("one", 1))
        .await
        .unwrap_err();
    assert!(unknown.is_transient(), "{unknown}");
    controller.clear();
    let head = publication
        .publish(&lease, snapshot("two", 2))
        .await
        .unwrap();
    assert_eq!(head.publication_sequence, PublicationSequence(3));
    let stored = snapshots.read_head().await.unwrap().unwrap();
    assert_eq!(stored.head, head);
    assert_eq!(
        snapshots.download(&head).await.unwrap(),
        Bytes::from_static(b"two")
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_upload_never_reuses_its_key() {
    let clock = ManualClock::shared(START_MS);
    let controller = FaultController::new(5);
    let store: DynBlobStore = Arc::new(FaultyStore::new(memory().await, controller.clone()));
    let lease = acquire(&store, &clock, "a").await;
    let snapshots = snapshots(&store, &clock);
    let mut publication = boot(&snapshots, &lease, "zero").await;
    lose_next_write(
        &controller,
        KeyMatch::Prefix("db/snapshots/".into()),
        &[Op::Create],
    );
    let unknown = publication
        .publish(&lease, snapshot("lost", 1))
        .await
        .unwrap_err();
    assert!(unknown.is_transient(), "{unknown}");
    controller.clear();
    let head = publication
        .publish(&lease, snapshot("kept", 2))
        .await
        .unwrap();
    assert_eq!(head.snapshot.sequence, PublicationSequence(3));
    let sequences: Vec<u64> = snapshots
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|payload| payload.id.sequence.0)
        .collect();
    assert_eq!(sequences, [1, 2, 3]);
}

#[tokio::test]
async fn download_checks_size_and_missing_payloads() {
    let clock = ManualClock::shared(START_MS);
    let store = memory().await;
    let lease = acquire(&store, &clock, "a").await;
    let snapshots = snapshots(&store, &clock);
    assert_eq!(snapshots.restore().await.unwrap(), None);
    let publication = boot(&snapshots, &lease, "zero").await;
    let head = publication.head().unwrap().clone();
    store.delete(&head.snapshot_key()).await.unwrap();
    let missing = snapshots.restore().await.unwrap_err();
    assert!(
        matches!(missing, SnapshotError::PayloadMissing { .. }),
        "{missing}"
    );
    store
        .create(&head.snapshot_key(), Bytes::from_static(b"zer"))
        .await
        .unwrap();
    let short = snapshots.download(&head).await.unwrap_err();
    assert_eq!(
        short.to_string(),
        format!(
            "snapshot payload size mismatch: key={} expected_bytes=4 found_bytes=3",
            head.snapshot_key()
        )
    );
}

/// How long a stalled store call would take: far beyond every bound below.
const STALL: Duration = Duration::from_secs(24 * 60 * 60);

/// A store whose stalls the test controls, and snapshots over it with
/// distinct HEAD and payload bounds, so an error shows which bound fired.
async fn stalling(clock: &Arc<ManualClock>) -> (DynBlobStore, FaultController, SnapshotStore) {
    let controller = FaultController::new(13);
    let store: DynBlobStore = Arc::new(FaultyStore::new(memory().await, controller.clone()));
    let config = SnapshotConfig {
        head_call_timeout: Duration::from_secs(1),
        payload_call_timeout: Duration::from_secs(3),
    };
    let snapshots = SnapshotStore::new(store.clone(), db(), config, clock.clone());
    (store, controller, snapshots)
}

/// Stalls the `ops` calls on keys matching `keys` until the rule is removed.
fn stall(controller: &FaultController, ops: &[Op], keys: KeyMatch) -> RuleId {
    controller.add(
        FaultRule::new(Fault::Delay(STALL))
            .ops(OpSet::of(ops))
            .keys(keys),
    )
}

/// Asserts that `result` failed transiently because the store call `call`
/// (`op=… key=…`) ran out of its `timeout_ms`, well before the stall ended
/// (`started` is tokio's paused clock, so no wall-clock time is measured).
#[track_caller]
fn assert_timed_out<T: std::fmt::Debug>(
    result: Result<T, SnapshotError>,
    call: &str,
    timeout_ms: u64,
    started: tokio::time::Instant,
) {
    let error = result.unwrap_err();
    assert!(
        matches!(error, SnapshotError::Store(BlobError::Unavailable { .. })),
        "{error}"
    );
    assert!(error.is_transient(), "{error}");
    let expected = format!("{call}: timed out after timeout_ms={timeout_ms}");
    assert!(error.to_string().contains(&expected), "{error}");
    assert!(started.elapsed() < STALL, "{:?}", started.elapsed());
}

/// Defends that a stalled store times out HEAD reads, listings and downloads instead of hanging.
#[tokio::test(start_paused = true)]
async fn a_stalled_store_times_out_head_reads_listings_and_downloads() {
    let clock = ManualClock::shared(START_MS);
    let (store, controller, snapshots) = stalling(&clock).await;
    let lease = acquire(&store, &clock, "a").await;
    let head = boot(&snapshots, &lease, "zero")
        .await
        .head()
        .unwrap()
        .clone();
    let head_key = || KeyMatch::Exact("db/HEAD.json".into());
    let payloads = || KeyMatch::Prefix(payload_prefix(&db()));

    let rule = stall(&controller, &[Op::Head, Op::Get], head_key());
    let started = tokio::time::Instant::now();
    let call = "op=head key=db/HEAD.json";
    assert_timed_out(snapshots.read_head().await, call, 1_000, started);
    assert_timed_out(snapshots.restore().await, call, 1_000, started);
    let mut publication = snapshots.publication();
    assert_timed_out(publication.observe_for_boot().await, call, 1_000, started);
    controller.remove(rule);

    stall(&controller, &[Op::Get, Op::List], payloads());
    let started = tokio::time::Instant::now();
    let call = format!("op=get key={}", head.snapshot_key());
    assert_timed_out(snapshots.restore().await, &call, 3_000, started);
    assert_timed_out(snapshots.download(&head).await, &call, 3_000, started);
    let call = format!("op=list key={}", payload_prefix(&db()));
    assert_timed_out(snapshots.list().await, &call, 3_000, started);
    controller.clear();
    let (restored, bytes) = snapshots.restore().await.unwrap().unwrap();
    assert_eq!((restored, bytes), (head, Bytes::from_static(b"zero")));
}

/// Defends that a stalled upload or HEAD write times out claims and publishes, without fencing.
#[tokio::test(start_paused = true)]
async fn a_stalled_store_times_out_claims_and_publications() {
    let clock = ManualClock::shared(START_MS);
    let (store, controller, snapshots) = stalling(&clock).await;
    let lease = acquire(&store, &clock, "a").await;
    let head_key = || KeyMatch::Exact("db/HEAD.json".into());
    let payloads = || KeyMatch::Prefix(payload_prefix(&db()));
    let payload_key = |sequence| {
        let generation = lease.generation();
        let sequence = PublicationSequence(sequence);
        PayloadId {
            generation,
            sequence,
        }
        .key(&db())
    };
    let mut publication = snapshots.publication();
    publication.observe_for_boot().await.unwrap();

    let rule = stall(&controller, &[Op::Create], payloads());
    let started = tokio::time::Instant::now();
    let call = format!("op=create key={}", payload_key(1));
    let claimed = publication.claim(&lease, Some(snapshot("zero", 0))).await;
    assert_timed_out(claimed, &call, 3_000, started);
    controller.remove(rule);
    let rule = stall(&controller, &[Op::Create], head_key());
    let claimed = publication.claim(&lease, Some(snapshot("zero", 0))).await;
    assert_timed_out(claimed, "op=create key=db/HEAD.json", 1_000, started);
    assert_eq!(publication.state(), PublicationState::Observed);
    controller.remove(rule);
    publication
        .claim(&lease, Some(snapshot("zero", 0)))
        .await
        .unwrap();

    let rule = stall(&controller, &[Op::Create], payloads());
    let started = tokio::time::Instant::now();
    let call = format!("op=create key={}", payload_key(2));
    let published = publication.publish(&lease, snapshot("one", 1)).await;
    assert_timed_out(published, &call, 3_000, started);
    controller.remove(rule);
    stall(&controller, &[Op::Update], head_key());
    let published = publication.publish(&lease, snapshot("two", 2)).await;
    assert_timed_out(published, "op=update key=db/HEAD.json", 1_000, started);
    assert_eq!(publication.state(), PublicationState::Claimed);
    controller.clear();
    let head = publication
        .publish(&lease, snapshot("four", 4))
        .await
        .unwrap();
    assert_eq!(snapshots.read_head().await.unwrap().unwrap().head, head);
}

#[tokio::test]
async fn only_a_first_boot_needs_an_initial_payload() {
    let clock = ManualClock::shared(START_MS);
    let store = memory().await;
    let snapshots = snapshots(&store, &clock);
    let lease = acquire(&store, &clock, "a").await;
    let mut first = snapshots.publication();
    assert!(!first.needs_initial(), "nothing observed yet");
    first.observe_for_boot().await.unwrap();
    assert!(first.needs_initial());
    let refused = first.claim(&lease, None).await.unwrap_err();
    assert!(
        matches!(refused, SnapshotError::WrongState { .. }),
        "{refused}"
    );
    assert!(
        snapshots.read_head().await.unwrap().is_none(),
        "nothing written"
    );
    first
        .claim(&lease, Some(snapshot("zero", 0)))
        .await
        .unwrap();
    // A later boot adopts HEAD's payload: no initial payload is needed.
    let mut later = snapshots.publication();
    later.observe_for_boot().await.unwrap();
    assert!(!later.needs_initial());
    let claimed = later.claim(&lease, None).await.unwrap();
    assert_eq!(claimed.head().wal_index, RecordIndex(0));
}
