//! etcd's guarantees under faults, through the binary: a Jepsen-style run.
//!
//! Two `chorus serve` processes on one embedded store (a directory), each
//! serving etcd on a fixed loopback port, with a short writer lease. Several
//! clients send get (linearizable, and serializable to either node), put,
//! delete, a compare-and-set Txn on `mod_revision` and a create-if-absent Txn
//! on a few keys, each to the node it last found primary, moving to the other
//! on `Unavailable` or silence. Two watchers follow the keys' prefix,
//! reconnecting to the other node with their last revision + 1.
//!
//! Fault model (the nemesis, on a seeded schedule): the primary is SIGKILLed,
//! SIGSTOPped past its lease (until the standby took over) then SIGCONTed,
//! or SIGTERMed; the standby is SIGKILLed, SIGSTOPped for a while or
//! SIGTERMed. Every killed or stopped process is restarted as the new
//! standby, so two processes run between faults. The first three faults are
//! the three primary faults, in a seeded order, so a short run sees each.
//!
//! A request without an answer, or answered "the write may have been
//! applied", has an unknown outcome: the client sends it again, unchanged,
//! until it is answered (what an etcd client does), and the report counts
//! requests applied twice.
//! At the end the committed history is read by a watch from the first
//! revision, the states at past revisions by Range, and `etcd_history`
//! checks everything (see its docs): linearizable, every acknowledged write
//! present, every watcher gap-free and duplicate-free.
//!
//! `CHORUS_ETCD_FAULTS_SEED` replays a schedule (OS timing still varies);
//! `CHORUS_ETCD_FAULTS_SECONDS` sets how long the workload runs (default 60).

mod support;

#[path = "support/etcd_history.rs"]
mod etcd_history;

use std::collections::{BTreeMap, HashMap};
use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, Txn, TxnOp,
    TxnOpResponse, WatchOptions,
};
use etcd_history::{
    Answer, Change, Entry, Event, Op, Outcome, Recorded, Request, Revision, StateAt, Summary,
    WatchLog,
};
use reqwest::Method;
use support::schedule::{Rng, seed_from};
use support::server::{Launch, ROLE_TIMEOUT, Server};
use tempfile::TempDir;

/// Workload seconds in CI.
const DEFAULT_SECONDS: u64 = 60;
/// The writer lease's time to live: takeovers take about this + 1 s.
const LEASE_TTL_SECS: u64 = 3;
/// Concurrent clients.
const CLIENTS: usize = 4;
/// Concurrent watchers.
const WATCHERS: usize = 2;
/// The keys the clients touch; nothing else writes under [`PREFIX`].
const KEYS: [&str; 4] = ["jepsen/a", "jepsen/b", "jepsen/c", "jepsen/d"];
/// The prefix the watchers and the final reads cover.
const PREFIX: &str = "jepsen/";
/// Bound on one request: past it, its outcome is unknown.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause after a failed request before the next (both nodes may refuse
/// during a takeover).
const FAILURE_PAUSE: Duration = Duration::from_millis(50);
/// A watcher asks for progress this often…
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// …and moves to the other node after this long without any answer.
const WATCH_SILENCE: Duration = Duration::from_secs(3);
/// How long the watchers may take to reach the final revision.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);
/// A pause between two faults, drawn in this range (milliseconds).
const FAULT_GAP_MS: (u64, u64) = (1_000, 4_000);
/// How long a standby stays stopped, drawn in this range (milliseconds).
const STANDBY_STOP_MS: (u64, u64) = (500, 4_000);
/// Generous bound on the time from a primary fault to the first write the
/// new primary acknowledged (the design target is the lease TTL + 1 s; the
/// machine is loaded).
const FIRST_WRITE_BOUND: Duration = Duration::from_secs(5 * LEASE_TTL_SECS);
/// The shutdown grace: longer than [`FIRST_WRITE_BOUND`], so a SIGTERMed
/// primary that held its lease through the grace (waiting for watch
/// streams, as it once did) fails the bound.
const SHUTDOWN_GRACE_SECS: u64 = 30;
/// Most times a write of unknown outcome is sent again while the answers
/// are refusals (both nodes refuse during a takeover).
const MAX_RETRIES: usize = 100;
/// Most past revisions read back by Range at the end.
const MAX_PAST_STATES: usize = 300;

