//! `chorus bench watch`: how long an event takes from its write's
//! acknowledgement to each watcher, over etcd's gRPC API.
//!
//! `--watchers` clients each open their own connection and one Watch stream
//! on the benchmark's prefix (so every watcher sees every event), then puts
//! are offered open loop at `--rate` per second, spread over
//! `--put-connections` connections, for `--seconds`. A put's
//! acknowledgement (its response, carrying the revision) is the reference
//! point: the delivery latency of an event at a watcher is its arrival
//! there minus the acknowledgement of its put. The watch is woken when the
//! record is applied, which is before the put's response is sent, so an
//! event may arrive before its acknowledgement; it counts as 0 and is
//! counted in `early`. Every instant is taken in this process.
//!
//! Without `--endpoint` it starts Chorus's etcd API in this process, on
//! three in-memory replicas behind the latency store (`--latency-ms`) and
//! on the embedded default (three local directories, fsync'd) in a
//! temporary directory. With `--endpoint` it drives any etcd v3 endpoint (a
//! `chorus serve`, or a real etcd). The load generator shares the machine
//! (and, without `--endpoint`, this process's runtime) with the service.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_etcd::proto::etcdserverpb::kv_client::KvClient;
use chorus_etcd::proto::etcdserverpb::watch_client::WatchClient;
use chorus_etcd::proto::etcdserverpb::watch_request::RequestUnion;
use chorus_etcd::proto::etcdserverpb::{
    PutRequest, WatchCreateRequest, WatchRequest, WatchResponse,
};
use futures::StreamExt;
use serde::Serialize;
use tokio::sync::{Semaphore, mpsc, watch};

use super::grpc::{
    CONNECT_TIMEOUT, connect, micros_since, percentile_ms, prefix_end, start_target,
};
use super::kv::Target;
use crate::CommandError;
use crate::output::outln;

/// The prefix every put writes under and every watcher watches.
const PREFIX: &str = "bench/watch/";
/// How long the watchers may take, after the last put was acknowledged,
/// to receive every event before the missing ones are counted.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Arguments of `bench watch`.
#[derive(Debug, Clone, clap::Args)]
pub struct WatchBenchArgs {
    /// Drive the etcd v3 API at this URL (a `chorus serve`, a real etcd)
    /// instead of starting Chorus here.
    #[arg(long)]
    endpoint: Option<String>,
    /// Replicas of the in-memory target (1, 3 or 5).
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Latency injected into every replica request of the in-memory target.
    #[arg(long, default_value_t = 10)]
    latency_ms: u64,
    /// Watchers, each on its own connection and stream, each watching every
    /// key written [default: 100; --quick: 10].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    watchers: Option<u64>,
    /// Puts offered per second, open loop: each is one event
    /// [default: 10000; --quick: 1000].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    rate: Option<u64>,
    /// How long the puts are offered, in seconds [default: 10; --quick: 2].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=3600))]
    seconds: Option<u64>,
    /// Size of each value in bytes.
    #[arg(long, default_value_t = 256)]
    value_bytes: usize,
    /// Keys written, in turn (8-byte names after the prefix).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// Connections the puts are spread over.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1024))]
    put_connections: u64,
    /// Puts in flight at most; while this many wait for their answers the
    /// offered schedule slips (the row's rate shows it).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    max_in_flight: u64,
    /// Which targets to start here (without `--endpoint`).
    #[arg(long, value_enum, default_values_t = [Target::Memory, Target::Embedded])]
    target: Vec<Target>,
    /// Smaller defaults: a run of seconds.
    #[arg(long)]
    quick: bool,
    /// Print one JSON object per row instead of a table.
    #[arg(long)]
    json: bool,
}

/// The load of one row, with `--quick`'s defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Load {
    watchers: usize,
    rate: u64,
    duration: Duration,
}

impl WatchBenchArgs {
    fn load(&self) -> Load {
        let (watchers, rate, seconds) = if self.quick {
            (10, 1_000, 2)
        } else {
            (100, 10_000, 10)
        };
        Load {
            watchers: usize::try_from(self.watchers.unwrap_or(watchers)).unwrap_or(usize::MAX),
            rate: self.rate.unwrap_or(rate),
            duration: Duration::from_secs(self.seconds.unwrap_or(seconds)),
        }
    }
}

