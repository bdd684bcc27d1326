//! S3-compatible moto servers as processes of a test's own, for tests that
//! stop one with SIGSTOP (a replica that accepts connections and then
//! answers nothing, the way a hung machine does) or kill one. The shared
//! servers of `scripts/services.sh` are never signalled: every other test
//! binary uses them, and runs at the same time.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One moto server: its port and the pid of its process.
#[derive(Debug, Clone, Copy)]
pub struct MotoServer {
    /// The port it listens on.
    pub port: u16,
    /// Its process.
    pub pid: u32,
}

/// Sends `signal` (`STOP`, `CONT`) to `pid` with the `kill` program.
pub fn send_signal(pid: u32, signal: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .map_err(|e| format!("cannot run kill: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -{signal} {pid}: {status}"))
    }
}

/// The bucket each [`PrivateMoto`] server holds.
pub const PRIVATE_BUCKET: &str = "private-zone";

/// moto servers of one test's own, each on a port it chose itself and with
/// [`PRIVATE_BUCKET`]: a test that stops one (SIGSTOP) or kills one stalls
/// no other test, so such tests run beside the others. Killed on drop.
pub struct PrivateMoto {
    children: Vec<Child>,
    servers: Vec<MotoServer>,
}

impl PrivateMoto {
    /// Starts `count` servers. Without moto's virtualenv (`scripts/services.sh
    /// start` makes it) a skip (`None`) outside CI, a panic under CI.
    pub fn start(count: usize) -> Option<PrivateMoto> {
        // scripts/services.sh installs moto into this virtualenv; the
        // launcher serializes requests so conditional PUTs are atomic.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let python = root.join(".ci/state/venv/bin/python");
        if !python.exists() {
            assert!(
                std::env::var_os("CI").is_none(),
                "moto's virtualenv is missing under CI: {python:?}"
            );
            eprintln!("skipping: {python:?} missing; run `bash scripts/services.sh start`");
            return None;
        }
        let mut moto = PrivateMoto {
            children: Vec::new(),
            servers: Vec::new(),
        };
        // All spawned first: the servers start up (about a second of
        // Python imports each) side by side.
        for _ in 0..count {
            // Port 0: the server binds a free port itself and prints it, so
            // no other process can take the port between choosing and
            // binding it.
            let child = Command::new(&python)
                .arg(root.join("scripts/serialized_moto_server.py"))
                .args(["-H", "127.0.0.1", "-p", "0"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("the moto server starts");
            moto.children.push(child);
        }
        for child in &mut moto.children {
            let mut first_line = String::new();
            BufReader::new(child.stdout.take().expect("piped"))
                .read_line(&mut first_line)
                .expect("the moto server's first line");
            let port = first_line
                .trim()
                .strip_prefix("listening on ")
                .and_then(|port| port.parse().ok())
                .unwrap_or_else(|| panic!("unexpected first line {first_line:?}"));
            moto.servers.push(MotoServer {
                port,
                pid: child.id(),
            });
        }
        for server in &moto.servers {
            create_bucket(server.port);
        }
        Some(moto)
    }

    /// The servers, in start order.
    pub fn servers(&self) -> &[MotoServer] {
        &self.servers
    }

    /// One S3 store URL per server, in start order, under a fresh prefix.
    pub fn s3_urls(&self, label: &str) -> Vec<String> {
        let prefix = crate::support::unique(label);
        self.servers
            .iter()
            .map(|server| {
                let endpoint = format!("http://127.0.0.1:{}", server.port);
                crate::support::s3_url(PRIVATE_BUCKET, &prefix, &endpoint)
            })
            .collect()
    }
}

impl Drop for PrivateMoto {
    fn drop(&mut self) {
        for child in &mut self.children {
            // SIGKILL ends a stopped process too.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Creates [`PRIVATE_BUCKET`] on the server at `port` once it answers
/// (moto takes an unsigned PUT).
fn create_bucket(port: u16) {
    let url = format!("http://127.0.0.1:{port}/{PRIVATE_BUCKET}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let created = Command::new("curl")
            .args(["-sf", "-X", "PUT", &url])
            .status()
            .is_ok_and(|status| status.success());
        if created {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the moto server on port {port} did not answer in 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A stopped server; SIGCONT on drop, so even a panic cannot leave it stopped.
pub struct Frozen {
    server: MotoServer,
}

impl Frozen {
    /// Stops `server` with SIGSTOP.
    pub fn freeze(server: MotoServer) -> Frozen {
        send_signal(server.pid, "STOP").expect("SIGSTOP a moto server");
        Frozen { server }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Err(e) = send_signal(self.server.pid, "CONT") {
            eprintln!("cannot resume moto pid {}: {e}", self.server.pid);
        }
    }
}
