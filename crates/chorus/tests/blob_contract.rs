//! The blob store contract, run against every backend: `memory::*`, `local::*`
//! (a directory), `s3::*` (an S3-compatible server) and `azure::*` (Azurite, the
//! Azure Blob Storage emulator), the last two from the test services.

#[path = "support/stores.rs"]
mod stores;
mod support;

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use chorus::blob::{
    BlobError, DynBlobStore, Fault, FaultController, FaultRule, FaultyStore, Op, OpSet, PutPayload,
    create_resolving, probe, update_resolving,
};
use stores::{azure, local, memory, s3};

fn bytes(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

/// Rounds of each concurrent race.
const RACE_ROUNDS: usize = 5;
/// Contenders per race.
const RACERS: usize = 16;

mod cases {
    use super::*;

    pub async fn create_once(store: DynBlobStore) {
        store.create("a/b", bytes("first")).await.unwrap();
        let second = store.create("a/b", bytes("second")).await;
        assert!(
            matches!(second, Err(BlobError::AlreadyExists { .. })),
            "{second:?}"
        );
        assert_eq!(store.get("a/b").await.unwrap().bytes, bytes("first"));
    }

    pub async fn cas_conflict(store: DynBlobStore) {
        let v1 = store.create("doc", bytes("one")).await.unwrap();
        let v2 = store.update("doc", &v1, bytes("two")).await.unwrap();
        assert_ne!(v1, v2);
        let stale = store.update("doc", &v1, bytes("stale")).await;
        assert!(
            matches!(stale, Err(BlobError::Conflict { .. })),
            "{stale:?}"
        );
        let read = store.get("doc").await.unwrap();
        assert_eq!(read.bytes, bytes("two"));
        assert_eq!(read.version, v2);
        let v3 = store
            .update("doc", &read.version, bytes("three"))
            .await
            .unwrap();
        assert_eq!(store.head("doc").await.unwrap().version, v3);
        let missing = store.update("absent", &v3, bytes("x")).await;
        assert!(
            matches!(missing, Err(BlobError::Conflict { .. })),
            "{missing:?}"
        );
        assert!(matches!(
            store.get("absent").await,
            Err(BlobError::NotFound { .. })
        ));
    }

    /// The response of a write is lost after it applied; reading back settles it.
    pub async fn lost_response_resolved_by_reread(store: DynBlobStore) {
        let controller = FaultController::new(7);
        let faulty: DynBlobStore = Arc::new(FaultyStore::new(store.clone(), controller.clone()));
        controller.add(
            FaultRule::new(Fault::FailAfter)
                .ops(OpSet::of(&[Op::Create]))
                .times(1),
        );
        let lost = faulty.create("frag", bytes("payload")).await;
        assert!(
            matches!(lost, Err(BlobError::Unavailable { .. })),
            "{lost:?}"
        );
        // The retry finds an object: identical bytes mean it was ours.
        let version = create_resolving(faulty.as_ref(), "frag", bytes("payload"))
            .await
            .unwrap();
        assert_eq!(store.head("frag").await.unwrap().version, version);
        let other = create_resolving(faulty.as_ref(), "frag", bytes("different")).await;
        assert!(
            matches!(other, Err(BlobError::AlreadyExists { .. })),
            "{other:?}"
        );

        controller.add(
            FaultRule::new(Fault::FailAfter)
                .ops(OpSet::of(&[Op::Update]))
                .times(1),
        );
        let ours = bytes("payload-2");
        let is_ours = |found: &Bytes| found == &bytes("payload-2");
        let updated = update_resolving(faulty.as_ref(), "frag", &version, ours.clone(), is_ours)
            .await
            .unwrap();
        let read = store.get("frag").await.unwrap();
        assert_eq!((read.bytes, read.version), (ours, updated.clone()));
        // A stale CAS that is not ours stays a conflict after reading back.
        let stale =
            update_resolving(faulty.as_ref(), "frag", &version, bytes("z"), |_| false).await;
        assert!(
            matches!(stale, Err(BlobError::Conflict { .. })),
            "{stale:?}"
        );
        assert_eq!(controller.injected(), 2);
    }

    pub async fn concurrent_creators_exactly_one_wins(store: DynBlobStore) {
        for round in 0..RACE_ROUNDS {
            let key = format!("race/create-{round}");
            let tasks: Vec<_> = (0..RACERS)
                .map(|racer| {
                    let store = store.clone();
                    let key = key.clone();
                    tokio::spawn(async move {
                        let mine = bytes(&format!("racer-{racer}"));
                        // A transient refusal (S3's 409 while another create
                        // is in flight) is settled as Chorus settles it.
                        let outcome = match store.create(&key, mine.clone()).await {
                            Err(e) if e.is_transient() => {
                                create_resolving(store.as_ref(), &key, mine.clone()).await
                            }
                            outcome => outcome,
                        };
                        (mine, outcome)
                    })
                })
                .collect();
            let mut winners = Vec::new();
            for task in tasks {
                match task.await.unwrap() {
                    (mine, Ok(_)) => winners.push(mine),
                    (_, Err(BlobError::AlreadyExists { .. })) => {}
                    (_, Err(other)) => panic!("unexpected create error: {other}"),
                }
            }
            assert_eq!(
                winners.len(),
                1,
                "round {round}: {} creators won",
                winners.len()
            );
            assert_eq!(store.get(&key).await.unwrap().bytes, winners[0]);
        }
    }

    pub async fn concurrent_cas_exactly_one_wins(store: DynBlobStore) {
        for round in 0..RACE_ROUNDS {
            let key = format!("race/cas-{round}");
            let base = store.create(&key, bytes("base")).await.unwrap();
            let tasks: Vec<_> = (0..RACERS)
                .map(|racer| {
                    let store = store.clone();
                    let key = key.clone();
                    let base = base.clone();
                    tokio::spawn(async move {
                        let mine = bytes(&format!("racer-{racer}"));
                        let outcome = match store.update(&key, &base, mine.clone()).await {
                            Err(e) if e.is_transient() => {
                                let ours = |stored: &Bytes| *stored == mine;
                                update_resolving(store.as_ref(), &key, &base, mine.clone(), ours)
                                    .await
                            }
                            outcome => outcome,
                        };
                        (mine, outcome)
                    })
                })
                .collect();
            let mut winners = Vec::new();
            for task in tasks {
                match task.await.unwrap() {
                    (mine, Ok(version)) => winners.push((mine, version)),
                    (_, Err(BlobError::Conflict { .. })) => {}
                    (_, Err(other)) => panic!("unexpected update error: {other}"),
                }
            }
            assert_eq!(winners.len(), 1, "round {round}: {} CAS won", winners.len());
            let read = store.get(&key).await.unwrap();
            assert_eq!((read.bytes, read.version), winners.pop().unwrap());
        }
    }

    pub async fn list_is_consistent(store: DynBlobStore) {
        for key in ["log/a/2", "log/a/1", "log/a/3", "log/ab/1", "other/1"] {
            store.create(key, bytes(key)).await.unwrap();
        }
        let keys = |listed: Vec<chorus::blob::ObjectMeta>| {
            listed.into_iter().map(|m| m.key).collect::<Vec<_>>()
        };
        // Directory semantics: "log/a" does not include "log/ab".
        assert_eq!(
            keys(store.list("log/a").await.unwrap()),
            ["log/a/1", "log/a/2", "log/a/3"]
        );
        assert_eq!(keys(store.list("log").await.unwrap()).len(), 4);
        assert!(store.list("missing").await.unwrap().is_empty());
        store.delete("log/a/2").await.unwrap();
        assert_eq!(
            keys(store.list("log/a").await.unwrap()),
            ["log/a/1", "log/a/3"]
        );
        let listed = store.list("log/a").await.unwrap();
        for meta in listed {
            let head = store.head(&meta.key).await.unwrap();
            assert_eq!((meta.size, &meta.version), (head.size, &head.version));
            assert_eq!(meta.size, meta.key.len() as u64);
        }
        let everything: HashSet<String> = keys(store.list("").await.unwrap()).into_iter().collect();
        assert!(everything.contains("other/1") && everything.contains("log/ab/1"));
    }

    pub async fn delete_is_idempotent(store: DynBlobStore) {
        store.create("d", bytes("x")).await.unwrap();
        store.delete("d").await.unwrap();
        assert!(matches!(
            store.get("d").await,
            Err(BlobError::NotFound { .. })
        ));
        assert!(matches!(
            store.head("d").await,
            Err(BlobError::NotFound { .. })
        ));
        store.delete("d").await.unwrap();
        // A deleted key can be created again.
        store.create("d", bytes("y")).await.unwrap();
        assert_eq!(store.get("d").await.unwrap().bytes, bytes("y"));
    }

    pub async fn range_reads(store: DynBlobStore) {
        let data: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        store.create("r", Bytes::from(data.clone())).await.unwrap();
        for range in [0..1, 0..10_000, 100..4_196, 9_999..10_000, 5_000..5_000] {
            let read = store.get_range("r", range.clone()).await.unwrap();
            assert_eq!(
                read.as_ref(),
                &data[range.start as usize..range.end as usize]
            );
        }
        assert!(store.get_range("r", 9_000..10_001).await.is_err());
        assert!(matches!(
            store.get_range("absent", 0..1).await,
            Err(BlobError::NotFound { .. })
        ));
        assert_eq!(store.head("r").await.unwrap().size, 10_000);
    }

    /// An object created from parts is their concatenation, whole and in
    /// ranges that cross the parts' boundaries; empty parts add nothing.
    pub async fn created_from_parts(store: DynBlobStore) {
        let parts = [&b"head-"[..], b"", b"middle-", b"tail"];
        let payload: PutPayload = parts.iter().map(|p| Bytes::copy_from_slice(p)).collect();
        let version = store.create_parts("parts", payload).await.unwrap();
        let joined = parts.concat();
        let read = store.get("parts").await.unwrap();
        assert_eq!(
            (read.bytes.as_ref(), &read.version),
            (&joined[..], &version)
        );
        assert_eq!(store.head("parts").await.unwrap().size, joined.len() as u64);
        for range in [0..5, 3..9, 4..16, 12..16, 0..16] {
            let read = store.get_range("parts", range.clone()).await.unwrap();
            assert_eq!(
                read.as_ref(),
                &joined[range.start as usize..range.end as usize]
            );
        }
        let again: PutPayload = vec![Bytes::from_static(b"x")].into_iter().collect();
        assert!(matches!(
            store.create_parts("parts", again).await,
            Err(BlobError::AlreadyExists { .. })
        ));
    }

    pub async fn empty_objects(store: DynBlobStore) {
        store.create("empty", Bytes::new()).await.unwrap();
        assert!(store.get("empty").await.unwrap().bytes.is_empty());
        assert_eq!(store.head("empty").await.unwrap().size, 0);
    }

    pub async fn invalid_keys_are_refused(store: DynBlobStore) {
        for key in [
            "",
            "/abs",
            "a//b",
            "../escape",
            ".chorus-locks/00",
            "sp ace",
        ] {
            let result = store.create(key, bytes("x")).await;
            assert!(
                matches!(result, Err(BlobError::InvalidKey { .. })),
                "{key:?}: {result:?}"
            );
        }
    }

    pub async fn probe_passes(store: DynBlobStore) {
        probe(store.as_ref()).await.unwrap();
        probe(store.as_ref()).await.unwrap();
    }
}

macro_rules! contract {
    ($backend:ident) => {
        mod $backend {
            use super::*;

            macro_rules! case {
                ($name:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                    async fn $name() {
                        if let Some(fixture) = super::$backend().await {
                            cases::$name(fixture.store.clone()).await;
                        }
                    }
                };
            }

            case!(create_once);
            case!(cas_conflict);
            case!(lost_response_resolved_by_reread);
            case!(concurrent_creators_exactly_one_wins);
            case!(concurrent_cas_exactly_one_wins);
            case!(list_is_consistent);
            case!(delete_is_idempotent);
            case!(range_reads);
            case!(created_from_parts);
            case!(empty_objects);
            case!(invalid_keys_are_refused);
            case!(probe_passes);
        }
    };
}

contract!(memory);
contract!(local);
contract!(s3);
contract!(azure);
