//! `chorus bench recovery`: how long opening a log takes against its length,
//! and how fast it replays.
//!
//! Each *cell* is a log of some sealed segments plus an active segment of
//! fragments, as a writer that stopped without sealing leaves it. The log is
//! built once per cell with no injected latency (the writer at full speed),
//! then each repetition measures a fresh copy of it (`InMemory::fork`, so
//! every repetition recovers the same state) behind the latency store:
//!
//! - *reader open*: `Reader::floor_beyond_end` (the check every open makes)
//!   and a `Reader` from the floor up to its first record, as `chorus log
//!   read` opens; then the reader goes on to the end (*read MB/s*);
//! - *recovery*: `Recovery::run` (claim, fence, seal the active segment,
//!   commit the view);
//! - *replay MB/s*: `Recovery::replay` of the whole log from the floor;
//! - *start*: `Recovery::start`.
//!
//! *Open* is recovery plus start. It leaves the replay out: a runtime replays
//! from its snapshot, so the replay's length is what was written since the
//! last snapshot, not the log's. Open must not grow with the number of sealed
//! segments (issue 12: open at 100 sealed ≤ 1.5× open at 1); the `×` column
//! is each cell's open over the open of the cell with the same active size
//! and the fewest sealed segments, min over min and median over median.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus::ids::RecordIndex;
use chorus::log::{LogConfig, LogError, LogStores, Reader, Recovery};
use chorus::register::{ManifestStore, MemoryRegister};
use object_store::memory::InMemory;
use serde::Serialize;

use super::{append_at_peak, blobs_over, delayed, new_log, replica_identity, start_writer};
use crate::output::outln;
use crate::{CommandError, UsageError};
use chorus::register::DEFAULT_WINDOW;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// The active segment limit while building a cell's active segment: it must
/// not rotate, however large the requested size.
const BUILD_ACTIVE_LIMIT: u64 = GIB;

/// How long the shutdown of a builder or a measured writer may take.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(60);

/// Arguments of `bench recovery`.
#[derive(Debug, Clone, clap::Args)]
pub struct RecoveryBenchArgs {
    /// Replicas (1, 3 or 5).
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Latency injected into every replica request while measuring, in
    /// milliseconds (building the logs runs without it).
    #[arg(long, default_value_t = 10)]
    latency_ms: u64,
    /// Fragments in flight per replica (the log's window); recovery fences
    /// this many positions per segment.
    #[arg(long, default_value_t = DEFAULT_WINDOW)]
    window: u32,
    /// Size of each record in bytes.
    #[arg(long, default_value_t = 4096)]
    record_bytes: usize,
    /// Sealed segment counts, comma-separated [default: 1,10,100].
    #[arg(long, value_delimiter = ',')]
    sealed: Option<Vec<usize>>,
    /// Active segment sizes, comma-separated, in bytes or with a KiB, MiB or
    /// GiB suffix [default: 0,1MiB,16MiB,64MiB; --quick: 0,1MiB].
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    active: Option<Vec<u64>>,
    /// Size of each sealed segment of those cells [default: 1MiB; --quick: 64KiB].
    #[arg(long, value_parser = parse_size)]
    segment: Option<u64>,
    /// Sealed segments of the default segment size (64 MiB) in one more cell,
    /// for replay throughput at full-size segments; 0 for none [default: 4;
    /// --quick: 1].
    #[arg(long)]
    replay_segments: Option<usize>,
    /// Measurements per cell.
    #[arg(long, default_value_t = 3)]
    repetitions: usize,
    /// Smaller defaults, to finish in under a minute.
    #[arg(long)]
    quick: bool,
    /// Print one JSON object per cell instead of a table.
    #[arg(long)]
    json: bool,
}

/// One log shape to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cell {
    sealed: usize,
    segment_bytes: u64,
    active_bytes: u64,
}

