//! Probed stores for backend-parameterised tests: memory, a local directory,
//! an S3-compatible server and an Azure Blob Storage emulator (Azurite) from
//! the test services.

#![allow(dead_code)] // each test binary uses a different subset

use chorus::blob::{DynBlobStore, StoreUrl, open_store};
use tempfile::TempDir;

/// A store under test plus whatever must outlive it.
pub struct Fixture {
    /// The store.
    pub store: DynBlobStore,
    _dir: Option<TempDir>,
}

async fn open(url: &str, dir: Option<TempDir>) -> Fixture {
    let url: StoreUrl = url.parse().expect("test URL parses");
    let store = open_store(&url)
        .await
        .expect("store opens and passes the probe");
    Fixture { store, _dir: dir }
}

/// A fresh in-memory store.
pub async fn memory() -> Option<Fixture> {
    Some(
        open(
            &format!("memory://{}", crate::support::unique("fixture")),
            None,
        )
        .await,
    )
}

/// A fresh local-directory store in a temporary directory.
pub async fn local() -> Option<Fixture> {
    let dir = TempDir::new().expect("temp dir");
    let url = StoreUrl::local(dir.path()).to_string();
    Some(open(&url, Some(dir)).await)
}

/// A fresh prefix on the first S3 test server, or `None` (skip) outside CI.
pub async fn s3() -> Option<Fixture> {
    let urls = crate::support::s3_urls("fixture")?;
    Some(open(&urls[0], None).await)
}

/// A fresh prefix in the Azurite container, or `None` (skip) outside CI.
/// object_store reaches Azurite through `AZURE_STORAGE_USE_EMULATOR=true`,
/// which `scripts/services.sh` exports with the container's name.
pub async fn azure() -> Option<Fixture> {
    let url = crate::support::azure_url("fixture")?;
    Some(open(&url, None).await)
}
