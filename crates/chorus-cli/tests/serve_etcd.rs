//! `chorus serve --etcd-listen`: etcd v3 clients against the binary, and
//! what happens when the etcd address cannot be bound.

mod support;

use std::net::TcpListener;
use std::time::Duration;

use support::server::{Launch, ROLE_TIMEOUT, Server};
use support::{ETCD_LISTEN_VARIABLE, chorus_command};
use tempfile::TempDir;

/// The line `chorus serve` prints once it serves the etcd API.
const ETCD_LINE: &str = "chorus serve: etcd API on ";
/// gRPC's code `Unavailable`, on which etcd clients try another endpoint.
const GRPC_UNAVAILABLE: i32 = 14;
/// What the log says when the default etcd address is taken.
const DEFAULT_TAKEN: &str = "not serving the etcd API: cannot listen on 127.0.0.1:2379";

/// The etcd address `server` printed.
fn etcd_address(server: &Server) -> String {
    let line = server.wait_for_line(ROLE_TIMEOUT, |line| line.starts_with(ETCD_LINE));
    line[ETCD_LINE.len()..].trim().to_owned()
}

/// A runtime for the async etcd client.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn etcd_clients_put_and_get_through_the_binary_and_shutdown_drains_the_api() {
    let dir = TempDir::new().unwrap();
    let mut server = Launch::new(dir.path())
        .args(["--etcd-listen", "127.0.0.1:0"])
        .start("etcd");
    server.wait_for_role("primary");
    let address = etcd_address(&server);
    let runtime = runtime();
    runtime.block_on(async {
        let mut client = etcd_client::Client::connect([format!("http://{address}")], None)
            .await
            .unwrap();
        let put = client.put("greeting", "hello", None).await.unwrap();
        assert_eq!(put.header().unwrap().revision(), 2);
        let got = client.get("greeting", None).await.unwrap();
        assert_eq!(got.kvs()[0].value(), b"hello");
        let members = client.member_list().await.unwrap();
        assert_eq!(
            members.members()[0].client_urls(),
            [format!("http://{address}")]
        );
    });
    // The HTTP API serves the same key from the same machine.
    assert_eq!(server.endpoint().get("greeting").text(), "hello");
    let exit = server.terminate(ROLE_TIMEOUT);
    assert!(exit.success(), "{exit:?}\n{}", server.stderr_tail());
    server.wait_for_line(ROLE_TIMEOUT, |line| line == "chorus serve: stopped");
    runtime.block_on(async {
        let refused = etcd_client::Client::connect([format!("http://{address}")], None).await;
        let answered = match refused {
            Ok(mut client) => client.get("greeting", None).await.is_ok(),
            Err(_) => false,
        };
        assert!(!answered, "the etcd API stopped with the process");
    });
}

#[test]
fn a_taken_default_etcd_port_is_logged_once_and_http_is_served_anyway() {
    // Held here (or already by something else: taken either way).
    let _holder = TcpListener::bind("127.0.0.1:2379");
    let dir = TempDir::new().unwrap();
    let server = Launch::new(dir.path())
        .unset_env(ETCD_LISTEN_VARIABLE)
        .start("default-taken");
    server.wait_for_role("primary");
    server.endpoint().put_ok("k", "v");
    let deadline = std::time::Instant::now() + ROLE_TIMEOUT;
    while !server.stderr_tail().contains(DEFAULT_TAKEN) {
        assert!(
            std::time::Instant::now() < deadline,
            "no warning:\n{}",
            server.stderr_tail()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
    assert_eq!(server.stderr_tail().matches(DEFAULT_TAKEN).count(), 1);
    assert!(
        !server
            .stdout()
            .iter()
            .any(|line| line.starts_with(ETCD_LINE))
    );
}

#[test]
fn a_taken_etcd_address_given_explicitly_is_an_error() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let dir = TempDir::new().unwrap();
    let output = chorus_command(dir.path())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--etcd-listen",
            &address,
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot listen for etcd clients on {address} (--etcd-listen)"
        )),
        "{stderr}"
    );
}

