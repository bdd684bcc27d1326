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

/// The process named `id`: the same incarnation every call, as one
/// process's runtime keeps one contender for its lifetime.
fn contender(id: &str) -> Contender {
    let incarnation = id.bytes().fold(1u128, |sum, b| sum * 131 + u128::from(b));
    Contender::with_incarnation(holder(id), Incarnation(incarnation))
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
        .acquire(&contender("a"), Term(1))
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
        .acquire(&contender("a"), Term(1))
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
        .acquire(&contender("a"), Term(1))
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
        .acquire(&contender("a"), Term(1))
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
        .acquire(&contender("a"), Term(1))
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
        .acquire(&contender("a"), Term(1))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(4));
    let error = leases(&store, &clock)
        .acquire(&contender("b"), Term(1))
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
        .acquire(&contender("a"), Term(1))
        .await
        .unwrap();
    let second = leases(&store, &clock)
        .acquire(&contender("a"), Term(1))
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
        .acquire(&contender("a"), Term(1))
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
async fn another_process_with_the_same_holder_id_waits_for_expiry() {
    let clock = ManualClock::shared(START_MS);
    let store = memory().await;
    let first = Contender::new(holder("shared-host"));
    let second = Contender::new(holder("shared-host"));
    let a = leases(&store, &clock)
        .acquire(&first, Term(1))
        .await
        .unwrap();
    let refused = leases(&store, &clock)
        .acquire(&second, Term(1))
        .await
        .unwrap_err();
    assert!(matches!(refused, LeaseError::Held { .. }), "{refused}");
    let refused = leases(&store, &clock)
        .acquire_at_stored_term(&second)
        .await
        .unwrap_err();
    assert!(matches!(refused, LeaseError::Held { .. }), "{refused}");
    assert!(a.may_write_now());
    a.refresh()
        .await
        .expect("the first process keeps its lease");
    // Expired, it is anyone's; the first process's refresh then finds it lost.
    clock.advance(Duration::from_secs(11));
    let b = leases(&store, &clock)
        .acquire_at_stored_term(&second)
        .await
        .unwrap();
    assert_eq!(b.incarnation(), second.incarnation());
    assert!(matches!(a.refresh().await, Err(LeaseError::Stale { .. })));
}

#[tokio::test]
async fn acquire_at_stored_term_follows_a_take_over_instead_of_being_fenced() {
    let clock = ManualClock::shared(START_MS);
    let store = memory().await;
    let leases = leases(&store, &clock);
    let a = leases
        .acquire_at_stored_term(&contender("a"))
        .await
        .unwrap();
    assert_eq!(a.term(), Term::FIRST);
    let b = leases.take_over(&contender("b")).await.unwrap();
    assert_eq!(b.term(), Term(2));
    b.release().await.unwrap();
    // A contender that read term 1 before the take-over would be fenced by
    // `acquire(.., Term(1))`; at the stored term it simply acquires.
    assert!(matches!(
        leases.acquire(&contender("a"), Term(1)).await,
        Err(LeaseError::Fenced { .. })
    ));
    let again = leases
        .acquire_at_stored_term(&contender("a"))
        .await
        .unwrap();
    assert_eq!(again.term(), Term(2));
}

#[tokio::test]
async fn release_holder_acts_only_for_the_named_holder_and_spares_a_live_lease() {
    let clock = ManualClock::shared(START_MS);
    let store = memory().await;
    let leases = leases(&store, &clock);
    assert_eq!(
        leases
            .release_holder(&holder("a"), LiveLease::Refuse)
            .await
            .unwrap(),
        ReleaseOutcome::NotHeld(None)
    );
    let a = leases.acquire(&contender("a"), Term(1)).await.unwrap();
    for live in [LiveLease::Refuse, LiveLease::Release] {
        let refused = leases.release_holder(&holder("b"), live).await.unwrap_err();
        assert!(matches!(refused, LeaseError::Held { .. }), "{refused}");
    }
    // Its own live lease is refused too, unless the caller says its process is gone.
    let refused = leases
        .release_holder(&holder("a"), LiveLease::Refuse)
        .await
        .unwrap_err();
    assert!(matches!(refused, LeaseError::Held { .. }), "{refused}");
    assert!(a.may_write_now());
    a.refresh()
        .await
        .expect("the refused release changed nothing");
    let ReleaseOutcome::Released(released) = leases
        .release_holder(&holder("a"), LiveLease::Release)
        .await
        .unwrap()
    else {
        panic!("expected a release");
    };
    assert!(released.released && released.generation == a.generation());
    assert!(matches!(a.refresh().await, Err(LeaseError::Stale { .. })));
    assert!(matches!(
        leases
            .release_holder(&holder("a"), LiveLease::Refuse)
            .await
            .unwrap(),
        ReleaseOutcome::NotHeld(Some(_))
    ));
    // An expired lease of the named holder is released without being asked twice.
    let expired = leases.acquire(&contender("a"), Term(1)).await.unwrap();
    clock.advance(Duration::from_secs(11));
    assert!(matches!(
        leases
            .release_holder(&holder("a"), LiveLease::Refuse)
            .await
            .unwrap(),
        ReleaseOutcome::Released(_)
    ));
    drop(expired);
    // Another holder's expired lease is not ours to release, nor is it an error.
    let _b = leases.acquire(&contender("b"), Term(1)).await.unwrap();
    clock.advance(Duration::from_secs(11));
    assert!(matches!(
        leases
            .release_holder(&holder("a"), LiveLease::Refuse)
            .await
            .unwrap(),
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
        incarnation: Some(Incarnation(1)),
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
            .acquire(&contender("a"), Term(1))
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
        .acquire(&contender("a"), Term(1))
        .await
        .unwrap();
    holder_clock.advance(Duration::from_millis(7_500));
    contender_clock.advance(Duration::from_millis(7_500));
    let b = leases(&store, &contender_clock)
        .acquire(&contender("b"), Term(1))
        .await
        .unwrap();
    assert!(a.may_write_now() && b.may_write_now());
}
