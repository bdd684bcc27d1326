//! The write path's cost per 4 KiB record, end to end (issue 12's target:
//! at most 2 µs of CPU per record at peak): appends pipelined through a
//! `Writer` over three in-memory replicas with no injected latency, so the
//! stores wait for nothing and the process's own work bounds the rate. It
//! covers admission, fragment encoding, the lanes, the commit tracker
//! (per-lane ack prefixes, per-fragment quorum counts, in-order
//! completions), rotation and sealing, and the in-memory stores' own work.
//! The commit tracker is private to the pipeline task; profile this
//! benchmark (`perf record`) to see its share.
//!
//! One iteration fills one 16 MiB segment and waits until it is sealed and
//! folded, so every record's whole cost, seal included, falls inside the
//! iteration. (With appends running on, sealing lags behind them and the
//! seals of the last segments would fall outside the measurement.) Then
//! the replicas forget the sealed object, as a remote store's bytes leave
//! the writer's memory once written: kept, every segment's fragment buffers
//! would stay allocated to the end of the sample, and each new segment
//! would land on fresh pages for the kernel to clear, a cost of in-memory
//! replicas and not of the write path. Two clocks: the process's CPU time
//! (user + system, every thread), which is the target's measure, and wall
//! time, which here runs appends and seals one after the other and so
//! understates pipelined throughput.
//!
//! `cargo bench -p chorus --bench write_path`; under `cargo test` each runs once.

#[path = "../tests/support/log.rs"]
mod log_support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus::codec::FRAME_HEADER_BYTES;
use chorus::log::layout::sealed_key;
use chorus::log::{ErrorKind, LogConfig, Writer};
use chorus::register::Manifest;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use log_support::Cluster;

/// The allocator the `chorus` binary ships with: with the system allocator
/// every sealed segment's buffer is mapped fresh and page-faulted in.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RECORD_BYTES: usize = 4096;
/// Records per iteration (one segment): 16 MiB, within the default 64 MiB
/// in-flight budget.
const BATCH: u64 = 4096;
const REPLICAS: usize = 3;
const WINDOW: u32 = 8;

/// What an iteration's time is read from.
#[derive(Debug, Clone, Copy)]
enum Clock {
    Wall,
    /// User plus system time of the whole process.
    Cpu,
}

impl Clock {
    fn label(self) -> &'static str {
        match self {
            Clock::Wall => "wall",
            Clock::Cpu => "cpu",
        }
    }
}

/// User plus system CPU time of this process so far.
fn process_cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    let seconds = |time: libc::timeval| {
        Duration::from_secs(time.tv_sec as u64) + Duration::from_micros(time.tv_usec as u64)
    };
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

fn append_and_ack(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let mut group = c.benchmark_group("write_path");
    // A fresh log per sample keeps memory bounded (the in-memory replicas
    // keep every sealed segment): about a second of appends per sample.
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Bytes(BATCH * RECORD_BYTES as u64));
    for clock in [Clock::Wall, Clock::Cpu] {
        let id = BenchmarkId::new("append_ack_seal_4KiB_x4096", clock.label());
        group.bench_function(id, |b| {
            b.iter_custom(|batches| runtime.block_on(measure(batches, clock)))
        });
    }
    group.finish();
}

/// Fills and seals `segments` segments of a fresh log; the time they took
/// on `clock`.
async fn measure(segments: u64, clock: Clock) -> Duration {
    let cluster = Cluster::new(REPLICAS, WINDOW).await;
    let config = LogConfig {
        // Rotates right after each iteration's last record.
        max_segment_bytes: BATCH * (RECORD_BYTES + FRAME_HEADER_BYTES) as u64,
        // A repair pass reads every sealed copy: not part of the write path.
        repair_interval: None,
        ..LogConfig::default()
    };
    let (writer, _) = cluster.open(config).await.expect("the log opens");
    let record = Bytes::from(vec![0xa5; RECORD_BYTES]);
    let (wall, cpu) = (Instant::now(), process_cpu_time());
    for sealed in 1..=segments {
        append_batch(&writer, &record).await;
        let folded = loop {
            let manifest = cluster.manifest().await;
            if manifest.segments.len() as u64 >= sealed {
                break manifest;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        forget_newest_seal(&cluster, &folded).await;
    }
    let elapsed = match clock {
        Clock::Wall => wall.elapsed(),
        Clock::Cpu => process_cpu_time() - cpu,
    };
    writer
        .shutdown(Duration::from_secs(60))
        .await
        .expect("a clean shutdown");
    for replica in 0..REPLICAS {
        let kept = cluster.sealed_on(replica).await;
        assert!(kept.is_empty(), "sealed objects not forgotten: {kept:?}");
    }
    elapsed
}

/// Deletes the newest sealed object from every replica (behind the
/// writer's back: it never reads a sealed segment again, and repair is off).
async fn forget_newest_seal(cluster: &Cluster, manifest: &Manifest) {
    let newest = manifest.segments.last().expect("a sealed segment");
    let key = sealed_key(newest.id, newest.crc32c);
    for replica in &cluster.raw {
        replica
            .delete(&key)
            .await
            .expect("the sealed object is deleted");
    }
}

/// Appends [`BATCH`] copies of `record` and waits for every ack.
async fn append_batch(writer: &Writer, record: &Bytes) {
    let mut completions = Vec::with_capacity(BATCH as usize);
    let mut admitted = 0;
    while admitted < BATCH {
        match writer.append(record.clone()) {
            Ok(completion) => {
                completions.push(completion);
                admitted += 1;
            }
            // Refused for now (`Backpressure`): let what is in flight land,
            // then go on.
            Err(refused) if refused.kind() == ErrorKind::Retry => {
                for completion in completions.drain(..) {
                    completion.await.expect("acknowledged");
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err(refused) => panic!("append refused: {refused}"),
        }
    }
    for completion in completions {
        completion.await.expect("acknowledged");
    }
}

criterion_group!(benches, append_and_ack);
criterion_main!(benches);
