//! The manifest register contract (docs/overview.md, The manifest register),
//! one suite run against every backend: `memory::*`, `sqlite::*`,
//! `postgres::*`, `object_local::*` (an object register in a local directory
//! store) and `object_s3::*` (an object register in an S3-compatible server
//! from the test services).
//!
//! Every case gets a fresh register (unique names and prefixes), so the suite
//! can run again and again against the same services.

#[path = "support/register.rs"]
mod register_support;
mod support;

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;

use chorus::blob::{Fault, FaultController, FaultRule, Op, OpSet};
use chorus::ids::{Epoch, OwnerId};
use chorus::register::{
    DEFAULT_MAX_ROUNDS, FORMAT, FaultyRegister, Fields, InitError, Initialized, Manifest,
    ManifestError, ManifestStore, RegisterError, RegisterVersion, Step, TransformError, initialize,
    transform,
};
use register_support::{Backend, Fixture};
use tokio::sync::Barrier;

/// Rounds of each concurrent race.
const RACE_ROUNDS: usize = 5;
/// Contenders per race.
const RACERS: usize = 16;
/// Window used by the registers the suite initializes.
const WINDOW: u32 = 4;

/// A transition's own refusal; the suite's transitions never refuse.
#[derive(Debug)]
struct Never;

/// Three replica identities.
fn replicas() -> Vec<String> {
    (0..3)
        .map(|i| format!("s3://contract-zone-{i}/log"))
        .collect()
}

/// A valid document unique to (`writer`, `round`): its owner encodes both.
fn doc(writer: usize, round: usize) -> Fields {
    doc_manifest(writer, round)
        .to_fields()
        .expect("contract documents are valid")
}

fn doc_manifest(writer: usize, round: usize) -> Manifest {
    Manifest {
        epoch: Epoch(round as u64 + 1),
        owner: owner(writer, round),
        ..Manifest::initial(replicas(), (writer % 64) as u32 + 1)
    }
}

fn owner(writer: usize, round: usize) -> OwnerId {
    OwnerId(((round as u128) << 64) | (writer as u128 + 1))
}

/// The "claim the next epoch" transition for `me`: done once `me` owns it.
fn claim(current: &Manifest, me: OwnerId) -> Result<Step, Never> {
    if current.owner == me {
        return Ok(Step::Done);
    }
    Ok(Step::Write(Manifest {
        epoch: current.epoch.next().expect("epoch overflow"),
        owner: me,
        ..current.clone()
    }))
}

async fn read(store: &dyn ManifestStore) -> (RegisterVersion, Fields) {
    let current = store
        .read()
        .await
        .unwrap_or_else(|e| panic!("read {}: {e}", store.name()))
        .unwrap_or_else(|| panic!("register {} exists", store.name()));
    (current.version, current.fields)
}

/// Asserts `error` is a manifest error about `field`, named in the message.
#[track_caller]
fn assert_names(error: &ManifestError, field: &str) {
    assert_eq!(error.field(), field, "{error}");
    assert!(error.to_string().contains(field), "{error}");
}

#[track_caller]
fn expect_init_invalid(result: Result<Initialized, InitError>, field: &str) {
    match result {
        Err(InitError::Invalid(error)) => assert_names(&error, field),
        other => panic!("expected a refusal naming {field}, got {other:?}"),
    }
}

#[track_caller]
fn expect_transform_invalid<T: Debug>(result: Result<T, TransformError<Never>>, field: &str) {
    match result {
        Err(TransformError::Invalid(error)) => assert_names(&error, field),
        other => panic!("expected a refusal naming {field}, got {other:?}"),
    }
}

/// Opens `RACERS` independent handles on the fixture's register.
async fn handles(fixture: &Fixture) -> Vec<Arc<dyn ManifestStore>> {
    let mut handles = Vec::with_capacity(RACERS);
    for _ in 0..RACERS {
        handles.push(fixture.handle().await);
    }
    handles
}

