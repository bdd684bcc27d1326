//! Opening an existing log for a command: the register first (so a missing log
//! creates nothing), then the replica binding check, then every replica.

use std::sync::Arc;

use chorus::blob::{DynBlobStore, StoreUrl, open_store, open_store_unprobed};
use chorus::log::LogStores;
use chorus::register::{Manifest, ManifestStore, OpenMode, check_binding, open_register};
use futures::future::try_join_all;

use crate::CommandError;
use crate::config::Location;

/// What a command does to the log, which decides how its replicas are opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Writes (recovery, appends): every replica must pass the capability probe.
    Write,
    /// Only reads: no probe, because the probe writes and a reader never does.
    Read,
}

/// An opened log: its stores and the register as it was when opened.
#[derive(Debug)]
pub struct OpenedLog {
    /// Replicas and register, ready for the library.
    pub stores: LogStores,
    /// The register's contents at open time.
    pub manifest: Manifest,
}

/// Opens the register at `location`, which must already hold a log.
pub async fn open_existing_register(
    location: &Location,
) -> Result<Arc<dyn ManifestStore>, CommandError> {
    let register = open_register(&location.register, OpenMode::MustExist)
        .await
        .map_err(|e| {
            format!(
                "cannot open register {}: {e}; run `chorus log init` first",
                location.register
            )
        })?;
    Ok(register)
}

/// Reads and decodes the register; returns the manifest and its version.
pub async fn read_manifest(
    register: &dyn ManifestStore,
    location: &Location,
) -> Result<(Manifest, String), CommandError> {
    let current = register
        .read()
        .await
        .map_err(|e| format!("cannot read register {}: {e}", location.register))?
        .ok_or_else(|| {
            format!(
                "no log at register {}; run `chorus log init` first",
                location.register
            )
        })?;
    let manifest = Manifest::from_fields(&current.fields)
        .map_err(|e| format!("malformed register {}: {e}", location.register))?;
    Ok((manifest, current.version.to_string()))
}

/// Opens the log at `location`: the register, a check that it binds exactly
/// these replicas in this order, then every replica (concurrently).
pub async fn open_log(location: &Location, access: Access) -> Result<OpenedLog, CommandError> {
    let register = open_existing_register(location).await?;
    let (manifest, _) = read_manifest(register.as_ref(), location).await?;
    let identities = location.replica_identities();
    check_binding(&manifest.replicas, &identities)
        .map_err(|e| format!("replicas do not match register {}: {e}", location.register))?;
    let stores = try_join_all(
        location
            .replicas
            .iter()
            .map(|url| open_replica(url, access)),
    )
    .await?;
    let replicas = identities.into_iter().zip(stores).collect();
    Ok(OpenedLog {
        stores: LogStores { replicas, register },
        manifest,
    })
}

async fn open_replica(url: &StoreUrl, access: Access) -> Result<DynBlobStore, CommandError> {
    let opened = match access {
        Access::Write => open_store(url).await,
        Access::Read => open_store_unprobed(url),
    };
    Ok(opened.map_err(|e| format!("cannot open replica {url}: {e}"))?)
}
