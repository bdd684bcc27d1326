//! Object stores ("blob stores"): the bottom layer of Chorus.
//!
//! Every replica, lease and snapshot lives in a [`BlobStore`]: a flat namespace of
//! immutable-or-CAS-updated objects with exactly the operations the protocol needs
//! (docs/overview.md, Stores). Backends:
//!
//! - [`ObjectStoreBlobs`]: any store the `object_store` crate speaks (`s3://`,
//!   `gs://`, `az://`), with create-if-absent and CAS by ETag/generation.
//! - [`LocalDirStore`]: `file:///abs/dir`, durable (fsync) and atomic across
//!   processes, including CAS update, which `object_store`'s local store lacks.
//! - [`MemoryStore`]: `memory://name`, in this process only; keeps the parts
//!   it is given rather than joining them.
//!
//! Wrappers that work around any store: [`FaultyStore`] (fault injection),
//! [`LatencyStore`] (latency injection) and [`TimeoutStore`] (a bound on every
//! call). [`open_store`] opens a store by URL and refuses it unless it passes the
//! capability [`probe`].

mod error;
mod faulty;
mod instrumented;
mod key;
mod latency;
mod layer;
mod local;
mod memory;
mod object;
mod probe;
mod resolve;
mod timeout;
mod url;

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

pub use error::{BlobError, Source};
pub use faulty::{Fault, FaultController, FaultRule, FaultyStore, KeyMatch, OpSet, RuleId};
pub use instrumented::InstrumentedStore;
pub use key::validate_key;
pub use latency::{Latency, LatencyProfile, LatencyStore};
pub use layer::Layer;
pub use local::LocalDirStore;
pub use memory::MemoryStore;
pub use object::ObjectStoreBlobs;
pub use object_store::PutPayload;
pub use probe::probe;
pub use resolve::{
    GuardedWriteError, create_resolving, create_resolving_guarded, update_resolving,
    update_resolving_guarded,
};
pub use timeout::TimeoutStore;
pub use url::{S3Settings, StoreUrl, StoreUrlError, open_store, open_store_unprobed};

/// A shared, dynamically typed blob store.
pub type DynBlobStore = Arc<dyn BlobStore>;

/// The operations of a [`BlobStore`], used for fault targeting, metrics and errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`BlobStore::create`].
    Create,
    /// [`BlobStore::update`].
    Update,
    /// [`BlobStore::get`] and [`BlobStore::get_range`].
    Get,
    /// [`BlobStore::head`].
    Head,
    /// [`BlobStore::list`].
    List,
    /// [`BlobStore::delete`].
    Delete,
}

impl Op {
    /// Every operation, in declaration order.
    pub const ALL: [Op; 6] = [
        Op::Create,
        Op::Update,
        Op::Get,
        Op::Head,
        Op::List,
        Op::Delete,
    ];

    /// Whether the operation changes the store (its outcome may be unknown on error).
    pub fn is_write(self) -> bool {
        matches!(self, Op::Create | Op::Update | Op::Delete)
    }

    /// Lowercase name for messages and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Update => "update",
            Op::Get => "get",
            Op::Head => "head",
            Op::List => "list",
            Op::Delete => "delete",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The version token of one stored object: what a CAS update must name.
///
/// Backends fill whichever of the two tokens they use (ETag for S3 and Azure,
/// generation for GCS, a random nonce for the local store), mirroring
/// `object_store::UpdateVersion`. A new token is issued on every write, so a
/// token never recurs for different contents (no ABA).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Version {
    /// The entity tag, if the backend has one.
    pub e_tag: Option<String>,
    /// The object generation or version id, if the backend has one.
    pub generation: Option<String>,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.e_tag, &self.generation) {
            (Some(e_tag), Some(generation)) => write!(f, "{e_tag}/{generation}"),
            (Some(e_tag), None) => f.write_str(e_tag),
            (None, Some(generation)) => f.write_str(generation),
            (None, None) => f.write_str("-"),
        }
    }
}

/// An object's contents with the version they were read at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// The object's bytes.
    pub bytes: Bytes,
    /// The version the bytes belong to.
    pub version: Version,
}

/// What a listing or `head` reports about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// The key relative to the store's root.
    pub key: String,
    /// Size of the object's contents in bytes.
    pub size: u64,
    /// The current version.
    pub version: Version,
}

/// The storage operations Chorus needs from an object store.
///
/// Keys are `/`-separated paths relative to the store's root; see
/// [`validate_key`]. Every method is atomic with respect to every other call,
/// also from other processes. Write errors other than the precondition errors
/// (`AlreadyExists`, `Conflict`, `NotFound`) leave the outcome unknown: the write
/// may have applied; use [`create_resolving`] or [`update_resolving`] to settle it.
#[async_trait]
pub trait BlobStore: Send + Sync + fmt::Debug + 'static {
    /// A printable name for errors and metrics: the store URL without secrets.
    fn name(&self) -> &str;

    /// Creates `key` with `bytes` iff no object exists there.
    /// Fails with [`BlobError::AlreadyExists`] otherwise, only when an object
    /// is there: a refusal while another create of the key is still in
    /// flight (S3's 409) is [`BlobError::Unavailable`], to be retried.
    async fn create(&self, key: &str, bytes: Bytes) -> Result<Version, BlobError> {
        self.create_parts(key, PutPayload::from(bytes)).await
    }

    /// [`create`](BlobStore::create) with the contents given as parts, the
    /// object being their concatenation: a caller holding an object in
    /// pieces (a sealed segment made of its fragments) need not copy them
    /// into one buffer, and a store that can keeps or sends them as they are.
    async fn create_parts(&self, key: &str, parts: PutPayload) -> Result<Version, BlobError>;

    /// Replaces `key` with `bytes` iff its current version is `expected`.
    /// Fails with [`BlobError::Conflict`] if the version differs or the object
    /// does not exist (as S3 answers a conditional put on a missing key). A
    /// refusal while another conditional write of the key is in flight (S3's
    /// 409) is [`BlobError::Unavailable`]: the version may not have moved.
    async fn update(
        &self,
        key: &str,
        expected: &Version,
        bytes: Bytes,
    ) -> Result<Version, BlobError>;

    /// Reads a whole object. [`BlobError::NotFound`] if absent.
    async fn get(&self, key: &str) -> Result<Blob, BlobError>;

    /// Reads `range` of an object's bytes; the range must lie within the object.
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BlobError>;

    /// Reads an object's metadata. [`BlobError::NotFound`] if absent.
    async fn head(&self, key: &str) -> Result<ObjectMeta, BlobError>;

    /// Lists every object under the directory `prefix` ("" for all), sorted by
    /// key, strongly consistent with completed writes.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, BlobError>;

    /// Deletes `key`; deleting an absent key succeeds.
    async fn delete(&self, key: &str) -> Result<(), BlobError>;
}
