//! The capability probe run once when a store is opened (DESIGN 3.1).
//!
//! Some "S3-compatible" servers accept `If-None-Match` / `If-Match` and then
//! ignore them. The protocol is unsafe on such a store, so we refuse it up front.

use bytes::Bytes;

use super::{BlobError, BlobStore};

/// Where probe objects live; each probe uses a fresh random key and deletes it.
pub const PROBE_PREFIX: &str = "chorus-probe";

/// Checks that `store` enforces create-if-absent and CAS: a second create of one
/// key must fail with `AlreadyExists`, and an update naming a stale version must
/// fail with `Conflict`. Errors say which capability is missing.
pub async fn probe(store: &dyn BlobStore) -> Result<(), BlobError> {
    let key = format!("{PROBE_PREFIX}/{}", hex::encode(rand::random::<[u8; 16]>()));
    let outcome = probe_key(store, &key).await;
    // Best effort: a leftover probe object is harmless.
    let _ = store.delete(&key).await;
    outcome
}

async fn probe_key(store: &dyn BlobStore, key: &str) -> Result<(), BlobError> {
    let refuse = |what: &str| {
        BlobError::backend(
            store.name(),
            super::Op::Create,
            key,
            format!("store refused: it {what}; Chorus needs atomic conditional writes"),
        )
    };
    let first = store.create(key, Bytes::from_static(b"probe-1")).await?;
    match store.create(key, Bytes::from_static(b"probe-2")).await {
        Err(BlobError::AlreadyExists { .. }) => {}
        Ok(_) => {
            return Err(refuse(
                "ignores create-if-absent (a second create succeeded)",
            ));
        }
        Err(error) => return Err(error),
    }
    store
        .update(key, &first, Bytes::from_static(b"probe-3"))
        .await?;
    match store
        .update(key, &first, Bytes::from_static(b"probe-4"))
        .await
    {
        Err(BlobError::Conflict { .. }) => {}
        Ok(_) => {
            return Err(refuse(
                "ignores CAS (an update with a stale version succeeded)",
            ));
        }
        Err(error) => return Err(error),
    }
    let found = store.get(key).await?;
    if found.bytes.as_ref() != b"probe-3" {
        return Err(refuse("lost or reordered a conditional write"));
    }
    Ok(())
}
