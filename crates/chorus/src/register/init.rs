//! Creating a register, or checking an existing one, for a replica list.

use super::{
    Committed, Manifest, ManifestError, ManifestStore, RegisterError, check_binding,
    check_directory_capacity,
};

/// What [`initialize`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Initialized {
    /// The register was created by this call.
    Created(Committed),
    /// The register already existed, bound to the same replicas.
    Existing(Committed),
}

/// Why [`initialize`] failed.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] RegisterError),
    /// The existing register is malformed, or bound to other replicas, or the
    /// requested settings are invalid.
    #[error(transparent)]
    Invalid(#[from] ManifestError),
}

/// Creates the register for `replicas` (identities, in order) with `window`, or,
/// if it exists, checks that it is bound to exactly these replicas. Never
/// modifies an existing register.
pub async fn initialize(
    store: &dyn ManifestStore,
    replicas: Vec<String>,
    window: u32,
) -> Result<Initialized, InitError> {
    if let Some(existing) = read_existing(store, &replicas).await? {
        return Ok(Initialized::Existing(existing));
    }
    let manifest = Manifest::initial(replicas.clone(), window);
    let fields = manifest.to_fields()?;
    check_directory_capacity(&manifest, store.max_directory_bytes())?;
    match store.create(&fields).await {
        Ok(version) => Ok(Initialized::Created(Committed { manifest, version })),
        // A concurrent creator won: accept its register if it binds the same replicas.
        Err(RegisterError::AlreadyExists { .. }) => match read_existing(store, &replicas).await? {
            Some(existing) => Ok(Initialized::Existing(existing)),
            None => {
                Err(RegisterError::backend(store.name(), "register vanished after create").into())
            }
        },
        Err(error) => Err(error.into()),
    }
}

async fn read_existing(
    store: &dyn ManifestStore,
    replicas: &[String],
) -> Result<Option<Committed>, InitError> {
    let Some(current) = store.read().await? else {
        return Ok(None);
    };
    let manifest = Manifest::from_fields(&current.fields)?;
    check_binding(&manifest.replicas, replicas)?;
    Ok(Some(Committed {
        manifest,
        version: current.version,
    }))
}