/// Settles racers whose call failed transiently as callers do, by reading
/// the register back: one whose document is there won. (S3 refuses a
/// conditional write with a 409 while another one of the key is in flight;
/// moto serializes requests and never does.) The others stay errors, which
/// `single_winner`'s `lost` must accept.
async fn settle_unknown(
    store: &dyn ManifestStore,
    results: &mut [Result<RegisterVersion, RegisterError>],
    round: usize,
) {
    if !results
        .iter()
        .any(|r| r.as_ref().is_err_and(RegisterError::is_transient))
    {
        return;
    }
    let (version, held) = read(store).await;
    for (writer, result) in results.iter_mut().enumerate() {
        if result.as_ref().is_err_and(RegisterError::is_transient) && held == doc(writer, round) {
            *result = Ok(version.clone());
        }
    }
}

/// Exactly one result is `Ok`; every other one is the loser's error `lost`.
#[track_caller]
fn single_winner<T: Debug>(
    results: &[Result<T, RegisterError>],
    lost: fn(&RegisterError) -> bool,
) -> usize {
    let winners: Vec<usize> = (0..results.len()).filter(|i| results[*i].is_ok()).collect();
    assert_eq!(winners.len(), 1, "exactly one winner: {results:?}");
    for (i, result) in results.iter().enumerate() {
        if let Err(error) = result {
            assert!(lost(error), "racer {i} failed unexpectedly: {error}");
        }
    }
    winners[0]
}

mod cases {
    use super::*;

    pub async fn read_before_create_is_none(backend: Backend) {
        let Some(fixture) = Fixture::new(backend).await else {
            return;
        };
        assert!(fixture.register.read().await.unwrap().is_none());
        assert!(fixture.register.max_directory_bytes() > 0);
    }

    pub async fn create_once_then_already_exists(backend: Backend) {
        let Some(fixture) = Fixture::new(backend).await else {
            return;
        };
        let store = &fixture.register;
        let created = store.create(&doc(1, 0)).await.unwrap();
        if backend.counts_versions() {
            assert_eq!(created.to_string(), "1");
        }
        let second = store.create(&doc(2, 0)).await;
        match second {
            Err(RegisterError::AlreadyExists { register }) => assert_eq!(register, store.name()),
            other => panic!("second create: {other:?}"),
        }
        // Also from an independent handle.
        let other = fixture.handle().await;
        assert!(matches!(
            other.create(&doc(3, 0)).await,
            Err(RegisterError::AlreadyExists { .. })
        ));
        let (version, fields) = read(store.as_ref()).await;
        assert_eq!(version, created);
        assert_eq!(fields, doc(1, 0));
    }

    pub async fn update_with_current_version_succeeds(backend: Backend) {
        let Some(fixture) = Fixture::new(backend).await else {
            return;
        };
        let store = &fixture.register;
        let v1 = store.create(&doc(1, 0)).await.unwrap();
        let v2 = store.update(&v1, &doc(1, 1)).await.unwrap();
        assert_ne!(v1, v2);
        assert_eq!(read(store.as_ref()).await, (v2.clone(), doc(1, 1)));
        // Through another handle, from the version it reads.
        let other = fixture.handle().await;
        let (seen, _) = read(other.as_ref()).await;
        assert_eq!(seen, v2);
        let v3 = other.update(&seen, &doc(2, 2)).await.unwrap();
        assert_ne!(v3, v2);
        assert_ne!(v3, v1);
        assert_eq!(read(store.as_ref()).await, (v3.clone(), doc(2, 2)));
        if backend.counts_versions() {
            assert_eq!(
                [v1, v2, v3].map(|v| v.to_string()),
                ["1", "2", "3"].map(String::from)
            );
        }
    }

