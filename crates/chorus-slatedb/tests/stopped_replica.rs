//! One of three WAL replicas hangs: its S3-compatible server (a moto process
//! of the test's own, so no other test stalls) is stopped with SIGSTOP while
//! SlateDB writes. The
//! server keeps its socket open and answers nothing, as a hung machine does,
//! so every request to it waits until the client gives up.
//!
//! Durable puts must go on through the other two replicas, for longer than
//! the writer's `lane_stall_timeout` (so the writer both waits on the lane
//! and sheds it); reopening the database while the server is still stopped
//! must replay every durable put; and after the server resumes, nothing is
//! lost. The register is on PostgreSQL; SlateDB's own bucket is in memory.
//!
//! Needs moto and PostgreSQL from the test services (`bash scripts/services.sh
//! start`); it skips without them, except under CI, where it fails.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus::blob::StoreUrl;
use chorus::register::RegisterUrl;
use chorus_slatedb::{ChorusWal, ChorusWalOptions, WalLocation};
use object_store::ObjectStore;
use object_store::memory::InMemory;
use slatedb::Db;
use support::moto::{Frozen, PrivateMoto};
use support::{DB_PATH, assert_exactly, key, quiet, value};

/// Bounds one durable put, so a hang fails the test instead of stalling CI.
/// It is no latency target: the S3 client alone waits 10 s on a silent server.
const PUT_LIMIT: Duration = Duration::from_secs(60);

/// How long puts go on while the server is stopped: past the writer's
/// `lane_stall_timeout` (5 s by default), so the stalled lane is shed.
const WRITE_WHILE_STOPPED: Duration = Duration::from_secs(8);

async fn open(location: &WalLocation, bucket: &Arc<dyn ObjectStore>) -> Db {
    let stores = location.open().await.expect("the WAL's stores open");
    Db::builder(DB_PATH, Arc::clone(bucket))
        .with_settings(quiet())
        .with_wal_writer(Box::new(ChorusWal::new(
            stores,
            ChorusWalOptions::default(),
        )))
        .build()
        .await
        .expect("the database opens")
}

/// Puts key/value `i` durably, bounded by [`PUT_LIMIT`]; returns how long it took.
async fn put(db: &Db, i: u32) -> Duration {
    let started = Instant::now();
    tokio::time::timeout(PUT_LIMIT, async {
        db.put(key(i), value(i))
            .await
            .unwrap()
            .await_durable()
            .await
            .unwrap()
    })
    .await
    .unwrap_or_else(|_| panic!("put {i} was not durable within {PUT_LIMIT:?}"));
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_puts_go_on_while_one_replica_server_is_stopped() {
    let Some(moto) = PrivateMoto::start(3) else {
        return;
    };
    let servers = moto.servers();
    let replicas = moto.s3_urls("slatedb-stopped");
    let Some(register) = support::postgres_register_url("slatedb-stopped") else {
        return;
    };
    let location = WalLocation::new(
        replicas
            .iter()
            .map(|url| url.parse::<StoreUrl>().unwrap())
            .collect(),
        register.parse::<RegisterUrl>().unwrap(),
    );
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());

    let db = open(&location, &bucket).await;
    let mut next = 0;
    for _ in 0..20 {
        put(&db, next).await;
        next += 1;
    }

    let stopped = Frozen::freeze(servers[0]);
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    while started.elapsed() < WRITE_WHILE_STOPPED {
        slowest = slowest.max(put(&db, next).await);
        next += 1;
    }
    eprintln!(
        "{next} puts durable, {} with replica 0 stopped; slowest {slowest:?}",
        next - 20
    );
    db.close().await.expect("close with one replica stopped");

    // A new writer recovers with the server still stopped: two replicas are
    // a quorum, and the silent one cannot hold recovery up for good.
    let db = open(&location, &bucket).await;
    assert_exactly(&db, 0..next, |_| true).await;
    for _ in 0..20 {
        put(&db, next).await;
        next += 1;
    }

    drop(stopped); // SIGCONT
    for _ in 0..20 {
        put(&db, next).await;
        next += 1;
    }
    db.close().await.unwrap();

    let db = open(&location, &bucket).await;
    assert_exactly(&db, 0..next + 1, |i| i < next).await;
    db.close().await.unwrap();
}
