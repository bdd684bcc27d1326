//! `chorus-bench compare`: every system, each latency scenario, a sweep of
//! offered rates; one fresh system instance per cell, all in this process.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chorus::log::HedgeAfter;
use chorus::register::MAX_WINDOW;
use chorus::timer::Timer;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

use crate::cost::{
    PRICES_CHECKED, S3_EXPRESS_ONE_ZONE, S3_EXPRESS_UPLOAD_PER_GB, S3_STANDARD, request_usd_per_gb,
    requests_per_mb, upload_amplification,
};
use crate::driver::{self, Load};
use crate::floor::quorum_floor;
use crate::heap;
use crate::models::Scenario;
use crate::plan::{self, Group, Request};
use crate::report::{CellRow, ConfigRow, FloorRow, HeadlineRow, Printer, Row};
use crate::schedule::{CellLength, warmup};
use crate::stats::{Summary, millis, percentile};
use crate::store::Counters;
use crate::systems::ChorusSettings;
use crate::systems::{Error, SystemKind};
use crate::usage::{cpu_time, peak_rss_bytes, reset_peak_rss, rss_bytes};
use crate::verdict::{
    CellCounts, SLO_FACTOR, highest_sustained, overloaded, p99_ratios, sustained,
};

/// Draws behind each computed floor.
const FLOOR_DRAWS: usize = 100_000;

/// How long closing a system may take before the run moves on.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(60);

/// Arguments of `compare`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// A short run (under a minute): three rates at fixed latency, one in
    /// the other scenarios, 1-second cells, fewer systems in the tails.
    #[arg(long)]
    pub quick: bool,
    /// The injected (base) latency of every store request, in milliseconds.
    #[arg(long, default_value_t = 10)]
    pub latency_ms: u64,
    /// Bytes per record.
    #[arg(long, default_value_t = 4096)]
    pub record_bytes: usize,
    /// Offered rates in records per second, comma-separated (default: the
    /// sweep of the full or quick run).
    #[arg(long, value_delimiter = ',')]
    pub rates: Vec<f64>,
    /// Systems, comma-separated (default: all at fixed latency, a selection
    /// in the other scenarios): chorus-1, chorus-3, chorus-5, slatedb-100ms,
    /// slatedb-10ms, slatedb-1ms, naive-1 (the measured floor of one
    /// store), naive-3.
    #[arg(long, value_delimiter = ',')]
    pub systems: Vec<SystemKind>,
    /// Latency scenarios, comma-separated (default: all): fixed, log-normal,
    /// one-slow, one-spiky.
    #[arg(long, value_delimiter = ',')]
    pub scenarios: Vec<Scenario>,
    /// Length of every cell in milliseconds (default: 1 s with --quick,
    /// else 3–10 s, longer at low rates).
    #[arg(long)]
    pub cell_ms: Option<u64>,
    /// Most MiB of records one cell writes (they stay in memory, once per
    /// replica, until the cell ends).
    #[arg(long, default_value_t = 512)]
    pub max_cell_mib: u64,
    /// MiB of heap touched before the first cell and kept in the process
    /// for reuse, so that cells do not pay the kernel for fresh pages
    /// (default: three times --max-cell-mib; 0 leaves the heap alone).
    #[arg(long, value_name = "MIB")]
    pub warm_heap_mib: Option<u64>,
    /// Most records outstanding at once; records due beyond it are dropped
    /// and the rate counts as not sustained.
    #[arg(long, default_value_t = 100_000)]
    pub max_outstanding: usize,
    /// How long to wait for acknowledgements after the last record is due,
    /// in milliseconds.
    #[arg(long, default_value_t = 5_000)]
    pub drain_ms: u64,
    /// Chorus's segment size (`LogConfig::max_segment_bytes`) in MiB,
    /// instead of the default 64: to see what rotation and sealing cost.
    /// The active-segment limit is raised to match when needed.
    #[arg(long, value_name = "MIB")]
    pub segment_mib: Option<u64>,
    /// Run Chorus without paced fragment cuts (`LogConfig::pace_fragments`
    /// off), to see what pacing costs or saves.
    #[arg(long)]
    pub no_pace: bool,
    /// Hedge Chorus's fragment writes after this percentile of each
    /// replica's recent write latencies, or `off`
    /// (`LogConfig::hedge_after_percentile`; default: the log's default).
    #[arg(long, value_name = "N|off")]
    pub hedge_after_percentile: Option<HedgeAfter>,
    /// Chorus's window (fragments in flight per replica) instead of the
    /// default of new logs.
    #[arg(long)]
    pub window: Option<u32>,
    /// Seed of the latency draws and the record bytes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run every cell on a paused clock (tokio's, on one thread): time moves
    /// only when every task waits, so latencies are the protocol's alone,
    /// with none of this machine's CPU or scheduling in them, and a run
    /// repeats exactly for its seed. Only chorus-N and naive-N run (SlateDB
    /// keeps threads and timers of its own). The clock moves in whole
    /// milliseconds, so give --latency-ms 100 or more (and rates a tenth of
    /// those at 10 ms) to keep that rounding to 1 %.
    #[arg(long)]
    pub virtual_time: bool,
    /// Print one JSON object per row instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Also write every row as a JSON line to this file (the input of
    /// `chorus-bench plot`), whatever stdout shows.
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,
}