    pub async fn update_with_stale_version_conflicts(backend: Backend) {
        let Some(fixture) = Fixture::new(backend).await else {
            return;
        };
        let store = &fixture.register;
        let v1 = store.create(&doc(1, 0)).await.unwrap();
        let v2 = store.update(&v1, &doc(1, 1)).await.unwrap();
        for (stale, label) in [(&v1, "previous"), (&v1, "again")] {
            match store.update(stale, &doc(9, 9)).await {
                Err(RegisterError::Conflict { register }) => assert_eq!(register, store.name()),
                other => panic!("{label} stale update: {other:?}"),
            }
        }
        assert_eq!(read(store.as_ref()).await, (v2.clone(), doc(1, 1)));
        // Older than the previous version: still a conflict.
        let v3 = store.update(&v2, &doc(1, 2)).await.unwrap();
        assert!(matches!(
            store.update(&v1, &doc(9, 9)).await,
            Err(RegisterError::Conflict { .. })
        ));
        assert!(matches!(
            store.update(&v2, &doc(9, 9)).await,
            Err(RegisterError::Conflict { .. })
        ));
        assert_eq!(read(store.as_ref()).await, (v3, doc(1, 2)));
    }

    pub async fn update_of_a_missing_register_conflicts(backend: Backend) {
        let (Some(created), Some(missing)) =
            (Fixture::new(backend).await, Fixture::new(backend).await)
        else {
            return;
        };
        let version = created.register.create(&doc(1, 0)).await.unwrap();
        match missing.register.update(&version, &doc(1, 1)).await {
            Err(RegisterError::Conflict { .. }) => {}
            other => panic!("update of a register never created: {other:?}"),
        }
        assert!(missing.register.read().await.unwrap().is_none());
    }

    pub async fn versions_from_read_match(backend: Backend) {
        let Some(fixture) = Fixture::new(backend).await else {
            return;
        };
        let store = &fixture.register;
        let other = fixture.handle().await;
        let created = store.create(&doc(1, 0)).await.unwrap();
        assert_eq!(read(store.as_ref()).await.0, created);
        assert_eq!(read(other.as_ref()).await.0, created);
        assert_eq!(
            read(store.as_ref()).await.0,
            created,
            "reads do not move the version"
        );
        let mut seen = vec![created.to_string()];
        let mut version = created;
        for round in 1..=4 {
            let writer = if round % 2 == 0 { store } else { &other };
            version = writer.update(&version, &doc(round, round)).await.unwrap();
            assert_eq!(
                read(store.as_ref()).await,
                (version.clone(), doc(round, round))
            );
            assert_eq!(read(other.as_ref()).await.0, version);
            seen.push(version.to_string());
        }
        let distinct: BTreeSet<&String> = seen.iter().collect();
        assert_eq!(distinct.len(), seen.len(), "versions never recur: {seen:?}");
    }

    pub async fn concurrent_creators_exactly_one_wins(backend: Backend) {
        for round in 0..RACE_ROUNDS {
            let Some(fixture) = Fixture::new(backend).await else {
                return;
            };
            let barrier = Arc::new(Barrier::new(RACERS));
            let tasks: Vec<_> = handles(&fixture)
                .await
                .into_iter()
                .enumerate()
                .map(|(writer, store)| {
                    let barrier = Arc::clone(&barrier);
                    tokio::spawn(async move {
                        barrier.wait().await;
                        store.create(&doc(writer, round)).await
                    })
                })
                .collect();
            let mut results = Vec::with_capacity(RACERS);
            for task in tasks {
                results.push(task.await.expect("racer panicked"));
            }
            settle_unknown(fixture.register.as_ref(), &mut results, round).await;
            let winner = single_winner(&results, |e| {
                matches!(e, RegisterError::AlreadyExists { .. }) || e.is_transient()
            });
            let won = results[winner].as_ref().unwrap();
            assert_eq!(
                read(fixture.register.as_ref()).await,
                (won.clone(), doc(winner, round)),
                "round {round}: the register holds the winner's document"
            );
        }
    }

