//! Settling the unknown outcome of a conditional write by reading back.
//!
//! A conditional write that failed transiently may have applied; one that failed
//! its precondition after the client retried internally may have been beaten by
//! our own earlier attempt. Neither is a clean loss or a clean win: read the
//! object back and compare it with what we wrote.
//!
//! The `_guarded` variants ask a check of the caller's before every attempt: a
//! writer whose authority runs out (a lease) must not send a retry after that.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;

use super::{BlobError, BlobStore, Version};

/// How many times a transient failure is retried while settling an outcome.
const MAX_RESOLVE_ATTEMPTS: u32 = 5;

/// First retry delay; doubles per attempt.
const RESOLVE_BACKOFF: Duration = Duration::from_millis(20);

/// Why a guarded resolving write ([`create_resolving_guarded`],
/// [`update_resolving_guarded`]) stopped without a version.
#[derive(Debug)]
pub enum GuardedWriteError<E> {
    /// What the unguarded helper returns: a precondition error or the last
    /// transient one.
    Store(BlobError),
    /// The guard refused an attempt, which was therefore not sent. An earlier
    /// attempt's outcome may still be unknown.
    Refused(E),
}

impl GuardedWriteError<Infallible> {
    fn into_store(self) -> BlobError {
        match self {
            GuardedWriteError::Store(error) => error,
            GuardedWriteError::Refused(never) => match never {},
        }
    }
}

/// The guard of the unguarded helpers: every attempt may go.
fn always() -> Result<(), Infallible> {
    Ok(())
}

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
    create_resolving_guarded(store, key, bytes, always)
        .await
        .map_err(GuardedWriteError::into_store)
}

/// [`create_resolving`], asking `guard` immediately before every write attempt
/// (the first and each retry), since retries can outlast the authority to
/// write; a refusal ends the call with [`GuardedWriteError::Refused`].
pub async fn create_resolving_guarded<E>(
    store: &dyn BlobStore,
    key: &str,
    bytes: Bytes,
    mut guard: impl FnMut() -> Result<(), E>,
) -> Result<Version, GuardedWriteError<E>> {
    use GuardedWriteError::{Refused, Store};
    let mut attempt = 0;
    loop {
        attempt += 1;
        guard().map_err(Refused)?;
        match store.create(key, bytes.clone()).await {
            Ok(version) => return Ok(version),
            Err(BlobError::AlreadyExists { .. }) => {}
            Err(error) if error.is_transient() && attempt < MAX_RESOLVE_ATTEMPTS => {}
            Err(error) => return Err(Store(error)),
        }
        match store.get(key).await {
            Ok(found) if found.bytes == bytes => return Ok(found.version),
            Ok(_) => return Err(Store(BlobError::already_exists(store.name(), key))),
            // Our attempt did not land (yet): creating again is safe, because a
            // delayed landing of the first attempt makes the retry find our bytes.
            Err(BlobError::NotFound { .. }) => {}
            Err(error) if error.is_transient() && attempt < MAX_RESOLVE_ATTEMPTS => {}
            Err(error) => return Err(Store(error)),
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
    update_resolving_guarded(store, key, expected, bytes, is_ours, always)
        .await
        .map_err(GuardedWriteError::into_store)
}

/// [`update_resolving`], asking `guard` immediately before every write attempt
/// (the first and each retry), since retries can outlast the authority to
/// write; a refusal ends the call with [`GuardedWriteError::Refused`].
pub async fn update_resolving_guarded<E>(
    store: &dyn BlobStore,
    key: &str,
    expected: &Version,
    bytes: Bytes,
    is_ours: impl Fn(&Bytes) -> bool,
    mut guard: impl FnMut() -> Result<(), E>,
) -> Result<Version, GuardedWriteError<E>> {
    use GuardedWriteError::{Refused, Store};
    let mut attempt = 0;
    loop {
        attempt += 1;
        guard().map_err(Refused)?;
        match store.update(key, expected, bytes.clone()).await {
            Ok(version) => return Ok(version),
            Err(BlobError::Conflict { .. }) => {}
            Err(error) if error.is_transient() && attempt < MAX_RESOLVE_ATTEMPTS => {}
            Err(error) => return Err(Store(error)),
        }
        match store.get(key).await {
            Ok(found) if is_ours(&found.bytes) => return Ok(found.version),
            // Still at the expected version: our write did not apply; try again.
            Ok(found) if &found.version == expected => {}
            Ok(_) => return Err(Store(BlobError::conflict(store.name(), key))),
            Err(error) if error.is_transient() && attempt < MAX_RESOLVE_ATTEMPTS => {}
            Err(error) => return Err(Store(error)),
        }
        tokio::time::sleep(RESOLVE_BACKOFF * 2u32.pow(attempt - 1)).await;
    }
}
