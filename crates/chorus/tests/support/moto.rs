//! The S3-compatible moto servers of the test services as processes, for
//! tests that stop one with SIGSTOP: a replica that accepts connections and
//! then answers nothing, the way a hung machine does.
//!
//! The pids come from the pid files `scripts/services.sh` writes
//! (`CHORUS_TEST_MOTO_PID_FILES`, else `.ci/state/moto-{a,b,c}.pid`); each pid
//! is checked to be a moto server listening on its endpoint's port before it
//! is ever signalled. Like every service, a missing one skips the test
//! outside CI and fails it under CI.

#![allow(dead_code)] // each test binary uses a different subset

use std::process::Command;

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

/// A missing service: a panic under CI, a skip (`None`) otherwise.
fn missing_service(why: &str) -> Option<Vec<MotoServer>> {
    if std::env::var_os("CI").is_some() {
        panic!("the moto test servers are missing under CI: {why}");
    }
    eprintln!("skipping: {why}; run `bash scripts/services.sh start` and source .ci/state/env");
    None
}

/// The pid files of the moto servers, in endpoint order.
fn moto_pid_files() -> Vec<String> {
    match std::env::var("CHORUS_TEST_MOTO_PID_FILES") {
        Ok(files) if !files.is_empty() => files.split(',').map(str::to_owned).collect(),
        _ => {
            let state = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.ci/state");
            ["a", "b", "c"]
                .iter()
                .map(|zone| format!("{state}/moto-{zone}.pid"))
                .collect()
        }
    }
}

/// The pid in `file` if it is a live moto server listening on `port`.
fn moto_pid(file: &str, port: u16) -> Result<u32, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read {file}: {e}"))?;
    let pid: u32 = text
        .trim()
        .parse()
        .map_err(|_| format!("{file} holds no pid: {text:?}"))?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map_err(|e| format!("pid {pid} from {file} is not running: {e}"))?;
    let arguments: Vec<String> = cmdline
        .split(|&byte| byte == 0)
        .map(|argument| String::from_utf8_lossy(argument).into_owned())
        .collect();
    // scripts/serialized_moto_server.py (or moto's own moto_server).
    let is_moto = arguments.iter().any(|a| a.contains("moto_server"));
    let on_port = arguments
        .windows(2)
        .any(|w| w[0] == "-p" && w[1] == port.to_string());
    if is_moto && on_port {
        Ok(pid)
    } else {
        Err(format!(
            "pid {pid} from {file} is not a moto server on -p {port}: {arguments:?}"
        ))
    }
}

/// The moto servers behind `CHORUS_TEST_S3_ENDPOINTS`, in the order of
/// [`s3_urls`](crate::support::s3_urls).
pub fn moto_servers() -> Option<Vec<MotoServer>> {
    let endpoints = crate::support::service_var("CHORUS_TEST_S3_ENDPOINTS")?;
    let files = moto_pid_files();
    let endpoints: Vec<&str> = endpoints.split(',').collect();
    if endpoints.len() != files.len() {
        return missing_service(&format!("{endpoints:?} and pid files {files:?} differ"));
    }
    let mut servers = Vec::new();
    for (endpoint, file) in endpoints.iter().zip(&files) {
        let Some(port) = endpoint.rsplit(':').next().and_then(|p| p.parse().ok()) else {
            return missing_service(&format!("endpoint {endpoint} has no port"));
        };
        match moto_pid(file, port) {
            Ok(pid) => servers.push(MotoServer { port, pid }),
            Err(why) => return missing_service(&why),
        }
    }
    Some(servers)
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
