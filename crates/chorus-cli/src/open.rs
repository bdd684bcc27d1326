//! Opening an existing log for a command: the register first (so a missing log
//! creates nothing), then the replica binding check, then every replica.

use std::sync::Arc;

use chorus::blob::{DynBlobStore, open_store_unprobed};
use chorus::log::maintenance::first_log_object;
use chorus::log::probe::{PROBE_GRACE, probe_quorum};
use chorus::log::{LogStores, Reader};
use chorus::register::{Manifest, ManifestStore, OpenMode, check_binding, open_register};

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

/// Opens the register at `location`, which must already hold a log; for
/// [`Access::Read`] without writing anything.
pub async fn open_existing_register(
    location: &Location,
    access: Access,
) -> Result<Arc<dyn ManifestStore>, CommandError> {
    let mode = match access {
        Access::Write => OpenMode::MustExist,
        Access::Read => OpenMode::ReadOnly,
    };
    match open_register(&location.register, mode).await {
        Ok(register) => Ok(register),
        // A busy or unreachable register exists: `init` would not help.
        Err(e) if e.is_transient() => {
            Err(format!("cannot open register {}: {e}", location.register).into())
        }
        Err(e) => {
            let hint = missing_log_hint(location).await;
            Err(format!("cannot open register {}: {e}; {hint}", location.register).into())
        }
    }
}

/// A decoded register as stored.
pub struct StoredManifest {
    /// The decoded record.
    pub manifest: Manifest,
    /// The register's version, as text.
    pub version: String,
    /// The register format it is stored in (a build reads older ones and
    /// writes its own on the next change).
    pub format: u32,
}

/// Reads and decodes the register.
pub async fn read_manifest(
    register: &dyn ManifestStore,
    location: &Location,
) -> Result<StoredManifest, CommandError> {
    let current = match register.read().await {
        Ok(current) => current,
        Err(e) if e.is_transient() => {
            return Err(format!("cannot read register {}: {e}", location.register).into());
        }
        Err(e) => {
            let hint = lost_register_hint(location)
                .await
                .map(|hint| format!("; {hint}"))
                .unwrap_or_default();
            return Err(format!("cannot read register {}: {e}{hint}", location.register).into());
        }
    };
    let Some(current) = current else {
        let hint = missing_log_hint(location).await;
        return Err(format!("no log at register {}; {hint}", location.register).into());
    };
    let malformed = |e| format!("malformed register {}: {e}", location.register);
    let manifest = Manifest::from_fields(&current.fields).map_err(malformed)?;
    let format = Manifest::stored_format(&current.fields).map_err(malformed)?;
    Ok(StoredManifest {
        manifest,
        version: current.version.to_string(),
        format,
    })
}

/// What to do about a register that holds no log: create one, unless the
/// replicas already hold a log, whose register must then be restored (a new
/// one would start the log over; `log init` refuses).
async fn missing_log_hint(location: &Location) -> String {
    lost_register_hint(location)
        .await
        .unwrap_or_else(|| "run `chorus log init` first".to_owned())
}

/// If a replica holds log data, says that the register was lost or damaged
/// and must be restored.
async fn lost_register_hint(location: &Location) -> Option<String> {
    for url in &location.replicas {
        // A local replica that does not exist holds nothing; opening it would create it.
        if url
            .local_dir()
            .is_some_and(|dir| !std::path::Path::new(dir).is_dir())
        {
            continue;
        }
        let found = match open_store_unprobed(url) {
            Ok(store) => first_log_object(&store).await.ok().flatten(),
            Err(_) => None,
        };
        if let Some(key) = found {
            return Some(format!(
                "replica {url} holds log data ({key}), so the register was lost or damaged: \
                 restore it from a backup, or rebuild it with `chorus log recover-register` \
                 (docs/operations.md, \"Lost or corrupt register\"); `chorus log init` refuses \
                 replicas that hold a log"
            ));
        }
    }
    None
}

/// Opens the log at `location`: the register, a check that it binds exactly
/// these replicas in this order, then every replica (concurrently).
///
/// For writing, every replica is probed; a replica that is unreachable (a
/// transient failure) is tolerated as long as a quorum probes fine, because the
/// protocol runs on Q replicas; a replica that answers but does not enforce
/// conditional writes is always refused.
pub async fn open_log(location: &Location, access: Access) -> Result<OpenedLog, CommandError> {
    let register = open_existing_register(location, access).await?;
    let manifest = read_manifest(register.as_ref(), location).await?.manifest;
    let identities = location.replica_identities();
    check_binding(&manifest.replicas, &identities)
        .map_err(|e| format!("replicas do not match register {}: {e}", location.register))?;
    let stores = open_replicas_unprobed(location)?;
    let replicas: Vec<_> = identities.into_iter().zip(stores).collect();
    if access == Access::Write {
        for replica in probe_quorum(&replicas, PROBE_GRACE).await? {
            tracing::warn!(%replica, "replica unreachable; continuing on the others");
        }
    }
    let stores = LogStores { replicas, register };
    check_floor(&stores, &manifest, location).await?;
    Ok(OpenedLog { stores, manifest })
}

/// Every replica of `location`, opened without the probe (which writes).
pub fn open_replicas_unprobed(location: &Location) -> Result<Vec<DynBlobStore>, CommandError> {
    let stores = location
        .replicas
        .iter()
        .map(|url| open_store_unprobed(url).map_err(|e| format!("cannot open replica {url}: {e}")))
        .collect::<Result<Vec<DynBlobStore>, String>>()?;
    Ok(stores)
}

/// The floor may be above the sealed directory's end (truncation below a
/// snapshot in the active segment), but never above the committed end: a
/// register whose floor is, does not describe these replicas (or was
/// edited), and every reader would see an empty log while appends fail.
async fn check_floor(
    stores: &LogStores,
    manifest: &Manifest,
    location: &Location,
) -> Result<(), CommandError> {
    let beyond = Reader::floor_beyond_end(stores)
        .await
        .map_err(|e| format!("cannot read the active segment: {e}"))?;
    if let Some(end) = beyond {
        return Err(format!(
            "inconsistent register {}: field=chorus.trunc: the floor {} is beyond the log's \
             committed end {end}; the register does not describe these replicas (restore it \
             from a backup, docs/operations.md, \"Lost or corrupt register\")",
            location.register, manifest.trunc
        )
        .into());
    }
    Ok(())
}
