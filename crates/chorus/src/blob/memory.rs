//! `memory://name[/prefix]`: objects in this process's memory, shared by every
//! handle opened on the same name, and gone when the process ends. For tests,
//! benchmarks and trying things out; never durable.
//!
//! An object keeps the parts it was created from as they are (reference-counted
//! buffers, not copies): a sealed segment written to three memory replicas is
//! one set of buffers, the fragments' own, rather than three joined copies.
//! A read of an object made of several parts joins them.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};

use super::key::validate_prefix;
use super::{Blob, BlobError, BlobStore, ObjectMeta, Op, PutPayload, Version, validate_key};

/// An in-process store; see the module docs.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    bucket: Arc<Bucket>,
    /// Prepended to every key (`prefix/key`); empty for none.
    prefix: String,
    name: String,
}

/// The objects of one name, by full path.
#[derive(Debug, Default)]
struct Bucket {
    objects: Mutex<Objects>,
}

#[derive(Debug, Default)]
struct Objects {
    by_path: BTreeMap<String, Stored>,
    /// The last version handed out: versions are never reused, so a
    /// recreated or rewritten object never matches an older version.
    last_version: u64,
}

#[derive(Debug, Clone)]
struct Stored {
    parts: PutPayload,
    size: u64,
    version: u64,
}

impl Objects {
    /// Stores `parts` at `path` under a version never handed out before.
    fn put(&mut self, path: String, parts: PutPayload) -> Version {
        self.last_version += 1;
        let stored = Stored {
            size: parts.content_length() as u64,
            parts,
            version: self.last_version,
        };
        self.by_path.insert(path, stored);
        version(self.last_version)
    }
}

impl MemoryStore {
    /// A fresh, empty store that no other handle reaches (its objects go
    /// when the last clone is dropped), called `name` in errors and metrics.
    pub fn new(name: impl Into<String>) -> MemoryStore {
        MemoryStore {
            bucket: Arc::default(),
            prefix: String::new(),
            name: name.into(),
        }
    }

    /// The store named `bucket`, shared with every other handle on that name
    /// in this process, with keys under `prefix` (`""` for none); `name` is
    /// what errors and metrics call it (its URL).
    pub fn shared(bucket: &str, prefix: &str, name: impl Into<String>) -> MemoryStore {
        static BUCKETS: LazyLock<Mutex<HashMap<String, Arc<Bucket>>>> =
            LazyLock::new(Default::default);
        let bucket = BUCKETS
            .lock()
            .expect("memory store registry poisoned")
            .entry(bucket.to_owned())
            .or_default()
            .clone();
        MemoryStore {
            bucket,
            prefix: prefix.trim_matches('/').to_owned(),
            name: name.into(),
        }
    }

    fn objects(&self) -> MutexGuard<'_, Objects> {
        // A panic while holding the lock cannot leave a map half-changed:
        // every change is one insert or remove.
        self.bucket
            .objects
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn path(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{}/{key}", self.prefix)
        }
    }

    fn key_of<'a>(&self, path: &'a str) -> &'a str {
        if self.prefix.is_empty() {
            path
        } else {
            &path[self.prefix.len() + 1..]
        }
    }

    fn found(&self, key: &str) -> Result<Stored, BlobError> {
        validate_key(key)?;
        self.objects()
            .by_path
            .get(&self.path(key))
            .cloned()
            .ok_or_else(|| BlobError::not_found(&self.name, key))
    }
}

fn version(number: u64) -> Version {
    Version {
        e_tag: Some(format!("\"{number}\"")),
        generation: None,
    }
}

/// `range` of the concatenation of `parts`: a slice of one part where the
/// range lies within it, else a copy.
fn slice_parts(parts: &PutPayload, range: Range<usize>) -> Bytes {
    let mut start = 0;
    let mut joined = BytesMut::new();
    for part in parts {
        let end = start + part.len();
        if range.start >= start && range.end <= end && joined.is_empty() {
            return part.slice(range.start - start..range.end - start);
        }
        let (from, to) = (range.start.max(start), range.end.min(end));
        if from < to {
            joined.extend_from_slice(&part[from - start..to - start]);
        }
        start = end;
    }
    joined.freeze()
}

#[async_trait]
impl BlobStore for MemoryStore {
    fn name(&self) -> &str {
        &self.name
    }

    async fn create_parts(&self, key: &str, parts: PutPayload) -> Result<Version, BlobError> {
        validate_key(key)?;
        let mut objects = self.objects();
        let path = self.path(key);
        if objects.by_path.contains_key(&path) {
            return Err(BlobError::already_exists(&self.name, key));
        }
        Ok(objects.put(path, parts))
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        bytes: Bytes,
    ) -> Result<Version, BlobError> {
        validate_key(key)?;
        let mut objects = self.objects();
        let path = self.path(key);
        let current = objects
            .by_path
            .get(&path)
            .map(|stored| version(stored.version));
        if current.as_ref() != Some(expected) {
            return Err(BlobError::conflict(&self.name, key));
        }
        Ok(objects.put(path, bytes.into()))
    }

