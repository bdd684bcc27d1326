//! What the benchmarks over etcd's gRPC API share: connections with etcd's
//! clients' settings, Chorus's etcd API started in this process (a primary
//! and, optionally, a standby on the same stores), and percentiles of
//! microsecond samples.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus::kv::KvState;
use chorus::lease::HolderId;
use chorus::runtime::{Role, Runtime, RuntimeConfig, RuntimeStores};
use chorus_etcd::{EtcdConfig, EtcdService};
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};

use super::kv::{Target, embedded_stores, memory_stores};
use crate::CommandError;

/// How long the stopping service waits for its streams to end.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// Bound on connecting and on a watch's create answer.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a started runtime may take to become primary (or standby).
const ROLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Connects to `url`, with Nagle off as etcd's clients have it.
pub(super) async fn connect(url: &str) -> Result<Channel, CommandError> {
    Ok(endpoint(url)?
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))?)
}

/// `url` as a tonic endpoint with etcd's clients' settings, not connected.
pub(super) fn endpoint(url: &str) -> Result<Endpoint, CommandError> {
    Ok(Endpoint::from_shared(url.to_owned())
        .map_err(|e| format!("invalid endpoint {url:?}: {e}"))?
        .tcp_nodelay(true)
        .connect_timeout(CONNECT_TIMEOUT))
}

/// The end of the range of every key starting with `prefix`, as etcd
/// clients compute it.
pub(super) fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Bytes::from(end);
        }
    }
    Bytes::from_static(b"\0")
}

/// Microseconds from `epoch` to now (saturating after 71 minutes).
pub(super) fn micros_since(epoch: Instant) -> u32 {
    u32::try_from(epoch.elapsed().as_micros()).unwrap_or(u32::MAX)
}

/// The `p`-th percentile of sorted microseconds, in milliseconds.
pub(super) fn percentile_ms(sorted_us: &[u32], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let rank = ((sorted_us.len() as f64 * p).ceil() as usize).clamp(1, sorted_us.len());
    f64::from(sorted_us[rank - 1]) / 1000.0
}

/// Starts `target` in this process: its system name (`chorus-<replicas>-<latency>ms`
/// or `chorus-3-local`) and the service, with a standby beside the primary
/// when `standby` is set. `label` names the temporary directory.
pub(super) async fn start_target(
    target: Target,
    replicas: usize,
    latency_ms: u64,
    standby: bool,
    label: &str,
) -> Result<(String, Service), CommandError> {
    Ok(match target {
        Target::Memory => (
            format!("chorus-{replicas}-{latency_ms}ms"),
            Service::start(memory_stores(replicas, latency_ms).await?, standby).await?,
        ),
        Target::Embedded => {
            static STARTED: AtomicU64 = AtomicU64::new(0);
            let dir = std::env::temp_dir().join(format!(
                "chorus-bench-{label}-{}-{}",
                std::process::id(),
                STARTED.fetch_add(1, Ordering::Relaxed)
            ));
            let service = Service::start(embedded_stores(&dir).await?, standby).await?;
            ("chorus-3-local".to_owned(), service.cleaning(dir))
        }
    })
}

/// One runtime serving Chorus's etcd API on a loopback port.
struct Node {
    url: String,
    runtime: Arc<Runtime<KvState>>,
    stop: watch::Sender<bool>,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Node {
    /// Starts a runtime on `stores` and its etcd API on a free port.
    async fn start(stores: RuntimeStores) -> Result<Node, CommandError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let runtime = Arc::new(Runtime::<KvState>::start(
            stores,
            RuntimeConfig::new(HolderId::new(&url)?),
        )?);
        let mut config = EtcdConfig::new("bench");
        config.client_urls = vec![url.clone()];
        let service = EtcdService::new(Arc::clone(&runtime), config);
        let (stop, mut stopped) = watch::channel(false);
        let server = tokio::spawn(chorus_etcd::serve(listener, service, async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }));
        Ok(Node {
            url,
            runtime,
            stop,
            server,
        })
    }

    /// Waits until the runtime has taken `role` (and, as primary, is sure
    /// of its lease).
    async fn wait_for(&self, role: Role) -> Result<(), CommandError> {
        let deadline = Instant::now() + ROLE_TIMEOUT;
        loop {
            let reached = match role {
                Role::Primary => self.runtime.is_primary_and_sure(),
                _ => self.runtime.status().role == role,
            };
            if reached {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the benchmark's {} did not become {role:?} within {ROLE_TIMEOUT:?}",
                    self.url
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the server, closing the streams still open after
    /// [`STOP_GRACE`] (clients' connections may outlive them), and the
    /// runtime.
    async fn stop(self) -> Result<(), CommandError> {
        let _ = self.stop.send(true);
        let abort = self.server.abort_handle();
        match tokio::time::timeout(STOP_GRACE, self.server).await {
            Ok(Ok(served)) => served.map_err(|e| format!("the etcd server failed: {e}"))?,
            Ok(Err(join)) if join.is_cancelled() => {}
            Ok(Err(join)) => return Err(join.into()),
            Err(_) => abort.abort(),
        }
        self.runtime.shutdown().await?;
        Ok(())
    }
}

/// Chorus's etcd API started in this process: a primary, and a standby on
/// the same stores when asked for.
pub(super) struct Service {
    /// The primary first.
    nodes: Vec<Node>,
    /// A directory to remove after the stop.
    scratch: Option<PathBuf>,
}

impl Service {
    /// Starts the primary, waits until it is sure of its lease, then the
    /// standby (when `standby` is set) and waits until it is one.
    pub(super) async fn start(
        stores: RuntimeStores,
        standby: bool,
    ) -> Result<Service, CommandError> {
        let primary = Node::start(stores.clone()).await?;
        primary.wait_for(Role::Primary).await?;
        let mut nodes = vec![primary];
        if standby {
            let standby = Node::start(stores).await?;
            standby.wait_for(Role::Standby).await?;
            nodes.push(standby);
        }
        Ok(Service {
            nodes,
            scratch: None,
        })
    }

    /// Removes `dir` after the stop.
    pub(super) fn cleaning(mut self, dir: PathBuf) -> Service {
        self.scratch = Some(dir);
        self
    }

    /// The primary's URL.
    pub(super) fn url(&self) -> &str {
        &self.nodes[0].url
    }

    /// Stops every node and removes the scratch directory.
    pub(super) async fn stop(self) -> Result<(), CommandError> {
        let mut outcome = Ok(());
        for node in self.nodes {
            let stopped = node.stop().await;
            if outcome.is_ok() {
                outcome = stopped;
            }
        }
        if let Some(dir) = self.scratch {
            let _ = std::fs::remove_dir_all(dir);
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_end_is_etcds() {
        assert_eq!(prefix_end(b"a/"), Bytes::from_static(b"a0"));
        assert_eq!(prefix_end(b"a\xff"), Bytes::from_static(b"b"));
        assert_eq!(prefix_end(b"\xff"), Bytes::from_static(b"\0"));
    }

    #[test]
    fn percentiles_round_up_to_a_sample() {
        let samples = [1_000, 2_000, 3_000, 4_000];
        assert_eq!(percentile_ms(&samples, 0.5), 2.0);
        assert_eq!(percentile_ms(&samples, 0.99), 4.0);
        assert_eq!(percentile_ms(&[], 0.99), 0.0);
    }
}
