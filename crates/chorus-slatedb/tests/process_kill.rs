//! A writer process killed with SIGKILL mid-stream: reopening the database
//! in another process replays every put the killed one saw durable. The
//! stores are the embedded default: local directories for SlateDB's bucket
//! and the three WAL replicas, SQLite for the register.
//!
//! The test re-runs its own binary as the writer: `writer` acts only when
//! `CHORUS_SLATEDB_KILL_DIR` is set, and prints `DURABLE <i>` after each put
//! it saw become durable.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use chorus_slatedb::{ChorusWal, ChorusWalOptions, WalLocation};
use object_store::local::LocalFileSystem;
use slatedb::Db;

/// Puts the killed writer must have seen durable before it is killed.
const DURABLE_BEFORE_KILL: u32 = 200;

async fn open(dir: &Path) -> Db {
    let replicas = ["wal-a", "wal-b", "wal-c"]
        .iter()
        .map(|name| chorus::blob::StoreUrl::local(&dir.join(name)))
        .collect();
    let register = chorus::register::RegisterUrl::sqlite(dir.join("register.db"));
    let stores = WalLocation::new(replicas, register).open().await.unwrap();
    std::fs::create_dir_all(dir.join("bucket")).unwrap();
    let bucket = Arc::new(LocalFileSystem::new_with_prefix(dir.join("bucket")).unwrap());
    Db::builder("db", bucket)
        .with_wal_writer(Box::new(ChorusWal::new(
            stores,
            ChorusWalOptions::default(),
        )))
        .build()
        .await
        .unwrap()
}

fn key(i: u32) -> String {
    format!("key-{i:06}")
}

/// The writer process; a no-op in a normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer() {
    let Ok(dir) = std::env::var("CHORUS_SLATEDB_KILL_DIR") else {
        return;
    };
    let db = open(Path::new(&dir)).await;
    for i in 0.. {
        db.put(key(i), format!("value-{i}"))
            .await
            .unwrap()
            .await_durable()
            .await
            .unwrap();
        println!("DURABLE {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_writer_loses_no_durable_put() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "writer", "--nocapture", "--test-threads=1"])
        .env("CHORUS_SLATEDB_KILL_DIR", dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the writer starts");
    let mut durable = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(i) = line.strip_prefix("DURABLE ") {
            durable.push(i.parse::<u32>().unwrap());
            if durable.len() as u32 == DURABLE_BEFORE_KILL {
                child.kill().unwrap(); // SIGKILL
                break;
            }
        }
    }
    child.wait().unwrap();
    assert_eq!(
        durable.len() as u32,
        DURABLE_BEFORE_KILL,
        "the writer died early"
    );

    let db = open(dir.path()).await;
    for i in durable {
        let value = db.get(key(i)).await.unwrap();
        assert_eq!(
            value.as_deref(),
            Some(format!("value-{i}").as_bytes()),
            "key {i}"
        );
    }
    db.close().await.unwrap();
}
