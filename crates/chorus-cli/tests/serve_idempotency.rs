//! Exactly-once writes through the real binary: `Idempotency-Key` retries
//! across SIGKILL and SIGSTOP of the primary, with a standby taking over.
//!
//! Client threads each keep a counter in the key-value state and increment
//! it with a batch (`counter/<t>` compare-and-set to value + 1, and
//! `inc/<t>/<i>` = value + 1), one fresh key per attempt, retried with the
//! same key on every unknown outcome (a timeout, a dropped connection, any
//! `503`) at whichever instance serves. Without the key, a retry of a batch
//! that did commit fails its condition, the client reads the counter again
//! and increments it a second time; with it, the retry is answered the
//! original `200`. The counters must end at exactly the number of
//! increments, each `inc/<t>/<i>` holding `i + 1`.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Method;
use reqwest::blocking::RequestBuilder;
use serde_json::{Value, json};
use support::server::{Endpoint, Launch, Server};
use tempfile::TempDir;

/// The lease ttl: the smallest `serve` takes, so takeovers are quick.
const TTL_SECS: &str = "2";
/// Client threads, each with its own counter.
const CLIENTS: u64 = 3;
/// Increments per client.
const INCREMENTS: u64 = 60;
/// Bound on one client request: short, so a frozen primary is an unknown
/// outcome the client retries elsewhere, not a long wait.
const CLIENT_TIMEOUT: Duration = Duration::from_millis(1500);
/// The first send of every other attempt gives up this soon: a client that
/// times out (or drops the connection) while its write still commits, the
/// unknown outcome a retry must not apply twice.
const IMPATIENT_TIMEOUT: Duration = Duration::from_millis(2);
/// Bound on the whole run of one logical increment, and on each phase.
const WORK_TIMEOUT: Duration = Duration::from_secs(120);

/// What the clients saw.
#[derive(Default)]
struct Seen {
    /// Increments that were answered 200.
    applied: AtomicU64,
    /// Attempts whose outcome was unknown at least once.
    unknown: AtomicU64,
    /// Answers marked `Idempotent-Replayed`.
    replayed: AtomicU64,
    /// Attempts that failed their condition (then read again and retried).
    conflicts: AtomicU64,
    /// Anything else, which fails the test.
    unexpected: Mutex<Vec<String>>,
}

/// The instances clients may talk to (they change as processes restart).
type Endpoints = Arc<Mutex<Vec<Endpoint>>>;

/// How one attempt of a keyed write ended.
enum Attempt {
    Applied,
    ConditionFailed,
}