// ------------------------------------------------------------------ rng ----

fn seed() -> u64 {
    seed_from("CHORUS_ETCD_FAULTS_SEED")
}

fn workload_seconds() -> u64 {
    std::env::var("CHORUS_ETCD_FAULTS_SECONDS")
        .map(|text| text.parse().expect("CHORUS_ETCD_FAULTS_SECONDS is seconds"))
        .unwrap_or(DEFAULT_SECONDS)
}

/// Microseconds since the run began: the history's real time.
#[derive(Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn micros(&self) -> u64 {
        self.0.elapsed().as_micros() as u64
    }
}

// ---------------------------------------------------------------- nodes ----

/// One `chorus serve` instance: how it starts, its etcd URL (the same port
/// across restarts) and the running process, if any.
struct Node {
    name: &'static str,
    launch: Launch,
    etcd_url: String,
    server: Option<Server>,
}

impl Node {
    fn new(dir: &Path, name: &'static str, port: u16) -> Node {
        let data = dir.join("data").display().to_string();
        let launch = Launch::new(dir).args([
            "--data-dir",
            &data,
            "--holder",
            name,
            "--lease-ttl-secs",
            &LEASE_TTL_SECS.to_string(),
            "--etcd-listen",
            &format!("127.0.0.1:{port}"),
            "--shutdown-grace-secs",
            &SHUTDOWN_GRACE_SECS.to_string(),
        ]);
        Node {
            name,
            launch,
            etcd_url: format!("http://127.0.0.1:{port}"),
            server: None,
        }
    }

    fn start(&mut self) {
        self.server = Some(self.launch.start(self.name));
    }

    fn server(&self) -> &Server {
        self.server.as_ref().expect("the node runs")
    }

    fn server_mut(&mut self) -> &mut Server {
        self.server.as_mut().expect("the node runs")
    }

    /// Restarts the (exited) process and waits until it stands by.
    fn restart_as_standby(&mut self) {
        self.server = None;
        self.start();
        self.server().wait_for_role("standby");
    }

    /// Whether `/readyz` says this node is a primary sure of its lease now.
    fn is_ready_primary(&self) -> bool {
        let Some(server) = &self.server else {
            return false;
        };
        let request = server
            .request(Method::GET, "/readyz")
            .timeout(Duration::from_secs(2));
        server
            .try_send(request)
            .ok()
            .and_then(|reply| reply.json_value().ok())
            .is_some_and(|ready| ready["role"] == "primary" && ready["ready"] == true)
    }
}

/// Ports the etcd listeners are picked from: below Linux's ephemeral range
/// (32768–60999), so no outgoing connection takes a node's port while it
/// restarts.
const ETCD_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// Two distinct loopback ports free now, outside the ephemeral range (each
/// node's etcd listener binds its port again at every restart).
fn free_ports() -> [u16; 2] {
    let span = u64::from(ETCD_PORTS.end - ETCD_PORTS.start);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64;
    let mut rng = Rng(nanos ^ u64::from(std::process::id()));
    let mut held = Vec::new();
    for _ in 0..1_000 {
        let port = ETCD_PORTS.start + rng.below(span) as u16;
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            held.push((port, listener));
        }
        if let [(first, _), (second, _)] = held[..] {
            return [first, second];
        }
    }
    panic!("no two free ports in {ETCD_PORTS:?}");
}

