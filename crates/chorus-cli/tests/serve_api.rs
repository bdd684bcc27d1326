//! `chorus serve`'s streams, metrics and configuration through the real
//! binary: the key watch (by store revision) and the log (by index), as
//! server-sent events resumable where they stopped (410 below what is
//! retained); `/metrics` carrying the log's, the
//! runtime's and the HTTP layer's series; `--print-config` redacting secrets.

mod support;

use std::io::{BufRead, BufReader};
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;
use support::server::{Endpoint, Launch, Server};
use tempfile::TempDir;

/// One server-sent event.
#[derive(Debug, Clone, PartialEq)]
struct Event {
    id: Option<String>,
    kind: String,
    data: Value,
}

/// Reads server-sent events from a streaming response, one at a time.
struct Events {
    lines: std::io::Lines<BufReader<reqwest::blocking::Response>>,
}

impl Events {
    /// Opens `path` as an event stream; panics unless it answers 200.
    fn open(endpoint: &Endpoint, path: &str, last_event_id: Option<&str>) -> Events {
        let mut request = endpoint.request(Method::GET, path);
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().expect("the stream opens");
        assert_eq!(response.status().as_u16(), 200, "{path}");
        Events {
            lines: BufReader::new(response).lines(),
        }
    }

    /// The next event (keep-alive comments skipped).
    fn next(&mut self) -> Event {
        let (mut id, mut kind, mut data) = (None, "message".to_owned(), String::new());
        loop {
            let line = self.lines.next().expect("the stream goes on").unwrap();
            if line.is_empty() && !data.is_empty() {
                let data = serde_json::from_str(&data).expect("event data is JSON");
                return Event { id, kind, data };
            }
            if let Some(value) = line.strip_prefix("id:") {
                id = Some(value.trim().to_owned());
            } else if let Some(value) = line.strip_prefix("event:") {
                kind = value.trim().to_owned();
            } else if let Some(value) = line.strip_prefix("data:") {
                data.push_str(value.trim_start());
            }
        }
    }
}

fn started(dir: &TempDir) -> (Launch, Server) {
    let launch = Launch::new(dir.path()).args(["--data-dir", "data"]);
    let server = launch.start("server");
    server.wait_for_role("primary");
    (launch, server)
}

