//! Report rows and how they print: a table on stdout, or one JSON object per
//! row with `--json`.

use std::fs::File;
use std::io::{self, BufWriter, Write};

use serde::Serialize;

use crate::cost::RequestCounts;
use crate::stats::Summary;

/// One system at one offered rate in one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct CellRow {
    /// Latency scenario.
    pub scenario: String,
    /// System.
    pub system: String,
    /// Offered rate, records per second.
    pub offered_rate: f64,
    /// Records due in the cell.
    pub records: u64,
    /// Records acknowledged.
    pub acked: u64,
    /// Records dropped at the outstanding cap.
    pub dropped: u64,
    /// Records the system refused (backpressure).
    pub refused: u64,
    /// Records failed or unacknowledged at the drain deadline.
    pub failed: u64,
    /// Acknowledged records per second.
    pub achieved_rate: f64,
    /// Acknowledged record bytes per second, in MB (10^6 bytes).
    pub mb_per_s: f64,
    /// Acknowledgement latency from due time, past the warm-up.
    #[serde(flatten)]
    pub latency: Summary,
    /// Whether the rate was sustained (`verdict::sustained`).
    pub sustained: bool,
    /// Whether the system could not keep up at all (`verdict::overloaded`):
    /// higher rates were then skipped.
    pub overloaded: bool,
    /// Store requests during the cell.
    pub requests: RequestCounts,
    /// Store requests per MB of records acknowledged.
    pub requests_per_mb: f64,
    /// Request cost per GB of records at S3 Standard prices, USD.
    pub usd_per_gb_s3_standard: f64,
    /// Request cost per GB of records at S3 Express One Zone prices, USD.
    pub usd_per_gb_s3_express: f64,
    /// S3 Express One Zone's per-GB upload charge per GB of records, USD.
    pub usd_per_gb_s3_express_upload: f64,
    /// Bytes uploaded per byte of records.
    pub upload_amplification: f64,
    /// Process CPU time per acknowledged record, microseconds.
    pub cpu_us_per_record: f64,
    /// Resident memory when the cell started (what earlier cells left
    /// behind in the allocator included), MiB.
    pub start_rss_mib: Option<f64>,
    /// Peak resident memory from the cell's start to its end (the
    /// in-memory stores included), MiB.
    pub peak_rss_mib: Option<f64>,
    /// How far the driver fell behind the schedule, milliseconds.
    pub max_send_lag_ms: f64,
    /// The first failure, if any.
    pub first_error: Option<String>,
}

/// The physical floor of `quorum` out of `stores` in one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct FloorRow {
    /// Latency scenario.
    pub scenario: String,
    /// Stores written.
    pub stores: usize,
    /// Answers waited for.
    pub quorum: usize,
    /// The floor's distribution.
    #[serde(flatten)]
    pub latency: Summary,
}

/// The headline of one system in one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct HeadlineRow {
    /// Latency scenario.
    pub scenario: String,
    /// System.
    pub system: String,
    /// Highest offered rate sustained (`verdict::highest_sustained`).
    pub highest_sustained_rate: Option<f64>,
    /// The lowest offered rate measured: "light load".
    pub light_rate: f64,
    /// p50 at light load, milliseconds.
    pub light_p50_ms: f64,
    /// p99 at light load, milliseconds.
    pub light_p99_ms: f64,
    /// The floor's p50 for this system's stores and quorum, milliseconds.
    pub floor_p50_ms: f64,
    /// Light-load p50 as a multiple of the floor's p50.
    pub light_p50_over_floor: f64,
}