/// The index of the node that is primary, waiting for one.
fn primary_index(nodes: &[Node; 2]) -> usize {
    let deadline = Instant::now() + ROLE_TIMEOUT;
    loop {
        if let Some(index) = (0..2).find(|index| nodes[*index].is_ready_primary()) {
            return index;
        }
        assert!(
            Instant::now() < deadline,
            "no primary within {ROLE_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// -------------------------------------------------------------- nemesis ----

/// What the nemesis does to a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    KillPrimary,
    StopPrimaryPastLease,
    TerminatePrimary,
    KillStandby,
    StopStandby,
    TerminateStandby,
}

impl Fault {
    const PRIMARY: [Fault; 3] = [
        Fault::KillPrimary,
        Fault::StopPrimaryPastLease,
        Fault::TerminatePrimary,
    ];
    const ALL: [Fault; 6] = [
        Fault::KillPrimary,
        Fault::StopPrimaryPastLease,
        Fault::TerminatePrimary,
        Fault::KillStandby,
        Fault::StopStandby,
        Fault::TerminateStandby,
    ];

    fn hits_primary(self) -> bool {
        Fault::PRIMARY.contains(&self)
    }
}

/// One fault as injected.
#[derive(Debug)]
struct FaultRecord {
    fault: Fault,
    /// When it hit (the history's clock).
    at_micros: u64,
    /// For a primary fault: how long until the other node reported itself
    /// primary and ready.
    takeover: Option<Duration>,
    /// For a primary fault: the node that took over.
    successor: Option<usize>,
}

/// Injects faults until `duration` passed: the three primary faults first
/// in a seeded order, then any, each followed by the restart it needs.
fn nemesis(
    nodes: &mut [Node; 2],
    rng: &mut Rng,
    duration: Duration,
    clock: Clock,
) -> Vec<FaultRecord> {
    let deadline = Instant::now() + duration;
    let mut first = Fault::PRIMARY.to_vec();
    for index in (1..first.len()).rev() {
        first.swap(index, rng.below(index as u64 + 1) as usize);
    }
    let mut records = Vec::new();
    loop {
        std::thread::sleep(rng.millis(FAULT_GAP_MS.0, FAULT_GAP_MS.1));
        if Instant::now() >= deadline {
            return records;
        }
        let fault = if records.len() < first.len() {
            first[records.len()]
        } else {
            Fault::ALL[rng.below(Fault::ALL.len() as u64) as usize]
        };
        let record = inject(nodes, fault, rng, clock);
        eprintln!(
            "fault {:>2} at {:>6.1} s: {fault:?}{}",
            records.len(),
            record.at_micros as f64 / 1e6,
            record
                .takeover
                .map(|took| format!(", takeover after {took:?}"))
                .unwrap_or_default()
        );
        records.push(record);
    }
}

/// Injects `fault` and heals it: on return both nodes run, one primary.
fn inject(nodes: &mut [Node; 2], fault: Fault, rng: &mut Rng, clock: Clock) -> FaultRecord {
    let primary = primary_index(nodes);
    let (target, other) = if fault.hits_primary() {
        (primary, 1 - primary)
    } else {
        (1 - primary, primary)
    };
    let at_micros = clock.micros();
    let hit = Instant::now();
    let mut takeover = None;
    match fault {
        Fault::KillPrimary | Fault::KillStandby => nodes[target].server_mut().kill(),
        Fault::TerminatePrimary | Fault::TerminateStandby => {
            let server = nodes[target].server_mut();
            let exit = server.terminate(ROLE_TIMEOUT);
            assert!(
                exit.success(),
                "{fault:?}: {exit:?}\n{}",
                server.stderr_tail()
            );
        }
        Fault::StopPrimaryPastLease => nodes[target].server().freeze(),
        Fault::StopStandby => {
            nodes[target].server().freeze();
            std::thread::sleep(rng.millis(STANDBY_STOP_MS.0, STANDBY_STOP_MS.1));
            nodes[target].server().resume();
        }
    }
    if fault.hits_primary() {
        nodes[other].server().wait_for_role("primary");
        takeover = Some(hit.elapsed());
    }
    match fault {
        Fault::StopPrimaryPastLease => {
            // The standby took over, so the lease had expired: resume the
            // old primary, which must step down.
            nodes[target].server().resume();
            nodes[target].server().wait_for_role("standby");
        }
        Fault::StopStandby => {
            nodes[target].server().wait_for_role("standby");
        }
        _ => nodes[target].restart_as_standby(),
    }
    FaultRecord {
        fault,
        at_micros,
        takeover,
        successor: fault.hits_primary().then_some(other),
    }
}

// -------------------------------------------------------------- clients ----

/// Why a request got no answer from the state machine.
enum Failure {
    /// Refused with nothing written.
    Refused,
    /// The write may have been applied.
    Unknown,
}

/// Sorts an error: the refusals Chorus documents as "nothing written" (a
/// standby relays them from the primary as they are) and this client's
/// connection that was never made are definite; anything else may have
/// applied.
fn classify(error: &etcd_client::Error) -> Failure {
    let message = match error {
        etcd_client::Error::GRpcStatus(status) => status.message().to_owned(),
        other => other.to_string(),
    };
    let definite = [
        "chorus: not the primary",
        "chorus: lease uncertain",
        "chorus: write not appended",
        "tcp connect error",
    ];
    // A standby relays a failure to reach the primary as etcd's timeout,
    // whatever the transport said: unknown.
    let timed_out = message.starts_with("etcdserver: request timed out");
    if !timed_out && definite.iter().any(|needle| message.contains(needle)) {
        Failure::Refused
    } else {
        Failure::Unknown
    }
}

fn entry(kv: &KeyValue) -> Entry {
    Entry {
        value: kv.value_str().expect("a text value").to_owned(),
        mod_revision: kv.mod_revision(),
        create_revision: kv.create_revision(),
        version: kv.version(),
    }
}

/// Sends `request` on `client`; the header revision and what it answered.
async fn send_once(
    client: &mut Client,
    request: &Request,
) -> Result<(Revision, Answer), etcd_client::Error> {
    let header =
        |header: Option<&etcd_client::ResponseHeader>| header.expect("a header").revision();
    match request {
        Request::Get { key, serializable } => {
            let options = serializable.then(|| GetOptions::new().with_serializable());
            let got = client.get(key.as_str(), options).await?;
            let found = got.kvs().first().map(entry);
            Ok((header(got.header()), Answer::Read(found)))
        }
        Request::Put { key, value } => {
            let put = client.put(key.as_str(), value.as_str(), None).await?;
            Ok((header(put.header()), Answer::Written))
        }
        Request::Delete { key } => {
            let deleted = client.delete(key.as_str(), None).await?;
            Ok((header(deleted.header()), Answer::Deleted(deleted.deleted())))
        }
        Request::Cas {
            key,
            expected_mod_revision,
            value,
        } => {
            let compare =
                Compare::mod_revision(key.as_str(), CompareOp::Equal, *expected_mod_revision);
            guarded_put(client, compare, key, value).await
        }
        Request::Create { key, value } => {
            let compare = Compare::create_revision(key.as_str(), CompareOp::Equal, 0);
            guarded_put(client, compare, key, value).await
        }
    }
}

/// Txn: if `compare` then put `key`=`value`, else get `key`.
async fn guarded_put(
    client: &mut Client,
    compare: Compare,
    key: &str,
    value: &str,
) -> Result<(Revision, Answer), etcd_client::Error> {
    let txn = Txn::new()
        .when([compare])
        .and_then([TxnOp::put(key, value, None)])
        .or_else([TxnOp::get(key, None)]);
    let answer = client.txn(txn).await?;
    let revision = answer.header().expect("a header").revision();
    if answer.succeeded() {
        return Ok((revision, Answer::Written));
    }
    let found = match answer.op_responses().first() {
        Some(TxnOpResponse::Get(got)) => got.kvs().first().map(entry),
        other => panic!("a failed compare answered {other:?}"),
    };
    Ok((revision, Answer::CompareFailed(found)))
}

/// Sends `request` with the request bound.
async fn send(client: &mut Client, request: &Request) -> Result<(Revision, Answer), Failure> {
    match tokio::time::timeout(REQUEST_TIMEOUT, send_once(client, request)).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(error)) => Err(classify(&error)),
        Err(_) => Err(Failure::Unknown),
    }
}

