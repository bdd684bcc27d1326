//! The one error type of the blob layer.

use super::Op;

/// Boxed source error from a backend.
pub type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a blob store call failed. The precondition variants (`NotFound`,
/// `AlreadyExists`, `Conflict`) are definitive; `Unavailable` is transient and,
/// for writes, leaves the outcome unknown.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// The object does not exist.
    #[error("object not found: store={store} key={key}")]
    NotFound {
        /// Store name.
        store: String,
        /// Object key.
        key: String,
    },
    /// A create found an object already there.
    #[error("object already exists: store={store} key={key}")]
    AlreadyExists {
        /// Store name.
        store: String,
        /// Object key.
        key: String,
    },
    /// A CAS update named a version that is no longer current.
    #[error("version conflict: store={store} key={key}")]
    Conflict {
        /// Store name.
        store: String,
        /// Object key.
        key: String,
    },
    /// A transient failure (network, timeout, throttling, outage). A write that
    /// fails this way may or may not have applied.
    #[error("store unavailable: store={store} op={op} key={key}: {source}")]
    Unavailable {
        /// Store name.
        store: String,
        /// The failed operation.
        op: Op,
        /// Object key or listing prefix.
        key: String,
        /// What went wrong.
        source: Source,
    },
    /// A key that the blob layer does not accept.
    #[error("invalid object key {key:?}: {reason}")]
    InvalidKey {
        /// The rejected key.
        key: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A terminal failure: misconfiguration, permissions, unsupported operation,
    /// or an object that is not in the backend's format.
    #[error("store error: store={store} op={op}{}: {source}", key_label(.key))]
    Backend {
        /// Store name.
        store: String,
        /// The failed operation.
        op: Op,
        /// Object key or listing prefix.
        key: String,
        /// What went wrong.
        source: Source,
    },
}

/// ` key=<key>`, or nothing for an error of the whole store (opening it).
fn key_label(key: &str) -> String {
    if key.is_empty() {
        String::new()
    } else {
        format!(" key={key}")
    }
}

impl BlobError {
    /// Whether retrying the same call may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, BlobError::Unavailable { .. })
    }

    /// Builds an [`BlobError::Unavailable`].
    pub fn unavailable(store: &str, op: Op, key: &str, source: impl Into<Source>) -> BlobError {
        BlobError::Unavailable {
            store: store.to_owned(),
            op,
            key: key.to_owned(),
            source: source.into(),
        }
    }

    /// Builds a [`BlobError::Backend`].
    pub fn backend(store: &str, op: Op, key: &str, source: impl Into<Source>) -> BlobError {
        BlobError::Backend {
            store: store.to_owned(),
            op,
            key: key.to_owned(),
            source: source.into(),
        }
    }

    /// Builds a [`BlobError::NotFound`].
    pub fn not_found(store: &str, key: &str) -> BlobError {
        BlobError::NotFound {
            store: store.to_owned(),
            key: key.to_owned(),
        }
    }

    /// Builds a [`BlobError::AlreadyExists`].
    pub fn already_exists(store: &str, key: &str) -> BlobError {
        BlobError::AlreadyExists {
            store: store.to_owned(),
            key: key.to_owned(),
        }
    }

    /// Builds a [`BlobError::Conflict`].
    pub fn conflict(store: &str, key: &str) -> BlobError {
        BlobError::Conflict {
            store: store.to_owned(),
            key: key.to_owned(),
        }
    }
}
