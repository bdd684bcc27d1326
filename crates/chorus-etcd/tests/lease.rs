//! etcd's Lease service driven by etcd's own Rust client over loopback:
//! grant, keep-alive, time-to-live, list and revoke as etcd answers them;
//! expiry deleting a lease's keys at one revision; keep-alives holding a
//! lease past its TTL; a standby refusing what only the primary knows; and
//! a takeover extending leases rather than expiring them.

mod support;

use std::time::{Duration, Instant};

use chorus::kv::KvState;
use chorus::kv::lease::SERVER_LEASE_ID_BASE;
use chorus::runtime::Runtime;
use etcd_client::{
    Client, EventType, LeaseGrantOptions, LeaseTimeToLiveOptions, PutOptions, WatchOptions,
};
use support::assert_refused;
use support::memory_runtime::{MemoryStores, PATIENCE, wait_for_takeover, wait_until};
use tonic::Code;

/// One keep-alive of `id` on a fresh stream: the TTL answered.
async fn keep_alive_once(client: &mut Client, id: i64) -> Result<i64, etcd_client::Error> {
    let (mut keeper, mut answers) = client.lease_keep_alive(id).await?;
    keeper.keep_alive().await?;
    let answer = tokio::time::timeout(PATIENCE, answers.message())
        .await
        .expect("a keep-alive answer in time")?
        .expect("the stream answers");
    assert_eq!(answer.id(), id);
    Ok(answer.ttl())
}

