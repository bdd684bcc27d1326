//! End-to-end tests of `chorus serve` through the real binary, over HTTP on
//! loopback: crashes (SIGKILL), graceful stops (SIGTERM), a warm standby's
//! takeover, a frozen primary (SIGSTOP/SIGCONT) that must not serve after it
//! lost its lease, a standby rehydrating after the log was truncated past
//! it, compare-and-set increments across a failover, and the API's refusals.
//!
//! Two instances share their stores by getting the same store flags (on the
//! embedded default: the same `--data-dir`). The crash and takeover
//! scenarios run again on the test services (three S3 servers and a
//! PostgreSQL register; S3, Azure and a local directory in one quorum), which
//! skip outside CI when the services are not running and fail under CI.
//!
//! Every wait is a bounded poll (see `support/server.rs`); the lease ttl of
//! the failover scenarios is 3 s, so a takeover takes about 4 s.
//!
//! `a_standby_restored_from_a_snapshot_reads_only_the_log_after_it` counts
//! store reads on `/metrics`: a standby that restored a snapshot used to
//! re-read every fragment of the active segment below it before it could
//! apply the next record.

mod support;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use tempfile::TempDir;

use support::server::{Endpoint, Launch, POLL, ROLE_TIMEOUT, Reply, Server};

/// The lease ttl of the failover scenarios (the smallest `serve` takes is 2).
const FAILOVER_TTL_SECS: &str = "3";
/// Bound on a SIGTERMed process's graceful exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on client work that only waits for the service (writes, catch-up).
const WORK_TIMEOUT: Duration = Duration::from_secs(90);

// ------------------------------------------------------------ stores ----

/// Where the instances of one test keep their log, register, snapshots and
/// lease: a temporary directory (the working directory and `--data-dir`) and
/// the store flags every instance gets.
struct Deployment {
    dir: TempDir,
    stores: Vec<String>,
}

impl Deployment {
    /// The embedded default: three local replicas, an object register and the
    /// snapshot store, all under `<dir>/data`.
    fn embedded() -> Deployment {
        Deployment::with_stores(TempDir::new().unwrap(), Vec::new())
    }

    /// Three S3 replicas (one per zone), a PostgreSQL register and the
    /// snapshot store on S3; `None` skips (outside CI, services missing).
    fn on_s3_and_postgres(label: &str) -> Option<Deployment> {
        let replicas = support::s3_urls(label)?;
        let register = support::postgres_register_url(label)?;
        let snapshots = support::s3_urls(&format!("{label}-snapshots"))?.swap_remove(0);
        let stores = vec![
            "--replicas".to_owned(),
            replicas.join(","),
            "--register".to_owned(),
            register,
            "--snapshot-store".to_owned(),
            snapshots,
        ];
        Some(Deployment::with_stores(TempDir::new().unwrap(), stores))
    }

    /// One quorum over three providers: an S3 replica, an Azure replica and
    /// a local directory; the register is an object register on Azure and
    /// the snapshot store is on the second S3 server.
    fn on_three_providers(label: &str) -> Option<Deployment> {
        let s3 = support::s3_urls(label)?;
        let azure = support::azure_url(label)?;
        let dir = TempDir::new().unwrap();
        let local = format!("file://{}", dir.path().join("replica-local").display());
        let stores = vec![
            "--replicas".to_owned(),
            [s3[0].clone(), format!("{azure}/replica"), local].join(","),
            "--register".to_owned(),
            format!("{azure}/register"),
            "--snapshot-store".to_owned(),
            s3[1].clone(),
        ];
        Some(Deployment::with_stores(dir, stores))
    }

    fn with_stores(dir: TempDir, mut stores: Vec<String>) -> Deployment {
        let data = dir.path().join("data");
        stores.extend(["--data-dir".to_owned(), data.display().to_string()]);
        Deployment { dir, stores }
    }

    /// How every instance of this deployment starts.
    fn launch(&self) -> Launch {
        Launch::new(self.dir.path()).args(&self.stores)
    }