/// One row of results (the fields issue-34-style rows share first).
#[derive(Debug, Serialize)]
pub(super) struct Row {
    pub(super) system: String,
    pub(super) workload: &'static str,
    /// Watchers.
    pub(super) clients: usize,
    pub(super) offered_per_second: u64,
    /// Puts acknowledged per second: events written.
    pub(super) per_second: f64,
    /// Events received by all watchers together, per second.
    pub(super) deliveries_per_second: f64,
    pub(super) deliveries: u64,
    /// Puts acknowledged.
    pub(super) puts: u64,
    /// Deliveries owed (acknowledged puts × watchers) never received.
    pub(super) missing: u64,
    /// Puts that failed.
    pub(super) errors: u64,
    /// Deliveries that arrived before their put's acknowledgement.
    pub(super) early: u64,
    /// Delivery after the acknowledgement.
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
    pub(super) max_ms: f64,
    /// The puts' own latency, sent to acknowledged.
    pub(super) put_p50_ms: f64,
    pub(super) put_p99_ms: f64,
}

/// Runs the benchmark.
pub async fn run(args: WatchBenchArgs) -> Result<(), CommandError> {
    let load = args.load();
    if !args.json {
        outln!(
            "{:<22} {:>8} {:>9} {:>9} {:>12} {:>8} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "system",
            "watchers",
            "offered/s",
            "events/s",
            "deliveries/s",
            "missing",
            "errors",
            "p50 ms",
            "p99 ms",
            "max ms",
            "put p50",
            "put p99"
        )?;
    }
    if let Some(endpoint) = &args.endpoint {
        let row = measure(std::slice::from_ref(endpoint), endpoint, &args, load).await?;
        return print(&row, args.json);
    }
    for target in &args.target {
        let (system, service) =
            start_target(*target, args.replicas, args.latency_ms, false, "watch").await?;
        let row = measure(&[service.url().to_owned()], &system, &args, load).await;
        if let Ok(row) = &row {
            print(row, args.json)?;
        }
        service.stop().await?;
        row?;
    }
    Ok(())
}

/// One watch cell of `bench etcd` against `urls`: watchers and put
/// connections spread over them in turn, with this benchmark's defaults
/// (`--quick`'s when `quick`).
pub(super) async fn measure_cell(
    urls: &[String],
    system: &str,
    quick: bool,
) -> Result<Row, CommandError> {
    let args = WatchBenchArgs {
        endpoint: None,
        replicas: 3,
        latency_ms: 10,
        watchers: None,
        rate: None,
        seconds: None,
        value_bytes: 256,
        keys: 1000,
        put_connections: 16,
        max_in_flight: 4096,
        target: Vec::new(),
        quick,
        json: true,
    };
    measure(urls, system, &args, args.load()).await
}

fn print(row: &Row, json: bool) -> Result<(), CommandError> {
    if json {
        return outln!("{}", serde_json::to_string(row).expect("rows encode"));
    }
    outln!(
        "{:<22} {:>8} {:>9} {:>9.0} {:>12.0} {:>8} {:>6} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
        row.system,
        row.clients,
        row.offered_per_second,
        row.per_second,
        row.deliveries_per_second,
        row.missing,
        row.errors,
        row.p50_ms,
        row.p99_ms,
        row.max_ms,
        row.put_p50_ms,
        row.put_p99_ms
    )
}

/// What one put gave: its revision (`None`: it failed), when it was sent
/// and acknowledged, in microseconds since the benchmark's epoch.
struct Ack {
    revision: Option<i64>,
    sent_us: u32,
    acked_us: u32,
}

/// One row against the etcd API at `urls`, the watchers and the put
/// connections spread over them in turn.
async fn measure(
    urls: &[String],
    system: &str,
    args: &WatchBenchArgs,
    load: Load,
) -> Result<Row, CommandError> {
    let epoch = Instant::now();
    eprintln!("{system}: opening {} watchers …", load.watchers);
    let (last_revision, published) = watch::channel(i64::MAX);
    let mut watchers = Vec::with_capacity(load.watchers);
    for url in urls.iter().cycle().take(load.watchers) {
        let stream = open_watch(url).await?;
        watchers.push(tokio::spawn(receive(stream, epoch, published.clone())));
    }
    eprintln!(
        "{system}: {} puts/s for {} s …",
        load.rate,
        load.duration.as_secs()
    );
    let started = Instant::now();
    let acks = offer_puts(urls, args, load, epoch).await?;
    let elapsed = started.elapsed();
    let last = acks
        .iter()
        .filter_map(|ack| ack.revision)
        .max()
        .unwrap_or(0);
    last_revision.send_replace(last);
    let mut arrivals = Vec::with_capacity(watchers.len());
    for watcher in watchers {
        arrivals.push(watcher.await??);
    }
    Ok(summarize(system, load, &acks, &arrivals, elapsed))
}