#[test]
fn watch_streams_changes_resumable_by_revision_and_is_gone_below_its_history() {
    let dir = TempDir::new().unwrap();
    let (launch, mut server) = started(&dir);
    let endpoint = server.endpoint();
    // A raw record first: indices and revisions part (an empty store is at
    // revision 1, and the raw record moves no revision).
    let raw = endpoint.send(endpoint.request(Method::POST, "/v1/log").body("raw"));
    assert_eq!(raw.expect_index("raw append"), 0);
    assert_eq!(endpoint.put_ok("a/1", "one"), 2);
    assert_eq!(endpoint.put_ok("a/2", "two"), 3);
    assert_eq!(endpoint.put_ok("b/1", "elsewhere"), 4);
    let deleted = endpoint.send(endpoint.request(Method::DELETE, "/v1/kv/a/1"));
    assert_eq!(deleted.expect_index("delete"), 4);
    assert_eq!(deleted.expect_revision("delete"), 5);

    let mut events = Events::open(&endpoint, "/v1/kv/watch?prefix=a/&from=0", None);
    let first = events.next();
    assert_eq!(first.id.as_deref(), Some("2.0"));
    assert_eq!(first.kind, "put");
    assert_eq!(first.data["key"], "a/1");
    assert_eq!(first.data["value"], "one");
    assert_eq!(
        (&first.data["revision"], &first.data["index"]),
        (&2.into(), &1.into())
    );
    assert_eq!(events.next().id.as_deref(), Some("3.0"));
    let delete = events.next();
    assert_eq!(
        (delete.id.as_deref(), delete.kind.as_str()),
        (Some("5.0"), "delete")
    );
    assert_eq!(delete.data["key"], "a/1");
    // Changes applied after the stream opened arrive too.
    endpoint.put_ok("a/3", "three");
    let live = events.next();
    assert_eq!(
        (live.id.as_deref(), &live.data["value"]),
        (Some("6.0"), &Value::from("three"))
    );

    // Resuming after revision 3 with Last-Event-ID skips what was seen, and
    // so does starting from revision 4 (b/1's, not under the prefix).
    let mut resumed = Events::open(&endpoint, "/v1/kv/watch?prefix=a/", Some("3.0"));
    assert_eq!(resumed.next().id.as_deref(), Some("5.0"));
    let mut from = Events::open(&endpoint, "/v1/kv/watch?prefix=a/&from=4", None);
    assert_eq!(from.next().id.as_deref(), Some("5.0"));
    drop((events, resumed, from));

    // After a restart the history begins at the final snapshot: older
    // revisions are gone, and the answer says where to resume, which is
    // the revision after a list's.
    server.terminate(Duration::from_secs(60));
    let server = launch.start("restarted");
    server.wait_for_role("primary");
    let endpoint = server.endpoint();
    let gone = endpoint.send(endpoint.request(Method::GET, "/v1/kv/watch?from=0"));
    assert_eq!(gone.status, 410, "{}", gone.text());
    assert_eq!(gone.json()["oldest"], 7);
    let list = endpoint.send(endpoint.request(Method::GET, "/v1/kv?prefix=a/"));
    assert_eq!(list.json()["revision"], 6);
    assert_eq!(list.header("x-chorus-revision"), Some("6"));
    let mut events = Events::open(&endpoint, "/v1/kv/watch?from=7", None);
    endpoint.put_ok("a/4", "four");
    assert_eq!(events.next().id.as_deref(), Some("7.0"));
}

#[test]
fn a_watch_resumed_inside_a_batch_delivers_the_rest_of_it_exactly_once() {
    let dir = TempDir::new().unwrap();
    let (_launch, server) = started(&dir);
    let endpoint = server.endpoint();
    let batch = serde_json::json!({"operations": [
        {"op": "put", "key": "w/1", "value": "one"},
        {"op": "put", "key": "w/2", "value": "two"},
        {"op": "delete", "key": "w/absent"},
        {"op": "put", "key": "w/3", "value": "three"},
    ]});
    let written = endpoint.send(
        endpoint
            .request(Method::POST, "/v1/kv:batch")
            .body(batch.to_string()),
    );
    assert_eq!(written.expect_index("batch"), 0);
    assert_eq!(
        written.expect_revision("batch"),
        2,
        "a batch is one revision"
    );

    // A client that read exactly one event and dropped.
    let mut events = Events::open(&endpoint, "/v1/kv/watch?from=0", None);
    let first = events.next();
    assert_eq!(
        (first.id.as_deref(), &first.data["key"]),
        (Some("2.0"), &Value::from("w/1"))
    );
    drop(events);

    // It resumes with the id it saw and gets the other two puts; the delete
    // of an absent key changed nothing and is no event.
    let last = first.id.unwrap();
    let mut resumed = Events::open(&endpoint, "/v1/kv/watch", Some(&last));
    let second = resumed.next();
    assert_eq!(
        (
            second.id.as_deref(),
            &second.data["key"],
            &second.data["position"]
        ),
        (Some("2.1"), &Value::from("w/2"), &Value::from(1))
    );
    let third = resumed.next();
    assert_eq!(
        (third.id.as_deref(), &third.data["key"]),
        (Some("2.3"), &Value::from("w/3"))
    );
    // Nothing twice: the next event is the next change. A delete of an
    // absent key changes nothing and moves no revision.
    let deleted = endpoint.send(endpoint.request(Method::DELETE, "/v1/kv/w/absent"));
    assert_eq!(deleted.expect_index("delete of an absent key"), 1);
    assert_eq!(deleted.expect_revision("delete of an absent key"), 2);
    assert_eq!(endpoint.put_ok("w/4", "four"), 3);
    let next = resumed.next();
    assert_eq!(
        (next.id.as_deref(), &next.data["key"]),
        (Some("3.0"), &Value::from("w/4"))
    );

    // The largest index has no successor: refused, never wrapped to 0.
    for path in ["/v1/kv/watch", "/v1/log?follow=true"] {
        let refused = endpoint.send(
            endpoint
                .request(Method::GET, path)
                .header("last-event-id", u64::MAX.to_string()),
        );
        assert_eq!(refused.status, 400, "{path}: {}", refused.text());
    }
}

