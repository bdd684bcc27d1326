//! A wrapper that bounds every call to a [`BlobStore`] by a timeout.
//!
//! A call that does not finish in time fails with [`BlobError::Unavailable`]:
//! transient, and for writes of unknown outcome (the abandoned request may still
//! apply), which is exactly how callers already treat a lost response. Leases
//! need this: a holder must get an answer (or give up) well within its lease.

use std::time::Duration;

use async_trait::async_trait;

use futures::future::BoxFuture;

use super::layer::Layer;
use super::{BlobError, BlobStore, DynBlobStore, Op};

/// A [`BlobStore`] whose every call fails as `Unavailable` after `timeout`.
#[derive(Debug, Clone)]
pub struct TimeoutStore {
    inner: DynBlobStore,
    timeout: Duration,
}

/// The cause of a timed-out call.
#[derive(Debug, thiserror::Error)]
#[error("timed out after timeout_ms={timeout_ms}")]
struct TimedOut {
    timeout_ms: u128,
}

impl TimeoutStore {
    /// Wraps `inner`, bounding each call by `timeout` (which must be non-zero).
    pub fn new(inner: DynBlobStore, timeout: Duration) -> TimeoutStore {
        assert!(!timeout.is_zero(), "a zero timeout fails every call");
        TimeoutStore { inner, timeout }
    }

    /// The bound on each call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn run<T>(
        &self,
        op: Op,
        key: &str,
        call: impl Future<Output = Result<T, BlobError>>,
    ) -> Result<T, BlobError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_elapsed) => Err(BlobError::unavailable(
                self.name(),
                op,
                key,
                TimedOut {
                    timeout_ms: self.timeout.as_millis(),
                },
            )),
        }
    }
}

#[async_trait]
impl Layer for TimeoutStore {
    fn inner(&self) -> &DynBlobStore {
        &self.inner
    }

    async fn around<T: Send + 'static>(
        &self,
        op: Op,
        key: &str,
        call: BoxFuture<'_, Result<T, BlobError>>,
    ) -> Result<T, BlobError> {
        self.run(op, key, call).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::blob::{Fault, FaultController, FaultRule, FaultyStore, StoreUrl, open_store};

    async fn memory() -> DynBlobStore {
        let name = format!("memory://timeout-{:x}", rand::random::<u64>());
        open_store(&name.parse::<StoreUrl>().unwrap())
            .await
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn slow_calls_fail_as_transient_and_fast_calls_pass() {
        let controller = FaultController::new(1);
        let slow: DynBlobStore = Arc::new(FaultyStore::new(memory().await, controller.clone()));
        let store = TimeoutStore::new(slow, Duration::from_secs(1));
        store.create("k", Bytes::from_static(b"v")).await.unwrap();
        controller.add(FaultRule::new(Fault::Delay(Duration::from_secs(5))).times(1));
        let error = store.get("k").await.unwrap_err();
        assert!(error.is_transient(), "{error}");
        assert!(
            error
                .to_string()
                .contains("timed out after timeout_ms=1000"),
            "{error}"
        );
        assert_eq!(
            store.get("k").await.unwrap().bytes,
            Bytes::from_static(b"v")
        );
    }
}
