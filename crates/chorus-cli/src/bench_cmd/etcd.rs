//! `chorus bench etcd`: Chorus's etcd API beside a real etcd, driven by one
//! load generator (chorus-etcd's generated gRPC client) in this process;
//! every system runs in processes of its own.
//!
//! Systems: `etcd-3`, three etcd members on loopback started here (each its
//! own data directory on local disk, its own ports); `chorus-3-local`,
//! Chorus on three fsync'd local directories; `chorus-3-10ms`, the same
//! with every replica request delayed 10 ms (`chorus serve
//! --replica-latency-ms 10`: a remote object store's latency). Each Chorus
//! is two `chorus serve` processes, a primary and a standby on the same
//! stores, both serving etcd. The client is given every endpoint of a
//! system (three members, or the primary and the standby): its connections
//! are spread over them in turn, and a client whose request fails moves to
//! the next endpoint, as etcd's clients do.
//!
//! Workloads (8-byte keys, 256-byte values), closed loop (each client sends
//! its next request when the previous one is answered): `put` with 1, 64
//! and 1,000 clients over at most 100 connections; `range-linearizable`
//! and `range-serializable` of one key; `txn-cas` (compare a key's
//! mod_revision, then put it: each client owns its key); `watch` (`bench
//! watch`'s delivery measurement); `failover` (puts while the etcd leader
//! or the Chorus primary is SIGKILLed: how long until each client's writes
//! succeed again).
//!
//! With `--endpoints` it drives a system that is already running instead
//! (a `chorus serve` on object-store replicas, say), with every workload but
//! failover, which has to kill a node it started.
//!
//! CPU: `cpu_us_per_op` is the CPU time of this process (the load
//! generator) and of the system's processes, over the operations of the
//! cell; `server_cpu_us_per_op` is the system's processes' alone (a killed
//! one's until the kill; with `--endpoints`, those named by `--server-pid`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_etcd::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use chorus_etcd::proto::etcdserverpb::kv_client::KvClient;
use chorus_etcd::proto::etcdserverpb::request_op::Request as Op;
use chorus_etcd::proto::etcdserverpb::{Compare, PutRequest, RangeRequest, RequestOp, TxnRequest};
use serde::Serialize;
use tonic::transport::Channel;

use super::cpu::{Cpu, Spent};
use super::etcd_chorus::ChorusPair;
use super::etcd_cluster::EtcdCluster;
use super::grpc::{connect, micros_since, percentile_ms, prefix_end};
use super::{on_own_runtime, watch};
use crate::CommandError;
use crate::output::outln;

/// Connections a cell's clients share at most (etcd's benchmark: 100).
const MAX_CONNECTIONS: usize = 100;
/// Clients of the put cells.
const PUT_CLIENTS: [usize; 3] = [1, 64, 1_000];
/// Clients of the one-key range cells (etcd's published read figure: 1,000).
const RANGE_CLIENTS: usize = 1_000;
/// Clients of the prefix range cells: each answer is about 260 KiB, so
/// 1,000 of them in flight would mostly measure this load generator.
const PREFIX_RANGE_CLIENTS: usize = 64;
/// Keys under the prefix the prefix range cells read.
const PREFIX_KEYS: usize = 1_000;
/// Puts per transaction while the prefix is written (etcd's default
/// --max-txn-ops is 128).
const PRELOAD_PUTS_PER_TXN: usize = 100;
/// Clients of the compare-and-set cell.
const TXN_CLIENTS: usize = 64;
/// Clients writing through a failover.
const FAILOVER_CLIENTS: usize = 16;
/// How long the failover clients write before the kill.
const FAILOVER_WARMUP: Duration = Duration::from_secs(1);
/// How long the failover cell waits for every client's writes to resume.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one request; past it the request counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on one request of the failover cell: a request stuck at a dead
/// node is given up and retried elsewhere after this, as an etcd client
/// with a one-second deadline would.
const FAILOVER_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause of a client after a failed request, before it tries the next
/// endpoint (keeps a refusing endpoint from being hammered).
const ERROR_BACKOFF: Duration = Duration::from_millis(10);
/// Distinct keys the put cells write.
const PUT_KEY_SPACE: u64 = 100_000;
/// Bytes of every value written.
const VALUE_BYTES: usize = 256;
/// How long every endpoint may take to see the range cells' key.
const PRELOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// The one key the one-key range cells read (8 bytes).
const RANGE_KEY: &[u8] = b"range000";
/// The prefix of the prefix range cells' keys (`p/000000` …: 8 bytes).
const PREFIX: &[u8] = b"p/";

