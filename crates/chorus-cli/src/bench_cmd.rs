//! `chorus bench log`: ack latency and peak throughput of the write path over
//! in-memory replicas behind the latency-injecting store; `chorus bench kv`
//! ([`kv`]): the key-value service over HTTP; `chorus bench failover`
//! ([`failover`]): the takeover time of `chorus serve` on real processes.
//!
//! `chorus bench recovery` ([`recovery`]): log open time against log length,
//! and replay throughput. `chorus bench takeover` ([`takeover`]): takeover
//! time against the size of the state, warm standby and cold process.
//! `chorus bench watch` ([`watch`]): watch delivery over etcd's gRPC API.
//! `chorus bench etcd` ([`etcd`]): Chorus's etcd API beside a real etcd.
//!
//! `bench log` has six scenarios: light load (one append at a time) and peak load (appends
//! pipelined up to the in-flight budget), each with all replicas at the
//! injected latency, with one replica much slower, and with repair passes
//! running back to back beside the appends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus::blob::{DynBlobStore, LatencyStore, ObjectStoreBlobs};
use chorus::log::maintenance::{Maintenance, NoProgress};
use chorus::log::{Completion, LogConfig, LogError, LogStores, Recovery, Writer};
use chorus::register::{MemoryRegister, initialize};
use object_store::memory::InMemory;
use serde::Serialize;

use crate::CommandError;
use crate::output::outln;

mod cpu;
mod etcd;
mod etcd_chorus;
mod etcd_cluster;
mod failover;
mod grpc;
mod kv;
mod recovery;
mod takeover;
mod watch;

/// The `bench` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Benchmark the replicated log's write path.
    Log(LogBenchArgs),
    /// Benchmark the key-value service over HTTP: puts and gets per second
    /// with latency percentiles, on a running service or one started here.
    Kv(kv::KvBenchArgs),
    /// Measure the takeover time of `chorus serve`: SIGKILL of the primary →
    /// first write acknowledged by the standby, over several runs.
    Failover(failover::FailoverBenchArgs),
    /// Measure log open time (recovery, start, a reader's first record)
    /// against the number of sealed segments and the active segment's size,
    /// and replay throughput.
    Recovery(recovery::RecoveryBenchArgs),
    /// Measure takeover time against the size of the state: a graceful stop
    /// of the primary → first write acknowledged by a warm standby or a cold
    /// process, with the new primary's boot phases and peak RSS.
    Takeover(takeover::TakeoverBenchArgs),
    /// Measure watch delivery over etcd's gRPC API: the time from a put's
    /// acknowledgement to its event at each of many watchers, at a paced
    /// rate of puts.
    Watch(watch::WatchBenchArgs),
    /// Compare Chorus's etcd API with a real 3-member etcd started here:
    /// puts, ranges, compare-and-set, watch delivery and failover, with
    /// throughput, latency percentiles and CPU per operation.
    Etcd(etcd::EtcdBenchArgs),
}

/// Arguments of `bench log`.
#[derive(Debug, Clone, clap::Args)]
pub struct LogBenchArgs {
    /// Replicas (1, 3 or 5).
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Latency injected into every store request, in milliseconds.
    #[arg(long, default_value_t = 10)]
    latency_ms: u64,
    /// Latency of the slow replica in the slow-replica scenarios, in milliseconds.
    #[arg(long, default_value_t = 100)]
    slow_latency_ms: u64,
    /// Size of each record in bytes.
    #[arg(long, default_value_t = 4096)]
    record_bytes: usize,
    /// Appends measured at light load.
    #[arg(long, default_value_t = 500)]
    light_appends: usize,
    /// MiB appended before the repair scenarios, so repair has sealed
    /// segments to read.
    #[arg(long, default_value_t = 256)]
    prefill_mib: u64,
    /// How long each peak-load scenario runs, in seconds.
    #[arg(long, default_value_t = 5)]
    peak_seconds: u64,
    /// Print one JSON object per scenario instead of a table.
    #[arg(long)]
    json: bool,
}