/// What every cell shares.
struct Context {
    base: Duration,
    chorus: ChorusSettings,
    seed: u64,
    record: Bytes,
    length: CellLength,
    max_outstanding: usize,
    drain: Duration,
    /// What injected delays and the driver's waits end by.
    timer: Timer,
}

/// The runtime a comparison runs on: tokio's default, or with
/// `--virtual-time` one thread on a paused clock, which jumps to the next
/// timer whenever every task waits.
pub fn runtime(virtual_time: bool) -> tokio::runtime::Runtime {
    let mut builder = if virtual_time {
        let mut builder = tokio::runtime::Builder::new_current_thread();
        builder.start_paused(true);
        builder
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    builder.enable_all().build().expect("the runtime starts")
}

/// Runs the comparison.
pub async fn run(args: CompareArgs) -> Result<(), Error> {
    if args.latency_ms == 0 || args.record_bytes == 0 || args.max_outstanding == 0 {
        return Err("--latency-ms, --record-bytes and --max-outstanding must be positive".into());
    }
    if args
        .rates
        .iter()
        .any(|rate| !(rate.is_finite() && *rate > 0.0))
    {
        return Err("--rates must be positive numbers".into());
    }
    let mut groups = plan::groups(&Request {
        quick: args.quick,
        rates: args.rates.clone(),
        systems: args.systems.clone(),
        scenarios: args.scenarios.clone(),
    });
    if args.virtual_time {
        let before = groups.len();
        groups.retain(|group| group.system.runs_on_virtual_time());
        if groups.len() < before {
            eprintln!(
                "--virtual-time: SlateDB's systems left out (they keep their own threads and timers)"
            );
        }
    }
    if groups.is_empty() {
        return Err("nothing to run: no system fits the chosen scenarios".into());
    }
    let context = Context {
        base: Duration::from_millis(args.latency_ms),
        chorus: chorus_settings(&args)?,
        seed: args.seed,
        record: record(args.record_bytes, args.seed),
        length: plan::cell_length(
            args.quick,
            args.cell_ms.map(Duration::from_millis),
            args.max_cell_mib << 20,
        ),
        max_outstanding: args.max_outstanding,
        drain: Duration::from_millis(args.drain_ms),
        timer: if args.virtual_time {
            Timer::Tokio
        } else {
            Timer::Precise
        },
    };
    let save = match &args.save {
        Some(path) => Some(
            File::create(path).map_err(|error| format!("--save {}: {error}", path.display()))?,
        ),
        None => None,
    };
    let warm = warm_heap_mib(&args);
    if warm > 0 {
        eprintln!("warming {warm} MiB of heap …");
        heap::retain_and_warm(warm);
    }
    let mut printer = Printer::new(args.json, save);
    printer.print(&Row::Config(config(&args, &context.chorus)))?;
    let floors = floors(&groups, &context);
    let mut progress = Progress {
        done: 0,
        total: groups.iter().map(|group| group.rates.len()).sum(),
    };
    let mut headlines = Vec::new();
    let mut measured = Vec::new();
    for group in &groups {
        let cells = sweep(group, &context, &mut printer, &mut progress).await?;
        let floor = &floors[&(group.scenario, group.system.quorum())];
        headlines.push(headline(group, &cells, floor));
        measured.extend(cells);
    }
    for ((scenario, (stores, quorum)), latency) in &floors {
        printer.print(&Row::Floor(FloorRow {
            scenario: scenario.name().to_owned(),
            stores: *stores,
            quorum: *quorum,
            latency: *latency,
        }))?;
    }
    for headline in &headlines {
        printer.print(&Row::Headline(headline.clone()))?;
    }
    for line in against_slatedb(&headlines)
        .into_iter()
        .chain(against_fixed(&measured))
    {
        printer.note(&line)?;
    }
    Ok(())
}

/// Chorus's settings: the defaults of a new log, changed by `--segment-mib`,
/// `--no-pace`, `--hedge-after-percentile` and `--window`.
fn chorus_settings(args: &CompareArgs) -> Result<ChorusSettings, Error> {
    let mut settings = ChorusSettings::default();
    let config = &mut settings.config;
    config.pace_fragments = !args.no_pace;
    if let Some(HedgeAfter(percentile)) = args.hedge_after_percentile {
        config.hedge_after_percentile = percentile;
    }
    if let Some(mib) = args.segment_mib {
        config.max_segment_bytes = mib << 20;
        config.max_active_segment_bytes = config
            .max_active_segment_bytes
            .max(config.max_segment_bytes);
    }
    config
        .validate()
        .map_err(|error| format!("--segment-mib: {error}"))?;
    if let Some(window) = args.window {
        if !(1..=MAX_WINDOW).contains(&window) {
            return Err(format!("--window {window} is outside 1..={MAX_WINDOW}").into());
        }
        settings.window = window;
    }
    Ok(settings)
}

/// `--warm-heap-mib`, or room for a cell's records as fragments and as
/// sealed copies with the stores' overhead.
fn warm_heap_mib(args: &CompareArgs) -> u64 {
    args.warm_heap_mib.unwrap_or(3 * args.max_cell_mib)
}

/// The run's settings as a row.
fn config(args: &CompareArgs, chorus: &ChorusSettings) -> ConfigRow {
    ConfigRow {
        latency_ms: args.latency_ms,
        record_bytes: args.record_bytes,
        slo_p99_ms: args.latency_ms * u64::from(SLO_FACTOR),
        chorus_max_inflight_bytes: chorus.config.max_inflight_bytes,
        chorus_window: chorus.window,
        chorus_max_segment_bytes: chorus.config.max_segment_bytes,
        chorus_pace_fragments: chorus.config.pace_fragments,
        chorus_hedge_after_percentile: chorus.config.hedge_after_percentile,
        virtual_time: args.virtual_time,
        max_outstanding: args.max_outstanding,
        warm_heap_mib: warm_heap_mib(args),
        peak_rss_per_cell: reset_peak_rss(),
        prices_checked: PRICES_CHECKED,
        s3_standard_put_per_1000: S3_STANDARD.put_per_1000,
        s3_standard_get_per_1000: S3_STANDARD.get_per_1000,
        s3_express_put_per_1000: S3_EXPRESS_ONE_ZONE.put_per_1000,
        s3_express_get_per_1000: S3_EXPRESS_ONE_ZONE.get_per_1000,
        s3_express_upload_per_gb: S3_EXPRESS_UPLOAD_PER_GB,
    }
}

/// Cells run so far (skipped ones included) out of all planned.
struct Progress {
    done: usize,
    total: usize,
}

/// Runs `group`'s rates in ascending order, printing each cell, until the
/// system cannot keep up; returns the cells measured (at least one).
async fn sweep(
    group: &Group,
    context: &Context,
    printer: &mut Printer,
    progress: &mut Progress,
) -> Result<Vec<CellRow>, Error> {
    let mut cells = Vec::new();
    for &rate in &group.rates {
        progress.done += 1;
        eprintln!(
            "[{}/{}] {} {} at {rate} records/s …",
            progress.done, progress.total, group.scenario, group.system
        );
        let cell = measure(group, rate, context).await?;
        printer.print(&Row::Cell(cell.clone()))?;
        let overloaded = cell.overloaded;
        cells.push(cell);
        if overloaded {
            eprintln!(
                "{} {} cannot keep up at {rate} records/s: higher rates skipped",
                group.scenario, group.system
            );
            progress.done += group.rates.iter().filter(|r| **r > rate).count();
            break;
        }
    }
    Ok(cells)
}

/// `bytes` pseudo-random bytes, so nothing along the way can compress them.
fn record(bytes: usize, seed: u64) -> Bytes {
    let mut record = vec![0; bytes];
    StdRng::seed_from_u64(seed).fill_bytes(&mut record);
    Bytes::from(record)
}

/// The floor of every (scenario, (stores, quorum)) the groups need.
fn floors(groups: &[Group], context: &Context) -> BTreeMap<(Scenario, (usize, usize)), Summary> {
    let mut floors = BTreeMap::new();
    for group in groups {
        let (stores, quorum) = group.system.quorum();
        floors
            .entry((group.scenario, (stores, quorum)))
            .or_insert_with(|| {
                let replicas = group.scenario.replicas(context.base, stores);
                Summary::of(&quorum_floor(&replicas, quorum, FLOOR_DRAWS, context.seed))
            });
    }
    floors
}

/// Runs one cell on a fresh instance of the group's system.
async fn measure(group: &Group, rate: f64, context: &Context) -> Result<CellRow, Error> {
    let record_bytes = context.record.len() as u64;
    let records = context.length.records(rate, record_bytes);
    let load = Load {
        rate,
        records,
        warmup: warmup(records),
        max_outstanding: context.max_outstanding,
        drain: context.drain,
        timer: context.timer,
    };
    let counters = Arc::new(Counters::default());
    let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
    reset_peak_rss();
    let start_rss_mib = rss_bytes().map(mib);
    let system = group
        .system
        .open(
            group.scenario,
            context.base,
            context.seed,
            &counters,
            &context.chorus,
            context.timer,
        )
        .await
        .map_err(|error| format!("opening {}: {error}", group.system))?;
    let (requests_before, cpu_before) = (counters.snapshot(), cpu_time());
    let run = driver::run(system.as_ref(), &load, &context.record).await;
    let cpu = cpu_time().saturating_sub(cpu_before);
    let requests = counters.snapshot().since(&requests_before);
    let peak_rss_mib = peak_rss_bytes().map(mib);
    match tokio::time::timeout(CLOSE_TIMEOUT, system.close()).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => eprintln!("closing {} failed: {error}", group.system),
        Err(_) => eprintln!("closing {} took over {CLOSE_TIMEOUT:?}", group.system),
    }
    let written = run.acked * record_bytes;
    let latency = Summary::of(&run.latencies);
    let achieved_rate = run.achieved_rate();
    let amplification = upload_amplification(&requests, written);
    let counts = CellCounts {
        offered_rate: rate,
        achieved_rate,
        dropped: run.dropped,
        refused: run.refused,
        failed: run.failed,
        p99: percentile(&run.latencies, 0.99),
    };
    Ok(CellRow {
        scenario: group.scenario.name().to_owned(),
        system: group.system.name(),
        offered_rate: rate,
        records,
        acked: run.acked,
        dropped: run.dropped,
        refused: run.refused,
        failed: run.failed,
        achieved_rate,
        mb_per_s: achieved_rate * record_bytes as f64 / 1e6,
        latency,
        sustained: sustained(&counts, context.base),
        overloaded: overloaded(&counts),
        requests,
        requests_per_mb: requests_per_mb(&requests, written),
        usd_per_gb_s3_standard: request_usd_per_gb(&requests, written, &S3_STANDARD),
        usd_per_gb_s3_express: request_usd_per_gb(&requests, written, &S3_EXPRESS_ONE_ZONE),
        usd_per_gb_s3_express_upload: amplification * S3_EXPRESS_UPLOAD_PER_GB,
        upload_amplification: amplification,
        cpu_us_per_record: if run.acked == 0 {
            0.0
        } else {
            cpu.as_secs_f64() * 1e6 / run.acked as f64
        },
        start_rss_mib,
        peak_rss_mib,
        max_send_lag_ms: millis(run.max_send_lag),
        first_error: run.first_error,
    })
}