    async fn get(&self, key: &str) -> Result<Blob, BlobError> {
        let stored = self.found(key)?;
        Ok(Blob {
            bytes: stored.parts.into(),
            version: version(stored.version),
        })
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BlobError> {
        let stored = self.found(key)?;
        if range.start > range.end || range.end > stored.size {
            return Err(BlobError::backend(
                &self.name,
                Op::Get,
                key,
                format!("range {range:?} outside object of {} bytes", stored.size),
            ));
        }
        // Within the object's size, which fits in memory: no truncation.
        Ok(slice_parts(
            &stored.parts,
            range.start as usize..range.end as usize,
        ))
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, BlobError> {
        let stored = self.found(key)?;
        Ok(ObjectMeta {
            key: key.to_owned(),
            size: stored.size,
            version: version(stored.version),
        })
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, BlobError> {
        validate_prefix(prefix)?;
        // Directory semantics: `a` lists `a/…`, not `ab`.
        let directory = match (self.prefix.is_empty(), prefix.is_empty()) {
            (true, true) => String::new(),
            (true, false) => format!("{prefix}/"),
            (false, true) => format!("{}/", self.prefix),
            (false, false) => format!("{}/{prefix}/", self.prefix),
        };
        let objects = self.objects();
        Ok(objects
            .by_path
            .range(directory.clone()..)
            .take_while(|(path, _)| path.starts_with(&directory))
            .map(|(path, stored)| ObjectMeta {
                key: self.key_of(path).to_owned(),
                size: stored.size,
                version: version(stored.version),
            })
            .collect())
    }

    async fn delete(&self, key: &str) -> Result<(), BlobError> {
        validate_key(key)?;
        self.objects().by_path.remove(&self.path(key));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn payload(parts: &[&'static [u8]]) -> PutPayload {
        parts.iter().map(|part| Bytes::from_static(part)).collect()
    }

    #[tokio::test]
    async fn parts_are_kept_as_given_and_read_as_one_object() {
        let store = MemoryStore::shared("memory-parts-kept", "", "memory://memory-parts-kept");
        let first = Bytes::from_static(b"abc");
        let parts: PutPayload = vec![first.clone(), Bytes::from_static(b"de")]
            .into_iter()
            .collect();
        store.create_parts("k", parts).await.unwrap();
        let stored = store.found("k").unwrap();
        assert_eq!(
            stored.parts.as_ref()[0].as_ptr(),
            first.as_ptr(),
            "not copied"
        );
        assert_eq!(
            store.get("k").await.unwrap().bytes,
            Bytes::from_static(b"abcde")
        );
        assert_eq!(store.head("k").await.unwrap().size, 5);
    }

    #[tokio::test]
    async fn handles_on_one_name_share_objects_and_prefixes_separate_them() {
        let whole = MemoryStore::shared("memory-shared", "", "memory://memory-shared");
        let under = MemoryStore::shared("memory-shared", "/p/", "memory://memory-shared/p");
        under.create("k", Bytes::from_static(b"x")).await.unwrap();
        assert_eq!(
            whole.get("p/k").await.unwrap().bytes,
            Bytes::from_static(b"x")
        );
        let keys: Vec<String> = under
            .list("")
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.key)
            .collect();
        assert_eq!(keys, ["k"]);
        assert!(matches!(
            under.create("k", Bytes::new()).await,
            Err(BlobError::AlreadyExists { .. })
        ));
    }

    #[tokio::test]
    async fn a_deleted_and_recreated_object_has_a_new_version() {
        let store = MemoryStore::shared("memory-versions", "", "memory://memory-versions");
        let first = store.create("k", Bytes::from_static(b"1")).await.unwrap();
        store.delete("k").await.unwrap();
        store.create("k", Bytes::from_static(b"1")).await.unwrap();
        assert!(matches!(
            store.update("k", &first, Bytes::from_static(b"2")).await,
            Err(BlobError::Conflict { .. })
        ));
    }

    proptest! {
        /// Any range of any split reads as the same range of the joined bytes.
        #[test]
        fn a_range_of_parts_is_the_range_of_their_concatenation(
            parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..20), 0..6),
            a in 0usize..120,
            b in 0usize..120,
        ) {
            let joined: Vec<u8> = parts.concat();
            let (start, end) = (a.min(b).min(joined.len()), a.max(b).min(joined.len()));
            let payload: PutPayload = parts.into_iter().map(Bytes::from).collect();
            prop_assert_eq!(&slice_parts(&payload, start..end)[..], &joined[start..end]);
        }
    }

    #[test]
    fn a_range_within_one_part_is_a_slice_of_it() {
        let parts = payload(&[b"abc", b"defg"]);
        let sliced = slice_parts(&parts, 4..6);
        assert_eq!(&sliced[..], b"ef");
        assert_eq!(sliced.as_ptr(), parts.as_ref()[1][1..].as_ptr());
    }
}