#[test]
fn etcd_listen_off_serves_http_only() {
    let dir = TempDir::new().unwrap();
    let server = Launch::new(dir.path())
        .unset_env(ETCD_LISTEN_VARIABLE)
        .args(["--etcd-listen", "off"])
        .start("etcd-off");
    server.wait_for_role("primary");
    server.endpoint().put_ok("k", "v");
    let stdout = server.stdout();
    assert!(
        !stdout.iter().any(|line| line.starts_with(ETCD_LINE)),
        "{stdout:?}"
    );
    assert!(
        !server.stderr_tail().contains("etcd"),
        "{}",
        server.stderr_tail()
    );
}

/// Watch and LeaseKeepAlive streams never end on their own. A SIGTERMed
/// node used to wait for them for its whole shutdown grace before it
/// released the writer lease, so no node took writes meanwhile (10 s by
/// default, against a takeover of about the lease TTL after a SIGKILL).
/// Now they end `Unavailable` at once (clients resume on another node) and
/// the process stops well within the grace.
#[test]
fn a_sigtermed_node_ends_its_etcd_streams_instead_of_waiting_out_the_grace() {
    const GRACE_SECS: u64 = 60;
    let dir = TempDir::new().unwrap();
    let mut server = Launch::new(dir.path())
        .args(["--etcd-listen", "127.0.0.1:0"])
        .args(["--shutdown-grace-secs", &GRACE_SECS.to_string()])
        .start("streams");
    server.wait_for_role("primary");
    let address = etcd_address(&server);
    let runtime = runtime();
    let (mut watch, _keeper, mut keep_alives) = runtime.block_on(async {
        let mut client = etcd_client::Client::connect([format!("http://{address}")], None)
            .await
            .unwrap();
        let watch = client.watch("k", None).await.unwrap();
        let lease = client.lease_grant(60, None).await.unwrap();
        let (mut keeper, mut keep_alives) = client.lease_keep_alive(lease.id()).await.unwrap();
        keeper.keep_alive().await.unwrap();
        assert_eq!(keep_alives.message().await.unwrap().unwrap().ttl(), 60);
        // The keeper is kept, so the request side stays open.
        (watch, keeper, keep_alives)
    });
    let signalled = std::time::Instant::now();
    let exit = server.terminate(Duration::from_secs(GRACE_SECS / 3));
    assert!(exit.success(), "{exit:?}\n{}", server.stderr_tail());
    eprintln!("stopped {:?} after SIGTERM", signalled.elapsed());
    runtime.block_on(async {
        let watch_end = loop {
            match watch.message().await {
                Ok(Some(_created)) => continue,
                other => break other,
            }
        };
        let keep_alive_end = keep_alives.message().await;
        for (what, end) in [
            ("watch", watch_end.map(|_| ())),
            ("keep-alive", keep_alive_end.map(|_| ())),
        ] {
            match end {
                Err(etcd_client::Error::GRpcStatus(status)) => {
                    assert_eq!(status.code() as i32, GRPC_UNAVAILABLE, "{what}: {status:?}");
                    assert!(
                        status.message().contains("shutting down"),
                        "{what}: {status:?}"
                    );
                }
                other => panic!("{what}: ended with {other:?}"),
            }
        }
    });
}