    /// `chorus lease status --json` on this deployment's snapshot store.
    fn lease_status(&self) -> Value {
        let mut command = support::chorus_command(self.dir.path());
        command.args(["lease", "status", "--json"]);
        // `lease` takes --store for the snapshot store, and --data-dir.
        let mut flags = self.stores.iter();
        while let Some(flag) = flags.next() {
            let value = flags.next().expect("a flag's value");
            match flag.as_str() {
                "--snapshot-store" => command.args(["--store", value]),
                "--data-dir" => command.args(["--data-dir", value]),
                _ => &mut command,
            };
        }
        let output = command.output().expect("chorus lease status runs");
        assert!(
            output.status.success(),
            "lease status: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).expect("lease status prints JSON")
    }
}

// ----------------------------------------------------------- clients ----

/// Acknowledged puts: key → (value, version: the revision that set it).
type Acked = BTreeMap<String, (String, u64)>;
/// [`Acked`], with the time each acknowledged request was sent.
type TimedAcks = BTreeMap<String, (String, u64, Instant)>;

/// Puts `value` until a `200` acknowledges it and returns its version. A `503`
/// is retried (nothing was appended, or an ambiguous write that the retry
/// supersedes with the same value); anything else fails the test.
fn put_acked(endpoint: &Endpoint, key: &str, value: &str) -> u64 {
    let deadline = Instant::now() + WORK_TIMEOUT;
    loop {
        let reply = endpoint.put(key, value);
        match reply.status {
            200 => return reply.expect_revision(&format!("put {key}")),
            503 if Instant::now() < deadline => std::thread::sleep(POLL),
            _ => panic!("{endpoint:?}: put {key}: {} {}", reply.status, reply.text()),
        }
    }
}

/// Expects `200` with `value` and `ETag: "version"` for `key`.
fn assert_value(reply: &Reply, key: &str, value: &str, version: u64) {
    assert_eq!(reply.status, 200, "{key}: {}", reply.text());
    assert_eq!(reply.text(), value, "{key}");
    assert_eq!(reply.etag(), version, "{key}: ETag");
    let revision: u64 = reply
        .header("x-chorus-revision")
        .expect("X-Chorus-Revision")
        .parse()
        .unwrap();
    assert!(
        revision >= version,
        "{key}: X-Chorus-Revision {revision} < {version}"
    );
    assert!(
        reply.header("x-chorus-index").is_some(),
        "{key}: X-Chorus-Index"
    );
}

/// Expects every acknowledged key to read back (strong reads) with its
/// value and version.
fn assert_serves_every_ack(endpoint: &Endpoint, acked: &Acked) {
    for (key, (value, version)) in acked {
        assert_value(&endpoint.get(key), key, value, *version);
    }
}

/// Expects the list (all pages) to hold exactly `expected`.
fn assert_lists_exactly(endpoint: &Endpoint, prefix: &str, stale: bool, expected: &Acked) {
    let (items, _) = endpoint.list_all(prefix, stale);
    let listed: Acked = items
        .into_iter()
        .map(|(key, value, version)| (key, (value, version)))
        .collect();
    assert_eq!(&listed, expected, "{endpoint:?}: list of {prefix:?}");
}

/// Client threads putting keys from a shared queue, each key once, until the
/// queue is empty, [`Writers::stop`], or the process stops answering (a
/// transport error leaves that key's write unknown). A `503` puts the key
/// back for later: a retry with the same value supersedes a write that may
/// have committed. Acknowledgements are kept as they arrive, with the time
/// their request was sent.
struct Writers {
    acked: Arc<Mutex<TimedAcks>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Writers {
    fn start(endpoint: &Endpoint, keys: Vec<String>, threads: usize) -> Writers {
        let queue = Arc::new(Mutex::new(VecDeque::from(keys)));
        let acked = Arc::new(Mutex::new(TimedAcks::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|_| {
                let endpoint = endpoint.clone();
                let (queue, acked, stop) =
                    (Arc::clone(&queue), Arc::clone(&acked), Arc::clone(&stop));
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let Some(key) = queue.lock().unwrap().pop_front() else {
                            return;
                        };
                        let value = value_of(&key);
                        let sent = Instant::now();
                        match endpoint.try_send(endpoint.put_request(&key, &value)) {
                            Ok(reply) if reply.status == 200 => {
                                let version = reply.expect_revision(&key);
                                acked.lock().unwrap().insert(key, (value, version, sent));
                            }
                            Ok(reply) if reply.status == 503 => {
                                queue.lock().unwrap().push_back(key);
                                std::thread::sleep(POLL);
                            }
                            Ok(reply) => {
                                panic!("{endpoint:?}: put {key}: {} {}", reply.status, reply.text())
                            }
                            Err(_) => return,
                        }
                    }
                })
            })
            .collect();
        Writers {
            acked,
            stop,
            threads,
        }
    }