/// The cells `args` asks for: every sealed count (ascending, so each group
/// starts with its baseline) for each active size, then the replay cell.
fn plan(args: &RecoveryBenchArgs) -> Result<Vec<Cell>, UsageError> {
    if ![1, 3, 5].contains(&args.replicas) {
        return Err(UsageError("--replicas must be 1, 3 or 5".into()));
    }
    if args.repetitions == 0 {
        return Err(UsageError("--repetitions must be positive".into()));
    }
    if args.record_bytes == 0 || args.record_bytes as u64 > LogConfig::default().max_record_bytes {
        return Err(UsageError(format!(
            "--record-bytes must be between 1 and {}",
            LogConfig::default().max_record_bytes
        )));
    }
    let mut sealed = args.sealed.clone().unwrap_or_else(|| vec![1, 10, 100]);
    sealed.sort_unstable();
    sealed.dedup();
    let active = args.active.clone().unwrap_or_else(|| {
        if args.quick {
            vec![0, MIB]
        } else {
            vec![0, MIB, 16 * MIB, 64 * MIB]
        }
    });
    if let Some(too_large) = active
        .iter()
        .find(|bytes| **bytes >= BUILD_ACTIVE_LIMIT / 2)
    {
        return Err(UsageError(format!(
            "--active {too_large} is too large: at most {} bytes",
            BUILD_ACTIVE_LIMIT / 2 - 1
        )));
    }
    let segment_bytes = args
        .segment
        .unwrap_or(if args.quick { 64 * KIB } else { MIB });
    if segment_bytes == 0 {
        return Err(UsageError("--segment must be positive".into()));
    }
    let replay_segments = args
        .replay_segments
        .unwrap_or(if args.quick { 1 } else { 4 });
    let mut cells: Vec<Cell> = active
        .iter()
        .flat_map(|active_bytes| {
            sealed.iter().map(move |sealed| Cell {
                sealed: *sealed,
                segment_bytes,
                active_bytes: *active_bytes,
            })
        })
        .collect();
    if replay_segments > 0 {
        cells.push(Cell {
            sealed: replay_segments,
            segment_bytes: LogConfig::default().max_segment_bytes,
            active_bytes: 0,
        });
    }
    Ok(cells)
}

/// Parses a byte size: a number, optionally followed by `KiB`, `MiB` or `GiB`.
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size such as 4096, 64KiB or 16MiB"))?;
    let unit = match unit.trim() {
        "" => 1,
        "KiB" => KIB,
        "MiB" => MIB,
        "GiB" => GIB,
        other => return Err(format!("unknown unit {other:?}: use KiB, MiB or GiB")),
    };
    number
        .checked_mul(unit)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// The smallest, middle and largest of several measurements.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(super) struct Spread {
    /// The smallest.
    pub(super) min: f64,
    /// The middle one (the mean of the middle two of an even count).
    pub(super) median: f64,
    /// The largest.
    pub(super) max: f64,
}

impl Spread {
    /// The spread of `values` (not empty); an even count's median is the
    /// mean of the middle two.
    pub(super) fn of(values: &[f64]) -> Spread {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let middle = sorted.len() / 2;
        let median = if sorted.len().is_multiple_of(2) {
            (sorted[middle - 1] + sorted[middle]) / 2.0
        } else {
            sorted[middle]
        };
        Spread {
            min: sorted[0],
            median,
            max: sorted[sorted.len() - 1],
        }
    }
}

/// One repetition's measurements of one cell.
#[derive(Debug, Clone, Copy)]
struct Sample {
    reader_open: Duration,
    read: Duration,
    recovery: Duration,
    replay: Duration,
    start: Duration,
}

/// One cell's results.
#[derive(Debug, Serialize)]
struct Row {
    sealed_segments: usize,
    segment_bytes: u64,
    active_bytes: u64,
    /// Record payload bytes in the log.
    log_bytes: u64,
    repetitions: usize,
    open_ms: Spread,
    recovery_ms: Spread,
    start_ms: Spread,
    reader_open_ms: Spread,
    replay_mb_per_s: Spread,
    read_mb_per_s: Spread,
    /// Open over the open of the cell with the same active size and segment
    /// size and the fewest sealed segments: min over min, and median over
    /// median. The min is the steadier on a busy machine.
    open_vs_fewest_sealed: Ratio,
}

