//! An etcd service over a runtime on in-memory stores, served on a loopback
//! port, and an etcd-client connected to it; and the library's test helpers
//! (where the test services are: a real etcd is one).

#![allow(dead_code)] // each test binary uses a different subset

#[path = "../../../chorus/tests/support/memory_runtime.rs"]
pub mod memory_runtime;

#[path = "../../../chorus/tests/support/mod.rs"]
mod shared;

#[allow(unused_imports)] // not every test binary needs the services
pub use shared::*;

use std::net::SocketAddr;
use std::sync::Arc;

use chorus::kv::KvState;
use chorus::runtime::Runtime;
use chorus_etcd::{EtcdConfig, EtcdService};
use tokio::sync::oneshot;

/// A served etcd API: its address, the runtime under it, and the handle
/// that stops it when dropped.
pub struct Served {
    /// Where clients connect.
    pub address: SocketAddr,
    /// The runtime the service runs on.
    pub runtime: Arc<Runtime<KvState>>,
    /// The service's ids.
    pub service: EtcdService,
    _stop: oneshot::Sender<()>,
}

impl Served {
    /// The URL clients connect to, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.address)
    }

    /// A client of this service.
    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([self.endpoint()], None)
            .await
            .expect("etcd-client connects")
    }
}

/// A primary of `database` serving etcd with `configure` applied to the
/// default settings.
pub async fn serve(database: &str, configure: impl FnOnce(&mut EtcdConfig)) -> Served {
    let runtime = memory_runtime::primary(database, |store| store).await;
    serve_runtime(runtime, database, configure).await
}

/// `runtime`, whatever its role, serving etcd for `database` with
/// `configure` applied to the default settings.
pub async fn serve_runtime(
    runtime: Arc<Runtime<KvState>>,
    database: &str,
    configure: impl FnOnce(&mut EtcdConfig),
) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let mut config = EtcdConfig::new(format!("memory://{database}"));
    config.client_urls = vec![format!("http://{address}")];
    configure(&mut config);
    let service = EtcdService::new(Arc::clone(&runtime), config);
    let (stop, stopped) = oneshot::channel();
    let shutdown = async move {
        let _ = stopped.await;
    };
    tokio::spawn(chorus_etcd::serve(listener, service.clone(), shutdown));
    Served {
        address,
        runtime,
        service,
        _stop: stop,
    }
}

/// A primary (`http://primary:1`, sure of its lease) and a standby
/// (`http://standby:1`, in its role, polling every 50 ms) of `database` on shared
/// in-memory stores, each serving etcd with the default settings.
pub async fn primary_and_standby(database: &str) -> (Served, Served) {
    primary_and_standby_with(database, |config| {
        config.standby_poll_interval = std::time::Duration::from_millis(50);
    })
    .await
}

/// [`primary_and_standby`], each runtime configured by `configure`.
pub async fn primary_and_standby_with(
    database: &str,
    configure: impl Fn(&mut chorus::runtime::RuntimeConfig),
) -> (Served, Served) {
    let stores = memory_runtime::MemoryStores::new(database, |store| store).await;
    let start = |holder: &str| stores.runtime_with(holder, &configure);
    let primary = serve_runtime(start("http://primary:1"), database, |_| {}).await;
    memory_runtime::wait_until("primary", || primary.runtime.is_primary_and_sure()).await;
    let standby = serve_runtime(start("http://standby:1"), database, |_| {}).await;
    // A node still booting knows no primary yet to forward to.
    memory_runtime::wait_until("standby", || {
        standby.runtime.status().role == chorus::runtime::Role::Standby
    })
    .await;
    (primary, standby)
}

/// The gRPC status of a refused call.
pub fn status(error: etcd_client::Error) -> tonic::Status {
    match error {
        etcd_client::Error::GRpcStatus(status) => status,
        other => panic!("not a gRPC status: {other:?}"),
    }
}

/// Asserts that `result` failed with `code` and exactly `message`.
pub fn assert_refused<T: std::fmt::Debug>(
    result: Result<T, etcd_client::Error>,
    code: tonic::Code,
    message: &str,
) {
    let refused = status(result.expect_err("refused"));
    assert_eq!((refused.code(), refused.message()), (code, message));
}

/// Real etcd servers, the oracle of the comparison tests.
#[path = "../../../chorus/tests/support/etcd.rs"]
pub mod etcd;
