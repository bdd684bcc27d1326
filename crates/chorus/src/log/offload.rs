//! Running CPU-heavy work (checksums and encoding of whole sealed segments, up
//! to `max_segment_bytes`; the digest of a whole snapshot payload) off the
//! async workers, so it cannot delay acks.

use tokio::runtime::{Handle, RuntimeFlavor};

/// Runs `work` on the blocking pool on a multi-threaded runtime. On a
/// current-thread runtime (the deterministic simulator) it runs inline, since
/// the blocking pool would make virtual time depend on real thread timing.
pub async fn offload<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match Handle::current().runtime_flavor() {
        RuntimeFlavor::CurrentThread => work(),
        _ => tokio::task::spawn_blocking(work)
            .await
            .expect("offloaded work panicked"),
    }
}
