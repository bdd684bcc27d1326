//! `chorus bench log`: ack latency and peak throughput of the write path over
//! in-memory replicas behind the latency-injecting store.
//!
//! Four scenarios: light load (one append at a time) and peak load (appends
//! pipelined up to the in-flight budget), each with all replicas at the
//! injected latency and with one replica much slower.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus::blob::{DynBlobStore, Latency, LatencyProfile, LatencyStore, ObjectStoreBlobs};
use chorus::log::{LogConfig, LogError, LogStores, Recovery, Writer};
use chorus::register::{MemoryRegister, initialize};
use serde::Serialize;

use crate::CommandError;

/// The `bench` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Benchmark the replicated log's write path.
    Log(LogBenchArgs),
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
        let BenchCommand::Log(args) = self;
        if ![1, 3, 5].contains(&args.replicas) {
            return Err("--replicas must be 1, 3 or 5".into());
        }
        let slow = Some(args.slow_latency_ms);
        let scenarios = [
            ("light", None),
            ("light, one slow replica", slow),
            ("peak", None),
            ("peak, one slow replica", slow),
        ];
        if !args.json {
            println!(
                "{:<26} {:>8} {:>8} {:>10} {:>9} {:>9} {:>9}",
                "scenario", "appends", "seconds", "MB/s", "p50 ms", "p99 ms", "max ms"
            );
        }
        for (name, slow) in scenarios {
            eprintln!("running: {name} …");
            let writer = open_writer(&args, slow).await?;
            let outcome = if name.starts_with("light") {
                light(&writer, &args).await?
            } else {
                peak(&writer, &args).await?
            };
            writer.shutdown(Duration::from_secs(30)).await?;
            print_outcome(
                &Outcome {
                    scenario: name.to_owned(),
                    ..outcome
                },
                args.json,
            );
        }
        Ok(())
    }
}

fn print_outcome(outcome: &Outcome, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string(outcome).expect("outcomes encode")
        );
    } else {
        println!(
            "{:<26} {:>8} {:>8.2} {:>10.1} {:>9.2} {:>9.2} {:>9.2}",
            outcome.scenario,
            outcome.appends,
            outcome.seconds,
            outcome.throughput_mb_per_s,
            outcome.p50_ms,
            outcome.p99_ms,
            outcome.max_ms
        );
    }
}

/// A fresh log over in-memory replicas behind the latency store; replica 0
/// gets `slow_ms` instead when set.
async fn open_writer(args: &LogBenchArgs, slow_ms: Option<u64>) -> Result<Writer, LogError> {
    let replicas = (0..args.replicas)
        .map(|position| {
            let latency = match (position, slow_ms) {
                (0, Some(slow)) => slow,
                _ => args.latency_ms,
            };
            let memory = Arc::new(object_store::memory::InMemory::new());
            let store: DynBlobStore = Arc::new(ObjectStoreBlobs::new(
                memory,
                "",
                format!("memory://bench-{position}"),
            ));
            let profile = LatencyProfile::uniform(Latency::Fixed(Duration::from_millis(latency)));
            let delayed: DynBlobStore =
                Arc::new(LatencyStore::new(store, profile, position as u64));
            (format!("memory://bench-{position}"), delayed)
        })
        .collect::<Vec<_>>();
    let register = Arc::new(MemoryRegister::new());
    let identities = replicas
        .iter()
        .map(|(identity, _)| identity.clone())
        .collect();
    initialize(register.as_ref(), identities, 4)
        .await
        .map_err(|e| LogError::Transition(e.to_string()))?;
    let stores = LogStores { replicas, register };
    let recovery = Recovery::run(stores, LogConfig::default()).await?;
    let mut replay = recovery.replay(recovery.end())?;
    while replay.next().await?.is_some() {}
    recovery.start().await
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
    let mut outstanding = std::collections::VecDeque::new();
    let mut latencies = Vec::new();
    let started = Instant::now();
    while Instant::now() < deadline {
        match writer.append(record.clone()) {
            Ok(completion) => outstanding.push_back((Instant::now(), completion)),
            Err(LogError::Backpressure { .. } | LogError::ActiveSegmentFull { .. }) => {
                let (sent, oldest) = outstanding
                    .pop_front()
                    .expect("backpressure implies appends in flight");
                oldest.await?;
                latencies.push(sent.elapsed());
            }
            Err(error) => return Err(error),
        }
    }
    for (sent, completion) in outstanding {
        completion.await?;
        latencies.push(sent.elapsed());
    }
    Ok(summarize(latencies, started.elapsed(), args.record_bytes))
}

fn summarize(mut latencies: Vec<Duration>, elapsed: Duration, record_bytes: usize) -> Outcome {
    latencies.sort_unstable();
    let percentile = |p: f64| {
        let rank = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len());
        latencies[rank - 1].as_secs_f64() * 1000.0
    };
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