    pub async fn concurrent_updates_exactly_one_wins(backend: Backend) {
        let Some(fixture) = Fixture::new(backend).await else {
            return;
        };
        let handles = handles(&fixture).await;
        let mut version = fixture.register.create(&doc(0, 0)).await.unwrap();
        let mut seen = vec![version.to_string()];
        for round in 1..=RACE_ROUNDS {
            let barrier = Arc::new(Barrier::new(RACERS));
            let tasks: Vec<_> = handles
                .iter()
                .enumerate()
                .map(|(writer, store)| {
                    let store = Arc::clone(store);
                    let barrier = Arc::clone(&barrier);
                    let version = version.clone();
                    tokio::spawn(async move {
                        barrier.wait().await;
                        store.update(&version, &doc(writer, round)).await
                    })
                })
                .collect();
            let mut results = Vec::with_capacity(RACERS);
            for task in tasks {
                results.push(task.await.expect("racer panicked"));
            }
            settle_unknown(fixture.register.as_ref(), &mut results, round).await;
            let winner = single_winner(&results, |e| {
                matches!(e, RegisterError::Conflict { .. }) || e.is_transient()
            });
            let won = results[winner].as_ref().unwrap().clone();
            assert_eq!(
                read(fixture.register.as_ref()).await,
                (won.clone(), doc(winner, round)),
                "round {round}: the register holds the winner's document"
            );
            seen.push(won.to_string());
            version = won;
        }
        let distinct: BTreeSet<&String> = seen.iter().collect();
        assert_eq!(distinct.len(), seen.len(), "versions never recur: {seen:?}");
    }

    pub async fn concurrent_transforms_each_apply_once(backend: Backend) {
        let Some(fixture) = Fixture::new(backend).await else {
            return;
        };
        initialize(fixture.register.as_ref(), replicas(), WINDOW)
            .await
            .unwrap();
        let barrier = Arc::new(Barrier::new(RACERS));
        let tasks: Vec<_> = handles(&fixture)
            .await
            .into_iter()
            .enumerate()
            .map(|(writer, store)| {
                let barrier = Arc::clone(&barrier);
                tokio::spawn(async move {
                    barrier.wait().await;
                    let me = owner(writer, 0);
                    transform(store.as_ref(), DEFAULT_MAX_ROUNDS, |m| claim(m, me)).await
                })
            })
            .collect();
        let mut epochs = BTreeSet::new();
        for (writer, task) in tasks.into_iter().enumerate() {
            let committed = task
                .await
                .expect("claimer panicked")
                .unwrap_or_else(|e| panic!("claimer {writer}: {e:?}"));
            assert_eq!(committed.manifest.owner, owner(writer, 0));
            epochs.insert(committed.manifest.epoch.0);
        }
        // Every claim applied exactly once, each at its own epoch.
        assert_eq!(epochs, (1..=RACERS as u64).collect::<BTreeSet<_>>());
        let (_, fields) = read(fixture.register.as_ref()).await;
        let last = Manifest::from_fields(&fields).unwrap();
        assert_eq!(last.epoch, Epoch(RACERS as u64));
    }

    pub async fn lost_cas_response_applies_once(backend: Backend) {
        let Some(fixture) = Fixture::new(backend).await else {
            return;
        };
        let controller = FaultController::new(11);
        let faulty = FaultyRegister::new(Arc::clone(&fixture.register), controller.clone());
        let Initialized::Created(created) = initialize(&faulty, replicas(), WINDOW).await.unwrap()
        else {
            panic!("fresh register was created");
        };
        controller.add(
            FaultRule::new(Fault::FailAfter)
                .ops(OpSet::of(&[Op::Update]))
                .times(1),
        );
        let me = OwnerId(0xfeed);
        let mut decisions = Vec::new();
        let committed = transform(&faulty, DEFAULT_MAX_ROUNDS, |m| {
            let step = claim(m, me);
            decisions.push(
                step.as_ref()
                    .map(|s| matches!(s, Step::Write(_)))
                    .unwrap_or(false),
            );
            step
        })
        .await
        .expect("the transform resolves the lost response");
        // Round 1 wrote and lost the response; round 2 found it applied.
        assert_eq!(decisions, [true, false]);
        assert_eq!(controller.calls(Op::Update), 1, "one CAS reached the store");
        assert_eq!(controller.injected(), 1);
        assert_eq!(committed.manifest.epoch, Epoch(1));
        assert_eq!(committed.manifest.owner, me);
        let (version, fields) = read(fixture.register.as_ref()).await;
        assert_eq!(version, committed.version);
        assert_ne!(version, created.version);
        if backend.counts_versions() {
            assert_eq!(
                version.to_string(),
                "2",
                "the version advanced exactly once"
            );
        }
        let stored = Manifest::from_fields(&fields).unwrap();
        assert_eq!(stored, committed.manifest);
        assert_eq!(
            stored,
            Manifest {
                epoch: Epoch(1),
                owner: me,
                ..created.manifest
            }
        );
    }

