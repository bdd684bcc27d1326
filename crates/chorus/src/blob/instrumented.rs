//! A wrapper that gives every store call a `tracing` span (store, operation,
//! key) and records request counts and latencies. `open_store` applies it to
//! every store it opens.

use async_trait::async_trait;
use tracing::Instrument;

use futures::future::BoxFuture;

use super::layer::Layer;
use super::{BlobError, DynBlobStore, Op};

/// A [`BlobStore`](super::BlobStore) that traces and measures every call to the store it wraps.
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
impl Layer for InstrumentedStore {
    fn inner(&self) -> &DynBlobStore {
        &self.inner
    }

    async fn around<T: Send + 'static>(
        &self,
        op: Op,
        key: &str,
        call: BoxFuture<'_, Result<T, BlobError>>,
    ) -> Result<T, BlobError> {
        self.observe(op, key, call).await
    }
}