/// Why `--endpoints` runs no failover cell.
const FAILOVER_OF_EXTERNAL: &str = "--endpoints: the failover workload kills a node this benchmark started; leave it out of --workloads";

/// A system under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum System {
    /// Three etcd members on loopback.
    #[value(name = "etcd-3")]
    Etcd3,
    /// Chorus on three local directories.
    #[value(name = "chorus-3-local")]
    ChorusLocal,
    /// Chorus on three local directories, each request delayed 10 ms.
    #[value(name = "chorus-3-10ms")]
    Chorus10ms,
}

/// A workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Workload {
    /// Puts with 1, 64 and 1,000 clients.
    Put,
    /// Linearizable ranges of one key, and of a 1,000-key prefix.
    RangeLinearizable,
    /// Serializable ranges of one key, and of a 1,000-key prefix.
    RangeSerializable,
    /// Compare mod_revision, then put.
    TxnCas,
    /// Watch delivery after the put's acknowledgement.
    Watch,
    /// Time until writes succeed again after the leader/primary dies.
    Failover,
}

/// Arguments of `bench etcd`.
#[derive(Debug, Clone, clap::Args)]
pub struct EtcdBenchArgs {
    /// Systems to measure, in this order.
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = [System::Etcd3, System::ChorusLocal, System::Chorus10ms])]
    systems: Vec<System>,
    /// Workloads to run on each system (failover always last) [default:
    /// all; with --endpoints all but failover].
    #[arg(long, value_enum, value_delimiter = ',')]
    workloads: Vec<Workload>,
    /// How long each closed-loop cell runs, in seconds [default: 10; --quick: 2].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=3600))]
    seconds: Option<u64>,
    /// The etcd server binary of `etcd-3`.
    #[arg(long, default_value = "etcd")]
    etcd_binary: PathBuf,
    /// Short cells (every cell of every system in a few minutes).
    #[arg(long)]
    quick: bool,
    /// Print one JSON object per cell instead of a table.
    #[arg(long)]
    json: bool,
    /// Drive the etcd API at these URLs (comma-separated, e.g.
    /// `http://127.0.0.1:2379`) instead of starting systems here.
    #[arg(long, value_delimiter = ',', conflicts_with = "systems")]
    endpoints: Vec<String>,
    /// With `--endpoints`: process ids of the system on this machine, so
    /// that every row also reports the system's CPU per operation (Linux
    /// only).
    #[arg(long, value_delimiter = ',', requires = "endpoints")]
    server_pid: Vec<u32>,
    /// Worker threads of the closed-loop cells' load generator, a runtime
    /// of its own [default: 1, and 2 for the prefix ranges, whose answers
    /// of 1,000 keys take one thread's worth of decoding]. One thread (no
    /// work stealing, no wakeups across threads) leaves the most of the
    /// machine to the system.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    threads: Option<u16>,
}

