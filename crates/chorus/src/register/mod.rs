//! The manifest register: one small versioned document that every control
//! decision of the log goes through by compare-and-swap (docs/overview.md, The
//! manifest register).
//!
//! - [`ManifestStore`] is the pluggable store, one contract for every backend:
//!   [`MemoryRegister`], [`ObjectRegister`] (a JSON object in any CAS-capable
//!   blob store), [`SqliteRegister`] (the embedded default) and
//!   [`PostgresRegister`].
//! - [`Manifest`] is the decoded record, with every invariant checked on decode
//!   and before every write ([`validate`]).
//! - [`transform`] is the bounded CAS loop every transition uses.

mod error;
mod faulty;
mod init;
mod manifest;
mod memory;
mod object;
mod open;
mod postgres;
mod seal_digest;
mod sql;
mod sqlite;
mod transform;
mod validate;

use std::collections::BTreeMap;
use std::fmt;

use async_trait::async_trait;

use crate::blob;

pub use error::{ManifestError, RegisterError};
pub use faulty::{FaultyRegister, REGISTER_FAULT_KEY};
pub use init::{InitError, Initialized, initialize};
pub(crate) use manifest::directory_bytes;
pub use manifest::{DirectoryEntry, FORMAT, Manifest, OLDEST_READABLE_FORMAT, Seal};
pub use memory::MemoryRegister;
pub use object::{ObjectRegister, decode_document, encode_document};
pub use open::{DEFAULT_REGISTER_NAME, OpenMode, RegisterUrl, RegisterUrlError, open_register};
pub use postgres::PostgresRegister;
pub use seal_digest::{SealDigest, SealHasher};
pub use sqlite::SqliteRegister;
pub use transform::{Committed, DEFAULT_MAX_ROUNDS, Step, TransformError, transform};
pub use validate::{DEFAULT_WINDOW, MAX_WINDOW, check_binding, check_directory_capacity, validate};

/// The register's raw contents: field name to value, ordered for stable encoding.
pub type Fields = BTreeMap<String, String>;

/// Default capacity for the sealed directory, in bytes of its encoded field.
pub const DEFAULT_MAX_DIRECTORY_BYTES: usize = 1024 * 1024;

/// The version of a register document. Totally ordered per register; opaque to
/// callers, who only hand it back to [`ManifestStore::update`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterVersion(VersionToken);

#[derive(Debug, Clone, PartialEq, Eq)]
enum VersionToken {
    /// SQL and in-memory backends count updates.
    Counter(u64),
    /// The object backend uses the blob's version token.
    Blob(blob::Version),
}

impl fmt::Display for RegisterVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            VersionToken::Counter(counter) => write!(f, "{counter}"),
            VersionToken::Blob(version) => write!(f, "{version}"),
        }
    }
}

/// A register document with the version it was read at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionedManifest {
    /// The version to name in a CAS.
    pub version: RegisterVersion,
    /// The raw fields.
    pub fields: Fields,
}

/// The store behind the manifest register.
///
/// A call that fails with [`RegisterError::Unavailable`] may have applied:
/// callers re-read and re-decide. Implementations never retry internally in a
/// way that could apply one logical update twice.
#[async_trait]
pub trait ManifestStore: Send + Sync + fmt::Debug + 'static {
    /// A printable name for errors: the register URL without secrets.
    fn name(&self) -> &str;

    /// Reads the current document, strongly consistent; `None` if never created.
    async fn read(&self) -> Result<Option<VersionedManifest>, RegisterError>;

    /// Creates the register exactly once; concurrent creators lose with
    /// [`RegisterError::AlreadyExists`].
    async fn create(&self, fields: &Fields) -> Result<RegisterVersion, RegisterError>;

    /// Replaces the document iff it is still at `version`, else
    /// [`RegisterError::Conflict`].
    async fn update(
        &self,
        version: &RegisterVersion,
        fields: &Fields,
    ) -> Result<RegisterVersion, RegisterError>;

    /// The backend's capacity for the sealed directory field, in bytes.
    fn max_directory_bytes(&self) -> usize;
}
