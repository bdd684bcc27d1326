//! A wrapper that gives every store call a `tracing` span (store, operation,
//! key) and records request counts and latencies (DESIGN 12). `open_store`
//! applies it to every store it opens.

use std::ops::Range;

use async_trait::async_trait;
use bytes::Bytes;
use tracing::Instrument;

use super::{Blob, BlobError, BlobStore, DynBlobStore, ObjectMeta, Op, Version};

/// A [`BlobStore`] that traces and measures every call to the store it wraps.
#[derive(Debug, Clone)]
pub struct InstrumentedStore {
    inner: DynBlobStore,
}

impl InstrumentedStore {
    /// Wraps `inner`.
    pub fn new(inner: DynBlobStore) -> InstrumentedStore {
        InstrumentedStore { inner }
    }

    async fn observe<T>(
        &self,
        op: Op,
        key: &str,
        call: impl Future<Output = Result<T, BlobError>>,
    ) -> Result<T, BlobError> {
        let span = tracing::debug_span!("store", store = self.inner.name(), op = op.as_str(), key);
        let started = tokio::time::Instant::now();
        let result = call.instrument(span.clone()).await;
        let elapsed = started.elapsed();
        let outcome = match &result {
            Ok(_) => "ok",
            Err(BlobError::NotFound { .. }) => "not_found",
            Err(BlobError::AlreadyExists { .. }) => "already_exists",
            Err(BlobError::Conflict { .. }) => "conflict",
            Err(BlobError::Unavailable { .. }) => "unavailable",
            Err(_) => "error",
        };
        let store = self.inner.name().to_owned();
        metrics::counter!("chorus_store_requests_total", "store" => store.clone(), "op" => op.as_str(), "outcome" => outcome)
            .increment(1);
        metrics::histogram!("chorus_store_request_seconds", "store" => store, "op" => op.as_str())
            .record(elapsed.as_secs_f64());
        span.in_scope(|| {
            tracing::trace!(
                latency_ms = elapsed.as_secs_f64() * 1e3,
                outcome,
                "store call"
            )
        });
        result
    }
}

#[async_trait]
impl BlobStore for InstrumentedStore {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn create(&self, key: &str, bytes: Bytes) -> Result<Version, BlobError> {
        self.observe(Op::Create, key, self.inner.create(key, bytes))
            .await
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        bytes: Bytes,
    ) -> Result<Version, BlobError> {
        self.observe(Op::Update, key, self.inner.update(key, expected, bytes))
            .await
    }

    async fn get(&self, key: &str) -> Result<Blob, BlobError> {
        self.observe(Op::Get, key, self.inner.get(key)).await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BlobError> {
        self.observe(Op::Get, key, self.inner.get_range(key, range))
            .await
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, BlobError> {
        self.observe(Op::Head, key, self.inner.head(key)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, BlobError> {
        self.observe(Op::List, prefix, self.inner.list(prefix))
            .await
    }

    async fn delete(&self, key: &str) -> Result<(), BlobError> {
        self.observe(Op::Delete, key, self.inner.delete(key)).await
    }
}