/// Summarizes `samples` of `cell`, whose log holds `log_bytes`.
fn summarize(cell: Cell, log_bytes: u64, samples: &[Sample]) -> Row {
    let spread =
        |value: &dyn Fn(&Sample) -> f64| Spread::of(&samples.iter().map(value).collect::<Vec<_>>());
    let ms = |duration: Duration| duration.as_secs_f64() * 1000.0;
    let mb_per_s = |duration: Duration| log_bytes as f64 / duration.as_secs_f64() / 1e6;
    Row {
        sealed_segments: cell.sealed,
        segment_bytes: cell.segment_bytes,
        active_bytes: cell.active_bytes,
        log_bytes,
        repetitions: samples.len(),
        open_ms: spread(&|s| ms(s.recovery + s.start)),
        recovery_ms: spread(&|s| ms(s.recovery)),
        start_ms: spread(&|s| ms(s.start)),
        reader_open_ms: spread(&|s| ms(s.reader_open)),
        replay_mb_per_s: spread(&|s| mb_per_s(s.replay)),
        read_mb_per_s: spread(&|s| mb_per_s(s.read)),
        open_vs_fewest_sealed: Ratio {
            min: 1.0,
            median: 1.0,
        },
    }
}

/// One cell's open time relative to another's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
struct Ratio {
    min: f64,
    median: f64,
}

/// The open time of the first (fewest sealed) cell of each group of cells
/// with the same active and segment sizes.
#[derive(Debug, Default)]
struct Baselines(HashMap<(u64, u64), Spread>);

impl Baselines {
    /// Sets `row`'s ratios to its group's baseline, which `row` becomes if
    /// it is the group's first.
    fn compare(&mut self, row: &mut Row) {
        let baseline = *self
            .0
            .entry((row.active_bytes, row.segment_bytes))
            .or_insert(row.open_ms);
        row.open_vs_fewest_sealed = Ratio {
            min: row.open_ms.min / baseline.min,
            median: row.open_ms.median / baseline.median,
        };
    }
}

/// Runs the benchmark.
pub async fn run(args: RecoveryBenchArgs) -> Result<(), CommandError> {
    let cells = plan(&args)?;
    if !args.json {
        print_header()?;
    }
    let mut baselines = Baselines::default();
    for (number, cell) in cells.iter().enumerate() {
        let label = format!(
            "cell {}/{}: {} sealed × {} + {} active",
            number + 1,
            cells.len(),
            cell.sealed,
            size_label(cell.segment_bytes),
            size_label(cell.active_bytes)
        );
        eprintln!("{label}: building …");
        let built = Built::new(*cell, &args).await?;
        let mut samples = Vec::with_capacity(args.repetitions);
        for repetition in 1..=args.repetitions {
            eprintln!("{label}: repetition {repetition}/{} …", args.repetitions);
            samples.push(built.measure(&args).await?);
        }
        let mut row = summarize(*cell, built.log_bytes, &samples);
        baselines.compare(&mut row);
        print_row(&row, args.json)?;
    }
    Ok(())
}

/// A cell's log, built without latency, to be copied for each measurement.
struct Built {
    memories: Vec<Arc<InMemory>>,
    register: Arc<dyn ManifestStore>,
    log_bytes: u64,
    /// The segment size it was written with, which recovery is configured
    /// with too (replay reads ahead by it), as a deployment's would be.
    segment_bytes: u64,
}