/// One client: its connections to both nodes, the node it believes primary,
/// and the `mod_revision` it last saw per key.
struct Worker {
    id: usize,
    nodes: [Client; 2],
    preferred: usize,
    known: HashMap<String, Revision>,
    rng: Rng,
    clock: Clock,
    ops: Vec<Op>,
    sequence: u64,
}

impl Worker {
    /// The next request: a mix of reads, puts, deletes, compare-and-sets
    /// on the last `mod_revision` seen and creates.
    fn next_request(&mut self) -> Request {
        let key = KEYS[self.rng.below(KEYS.len() as u64) as usize].to_owned();
        self.sequence += 1;
        let value = format!("c{}-{}", self.id, self.sequence);
        match self.rng.below(20) {
            0..=4 => Request::Get {
                key,
                serializable: false,
            },
            5..=6 => Request::Get {
                key,
                serializable: true,
            },
            7..=10 => Request::Put { key, value },
            11..=12 => Request::Delete { key },
            13..=17 => match self.known.get(&key) {
                // A compare on mod_revision 0 would be a create; see below.
                Some(&expected_mod_revision) if expected_mod_revision > 0 => Request::Cas {
                    key,
                    expected_mod_revision,
                    value,
                },
                _ => Request::Get {
                    key,
                    serializable: false,
                },
            },
            _ => Request::Create { key, value },
        }
    }

