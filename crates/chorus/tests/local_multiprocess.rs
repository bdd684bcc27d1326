//! The local-directory store is atomic across processes: racing processes (not
//! threads) creating one key, or CASing one version, produce exactly one winner.
//!
//! The test re-runs its own binary as the child processes: `child` acts only
//! when `CHORUS_RACE_ROLE` is set and prints `WON` or `LOST`.

use std::path::Path;
use std::process::{Command, Stdio};

use bytes::Bytes;
use chorus::blob::{BlobError, BlobStore, LocalDirStore, Version};

const ROUNDS: usize = 4;
const PROCESSES: usize = 8;

/// The body of a child process; a no-op in a normal test run.
#[tokio::test]
async fn child() {
    let Ok(role) = std::env::var("CHORUS_RACE_ROLE") else {
        return;
    };
    let dir = std::env::var("CHORUS_RACE_DIR").unwrap();
    let key = std::env::var("CHORUS_RACE_KEY").unwrap();
    let mine = Bytes::from(std::env::var("CHORUS_RACE_BYTES").unwrap());
    let store = LocalDirStore::open(dir).unwrap();
    let outcome = match role.as_str() {
        "create" => store.create(&key, mine).await.map(drop),
        "update" => {
            let expected = Version {
                e_tag: Some(std::env::var("CHORUS_RACE_VERSION").unwrap()),
                generation: None,
            };
            store.update(&key, &expected, mine).await.map(drop)
        }
        other => panic!("unknown role {other}"),
    };
    match outcome {
        Ok(()) => println!("RACE-RESULT WON"),
        Err(BlobError::AlreadyExists { .. } | BlobError::Conflict { .. }) => {
            println!("RACE-RESULT LOST")
        }
        Err(other) => panic!("unexpected error: {other}"),
    }
}

/// Starts one child per contender at once and returns each one's bytes and
/// whether it won.
fn race(dir: &Path, role: &str, key: &str, version: Option<&str>) -> Vec<(String, bool)> {
    let children: Vec<_> = (0..PROCESSES)
        .map(|racer| {
            let mine = format!("process-{racer}");
            let mut command = Command::new(std::env::current_exe().unwrap());
            command
                .args(["--exact", "child", "--nocapture", "--test-threads=1"])
                .env("CHORUS_RACE_ROLE", role)
                .env("CHORUS_RACE_DIR", dir)
                .env("CHORUS_RACE_KEY", key)
                .env("CHORUS_RACE_BYTES", &mine)
                .stdout(Stdio::piped());
            if let Some(version) = version {
                command.env("CHORUS_RACE_VERSION", version);
            }
            (mine, command.spawn().expect("child starts"))
        })
        .collect();
    children
        .into_iter()
        .map(|(mine, child)| {
            let output = child.wait_with_output().unwrap();
            assert!(output.status.success(), "child {mine} failed");
            let stdout = String::from_utf8(output.stdout).unwrap();
            let won = stdout.contains("RACE-RESULT WON");
            assert!(
                won || stdout.contains("RACE-RESULT LOST"),
                "child {mine}: {stdout}"
            );
            (mine, won)
        })
        .collect()
}

fn single_winner(results: &[(String, bool)]) -> String {
    let winners: Vec<_> = results.iter().filter(|(_, won)| *won).collect();
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    winners[0].0.clone()
}

#[tokio::test]
async fn processes_racing_to_create_one_key_have_one_winner() {
    let dir = tempfile::TempDir::new().unwrap();
    let store = LocalDirStore::open(dir.path()).unwrap();
    for round in 0..ROUNDS {
        let key = format!("race/create-{round}");
        let winner = single_winner(&race(dir.path(), "create", &key, None));
        assert_eq!(store.get(&key).await.unwrap().bytes, winner.as_bytes());
    }
}

#[tokio::test]
async fn processes_racing_to_cas_one_version_have_one_winner() {
    let dir = tempfile::TempDir::new().unwrap();
    let store = LocalDirStore::open(dir.path()).unwrap();
    for round in 0..ROUNDS {
        let key = format!("race/cas-{round}");
        let base = store
            .create(&key, Bytes::from_static(b"base"))
            .await
            .unwrap();
        let version = base.e_tag.clone().unwrap();
        let winner = single_winner(&race(dir.path(), "update", &key, Some(&version)));
        let read = store.get(&key).await.unwrap();
        assert_eq!(read.bytes, winner.as_bytes());
        assert_ne!(read.version, base);
    }
}