#[test]
fn the_log_is_read_in_pages_and_followed_as_events() {
    let dir = TempDir::new().unwrap();
    let (_launch, server) = started(&dir);
    let endpoint = server.endpoint();
    for (index, record) in ["first", "second", "third"].into_iter().enumerate() {
        let appended = endpoint.send(endpoint.request(Method::POST, "/v1/log").body(record));
        assert_eq!(appended.expect_index("append"), index as u64);
    }
    let page = endpoint.send(endpoint.request(Method::GET, "/v1/log?from=1&limit=1"));
    assert_eq!(page.status, 200, "{}", page.text());
    let page = page.json();
    assert_eq!(page["records"][0]["index"], 1);
    assert_eq!(page["records"][0]["data"], "second");
    assert_eq!(page["next"], 2);
    let binary = endpoint.send(
        endpoint
            .request(Method::POST, "/v1/log")
            .body(vec![0xff, 0]),
    );
    assert_eq!(binary.expect_index("binary append"), 3);
    let all = endpoint
        .send(endpoint.request(Method::GET, "/v1/log"))
        .json();
    assert_eq!(all["records"].as_array().unwrap().len(), 4);
    assert_eq!(all["records"][3]["data_b64"], "/wA=");

    let mut events = Events::open(&endpoint, "/v1/log?from=2&follow=true", None);
    assert_eq!(events.next().data["data"], "third");
    assert_eq!(events.next().id.as_deref(), Some("3"));
    endpoint.put_ok("key", "value");
    let put = events.next();
    assert_eq!(put.id.as_deref(), Some("4"));
    assert!(
        put.data.get("data_b64").is_some() || put.data.get("data").is_some(),
        "{put:?}"
    );

    let bad = endpoint.send(endpoint.request(Method::GET, "/v1/log?limit=0"));
    assert_eq!(bad.status, 400, "{}", bad.text());
}

#[test]
fn metrics_carry_the_log_runtime_lease_and_http_series() {
    let dir = TempDir::new().unwrap();
    let (_launch, server) = started(&dir);
    let endpoint = server.endpoint();
    endpoint.put_ok("k", "v");
    assert_eq!(endpoint.get("k").status, 200);
    let metrics = endpoint.send(endpoint.request(Method::GET, "/metrics"));
    assert_eq!(metrics.status, 200);
    let text = metrics.text();
    for series in [
        "chorus_append_records_total",
        "chorus_commit_latency_seconds",
        "chorus_recovery_runs_total",
        "chorus_lease_operations_total",
        "chorus_runtime_phase_seconds",
        "chorus_runtime_applied_index",
        "chorus_runtime_role{role=\"primary\"} 1",
        "chorus_http_requests_total{route=\"/v1/kv/{*key}\",method=\"PUT\",status=\"200\"}",
        "chorus_http_request_seconds",
    ] {
        assert!(text.contains(series), "no {series} in:\n{text}");
    }
}