    /// Sends `request` to the node it goes to, records it, and returns its
    /// outcome; a failure moves this client to the other node.
    async fn run(&mut self, request: Request) -> Outcome {
        let node = match request {
            Request::Get {
                serializable: true, ..
            } => self.rng.below(2) as usize,
            _ => self.preferred,
        };
        let start_micros = self.clock.micros();
        let sent = send(&mut self.nodes[node], &request).await;
        let end_micros = self.clock.micros();
        let outcome = match sent {
            Ok((revision, answer)) => {
                self.learn(request.key(), revision, &answer);
                Outcome::Ok { revision, answer }
            }
            Err(failure) => {
                if node == self.preferred {
                    self.preferred = 1 - node;
                }
                let is_read = matches!(request, Request::Get { .. });
                match failure {
                    Failure::Unknown if !is_read => Outcome::Unknown,
                    _ => Outcome::Failed,
                }
            }
        };
        let answered = matches!(outcome, Outcome::Ok { .. });
        self.ops.push(Op {
            client: self.id,
            node,
            start_micros,
            end_micros: answered.then_some(end_micros),
            request,
            outcome: outcome.clone(),
        });
        if !answered {
            tokio::time::sleep(FAILURE_PAUSE).await;
        }
        outcome
    }

    /// Remembers the key's `mod_revision` as an answer showed it.
    fn learn(&mut self, key: &str, revision: Revision, answer: &Answer) {
        let seen = match answer {
            Answer::Read(found) | Answer::CompareFailed(found) => {
                found.as_ref().map_or(0, |entry| entry.mod_revision)
            }
            Answer::Written => revision,
            Answer::Deleted(_) => 0,
        };
        self.known.insert(key.to_owned(), seen);
    }
}

/// A client's loop until `stop`. A write of unknown outcome is sent again,
/// unchanged, as an etcd client retries on `Unavailable`: until it is
/// answered or its outcome is unknown again (refusals wrote nothing, so
/// they are retried too, at most [`MAX_RETRIES`] times).
async fn client_loop(mut worker: Worker, stop: Arc<AtomicBool>) -> Vec<Op> {
    while !stop.load(Ordering::Relaxed) {
        let request = worker.next_request();
        let retryable = matches!(
            request,
            Request::Put { .. } | Request::Cas { .. } | Request::Create { .. }
        );
        if worker.run(request.clone()).await != Outcome::Unknown || !retryable {
            continue;
        }
        for _ in 0..MAX_RETRIES {
            if worker.run(request.clone()).await != Outcome::Failed {
                break;
            }
        }
    }
    worker.ops
}

// ------------------------------------------------------------- watchers ----

/// What a watcher needs to know about the end of the run.
#[derive(Clone)]
struct WatchEnd {
    /// The final revision once known (0 before).
    final_revision: Arc<AtomicI64>,
}

impl WatchEnd {
    fn reached(&self, next: Revision) -> bool {
        let target = self.final_revision.load(Ordering::SeqCst);
        target > 0 && next > target
    }
}

