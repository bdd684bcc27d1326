//! Probed stores for backend-parameterised tests: memory, a local directory,
//! and an S3-compatible server from the test services.

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