/// A strong read of `counter/<client>` from whichever instance serves it:
/// its value and version.
fn read_counter(endpoints: &Endpoints, counter: &str) -> (u64, u64) {
    let deadline = Instant::now() + WORK_TIMEOUT;
    loop {
        assert!(Instant::now() < deadline, "no instance serves {counter}");
        for endpoint in endpoints.lock().unwrap().clone() {
            let request = endpoint
                .request(Method::GET, &format!("/v1/kv/{counter}"))
                .timeout(CLIENT_TIMEOUT);
            let Ok(reply) = send(request) else {
                continue;
            };
            if reply.0 == 200 {
                let value = String::from_utf8(reply.2).unwrap().parse().unwrap();
                let version = reply.1.trim_matches('"').parse().unwrap();
                return (value, version);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `request`: status, ETag, body and whether it was replayed.
fn send(request: RequestBuilder) -> Result<(u16, String, Vec<u8>, bool), reqwest::Error> {
    let response = request.send()?;
    let status = response.status().as_u16();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    let etag = header("etag").unwrap_or_default();
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    let body = response.bytes()?.to_vec();
    Ok((status, etag, body, replayed))
}

/// Sends one attempt with key `key` until its outcome is known, at
/// whichever instance answers; every unknown outcome is retried with the
/// same key.
fn attempt(
    endpoints: &Endpoints,
    key: &str,
    batch: &Value,
    impatient: bool,
    seen: &Seen,
) -> Attempt {
    let deadline = Instant::now() + WORK_TIMEOUT;
    let mut unknown = false;
    let mut sends = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "attempt {key} never got an answer"
        );
        for endpoint in endpoints.lock().unwrap().clone() {
            sends += 1;
            let timeout = if impatient && sends == 1 {
                IMPATIENT_TIMEOUT
            } else {
                CLIENT_TIMEOUT
            };
            let request = endpoint
                .request(Method::POST, "/v1/kv:batch")
                .header("idempotency-key", key)
                .timeout(timeout)
                .body(batch.to_string());
            let reply = match send(request) {
                Ok(reply) => reply,
                Err(error) => {
                    // Sent and no answer: it may have committed.
                    if !error.is_connect() && !unknown {
                        unknown = true;
                        seen.unknown.fetch_add(1, Ordering::SeqCst);
                    }
                    continue;
                }
            };
            let (status, _, body, replayed) = reply;
            seen.replayed
                .fetch_add(u64::from(replayed), Ordering::SeqCst);
            match status {
                200 => return Attempt::Applied,
                412 => return Attempt::ConditionFailed,
                503 => {
                    let body: Value = serde_json::from_slice(&body).unwrap_or_default();
                    if body["may_have_committed"] == true && !unknown {
                        unknown = true;
                        seen.unknown.fetch_add(1, Ordering::SeqCst);
                    }
                }
                _ => {
                    let body = String::from_utf8_lossy(&body).into_owned();
                    seen.unexpected
                        .lock()
                        .unwrap()
                        .push(format!("{key}: {status} {body}"));
                    return Attempt::ConditionFailed;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One client: `INCREMENTS` logical increments of its counter.
fn run_client(client_id: u64, endpoints: Endpoints, seen: Arc<Seen>) {
    let counter = format!("counter/{client_id}");
    let mut attempts = 0u64;
    for increment in 0..INCREMENTS {
        loop {
            let (value, version) = read_counter(&endpoints, &counter);
            attempts += 1;
            let key = format!("client-{client_id}-attempt-{attempts}");
            let batch = json!({"operations": [
                {"op": "put", "key": counter, "value": (value + 1).to_string(), "if_version": version},
                {"op": "put", "key": format!("inc/{client_id}/{increment:03}"), "value": (value + 1).to_string()},
            ]});
            match attempt(&endpoints, &key, &batch, attempts.is_multiple_of(2), &seen) {
                Attempt::Applied => {
                    seen.applied.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                Attempt::ConditionFailed => {
                    seen.conflicts.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }
}

fn wait_for_increments(seen: &Seen, count: u64) {
    let deadline = Instant::now() + WORK_TIMEOUT;
    while seen.applied.load(Ordering::SeqCst) < count {
        assert!(
            Instant::now() < deadline,
            "the clients stalled below {count}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A keyed write and its answer: status, replayed, body.
fn keyed(endpoint: &Endpoint, request: RequestBuilder, key: &str) -> (u16, bool, Value) {
    let reply = endpoint.send(request.header("idempotency-key", key));
    let replayed = reply.header("idempotent-replayed") == Some("true");
    (reply.status, replayed, reply.json())
}

#[test]
fn idempotent_increments_survive_sigkill_and_sigstop_failovers_exactly_once() {
    let dir = TempDir::new().unwrap();
    let launch = Launch::new(dir.path()).args([
        "--data-dir",
        "data",
        "--lease-ttl-secs",
        TTL_SECS,
        // Snapshots during the run, so the table also crosses a restore.
        "--snapshot-every-records",
        "50",
        "--snapshot-min-log-percent",
        "0",
    ]);
    let mut a = launch.start("a");
    a.wait_for_role("primary");
    let b = launch.start("b");
    b.wait_for_role("standby");
    for client in 0..CLIENTS {
        a.put_ok(&format!("counter/{client}"), "0");
    }

    // Two outcomes to retry after the failover: a put, and a failed CAS.
    let probe = |endpoint: &Endpoint| {
        let put = keyed(endpoint, endpoint.put_request("probe", "1"), "probe-put");
        let cas = endpoint
            .put_request("probe", "2")
            .header("if-match", "\"999999\"");
        (put, keyed(endpoint, cas, "probe-cas"))
    };
    let (put, cas) = probe(&a.endpoint());
    assert_eq!((put.0, put.1), (200, false), "{put:?}");
    assert_eq!((cas.0, cas.1), (412, false), "{cas:?}");

    let endpoints: Endpoints = Arc::new(Mutex::new(vec![a.endpoint(), b.endpoint()]));
    let seen = Arc::new(Seen::default());
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (endpoints, seen) = (Arc::clone(&endpoints), Arc::clone(&seen));
            std::thread::spawn(move || run_client(client, endpoints, seen))
        })
        .collect();

    // SIGKILL the primary mid-run: b takes over once the lease expires.
    wait_for_increments(&seen, 20);
    a.kill();
    b.wait_for_role("primary");
    // The probes retried at the new primary: the same answers, replayed.
    let (put_again, cas_again) = probe(&b.endpoint());
    assert_eq!(put_again, (200, true, put.2.clone()));
    assert_eq!(cas_again, (412, true, cas.2.clone()));
    let a2 = launch.start("a2");
    a2.wait_for_role("standby");
    *endpoints.lock().unwrap() = vec![a2.endpoint(), b.endpoint()];

    // SIGSTOP the new primary: its writes in flight time out, a2 takes over,
    // and b resumes as a standby.
    wait_for_increments(&seen, 90);
    b.freeze();
    a2.wait_for_role("primary");
    b.resume();
    b.wait_for_role("standby");

    for client in clients {
        client.join().expect("a client thread panicked");
    }
    let unexpected = seen.unexpected.lock().unwrap().clone();
    assert!(unexpected.is_empty(), "unexpected answers: {unexpected:?}");
    eprintln!(
        "increments {}, attempts with an unknown outcome {}, replayed answers {}, conflicts {}",
        seen.applied.load(Ordering::SeqCst),
        seen.unknown.load(Ordering::SeqCst),
        seen.replayed.load(Ordering::SeqCst),
        seen.conflicts.load(Ordering::SeqCst),
    );
    assert_final_state(&a2, &b);
    assert!(
        seen.replayed.load(Ordering::SeqCst) > 0,
        "no retry met a write that had committed: the test proved nothing"
    );
}

/// Every counter at exactly its client's increment count, each increment's
/// key holding its own step, on the primary and on the caught-up standby.
fn assert_final_state(primary: &Server, standby: &Server) {
    let (counters, _) = primary.list_all("counter/", false);
    let expected: Vec<_> = (0..CLIENTS)
        .map(|client| (format!("counter/{client}"), INCREMENTS.to_string()))
        .collect();
    let found: Vec<_> = counters
        .iter()
        .map(|(k, v, _)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(found, expected, "a counter lost or doubled an increment");
    let (steps, index) = primary.list_all("inc/", false);
    assert_eq!(steps.len() as u64, CLIENTS * INCREMENTS);
    for (key, value, _) in &steps {
        let step: u64 = key.rsplit('/').next().unwrap().parse().unwrap();
        assert_eq!(value, &(step + 1).to_string(), "{key}");
    }
    let status = primary.status();
    assert!(
        status["idempotency"]["keys"].as_u64().unwrap() >= CLIENTS * INCREMENTS,
        "{}",
        status["idempotency"]
    );
    standby.wait_for_applied(index, WORK_TIMEOUT);
    assert_eq!(standby.list_all("inc/", true).0, steps);
    assert_eq!(standby.list_all("counter/", true).0, counters);
}
