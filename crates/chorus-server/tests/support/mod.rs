//! A primary runtime over fresh in-memory stores, and the service state a
//! router over it shares: what the router-level tests start from.

#[path = "../../../chorus/tests/support/memory_runtime.rs"]
mod memory_runtime;

use std::sync::Arc;
use std::time::Duration;

use chorus::kv::{KvState, Retention};
use chorus::runtime::Runtime;
use chorus_server::limits::MemoryLimits;
use chorus_server::listener::ConnectionLimits;
use chorus_server::{AppState, ServiceConfig};
#[allow(unused_imports)] // not every test binary waits on its own
pub use memory_runtime::{primary, wait_until};

/// The service state over `runtime`: no auth, default limits, and the given
/// request timeout and idempotency retention.
pub fn app_state(
    runtime: &Arc<Runtime<KvState>>,
    request_timeout: Duration,
    idempotency: Retention,
) -> Arc<AppState> {
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    let config = ServiceConfig {
        token: None,
        max_body_bytes: 1 << 20,
        request_timeout,
        advertise_url: None,
        ready_as_standby: false,
        connections: ConnectionLimits::default(),
        memory: MemoryLimits::default(),
        idempotency,
    };
    Arc::new(AppState::new(Arc::clone(runtime), config, None, shutdown))
}
