//! The request timeout, owned by the service rather than a blind outer
//! layer, so that its answer can say whether a write may still commit.
//!
//! A write handler marks the moment it hands its record to the runtime
//! ([`admitting`]); from then on the record may be appended and applied
//! even if nobody waits for the answer. A timeout before that moment
//! provably appended nothing. The mark lives in a task-local set around
//! the request, so handlers need no extra argument: the handler's future is
//! polled inside [`bound`]'s scope on the connection's task.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

tokio::task_local! {
    /// Whether the current request handed a record to the runtime.
    static ADMITTED: Arc<AtomicBool>;
}

/// Marks the current request's write as handed to the runtime: a timeout
/// from now on answers `may_have_committed: true`. Returns `record`, so a
/// prepare closure can end with it. Outside a request it only returns.
pub fn admitting<T>(record: T) -> T {
    let _ = ADMITTED.try_with(|admitted| admitted.store(true, Ordering::Release));
    record
}

/// Runs `request` bounded by `timeout` until its answer starts. A timeout
/// is `503` with `Retry-After`; for a method that may write, it says
/// whether the write may have committed.
pub async fn bound(timeout: Duration, request: Request, next: Next) -> Response {
    let may_write = !request.method().is_safe();
    let admitted = Arc::new(AtomicBool::new(false));
    let answer = ADMITTED
        .scope(
            Arc::clone(&admitted),
            tokio::time::timeout(timeout, next.run(request)),
        )
        .await;
    match answer {
        Ok(response) => response,
        Err(_) => {
            let admitted = may_write.then(|| admitted.load(Ordering::Acquire));
            ApiError::request_timeout(timeout, admitted).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_mark_is_seen_by_its_own_request_only() {
        let first = Arc::new(AtomicBool::new(false));
        let second = Arc::new(AtomicBool::new(false));
        ADMITTED
            .scope(Arc::clone(&first), async {
                tokio::task::yield_now().await;
                assert_eq!(admitting(7), 7);
            })
            .await;
        ADMITTED.scope(Arc::clone(&second), async {}).await;
        assert!(first.load(Ordering::Acquire));
        assert!(!second.load(Ordering::Acquire));
        // Outside any request the mark goes nowhere.
        assert_eq!(admitting("record"), "record");
    }
}