/// One cell's results.
#[derive(Debug, Serialize)]
struct Row {
    system: String,
    workload: &'static str,
    clients: usize,
    /// Successful operations per second (watch: puts acknowledged; failover:
    /// over the whole cell, the outage included).
    per_second: f64,
    /// Latency of successful operations (watch: delivery after the put's
    /// acknowledgement; failover: each client's time from the kill to its
    /// first successful write sent after it, which includes requests stuck
    /// at the dead node until [`FAILOVER_REQUEST_TIMEOUT`]).
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    /// CPU of this process and the system's per successful operation.
    cpu_us_per_op: f64,
    /// CPU of the system's processes alone per successful operation.
    server_cpu_us_per_op: f64,
    /// Ranges: keys in each answer (1, or [`PREFIX_KEYS`] for a prefix).
    #[serde(skip_serializing_if = "Option::is_none")]
    keys: Option<usize>,
    /// Watch: deliveries owed but never received.
    #[serde(skip_serializing_if = "Option::is_none")]
    missing: Option<u64>,
    /// Failover: time from the kill to the first acknowledged write sent
    /// after it, of any client (the system takes writes again).
    #[serde(skip_serializing_if = "Option::is_none")]
    resume_ms: Option<f64>,
    /// Failover: clients whose writes never succeeded again in time.
    #[serde(skip_serializing_if = "Option::is_none")]
    unresumed: Option<u64>,
}

/// Runs the benchmark.
pub async fn run(mut args: EtcdBenchArgs) -> Result<(), CommandError> {
    if args.workloads.is_empty() {
        args.workloads = <Workload as clap::ValueEnum>::value_variants()
            .iter()
            .copied()
            .filter(|w| *w != Workload::Failover || args.endpoints.is_empty())
            .collect();
    }
    if !args.endpoints.is_empty() && args.workloads.contains(&Workload::Failover) {
        return Err(FAILOVER_OF_EXTERNAL.into());
    }
    if !args.json {
        outln!(
            "{:<15} {:<19} {:>7} {:>10} {:>8} {:>9} {:>7} {:>9} {:>9}",
            "system",
            "workload",
            "clients",
            "per_second",
            "p50 ms",
            "p99 ms",
            "errors",
            "cpu us/op",
            "server us/op"
        )?;
    }
    if !args.endpoints.is_empty() {
        let mut running = Running {
            name: "endpoints",
            backend: Backend::External(args.server_pid.clone()),
            urls: args.endpoints.clone(),
        };
        return run_cells(&mut running, &args).await;
    }
    for system in &args.systems {
        eprintln!("{}: starting …", system_name(*system));
        let mut running = Running::start(*system, &args).await?;
        let outcome = run_cells(&mut running, &args).await;
        let stopped = running.stop().await;
        outcome?;
        stopped?;
    }
    Ok(())
}

fn system_name(system: System) -> &'static str {
    match system {
        System::Etcd3 => "etcd-3",
        System::ChorusLocal => "chorus-3-local",
        System::Chorus10ms => "chorus-3-10ms",
    }
}

/// Every selected workload's cells on `running`, failover last (it kills a
/// node).
async fn run_cells(running: &mut Running, args: &EtcdBenchArgs) -> Result<(), CommandError> {
    let duration = Duration::from_secs(args.seconds.unwrap_or(if args.quick { 2 } else { 10 }));
    let selected = |workload| args.workloads.contains(&workload);
    let mut rows = Vec::new();
    if selected(Workload::Put) {
        for clients in PUT_CLIENTS {
            rows.push(
                running
                    .closed_loop(Kind::Put, clients, duration, args.threads)
                    .await?,
            );
            print(rows.last().expect("pushed"), args.json)?;
        }
    }
    let mut others = Vec::new();
    for (workload, serializable) in [
        (Workload::RangeLinearizable, false),
        (Workload::RangeSerializable, true),
    ] {
        for (prefix, clients) in [(false, RANGE_CLIENTS), (true, PREFIX_RANGE_CLIENTS)] {
            let kind = Kind::Range {
                serializable,
                prefix,
            };
            others.push((workload, kind, clients));
        }
    }
    others.push((Workload::TxnCas, Kind::TxnCas, TXN_CLIENTS));
    for (workload, kind, clients) in others {
        if selected(workload) {
            rows.push(
                running
                    .closed_loop(kind, clients, duration, args.threads)
                    .await?,
            );
            print(rows.last().expect("pushed"), args.json)?;
        }
    }
    if selected(Workload::Watch) {
        rows.push(running.watch(args.quick).await?);
        print(rows.last().expect("pushed"), args.json)?;
    }
    if selected(Workload::Failover) {
        rows.push(running.failover().await?);
        print(rows.last().expect("pushed"), args.json)?;
    }
    Ok(())
}

