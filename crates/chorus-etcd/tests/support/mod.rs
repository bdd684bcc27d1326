//! An etcd service over a primary on in-memory stores, served on a loopback
//! port, and an etcd-client connected to it.

#[path = "../../../chorus/tests/support/memory_runtime.rs"]
pub mod memory_runtime;

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
    /// A client of this service.
    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([format!("http://{}", self.address)], None)
            .await
            .expect("etcd-client connects")
    }
}

/// A primary of `database` serving etcd with `configure` applied to the
/// default settings.
pub async fn serve(database: &str, configure: impl FnOnce(&mut EtcdConfig)) -> Served {
    let runtime = memory_runtime::primary(database, |store| store).await;
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

/// Real etcd servers, the oracle of the comparison tests.
#[path = "../../../chorus/tests/support/etcd.rs"]
pub mod etcd;

/// The value of the service variable `name`, or `None` (after printing why)
/// when it is unset outside CI. Panics under CI.
#[allow(dead_code)] // used by the tests that start a real etcd
pub fn service_var(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => Some(value),
        _ if std::env::var_os("CI").is_some() => {
            panic!(
                "{name} is not set under CI: the test services did not start (scripts/services.sh)"
            )
        }
        _ => {
            eprintln!(
                "skipping: {name} is not set; run `bash scripts/services.sh start` and source .ci/state/env"
            );
            None
        }
    }
}

/// A name no other test run uses.
#[allow(dead_code)] // used by the tests that start a real etcd
pub fn unique(label: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{label}-{nanos:x}-{:x}-{count}", std::process::id())
}
