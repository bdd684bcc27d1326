//! [`BlobStore`] over any `object_store` backend (S3, GCS, Azure, in-memory).
//!
//! Provider quirks stay in here: `object_store` already maps each provider's
//! precondition responses onto `AlreadyExists` / `Precondition`; we map those onto
//! the blob contract. Its client retries 5xx and 429 responses even for
//! conditional puts, so `AlreadyExists` or `Conflict` after a retried request may
//! be our own earlier attempt: callers settle that with
//! [`create_resolving`](super::create_resolving) / [`update_resolving`](super::update_resolving).

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{
    GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion,
};

use super::key::validate_prefix;
use super::{Blob, BlobError, BlobStore, ObjectMeta, Op, Version, validate_key};

/// A [`BlobStore`] backed by an `object_store::ObjectStore`, rooted at a prefix.
#[derive(Debug, Clone)]
pub struct ObjectStoreBlobs {
    store: Arc<dyn ObjectStore>,
    /// Root prefix inside the bucket, without leading or trailing `/`; may be empty.
    prefix: String,
    name: String,
}

impl ObjectStoreBlobs {
    /// Wraps `store`, placing every key under `prefix` (may be empty).
    /// `name` is used in errors and metrics and must not contain secrets.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str, name: impl Into<String>) -> Self {
        ObjectStoreBlobs {
            store,
            prefix: prefix.trim_matches('/').to_owned(),
            name: name.into(),
        }
    }

    fn path(&self, key: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(key)
        } else {
            Path::from(format!("{}/{key}", self.prefix))
        }
    }

    /// The key of a listed path relative to our prefix.
    fn key_of(&self, path: &Path) -> String {
        let full = path.as_ref();
        if self.prefix.is_empty() {
            full.to_owned()
        } else {
            full.strip_prefix(&self.prefix)
                .and_then(|rest| rest.strip_prefix('/'))
                .unwrap_or(full)
                .to_owned()
        }
    }

    /// Maps an `object_store` error onto the blob contract.
    fn error(&self, op: Op, key: &str, error: object_store::Error) -> BlobError {
        use object_store::Error as E;
        match error {
            E::NotFound { .. } if op == Op::Update => BlobError::conflict(&self.name, key),
            E::NotFound { .. } => BlobError::not_found(&self.name, key),
            // S3's 409 to a conditional update: another conditional write of
            // the key is in flight, and it may yet fail, so the version may
            // not have moved; retrying the same update is safe.
            E::AlreadyExists { .. } if op == Op::Update => BlobError::unavailable(
                &self.name,
                op,
                key,
                "refused while another conditional write of the key is in flight",
            ),
            E::AlreadyExists { .. } => BlobError::already_exists(&self.name, key),
            E::Precondition { .. } if op == Op::Create => {
                BlobError::already_exists(&self.name, key)
            }
            E::Precondition { .. } => BlobError::conflict(&self.name, key),
            // Configuration and capability problems do not clear up by retrying.
            error @ (E::NotSupported { .. }
            | E::NotImplemented { .. }
            | E::InvalidPath { .. }
            | E::UnknownConfigurationKey { .. }
            | E::PermissionDenied { .. }
            | E::Unauthenticated { .. }) => BlobError::backend(&self.name, op, key, error),
            // Network failures and 5xx after the client's own retries: transient.
            error => BlobError::unavailable(&self.name, op, key, error),
        }
    }

    async fn put(
        &self,
        op: Op,
        key: &str,
        payload: PutPayload,
        mode: PutMode,
    ) -> Result<Version, BlobError> {
        validate_key(key)?;
        let options = PutOptions {
            mode,
            ..PutOptions::default()
        };
        let result = self
            .store
            .put_opts(&self.path(key), payload, options)
            .await
            .map_err(|e| self.error(op, key, e))?;
        Ok(version(result.e_tag, result.version))
    }
}

/// A version in one canonical form. Azure's listings give ETags unquoted
/// while its responses' `ETag` headers quote them: the same version must
/// compare equal whichever call reported it, so ETags are kept quoted, as
/// HTTP writes strong ETags.
fn version(e_tag: Option<String>, generation: Option<String>) -> Version {
    let e_tag = e_tag.map(|tag| {
        if tag.starts_with('"') || tag.starts_with("W/") {
            tag
        } else {
            format!("\"{tag}\"")
        }
    });
    Version { e_tag, generation }
}