fn event(event: &etcd_client::Event) -> Event {
    let kv = event.kv().expect("an event's entry");
    let change = match event.event_type() {
        EventType::Put => Change::Put(entry(kv)),
        EventType::Delete => Change::Delete,
    };
    Event {
        revision: kv.mod_revision(),
        key: kv.key_str().expect("a text key").to_owned(),
        change,
    }
}

/// Watches [`PREFIX`] from `start` until the final revision, starting on
/// node `first` and moving to the other whenever a stream breaks, is
/// canceled or goes silent, resuming from the last revision received + 1.
/// Gives up `CATCH_UP_TIMEOUT` after the final revision is known (the
/// checker then reports the gap). Returns the log and its reconnects.
async fn watcher(
    name: String,
    nodes: [Client; 2],
    first: usize,
    start: Revision,
    end: WatchEnd,
) -> (WatchLog, usize) {
    let mut node = first;
    let mut next = start;
    let mut events = Vec::new();
    let mut reconnects: usize = 0;
    let mut give_up_at: Option<Instant> = None;
    while !end.reached(next) {
        if end.final_revision.load(Ordering::SeqCst) > 0 {
            let give_up = *give_up_at.get_or_insert_with(|| Instant::now() + CATCH_UP_TIMEOUT);
            if Instant::now() >= give_up {
                eprintln!("watcher {name}: gave up at revision {next}");
                break;
            }
        }
        watch_session(&nodes[node], &mut next, &mut events, &end).await;
        node = 1 - node;
        reconnects += 1;
        tokio::time::sleep(FAILURE_PAUSE).await;
    }
    let log = WatchLog {
        name,
        start_revision: start,
        events,
    };
    (log, reconnects.saturating_sub(1))
}

/// One watch stream on one node, until it breaks, goes silent or the final
/// revision is reached.
async fn watch_session(
    client: &Client,
    next: &mut Revision,
    events: &mut Vec<Event>,
    end: &WatchEnd,
) {
    let options = WatchOptions::new().with_prefix().with_start_revision(*next);
    let mut client = client.clone();
    let Ok(Ok(mut stream)) =
        tokio::time::timeout(WATCH_SILENCE, client.watch(PREFIX, Some(options))).await
    else {
        return;
    };
    let mut last_heard = Instant::now();
    let mut progress = tokio::time::interval(PROGRESS_EVERY);
    loop {
        tokio::select! {
            _ = progress.tick() => {
                if last_heard.elapsed() > WATCH_SILENCE || stream.request_progress().await.is_err() {
                    return;
                }
            }
            message = stream.message() => {
                let Ok(Some(message)) = message else { return };
                last_heard = Instant::now();
                if message.canceled() {
                    eprintln!("watch canceled at {next}: {}", message.cancel_reason());
                    return;
                }
                for received in message.events() {
                    let received = event(received);
                    *next = received.revision + 1;
                    events.push(received);
                }
                if end.reached(*next) {
                    return;
                }
            }
        }
    }
}

// ------------------------------------------------------------ the end ----

/// A linearizable Range of [`PREFIX`] (at `revision`, if given) on the
/// primary, retried until answered: every key's entry and the revision.
async fn range(client: &Client, revision: Option<Revision>) -> StateAt {
    let mut options = GetOptions::new().with_prefix();
    if let Some(revision) = revision {
        options = options.with_revision(revision);
    }
    let deadline = Instant::now() + ROLE_TIMEOUT;
    loop {
        let mut client = client.clone();
        let answered =
            tokio::time::timeout(REQUEST_TIMEOUT, client.get(PREFIX, Some(options.clone()))).await;
        if let Ok(Ok(got)) = answered {
            let entries = got
                .kvs()
                .iter()
                .map(|kv| (kv.key_str().expect("a text key").to_owned(), entry(kv)))
                .collect::<BTreeMap<_, _>>();
            let revision = revision.unwrap_or_else(|| got.header().expect("a header").revision());
            return StateAt { revision, entries };
        }
        assert!(
            Instant::now() < deadline,
            "the primary answers no Range: {answered:?}"
        );
        tokio::time::sleep(FAILURE_PAUSE).await;
    }
}

