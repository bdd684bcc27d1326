//! Chorus for `chorus bench etcd`: a primary and a standby `chorus serve`
//! process (this executable) on one fresh embedded-default data directory
//! (three local replica directories), each serving etcd on its own loopback
//! port, so that the load generator runs in a process of its own and each
//! system's CPU is its processes' own. Stopped and removed on drop.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::etcd_cluster::free_port;
use super::failover::{Instance, wait_for_role};
use crate::CommandError;

/// Lease time to live of both processes: `chorus serve`'s default, so the
/// failover cell measures what a default deployment does.
const LEASE_TTL_SECS: u64 = 10;
/// Bound on a graceful stop (SIGTERM: drain, final snapshot, release).
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// A running primary and standby.
pub(super) struct ChorusPair {
    /// The primary, `None` once killed.
    primary: Option<Instance>,
    standby: Instance,
    /// The etcd URLs, the primary's first.
    etcd_urls: Vec<String>,
    dir: PathBuf,
}

impl ChorusPair {
    /// Starts the primary, waits until it is primary, then the standby, and
    /// waits until it is a caught-up standby. Every request to a replica
    /// waits `replica_latency_ms` first (`chorus serve --replica-latency-ms`).
    pub(super) async fn start(replica_latency_ms: u64) -> Result<ChorusPair, CommandError> {
        static STARTED: AtomicU64 = AtomicU64::new(0);
        let executable = std::env::current_exe()?;
        let dir = std::env::temp_dir().join(format!(
            "chorus-bench-etcd-chorus-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()?;
        let mut etcd_urls = Vec::with_capacity(2);
        let start = |etcd_urls: &mut Vec<String>| -> Result<Instance, CommandError> {
            let etcd = format!("127.0.0.1:{}", free_port()?);
            let extra = [
                "--etcd-listen".to_owned(),
                etcd.clone(),
                "--replica-latency-ms".to_owned(),
                replica_latency_ms.to_string(),
            ];
            let node = Instance::start(&executable, &dir, LEASE_TTL_SECS, &extra)?;
            etcd_urls.push(format!("http://{etcd}"));
            Ok(node)
        };
        let primary = start(&mut etcd_urls)?;
        wait_for_role(&http, &primary.url, "primary").await?;
        let standby = start(&mut etcd_urls)?;
        wait_for_role(&http, &standby.url, "standby").await?;
        Ok(ChorusPair {
            primary: Some(primary),
            standby,
            etcd_urls,
            dir,
        })
    }

    /// Both processes' etcd URLs, the primary's first.
    pub(super) fn urls(&self) -> Vec<String> {
        self.etcd_urls.clone()
    }

    /// The process ids of the processes still running.
    pub(super) fn pids(&self) -> Vec<u32> {
        self.primary
            .iter()
            .chain([&self.standby])
            .map(Instance::pid)
            .collect()
    }

    /// SIGKILLs the primary and reaps it: nothing drained, the lease not
    /// released.
    pub(super) fn kill_primary(&mut self) -> Result<(), CommandError> {
        let mut primary = self
            .primary
            .take()
            .ok_or("the primary was killed already")?;
        primary.kill();
        Ok(())
    }

    /// Stops the processes still running gracefully (SIGTERM) and removes
    /// the data directory.
    pub(super) async fn stop(mut self) -> Result<(), CommandError> {
        let mut outcome = Ok(());
        for node in self.primary.iter_mut().chain([&mut self.standby]) {
            let stopped = match node.terminate() {
                Ok(()) => node.wait_exit(STOP_TIMEOUT).await,
                Err(e) => Err(e),
            };
            if outcome.is_ok() {
                outcome = stopped;
            }
        }
        outcome
    }
}

impl Drop for ChorusPair {
    fn drop(&mut self) {
        // The instances kill themselves on drop; the directory goes after.
        if let Some(mut primary) = self.primary.take() {
            primary.kill();
        }
        self.standby.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