/// A new connection and a watch of [`PREFIX`] on it, its create answered.
async fn open_watch(url: &str) -> Result<tonic::Streaming<WatchResponse>, CommandError> {
    let mut client = WatchClient::new(connect(url).await?);
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: Bytes::from_static(PREFIX.as_bytes()),
            range_end: prefix_end(PREFIX.as_bytes()),
            ..WatchCreateRequest::default()
        })),
    };
    // The request side stays open: a closed one would end the stream on
    // servers that treat it so.
    let requests = futures::stream::iter([create]).chain(futures::stream::pending());
    let mut stream = client.watch(requests).await?.into_inner();
    let created = tokio::time::timeout(CONNECT_TIMEOUT, stream.message())
        .await
        .map_err(|_| "a watch's create was not answered within 30 s")??
        .ok_or("the watch stream ended before its create was answered")?;
    if !created.created || created.canceled {
        return Err(format!("the watch was refused: {}", created.cancel_reason).into());
    }
    Ok(stream)
}

/// Reads events until one at or past the last acknowledged revision
/// arrived (or [`DRAIN_TIMEOUT`] after it was published): each event's
/// revision and arrival, in microseconds since `epoch`.
async fn receive(
    mut stream: tonic::Streaming<WatchResponse>,
    epoch: Instant,
    mut last_revision: watch::Receiver<i64>,
) -> Result<Vec<(i64, u32)>, CommandError> {
    let mut arrivals = Vec::new();
    let mut highest = 0;
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        if highest >= *last_revision.borrow() {
            return Ok(arrivals);
        }
        let until = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            message = stream.message() => {
                let Some(response) = message? else {
                    return Err("a watch stream ended during the benchmark".into());
                };
                let arrived = micros_since(epoch);
                for event in &response.events {
                    let revision = event.kv.as_ref().map_or(0, |kv| kv.mod_revision);
                    highest = highest.max(revision);
                    arrivals.push((revision, arrived));
                }
                if response.canceled {
                    return Err(format!("a watch was canceled: {}", response.cancel_reason).into());
                }
            }
            changed = last_revision.changed(), if deadline.is_none() => {
                if changed.is_ok() {
                    deadline = Some(tokio::time::Instant::now() + DRAIN_TIMEOUT);
                }
            }
            () = until => return Ok(arrivals),
        }
    }
}

/// Offers `load.rate` puts per second for `load.duration`, open loop, and
/// waits for every answer.
async fn offer_puts(
    urls: &[String],
    args: &WatchBenchArgs,
    load: Load,
    epoch: Instant,
) -> Result<Vec<Ack>, CommandError> {
    let mut clients = Vec::new();
    for url in urls.iter().cycle().take(args.put_connections as usize) {
        clients.push(KvClient::new(connect(url).await?));
    }
    let value = Bytes::from(vec![b'v'; args.value_bytes]);
    let in_flight = Arc::new(Semaphore::new(
        usize::try_from(args.max_in_flight).unwrap_or(usize::MAX),
    ));
    let (done, mut answers) = mpsc::unbounded_channel();
    let total = load.rate * load.duration.as_secs();
    let interval = Duration::from_secs(1).div_f64(load.rate as f64);
    let started = tokio::time::Instant::now();
    for n in 0..total {
        tokio::time::sleep_until(started + interval.mul_f64(n as f64)).await;
        let permit = Arc::clone(&in_flight).acquire_owned().await?;
        let mut client = clients[(n % args.put_connections) as usize].clone();
        let request = PutRequest {
            key: Bytes::from(format!("{PREFIX}{:08}", n % args.keys)),
            value: value.clone(),
            ..PutRequest::default()
        };
        let done = done.clone();
        tokio::spawn(async move {
            let sent_us = micros_since(epoch);
            let answer = client.put(request).await;
            let acked_us = micros_since(epoch);
            drop(permit);
            let revision = answer
                .ok()
                .and_then(|answer| answer.into_inner().header.map(|header| header.revision));
            let _ = done.send(Ack {
                revision,
                sent_us,
                acked_us,
            });
        });
    }
    drop(done);
    let mut acks = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    while let Some(ack) = answers.recv().await {
        acks.push(ack);
    }
    Ok(acks)
}