/// The states at up to [`MAX_PAST_STATES`] revisions spread over
/// `first..final`, then the final state.
async fn past_states(client: &Client, first: Revision, last: StateAt) -> Vec<StateAt> {
    let span = (last.revision - first).max(0) as usize;
    let step = span.div_ceil(MAX_PAST_STATES).max(1);
    let mut states = Vec::new();
    for revision in (first..last.revision).step_by(step) {
        states.push(range(client, Some(revision)).await);
    }
    states.push(last);
    states
}

/// For each primary fault: the time until the new primary acknowledged a
/// write (the old one may still answer some: a SIGTERMed primary finishes
/// what it accepted before it lets the lease go).
fn first_writes_after(faults: &[FaultRecord], ops: &[Op]) -> Vec<(Fault, Option<Duration>)> {
    faults
        .iter()
        .filter_map(|record| Some((record, record.successor?)))
        .map(|(record, successor)| {
            let first = ops
                .iter()
                .filter(|op| op.start_micros >= record.at_micros && op.node == successor)
                .filter(|op| op.request.value().is_some())
                .filter(|op| matches!(op.outcome, Outcome::Ok { .. }))
                .filter_map(|op| op.end_micros)
                .min();
            let took = first.map(|end| Duration::from_micros(end - record.at_micros));
            (record.fault, took)
        })
        .collect()
}

/// Retries of writes of unknown outcome, per kind: requests retried, and
/// the retries' outcomes (`ok`, `failed`, `unknown`).
#[derive(Debug, Default)]
struct Retries {
    requests: usize,
    ok: usize,
    failed: usize,
    unknown: usize,
}

fn retries(ops: &[Op]) -> BTreeMap<&'static str, Retries> {
    let mut counts: BTreeMap<&'static str, Retries> = BTreeMap::new();
    let mut sent: HashMap<&str, usize> = HashMap::new();
    for op in ops {
        let Some(value) = op.request.value() else {
            continue;
        };
        let attempts = sent.entry(value).or_default();
        *attempts += 1;
        if *attempts == 1 {
            continue;
        }
        let count = counts.entry(op.request.kind()).or_default();
        count.requests += usize::from(*attempts == 2);
        match op.outcome {
            Outcome::Ok { .. } => count.ok += 1,
            Outcome::Failed => count.failed += 1,
            Outcome::Unknown => count.unknown += 1,
        }
    }
    counts
}

fn print_report(
    summary: &Summary,
    ops: &[Op],
    faults: &[FaultRecord],
    first_writes: &[(Fault, Option<Duration>)],
    reconnects: &[usize],
) {
    eprintln!("requests by kind and outcome:");
    for ((kind, outcome), count) in &summary.outcomes {
        eprintln!("  {kind:>6} {outcome:>7}: {count}");
    }
    eprintln!(
        "writes of unknown outcome: {} applied, {} not; retries: {:?}; requests applied \
         twice: {:?}",
        summary.unknown_applied,
        summary.unknown_not_applied,
        retries(ops),
        summary.applied_twice
    );
    eprintln!(
        "committed events: {}; faults: {}; takeovers: {}; watcher reconnects: {reconnects:?}",
        summary.committed_events,
        faults.len(),
        faults
            .iter()
            .filter(|record| record.takeover.is_some())
            .count()
    );
    for (record, (fault, first_write)) in faults
        .iter()
        .filter(|record| record.takeover.is_some())
        .zip(first_writes)
    {
        eprintln!(
            "  {fault:?}: takeover reported after {:?}, first write acknowledged by the new primary after {:?}",
            record.takeover.unwrap(),
            first_write
        );
    }
}