fn meta(key: String, meta: object_store::ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        key,
        size: meta.size,
        version: version(meta.e_tag, meta.version),
    }
}

#[async_trait]
impl BlobStore for ObjectStoreBlobs {
    fn name(&self) -> &str {
        &self.name
    }

    async fn create_parts(&self, key: &str, parts: PutPayload) -> Result<Version, BlobError> {
        let refused = match self.put(Op::Create, key, parts, PutMode::Create).await {
            Err(refused @ BlobError::AlreadyExists { .. }) => refused,
            outcome => return outcome,
        };
        // S3 answers a conditional create with 409 while another create of
        // the key is still uploading, which object_store reports as
        // `AlreadyExists`, though nothing exists yet and the other upload
        // may still fail. The contract's `AlreadyExists` says the key
        // exists, so confirm it; if nothing is there, the create may simply
        // be retried. (Concurrent creates of a key are routine: a hedged
        // fragment write, a fence racing the writer it fences.)
        match self.head(key).await {
            Ok(_) => Err(refused),
            Err(BlobError::NotFound { .. }) => Err(BlobError::unavailable(
                &self.name,
                Op::Create,
                key,
                "refused as existing, but nothing is there yet: another create of the key is in flight",
            )),
            Err(error) => Err(error),
        }
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        bytes: Bytes,
    ) -> Result<Version, BlobError> {
        let expected = UpdateVersion {
            e_tag: expected.e_tag.clone(),
            version: expected.generation.clone(),
        };
        self.put(Op::Update, key, bytes.into(), PutMode::Update(expected))
            .await
    }

