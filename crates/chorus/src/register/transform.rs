//! The CAS-transform loop every register transition goes through.
//!
//! Each round reads and validates the current record, then asks the transition
//! whether it is already applied (which makes a lost CAS response harmless: the
//! next round sees our own write) and otherwise what to write. A conflict or a
//! transient error starts a new round; rounds are bounded.

use std::time::Duration;

use super::{
    Manifest, ManifestError, ManifestStore, RegisterError, RegisterVersion,
    check_directory_capacity,
};

/// Default bound on CAS rounds per transition.
pub const DEFAULT_MAX_ROUNDS: u32 = 16;

/// First delay after a transient error; doubles per round, capped.
const BACKOFF_START: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_millis(500);

/// What a transition decides after seeing the current record.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // built once per CAS round; boxing buys nothing
pub enum Step {
    /// The transition is already reflected in the record; write nothing.
    Done,
    /// Replace the record with this one.
    Write(Manifest),
}

/// The record as the transition left it, with its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The current record.
    pub manifest: Manifest,
    /// Its register version.
    pub version: RegisterVersion,
}

/// Why a transition did not commit.
#[derive(Debug, thiserror::Error)]
pub enum TransformError<E> {
    /// The transition itself refused (for example: fenced by a newer epoch).
    #[error(transparent)]
    Rejected(E),
    /// The register has never been created.
    #[error("register not initialized: register={register}")]
    NotInitialized {
        /// Register name.
        register: String,
    },
    /// The stored record, or the one the transition produced, is invalid.
    #[error(transparent)]
    Invalid(#[from] ManifestError),
    /// The store failed terminally, or transiently in every round.
    #[error(transparent)]
    Store(#[from] RegisterError),
    /// Every round lost its CAS to a concurrent writer.
    #[error("register contended: gave up after {rounds} rounds: register={register}")]
    Contended {
        /// Rounds tried.
        rounds: u32,
        /// Register name.
        register: String,
    },
}

/// Applies `decide` to the register by CAS, for at most `max_rounds` rounds.
pub async fn transform<E>(
    store: &dyn ManifestStore,
    max_rounds: u32,
    mut decide: impl FnMut(&Manifest) -> Result<Step, E>,
) -> Result<Committed, TransformError<E>> {
    let mut backoff = BACKOFF_START;
    let mut last_transient = None;
    for round in 0..max_rounds {
        if round > 0 && last_transient.is_some() {
            sleep_backoff(&mut backoff).await;
        }
        let current = match store.read().await {
            Ok(Some(current)) => current,
            Ok(None) => {
                return Err(TransformError::NotInitialized {
                    register: store.name().to_owned(),
                });
            }
            Err(error) if error.is_transient() => {
                last_transient = Some(error);
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        let manifest = Manifest::from_fields(&current.fields)?;
        let next = match decide(&manifest).map_err(TransformError::Rejected)? {
            Step::Done => {
                return Ok(Committed {
                    manifest,
                    version: current.version,
                });
            }
            Step::Write(next) => next,
        };
        let fields = next.to_fields()?;
        check_directory_capacity(&next, store.max_directory_bytes())?;
        let started = tokio::time::Instant::now();
        let updated = store.update(&current.version, &fields).await;
        record_cas(started.elapsed(), &updated);
        match updated {
            Ok(version) => {
                return Ok(Committed {
                    manifest: next,
                    version,
                });
            }
            Err(RegisterError::Conflict { .. }) => last_transient = None,
            Err(error) if error.is_transient() => last_transient = Some(error),
            Err(error) => return Err(error.into()),
        }
    }
    Err(match last_transient {
        Some(error) => TransformError::Store(error),
        None => TransformError::Contended {
            rounds: max_rounds,
            register: store.name().to_owned(),
        },
    })
}

/// Metrics of one CAS: attempts, conflicts and latency.
fn record_cas<T>(elapsed: Duration, outcome: &Result<T, RegisterError>) {
    metrics::counter!("chorus_manifest_cas_attempts_total").increment(1);
    if matches!(outcome, Err(RegisterError::Conflict { .. })) {
        metrics::counter!("chorus_manifest_cas_conflicts_total").increment(1);
    }
    metrics::histogram!("chorus_manifest_cas_seconds").record(elapsed.as_secs_f64());
}

async fn sleep_backoff(backoff: &mut Duration) {
    tokio::time::sleep(*backoff).await;
    *backoff = (*backoff * 2).min(BACKOFF_MAX);
}

#[cfg(test)]
mod tests {
    //! The CAS loop: Done writes nothing, Write commits, conflicts re-decide, a
    //! lost CAS response resolves through "already applied?", and errors come
    //! out as the right variant.

    use std::fmt;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;

    use super::*;
    use crate::blob::{Fault, FaultController, FaultRule, Op, OpSet};
    use crate::ids::{Epoch, OwnerId};
    use crate::register::manifest::tests::{assert_field, replicas, rich};
    use crate::register::{FaultyRegister, Fields, MemoryRegister, VersionedManifest};

    #[derive(Debug, PartialEq, Eq)]
    struct Refused(&'static str);

    impl fmt::Display for Refused {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Refused {}

    /// The "claim epoch" transition: done once `owner` holds the epoch, else
    /// claim the next one.
    fn claim(current: &Manifest, owner: OwnerId) -> Step {
        if current.owner == owner {
            return Step::Done;
        }
        Step::Write(Manifest {
            epoch: current.epoch.next().expect("epoch overflow"),
            owner,
            ..current.clone()
        })
    }

    async fn created(store: &dyn ManifestStore) -> RegisterVersion {
        let fields = Manifest::initial(replicas(3), 4).to_fields().unwrap();
        store.create(&fields).await.unwrap()
    }

    async fn read(store: &dyn ManifestStore) -> VersionedManifest {
        store.read().await.unwrap().expect("register exists")
    }

    /// A register where another writer claims the next epoch right before
    /// each of our first `interpose` updates lands.
    #[derive(Debug)]
    struct Rival {
        inner: MemoryRegister,
        interpose: AtomicU32,
        owner: OwnerId,
    }

    impl Rival {
        fn new(inner: MemoryRegister, interpose: u32) -> Rival {
            Rival {
                inner,
                interpose: AtomicU32::new(interpose),
                owner: OwnerId(0xbad),
            }
        }
    }

    #[async_trait]
    impl ManifestStore for Rival {
        fn name(&self) -> &str {
            "rival-register"
        }

        async fn read(&self) -> Result<Option<VersionedManifest>, RegisterError> {
            self.inner.read().await
        }

        async fn create(&self, fields: &Fields) -> Result<RegisterVersion, RegisterError> {
            self.inner.create(fields).await
        }

        async fn update(
            &self,
            version: &RegisterVersion,
            fields: &Fields,
        ) -> Result<RegisterVersion, RegisterError> {
            let interpose = self
                .interpose
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if interpose {
                let current = read(&self.inner).await;
                let manifest = Manifest::from_fields(&current.fields).unwrap();
                let mut next = manifest.clone();
                next.epoch = manifest.epoch.next().unwrap();
                next.owner = self.owner;
                self.inner
                    .update(&current.version, &next.to_fields().unwrap())
                    .await
                    .expect("rival's CAS wins");
            }
            self.inner.update(version, fields).await
        }

        fn max_directory_bytes(&self) -> usize {
            self.inner.max_directory_bytes()
        }
    }

    #[tokio::test]
    async fn done_writes_nothing() {
        let store = MemoryRegister::new();
        let created = created(&store).await;
        let faulty = FaultyRegister::new(Arc::new(store.clone()), FaultController::new(1));
        let committed = transform(&faulty, DEFAULT_MAX_ROUNDS, |_| {
            Ok::<_, Refused>(Step::Done)
        })
        .await
        .unwrap();
        assert_eq!(committed.version, created);
        assert_eq!(committed.manifest, Manifest::initial(replicas(3), 4));
        assert_eq!(faulty.controller().calls(Op::Update), 0);
        assert_eq!(faulty.controller().calls(Op::Get), 1);
        assert_eq!(read(&store).await.version, created);
    }

    #[tokio::test]
    async fn write_commits() {
        let store = MemoryRegister::new();
        let created = created(&store).await;
        let me = OwnerId(42);
        let committed = transform(&store, DEFAULT_MAX_ROUNDS, |m| {
            Ok::<_, Refused>(claim(m, me))
        })
        .await
        .unwrap();
        assert_eq!(committed.manifest.epoch, Epoch(1));
        assert_eq!(committed.manifest.owner, me);
        assert_ne!(committed.version, created);
        let stored = read(&store).await;
        assert_eq!(stored.version, committed.version);
        assert_eq!(stored.version.to_string(), "2");
        assert_eq!(
            Manifest::from_fields(&stored.fields).unwrap(),
            committed.manifest
        );
    }

    #[tokio::test]
    async fn conflicting_writer_causes_a_retry_that_re_decides() {
        let memory = MemoryRegister::new();
        created(&memory).await;
        let store = Rival::new(memory.clone(), 1);
        let me = OwnerId(42);
        let mut seen = Vec::new();
        let committed = transform(&store, DEFAULT_MAX_ROUNDS, |m| {
            seen.push((m.epoch, m.owner));
            Ok::<_, Refused>(claim(m, me))
        })
        .await
        .unwrap();
        // Round 1 decided on epoch 0 and lost; round 2 saw the rival's epoch 1.
        assert_eq!(
            seen,
            vec![(Epoch(0), OwnerId::NONE), (Epoch(1), store.owner)]
        );
        assert_eq!(committed.manifest.epoch, Epoch(2));
        assert_eq!(committed.manifest.owner, me);
        let stored = read(&memory).await;
        assert_eq!(stored.version, committed.version);
        assert_eq!(stored.version.to_string(), "3");
    }

    #[tokio::test]
    async fn lost_cas_response_resolves_to_done_and_applies_once() {
        let memory = MemoryRegister::new();
        let created = created(&memory).await;
        let controller = FaultController::new(7);
        controller.add(
            FaultRule::new(Fault::FailAfter)
                .ops(OpSet::of(&[Op::Update]))
                .times(1),
        );
        let faulty = FaultyRegister::new(Arc::new(memory.clone()), controller.clone());
        let me = OwnerId(42);
        let mut steps = Vec::new();
        let committed = transform(&faulty, DEFAULT_MAX_ROUNDS, |m| {
            let step = claim(m, me);
            steps.push(step.clone());
            Ok::<_, Refused>(step)
        })
        .await
        .unwrap();
        // Round 1 wrote (and lost the response); round 2 found it applied.
        assert_eq!(steps.len(), 2);
        assert!(matches!(steps[0], Step::Write(_)));
        assert_eq!(steps[1], Step::Done);
        assert_eq!(controller.calls(Op::Update), 1);
        assert_eq!(controller.injected(), 1);
        assert_eq!(committed.manifest.epoch, Epoch(1));
        assert_eq!(committed.manifest.owner, me);
        let stored = read(&memory).await;
        assert_ne!(stored.version, created);
        assert_eq!(stored.version, committed.version);
        // The counter advanced exactly once: 1 (create) -> 2.
        assert_eq!(stored.version.to_string(), "2");
    }

    #[tokio::test]
    async fn rejection_passes_through_and_writes_nothing() {
        let store = MemoryRegister::new();
        let created = created(&store).await;
        let error = transform(&store, DEFAULT_MAX_ROUNDS, |_| {
            Err(Refused("fenced by epoch 9"))
        })
        .await
        .unwrap_err();
        assert!(matches!(
            error,
            TransformError::Rejected(Refused("fenced by epoch 9"))
        ));
        assert_eq!(error.to_string(), "fenced by epoch 9");
        assert_eq!(read(&store).await.version, created);
    }

    #[tokio::test]
    async fn missing_register_is_not_initialized() {
        let store = MemoryRegister::new();
        let mut decided = false;
        let error = transform(&store, DEFAULT_MAX_ROUNDS, |_| {
            decided = true;
            Ok::<_, Refused>(Step::Done)
        })
        .await
        .unwrap_err();
        assert!(!decided);
        match &error {
            TransformError::NotInitialized { register } => assert_eq!(register, store.name()),
            other => panic!("expected NotInitialized, got {other:?}"),
        }
        assert!(error.to_string().contains("not initialized"), "{error}");
        assert!(store.read().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn invalid_stored_record_is_refused_before_deciding() {
        let store = MemoryRegister::new();
        let mut fields = Manifest::initial(replicas(3), 4).to_fields().unwrap();
        fields.insert("chorus.window".into(), "0".into());
        let created = store.create(&fields).await.unwrap();
        let mut decided = false;
        let error = transform(&store, DEFAULT_MAX_ROUNDS, |_| {
            decided = true;
            Ok::<_, Refused>(Step::Done)
        })
        .await
        .unwrap_err();
        assert!(!decided);
        let TransformError::Invalid(invalid) = error else {
            panic!("expected Invalid, got {error:?}");
        };
        assert_field(Err::<(), _>(invalid), "chorus.window");
        assert_eq!(read(&store).await.version, created);
    }

    #[tokio::test]
    async fn invalid_next_record_is_refused_and_not_written() {
        let store = MemoryRegister::new();
        let created = created(&store).await;
        let error = transform(&store, DEFAULT_MAX_ROUNDS, |m| {
            Ok::<_, Refused>(Step::Write(Manifest {
                owner: OwnerId(5),
                ..m.clone()
            }))
        })
        .await
        .unwrap_err();
        let TransformError::Invalid(invalid) = error else {
            panic!("expected Invalid, got {error:?}");
        };
        assert_field(Err::<(), _>(invalid), "chorus.owner");
        assert_eq!(read(&store).await.version, created);
    }

    #[tokio::test]
    async fn directory_beyond_capacity_is_refused_and_not_written() {
        let rich = rich();
        let capacity = rich.to_fields().unwrap()["chorus.segments"].len() - 1;
        let store = MemoryRegister::with_capacity(capacity);
        let created = created(&store).await;
        let next = Manifest {
            replicas: replicas(3),
            window: 4,
            ..rich
        };
        let error = transform(&store, DEFAULT_MAX_ROUNDS, |_| {
            Ok::<_, Refused>(Step::Write(next.clone()))
        })
        .await
        .unwrap_err();
        let TransformError::Invalid(invalid) = error else {
            panic!("expected Invalid, got {error:?}");
        };
        let message = assert_field(Err::<(), _>(invalid), "chorus.segments").to_string();
        assert!(message.contains("capacity"), "{message}");
        assert_eq!(read(&store).await.version, created);
    }

    #[tokio::test]
    async fn losing_every_round_is_contended() {
        let memory = MemoryRegister::new();
        created(&memory).await;
        let store = Rival::new(memory.clone(), u32::MAX);
        let me = OwnerId(42);
        let decisions = Mutex::new(0u32);
        let error = transform(&store, 5, |m| {
            *decisions.lock().unwrap() += 1;
            Ok::<_, Refused>(claim(m, me))
        })
        .await
        .unwrap_err();
        match &error {
            TransformError::Contended { rounds, register } => {
                assert_eq!(*rounds, 5);
                assert_eq!(register, "rival-register");
            }
            other => panic!("expected Contended, got {other:?}"),
        }
        assert!(error.to_string().contains("5 rounds"), "{error}");
        assert_eq!(*decisions.lock().unwrap(), 5);
        // Only the rival's five claims landed.
        let stored = Manifest::from_fields(&read(&memory).await.fields).unwrap();
        assert_eq!(stored.epoch, Epoch(5));
        assert_eq!(stored.owner, store.owner);
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failure_in_every_round_gives_up_with_the_store_error() {
        let memory = MemoryRegister::new();
        let created = created(&memory).await;
        let controller = FaultController::new(3);
        controller.add(FaultRule::new(Fault::FailBefore).ops(OpSet::of(&[Op::Update])));
        let faulty = FaultyRegister::new(Arc::new(memory.clone()), controller.clone());
        let started = tokio::time::Instant::now();
        let error = transform(&faulty, DEFAULT_MAX_ROUNDS, |m| {
            Ok::<_, Refused>(claim(m, OwnerId(42)))
        })
        .await
        .unwrap_err();
        assert!(
            matches!(
                error,
                TransformError::Store(RegisterError::Unavailable { .. })
            ),
            "{error:?}"
        );
        assert!(error.to_string().contains("injected fault"), "{error}");
        assert_eq!(controller.calls(Op::Update), u64::from(DEFAULT_MAX_ROUNDS));
        assert_eq!(read(&memory).await.version, created);
        // Every failed round backs off, from BACKOFF_START up to BACKOFF_MAX.
        let waited = started.elapsed();
        assert!(waited >= BACKOFF_START * DEFAULT_MAX_ROUNDS, "{waited:?}");
        assert!(waited <= BACKOFF_MAX * DEFAULT_MAX_ROUNDS, "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_retried() {
        let memory = MemoryRegister::new();
        created(&memory).await;
        let controller = FaultController::new(4);
        controller.add(
            FaultRule::new(Fault::FailBefore)
                .ops(OpSet::of(&[Op::Get]))
                .times(2),
        );
        controller.add(
            FaultRule::new(Fault::FailBefore)
                .ops(OpSet::of(&[Op::Update]))
                .times(2),
        );
        let faulty = FaultyRegister::new(Arc::new(memory.clone()), controller.clone());
        let committed = transform(&faulty, DEFAULT_MAX_ROUNDS, |m| {
            Ok::<_, Refused>(claim(m, OwnerId(42)))
        })
        .await
        .unwrap();
        assert_eq!(committed.manifest.epoch, Epoch(1));
        assert_eq!(controller.calls(Op::Update), 3);
        assert_eq!(read(&memory).await.version.to_string(), "2");
    }

    #[tokio::test]
    async fn terminal_store_error_is_not_retried() {
        #[derive(Debug)]
        struct Broken;

        #[async_trait]
        impl ManifestStore for Broken {
            fn name(&self) -> &str {
                "broken"
            }
            async fn read(&self) -> Result<Option<VersionedManifest>, RegisterError> {
                Err(RegisterError::backend("broken", "permission denied"))
            }
            async fn create(&self, _: &Fields) -> Result<RegisterVersion, RegisterError> {
                unreachable!()
            }
            async fn update(
                &self,
                _: &RegisterVersion,
                _: &Fields,
            ) -> Result<RegisterVersion, RegisterError> {
                unreachable!()
            }
            fn max_directory_bytes(&self) -> usize {
                0
            }
        }

        let error = transform(&Broken, DEFAULT_MAX_ROUNDS, |_| {
            Ok::<_, Refused>(Step::Done)
        })
        .await
        .unwrap_err();
        assert!(
            matches!(error, TransformError::Store(RegisterError::Backend { .. })),
            "{error:?}"
        );
        assert!(error.to_string().contains("permission denied"), "{error}");
    }
}