/// The headline of one group from its cells (ascending rates, at least one).
fn headline(group: &Group, cells: &[CellRow], floor: &Summary) -> HeadlineRow {
    let light = &cells[0];
    let sustained: Vec<_> = cells
        .iter()
        .map(|cell| (cell.offered_rate, cell.sustained))
        .collect();
    HeadlineRow {
        scenario: group.scenario.name().to_owned(),
        system: group.system.name(),
        highest_sustained_rate: highest_sustained(&sustained),
        light_rate: light.offered_rate,
        light_p50_ms: light.latency.p50_ms,
        light_p99_ms: light.latency.p99_ms,
        floor_p50_ms: floor.p50_ms,
        light_p50_over_floor: light.latency.p50_ms / floor.p50_ms,
    }
}

/// Per system in each scenario but `fixed`: its p99 at each rate as a
/// multiple of its p99 at the same rate with every store fast.
fn against_fixed(cells: &[CellRow]) -> Vec<String> {
    let p99s = |scenario: &str, system: &str| -> Vec<(f64, f64)> {
        cells
            .iter()
            .filter(|c| c.scenario == scenario && c.system == system)
            .map(|c| (c.offered_rate, c.latency.p99_ms))
            .collect()
    };
    let fixed = Scenario::Fixed.name();
    let mut groups: Vec<(&str, &str)> = cells
        .iter()
        .filter(|c| c.scenario != fixed)
        .map(|c| (c.scenario.as_str(), c.system.as_str()))
        .collect();
    groups.dedup();
    groups
        .into_iter()
        .filter_map(|(scenario, system)| {
            let ratios = p99_ratios(&p99s(fixed, system), &p99s(scenario, system));
            (!ratios.is_empty()).then(|| {
                let each: Vec<_> = ratios
                    .iter()
                    .map(|(rate, ratio)| format!("{ratio:.2}× at {rate}/s"))
                    .collect();
                format!("{scenario} {system}: p99 {} of fixed", each.join(", "))
            })
        })
        .collect()
}

