//! Settling the unknown outcome of a conditional write by reading back.
//!
//! A conditional write that failed transiently may have applied; one that failed
//! its precondition after the client retried internally may have been beaten by
//! our own earlier attempt. Neither is a clean loss or a clean win: read the
//! object back and compare it with what we wrote.

use std::time::Duration;

use bytes::Bytes;

use super::{BlobError, BlobStore, Version};

/// How many times a transient failure is retried while settling an outcome.
const MAX_RESOLVE_ATTEMPTS: u32 = 5;

/// First retry delay; doubles per attempt.
const RESOLVE_BACKOFF: Duration = Duration::from_millis(20);

/// Creates `key` with `bytes`, settling unknown outcomes.
///
/// Returns the object's version if it now holds exactly `bytes` (whether this call
/// or an earlier attempt of ours wrote it), [`BlobError::AlreadyExists`] if it
/// holds other bytes, and the last transient error if the outcome stays unknown
/// after `MAX_RESOLVE_ATTEMPTS` (5).
pub async fn create_resolving(
    store: &dyn BlobStore,
    key: &str,
    bytes: Bytes,
) -> Result<Version, BlobError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match store.create(key, bytes.clone()).await {
            Ok(version) => return Ok(version),
            Err(BlobError::AlreadyExists { .. }) => {}
            Err(error) if error.is_transient() && attempt < MAX_RESOLVE_ATTEMPTS => {}
            Err(error) => return Err(error),
        }
        match store.get(key).await {
            Ok(found) if found.bytes == bytes => return Ok(found.version),
            Ok(_) => return Err(BlobError::already_exists(store.name(), key)),
            // Our attempt did not land (yet): creating again is safe, because a
            // delayed landing of the first attempt makes the retry find our bytes.
            Err(BlobError::NotFound { .. }) => {}
            Err(error) if error.is_transient() && attempt < MAX_RESOLVE_ATTEMPTS => {}
            Err(error) => return Err(error),
        }
        tokio::time::sleep(RESOLVE_BACKOFF * 2u32.pow(attempt - 1)).await;
    }
}

/// Replaces `key` iff it is at `expected`, settling unknown outcomes.
///
/// `is_ours` decides whether stored bytes are the document this call wrote (for
/// JSON documents: the writer identity embedded in them; pass a byte comparison
/// for exact matches). Returns the new version if our document is in place,
/// [`BlobError::Conflict`] if someone else's write won, and the last transient
/// error if the outcome stays unknown after `MAX_RESOLVE_ATTEMPTS` (5).
pub async fn update_resolving(
    store: &dyn BlobStore,
    key: &str,
    expected: &Version,
    bytes: Bytes,
    is_ours: impl Fn(&Bytes) -> bool,
) -> Result<Version, BlobError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match store.update(key, expected, bytes.clone()).await {
            Ok(version) => return Ok(version),
            Err(BlobError::Conflict { .. }) => {}
            Err(error) if error.is_transient() && attempt < MAX_RESOLVE_ATTEMPTS => {}
            Err(error) => return Err(error),
        }
        match store.get(key).await {
            Ok(found) if is_ours(&found.bytes) => return Ok(found.version),
            // Still at the expected version: our write did not apply; try again.
            Ok(found) if &found.version == expected => {}
            Ok(_) => return Err(BlobError::conflict(store.name(), key)),
            Err(error) if error.is_transient() && attempt < MAX_RESOLVE_ATTEMPTS => {}
            Err(error) => return Err(error),
        }
        tokio::time::sleep(RESOLVE_BACKOFF * 2u32.pow(attempt - 1)).await;
    }
}