    async fn get(&self, key: &str) -> Result<Blob, BlobError> {
        validate_key(key)?;
        let err = |e| self.error(Op::Get, key, e);
        let result = self
            .store
            .get_opts(&self.path(key), GetOptions::default())
            .await
            .map_err(err)?;
        let version = version(result.meta.e_tag.clone(), result.meta.version.clone());
        let bytes = result.bytes().await.map_err(err)?;
        Ok(Blob { bytes, version })
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BlobError> {
        validate_key(key)?;
        if range.is_empty() {
            // object_store refuses empty ranges; an empty read needs no request
            // beyond checking that the object exists.
            self.head(key).await?;
            return Ok(Bytes::new());
        }
        let expected = range.end - range.start;
        let bytes = self
            .store
            .get_range(&self.path(key), range.clone())
            .await
            .map_err(|e| self.error(Op::Get, key, e))?;
        if bytes.len() as u64 != expected {
            return Err(BlobError::backend(
                &self.name,
                Op::Get,
                key,
                format!("range {range:?} outside object"),
            ));
        }
        Ok(bytes)
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, BlobError> {
        validate_key(key)?;
        let found = self
            .store
            .head(&self.path(key))
            .await
            .map_err(|e| self.error(Op::Head, key, e))?;
        Ok(meta(key.to_owned(), found))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, BlobError> {
        validate_prefix(prefix)?;
        let root = match (self.prefix.is_empty(), prefix.is_empty()) {
            (true, true) => None,
            (true, false) => Some(Path::from(prefix)),
            (false, true) => Some(Path::from(self.prefix.as_str())),
            (false, false) => Some(self.path(prefix)),
        };
        let mut listed: Vec<ObjectMeta> = self
            .store
            .list(root.as_ref())
            .map_ok(|found| meta(self.key_of(&found.location), found))
            .try_collect()
            .await
            .map_err(|e| self.error(Op::List, prefix, e))?;
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(listed)
    }

    async fn delete(&self, key: &str) -> Result<(), BlobError> {
        validate_key(key)?;
        match self.store.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error(Op::Delete, key, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fmt;
    use std::sync::atomic::{AtomicU32, Ordering};

    use futures::stream::BoxStream;
    use object_store::memory::InMemory;
    use object_store::{
        CopyOptions, GetResult, ListResult, MultipartUpload, PutMultipartOptions, PutResult,
    };

    use super::*;

    /// In-memory, but the first `refusals` conditional writes (creates and
    /// updates) are answered as S3 answers one while another conditional
    /// write of the key is uploading: a 409, which object_store reports as
    /// `AlreadyExists`, with nothing stored.
    #[derive(Debug)]
    struct UploadInFlight {
        inner: InMemory,
        refusals: AtomicU32,
    }

    impl fmt::Display for UploadInFlight {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "UploadInFlight")
        }
    }

    #[async_trait]
    impl ObjectStore for UploadInFlight {
        async fn put_opts(
            &self,
            location: &Path,
            payload: PutPayload,
            options: PutOptions,
        ) -> object_store::Result<PutResult> {
            let conditional = matches!(options.mode, PutMode::Create | PutMode::Update(_));
            let refuse = || {
                self.refusals
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            };
            if conditional && refuse() {
                return Err(object_store::Error::AlreadyExists {
                    path: location.to_string(),
                    source: "409 ConditionalRequestConflict".into(),
                });
            }
            self.inner.put_opts(location, payload, options).await
        }
        async fn put_multipart_opts(
            &self,
            location: &Path,
            options: PutMultipartOptions,
        ) -> object_store::Result<Box<dyn MultipartUpload>> {
            self.inner.put_multipart_opts(location, options).await
        }
        async fn get_opts(
            &self,
            location: &Path,
            options: GetOptions,
        ) -> object_store::Result<GetResult> {
            self.inner.get_opts(location, options).await
        }
        fn delete_stream(
            &self,
            locations: BoxStream<'static, object_store::Result<Path>>,
        ) -> BoxStream<'static, object_store::Result<Path>> {
            self.inner.delete_stream(locations)
        }
        fn list(
            &self,
            prefix: Option<&Path>,
        ) -> BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
            self.inner.list(prefix)
        }
        async fn list_with_delimiter(
            &self,
            prefix: Option<&Path>,
        ) -> object_store::Result<ListResult> {
            self.inner.list_with_delimiter(prefix).await
        }
        async fn copy_opts(
            &self,
            from: &Path,
            to: &Path,
            options: CopyOptions,
        ) -> object_store::Result<()> {
            self.inner.copy_opts(from, to, options).await
        }
    }

    /// A create refused as existing while nothing is there is transient
    /// (the other upload may fail; retrying is safe), and once the key
    /// exists a refusal is `AlreadyExists`, as the contract says.
    #[tokio::test]
    async fn a_create_refused_while_another_uploads_is_transient() {
        let store = ObjectStoreBlobs::new(
            Arc::new(UploadInFlight {
                inner: InMemory::new(),
                refusals: AtomicU32::new(1),
            }),
            "root",
            "s3-like",
        );
        let bytes = Bytes::from_static(b"fragment");
        let error = store.create("k", bytes.clone()).await.unwrap_err();
        assert!(error.is_transient(), "{error}");
        assert!(error.to_string().contains("in flight"), "{error}");
        store.create("k", bytes.clone()).await.unwrap();
        let error = store.create("k", bytes).await.unwrap_err();
        assert!(matches!(error, BlobError::AlreadyExists { .. }), "{error}");
    }

    /// An update refused while another conditional write uploads is
    /// transient too, not a claim that the key exists: the version may not
    /// have moved, and the same update then succeeds.
    #[tokio::test]
    async fn an_update_refused_while_another_uploads_is_transient() {
        let refusing = Arc::new(UploadInFlight {
            inner: InMemory::new(),
            refusals: AtomicU32::new(0),
        });
        let store = ObjectStoreBlobs::new(refusing.clone(), "root", "s3-like");
        let base = store.create("k", Bytes::from_static(b"v1")).await.unwrap();
        refusing.refusals.store(1, Ordering::SeqCst);
        let v2 = Bytes::from_static(b"v2");
        let error = store.update("k", &base, v2.clone()).await.unwrap_err();
        assert!(error.is_transient(), "{error}");
        assert!(error.to_string().contains("in flight"), "{error}");
        store.update("k", &base, v2.clone()).await.unwrap();
        assert_eq!(store.get("k").await.unwrap().bytes, v2);
    }

    #[test]
    fn etags_are_kept_quoted_whichever_call_reported_them() {
        let quoted = Some("\"0x1DA\"".to_owned());
        assert_eq!(version(Some("0x1DA".into()), None).e_tag, quoted);
        assert_eq!(version(quoted.clone(), None).e_tag, quoted);
        let weak = Some("W/\"x\"".to_owned());
        assert_eq!(version(weak.clone(), None).e_tag, weak);
        let generation = version(None, Some("7".into()));
        assert_eq!(
            (generation.e_tag, generation.generation.as_deref()),
            (None, Some("7"))
        );
    }
}