impl Built {
    /// Builds `cell`'s log: `cell.sealed` segments of `cell.segment_bytes`,
    /// each written and folded before the next begins (so the count is
    /// exact), then a writer with rotation out of reach appends the active
    /// segment and stops without sealing it.
    async fn new(cell: Cell, args: &RecoveryBenchArgs) -> Result<Built, CommandError> {
        let memories: Vec<Arc<InMemory>> = (0..args.replicas)
            .map(|_| Arc::new(InMemory::new()))
            .collect();
        let replicas = memories
            .iter()
            .enumerate()
            .map(|(position, memory)| {
                let identity = replica_identity(position);
                let store = blobs_over(Arc::clone(memory), &identity);
                (identity, store)
            })
            .collect();
        let stores = new_log(replicas, args.window).await?;
        let record = Bytes::from(vec![0x3c; args.record_bytes]);
        let sealing = LogConfig {
            max_segment_bytes: cell.segment_bytes,
            repair_interval: None,
            ..LogConfig::default()
        };
        let writer = start_writer(&stores, sealing).await?;
        let per_segment = records_per_segment(cell.segment_bytes, args.record_bytes);
        for folded in 1..=cell.sealed {
            append_at_peak(&writer, &record, per_segment).await?;
            wait_for_directory(&stores, folded).await?;
        }
        writer.shutdown(SHUTDOWN_TIMEOUT).await?;
        let appending = LogConfig {
            max_segment_bytes: BUILD_ACTIVE_LIMIT,
            max_active_segment_bytes: BUILD_ACTIVE_LIMIT,
            repair_interval: None,
            ..LogConfig::default()
        };
        let writer = start_writer(&stores, appending).await?;
        let active_records = cell.active_bytes.div_ceil(args.record_bytes as u64);
        append_at_peak(&writer, &record, active_records).await?;
        writer.shutdown(SHUTDOWN_TIMEOUT).await?;
        let records = cell.sealed as u64 * per_segment + active_records;
        Ok(Built {
            memories,
            register: stores.register,
            log_bytes: records * args.record_bytes as u64,
            segment_bytes: cell.segment_bytes,
        })
    }

    /// A private copy of the log behind the latency store.
    async fn fork(&self, latency_ms: u64) -> Result<LogStores, CommandError> {
        let replicas = self
            .memories
            .iter()
            .enumerate()
            .map(|(position, memory)| {
                let identity = replica_identity(position);
                let copy = blobs_over(Arc::new(memory.fork()), &identity);
                (identity, delayed(copy, latency_ms))
            })
            .collect();
        let register = Arc::new(MemoryRegister::new());
        let current = self
            .register
            .read()
            .await?
            .ok_or("the built log has no register")?;
        register.create(&current.fields).await?;
        Ok(LogStores { replicas, register })
    }

    /// One repetition on a fresh copy: the reader first (it sees the active
    /// segment as the writer left it), then recovery, replay and start.
    async fn measure(&self, args: &RecoveryBenchArgs) -> Result<Sample, CommandError> {
        let stores = self.fork(args.latency_ms).await?;
        let started = Instant::now();
        if let Some(end) = Reader::floor_beyond_end(&stores).await? {
            return Err(format!("the built log's floor is beyond its end {end}").into());
        }
        let mut reader = Reader::new(&stores, RecordIndex(0));
        let mut read_bytes = 0;
        let mut reader_open = None;
        while let Some((_, record)) = reader.try_next().await? {
            reader_open.get_or_insert_with(|| started.elapsed());
            read_bytes += record.len() as u64;
        }
        let read = started.elapsed();
        self.check_length("reader", read_bytes)?;

        let started = Instant::now();
        let config = LogConfig {
            max_segment_bytes: self.segment_bytes,
            ..LogConfig::default()
        };
        let recovery = Recovery::run(stores, config).await?;
        let recovered = started.elapsed();
        let started = Instant::now();
        let replayed_bytes = replay_all(&recovery).await?;
        let replay = started.elapsed();
        self.check_length("replay", replayed_bytes)?;
        let started = Instant::now();
        let writer = recovery.start().await?;
        let start = started.elapsed();
        // Ends the start-up repair pass too, before the next repetition.
        writer.shutdown(SHUTDOWN_TIMEOUT).await?;
        Ok(Sample {
            reader_open: reader_open.unwrap_or(read),
            read,
            recovery: recovered,
            replay,
            start,
        })
    }

    fn check_length(&self, what: &str, bytes: u64) -> Result<(), CommandError> {
        if bytes != self.log_bytes {
            return Err(format!(
                "the {what} returned {bytes} bytes of a log of {} bytes",
                self.log_bytes
            )
            .into());
        }
        Ok(())
    }
}

/// Records of `record_bytes` that fill a segment of `segment_bytes` framed
/// bytes (each record plus its 4-byte length prefix), at which it rotates.
fn records_per_segment(segment_bytes: u64, record_bytes: usize) -> u64 {
    let framed = record_bytes as u64 + chorus::codec::FRAME_HEADER_BYTES as u64;
    segment_bytes.div_ceil(framed)
}