async fn exists(client: &mut Client, key: &str) -> bool {
    client.get(key, None).await.unwrap().count() == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_keep_alives_lists_and_revokes_answer_as_etcd_does() {
    let served = support::serve("lease-api", |_| {}).await;
    let mut client = served.client().await;

    let chosen = client.lease_grant(60, None).await.unwrap();
    assert!(chosen.id() >= SERVER_LEASE_ID_BASE, "{chosen:?}");
    assert_eq!(chosen.ttl(), 60);
    assert_eq!(
        chosen.header().unwrap().revision(),
        1,
        "a grant writes no key"
    );
    let short = client
        .lease_grant(1, Some(LeaseGrantOptions::new().with_id(7)))
        .await
        .unwrap();
    assert_eq!(
        (short.id(), short.ttl()),
        (7, 2),
        "raised to the minimum TTL"
    );
    assert_refused(
        client
            .lease_grant(60, Some(LeaseGrantOptions::new().with_id(7)))
            .await,
        Code::FailedPrecondition,
        "etcdserver: lease already exists",
    );
    assert_refused(
        client.lease_grant(9_000_000_001, None).await,
        Code::OutOfRange,
        "etcdserver: too large lease TTL",
    );

    let leased = PutOptions::new().with_lease(chosen.id());
    client.put("b", "2", Some(leased.clone())).await.unwrap();
    client.put("a", "1", Some(leased)).await.unwrap();
    assert_refused(
        client
            .put("c", "3", Some(PutOptions::new().with_lease(99)))
            .await,
        Code::NotFound,
        "etcdserver: requested lease not found",
    );
    let kv = client.get("a", None).await.unwrap().kvs()[0].clone();
    assert_eq!(kv.lease(), chosen.id());

    let live = client
        .lease_time_to_live(chosen.id(), Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!(live.granted_ttl(), 60);
    assert!((58..=60).contains(&live.ttl()), "{live:?}");
    assert_eq!(live.keys(), [b"a".to_vec(), b"b".to_vec()]);
    assert_eq!(live.header().unwrap().revision(), 3);
    let mut ids: Vec<i64> = client
        .leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .map(|lease| lease.id())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![7, chosen.id()]);
    assert_eq!(keep_alive_once(&mut client, chosen.id()).await.unwrap(), 60);
    // etcd answers TTL 0 for an unknown lease; the client turns it into this.
    match keep_alive_once(&mut client, 12345).await {
        Err(etcd_client::Error::LeaseKeepAliveError(message)) => {
            assert_eq!(message, "lease not found")
        }
        other => panic!("an unknown lease's keep-alive answered {other:?}"),
    }

    let revoked = client.lease_revoke(chosen.id()).await.unwrap();
    assert_eq!(
        revoked.header().unwrap().revision(),
        4,
        "both keys at one revision"
    );
    assert!(!exists(&mut client, "a").await && !exists(&mut client, "b").await);
    let gone = client.lease_time_to_live(chosen.id(), None).await.unwrap();
    assert_eq!((gone.ttl(), gone.granted_ttl()), (-1, 0));
    assert_refused(
        client.lease_revoke(chosen.id()).await,
        Code::NotFound,
        "etcdserver: requested lease not found",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_deletes_its_keys_at_one_revision() {
    let served = support::serve("lease-expiry", |_| {}).await;
    let mut client = served.client().await;
    let lease = client.lease_grant(2, None).await.unwrap().id();
    for key in ["e/3", "e/1", "e/2"] {
        let leased = PutOptions::new().with_lease(lease);
        client.put(key, "v", Some(leased)).await.unwrap();
    }
    client.put("e/kept", "v", None).await.unwrap();
    let granted = Instant::now();
    let mut events = client
        .watch(
            "e/",
            Some(WatchOptions::new().with_prefix().with_start_revision(6)),
        )
        .await
        .unwrap();
    let response = loop {
        let response = tokio::time::timeout(PATIENCE, events.message())
            .await
            .expect("the expiry's events in time")
            .unwrap()
            .expect("the stream is open");
        if !response.events().is_empty() {
            break response;
        }
    };
    let waited = granted.elapsed();
    assert!(
        waited >= Duration::from_millis(1_500),
        "expired early: {waited:?}"
    );
    let deleted: Vec<(EventType, Vec<u8>, i64)> = response
        .events()
        .iter()
        .map(|event| {
            let kv = event.kv().unwrap();
            (event.event_type(), kv.key().to_vec(), kv.mod_revision())
        })
        .collect();
    let keys = [b"e/1".to_vec(), b"e/2".to_vec(), b"e/3".to_vec()];
    let expected: Vec<_> = keys
        .into_iter()
        .map(|k| (EventType::Delete, k, 6))
        .collect();
    assert_eq!(deleted, expected);
    assert!(exists(&mut client, "e/kept").await);
    assert!(client.leases().await.unwrap().leases().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alives_hold_a_lease_past_its_ttl_until_they_stop() {
    let served = support::serve("lease-keep-alive", |_| {}).await;
    let mut client = served.client().await;
    let lease = client.lease_grant(2, None).await.unwrap().id();
    let leased = PutOptions::new().with_lease(lease);
    client.put("k", "v", Some(leased)).await.unwrap();
    let (mut keeper, mut answers) = client.lease_keep_alive(lease).await.unwrap();
    let held_until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < held_until {
        keeper.keep_alive().await.unwrap();
        let answer = answers.message().await.unwrap().unwrap();
        assert_eq!(answer.ttl(), 2, "renewed");
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert!(exists(&mut client, "k").await, "held past its TTL");
    drop((keeper, answers));
    let stopped = Instant::now();
    wait_until("the key deleted by expiry", || gone(&served.runtime, "k")).await;
    assert!(stopped.elapsed() >= Duration::from_millis(1_500));
}

/// Whether `key` is gone from the state applied on `runtime`.
fn gone(runtime: &Runtime<KvState>, key: &str) -> bool {
    runtime
        .read_stale(|state| state.get(key.as_bytes()).is_none())
        .0
}

/// A standby lists the leases it applied and forwards grants, keep-alive
/// streams and time-to-live to the primary, which keeps the deadlines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_lists_leases_and_forwards_what_only_the_primary_keeps() {
    let (primary, standby) = support::primary_and_standby("lease-standby").await;
    let mut to_standby = standby.client().await;
    let lease = to_standby.lease_grant(3, None).await.unwrap().id();
    assert!(primary.runtime.read_stale(|s| s.leases().len()).0 == 1);
    wait_until("the grant applied on the standby", || {
        standby.runtime.read_stale(|s| s.leases().len()).0 == 1
    })
    .await;
    let listed = to_standby.leases().await.unwrap();
    assert_eq!(
        listed.leases().iter().map(|l| l.id()).collect::<Vec<_>>(),
        vec![lease]
    );
    let leased = PutOptions::new().with_lease(lease);
    to_standby.put("k", "v", Some(leased)).await.unwrap();
    // Keep-alives through the standby hold the lease past its TTL.
    let (mut keeper, mut answers) = to_standby.lease_keep_alive(lease).await.unwrap();
    let held_until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < held_until {
        keeper.keep_alive().await.unwrap();
        let answer = answers.message().await.unwrap().unwrap();
        assert_eq!(answer.ttl(), 3, "renewed on the primary");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let left = to_standby.lease_time_to_live(lease, None).await.unwrap();
    assert!((2..=3).contains(&left.ttl()), "{left:?}");
    assert!(!gone(&primary.runtime, "k"), "held past its TTL");
    drop((keeper, answers));
    wait_until("expired on the primary", || gone(&primary.runtime, "k")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_extends_every_lease_by_its_ttl() {
    let stores = MemoryStores::new("lease-takeover", |store| store).await;
    let start = |holder: &str| {
        stores.runtime_with(holder, |config| {
            config.standby_poll_interval = Duration::from_millis(50);
        })
    };
    let first = support::serve_runtime(start("http://first:1"), "lease-takeover", |_| {}).await;
    wait_until("primary", || first.runtime.is_primary_and_sure()).await;
    let second = support::serve_runtime(start("http://second:1"), "lease-takeover", |_| {}).await;
    let mut client = first.client().await;
    let lease = client.lease_grant(6, None).await.unwrap().id();
    let leased = PutOptions::new().with_lease(lease);
    client.put("k", "v", Some(leased)).await.unwrap();
    let granted = Instant::now();
    // Most of the TTL passes on the first primary, then it hands over.
    tokio::time::sleep(Duration::from_secs(4)).await;
    first.runtime.shutdown().await.expect("a clean shutdown");
    wait_for_takeover(&second.runtime, "the second node").await;
    let took_over = Instant::now();
    let mut client = second.client().await;
    let left = client.lease_time_to_live(lease, None).await.unwrap().ttl();
    assert!(left >= 5, "the successor restarts the TTL: {left} s left");
    // Past the grant's own deadline, the key is still there…
    let grant_deadline = granted + Duration::from_secs(7);
    tokio::time::sleep_until(grant_deadline.into()).await;
    assert!(
        exists(&mut client, "k").await,
        "expired on the old deadline"
    );
    // …and the successor expires it on its own deadline.
    wait_until("expired by the successor", || gone(&second.runtime, "k")).await;
    assert!(took_over.elapsed() >= Duration::from_secs(5));
}
