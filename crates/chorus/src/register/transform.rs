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
    for _ in 0..max_rounds {
        let current = match store.read().await {
            Ok(Some(current)) => current,
            Ok(None) => {
                return Err(TransformError::NotInitialized {
                    register: store.name().to_owned(),
                });
            }
            Err(error) if error.is_transient() => {
                last_transient = Some(error);
                sleep_backoff(&mut backoff).await;
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
        match store.update(&current.version, &fields).await {
            Ok(version) => {
                return Ok(Committed {
                    manifest: next,
                    version,
                });
            }
            Err(RegisterError::Conflict { .. }) => last_transient = None,
            Err(error) if error.is_transient() => {
                last_transient = Some(error);
                sleep_backoff(&mut backoff).await;
            }
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

async fn sleep_backoff(backoff: &mut Duration) {
    tokio::time::sleep(*backoff).await;
    *backoff = (*backoff * 2).min(BACKOFF_MAX);
}
