//! A `DbReader` tailing a live writer through the Chorus WAL; WAL garbage
//! collection truncating the Chorus log once SlateDB no longer needs its
//! records; SlateDB's admin inspecting and deleting the WAL.

mod support;

use std::sync::Arc;
use std::time::Duration;

use chorus::blob::{Fault, FaultRule};
use chorus::log::LogConfig;
use chorus_slatedb::{ChorusWalAdmin, ChorusWalGc, ChorusWalOptions, ChorusWalReader};
use slatedb::admin::Admin;
use slatedb::config::{
    CompactorOptions, DbReaderOptions, FlushOptions, FlushType, GarbageCollectorDirectoryOptions,
    GarbageCollectorOptions,
};
use slatedb::wal::{WalAdmin, WalError};
use slatedb::{DbReader, DbReaderBuilder, GarbageCollectorBuilder, Settings};
use support::{DB_PATH, Setup, assert_exactly, eventually, key, put_durably, quiet, value};

async fn reader(setup: &Setup) -> DbReader {
    DbReaderBuilder::new(DB_PATH, Arc::clone(&setup.bucket))
        .with_wal_reader(Arc::new(
            ChorusWalReader::new(setup.stores.clone())
                .with_poll_interval(Duration::from_millis(10)),
        ))
        .with_options(DbReaderOptions {
            manifest_poll_interval: Duration::from_millis(20),
            ..DbReaderOptions::default()
        })
        .build()
        .await
        .unwrap()
}

async fn read(reader: &DbReader, i: u32) -> Option<Vec<u8>> {
    reader.get(key(i)).await.unwrap().map(|v| v.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_tailing_a_live_writer_sees_only_durable_writes() {
    let setup = Setup::new(3).await;
    let db = setup.open().await.unwrap();
    put_durably(&db, 0..10).await;
    let reader = reader(&setup).await;
    eventually("the reader sees the durable puts", || async {
        read(&reader, 9).await == Some(value(9))
    })
    .await;

    // Two replicas of three take nothing: a put reaches the writer's
    // memtable and one replica, never a quorum.
    setup.faults[1].add(FaultRule::new(Fault::FailBefore));
    setup.faults[2].add(FaultRule::new(Fault::FailBefore));
    let pending = db.put(key(10), value(10)).await.unwrap();
    assert_eq!(
        db.get(key(10)).await.unwrap().as_deref(),
        Some(&value(10)[..])
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        read(&reader, 10).await,
        None,
        "the reader saw a write no quorum holds"
    );

    // Once the replicas are back, the lanes' retries land it, and the
    // reader follows.
    setup.faults[1].clear();
    setup.faults[2].clear();
    pending.await_durable().await.unwrap();
    eventually("the reader sees the write once durable", || async {
        read(&reader, 10).await == Some(value(10))
    })
    .await;
    reader.close().await.unwrap();
    db.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_gc_truncates_the_log_after_memtable_flushes_and_compaction() {
    let setup = Setup::new(3).await;
    let options = ChorusWalOptions {
        // Small segments, so that truncation has sealed segments to delete.
        log: LogConfig {
            max_segment_bytes: 4096,
            ..LogConfig::default()
        },
        ..ChorusWalOptions::default()
    };
    let settings = Settings {
        garbage_collector_options: None,
        compactor_options: Some(CompactorOptions {
            poll_interval: Duration::from_millis(50),
            ..CompactorOptions::default()
        }),
        ..Settings::default()
    };
    let db = setup
        .open_with_wal(settings.clone(), options.clone())
        .await
        .unwrap();
    for round in 0..4 {
        put_durably(&db, round * 50..(round + 1) * 50).await;
        db.flush_with_options(FlushOptions {
            flush_type: FlushType::MemTable,
        })
        .await
        .unwrap();
    }
    let admin = Admin::builder(DB_PATH, Arc::clone(&setup.bucket)).build();
    eventually("the compactor compacts L0", || async {
        let manifest = admin.read_manifest(None).await.unwrap().unwrap();
        !manifest.compacted().is_empty()
    })
    .await;
    let replay_after = admin
        .read_manifest(None)
        .await
        .unwrap()
        .unwrap()
        .replay_after_wal_id();
    assert!(
        replay_after >= 200,
        "the memtable flushes moved the replay point: {replay_after}"
    );
    let before = setup.manifest().await;
    assert_eq!(before.trunc.0, 0);

    let gc = GarbageCollectorBuilder::new(DB_PATH, Arc::clone(&setup.bucket))
        .with_options(GarbageCollectorOptions {
            wal_options: Some(GarbageCollectorDirectoryOptions {
                interval: None,
                min_age: Duration::ZERO,
                dry_run: false,
            }),
            manifest_options: None,
            wal_fence_options: None,
            compacted_options: None,
            compactions_options: None,
            ..GarbageCollectorOptions::default()
        })
        .with_wal_gc(Arc::new(ChorusWalGc::new(setup.stores.clone())))
        .build();
    gc.run_gc_once().await;

    let after = setup.manifest().await;
    // WAL file `replay_after` is record `replay_after - 1`: everything up to
    // it is in L0 or the sorted runs, and nothing after it is gone.
    assert!(after.trunc.0 > 0, "GC truncated nothing");
    assert!(
        after.trunc.0 <= replay_after,
        "GC truncated records SlateDB still needs"
    );
    // Sealed segments wholly below the floor are gone from the directory
    // (deleted from every replica first).
    assert!(
        (0..after.segments.len()).all(|position| after.entry_end(position) > after.trunc),
        "a sealed segment wholly below the floor is still listed"
    );
    assert!(after.segments.len() < before.segments.len());

    put_durably(&db, 200..210).await;
    db.close().await.unwrap();
    let db = setup.open_with_wal(quiet(), options).await.unwrap();
    assert_exactly(&db, 0..210, |_| true).await;
    db.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_sees_the_wal_and_deletes_it_with_the_database() {
    let setup = Setup::new(3).await;
    let db = setup.open().await.unwrap();
    put_durably(&db, 0..20).await;
    db.close().await.unwrap();
    let wal_admin = ChorusWalAdmin::new(setup.stores.clone());
    let path = object_store::path::Path::from(DB_PATH);
    // WAL files 1..=20 hold the puts; none lies after file 20.
    assert!(!wal_admin.is_empty(&path, 0, 20).await.unwrap());
    assert!(!wal_admin.is_empty(&path, 19, 20).await.unwrap());
    assert!(wal_admin.is_empty(&path, 20, 30).await.unwrap());

    let admin = Admin::builder(DB_PATH, Arc::clone(&setup.bucket))
        .with_wal_admin(Arc::new(wal_admin.clone()))
        .build();
    admin.delete_db(true).await.unwrap();
    let manifest = setup.manifest().await;
    assert!(
        manifest.trunc.0 >= 20,
        "the log's floor rose to its end: {}",
        manifest.trunc
    );
    // The deleted files cannot be inspected, as with SlateDB's own WAL;
    // nothing lies after them.
    assert!(matches!(
        wal_admin.is_empty(&path, 0, 20).await,
        Err(WalError::WalTruncated(_))
    ));
    assert!(
        wal_admin
            .is_empty(&path, manifest.trunc.0, manifest.trunc.0 + 10)
            .await
            .unwrap()
    );
    // SlateDB deleted its own manifest and tables.
    assert!(admin.read_manifest(None).await.unwrap().is_none());
}
