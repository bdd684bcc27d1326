//! The capability probe run once when a store is opened.
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::ops::Range;
    use std::sync::Mutex;

    use async_trait::async_trait;

    use super::*;
    use crate::blob::{Blob, ObjectMeta, PutPayload, Version};

    /// A store that accepts conditional writes and ignores the conditions it
    /// is told to ignore, like some "S3-compatible" servers.
    #[derive(Debug, Default)]
    struct CarelessStore {
        objects: Mutex<BTreeMap<String, (Bytes, u64)>>,
        ignores_create_condition: bool,
        ignores_update_condition: bool,
    }

    impl CarelessStore {
        fn put(&self, key: &str, bytes: Bytes) -> Version {
            let mut objects = self.objects.lock().unwrap();
            let generation = objects.get(key).map_or(1, |(_, g)| g + 1);
            objects.insert(key.to_owned(), (bytes, generation));
            version(generation)
        }
    }

    fn version(generation: u64) -> Version {
        Version {
            e_tag: None,
            generation: Some(generation.to_string()),
        }
    }

    #[async_trait]
    impl BlobStore for CarelessStore {
        fn name(&self) -> &str {
            "careless"
        }

        async fn create_parts(&self, key: &str, parts: PutPayload) -> Result<Version, BlobError> {
            let bytes = Bytes::from(parts);
            let exists = self.objects.lock().unwrap().contains_key(key);
            if exists && !self.ignores_create_condition {
                return Err(BlobError::already_exists("careless", key));
            }
            Ok(self.put(key, bytes))
        }

        async fn update(
            &self,
            key: &str,
            expected: &Version,
            bytes: Bytes,
        ) -> Result<Version, BlobError> {
            let current = self
                .objects
                .lock()
                .unwrap()
                .get(key)
                .map(|(_, g)| version(*g));
            if current.as_ref() != Some(expected) && !self.ignores_update_condition {
                return Err(BlobError::conflict("careless", key));
            }
            Ok(self.put(key, bytes))
        }

        async fn get(&self, key: &str) -> Result<Blob, BlobError> {
            let objects = self.objects.lock().unwrap();
            let (bytes, generation) = objects
                .get(key)
                .ok_or_else(|| BlobError::not_found("careless", key))?;
            Ok(Blob {
                bytes: bytes.clone(),
                version: version(*generation),
            })
        }

        async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BlobError> {
            let blob = self.get(key).await?;
            Ok(blob.bytes.slice(range.start as usize..range.end as usize))
        }

        async fn head(&self, key: &str) -> Result<ObjectMeta, BlobError> {
            let blob = self.get(key).await?;
            Ok(ObjectMeta {
                key: key.to_owned(),
                size: blob.bytes.len() as u64,
                version: blob.version,
            })
        }

        async fn list(&self, _prefix: &str) -> Result<Vec<ObjectMeta>, BlobError> {
            Ok(Vec::new())
        }

        async fn delete(&self, key: &str) -> Result<(), BlobError> {
            self.objects.lock().unwrap().remove(key);
            Ok(())
        }
    }

    #[tokio::test]
    async fn refuses_a_store_that_ignores_create_if_absent() {
        let store = CarelessStore {
            ignores_create_condition: true,
            ..CarelessStore::default()
        };
        let error = probe(&store).await.unwrap_err().to_string();
        assert!(error.contains("ignores create-if-absent"), "{error}");
        assert!(
            store.objects.lock().unwrap().is_empty(),
            "probe object left behind"
        );
    }

    #[tokio::test]
    async fn refuses_a_store_that_ignores_cas() {
        let store = CarelessStore {
            ignores_update_condition: true,
            ..CarelessStore::default()
        };
        let error = probe(&store).await.unwrap_err().to_string();
        assert!(error.contains("ignores CAS"), "{error}");
    }

    #[tokio::test]
    async fn accepts_a_store_that_enforces_conditions() {
        probe(&CarelessStore::default()).await.unwrap();
    }
}