fn print(row: &Row, json: bool) -> Result<(), CommandError> {
    if json {
        return outln!("{}", serde_json::to_string(row).expect("rows encode"));
    }
    let mut extra = String::new();
    if let Some(keys) = row.keys {
        extra = format!("  {keys} key(s) per range");
    }
    if let Some(missing) = row.missing {
        extra = format!("  missing {missing}");
    }
    if let (Some(resume), Some(unresumed)) = (row.resume_ms, row.unresumed) {
        extra = format!("  first write after {resume:.0} ms, unresumed {unresumed}");
    }
    outln!(
        "{:<15} {:<19} {:>7} {:>10.0} {:>8.2} {:>9.2} {:>7} {:>9.1} {:>12.1}{extra}",
        row.system,
        row.workload,
        row.clients,
        row.per_second,
        row.p50_ms,
        row.p99_ms,
        row.errors,
        row.cpu_us_per_op,
        row.server_cpu_us_per_op
    )
}

/// What a closed-loop client sends.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Put,
    /// `prefix`: the [`PREFIX_KEYS`] keys under [`PREFIX`], else [`RANGE_KEY`].
    Range {
        serializable: bool,
        prefix: bool,
    },
    TxnCas,
}

impl Kind {
    /// The load generator's threads for this kind by default: one, but two
    /// for prefix ranges, whose answers one thread cannot decode as fast as
    /// the systems send them.
    fn generator_threads(self) -> usize {
        match self {
            Kind::Range { prefix: true, .. } => 2,
            _ => 1,
        }
    }

    fn workload(self) -> &'static str {
        match self {
            Kind::Put => "put",
            Kind::Range {
                serializable: false,
                ..
            } => "range-linearizable",
            Kind::Range {
                serializable: true, ..
            } => "range-serializable",
            Kind::TxnCas => "txn-cas",
        }
    }
}

/// A system started for the benchmark.
struct Running {
    /// The system's name in the rows.
    name: &'static str,
    backend: Backend,
    urls: Vec<String>,
}

/// What runs a system.
enum Backend {
    Etcd(EtcdCluster),
    Chorus(ChorusPair),
    /// A system started elsewhere (`--endpoints`), with the process ids
    /// whose CPU counts as the system's.
    External(Vec<u32>),
}

impl Running {
    async fn start(system: System, args: &EtcdBenchArgs) -> Result<Running, CommandError> {
        let (backend, urls) = match system {
            System::Etcd3 => {
                let cluster = EtcdCluster::start(&args.etcd_binary, 3).await?;
                let urls = cluster.urls();
                (Backend::Etcd(cluster), urls)
            }
            System::ChorusLocal | System::Chorus10ms => {
                let latency_ms = if system == System::Chorus10ms { 10 } else { 0 };
                let pair = ChorusPair::start(latency_ms).await?;
                let urls = pair.urls();
                (Backend::Chorus(pair), urls)
            }
        };
        Ok(Running {
            name: system_name(system),
            backend,
            urls,
        })
    }

    async fn stop(self) -> Result<(), CommandError> {
        match self.backend {
            Backend::Etcd(cluster) => drop(cluster),
            Backend::Chorus(pair) => pair.stop().await?,
            Backend::External(_) => {}
        }
        Ok(())
    }