/// The settings of a run, first in its output.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigRow {
    /// Base injected latency, milliseconds.
    pub latency_ms: u64,
    /// Bytes per record.
    pub record_bytes: usize,
    /// The p99 a sustained rate must meet, milliseconds.
    pub slo_p99_ms: u64,
    /// Chorus's in-flight budget (`LogConfig::max_inflight_bytes`): what
    /// bounds its memory beyond the stores.
    pub chorus_max_inflight_bytes: u64,
    /// Chorus's window (fragments in flight per replica).
    pub chorus_window: u32,
    /// Chorus's segment size (`LogConfig::max_segment_bytes`).
    pub chorus_max_segment_bytes: u64,
    /// Whether Chorus paces its fragment cuts (`LogConfig::pace_fragments`).
    pub chorus_pace_fragments: bool,
    /// When Chorus hedges fragment writes (`LogConfig::hedge_after_percentile`).
    pub chorus_hedge_after_percentile: Option<u8>,
    /// Whether the cells ran on a paused clock (`--virtual-time`).
    pub virtual_time: bool,
    /// The driver's outstanding-record cap.
    pub max_outstanding: usize,
    /// MiB of heap touched before the first cell and kept for reuse.
    pub warm_heap_mib: u64,
    /// Whether peak RSS is per cell (else over the whole run so far).
    pub peak_rss_per_cell: bool,
    /// When the prices were looked up.
    pub prices_checked: &'static str,
    /// S3 Standard, USD per 1,000 PUT-class requests.
    pub s3_standard_put_per_1000: f64,
    /// S3 Standard, USD per 1,000 GET-class requests.
    pub s3_standard_get_per_1000: f64,
    /// S3 Express One Zone, USD per 1,000 PUT-class requests.
    pub s3_express_put_per_1000: f64,
    /// S3 Express One Zone, USD per 1,000 GET-class requests.
    pub s3_express_get_per_1000: f64,
    /// S3 Express One Zone, USD per GB uploaded.
    pub s3_express_upload_per_gb: f64,
}

/// Every kind of row, tagged for `--json`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Row {
    /// The run's settings.
    Config(ConfigRow),
    /// A measured cell.
    Cell(CellRow),
    /// A computed floor.
    Floor(FloorRow),
    /// A system's headline.
    Headline(HeadlineRow),
}

/// Writes rows as a table (a header before the first row of each kind) or
/// as JSON lines, and optionally also as JSON lines to a file.
#[derive(Debug)]
pub struct Printer {
    json: bool,
    last_kind: Option<&'static str>,
    save: Option<BufWriter<File>>,
}

impl Printer {
    /// A printer for tables, or JSON lines when `json`; every row also goes
    /// to `save` as a JSON line, flushed as it is written, so a run cut
    /// short keeps what it measured.
    pub fn new(json: bool, save: Option<File>) -> Printer {
        Printer {
            json,
            last_kind: None,
            save: save.map(BufWriter::new),
        }
    }

    /// Prints `row` to stdout (and to the save file).
    pub fn print(&mut self, row: &Row) -> io::Result<()> {
        let json = serde_json::to_string(row).expect("rows encode");
        if let Some(save) = &mut self.save {
            writeln!(save, "{json}")?;
            save.flush()?;
        }
        let mut out = io::stdout().lock();
        if self.json {
            return writeln!(out, "{json}");
        }
        let kind = match row {
            Row::Config(_) => "config",
            Row::Cell(_) => "cell",
            Row::Floor(_) => "floor",
            Row::Headline(_) => "headline",
        };
        if self.last_kind != Some(kind) {
            self.last_kind = Some(kind);
            if let Some(header) = header(row) {
                writeln!(out, "\n{header}")?;
            }
        }
        writeln!(out, "{}", line(row))?;
        out.flush()
    }

    /// Prints a free-text line (a table only; JSON output stays rows only).
    pub fn note(&self, text: &str) -> io::Result<()> {
        if self.json {
            return Ok(());
        }
        writeln!(io::stdout().lock(), "{text}")
    }
}