/// Per scenario: Chorus on 3 replicas, and SlateDB on a 3-replica Chorus
/// WAL, against SlateDB's best configuration with its own WAL.
fn against_slatedb(headlines: &[HeadlineRow]) -> Vec<String> {
    let ours = [SystemKind::Chorus(3), SystemKind::SlateDbOnChorus(3)].map(SystemKind::name);
    let mut lines = Vec::new();
    for ours in headlines.iter().filter(|h| ours.contains(&h.system)) {
        let slatedb = headlines.iter().filter(|h| {
            h.scenario == ours.scenario
                && h.system
                    .parse::<SystemKind>()
                    .is_ok_and(SystemKind::is_slatedb)
        });
        let best = slatedb.max_by(|a, b| {
            let rate = |h: &HeadlineRow| h.highest_sustained_rate.unwrap_or(0.0);
            rate(a).total_cmp(&rate(b))
        });
        let Some(best) = best else { continue };
        let rate = |h: &HeadlineRow| {
            h.highest_sustained_rate
                .map_or_else(|| "none".to_owned(), |rate| format!("{rate}/s"))
        };
        let ratio = match (ours.highest_sustained_rate, best.highest_sustained_rate) {
            (Some(a), Some(b)) => format!("{:.1}×", a / b),
            _ => "no ratio".to_owned(),
        };
        lines.push(format!(
            "{}: {} sustains {}, best SlateDB ({}) {}: {ratio}",
            ours.scenario,
            ours.system,
            rate(ours),
            best.system,
            rate(best)
        ));
    }
    lines
}