#[test]
fn etcd_watch_flags_out_of_range_are_refused_naming_the_flag_and_its_range() {
    let dir = TempDir::new().unwrap();
    for (flag, bad, range) in [
        ("--etcd-watch-progress-notify-interval-ms", "99", "100..="),
        ("--etcd-watch-send-buffer-bytes", "0", "1..="),
        ("--etcd-watch-stall-timeout-secs", "0", "1..="),
        ("--etcd-watch-stall-timeout-secs", "ten", "invalid digit"),
    ] {
        let output = chorus_command(dir.path())
            .args(["serve", "--print-config", flag, bad])
            .output()
            .unwrap();
        assert!(!output.status.success(), "{flag} {bad} was accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(flag) && stderr.contains(range),
            "{flag} {bad}: {stderr}"
        );
    }
    let output = chorus_command(dir.path())
        .args(["serve", "--print-config"])
        .args(["--etcd-watch-progress-notify-interval-ms", "250"])
        .args(["--etcd-watch-send-buffer-bytes", "65536"])
        .args(["--etcd-watch-stall-timeout-secs", "5"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let config: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(config["etcd_watch_progress_notify_interval_ms"], 250);
    assert_eq!(config["etcd_watch_send_buffer_bytes"], 65536);
    assert_eq!(config["etcd_watch_stall_timeout_secs"], 5);
    let defaults = chorus_command(dir.path())
        .args(["serve", "--print-config"])
        .output()
        .unwrap();
    let config: serde_json::Value = serde_json::from_slice(&defaults.stdout).unwrap();
    assert_eq!(config["etcd_watch_progress_notify_interval_ms"], 600_000);
    assert_eq!(config["etcd_watch_send_buffer_bytes"], 4 << 20);
    assert_eq!(config["etcd_watch_stall_timeout_secs"], 60);
}

#[test]
fn the_progress_notify_interval_flag_reaches_the_watch_service() {
    let dir = TempDir::new().unwrap();
    let mut server = Launch::new(dir.path())
        .args(["--etcd-listen", "127.0.0.1:0"])
        .args(["--etcd-watch-progress-notify-interval-ms", "200"])
        .start("etcd-progress");
    server.wait_for_role("primary");
    let address = etcd_address(&server);
    runtime().block_on(async {
        let mut client = etcd_client::Client::connect([format!("http://{address}")], None)
            .await
            .unwrap();
        let options = etcd_client::WatchOptions::new().with_progress_notify();
        let mut stream = client.watch("quiet", Some(options)).await.unwrap();
        let created = stream.message().await.unwrap().unwrap();
        assert!(created.created());
        // The default interval is ten minutes: a notification within a
        // (generous) few seconds comes from the flag.
        let notified = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("a progress notification within 10 s")
            .unwrap()
            .unwrap();
        assert!(notified.events().is_empty() && !notified.canceled());
        assert_eq!(notified.watch_id(), created.watch_id());
    });
    let exit = server.terminate(ROLE_TIMEOUT);
    assert!(exit.success(), "{exit:?}\n{}", server.stderr_tail());
}

/// One space quota for both APIs: `--quota-backend-bytes` refuses an HTTP
/// write over it (`507`) as it refuses an etcd one, and the NOSPACE alarm
/// an etcd write raises refuses HTTP writes that add data until it is
/// disarmed.
#[test]
fn the_space_quota_and_its_alarm_hold_for_both_apis() {
    let dir = TempDir::new().unwrap();
    let server = Launch::new(dir.path())
        .args([
            "--etcd-listen",
            "127.0.0.1:0",
            "--quota-backend-bytes",
            "3000",
        ])
        .start("etcd-quota");
    server.wait_for_role("primary");
    let address = etcd_address(&server);
    let http = server.endpoint();
    let big = "v".repeat(4000);

    let refused = http.put("big", &big);
    assert_eq!(refused.status, 507, "{}", refused.text());
    let body = refused.json();
    assert_eq!(body["quota_bytes"], 3000, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("space quota"),
        "{body}"
    );

    let runtime = runtime();
    let mut client = runtime
        .block_on(etcd_client::Client::connect(
            [format!("http://{address}")],
            None,
        ))
        .unwrap();
    let member = runtime.block_on(async {
        let refused = client.put("big", big.as_str(), None).await;
        match refused {
            Err(etcd_client::Error::GRpcStatus(status)) => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
                assert!(
                    status.message().contains("database space exceeded"),
                    "{status:?}"
                );
            }
            other => panic!("an etcd put over the quota answered {other:?}"),
        }
        client.status().await.unwrap().header().unwrap().member_id()
    });

    // The alarm the etcd write raised refuses a small HTTP put.
    let refused = http.put("small", "v");
    assert_eq!(refused.status, 507, "{}", refused.text());
    assert!(
        refused.text().contains("NOSPACE alarm is raised"),
        "{}",
        refused.text()
    );

    runtime.block_on(async {
        let mut disarm = etcd_client::AlarmOptions::new();
        disarm.with_member(member);
        client
            .alarm(
                etcd_client::AlarmAction::Deactivate,
                etcd_client::AlarmType::Nospace,
                Some(disarm),
            )
            .await
            .unwrap();
    });
    http.put_ok("small", "v");
}
