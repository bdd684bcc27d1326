//! Unit tests of the lease over an in-memory store: the holder's deadline,
//! retries and read-back settlement, timeouts, operator release, malformed
//! documents. The cross-backend contract is in `tests/lease_snapshot.rs`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::blob::{
    Fault, FaultController, FaultRule, FaultyStore, Op, OpSet, StoreUrl, open_store,
};
use crate::clock::{Clock, ManualClock};

const START_MS: u64 = 1_700_000_000_000;

fn config() -> LeaseConfig {
    LeaseConfig {
        ttl: Duration::from_secs(10),
        safety_margin: Duration::from_secs(2),
        store_call_timeout: Duration::from_secs(1),
    }
}

async fn memory() -> DynBlobStore {
    let url = format!("memory://lease-unit-{:x}", rand::random::<u64>());
    open_store(&url.parse::<StoreUrl>().unwrap()).await.unwrap()
}

fn leases(store: &DynBlobStore, clock: &Arc<ManualClock>) -> LeaseStore {
    let database = DatabaseKey::new("db").unwrap();
    LeaseStore::new(store.clone(), database, config(), clock.clone()).unwrap()
}

fn holder(id: &str) -> HolderId {
    HolderId::new(id).unwrap()
}

/// A store whose faults the test controls, plus the controller.
async fn faulty() -> (DynBlobStore, FaultController) {
    let controller = FaultController::new(11);
    let store: DynBlobStore = Arc::new(FaultyStore::new(memory().await, controller.clone()));
    (store, controller)
}

#[tokio::test]
async fn the_deadline_is_ttl_minus_margin_from_before_the_write() {
    let clock = ManualClock::shared(START_MS);
    let store = memory().await;
    let lease = leases(&store, &clock)
        .acquire(holder("a"), Term(1))
        .await
        .unwrap();
    let start = clock.now();
    assert_eq!(lease.record().expires_at_ms, START_MS + 10_000);
    assert!(lease.may_write(start + Duration::from_millis(7_999)));
    assert!(!lease.may_write(start + Duration::from_secs(8)));
    assert_eq!(lease.remaining(start), Duration::from_secs(8));

    clock.advance(Duration::from_secs(5));
    lease.refresh().await.unwrap();
    assert_eq!(lease.record().expires_at_ms, START_MS + 15_000);
    assert_eq!(
        lease.generation(),
        Generation::FIRST,
        "refresh keeps the generation"
    );
    assert!(lease.may_write(start + Duration::from_secs(12)));
    assert!(!lease.may_write(start + Duration::from_secs(13)));
}

#[tokio::test(start_paused = true)]
async fn refresh_retries_transient_errors() {
    let clock = ManualClock::shared(START_MS);
    let (store, controller) = faulty().await;
    let lease = leases(&store, &clock)
        .acquire(holder("a"), Term(1))
        .await
        .unwrap();
    // More failures than one round's read-back resolver absorbs.
    controller.add(
        FaultRule::new(Fault::FailBefore)
            .ops(OpSet::of(&[Op::Update]))
            .times(6),
    );
    clock.advance(Duration::from_secs(3));
    lease.refresh().await.unwrap();
    assert_eq!(lease.record().expires_at_ms, START_MS + 13_000);
    let stored = leases(&store, &clock).read().await.unwrap().unwrap();
    assert_eq!(stored, lease.record());
}

#[tokio::test(start_paused = true)]
async fn a_lost_refresh_response_is_settled_by_reading_back() {
    let clock = ManualClock::shared(START_MS);
    let (store, controller) = faulty().await;
    let lease = leases(&store, &clock)
        .acquire(holder("a"), Term(1))
        .await
        .unwrap();
    controller.add(
        FaultRule::new(Fault::FailAfter)
            .ops(OpSet::of(&[Op::Update]))
            .times(1),
    );
    controller.add(
        FaultRule::new(Fault::FailBefore)
            .ops(OpSet::of(&[Op::Get]))
            .times(2),
    );
    clock.advance(Duration::from_secs(1));
    lease.refresh().await.unwrap();
    // The holder follows the version its lost write created.
    clock.advance(Duration::from_secs(1));
    lease.refresh().await.unwrap();
    assert_eq!(lease.record().expires_at_ms, START_MS + 12_000);
}