/// The row: each arrival against its put's acknowledgement.
fn summarize(
    system: &str,
    load: Load,
    acks: &[Ack],
    arrivals: &[Vec<(i64, u32)>],
    elapsed: Duration,
) -> Row {
    let acked: HashMap<i64, u32> = acks
        .iter()
        .filter_map(|ack| Some((ack.revision?, ack.acked_us)))
        .collect();
    let mut put_us: Vec<u32> = acks
        .iter()
        .filter(|ack| ack.revision.is_some())
        .map(|ack| ack.acked_us.saturating_sub(ack.sent_us))
        .collect();
    let mut delivery_us = Vec::new();
    let mut early = 0;
    for (revision, arrived) in arrivals.iter().flatten() {
        let Some(ack) = acked.get(revision) else {
            continue;
        };
        if arrived < ack {
            early += 1;
        }
        delivery_us.push(arrived.saturating_sub(*ack));
    }
    put_us.sort_unstable();
    delivery_us.sort_unstable();
    let owed = acked.len() as u64 * arrivals.len() as u64;
    let delivered = delivery_us.len() as u64;
    let seconds = elapsed.as_secs_f64();
    Row {
        system: system.to_owned(),
        workload: "watch",
        clients: load.watchers,
        offered_per_second: load.rate,
        per_second: acked.len() as f64 / seconds,
        deliveries_per_second: delivered as f64 / seconds,
        deliveries: delivered,
        puts: acked.len() as u64,
        missing: owed.saturating_sub(delivered),
        errors: (acks.len() - acked.len()) as u64,
        early,
        p50_ms: percentile_ms(&delivery_us, 0.50),
        p99_ms: percentile_ms(&delivery_us, 0.99),
        max_ms: percentile_ms(&delivery_us, 1.0),
        put_p50_ms: percentile_ms(&put_us, 0.50),
        put_p99_ms: percentile_ms(&put_us, 0.99),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(revision: Option<i64>, sent_us: u32, acked_us: u32) -> Ack {
        Ack {
            revision,
            sent_us,
            acked_us,
        }
    }

    #[test]
    fn deliveries_are_measured_from_their_puts_acknowledgement() {
        let load = Load {
            watchers: 2,
            rate: 3,
            duration: Duration::from_secs(1),
        };
        let acks = [
            ack(Some(5), 0, 1_000),
            ack(Some(6), 0, 2_000),
            ack(None, 0, 3_000),
        ];
        // Watcher 1 got 5 early and 6 4 ms late; watcher 2 only 5, 2 ms late;
        // an event of another writer (revision 9) is not counted.
        let arrivals = [vec![(5, 500), (6, 6_000)], vec![(5, 3_000), (9, 9_000)]];
        let row = summarize("s", load, &acks, &arrivals, Duration::from_secs(2));
        assert_eq!(row.deliveries, 3);
        assert_eq!(row.missing, 1);
        assert_eq!(row.errors, 1);
        assert_eq!(row.early, 1);
        assert_eq!(row.per_second, 1.0);
        assert_eq!((row.p50_ms, row.max_ms), (2.0, 4.0));
        assert_eq!((row.put_p50_ms, row.put_p99_ms), (1.0, 2.0));
    }

    #[test]
    fn quick_shrinks_the_defaults_and_explicit_flags_win() {
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: WatchBenchArgs,
        }
        let parse = |flags: &[&str]| {
            <Wrapper as clap::Parser>::try_parse_from(
                std::iter::once("bench").chain(flags.iter().copied()),
            )
            .unwrap()
            .args
            .load()
        };
        assert_eq!(
            parse(&[]),
            Load {
                watchers: 100,
                rate: 10_000,
                duration: Duration::from_secs(10)
            }
        );
        assert_eq!(parse(&["--quick"]).watchers, 10);
        assert_eq!(parse(&["--quick", "--rate", "50"]).rate, 50);
    }
}
