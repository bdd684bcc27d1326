//! Register fixtures for the integration tests: a fresh, empty register per
//! call on each backend, a way to open more independent handles on the same
//! register (as other processes would), and a way to plant a raw stored
//! document behind the register's back.
//!
//! Include next to `mod support;`:
//! `#[path = "support/register.rs"] mod register_support;`

#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use chorus::blob::{StoreUrl, open_store, open_store_unprobed};
use chorus::register::{
    ManifestStore, MemoryRegister, ObjectRegister, OpenMode, RegisterUrl, open_register,
};
use tempfile::TempDir;

use crate::support;

/// The key the object backend keeps its document under (`register::object`).
pub const OBJECT_REGISTER_KEY: &str = "manifest.json";

/// The register backends under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// [`MemoryRegister`].
    Memory,
    /// [`chorus::register::SqliteRegister`] in a temp dir.
    Sqlite,
    /// [`chorus::register::PostgresRegister`] on the test server.
    Postgres,
    /// [`ObjectRegister`] over a `LocalDirStore` in a temp dir.
    ObjectLocal,
    /// [`ObjectRegister`] over a moto S3 store.
    ObjectS3,
    /// [`ObjectRegister`] over Azurite (the Azure Blob Storage emulator).
    ObjectAzure,
}

impl Backend {
    /// Whether versions are the SQL/in-memory update counter (1 after create).
    pub fn counts_versions(self) -> bool {
        matches!(self, Backend::Memory | Backend::Sqlite | Backend::Postgres)
    }
}

/// Where a fixture's register lives.
enum Location {
    Memory(MemoryRegister),
    Sqlite {
        _dir: TempDir,
        path: PathBuf,
        register: String,
    },
    Postgres {
        url: String,
        connection: String,
        register: String,
    },
    Object {
        url: StoreUrl,
        _dir: Option<TempDir>,
    },
}

/// A fresh register (never created) on one backend.
pub struct Fixture {
    /// The backend.
    pub backend: Backend,
    /// The first handle on the register.
    pub register: Arc<dyn ManifestStore>,
    location: Location,
}

impl Fixture {
    /// A fresh register on `backend`, or `None` (after printing "skipping: …")
    /// when the backend's service is not configured outside CI.
    pub async fn new(backend: Backend) -> Option<Fixture> {
        let location = match backend {
            Backend::Memory => Location::Memory(MemoryRegister::new()),
            Backend::Sqlite => {
                let dir = TempDir::new().expect("temp dir");
                let path = dir.path().join("register.db");
                Location::Sqlite {
                    _dir: dir,
                    path,
                    register: support::unique("contract"),
                }
            }
            Backend::Postgres => {
                let url = support::postgres_register_url("contract")?;
                let parsed: RegisterUrl = url.parse().expect("postgres register URL parses");
                let RegisterUrl::Postgres {
                    connection,
                    register,
                } = parsed
                else {
                    panic!("{url} is not a postgres register URL");
                };
                Location::Postgres {
                    url,
                    connection,
                    register,
                }
            }
            Backend::ObjectLocal => {
                let dir = TempDir::new().expect("temp dir");
                Location::Object {
                    url: StoreUrl::local(dir.path()),
                    _dir: Some(dir),
                }
            }
            Backend::ObjectS3 => {
                let urls = support::s3_urls("register-contract")?;
                // Spread the rounds over the zones; each is an independent server.
                let url = &urls[rand::random_range(0..urls.len())];
                Location::Object {
                    url: url.parse().expect("s3 URL parses"),
                    _dir: None,
                }
            }
            Backend::ObjectAzure => Location::Object {
                url: support::azure_url("register-contract")?
                    .parse()
                    .expect("az URL parses"),
                _dir: None,
            },
        };
        let register = open(&location, true).await;
        Some(Fixture {
            backend,
            register,
            location,
        })
    }

    /// Another independent handle on the same register: its own connection,
    /// client or store handle, as another process would have.
    pub async fn handle(&self) -> Arc<dyn ManifestStore> {
        open(&self.location, false).await
    }

    /// Replaces the stored document with `raw` bytes behind the register's
    /// back (the register must exist). Returns `false` where the backend has
    /// no raw representation (in-memory registers hold parsed fields).
    pub async fn plant_raw(&self, raw: &str) -> bool {
        match &self.location {
            Location::Memory(_) => false,
            Location::Sqlite { path, register, .. } => {
                let connection = rusqlite::Connection::open(path).expect("open sqlite file");
                let changed = connection
                    .execute(
                        "UPDATE chorus_register SET version = version + 1, fields = ?1 WHERE name = ?2",
                        rusqlite::params![raw, register],
                    )
                    .expect("plant sqlite row");
                assert_eq!(changed, 1, "the register row exists");
                true
            }
            Location::Postgres {
                connection,
                register,
                ..
            } => {
                let (client, driver) = tokio_postgres::connect(connection, tokio_postgres::NoTls)
                    .await
                    .expect("connect to postgres");
                let driver = tokio::spawn(driver);
                let changed = client
                    .execute(
                        "UPDATE chorus_register SET version = version + 1, fields = $1 WHERE name = $2",
                        &[&raw, register],
                    )
                    .await
                    .expect("plant postgres row");
                assert_eq!(changed, 1, "the register row exists");
                drop(client);
                let _ = driver.await;
                true
            }
            Location::Object { url, .. } => {
                let store = open_store_unprobed(url).expect("open store");
                let current = store
                    .get(OBJECT_REGISTER_KEY)
                    .await
                    .expect("the register object exists under its key");
                store
                    .update(
                        OBJECT_REGISTER_KEY,
                        &current.version,
                        Bytes::copy_from_slice(raw.as_bytes()),
                    )
                    .await
                    .expect("plant register object");
                true
            }
        }
    }
}

/// Opens a handle on the register at `location`; `first` handles go through
/// the public URL opener (probing object stores), later ones skip the probe.
async fn open(location: &Location, first: bool) -> Arc<dyn ManifestStore> {
    match location {
        Location::Memory(register) => Arc::new(register.clone()),
        Location::Sqlite { path, register, .. } => {
            let url = RegisterUrl::Sqlite {
                path: path.clone(),
                register: register.clone(),
            };
            open_register(&url, OpenMode::CreateIfMissing)
                .await
                .expect("open sqlite register")
        }
        Location::Postgres { url, .. } => {
            let url: RegisterUrl = url.parse().expect("postgres register URL parses");
            open_register(&url, OpenMode::CreateIfMissing)
                .await
                .expect("open postgres register (is the test server running?)")
        }
        Location::Object { url, .. } if first => {
            let store = open_store(url)
                .await
                .expect("store opens and passes the probe");
            Arc::new(ObjectRegister::new(store))
        }
        Location::Object { url, .. } => Arc::new(ObjectRegister::new(
            open_store_unprobed(url).expect("open store"),
        )),
    }
}
