//! SlateDB's own behaviour with its WAL on a Chorus log: durability across
//! close, crash and reopen, fencing of an older writer (and no fencing of a
//! newer one by a stale opener), and a replica down.

mod support;

use std::time::Duration;

use chorus::log::LogConfig;
use chorus_slatedb::{ChorusWal, ChorusWalOptions};
use slatedb::Db;
use slatedb::wal::{WalError, WriterInit, WriterInitResult, WriterManifest};
use tokio::sync::oneshot;

use chorus::blob::{Fault, FaultRule, Op, OpSet};
use slatedb::{CloseReason, ErrorKind};
use support::{Setup, assert_exactly, key, put_durably, value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_and_gets_survive_close_and_reopen() {
    let setup = Setup::new(3).await;
    let db = setup.open().await.unwrap();
    put_durably(&db, 0..50).await;
    db.delete(key(7))
        .await
        .unwrap()
        .await_durable()
        .await
        .unwrap();
    assert_exactly(&db, 0..50, |i| i != 7).await;
    db.close().await.unwrap();

    let db = setup.open().await.unwrap();
    assert_exactly(&db, 0..50, |i| i != 7).await;
    put_durably(&db, 50..60).await;
    db.close().await.unwrap();

    let db = setup.open().await.unwrap();
    assert_exactly(&db, 0..60, |i| i != 7).await;
    db.close().await.unwrap();
}

/// A process that dies: its runtime, and every task of the database in it,
/// stops at its next await; the stores remain. Waits until the runtime's
/// threads have stopped: `shutdown_background` returned while a worker
/// could still be polling the log's lane task, whose retried fragment write
/// then met the faults the test clears right after and landed, making a
/// write the dead process never acknowledged durable (seen once in CI).
fn crash(runtime: tokio::runtime::Runtime) {
    runtime.shutdown_timeout(Duration::from_secs(10));
}

#[test]
fn a_crash_replays_every_durable_write_and_nothing_that_was_not() {
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let setup = main.block_on(Setup::new(3));

    let doomed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    doomed.block_on(async {
        let db = setup.open().await.unwrap();
        put_durably(&db, 0..40).await;
        // From now on no fragment reaches any replica: these puts are in the
        // memtable only, never durable.
        for faults in &setup.faults {
            faults.add(FaultRule::new(Fault::FailBefore));
        }
        for i in 40..50 {
            db.put(key(i), value(i)).await.unwrap();
        }
        assert_eq!(
            db.get(key(45)).await.unwrap().as_deref(),
            Some(&value(45)[..])
        );
        std::mem::forget(db);
    });
    crash(doomed);
    for faults in &setup.faults {
        faults.clear();
    }

    main.block_on(async {
        let db = setup.open().await.unwrap();
        assert_exactly(&db, 0..50, |i| i < 40).await;
        db.close().await.unwrap();
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_fences_the_first_whose_later_writes_never_appear() {
    let setup = Setup::new(3).await;
    let first = setup.open().await.unwrap();
    put_durably(&first, 0..10).await;

    let second = setup.open().await.unwrap();
    assert_exactly(&second, 0..10, |_| true).await;

    // The first writer may still take a put into its memtable, but it can
    // never become durable, and the second never sees it.
    let late = match first.put(key(100), value(100)).await {
        Ok(handle) => handle.await_durable().await.map(drop),
        Err(error) => Err(error),
    };
    let error = late.expect_err("a fenced writer's put became durable");
    assert_eq!(
        error.kind(),
        ErrorKind::Closed(CloseReason::Fenced),
        "the first writer should report being fenced: {error}"
    );
    put_durably(&second, 10..20).await;
    assert_exactly(&second, 0..20, |_| true).await;
    assert_eq!(second.get(key(100)).await.unwrap(), None);
    second.close().await.unwrap();

    let third = setup.open().await.unwrap();
    assert_exactly(&third, 0..20, |_| true).await;
    assert_eq!(third.get(key(100)).await.unwrap(), None);
    third.close().await.unwrap();
}

/// A [`WriterInit`] that stops at the start of `fence_and_init`, after
/// SlateDB wrote its manifest epoch, until the test lets it go on.
struct Paused {
    inner: ChorusWal,
    reached: std::sync::Mutex<Option<oneshot::Sender<()>>>,
    resume: tokio::sync::Mutex<Option<oneshot::Receiver<()>>>,
}

#[async_trait::async_trait]
impl WriterInit for Paused {
    async fn fence_and_init(
        &self,
        manifest: &mut WriterManifest,
    ) -> Result<WriterInitResult, WalError> {
        if let Some(reached) = self.reached.lock().unwrap().take() {
            let _ = reached.send(());
        }
        if let Some(resume) = self.resume.lock().await.take() {
            let _ = resume.await;
        }
        self.inner.fence_and_init(manifest).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_opener_leaves_the_newer_writer_alone() {
    let setup = Setup::new(3).await;
    let (reached, at_wal) = oneshot::channel();
    let (go_on, resume) = oneshot::channel();
    let paused = Paused {
        inner: ChorusWal::new(setup.stores.clone(), ChorusWalOptions::default()),
        reached: std::sync::Mutex::new(Some(reached)),
        resume: tokio::sync::Mutex::new(Some(resume)),
    };
    let bucket = std::sync::Arc::clone(&setup.bucket);
    let stale = tokio::spawn(async move {
        Db::builder(support::DB_PATH, bucket)
            .with_settings(support::quiet())
            .with_wal_writer(Box::new(paused))
            .build()
            .await
    });
    at_wal
        .await
        .expect("the stale opener wrote its manifest epoch");

    // A newer writer opens and serves while the first is paused.
    let newer = setup.open().await.unwrap();
    put_durably(&newer, 0..10).await;

    go_on.send(()).unwrap();
    let error = match stale.await.unwrap() {
        Ok(_) => panic!("the stale opener opened"),
        Err(error) => error,
    };
    assert_eq!(
        error.kind(),
        ErrorKind::Closed(CloseReason::Fenced),
        "the stale opener should find itself fenced: {error}"
    );
    // The newer writer was not fenced by it.
    put_durably(&newer, 10..20).await;
    assert_exactly(&newer, 0..20, |_| true).await;
    newer.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_the_record_limit_stops_the_database_and_keeps_the_rest() {
    let setup = Setup::new(3).await;
    let db = setup.open().await.unwrap();
    put_durably(&db, 0..10).await;
    // Above the Chorus log's own 1 MiB default: a batch may fill a fragment.
    let large = vec![7u8; 3 << 20];
    db.put(b"large", &large)
        .await
        .unwrap()
        .await_durable()
        .await
        .unwrap();

    let too_large = vec![8u8; 5 << 20];
    let error = match db.put(b"too-large", &too_large).await {
        Ok(handle) => handle
            .await_durable()
            .await
            .expect_err("a 5 MiB batch is refused"),
        Err(error) => error,
    };
    assert!(
        error.to_string().contains("max_record_bytes"),
        "the error should name the limit: {error}"
    );
    let _ = db.close().await;

    let db = setup.open().await.unwrap();
    assert_exactly(&db, 0..10, |_| true).await;
    assert_eq!(db.get(b"large").await.unwrap().as_deref(), Some(&large[..]));
    assert_eq!(db.get(b"too-large").await.unwrap(), None);
    db.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_go_on_with_one_replica_of_three_down() {
    let setup = Setup::new(3).await;
    let db = setup.open().await.unwrap();
    put_durably(&db, 0..10).await;
    setup.faults[2].add(FaultRule::new(Fault::FailBefore));
    put_durably(&db, 10..30).await;
    db.close().await.unwrap();

    // Reopening (recovery needs a quorum, two of three) works without it too.
    let db = setup.open().await.unwrap();
    assert_exactly(&db, 0..30, |_| true).await;
    put_durably(&db, 30..40).await;
    db.close().await.unwrap();

    setup.faults[2].clear();
    let db = setup.open().await.unwrap();
    assert_exactly(&db, 0..40, |_| true).await;
    db.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_injected_run_loses_nothing_acknowledged() {
    let setup = Setup::new(3).await;
    // Every replica loses some responses (the write applied) and fails some
    // requests outright; replica 0 also returns damaged bytes on some reads.
    for faults in &setup.faults {
        faults.add(FaultRule::new(Fault::FailAfter).probability(0.03));
        faults.add(FaultRule::new(Fault::FailBefore).probability(0.03));
    }
    setup.faults[0].add(
        FaultRule::new(Fault::Corrupt)
            .ops(OpSet::of(&[Op::Get]))
            .probability(0.5),
    );
    let mut acknowledged = 0;
    for round in 0..3 {
        // A writer may be shed or fail on the way; what it acknowledged stays.
        let db = match setup.open().await {
            Ok(db) => db,
            Err(error) => panic!("round {round}: reopening under faults failed: {error}"),
        };
        assert_exactly(&db, 0..acknowledged, |_| true).await;
        put_durably(&db, acknowledged..acknowledged + 40).await;
        acknowledged += 40;
        db.close().await.unwrap();
    }
    for faults in &setup.faults {
        faults.clear();
    }
    let db = setup.open().await.unwrap();
    assert_exactly(&db, 0..acknowledged + 10, |i| i < acknowledged).await;
    db.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_beyond_the_logs_in_flight_budget_queue_and_all_become_durable() {
    let setup = Setup::new(3).await;
    // Room for about two 1 KiB batches in flight, and slow replicas: most
    // batches wait in the WAL's queue, counted, while SlateDB goes on.
    let options = ChorusWalOptions {
        log: LogConfig {
            max_inflight_bytes: 2048,
            max_record_bytes: 2048,
            ..LogConfig::default()
        },
        ..ChorusWalOptions::default()
    };
    for faults in &setup.faults {
        faults.add(
            FaultRule::new(Fault::Delay(Duration::from_millis(20))).ops(OpSet::of(&[Op::Create])),
        );
    }
    let db = setup
        .open_with_wal(support::quiet(), options)
        .await
        .unwrap();
    let big = |i: u32| format!("{i:01024}").into_bytes();
    let mut handles = Vec::new();
    for i in 0..50 {
        handles.push(db.put(key(i), big(i)).await.unwrap());
    }
    for handle in handles {
        handle.await_durable().await.unwrap();
    }
    for i in 0..50 {
        assert_eq!(db.get(key(i)).await.unwrap().as_deref(), Some(&big(i)[..]));
    }
    db.close().await.unwrap();
    let db = setup.open().await.unwrap();
    for i in 0..50 {
        assert_eq!(
            db.get(key(i)).await.unwrap().as_deref(),
            Some(&big(i)[..]),
            "key {i}"
        );
    }
    db.close().await.unwrap();
}