#[tokio::test(start_paused = true)]
async fn a_failed_refresh_keeps_the_old_deadline() {
    let clock = ManualClock::shared(START_MS);
    let (store, controller) = faulty().await;
    let lease = leases(&store, &clock)
        .acquire(holder("a"), Term(1))
        .await
        .unwrap();
    let start = clock.now();
    controller.set_outage(true);
    clock.advance(Duration::from_secs(4));
    let error = lease.refresh().await.unwrap_err();
    assert!(error.is_transient(), "{error}");
    assert!(lease.may_write(start + Duration::from_millis(7_999)));
    assert!(!lease.may_write(start + Duration::from_secs(8)));
    controller.set_outage(false);
    lease.refresh().await.unwrap();
    assert!(lease.may_write(start + Duration::from_secs(11)));
}

#[tokio::test(start_paused = true)]
async fn every_store_call_is_bounded_by_the_timeout() {
    let clock = ManualClock::shared(START_MS);
    let (store, controller) = faulty().await;
    controller.add(FaultRule::new(Fault::Delay(Duration::from_secs(60))));
    let started = tokio::time::Instant::now();
    let error = leases(&store, &clock)
        .acquire(holder("a"), Term(1))
        .await
        .unwrap_err();
    assert!(error.is_transient(), "{error}");
    assert!(error.to_string().contains("timed out"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn held_reports_the_holder_and_time_left_by_the_contenders_clock() {
    let clock = ManualClock::shared(START_MS);
    let store = memory().await;
    let _a = leases(&store, &clock)
        .acquire(holder("a"), Term(1))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(4));
    let error = leases(&store, &clock)
        .acquire(holder("b"), Term(1))
        .await
        .unwrap_err();
    let LeaseError::Held {
        holder: ref current,
        expires_in,
        ..
    } = error
    else {
        panic!("expected held, got {error}");
    };
    assert_eq!(
        (current.as_str(), expires_in),
        ("a", Duration::from_secs(6))
    );
    assert_eq!(
        error.to_string(),
        "lease held by another holder: database=db holder=a expires_in_ms=6000"
    );
}

#[tokio::test]
async fn reacquiring_an_own_live_lease_bumps_the_generation_and_stales_the_old_holder() {
    let clock = ManualClock::shared(START_MS);
    let store = memory().await;
    let first = leases(&store, &clock)
        .acquire(holder("a"), Term(1))
        .await
        .unwrap();
    let second = leases(&store, &clock)
        .acquire(holder("a"), Term(1))
        .await
        .unwrap();
    assert_eq!(second.generation(), Generation(2));
    assert!(matches!(
        first.refresh().await,
        Err(LeaseError::Stale { .. })
    ));
    assert!(!first.may_write_now());
    assert!(second.may_write_now());
}

#[tokio::test]
async fn release_stops_writing_is_idempotent_and_refresh_after_it_is_stale() {
    let clock = ManualClock::shared(START_MS);
    let store = memory().await;
    let lease = leases(&store, &clock)
        .acquire(holder("a"), Term(1))
        .await
        .unwrap();
    lease.release().await.unwrap();
    assert!(!lease.may_write_now());
    lease.release().await.unwrap();
    assert!(matches!(
        lease.refresh().await,
        Err(LeaseError::Stale { .. })
    ));
    let stored = leases(&store, &clock).read().await.unwrap().unwrap();
    assert!(stored.released && stored.generation == Generation::FIRST);
}

#[tokio::test]
async fn release_holder_acts_only_for_the_named_holder() {
    let clock = ManualClock::shared(START_MS);
    let store = memory().await;
    let leases = leases(&store, &clock);
    assert_eq!(
        leases.release_holder(&holder("a")).await.unwrap(),
        ReleaseOutcome::NotHeld(None)
    );
    let a = leases.acquire(holder("a"), Term(1)).await.unwrap();
    let refused = leases.release_holder(&holder("b")).await.unwrap_err();
    assert!(matches!(refused, LeaseError::Held { .. }), "{refused}");
    assert!(a.may_write_now());
    let ReleaseOutcome::Released(released) = leases.release_holder(&holder("a")).await.unwrap()
    else {
        panic!("expected a release");
    };
    assert!(released.released && released.generation == a.generation());
    assert!(matches!(a.refresh().await, Err(LeaseError::Stale { .. })));
    assert!(matches!(
        leases.release_holder(&holder("a")).await.unwrap(),
        ReleaseOutcome::NotHeld(Some(_))
    ));
    // Another holder's expired lease is not ours to release, nor is it an error.
    let _b = leases.acquire(holder("b"), Term(1)).await.unwrap();
    clock.advance(Duration::from_secs(11));
    assert!(matches!(
        leases.release_holder(&holder("a")).await.unwrap(),
        ReleaseOutcome::NotHeld(Some(_))
    ));
}

#[tokio::test]
async fn a_malformed_lease_document_is_reported_and_left_alone() {
    let clock = ManualClock::shared(START_MS);
    let store = memory().await;
    // Well-formed and checksummed, but missing a field; then hand-written
    // without a checksum; then a damaged digit.
    let incomplete =
        crate::lease::document::encode(serde_json::json!({"format": 1, "holder_id": "a"}));
    let unsigned = Bytes::from_static(br#"{"format": 1, "holder_id": "a"}"#);
    let good = LeaseRecord {
        database_key: DatabaseKey::new("db").unwrap(),
        holder_id: holder("b"),
        term: Term(1),
        generation: Generation(1),
        acquired_at_ms: START_MS,
        expires_at_ms: START_MS + 10_000,
        released: false,
    }
    .encode();
    let text = String::from_utf8(good.to_vec()).unwrap();
    let damaged = Bytes::from(text.replace(&(START_MS + 10_000).to_string(), "1"));
    for (garbage, field) in [
        (incomplete, "database_key"),
        (unsigned, "crc32c"),
        (damaged, "crc32c"),
    ] {
        let _ = store.delete("db/lease.json").await;
        store
            .create("db/lease.json", garbage.clone())
            .await
            .unwrap();
        let error = leases(&store, &clock)
            .acquire(holder("a"), Term(1))
            .await
            .unwrap_err();
        let LeaseError::Document(ref document) = error else {
            panic!("expected a document error, got {error}");
        };
        assert_eq!(document.field(), field, "{error}");
        assert_eq!(store.get("db/lease.json").await.unwrap().bytes, garbage);
    }
}

#[tokio::test]
async fn invalid_configs_are_refused() {
    let clock = ManualClock::shared(START_MS);
    let bad = LeaseConfig {
        safety_margin: Duration::from_secs(10),
        ..config()
    };
    let database = DatabaseKey::new("db").unwrap();
    assert!(LeaseStore::new(memory().await, database, bad, clock).is_err());
}

/// The safety margin is an assumption, not magic: a contender whose wall clock
/// runs ahead by more than the margin can take over while the holder still
/// believes it may write. This is why publication also fences by CAS.
#[tokio::test]
async fn skew_beyond_the_margin_breaks_the_time_based_exclusion() {
    let holder_clock = ManualClock::shared(START_MS);
    let contender_clock = ManualClock::shared(START_MS + 3_000);
    let store = memory().await;
    let a = leases(&store, &holder_clock)
        .acquire(holder("a"), Term(1))
        .await
        .unwrap();
    holder_clock.advance(Duration::from_millis(7_500));
    contender_clock.advance(Duration::from_millis(7_500));
    let b = leases(&store, &contender_clock)
        .acquire(holder("b"), Term(1))
        .await
        .unwrap();
    assert!(a.may_write_now() && b.may_write_now());
}