/// The settings as a paragraph above the tables.
fn describe(c: &ConfigRow) -> String {
    format!(
        "Injected latency {} ms per request, {}-byte records; sustained = nothing lost and \
         p99 <= {} ms. Chorus: window {}, {} MiB segments, paced cuts {}, in-flight budget {} MiB; \
         outstanding cap {} records; heap warmed {} MiB; peak RSS {}.\n\
         Request prices (USD per 1,000, looked up {}): S3 Standard PUT {} GET {}; \
         S3 Express One Zone PUT {} GET {}, plus {} per GB uploaded.",
        c.latency_ms,
        c.record_bytes,
        c.slo_p99_ms,
        c.chorus_window,
        c.chorus_max_segment_bytes >> 20,
        if c.chorus_pace_fragments { "on" } else { "off" },
        c.chorus_max_inflight_bytes >> 20,
        c.max_outstanding,
        c.warm_heap_mib,
        if c.peak_rss_per_cell {
            "per cell"
        } else {
            "over the whole run"
        },
        c.prices_checked,
        c.s3_standard_put_per_1000,
        c.s3_standard_get_per_1000,
        c.s3_express_put_per_1000,
        c.s3_express_get_per_1000,
        c.s3_express_upload_per_gb,
    )
}

/// The column names above rows like `row`; none above the settings.
fn header(row: &Row) -> Option<String> {
    Some(match row {
        Row::Config(_) => return None,
        Row::Cell(_) => format!(
            "{:<10} {:<13} {:>8} {:>9} {:>7} {:>8} {:>8} {:>8} {:>6} {:>6} {:>7} {:>7} {:>8} {:>6} {:>6} {:>7} {:>6}",
            "scenario",
            "system",
            "offered",
            "achieved",
            "MB/s",
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "lost",
            "sust",
            "req/MB",
            "$/GB S3",
            "$/GB S3X",
            "up×",
            "µs/rec",
            "RSS MiB",
            "lag ms",
        ),
        Row::Floor(_) => format!(
            "{:<10} {:<13} {:>8} {:>8} {:>8}",
            "scenario", "floor", "p50 ms", "p99 ms", "p99.9 ms"
        ),
        Row::Headline(_) => format!(
            "{:<10} {:<13} {:>12} {:>9} {:>9} {:>9} {:>9} {:>8}",
            "scenario",
            "system",
            "sustained/s",
            "light/s",
            "p50 ms",
            "p99 ms",
            "floor ms",
            "×floor"
        ),
    })
}

fn line(row: &Row) -> String {
    match row {
        Row::Config(config) => describe(config),
        Row::Cell(c) => format!(
            "{:<10} {:<13} {:>8} {:>9.0} {:>7.1} {:>8.2} {:>8.2} {:>8.2} {:>6} {:>6} {:>7.1} {:>7.4} {:>8.4} {:>6.2} {:>6.1} {:>7} {:>6.1}",
            c.scenario,
            c.system,
            c.offered_rate,
            c.achieved_rate,
            c.mb_per_s,
            c.latency.p50_ms,
            c.latency.p99_ms,
            c.latency.p999_ms,
            c.dropped + c.refused + c.failed,
            if c.sustained { "yes" } else { "no" },
            c.requests_per_mb,
            c.usd_per_gb_s3_standard,
            c.usd_per_gb_s3_express,
            c.upload_amplification,
            c.cpu_us_per_record,
            c.peak_rss_mib
                .map_or_else(|| "-".to_owned(), |mib| format!("{mib:.0}")),
            c.max_send_lag_ms,
        ),
        Row::Floor(f) => format!(
            "{:<10} {:<13} {:>8.2} {:>8.2} {:>8.2}",
            f.scenario,
            format!("{} of {}", f.quorum, f.stores),
            f.latency.p50_ms,
            f.latency.p99_ms,
            f.latency.p999_ms
        ),
        Row::Headline(h) => format!(
            "{:<10} {:<13} {:>12} {:>9} {:>9.2} {:>9.2} {:>9.2} {:>8.2}",
            h.scenario,
            h.system,
            h.highest_sustained_rate
                .map_or_else(|| "none".to_owned(), |rate| format!("{rate}")),
            h.light_rate,
            h.light_p50_ms,
            h.light_p99_ms,
            h.floor_p50_ms,
            h.light_p50_over_floor
        ),
    }
}
