//! Real etcd servers and etcdctl, the oracle of the etcd API tests.
//!
//! `scripts/services.sh` installs Debian's `etcd-server` and `etcd-client`
//! and exports where their binaries are (`CHORUS_TEST_ETCD_BIN`,
//! `CHORUS_TEST_ETCDCTL_BIN`). A test that compares revisions needs an etcd
//! of its own: the store revision is global, so one shared by tests running
//! at once is no oracle for it. [`EtcdServer::start`] runs a fresh
//! single-member etcd (revision 1) on free loopback ports, its data in memory
//! (`/dev/shm` where there is one: its fsyncs cost nothing there). Like every
//! service, a missing binary skips the test outside CI and fails it under CI.
//!
//! The including test crate has a `support` module with the shared helpers
//! (`crates/chorus/tests/support/mod.rs`, or one re-exporting it).

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::support::{service_var, unique};

/// How long a fresh etcd may take to serve clients (a loaded 2-core machine
/// runs several at once).
pub const ETCD_START_TIMEOUT: Duration = Duration::from_secs(60);
/// Lines of etcd's log kept for failure reports.
const LOG_LINES_KEPT: usize = 40;
/// How many times a start is retried when a port picked as free was taken
/// before etcd bound it.
const START_ATTEMPTS: usize = 3;
/// What etcd logs (with `--logger zap`) once it is ready and serves client
/// requests: "serving client traffic insecurely; …" after its ready signal.
const READY_LINE: &str = "serving client traffic";

/// The etcd binary, or `None` outside CI when the services are not set up.
pub fn etcd_binary() -> Option<PathBuf> {
    service_var("CHORUS_TEST_ETCD_BIN").map(PathBuf::from)
}

/// The etcdctl binary, or `None` outside CI when the services are not set up.
pub fn etcdctl_binary() -> Option<PathBuf> {
    service_var("CHORUS_TEST_ETCDCTL_BIN").map(PathBuf::from)
}

/// A free loopback port (bound once, then released for the child to bind).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A fresh single-member etcd process, killed (and its data removed) on drop.
pub struct EtcdServer {
    child: Child,
    data_dir: PathBuf,
    endpoint: String,
    log_tail: Arc<Mutex<VecDeque<String>>>,
}

impl EtcdServer {
    /// Starts a fresh etcd and waits until it serves clients; `None` when
    /// there is no etcd binary outside CI.
    pub fn start(label: &str) -> Option<EtcdServer> {
        let binary = etcd_binary()?;
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            match EtcdServer::start_once(&binary, label) {
                Ok(server) => return Some(server),
                Err(failure) => failures.push(failure),
            }
        }
        panic!("etcd did not start: {failures:#?}");
    }

    fn start_once(binary: &Path, label: &str) -> Result<EtcdServer, String> {
        let data_dir = data_root().join(unique(&format!("etcd-{label}")));
        let (client, peer) = (free_port(), free_port());
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new(binary)
            .arg("--name")
            .arg(label)
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--listen-client-urls", &endpoint])
            .args(["--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .arg("--initial-cluster")
            .arg(format!("{label}={peer_url}"))
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
        let mut server = EtcdServer {
            child,
            data_dir,
            endpoint,
            log_tail: Arc::default(),
        };
        server.wait_ready()?;
        Ok(server)
    }

    /// Reads etcd's log until it says it serves clients, then keeps draining
    /// it (a full pipe would block etcd).
    fn wait_ready(&mut self) -> Result<(), String> {
        let stderr = self.child.stderr.take().expect("stderr is piped");
        let (ready, ready_seen) = mpsc::channel();
        let tail = Arc::clone(&self.log_tail);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains(READY_LINE) {
                    let _ = ready.send(Ok(()));
                }
                let mut tail = tail.lock().unwrap();
                if tail.len() == LOG_LINES_KEPT {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
            let tail = tail.lock().unwrap();
            let _ = ready.send(Err(Vec::from(tail.clone()).join("\n")));
        });
        let deadline = Instant::now() + ETCD_START_TIMEOUT;
        match ready_seen.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(tail)) => Err(format!("etcd exited before serving:\n{tail}")),
            Err(_) => Err(format!("etcd not ready within {ETCD_START_TIMEOUT:?}")),
        }
    }

    /// The client URL, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The last lines etcd logged, for failure reports.
    pub fn log_tail(&self) -> String {
        Vec::from(self.log_tail.lock().unwrap().clone()).join("\n")
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// Where etcd data dirs go: memory-backed when the machine has `/dev/shm`.
fn data_root() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() && tempfile_writable(shm) {
        shm.to_owned()
    } else {
        std::env::temp_dir()
    }
}

fn tempfile_writable(dir: &Path) -> bool {
    let probe = dir.join(unique("chorus-etcd-probe"));
    let writable = std::fs::write(&probe, b"").is_ok();
    let _ = std::fs::remove_file(probe);
    writable
}
