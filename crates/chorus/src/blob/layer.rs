//! Wrappers that run every call of another store through one hook: fault
//! injection, latency, timeouts, instrumentation. A wrapper implements
//! [`Layer`]; the [`BlobStore`] methods come from the blanket implementation,
//! so no wrapper repeats the seven delegations.

use std::fmt;
use std::ops::Range;

use async_trait::async_trait;
use bytes::Bytes;
use futures::future::BoxFuture;

use super::{Blob, BlobError, BlobStore, DynBlobStore, ObjectMeta, Op, PutPayload, Version};

/// A store wrapper: every call of [`Layer::inner`] goes through
/// [`Layer::around`], and bytes that reads return through [`Layer::received`].
#[async_trait]
pub trait Layer: Send + Sync + fmt::Debug + 'static {
    /// The wrapped store.
    fn inner(&self) -> &DynBlobStore;

    /// Runs `call` (one operation `op` on `key`, or on a listing prefix).
    async fn around<T: Send + 'static>(
        &self,
        op: Op,
        key: &str,
        call: BoxFuture<'_, Result<T, BlobError>>,
    ) -> Result<T, BlobError>;

    /// Post-processes the bytes a read of `key` returned.
    fn received(&self, _key: &str, bytes: Bytes) -> Bytes {
        bytes
    }
}

#[async_trait]
impl<L: Layer> BlobStore for L {
    fn name(&self) -> &str {
        self.inner().name()
    }

    async fn create_parts(&self, key: &str, parts: PutPayload) -> Result<Version, BlobError> {
        self.around(Op::Create, key, self.inner().create_parts(key, parts))
            .await
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        bytes: Bytes,
    ) -> Result<Version, BlobError> {
        self.around(Op::Update, key, self.inner().update(key, expected, bytes))
            .await
    }

    async fn get(&self, key: &str) -> Result<Blob, BlobError> {
        let mut blob = self.around(Op::Get, key, self.inner().get(key)).await?;
        blob.bytes = self.received(key, blob.bytes);
        Ok(blob)
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BlobError> {
        let bytes = self
            .around(Op::Get, key, self.inner().get_range(key, range))
            .await?;
        Ok(self.received(key, bytes))
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, BlobError> {
        self.around(Op::Head, key, self.inner().head(key)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, BlobError> {
        self.around(Op::List, prefix, self.inner().list(prefix))
            .await
    }

    async fn delete(&self, key: &str) -> Result<(), BlobError> {
        self.around(Op::Delete, key, self.inner().delete(key)).await
    }
}