    fn acked_count(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// Waits until at least `count` puts were acknowledged.
    fn wait_for_acks(&self, count: usize) {
        let deadline = Instant::now() + WORK_TIMEOUT;
        while self.acked_count() < count {
            assert!(
                Instant::now() < deadline,
                "only {} of {count} puts acknowledged within {WORK_TIMEOUT:?}",
                self.acked_count()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Tells the threads to stop after their current request.
    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Joins the threads (which must not have panicked) and returns the acks.
    fn finish(self) -> Acked {
        self.finish_timed()
            .into_iter()
            .map(|(key, (value, version, _))| (key, (value, version)))
            .collect()
    }

    /// [`finish`](Writers::finish), with the time each acknowledged request was sent.
    fn finish_timed(self) -> TimedAcks {
        for thread in self.threads {
            thread.join().expect("a writer thread failed");
        }
        Arc::try_unwrap(self.acked).unwrap().into_inner().unwrap()
    }
}

/// The value the writers put for `key`.
fn value_of(key: &str) -> String {
    format!("value of {key}")
}

fn keys(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}/{i:04}")).collect()
}

/// Expects a JSON error body (`{"error": "…", …}`) with `status`.
fn assert_error(reply: &Reply, status: u16, what: &str) -> Value {
    assert_eq!(reply.status, status, "{what}: {}", reply.text());
    let body = reply
        .json_value()
        .unwrap_or_else(|e| panic!("{what}: error body is not JSON ({e}): {}", reply.text()));
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|error| !error.is_empty()),
        "{what}: no \"error\" in {body}"
    );
    body
}

/// Expects the `503` a standby answers a write or a strong read with.
fn assert_not_primary(reply: &Reply, primary: &Endpoint, what: &str) {
    let body = assert_error(reply, 503, what);
    assert_eq!(body["role"], "standby", "{what}: {body}");
    assert_eq!(body["primary"], primary.url.as_str(), "{what}: {body}");
    assert!(reply.header("retry-after").is_some(), "{what}: Retry-After");
}

fn applied_index(status: &Value) -> u64 {
    status["applied_index"].as_u64().expect("applied_index")
}

/// Waits until `standby` applied everything `primary` applied; returns the
/// standby's status.
fn wait_caught_up(standby: &Server, primary: &Endpoint) -> Value {
    let target = applied_index(&primary.status());
    standby.wait_for_applied(target, WORK_TIMEOUT)
}

// ------------------------------------------------------------ crashes ----

/// Puts `count` keys from 8 client threads, SIGKILLs the primary mid-way
/// (half acknowledged), restarts it under the same holder id (a new process:
/// it waits out the killed one's lease), and expects every acknowledged key
/// with its value and version; then puts the rest and lists all of them.
fn sigkill_restart_keeps_every_ack(deployment: &Deployment, count: usize) {
    let started = Instant::now();
    let launch = deployment
        .launch()
        .args(["--holder", "restarting-node", "--lease-ttl-secs", "5"]);
    let mut first = launch.start("first");
    first.wait_for_role("primary");
    let all_keys = keys("key", count);
    let writers = Writers::start(&first.endpoint(), all_keys.clone(), 8);
    writers.wait_for_acks(count / 2);
    first.kill();
    let acked = writers.finish();
    eprintln!(
        "{} of {count} puts acknowledged before SIGKILL ({:?})",
        acked.len(),
        started.elapsed()
    );

    // It stands by (tailing the log) until the killed process's lease
    // expires, then recovers the log and replays whatever it had not tailed.
    let restarted = launch.start("restarted");
    let status = restarted.wait_for_role("primary");
    let applied = applied_index(&status);
    assert!(
        applied >= acked.len() as u64,
        "applied {applied} records, fewer than the {} acknowledged: {status}",
        acked.len()
    );
    assert_serves_every_ack(&restarted, &acked);

    let rest: Vec<String> = all_keys
        .into_iter()
        .filter(|key| !acked.contains_key(key))
        .collect();
    let rest_count = rest.len();
    let rest = Writers::start(&restarted.endpoint(), rest, 8).finish();
    assert_eq!(
        rest.len(),
        rest_count,
        "the restarted primary stopped answering"
    );
    let mut expected = acked;
    expected.extend(rest);
    assert_lists_exactly(&restarted, "key/", false, &expected);
    eprintln!("sigkill + restart: {:?} in all", started.elapsed());
}

#[test]
fn put_1000_keys_sigkill_restart_keeps_every_acknowledged_key() {
    sigkill_restart_keeps_every_ack(&Deployment::embedded(), 1000);
}

#[test]
fn put_1000_keys_sigkill_restart_keeps_every_acknowledged_key_on_s3_and_postgres() {
    let Some(deployment) = Deployment::on_s3_and_postgres("serve-sigkill") else {
        return;
    };
    sigkill_restart_keeps_every_ack(&deployment, 1000);
}

#[test]
fn put_1000_keys_sigkill_restart_keeps_every_acknowledged_key_on_s3_azure_and_a_directory() {
    let Some(deployment) = Deployment::on_three_providers("serve-sigkill-mixed") else {
        return;
    };
    sigkill_restart_keeps_every_ack(&deployment, 1000);
}

// ------------------------------------------------------ graceful stop ----

/// SIGTERM drains, publishes a snapshot of everything applied and releases
/// the lease: the next process (another holder id, with a lease ttl far
/// longer than its boot) boots at once from the snapshot and replays nothing.
#[test]
fn sigterm_publishes_a_final_snapshot_releases_the_lease_and_the_restart_replays_nothing() {
    let deployment = Deployment::embedded();
    // A foreign lease that was not released would hold the restart for 60 s.
    let launch = deployment.launch().args(["--lease-ttl-secs", "60"]);
    let mut first = launch.start("first");
    first.wait_for_role("primary");
    let mut expected = Acked::new();
    for key in keys("key", 100) {
        let value = value_of(&key);
        let version = first.put_ok(&key, &value);
        expected.insert(key, (value, version));
    }
    // Overwrites and a delete, so the snapshot is not just the first puts.
    for key in keys("key", 10) {
        let value = format!("second value of {key}");
        let version = first.put_ok(&key, &value);
        expected.insert(key, (value, version));
    }
    let deleted = first.send(first.request(Method::DELETE, "/v1/kv/key/0099"));
    deleted.expect_index("delete key/0099");
    expected.remove("key/0099");
    assert_eq!(applied_index(&first.status()), 111, "one record per write");

    // SIGTERM while clients write: what was acknowledged is in the snapshot.
    let writers = Writers::start(&first.endpoint(), keys("busy", 100_000), 4);
    writers.wait_for_acks(50);
    let exit = first.terminate(EXIT_TIMEOUT);
    writers.stop();
    let busy = writers.finish();
    eprintln!("{} writes acknowledged around the SIGTERM", busy.len());
    assert!(exit.success(), "SIGTERM: {exit}\n{}", first.stderr_tail());
    assert!(
        first
            .stdout()
            .iter()
            .any(|line| line == "chorus serve: stopped"),
        "{:?}",
        first.stdout()
    );
    let lease = deployment.lease_status();
    assert_eq!(lease["lease"]["released"], true, "{lease}");
    assert_eq!(lease["lease"]["holder_id"], first.url.as_str(), "{lease}");

    let restart = Instant::now();
    let restarted = launch.start("restarted");
    let status = restarted.wait_for_status("primary", Duration::from_secs(30), |status| {
        status["role"] == "primary" && status["ready"] == true
    });
    eprintln!(
        "restart after SIGTERM became primary in {:?}",
        restart.elapsed()
    );
    let applied = applied_index(&status);
    assert!(applied >= 111 + busy.len() as u64, "{status}");
    assert_eq!(status["replayed_records"], 0, "{status}");
    assert_eq!(status["head"]["wal_index"], applied, "{status}");
    assert_eq!(status["last_snapshot_index"], applied, "{status}");
    assert_eq!(
        status["lease"]["holder"],
        restarted.url.as_str(),
        "{status}"
    );
    assert_eq!(status["lease"]["released"], false, "{status}");
    assert_lists_exactly(&restarted, "key/", false, &expected);
    assert_serves_every_ack(&restarted, &expected);
    assert_serves_every_ack(&restarted, &busy);
}

// ----------------------------------------------------------- failover ----

/// Instance `a`, primary, and `b`, its standby (with its status), on the
/// failover scenarios' short lease.
fn primary_and_standby(deployment: &Deployment) -> (Server, Server, Value) {
    let launch = deployment
        .launch()
        .args(["--lease-ttl-secs", FAILOVER_TTL_SECS]);
    let a = launch.start("a");
    a.wait_for_role("primary");
    let b = launch.start("b");
    let status = b.wait_for_role("standby");
    (a, b, status)
}

/// A second instance stands by (naming the primary in its 503s), its stale
/// reads catch up, and once the primary is SIGKILLed mid-writes it takes
/// over and serves every write either of them acknowledged.
fn standby_takes_over(deployment: &Deployment) {
    let (mut a, b, status) = primary_and_standby(deployment);
    assert_eq!(status["lease"]["holder"], a.url.as_str(), "{status}");

    let mut acked = Acked::new();
    for key in keys("before", 50) {
        let value = value_of(&key);
        let version = put_acked(&a, &key, &value);
        acked.insert(key, (value, version));
    }
    wait_caught_up(&b, &a);
    for (key, (value, version)) in &acked {
        assert_value(&b.get_stale(key), key, value, *version);
    }
    assert_not_primary(
        &b.put("before/0000", "on the standby"),
        &a,
        "put on the standby",
    );
    assert_not_primary(&b.get("before/0000"), &a, "strong read on the standby");
    let batch = b
        .request(Method::POST, "/v1/kv:batch")
        .body(json!({"operations": [{"op": "delete", "key": "before/0001"}]}).to_string());
    assert_not_primary(&b.send(batch), &a, "batch on the standby");

    // SIGKILL the primary while writes are in flight.
    let writers = Writers::start(&a.endpoint(), keys("during", 400), 4);
    writers.wait_for_acks(50);
    let killed = Instant::now();
    a.kill();
    let during = writers.finish();
    let status = b.wait_for_role("primary");
    eprintln!(
        "standby took over {:?} after SIGKILL ({} puts acknowledged by the primary during the writes)",
        killed.elapsed(),
        during.len()
    );
    assert_ne!(status["lease"]["holder"], a.url.as_str(), "{status}");
    acked.extend(during);
    assert_serves_every_ack(&b, &acked);

    let mut after = Acked::new();
    for key in keys("after", 50) {
        let value = value_of(&key);
        let version = put_acked(&b, &key, &value);
        after.insert(key, (value, version));
    }
    acked.extend(after);
    assert_serves_every_ack(&b, &acked);
    for prefix in ["before/", "after/"] {
        let expected: Acked = acked
            .iter()
            .filter(|(key, _)| key.starts_with(prefix))
            .map(|(key, entry)| (key.clone(), entry.clone()))
            .collect();
        assert_lists_exactly(&b, prefix, false, &expected);
    }
}

#[test]
fn a_standby_catches_up_and_takes_over_after_the_primary_is_killed() {
    standby_takes_over(&Deployment::embedded());
}

#[test]
fn a_standby_catches_up_and_takes_over_after_the_primary_is_killed_on_s3_and_postgres() {
    let Some(deployment) = Deployment::on_s3_and_postgres("serve-takeover") else {
        return;
    };
    standby_takes_over(&deployment);
}

#[test]
fn a_standby_catches_up_and_takes_over_after_the_primary_is_killed_on_s3_azure_and_a_directory() {
    let Some(deployment) = Deployment::on_three_providers("serve-takeover-mixed") else {
        return;
    };
    standby_takes_over(&deployment);
}

/// Regression: a second instance started under a live primary's holder id
/// took its lease at once, and for a while both answered current reads,
/// the first with a value the second had overwritten; then both flapped.
/// Now the second stands by: it refuses writes naming the primary, the
/// first keeps the same lease generation and serves its own writes, and the
/// second takes over only once the first releases the lease.
#[test]
fn a_second_instance_with_the_same_holder_id_stands_by_until_the_first_releases() {
    let deployment = Deployment::embedded();
    let launch = deployment
        .launch()
        .args(["--holder", "shared-host", "--lease-ttl-secs", "2"]);
    let mut first = launch.start("first");
    first.wait_for_role("primary");
    first.put_ok("k", "one");
    let second = launch.start("second");
    let standing = second.wait_for_role("standby");
    assert_ne!(
        standing["incarnation"],
        first.status()["incarnation"],
        "{standing}"
    );
    let refused = second.send(second.put_request("k", "two"));
    let body = assert_error(&refused, 503, "a write to the second instance");
    assert_eq!(
        (body["role"].as_str(), body["primary"].as_str()),
        (Some("standby"), Some("shared-host")),
        "{body}"
    );
    let generation = first.status()["lease"]["generation"].clone();
    // Three lease lifetimes: the first's reads stay its own, the second
    // never becomes primary, and the lease never changes hands.
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        assert_eq!(first.get("k").text(), "one");
        assert_eq!(second.status()["role"], "standby");
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = first.status();
    assert_eq!(status["role"], "primary", "{status}");
    assert_eq!(status["lease"]["generation"], generation, "{status}");
    assert_eq!(
        status["lease"]["incarnation"], status["incarnation"],
        "{status}"
    );

    let exit = first.terminate(EXIT_TIMEOUT);
    assert!(exit.success(), "SIGTERM: {exit}\n{}", first.stderr_tail());
    second.wait_for_role("primary");
    second.put_ok("k", "two");
    assert_eq!(second.get("k").text(), "two");
}

/// Primary A is frozen (SIGSTOP) with writes in flight and one more queued
/// on its socket; standby B takes over and overwrites every key; A is
/// resumed. A never acknowledges a write sent after it was frozen, every
/// write it did acknowledge is in the log B took over, and no strong read of
/// A answers a value B overwrote. A finds out it lost the lease and stands
/// by, following B.
#[test]
fn a_stopped_primary_never_acknowledges_or_serves_overwritten_values_after_resuming() {
    let deployment = Deployment::embedded();
    let (a, b, _) = primary_and_standby(&deployment);
    let keys = keys("k", 10);
    for key in &keys {
        put_acked(&a, key, &format!("a {key}"));
    }
    wait_caught_up(&b, &a);

    // Freeze A in the middle of a stream of writes.
    let inflight = Writers::start(&a.endpoint(), self::keys("inflight", 100_000), 4);
    inflight.wait_for_acks(20);
    a.freeze();
    let frozen = Instant::now();
    // A write that reaches A while it is frozen, answered once it resumes.
    let queued = {
        let a = a.endpoint();
        std::thread::spawn(move || a.try_send(a.put_request("k/0000", "queued on a")))
    };
    b.wait_for_role("primary");
    eprintln!("B took over {:?} after A froze", frozen.elapsed());
    let mut current = Acked::new();
    for key in &keys {
        let value = format!("b {key}");
        let version = put_acked(&b, key, &value);
        current.insert(key.clone(), (value, version));
    }
    a.resume();

    let check = |reply: &Reply, what: &str| {
        assert!(
            !(200..300).contains(&reply.status),
            "A acknowledged {what} after losing its lease: {} {}",
            reply.status,
            reply.text()
        );
    };
    if let Ok(reply) = queued.join().unwrap() {
        check(&reply, "the write queued while it was frozen");
    }
    // Hammer A until it reports standby: no acknowledged write, and no strong
    // read answering anything but B's values.
    let deadline = Instant::now() + ROLE_TIMEOUT;
    let mut rounds = 0;
    loop {
        rounds += 1;
        check(&a.put("k/0001", "written on a after resuming"), "a put");
        let batch = a.request(Method::POST, "/v1/kv:batch").body(
            json!({"operations": [{"op": "put", "key": "k/0002", "value": "batch on a"}]})
                .to_string(),
        );
        check(&a.send(batch), "a batch");
        check(
            &a.send(a.request(Method::DELETE, "/v1/kv/k/0003")),
            "a delete",
        );
        for key in &keys {
            let reply = a.get(key);
            if reply.status == 200 {
                assert_eq!(
                    reply.text(),
                    current[key].0,
                    "A served an overwritten value of {key} after losing its lease"
                );
            }
        }
        let status = a.status();
        if status["role"] == "standby" {
            assert_eq!(status["lease"]["holder"], b.url.as_str(), "{status}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "A did not stand by within {ROLE_TIMEOUT:?}: {status}"
        );
        std::thread::sleep(POLL);
    }
    eprintln!("A stood by after {rounds} rounds of refused requests");
    assert_not_primary(&a.put("k/0001", "standby"), &b, "put on A, standing by");

    inflight.stop();
    let inflight = inflight.finish_timed();
    let late: Vec<String> = inflight
        .iter()
        .filter(|(_, (_, _, sent))| *sent > frozen)
        .map(|(key, (_, version, sent))| {
            format!(
                "{key} at version {version}, sent {:?} after the freeze",
                *sent - frozen
            )
        })
        .collect();
    assert!(
        late.is_empty(),
        "A acknowledged writes sent after it was frozen: {late:?}"
    );
    // Every write A acknowledged (some answered only after it resumed) is in
    // the log B took over.
    let inflight: Acked = inflight
        .into_iter()
        .map(|(key, (value, version, _))| (key, (value, version)))
        .collect();
    eprintln!("A acknowledged {} writes of the stream", inflight.len());
    assert_lists_exactly(&b, "inflight/", false, &inflight);
    assert_serves_every_ack(&b, &inflight);
    // B is unaffected, and A follows B.
    assert_serves_every_ack(&b, &current);
    wait_caught_up(&a, &b);
    assert_lists_exactly(&a, "k/", true, &current);
    assert_lists_exactly(&a, "inflight/", true, &inflight);
}

// --------------------------------------------------------- truncation ----

/// A standby frozen while the primary snapshots and truncates the log past
/// the standby's position finds the records it needs gone when it resumes,
/// restores the newest snapshot and ends with the primary's state.
#[test]
fn truncation_under_a_lagging_standby_rehydrates_from_the_newest_snapshot() {
    let deployment = Deployment::embedded();
    let launch = deployment.launch().args([
        "--snapshot-every-records",
        "50",
        "--snapshot-min-log-percent",
        "0",
    ]);
    let a = launch.start("a");
    a.wait_for_role("primary");
    let b = launch.start("b");
    b.wait_for_role("standby");
    for key in keys("key", 20) {
        put_acked(&a, &key, &value_of(&key));
    }
    let lagging = applied_index(&wait_caught_up(&b, &a));

    b.freeze();
    // Puts, overwrites, deletes and batches: well over a snapshot's worth.
    for round in 0..4 {
        for key in keys("key", 60) {
            put_acked(&a, &key, &format!("round {round} of {key}"));
        }
        a.send(a.request(Method::DELETE, &format!("/v1/kv/key/{:04}", round * 3)))
            .expect_index("delete");
        let batch = json!({"operations": [
            {"op": "put", "key": format!("batch/{round}/a"), "value": "1"},
            {"op": "put", "key": format!("batch/{round}/b"), "value": "2"},
            {"op": "delete", "key": format!("key/{:04}", round * 3 + 1)},
        ]});
        a.send(
            a.request(Method::POST, "/v1/kv:batch")
                .body(batch.to_string()),
        )
        .expect_index("batch");
    }
    let truncated = a.wait_for_status(
        &format!("truncated past the standby's {lagging}"),
        WORK_TIMEOUT,
        |status| status["register"]["floor"].as_u64().unwrap_or(0) > lagging,
    );
    let floor = truncated["register"]["floor"].as_u64().unwrap();
    eprintln!("log truncated to {floor}; the standby was at {lagging}");

    b.resume();
    let status = wait_caught_up(&b, &a);
    assert_eq!(status["role"], "standby", "{status}");
    let restored = status["last_snapshot_index"].as_u64().unwrap_or(0);
    assert!(
        restored >= floor,
        "the standby caught up without restoring a snapshot at or past the floor {floor}: {status}"
    );
    let (expected, _) = a.list_all("", false);
    assert_eq!(b.list_all("", true).0, expected);

    // It tails the log again after the restore.
    for key in keys("later", 5) {
        put_acked(&a, &key, &value_of(&key));
    }
    wait_caught_up(&b, &a);
    let (expected, _) = a.list_all("", false);
    assert_eq!(b.list_all("", true).0, expected);
}

/// The log fragments `server` read so far: `get`s its replica stores
/// answered `ok` (`chorus_store_requests_total` on `/metrics`). A caught-up
/// standby's polls for the next fragment answer `not_found`, and the lease,
/// HEAD and the register live in other stores, so only fragment reads count.
fn fragment_reads(server: &Endpoint) -> u64 {
    let reply = server.send(server.request(Method::GET, "/metrics"));
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply
        .text()
        .lines()
        .filter(|line| {
            line.starts_with("chorus_store_requests_total{")
                && line.contains("/data/replica-")
                && line.contains("op=\"get\"")
                && line.contains("outcome=\"ok\"")
        })
        .map(|line| {
            let count = line.rsplit(' ').next().unwrap_or_default();
            count.parse::<f64>().expect("a counter value") as u64
        })
        .sum()
}

/// A standby restores a snapshot so it need not read the log below it. After
/// the log was snapshotted and truncated to its very end past a frozen
/// standby, catching up must read a bounded number of fragments, not every
/// fragment the active segment still holds below the snapshot.
#[test]
fn a_standby_restored_from_a_snapshot_reads_only_the_log_after_it() {
    const RECORDS: usize = 400;
    let deployment = Deployment::embedded();
    // Snapshots every 50 records, and within a second of the last write.
    let launch = deployment.launch().args([
        "--snapshot-every-records",
        "50",
        "--snapshot-min-log-percent",
        "0",
        "--snapshot-interval-secs",
        "1",
    ]);
    let a = launch.start("a");
    a.wait_for_role("primary");
    let b = launch.start("b");
    b.wait_for_role("standby");
    for key in keys("key", 10) {
        put_acked(&a, &key, &value_of(&key));
    }
    wait_caught_up(&b, &a);
    let before = fragment_reads(&b);

    b.freeze();
    // One at a time: about one record per fragment.
    for i in 0..RECORDS {
        let key = format!("key/{:04}", i % 100);
        put_acked(&a, &key, &format!("write {i}"));
    }
    let end = applied_index(&a.status());
    a.wait_for_status(
        &format!("snapshotted and truncated at the end {end}"),
        WORK_TIMEOUT,
        |status| status["head"]["wal_index"] == end && status["register"]["floor"] == end,
    );

    b.resume();
    let status = b.wait_for_applied(end, WORK_TIMEOUT);
    assert_eq!(status["last_snapshot_index"], end, "{status}");
    // Its applied index jumps to the snapshot's at once; what its reader has
    // to read shows when the next record arrives.
    let next = a
        .put("after/the-snapshot", "x")
        .expect_index("put after the snapshot");
    b.wait_for_applied(next + 1, WORK_TIMEOUT);
    let reads = fragment_reads(&b) - before;
    eprintln!(
        "the standby read {reads} fragment copies to apply the record after the snapshot at {end}"
    );
    let (expected, _) = a.list_all("", false);
    assert_eq!(b.list_all("", true).0, expected);
    // Finding the end of the active segment may take a few quorum reads (3
    // copies each), not one per fragment below the snapshot.
    assert!(
        reads <= 3 * 32,
        "the standby read {reads} fragment copies to apply one record after restoring the \
         snapshot at {end}: its reader scanned the active segment from its first fragment"
    );
}

// ---------------------------------------------------------------- CAS ----

/// What the increment threads saw.
#[derive(Default)]
struct Increments {
    /// `200`s: increments that certainly happened.
    acked: AtomicU64,
    /// Answers lost after the request was sent, and `503`s that may have
    /// committed: increments that may or may not have happened.
    ambiguous: AtomicU64,
    /// Anything else, which fails the test.
    unexpected: Mutex<Vec<String>>,
}

/// One compare-and-set increment of `counter` on `endpoint`; `false` when
/// this endpoint cannot serve it now (the caller tries the other one).
fn increment(endpoint: &Endpoint, increments: &Increments) -> bool {
    let read = match endpoint.try_send(endpoint.request(Method::GET, "/v1/kv/counter")) {
        Ok(reply) if reply.status == 200 => reply,
        Ok(reply) if reply.status == 503 => return false,
        Ok(reply) => {
            let what = format!("read: {} {}", reply.status, reply.text());
            increments.unexpected.lock().unwrap().push(what);
            return false;
        }
        Err(_) => return false,
    };
    let value: u64 = read.text().parse().expect("the counter is a number");
    let write = endpoint
        .put_request("counter", &(value + 1).to_string())
        .header("if-match", format!("\"{}\"", read.etag()));
    match endpoint.try_send(write) {
        Ok(reply) if reply.status == 200 => {
            increments.acked.fetch_add(1, Ordering::SeqCst);
            true
        }
        // Another thread's increment won.
        Ok(reply) if reply.status == 412 => true,
        Ok(reply) if reply.may_have_committed() => {
            increments.ambiguous.fetch_add(1, Ordering::SeqCst);
            false
        }
        Ok(reply) if reply.status == 503 => false,
        Ok(reply) => {
            let what = format!("write: {} {}", reply.status, reply.text());
            increments.unexpected.lock().unwrap().push(what);
            false
        }
        // Refused before anything was sent: certainly not applied.
        Err(error) if error.is_connect() => false,
        // Sent, answer lost (the process died): may have committed.
        Err(_) => {
            increments.ambiguous.fetch_add(1, Ordering::SeqCst);
            false
        }
    }
}

/// Client threads increment one counter with GET + `If-Match` PUT against
/// whichever instance serves; the primary is SIGKILLed half-way. The final
/// value counts every acknowledged increment, plus at most the ambiguous ones.
#[test]
fn concurrent_cas_increments_across_a_failover_equal_the_acknowledged_count() {
    const THREADS: usize = 4;
    const BEFORE_KILL: u64 = 40;
    const AFTER_KILL: u64 = 40;
    let deployment = Deployment::embedded();
    let (mut a, b, _) = primary_and_standby(&deployment);
    let created = a.send(a.put_request("counter", "0").header("if-none-match", "*"));
    created.expect_index("create the counter");

    let increments = Arc::new(Increments::default());
    let stop = Arc::new(AtomicBool::new(false));
    let endpoints = [a.endpoint(), b.endpoint()];
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (endpoints, increments, stop) = (
                endpoints.clone(),
                Arc::clone(&increments),
                Arc::clone(&stop),
            );
            std::thread::spawn(move || {
                let mut target = 0;
                while !stop.load(Ordering::SeqCst) {
                    if !increment(&endpoints[target], &increments) {
                        target = 1 - target;
                        std::thread::sleep(POLL);
                    }
                }
            })
        })
        .collect();
    let wait_for = |count: u64| {
        let deadline = Instant::now() + WORK_TIMEOUT;
        while increments.acked.load(Ordering::SeqCst) < count {
            if Instant::now() >= deadline {
                stop.store(true, Ordering::SeqCst);
                panic!(
                    "{} of {count} increments acknowledged within {WORK_TIMEOUT:?}; unexpected: {:?}",
                    increments.acked.load(Ordering::SeqCst),
                    increments.unexpected.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    wait_for(BEFORE_KILL);
    a.kill();
    let at_kill = increments.acked.load(Ordering::SeqCst);
    wait_for(at_kill + AFTER_KILL);
    stop.store(true, Ordering::SeqCst);
    for thread in threads {
        thread.join().expect("an increment thread failed");
    }

    let unexpected = increments.unexpected.lock().unwrap();
    assert!(unexpected.is_empty(), "unexpected answers: {unexpected:?}");
    let acked = increments.acked.load(Ordering::SeqCst);
    let ambiguous = increments.ambiguous.load(Ordering::SeqCst);
    b.wait_for_role("primary");
    let reply = b.get("counter");
    assert_eq!(reply.status, 200, "{}", reply.text());
    let value: u64 = reply.text().parse().unwrap();
    eprintln!(
        "counter {value}: {acked} increments acknowledged ({at_kill} before the kill), {ambiguous} ambiguous"
    );
    assert!(
        acked <= value && value <= acked + ambiguous,
        "counter {value} is outside acknowledged {acked} .. acknowledged + ambiguous {}",
        acked + ambiguous
    );
}

// ------------------------------------------------------------ the API ----

/// Bearer auth (only `/healthz` is open), body and key limits (`413`),
/// malformed requests (`400`) and failed conditions (`412`), each with a
/// JSON error body; none of the refusals appends to the log.
#[test]
fn auth_limits_and_bad_requests() {
    let deployment = Deployment::embedded();
    let server = deployment
        .launch()
        .token("s3cret")
        .args(["--max-body-bytes", "4096"])
        .start("server");
    server.wait_for_role("primary");
    let anonymous = server.endpoint().with_token(None);
    let impostor = server.endpoint().with_token(Some("wrong"));

    // Auth.
    let health = anonymous.send(anonymous.request(Method::GET, "/healthz"));
    assert_eq!(health.status, 200, "{}", health.text());
    assert_eq!(health.json()["status"], "ok");
    for (client, who) in [(&anonymous, "no token"), (&impostor, "a wrong token")] {
        for (method, path) in [
            (Method::GET, "/v1/kv/a"),
            (Method::PUT, "/v1/kv/a"),
            (Method::DELETE, "/v1/kv/a"),
            (Method::GET, "/v1/kv"),
            (Method::POST, "/v1/kv:batch"),
            (Method::GET, "/v1/status"),
            (Method::GET, "/readyz"),
            (Method::GET, "/metrics"),
        ] {
            let what = format!("{method} {path} with {who}");
            let reply = client.send(client.request(method, path));
            assert_error(&reply, 401, &what);
            assert_eq!(reply.header("www-authenticate"), Some("Bearer"), "{what}");
        }
    }
    let basic = anonymous.send(
        anonymous
            .request(Method::GET, "/v1/status")
            .header("authorization", "Basic czNjcmV0"),
    );
    assert_error(&basic, 401, "basic auth");
    assert_error(&server.get("missing"), 404, "a missing key");

    // Limits: at the limit is fine, one byte over is 413.
    let version = server.put_ok("a", "1");
    server.put_ok("big", &"v".repeat(4096));
    assert_error(
        &server.put("big", &"v".repeat(4097)),
        413,
        "a body over the limit",
    );
    let long_key = "k".repeat(1024);
    server.put_ok(&long_key, "fits");
    let too_long = "k".repeat(1025);
    assert_error(&server.put(&too_long, "x"), 413, "a key over 1024 bytes");
    let batch = |body: String| server.send(server.request(Method::POST, "/v1/kv:batch").body(body));
    let long_batch = json!({"operations": [{"op": "put", "key": too_long, "value": "x"}]});
    assert_error(
        &batch(long_batch.to_string()),
        413,
        "a batch key over 1024 bytes",
    );

    // Nothing below appends: the log's end stays where it is.
    let before = server.status();
    let end = |status: &Value| {
        (
            applied_index(status),
            status["writer"]["next_index"].clone(),
        )
    };

    // Malformed requests.
    for (header, value) in [
        ("if-match", "7"),
        ("if-match", "\"seven\""),
        ("if-match", "\"7"),
        ("if-none-match", "\"3\""),
    ] {
        let reply = server.send(server.put_request("a", "2").header(header, value));
        assert_error(&reply, 400, &format!("{header}: {value}"));
    }
    let both = server
        .put_request("a", "2")
        .header("if-match", "\"1\"")
        .header("if-none-match", "*");
    assert_error(&server.send(both), 400, "If-Match and If-None-Match");
    for query in [
        "limit=0",
        "limit=1001",
        "limit=abc",
        "limit=-1",
        "after=%21%21",
        "consistency=eventual",
        "unknown=1",
    ] {
        let reply = server.send(server.request(Method::GET, &format!("/v1/kv?{query}")));
        assert_error(&reply, 400, &format!("list with {query}"));
    }
    let stale = server.send(server.request(Method::GET, "/v1/kv/a?consistency=sometimes"));
    assert_error(&stale, 400, "a read with a bad consistency");
    for body in [
        "{".to_owned(),
        "[]".to_owned(),
        "not json".to_owned(),
        json!({"operations": [{"op": "frob", "key": "a"}]}).to_string(),
        json!({"operations": [{"op": "put", "key": "a"}]}).to_string(),
        json!({"operations": [{"op": "delete", "key": "a", "value": "1"}]}).to_string(),
        json!({"operations": [{"op": "put", "value": "1"}]}).to_string(),
        json!({"operations": [{"op": "put", "key": "a", "value": "1", "if_version": 1, "if_absent": true}]}).to_string(),
        json!({"operations": [{"op": "put", "key": "a", "value_b64": "!!"}]}).to_string(),
        json!({"operations": [], "extra": 1}).to_string(),
    ] {
        assert_error(&batch(body.clone()), 400, &format!("batch {body}"));
    }
    // Unknown routes and methods answer JSON too.
    assert_error(
        &server.send(server.request(Method::GET, "/v2/nothing")),
        404,
        "unknown route",
    );
    assert_error(
        &server.send(server.request(Method::POST, "/v1/status")),
        405,
        "wrong method",
    );

    // Failed conditions: 412 naming the current version.
    let stale_version = format!("\"{}\"", version + 1000);
    for (request, what) in [
        (
            server
                .put_request("a", "2")
                .header("if-match", &stale_version),
            "put If-Match",
        ),
        (
            server.put_request("a", "2").header("if-none-match", "*"),
            "put If-None-Match",
        ),
        (
            server
                .request(Method::DELETE, "/v1/kv/a")
                .header("if-match", &stale_version),
            "delete If-Match",
        ),
        (
            server
                .put_request("absent", "2")
                .header("if-match", &format!("\"{version}\"")),
            "put If-Match on an absent key",
        ),
    ] {
        let body = assert_error(&server.send(request), 412, what);
        assert!(body.get("current_version").is_some(), "{what}: {body}");
    }
    for operations in [
        json!([{"op": "put", "key": "a", "value": "2", "if_version": version + 1000}]),
        json!([{"op": "put", "key": "b", "value": "2"}, {"op": "put", "key": "a", "value": "2", "if_absent": true}]),
    ] {
        let reply = batch(json!({ "operations": operations }).to_string());
        let body = assert_error(&reply, 412, &format!("batch {operations}"));
        assert_eq!(body["key"], "a", "{body}");
        assert_eq!(body["current_version"], version, "{body}");
    }
    let after = server.status();
    assert_eq!(
        end(&after),
        end(&before),
        "a refused request appended to the log"
    );
    assert_value(&server.get("a"), "a", "1", version);
    assert_eq!(
        server.get("b").status,
        404,
        "a failed batch applied in part"
    );
}