/// `chorus bench kv --url` drives a running service with its token and
/// prints its three rows, every request answered; with a wrong token it
/// fails before measuring anything, naming the refusal.
#[test]
fn bench_kv_drives_a_running_service_with_its_token() {
    let dir = TempDir::new().unwrap();
    let server = Launch::new(dir.path())
        .args(["--data-dir", "data"])
        .token("s3cret")
        .start("server");
    server.wait_for_role("primary");
    let url = server.endpoint().url;
    let bench = |token: &str| {
        support::chorus_command(dir.path())
            .args(["bench", "kv", "--url", &url, "--token", token, "--json"])
            .args([
                "--clients",
                "4",
                "--seconds",
                "1",
                "--light-puts",
                "10",
                "--keys",
                "20",
            ])
            .output()
            .expect("chorus runs")
    };

    let output = bench("s3cret");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let rows: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON row"))
        .collect();
    let scenarios: Vec<&str> = rows
        .iter()
        .map(|r| r["scenario"].as_str().unwrap())
        .collect();
    assert_eq!(
        scenarios,
        ["put, light", "put, peak", "get, peak"],
        "{rows:?}"
    );
    for row in &rows {
        assert_eq!(row["errors"], 0, "{row}");
        assert!(row["requests"].as_u64().unwrap() > 0, "{row}");
    }
    assert_eq!(rows[0]["requests"], 10);
    let endpoint = server.endpoint();
    assert_eq!(endpoint.get("bench/load/19").status, 200);

    let refused = bench("wrong");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("refused the benchmark's token (GET /readyz answered 401)"),
        "{stderr}"
    );
    assert!(refused.stdout.is_empty(), "no row is measured");
}

#[test]
fn print_config_shows_the_merged_configuration_with_secrets_redacted() {
    let dir = TempDir::new().unwrap();
    let output = support::chorus_command(dir.path())
        .args([
            "serve",
            "--print-config",
            "--token",
            "t0ps3cret",
            "--register",
            "postgres://chorus:pa55word@db.internal/chorus?register=orders",
            "--listen",
            "127.0.0.1:7171",
            "--lease-ttl-secs",
            "20",
            "--replica-latency-ms",
            "10",
            "--hedge-after-percentile",
            "90",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        !text.contains("t0ps3cret") && !text.contains("pa55word"),
        "{text}"
    );
    let config: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(config["token"], "<redacted>");
    assert_eq!(config["advertise_url"], "http://127.0.0.1:7171");
    assert_eq!(config["holder"], "http://127.0.0.1:7171");
    assert_eq!(config["lease_ttl_secs"], 20);
    assert_eq!(config["replica_latency_ms"], 10);
    assert_eq!(config["hedge_after_percentile"], 90);
    // The etcd listener's cap leaves the HTTP listener's share of the
    // descriptors alone.
    let etcd_cap = config["etcd_max_connections"].as_u64().unwrap();
    assert!(
        etcd_cap <= config["max_connections"].as_u64().unwrap(),
        "{config}"
    );
    assert_eq!(config["snapshot_payload_timeout_secs"], 300);
    assert_eq!(config["replicas"].as_array().unwrap().len(), 3);
    assert!(
        !dir.path().join("chorus-data").exists(),
        "printing creates nothing"
    );
}

/// Regression: every instance listening on 0.0.0.0:7070 advertised, and by
/// default held the lease as, `http://0.0.0.0:7070`.
#[test]
fn the_default_holder_id_never_names_an_unspecified_address() {
    let dir = TempDir::new().unwrap();
    for listen in ["0.0.0.0:7171", "[::]:7171"] {
        let output = support::chorus_command(dir.path())
            .args(["serve", "--print-config", "--listen", listen])
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let config: Value = serde_json::from_slice(&output.stdout).unwrap();
        let holder = config["holder"].as_str().unwrap();
        assert!(
            holder.starts_with("http://") && holder.ends_with(":7171"),
            "{config}"
        );
        assert!(
            !holder.contains("0.0.0.0") && !holder.contains("[::]"),
            "{config}"
        );
        assert_eq!(config["advertise_url"], holder, "{config}");
    }
}