    /// The process ids of the system's processes still running.
    fn server_pids(&self) -> Vec<u32> {
        match &self.backend {
            Backend::Etcd(cluster) => cluster.pids(),
            Backend::Chorus(pair) => pair.pids(),
            Backend::External(pids) => pids.clone(),
        }
    }

    /// CPU ticks of this process and of the system's processes so far.
    fn cpu(&self) -> Cpu {
        Cpu::now(self.server_pids())
    }

    /// One closed-loop cell: `clients` clients sending `kind` for
    /// `duration`, on a runtime of `threads` worker threads of their own
    /// (`None`: [`Kind::generator_threads`]).
    async fn closed_loop(
        &self,
        kind: Kind,
        clients: usize,
        duration: Duration,
        threads: Option<u16>,
    ) -> Result<Row, CommandError> {
        let name = self.name;
        eprintln!("{name}: {} with {clients} clients …", kind.workload());
        let (urls, pids) = (self.urls.clone(), self.server_pids());
        let threads = threads.map_or(kind.generator_threads(), usize::from);
        let (outcomes, elapsed, cpu) = on_own_runtime(threads, async move {
            let pool = Arc::new(Pool::open(&urls, clients.min(MAX_CONNECTIONS)).await?);
            if let Kind::Range { prefix, .. } = kind {
                pool.preload_range(prefix).await?;
            }
            let control = Arc::new(Control::new(REQUEST_TIMEOUT));
            let before = Cpu::now(pids.iter().copied());
            let started = Instant::now();
            let tasks = spawn_clients(&pool, kind, clients, &control);
            tokio::time::sleep(duration).await;
            control.stop.store(true, Ordering::Relaxed);
            let outcomes = join(tasks).await?;
            let elapsed = started.elapsed();
            let cpu = Cpu::now(pids).since(&before, &before);
            Ok((outcomes, elapsed, cpu))
        })
        .await?;
        let mut row = summarize(name, kind.workload(), clients, &outcomes, elapsed, cpu);
        if let Kind::Range { prefix, .. } = kind {
            row.keys = Some(keys_read(prefix));
        }
        Ok(row)
    }

    /// The watch cell: `bench watch`'s measurement over every endpoint.
    async fn watch(&self, quick: bool) -> Result<Row, CommandError> {
        let name = self.name;
        let before = self.cpu();
        let measured = watch::measure_cell(&self.urls, name, quick).await?;
        let cpu = self.cpu().since(&before, &before);
        let operations = measured.puts as f64;
        Ok(Row {
            system: name.to_owned(),
            workload: "watch",
            clients: measured.clients,
            per_second: measured.per_second,
            p50_ms: measured.p50_ms,
            p99_ms: measured.p99_ms,
            errors: measured.errors,
            cpu_us_per_op: cpu.total_us() / operations.max(1.0),
            server_cpu_us_per_op: cpu.server_us() / operations.max(1.0),
            keys: None,
            missing: Some(measured.missing),
            resume_ms: None,
            unresumed: None,
        })
    }

