//! A real etcd cluster on loopback for `chorus bench etcd`: members started
//! as child processes, each with its own data directory (on local disk, in
//! the temporary directory) and its own client and peer ports, stopped and
//! removed on drop.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chorus_etcd::proto::etcdserverpb::StatusRequest;
use chorus_etcd::proto::etcdserverpb::maintenance_client::MaintenanceClient;

use super::grpc::connect;
use crate::CommandError;

/// How long the members may take to elect a leader and serve clients (a
/// loaded 2-core machine).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one member's status answer.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// One etcd process.
struct Member {
    name: String,
    client_url: String,
    /// `None` once killed.
    child: Option<Child>,
}

/// A running etcd cluster.
pub(super) struct EtcdCluster {
    members: Vec<Member>,
    dir: PathBuf,
}

impl EtcdCluster {
    /// Starts `size` members of `binary` under a fresh directory in the
    /// temporary directory and waits until every one serves clients and
    /// knows the leader.
    pub(super) async fn start(binary: &Path, size: usize) -> Result<EtcdCluster, CommandError> {
        let dir = std::env::temp_dir().join(format!("chorus-bench-etcd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let ports: Vec<(u16, u16)> = (0..size)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<Result<_, std::io::Error>>()?;
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(n, (_, peer))| format!("m{n}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members: Vec::new(),
            dir,
        };
        for (n, (client, peer)) in ports.into_iter().enumerate() {
            let name = format!("m{n}");
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let log = File::create(cluster.dir.join(format!("{name}.log")))?;
            let child = Command::new(binary)
                .args(["--name", &name])
                .arg("--data-dir")
                .arg(cluster.dir.join(&name))
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &initial_cluster])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", "chorus-bench"])
                .args(["--logger", "zap", "--log-outputs", "stderr"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .map_err(|e| {
                    format!(
                        "cannot run etcd ({}): {e}; pass --etcd-binary, or leave etcd-3 out of --systems",
                        binary.display()
                    )
                })?;
            cluster.members.push(Member {
                name,
                client_url,
                child: Some(child),
            });
        }
        cluster.wait_healthy().await?;
        Ok(cluster)
    }

    /// Waits until every member answers its status naming a leader.
    async fn wait_healthy(&mut self) -> Result<(), CommandError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let mut healthy = 0;
            for member in &mut self.members {
                if let Some(Ok(Some(exit))) = member.child.as_mut().map(Child::try_wait) {
                    return Err(format!(
                        "etcd member {} exited ({exit}) before serving; its log: {}",
                        member.name,
                        self.dir.join(format!("{}.log", member.name)).display()
                    )
                    .into());
                }
                if matches!(status(&member.client_url).await, Ok((_, leader)) if leader != 0) {
                    healthy += 1;
                }
            }
            if healthy == self.members.len() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the etcd cluster was not healthy within {START_TIMEOUT:?}; logs in {}",
                    self.dir.display()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every member's client URL.
    pub(super) fn urls(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// The process ids of the members still running.
    pub(super) fn pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|m| m.child.as_ref().map(Child::id))
            .collect()
    }

    /// The index of the member that leads, as the members report it.
    pub(super) async fn leader(&self) -> Result<usize, CommandError> {
        let mut ids = Vec::with_capacity(self.members.len());
        for member in &self.members {
            ids.push(status(&member.client_url).await.ok());
        }
        let leader = ids
            .iter()
            .flatten()
            .map(|(_, leader)| *leader)
            .find(|leader| *leader != 0)
            .ok_or("no etcd member knows a leader")?;
        ids.iter()
            .position(|id| matches!(id, Some((own, _)) if *own == leader))
            .ok_or_else(|| format!("no etcd member has the leader's id {leader:x}").into())
    }

    /// SIGKILLs member `index` and reaps it.
    pub(super) fn kill(&mut self, index: usize) -> Result<(), CommandError> {
        let member = &mut self.members[index];
        let mut child = member
            .child
            .take()
            .ok_or_else(|| format!("etcd member {} was killed already", member.name))?;
        child.kill()?;
        child.wait()?;
        Ok(())
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut child) = member.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A member's own id and the leader's id it knows (0: none).
async fn status(url: &str) -> Result<(u64, u64), CommandError> {
    let call = async {
        let mut client = MaintenanceClient::new(connect(url).await?);
        let answer = client.status(StatusRequest {}).await?.into_inner();
        let own = answer.header.map_or(0, |header| header.member_id);
        Ok::<_, CommandError>((own, answer.leader))
    };
    tokio::time::timeout(STATUS_TIMEOUT, call)
        .await
        .map_err(|_| format!("{url} did not answer its status within {STATUS_TIMEOUT:?}"))?
}

/// A free loopback port (bound once, then released for etcd to bind).
pub(super) fn free_port() -> Result<u16, std::io::Error> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