/// Waits until the register's directory holds `entries` sealed segments:
/// the fold of the segment just filled landed.
async fn wait_for_directory(stores: &LogStores, entries: usize) -> Result<(), CommandError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let current = stores
            .register
            .read()
            .await?
            .ok_or("the register vanished")?;
        let manifest = chorus::register::Manifest::from_fields(&current.fields)?;
        if manifest.segments.len() >= entries {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "segment {entries} was not sealed within 60 s ({} sealed)",
                manifest.segments.len()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Replays the whole recovered log; returns the record bytes read.
async fn replay_all(recovery: &Recovery) -> Result<u64, LogError> {
    let mut replay = recovery.replay(recovery.floor())?;
    let mut bytes = 0;
    while let Some((_, record)) = replay.next().await? {
        bytes += record.len() as u64;
    }
    Ok(bytes)
}

/// `bytes` in the largest binary unit that divides it, as `--active` takes it.
fn size_label(bytes: u64) -> String {
    match bytes {
        0 => "0".to_owned(),
        _ if bytes.is_multiple_of(GIB) => format!("{}GiB", bytes / GIB),
        _ if bytes.is_multiple_of(MIB) => format!("{}MiB", bytes / MIB),
        _ if bytes.is_multiple_of(KIB) => format!("{}KiB", bytes / KIB),
        _ => bytes.to_string(),
    }
}

fn print_header() -> Result<(), CommandError> {
    outln!(
        "{:>6} {:>8} {:>7} {:>9} {:>15} {:>9} {:>8} {:>15} {:>15} {:>15} {:>9}",
        "sealed",
        "segment",
        "active",
        "log MiB",
        "open ms min/med",
        "recov med",
        "start med",
        "reader min/med",
        "replay med/max",
        "read med/max",
        "× min/med"
    )
}

fn print_row(row: &Row, json: bool) -> Result<(), CommandError> {
    if json {
        return outln!("{}", serde_json::to_string(row).expect("rows encode"));
    }
    let pair = |low: f64, high: f64| format!("{low:.1}/{high:.1}");
    outln!(
        "{:>6} {:>8} {:>7} {:>9.1} {:>15} {:>9.1} {:>9.2} {:>15} {:>15} {:>15} {:>9}",
        row.sealed_segments,
        size_label(row.segment_bytes),
        size_label(row.active_bytes),
        row.log_bytes as f64 / MIB as f64,
        pair(row.open_ms.min, row.open_ms.median),
        row.recovery_ms.median,
        row.start_ms.median,
        pair(row.reader_open_ms.min, row.reader_open_ms.median),
        pair(row.replay_mb_per_s.median, row.replay_mb_per_s.max),
        pair(row.read_mb_per_s.median, row.read_mb_per_s.max),
        format!(
            "{:.2}/{:.2}",
            row.open_vs_fewest_sealed.min, row.open_vs_fewest_sealed.median
        )
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Command {
        #[command(flatten)]
        args: RecoveryBenchArgs,
    }

    fn args(flags: &[&str]) -> RecoveryBenchArgs {
        Command::try_parse_from(std::iter::once("recovery").chain(flags.iter().copied()))
            .expect("flags parse")
            .args
    }

    fn cell(sealed: usize, segment_bytes: u64, active_bytes: u64) -> Cell {
        Cell {
            sealed,
            segment_bytes,
            active_bytes,
        }
    }

    #[test]
    fn the_default_plan_is_every_sealed_count_per_active_size_then_the_replay_cell() {
        let cells = plan(&args(&[])).unwrap();
        let mut expected = Vec::new();
        for active in [0, MIB, 16 * MIB, 64 * MIB] {
            for sealed in [1, 10, 100] {
                expected.push(cell(sealed, MIB, active));
            }
        }
        expected.push(cell(4, 64 * MIB, 0));
        assert_eq!(cells, expected);
    }

    #[test]
    fn quick_shrinks_the_defaults_and_explicit_flags_win() {
        let quick = plan(&args(&["--quick"])).unwrap();
        assert_eq!(quick.len(), 7, "{quick:?}");
        assert_eq!(quick[0], cell(1, 64 * KIB, 0));
        assert_eq!(quick[5], cell(100, 64 * KIB, MIB));
        assert_eq!(quick[6], cell(1, 64 * MIB, 0));

        let explicit = plan(&args(&[
            "--quick",
            "--sealed",
            "5,0,5",
            "--active",
            "16KiB",
            "--segment",
            "4096",
            "--replay-segments",
            "0",
        ]))
        .unwrap();
        // Sorted and deduplicated: the group's first cell is its baseline.
        assert_eq!(explicit, [cell(0, 4096, 16 * KIB), cell(5, 4096, 16 * KIB)]);
    }

    #[test]
    fn impossible_plans_are_usage_errors() {
        for (flags, expected) in [
            (&["--replicas", "2"][..], "--replicas"),
            (&["--repetitions", "0"], "--repetitions"),
            (&["--record-bytes", "0"], "--record-bytes"),
            (&["--record-bytes", "2000000"], "--record-bytes"),
            (&["--active", "1GiB"], "--active"),
            (&["--segment", "0"], "--segment"),
        ] {
            let error = plan(&args(flags)).unwrap_err();
            assert!(error.0.contains(expected), "{flags:?}: {error}");
        }
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(64 * KIB));
        assert_eq!(parse_size("16MiB"), Ok(16 * MIB));
        assert_eq!(parse_size(" 2GiB "), Ok(2 * GIB));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("1MB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("-1").is_err());
        assert!(
            parse_size("99999999999999999GiB")
                .unwrap_err()
                .contains("too large")
        );
        for bytes in [0, 4096, 64 * KIB, 16 * MIB, 2 * GIB, 1000] {
            assert_eq!(parse_size(&size_label(bytes)), Ok(bytes), "{bytes}");
        }
    }

    #[test]
    fn spreads_take_the_middle_value_or_the_mean_of_the_middle_two() {
        let odd = Spread::of(&[3.0, 1.0, 2.0]);
        assert_eq!((odd.min, odd.median, odd.max), (1.0, 2.0, 3.0));
        let even = Spread::of(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!((even.min, even.median, even.max), (1.0, 2.5, 4.0));
        let one = Spread::of(&[7.0]);
        assert_eq!((one.min, one.median, one.max), (7.0, 7.0, 7.0));
    }

    #[test]
    fn rows_summarize_samples_and_compare_with_their_groups_first_cell() {
        let sample = |open_ms: u64, replay_ms: u64| Sample {
            reader_open: Duration::from_millis(5),
            read: Duration::from_millis(replay_ms),
            recovery: Duration::from_millis(open_ms - 1),
            replay: Duration::from_millis(replay_ms),
            start: Duration::from_millis(1),
        };
        let log_bytes = 10_000_000;
        let mut baselines = Baselines::default();
        let mut first = summarize(
            cell(1, MIB, 0),
            log_bytes,
            &[sample(100, 1000), sample(120, 500), sample(110, 2000)],
        );
        baselines.compare(&mut first);
        assert_eq!(first.open_ms.median, 110.0);
        assert_eq!(first.recovery_ms.min, 99.0);
        assert_eq!(first.replay_mb_per_s.median, 10.0);
        assert_eq!(first.replay_mb_per_s.max, 20.0);
        let same = Ratio {
            min: 1.0,
            median: 1.0,
        };
        assert_eq!(first.open_vs_fewest_sealed, same);

        let mut more_sealed = summarize(
            cell(100, MIB, 0),
            log_bytes,
            &[sample(120, 1000), sample(165, 1000), sample(500, 1000)],
        );
        baselines.compare(&mut more_sealed);
        assert_eq!(more_sealed.open_vs_fewest_sealed.min, 1.2);
        assert_eq!(more_sealed.open_vs_fewest_sealed.median, 1.5);
        // Another active size starts its own group.
        let mut other = summarize(cell(100, MIB, MIB), log_bytes, &[sample(300, 1000)]);
        baselines.compare(&mut other);
        assert_eq!(other.open_vs_fewest_sealed, same);
    }

    #[test]
    fn a_segment_holds_the_records_whose_frames_reach_its_size() {
        assert_eq!(records_per_segment(MIB, 4096), 256);
        assert_eq!(records_per_segment(4100, 4096), 1);
        assert_eq!(records_per_segment(4101, 4096), 2);
    }
}