    /// The failover cell: clients put, the leader/primary is killed after
    /// [`FAILOVER_WARMUP`], and the cell ends when every client had a write
    /// sent after the kill succeed (or after [`FAILOVER_TIMEOUT`]).
    async fn failover(&mut self) -> Result<Row, CommandError> {
        let name = self.name;
        eprintln!("{name}: failover with {FAILOVER_CLIENTS} clients …");
        let pool = Arc::new(Pool::open(&self.urls, FAILOVER_CLIENTS).await?);
        let control = Arc::new(Control::new(FAILOVER_REQUEST_TIMEOUT));
        let before = self.cpu();
        let started = Instant::now();
        let tasks = spawn_clients(&pool, Kind::Put, FAILOVER_CLIENTS, &control);
        tokio::time::sleep(FAILOVER_WARMUP).await;
        let leader = match &self.backend {
            Backend::Etcd(cluster) => cluster.leader().await?,
            Backend::Chorus(_) | Backend::External(_) => 0,
        };
        let before_kill = self.cpu();
        control
            .killed_at_us
            .store(micros_since(control.epoch), Ordering::Relaxed);
        match &mut self.backend {
            Backend::Etcd(cluster) => cluster.kill(leader)?,
            Backend::Chorus(pair) => pair.kill_primary()?,
            Backend::External(_) => return Err(FAILOVER_OF_EXTERNAL.into()),
        }
        let deadline = Instant::now() + FAILOVER_TIMEOUT;
        while control.resumed.load(Ordering::Relaxed) < FAILOVER_CLIENTS as u64
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        control.stop.store(true, Ordering::Relaxed);
        let outcomes = join(tasks).await?;
        let elapsed = started.elapsed();
        // The killed member's CPU counts until the kill.
        let cpu = self.cpu().since(&before, &before_kill);
        let mut row = summarize(name, "failover", FAILOVER_CLIENTS, &outcomes, elapsed, cpu);
        let mut resumes: Vec<u32> = outcomes.iter().filter_map(|o| o.resumed_us).collect();
        resumes.sort_unstable();
        row.p50_ms = percentile_ms(&resumes, 0.50);
        row.p99_ms = percentile_ms(&resumes, 0.99);
        row.resume_ms = Some(percentile_ms(&resumes, 0.0));
        row.unresumed = Some((FAILOVER_CLIENTS - resumes.len()) as u64);
        Ok(row)
    }
}

/// The connections of one cell: `by_endpoint[e]` are those to endpoint `e`.
struct Pool {
    by_endpoint: Vec<Vec<KvClient<Channel>>>,
}

impl Pool {
    /// `connections` connections spread over `urls` (at least one each).
    async fn open(urls: &[String], connections: usize) -> Result<Pool, CommandError> {
        let per_endpoint = connections.div_ceil(urls.len()).max(1);
        let mut by_endpoint = Vec::with_capacity(urls.len());
        for url in urls {
            let mut clients = Vec::with_capacity(per_endpoint);
            for _ in 0..per_endpoint {
                clients.push(KvClient::new(connect(url).await?));
            }
            by_endpoint.push(clients);
        }
        Ok(Pool { by_endpoint })
    }

    /// Client `client`'s connection on endpoint `endpoint`.
    fn client(&self, endpoint: usize, client: usize) -> KvClient<Channel> {
        let connections = &self.by_endpoint[endpoint % self.by_endpoint.len()];
        connections[(client / self.by_endpoint.len()) % connections.len()].clone()
    }

    fn endpoints(&self) -> usize {
        self.by_endpoint.len()
    }