    pub async fn initialize_creates_then_reports_existing(backend: Backend) {
        let Some(fixture) = Fixture::new(backend).await else {
            return;
        };
        let store = fixture.register.as_ref();
        let created = match initialize(store, replicas(), WINDOW).await.unwrap() {
            Initialized::Created(created) => created,
            other => panic!("first initialize: {other:?}"),
        };
        assert_eq!(created.manifest, Manifest::initial(replicas(), WINDOW));
        let (version, fields) = read(store).await;
        assert_eq!(version, created.version);
        assert_eq!(fields, created.manifest.to_fields().unwrap());
        let other = fixture.handle().await;
        for handle in [store, other.as_ref()] {
            match initialize(handle, replicas(), WINDOW).await.unwrap() {
                Initialized::Existing(existing) => assert_eq!(existing, created),
                other => panic!("second initialize: {other:?}"),
            }
        }
        // The window is fixed at creation: another one is not applied.
        match initialize(store, replicas(), WINDOW + 1).await.unwrap() {
            Initialized::Existing(existing) => assert_eq!(existing.manifest.window, WINDOW),
            other => panic!("initialize with another window: {other:?}"),
        }
        assert_eq!(read(store).await, (version, fields));
    }

    pub async fn initialize_refuses_other_replicas(backend: Backend) {
        let Some(fixture) = Fixture::new(backend).await else {
            return;
        };
        let store = fixture.register.as_ref();
        initialize(store, replicas(), WINDOW).await.unwrap();
        let before = read(store).await;
        let bound = replicas();
        let mut reordered = bound.clone();
        reordered.swap(1, 2);
        let mut renamed = bound.clone();
        renamed[0] = "s3://elsewhere/log".to_owned();
        let mut duplicated = bound.clone();
        duplicated[2] = bound[1].clone();
        let mut five = bound.clone();
        five.extend(["s3://d/log".to_owned(), "s3://e/log".to_owned()]);
        for given in [reordered, renamed, duplicated, five, bound[..1].to_vec()] {
            expect_init_invalid(initialize(store, given, WINDOW).await, "chorus.replicas");
        }
        assert_eq!(
            read(store).await,
            before,
            "a refused initialize modifies nothing"
        );
    }

    pub async fn initialize_after_a_lost_create_response_finds_it(backend: Backend) {
        let Some(fixture) = Fixture::new(backend).await else {
            return;
        };
        let controller = FaultController::new(5);
        controller.add(
            FaultRule::new(Fault::FailAfter)
                .ops(OpSet::of(&[Op::Create]))
                .times(1),
        );
        let faulty = FaultyRegister::new(Arc::clone(&fixture.register), controller.clone());
        match initialize(&faulty, replicas(), WINDOW).await {
            Err(InitError::Store(error)) => assert!(error.is_transient(), "{error}"),
            other => panic!("initialize with a lost create response: {other:?}"),
        }
        match initialize(&faulty, replicas(), WINDOW).await.unwrap() {
            Initialized::Existing(existing) => {
                assert_eq!(existing.manifest, Manifest::initial(replicas(), WINDOW));
            }
            other => panic!("initialize after a lost create response: {other:?}"),
        }
        assert_eq!(controller.calls(Op::Create), 1);
    }