/// One scenario's measurements.
#[derive(Debug, Serialize)]
struct Outcome {
    scenario: String,
    appends: u64,
    seconds: f64,
    throughput_mb_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

impl BenchCommand {
    /// Runs the benchmark.
    pub async fn run(self) -> Result<(), CommandError> {
        let args = match self {
            BenchCommand::Log(args) => args,
            BenchCommand::Kv(args) => return kv::run(args).await,
            BenchCommand::Failover(args) => return failover::run(args).await,
            BenchCommand::Recovery(args) => return recovery::run(args).await,
            BenchCommand::Takeover(args) => return takeover::run(args).await,
            BenchCommand::Watch(args) => return watch::run(args).await,
            BenchCommand::Etcd(args) => return etcd::run(args).await,
        };
        if ![1, 3, 5].contains(&args.replicas) {
            return Err("--replicas must be 1, 3 or 5".into());
        }
        let slow = Some(args.slow_latency_ms);
        let scenarios = [
            ("light", None, false),
            ("light, one slow replica", slow, false),
            ("light, repair running", None, true),
            ("peak", None, false),
            ("peak, one slow replica", slow, false),
            ("peak, repair running", None, true),
        ];
        if !args.json {
            outln!(
                "{:<26} {:>8} {:>8} {:>10} {:>9} {:>9} {:>9}",
                "scenario",
                "appends",
                "seconds",
                "MB/s",
                "p50 ms",
                "p99 ms",
                "max ms"
            )?;
        }
        for (name, slow, repair) in scenarios {
            eprintln!("running: {name} …");
            let (writer, stores) = open_writer(&args, slow).await?;
            if repair {
                prefill(&writer, &args).await?;
            }
            let repairing = repair.then(|| spawn_repair_loop(&stores));
            let outcome = if name.starts_with("light") {
                light(&writer, &args).await?
            } else {
                peak(&writer, &args).await?
            };
            if let Some(repairing) = repairing {
                repairing.abort();
            }
            writer.shutdown(Duration::from_secs(30)).await?;
            print_outcome(
                &Outcome {
                    scenario: name.to_owned(),
                    ..outcome
                },
                args.json,
            )?;
        }
        Ok(())
    }
}

/// Runs repair passes back to back (reading every sealed copy on every
/// replica) until aborted, as a maintenance load beside the appends.
fn spawn_repair_loop(stores: &LogStores) -> tokio::task::JoinHandle<()> {
    let maintenance = Maintenance::new(stores);
    tokio::spawn(async move {
        loop {
            if let Err(error) = maintenance.repair(&NoProgress).await {
                eprintln!("repair failed: {error}");
            }
            tokio::task::yield_now().await;
        }
    })
}

fn print_outcome(outcome: &Outcome, json: bool) -> Result<(), CommandError> {
    if json {
        outln!(
            "{}",
            serde_json::to_string(outcome).expect("outcomes encode")
        )
    } else {
        outln!(
            "{:<26} {:>8} {:>8.2} {:>10.1} {:>9.2} {:>9.2} {:>9.2}",
            outcome.scenario,
            outcome.appends,
            outcome.seconds,
            outcome.throughput_mb_per_s,
            outcome.p50_ms,
            outcome.p99_ms,
            outcome.max_ms
        )
    }
}

/// A fresh log over in-memory replicas behind the latency store; replica 0
/// gets `slow_ms` instead when set.
async fn open_writer(
    args: &LogBenchArgs,
    slow_ms: Option<u64>,
) -> Result<(Writer, LogStores), LogError> {
    // Window 4, as docs/BENCHMARKS.md records the earlier runs with.
    let replicas = latency_replicas(args.replicas, args.latency_ms, slow_ms);
    let stores = new_log(replicas, 4).await?;
    Ok((start_writer(&stores, LogConfig::default()).await?, stores))
}

/// A new, empty log over `replicas` with an in-memory register and `window`
/// fragments in flight per replica.
async fn new_log(
    replicas: Vec<(String, DynBlobStore)>,
    window: u32,
) -> Result<LogStores, LogError> {
    let register = Arc::new(MemoryRegister::new());
    let identities = replicas
        .iter()
        .map(|(identity, _)| identity.clone())
        .collect();
    initialize(register.as_ref(), identities, window)
        .await
        .map_err(|e| LogError::Transition(e.to_string()))?;
    Ok(LogStores { replicas, register })
}

/// Recovers the log in `stores`, replays it and starts a writer.
async fn start_writer(stores: &LogStores, config: LogConfig) -> Result<Writer, LogError> {
    let recovery = Recovery::run(stores.clone(), config).await?;
    let mut replay = recovery.replay(recovery.end())?;
    while replay.next().await?.is_some() {}
    recovery.start().await
}

/// `count` in-memory replicas behind the latency store, each request taking
/// `latency_ms` (replica 0 `slow_ms` when set), with their identities.
fn latency_replicas(
    count: usize,
    latency_ms: u64,
    slow_ms: Option<u64>,
) -> Vec<(String, DynBlobStore)> {
    (0..count)
        .map(|position| {
            let latency = match (position, slow_ms) {
                (0, Some(slow)) => slow,
                _ => latency_ms,
            };
            let identity = replica_identity(position);
            let delayed = delayed(memory_store(&identity), latency);
            (identity, delayed)
        })
        .collect()
}

/// The identity of the benchmark's replica at `position`.
fn replica_identity(position: usize) -> String {
    format!("memory://bench-{position}")
}

/// `store` behind the latency store: every request takes `latency_ms`.
fn delayed(store: DynBlobStore, latency_ms: u64) -> DynBlobStore {
    Arc::new(LatencyStore::fixed(
        store,
        Duration::from_millis(latency_ms),
    ))
}

/// A fresh, private in-memory store.
fn memory_store(identity: &str) -> DynBlobStore {
    blobs_over(Arc::new(InMemory::new()), identity)
}

/// The blob store over the in-memory object store `memory`.
fn blobs_over(memory: Arc<InMemory>, identity: &str) -> DynBlobStore {
    Arc::new(ObjectStoreBlobs::new(memory, "", identity.to_owned()))
}

/// The `p`-th percentile of sorted `latencies`, in milliseconds.
/// Runs `work` to its end on a new runtime of `threads` worker threads
/// (one: a current-thread runtime) on a thread of its own: a load
/// generator apart from the runtime of a service in this process, and with
/// one thread no wakeups across threads and no work stealing, so it takes
/// as little of the machine as it can.
pub(super) async fn on_own_runtime<T: Send + 'static>(
    threads: usize,
    work: impl Future<Output = Result<T, CommandError>> + Send + 'static,
) -> Result<T, CommandError> {
    let runtime = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?
    };
    let (done, outcome) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("bench-load".to_owned())
        .spawn(move || {
            let _ = done.send(runtime.block_on(work));
        })?;
    outcome
        .await
        .map_err(|_| "the load generator's thread ended without an answer")?
}

fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1000.0
}

/// Appends `prefill_mib` of records so repair has sealed segments to read.
async fn prefill(writer: &Writer, args: &LogBenchArgs) -> Result<(), LogError> {
    let record = Bytes::from(vec![0x11; args.record_bytes]);
    append_at_peak(
        writer,
        &record,
        args.prefill_mib * 1024 * 1024 / args.record_bytes as u64,
    )
    .await
}

/// Appends `count` copies of `record` as fast as admission allows and waits
/// until every one is acknowledged.
async fn append_at_peak(writer: &Writer, record: &Bytes, count: u64) -> Result<(), LogError> {
    let mut pipeline = Pipelined::default();
    for _ in 0..count {
        pipeline.append(writer, record).await?;
    }
    pipeline.drain().await?;
    Ok(())
}

/// Appends in flight, oldest first, and the ack latencies seen so far.
#[derive(Default)]
struct Pipelined {
    outstanding: std::collections::VecDeque<(Instant, Completion)>,
    latencies: Vec<Duration>,
    /// Times admission refused with nothing of ours in flight (the previous
    /// segment still sealing), each followed by a 1 ms pause.
    stalls: u64,
}

impl Pipelined {
    /// Admits `record`, waiting for the oldest outstanding append while
    /// admission pushes back.
    async fn append(&mut self, writer: &Writer, record: &Bytes) -> Result<(), LogError> {
        loop {
            match writer.append(record.clone()) {
                Ok(completion) => {
                    self.outstanding.push_back((Instant::now(), completion));
                    return Ok(());
                }
                Err(LogError::Backpressure { .. } | LogError::ActiveSegmentFull { .. }) => {
                    match self.outstanding.pop_front() {
                        Some((sent, oldest)) => {
                            oldest.await?;
                            self.latencies.push(sent.elapsed());
                        }
                        None => {
                            self.stalls += 1;
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Waits for every outstanding append.
    async fn drain(mut self) -> Result<(Vec<Duration>, u64), LogError> {
        for (sent, completion) in self.outstanding.drain(..) {
            completion.await?;
            self.latencies.push(sent.elapsed());
        }
        Ok((self.latencies, self.stalls))
    }
}

/// One append at a time: the latency of an otherwise idle log.
async fn light(writer: &Writer, args: &LogBenchArgs) -> Result<Outcome, LogError> {
    let record = Bytes::from(vec![0x5a; args.record_bytes]);
    let mut latencies = Vec::with_capacity(args.light_appends);
    let started = Instant::now();
    for _ in 0..args.light_appends {
        let sent = Instant::now();
        writer.append(record.clone())?.await?;
        latencies.push(sent.elapsed());
    }
    Ok(summarize(latencies, started.elapsed(), args.record_bytes))
}

/// Appends pipelined as fast as admission allows, for `peak_seconds`.
async fn peak(writer: &Writer, args: &LogBenchArgs) -> Result<Outcome, LogError> {
    let record = Bytes::from(vec![0xa5; args.record_bytes]);
    let deadline = Instant::now() + Duration::from_secs(args.peak_seconds);
    let mut pipeline = Pipelined::default();
    let started = Instant::now();
    while Instant::now() < deadline {
        pipeline.append(writer, &record).await?;
    }
    let (latencies, stalls) = pipeline.drain().await?;
    if stalls > 0 {
        eprintln!("admission stalled {stalls} times with nothing in flight (sealing behind)");
    }
    Ok(summarize(latencies, started.elapsed(), args.record_bytes))
}

fn summarize(mut latencies: Vec<Duration>, elapsed: Duration, record_bytes: usize) -> Outcome {
    latencies.sort_unstable();
    let percentile = |p: f64| percentile_ms(&latencies, p);
    let appends = latencies.len() as u64;
    Outcome {
        scenario: String::new(),
        appends,
        seconds: elapsed.as_secs_f64(),
        throughput_mb_per_s: (appends as f64 * record_bytes as f64) / elapsed.as_secs_f64() / 1e6,
        p50_ms: percentile(0.50),
        p99_ms: percentile(0.99),
        max_ms: percentile(1.0),
    }
}