    /// Writes what the range cells read (the one key, or the prefix's
    /// keys) and waits until a serializable range on every endpoint sees
    /// all of it (a standby applies it a poll later).
    async fn preload_range(&self, prefix: bool) -> Result<(), CommandError> {
        let mut kv = self.client(0, 0);
        if prefix {
            let keys: Vec<usize> = (0..PREFIX_KEYS).collect();
            for chunk in keys.chunks(PRELOAD_PUTS_PER_TXN) {
                let puts = chunk
                    .iter()
                    .map(|n| RequestOp {
                        request: Some(Op::RequestPut(PutRequest {
                            key: prefix_key(*n),
                            value: value(),
                            ..PutRequest::default()
                        })),
                    })
                    .collect();
                kv.txn(TxnRequest {
                    success: puts,
                    ..TxnRequest::default()
                })
                .await?;
            }
        } else {
            kv.put(PutRequest {
                key: Bytes::from_static(RANGE_KEY),
                value: value(),
                ..PutRequest::default()
            })
            .await?;
        }
        let expected = keys_read(prefix);
        let deadline = Instant::now() + PRELOAD_TIMEOUT;
        for endpoint in 0..self.endpoints() {
            let mut kv = self.client(endpoint, 0);
            loop {
                let mut request = range_request(prefix, true);
                request.count_only = true;
                let answer = kv.range(request).await?.into_inner();
                if answer.count == expected as i64 {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "endpoint {endpoint} did not see the range cells' {expected} key(s) within {PRELOAD_TIMEOUT:?}"
                    )
                    .into());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        Ok(())
    }
}

/// The range of a range cell: the one key, or every key under the prefix.
fn range_request(prefix: bool, serializable: bool) -> RangeRequest {
    if prefix {
        RangeRequest {
            key: Bytes::from_static(PREFIX),
            range_end: prefix_end(PREFIX),
            serializable,
            ..RangeRequest::default()
        }
    } else {
        RangeRequest {
            key: Bytes::from_static(RANGE_KEY),
            serializable,
            ..RangeRequest::default()
        }
    }
}

/// The keys a range cell's answer holds.
fn keys_read(prefix: bool) -> usize {
    if prefix { PREFIX_KEYS } else { 1 }
}

/// Key `n` under [`PREFIX`] (8 bytes).
fn prefix_key(n: usize) -> Bytes {
    let mut key = PREFIX.to_vec();
    key.extend_from_slice(format!("{n:06}").as_bytes());
    Bytes::from(key)
}

fn value() -> Bytes {
    Bytes::from(vec![b'v'; VALUE_BYTES])
}

/// What the cell's driver and its clients share.
struct Control {
    epoch: Instant,
    request_timeout: Duration,
    stop: AtomicBool,
    /// Microseconds since `epoch` of the kill (`u32::MAX`: none yet).
    killed_at_us: AtomicU32,
    /// Clients that had a write sent after the kill succeed.
    resumed: AtomicU64,
}

impl Control {
    fn new(request_timeout: Duration) -> Control {
        Control {
            epoch: Instant::now(),
            request_timeout,
            stop: AtomicBool::new(false),
            killed_at_us: AtomicU32::new(u32::MAX),
            resumed: AtomicU64::new(0),
        }
    }
}

/// What one client measured.
#[derive(Debug, Default)]
struct Outcome {
    latencies_us: Vec<u32>,
    errors: u64,
    /// From the kill to this client's first success sent after it.
    resumed_us: Option<u32>,
}

fn spawn_clients(
    pool: &Arc<Pool>,
    kind: Kind,
    clients: usize,
    control: &Arc<Control>,
) -> Vec<tokio::task::JoinHandle<Outcome>> {
    (0..clients)
        .map(|client| {
            let (pool, control) = (Arc::clone(pool), Arc::clone(control));
            tokio::spawn(async move { drive(&pool, kind, client, &control).await })
        })
        .collect()
}

async fn join(tasks: Vec<tokio::task::JoinHandle<Outcome>>) -> Result<Vec<Outcome>, CommandError> {
    let mut outcomes = Vec::with_capacity(tasks.len());
    for task in tasks {
        outcomes.push(task.await?);
    }
    Ok(outcomes)
}

/// One closed-loop client until the stop: a failed request moves it to
/// the next endpoint after [`ERROR_BACKOFF`].
async fn drive(pool: &Pool, kind: Kind, client: usize, control: &Control) -> Outcome {
    let mut outcome = Outcome::default();
    let mut endpoint = client % pool.endpoints();
    let mut kv = pool.client(endpoint, client);
    let mut state = ClientState {
        client,
        sent: 0,
        // Unknown until read (the key may exist from an earlier cell).
        revision: None,
        value: value(),
    };
    while !control.stop.load(Ordering::Relaxed) {
        let sent = micros_since(control.epoch);
        let answered =
            tokio::time::timeout(control.request_timeout, state.send(&mut kv, kind)).await;
        let acked = micros_since(control.epoch);
        if let Ok(Ok(())) = answered {
            outcome.latencies_us.push(acked.saturating_sub(sent));
            let killed = control.killed_at_us.load(Ordering::Relaxed);
            if outcome.resumed_us.is_none() && sent >= killed {
                outcome.resumed_us = Some(acked - killed);
                control.resumed.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            outcome.errors += 1;
            state.revision = None;
            endpoint += 1;
            kv = pool.client(endpoint, client);
            tokio::time::sleep(ERROR_BACKOFF).await;
        }
    }
    outcome
}

/// A client's own sequence.
struct ClientState {
    client: usize,
    sent: u64,
    /// txn-cas: the mod_revision of the client's key, when known.
    revision: Option<i64>,
    value: Bytes,
}

impl ClientState {
    /// One request of `kind`; a compare-and-set that does not apply is an
    /// error (nobody else writes the client's key).
    async fn send(&mut self, kv: &mut KvClient<Channel>, kind: Kind) -> Result<(), CommandError> {
        self.sent += 1;
        match kind {
            Kind::Put => {
                let n = (self.client as u64 * 1_000_003 + self.sent) % PUT_KEY_SPACE;
                kv.put(PutRequest {
                    key: Bytes::from(format!("{n:08}")),
                    value: self.value.clone(),
                    ..PutRequest::default()
                })
                .await?;
            }
            Kind::Range {
                serializable,
                prefix,
            } => {
                let answer = kv
                    .range(range_request(prefix, serializable))
                    .await?
                    .into_inner();
                let expected = keys_read(prefix);
                if answer.kvs.len() != expected {
                    return Err(format!(
                        "a range answered {} keys, not {expected}",
                        answer.kvs.len()
                    )
                    .into());
                }
            }
            Kind::TxnCas => self.compare_and_set(kv).await?,
        }
        Ok(())
    }

    async fn compare_and_set(&mut self, kv: &mut KvClient<Channel>) -> Result<(), CommandError> {
        let key = Bytes::from(format!("t{:07}", self.client));
        let revision = match self.revision {
            Some(revision) => revision,
            None => {
                let answer = kv
                    .range(RangeRequest {
                        key: key.clone(),
                        ..RangeRequest::default()
                    })
                    .await?
                    .into_inner();
                answer.kvs.first().map_or(0, |kv| kv.mod_revision)
            }
        };
        let answer = kv
            .txn(TxnRequest {
                compare: vec![Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Mod as i32,
                    key: key.clone(),
                    target_union: Some(TargetUnion::ModRevision(revision)),
                    ..Compare::default()
                }],
                success: vec![RequestOp {
                    request: Some(Op::RequestPut(PutRequest {
                        key,
                        value: self.value.clone(),
                        ..PutRequest::default()
                    })),
                }],
                failure: Vec::new(),
            })
            .await?
            .into_inner();
        if !answer.succeeded {
            return Err("a compare-and-set of the client's own key did not apply".into());
        }
        self.revision = answer.header.map(|header| header.revision);
        Ok(())
    }
}

/// The row of a closed-loop cell.
fn summarize(
    system: &str,
    workload: &'static str,
    clients: usize,
    outcomes: &[Outcome],
    elapsed: Duration,
    cpu: Spent,
) -> Row {
    let mut latencies: Vec<u32> = outcomes
        .iter()
        .flat_map(|o| o.latencies_us.iter().copied())
        .collect();
    latencies.sort_unstable();
    let operations = (latencies.len() as f64).max(1.0);
    Row {
        system: system.to_owned(),
        workload,
        clients,
        per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50_ms: percentile_ms(&latencies, 0.50),
        p99_ms: percentile_ms(&latencies, 0.99),
        errors: outcomes.iter().map(|o| o.errors).sum(),
        cpu_us_per_op: cpu.total_us() / operations,
        server_cpu_us_per_op: cpu.server_us() / operations,
        keys: None,
        missing: None,
        resume_ms: None,
        unresumed: None,
    }
}