    pub async fn invalid_document_is_refused_naming_the_field(backend: Backend) {
        let Some(fixture) = Fixture::new(backend).await else {
            return;
        };
        let store = fixture.register.as_ref();
        // Stores keep whatever they are given; decoding refuses it.
        let mut fields = doc(1, 0);
        fields.insert("chorus.window".into(), "0".into());
        let version = store.create(&fields).await.unwrap();
        let mut planted = vec![(fields, "chorus.window")];
        let mut newer_format = doc(1, 0);
        newer_format.insert("chorus.format".into(), (FORMAT + 1).to_string());
        planted.push((newer_format, "chorus.format"));
        let mut unknown = doc(1, 0);
        unknown.insert("chorus.colour".into(), "red".into());
        planted.push((unknown, "chorus.colour"));
        let mut duplicate = doc(1, 0);
        duplicate.insert("chorus.replicas".into(), r#"["a","b","a"]"#.into());
        planted.push((duplicate, "chorus.replicas"));

        let mut version = Some(version);
        for (fields, field) in planted {
            let current = match version.take() {
                Some(created) => created,
                None => store.update(&read(store).await.0, &fields).await.unwrap(),
            };
            let error = Manifest::from_fields(&read(store).await.1).unwrap_err();
            assert_names(&error, field);
            expect_init_invalid(initialize(store, replicas(), WINDOW).await, field);
            let result = transform(store, DEFAULT_MAX_ROUNDS, |m| claim(m, OwnerId(1))).await;
            expect_transform_invalid(result, field);
            assert_eq!(
                read(store).await,
                (current, fields),
                "refusing a malformed register modifies nothing"
            );
        }
    }

    pub async fn garbage_document_gives_a_clear_error(backend: Backend) {
        let Some(fixture) = Fixture::new(backend).await else {
            return;
        };
        let store = fixture.register.as_ref();
        initialize(store, replicas(), WINDOW).await.unwrap();
        for garbage in ["this is not json {", r#"{"chorus.format": 1}"#, "[]", ""] {
            if !fixture.plant_raw(garbage).await {
                eprintln!("skipping: {backend:?} registers hold parsed fields, never raw bytes");
                return;
            }
            for _ in 0..2 {
                let error = store.read().await.expect_err("garbage does not read");
                let message = error.to_string();
                assert!(
                    matches!(error, RegisterError::Backend { .. }),
                    "{garbage:?}: terminal, not retried: {error:?}"
                );
                assert!(
                    message.contains("not a JSON object of strings"),
                    "{message}"
                );
                assert!(message.contains(store.name()), "{message}");
            }
            match initialize(store, replicas(), WINDOW).await {
                Err(InitError::Store(RegisterError::Backend { .. })) => {}
                other => panic!("initialize over garbage {garbage:?}: {other:?}"),
            }
            match transform(store, DEFAULT_MAX_ROUNDS, |m| claim(m, OwnerId(1))).await {
                Err(TransformError::Store(RegisterError::Backend { .. })) => {}
                other => panic!("transform over garbage {garbage:?}: {other:?}"),
            }
        }
    }
}

/// Instantiates every case of the contract for one backend, as `<backend>::<case>`.
macro_rules! contract {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;

            macro_rules! case {
                ($name:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                    async fn $name() {
                        cases::$name($backend).await;
                    }
                };
            }

            case!(read_before_create_is_none);
            case!(create_once_then_already_exists);
            case!(update_with_current_version_succeeds);
            case!(update_with_stale_version_conflicts);
            case!(update_of_a_missing_register_conflicts);
            case!(versions_from_read_match);
            case!(concurrent_creators_exactly_one_wins);
            case!(concurrent_updates_exactly_one_wins);
            case!(concurrent_transforms_each_apply_once);
            case!(lost_cas_response_applies_once);
            case!(initialize_creates_then_reports_existing);
            case!(initialize_refuses_other_replicas);
            case!(initialize_after_a_lost_create_response_finds_it);
            case!(invalid_document_is_refused_naming_the_field);
            case!(garbage_document_gives_a_clear_error);
        }
    };
}

contract!(memory, Backend::Memory);
contract!(sqlite, Backend::Sqlite);
contract!(postgres, Backend::Postgres);
contract!(object_local, Backend::ObjectLocal);
contract!(object_s3, Backend::ObjectS3);
contract!(object_azure, Backend::ObjectAzure);