#[test]
fn etcd_histories_stay_linearizable_through_kills_pauses_and_stops() {
    let seed = seed();
    let seconds = workload_seconds();
    eprintln!("CHORUS_ETCD_FAULTS_SEED={seed} CHORUS_ETCD_FAULTS_SECONDS={seconds}");
    let mut rng = Rng(seed);
    let dir = TempDir::new().unwrap();
    let [port_a, port_b] = free_ports();
    let mut nodes = [
        Node::new(dir.path(), "node-a", port_a),
        Node::new(dir.path(), "node-b", port_b),
    ];
    nodes[0].start();
    nodes[0].server().wait_for_role("primary");
    nodes[1].start();
    nodes[1].server().wait_for_role("standby");

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(1));
    let clients: [Client; 2] = runtime.block_on(async {
        let connect = |url: String| Client::connect([url], Some(options.clone()));
        [
            connect(nodes[0].etcd_url.clone()).await.unwrap(),
            connect(nodes[1].etcd_url.clone()).await.unwrap(),
        ]
    });
    let first_revision = runtime.block_on(range(&clients[0], None)).revision + 1;
    let clock = Clock(Instant::now());
    let stop = Arc::new(AtomicBool::new(false));
    let end = WatchEnd {
        final_revision: Arc::new(AtomicI64::new(0)),
    };
    let workers: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let worker = Worker {
                id,
                nodes: clients.clone(),
                preferred: 0,
                known: HashMap::new(),
                rng: Rng(seed ^ (id as u64 + 1).wrapping_mul(0x51_7cc1_b727_220a)),
                clock,
                ops: Vec::new(),
                sequence: 0,
            };
            runtime.spawn(client_loop(worker, Arc::clone(&stop)))
        })
        .collect();
    let watchers: Vec<_> = (0..WATCHERS)
        .map(|index| {
            let name = format!("watcher-{index}");
            runtime.spawn(watcher(
                name,
                clients.clone(),
                index % 2,
                first_revision,
                end.clone(),
            ))
        })
        .collect();

    let faults = nemesis(&mut nodes, &mut rng, Duration::from_secs(seconds), clock);
    stop.store(true, Ordering::SeqCst);
    let ops: Vec<Op> = runtime.block_on(async {
        let mut ops = Vec::new();
        for worker in workers {
            ops.extend(worker.await.unwrap());
        }
        ops
    });
    let primary = primary_index(&nodes);
    let final_state = runtime.block_on(range(&clients[primary], None));
    end.final_revision
        .store(final_state.revision, Ordering::SeqCst);
    let (watches, reconnects): (Vec<WatchLog>, Vec<usize>) = runtime.block_on(async {
        let mut logs = Vec::new();
        for watcher in watchers {
            logs.push(watcher.await.unwrap());
        }
        logs.into_iter().unzip()
    });
    let (committed, _) = runtime.block_on(watcher(
        "committed".to_owned(),
        [clients[primary].clone(), clients[primary].clone()],
        0,
        first_revision,
        end.clone(),
    ));
    let states = runtime.block_on(past_states(
        &clients[primary],
        first_revision - 1,
        final_state,
    ));
    let recorded = Recorded {
        ops,
        committed: committed.events,
        first_revision,
        states,
        watches,
    };
    let summary = etcd_history::check(&recorded).unwrap_or_else(|violations| {
        let shown: Vec<_> = violations.iter().take(20).collect();
        panic!(
            "{} violations (CHORUS_ETCD_FAULTS_SEED={seed}), the first:\n{shown:#?}",
            violations.len()
        )
    });
    let first_writes = first_writes_after(&faults, &recorded.ops);
    print_report(&summary, &recorded.ops, &faults, &first_writes, &reconnects);

    assert!(
        !summary.applied_twice.contains_key("cas"),
        "a compare-and-set on mod_revision applied twice: {:?}",
        summary.applied_twice
    );
    for (fault, first_write) in &first_writes {
        let took =
            first_write.unwrap_or_else(|| panic!("{fault:?}: no write acknowledged after it"));
        assert!(
            took <= FIRST_WRITE_BOUND,
            "{fault:?}: first write after {took:?}"
        );
    }
    let acknowledged_writes = recorded
        .ops
        .iter()
        .filter(|op| op.request.value().is_some() && matches!(op.outcome, Outcome::Ok { .. }))
        .count();
    assert!(
        acknowledged_writes >= 50,
        "only {acknowledged_writes} writes acknowledged"
    );
}
