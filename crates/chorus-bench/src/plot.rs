//! `chorus-bench plot`: SVG charts from saved runs: ack latency against
//! offered load per system, the highest sustained rate per system, request
//! cost per GB, and log open time against log length.
//!
//! It reads what the benchmarks saved (`compare --save`, and `chorus bench
//! recovery --json`), so a chart can be redrawn without re-measuring, and
//! every point on it is a row in a file that can be checked.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::SegmentValue;
use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;
use serde::Deserialize;

use crate::systems::Error;

/// Chart size in pixels.
pub(crate) const SIZE: (u32, u32) = (960, 540);

/// Arguments of `plot`.
#[derive(Debug, Clone, clap::Args)]
pub struct PlotArgs {
    /// JSON lines of a `chorus-bench compare --save` run.
    #[arg(long, value_name = "FILE")]
    pub compare: PathBuf,
    /// JSON lines of a `chorus bench recovery --json` run (optional).
    #[arg(long, value_name = "FILE")]
    pub recovery: Option<PathBuf>,
    /// Directory the SVG files are written to (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// The latency scenario of the latency, sustained-rate and cost charts.
    #[arg(long, default_value = "fixed")]
    pub scenario: String,
}

/// The parts of a `compare` row the charts use.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CompareRow {
    /// The run's settings.
    Config {
        /// Base injected latency, milliseconds.
        latency_ms: u64,
        /// The p99 a sustained rate must meet, milliseconds.
        slo_p99_ms: u64,
    },
    /// A measured cell.
    Cell(CellPoint),
    /// A system's headline.
    Headline {
        /// Latency scenario.
        scenario: String,
        /// System.
        system: String,
        /// Highest offered rate sustained.
        highest_sustained_rate: Option<f64>,
    },
    /// Rows the charts do not use (floors).
    #[serde(other)]
    Other,
}

/// One measured cell, as the charts see it.
#[derive(Debug, Clone, Deserialize)]
pub struct CellPoint {
    /// Latency scenario.
    pub scenario: String,
    /// System.
    pub system: String,
    /// Offered rate, records per second.
    pub offered_rate: f64,
    /// Median ack latency, milliseconds.
    pub p50_ms: f64,
    /// 99th-percentile ack latency, milliseconds.
    pub p99_ms: f64,
    /// Request cost per GB of records at S3 Standard prices, USD.
    pub usd_per_gb_s3_standard: f64,
}

/// The parts of a `chorus bench recovery --json` row the chart uses.
#[derive(Debug, Clone, Deserialize)]
pub struct RecoveryPoint {
    /// Sealed segments in the log.
    pub sealed_segments: usize,
    /// Bytes in the active segment.
    pub active_bytes: u64,
    /// Size of each sealed segment.
    pub segment_bytes: u64,
    /// Open time (recovery and start), milliseconds.
    pub open_ms: Spread,
}

/// Smallest, median and largest of a cell's repetitions.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct Spread {
    /// Smallest.
    pub min: f64,
    /// Median.
    pub median: f64,
    /// Largest.
    pub max: f64,
}

/// A named line of (x, y) points, x ascending.
#[derive(Debug, Clone, PartialEq)]
pub struct Series<T> {
    /// Legend text.
    pub name: String,
    /// The points.
    pub points: Vec<(f64, T)>,
}

/// Draws every chart; returns the files written.
pub fn run(args: PlotArgs) -> Result<Vec<PathBuf>, Error> {
    let rows: Vec<CompareRow> = read_lines(&args.compare)?;
    let (latency_ms, slo_ms) = rows
        .iter()
        .find_map(|row| match row {
            CompareRow::Config {
                latency_ms,
                slo_p99_ms,
            } => Some((*latency_ms, *slo_p99_ms)),
            _ => None,
        })
        .ok_or_else(|| format!("{}: no config row", args.compare.display()))?;
    let cells: Vec<CellPoint> = rows
        .iter()
        .filter_map(|row| match row {
            CompareRow::Cell(cell) if cell.scenario == args.scenario => Some(cell.clone()),
            _ => None,
        })
        .collect();
    if cells.is_empty() {
        return Err(format!(
            "{}: no cells in scenario {:?}",
            args.compare.display(),
            args.scenario
        )
        .into());
    }
    fs::create_dir_all(&args.out)
        .map_err(|error| format!("--out {}: {error}", args.out.display()))?;
    let mut written = Vec::new();
    let subtitle = format!("{} latency, {latency_ms} ms per request", args.scenario);

    let path = args.out.join("latency.svg");
    latency_chart(&path, &cells, slo_ms as f64, &subtitle)?;
    written.push(path);

    let path = args.out.join("sustained.svg");
    sustained_chart(&path, &sustained(&rows, &args.scenario), slo_ms, &subtitle)?;
    written.push(path);

    let path = args.out.join("cost.svg");
    cost_chart(
        &path,
        &by_system(&cells, |c| c.usd_per_gb_s3_standard),
        &subtitle,
    )?;
    written.push(path);

    if let Some(recovery) = &args.recovery {
        let points: Vec<RecoveryPoint> = read_lines(recovery)?;
        let path = args.out.join("recovery.svg");
        recovery_chart(&path, &by_active_size(&points))?;
        written.push(path);
    }
    Ok(written)
}

/// Parses every non-empty line of `path` as JSON.
pub(crate) fn read_lines<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Vec<T>, Error> {
    let text = fs::read_to_string(path).map_err(|error| format!("{}: {error}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(number, line)| {
            serde_json::from_str(line)
                .map_err(|error| format!("{} line {}: {error}", path.display(), number + 1).into())
        })
        .collect()
}

/// One series per system, in the order systems first appear, of
/// (offered rate, `value`), ascending in rate.
pub fn by_system(cells: &[CellPoint], value: impl Fn(&CellPoint) -> f64) -> Vec<Series<f64>> {
    let mut series: Vec<Series<f64>> = Vec::new();
    for cell in cells {
        let point = (cell.offered_rate, value(cell));
        match series.iter_mut().find(|s| s.name == cell.system) {
            Some(s) => s.points.push(point),
            None => series.push(Series {
                name: cell.system.clone(),
                points: vec![point],
            }),
        }
    }
    for s in &mut series {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    series
}

/// Every system's highest sustained rate in `scenario`, in headline order.
pub fn sustained(rows: &[CompareRow], scenario: &str) -> Vec<(String, Option<f64>)> {
    rows.iter()
        .filter_map(|row| match row {
            CompareRow::Headline {
                scenario: s,
                system,
                highest_sustained_rate,
            } if s == scenario => Some((system.clone(), *highest_sustained_rate)),
            _ => None,
        })
        .collect()
}

/// One series per (active size, segment size) of (sealed segments, open
/// time spread), ascending in sealed segments.
pub fn by_active_size(points: &[RecoveryPoint]) -> Vec<Series<Spread>> {
    let mut groups: BTreeMap<(u64, u64), Vec<(f64, Spread)>> = BTreeMap::new();
    for point in points {
        groups
            .entry((point.active_bytes, point.segment_bytes))
            .or_default()
            .push((point.sealed_segments as f64, point.open_ms));
    }
    groups
        .into_iter()
        .map(|((active, segment), mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series {
                name: format!(
                    "active {}, sealed segments of {}",
                    size(active),
                    size(segment)
                ),
                points,
            }
        })
        .collect()
}

/// `bytes` in the largest binary unit that keeps it whole.
fn size(bytes: u64) -> String {
    const UNITS: [(&str, u32); 3] = [("GiB", 30), ("MiB", 20), ("KiB", 10)];
    if bytes == 0 {
        return "empty".to_owned();
    }
    UNITS
        .iter()
        .find(|(_, shift)| bytes.is_multiple_of(1 << shift))
        .map_or_else(
            || format!("{bytes} B"),
            |(unit, shift)| format!("{} {unit}", bytes >> shift),
        )
}

/// The range `[lo, hi]` of `values` widened to whole powers of ten, for a
/// log axis.
pub fn decades(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return (1.0, 10.0);
    }
    let lo = 10f64.powf(lo.log10().floor());
    let hi = 10f64.powf(hi.log10().ceil()).max(lo * 10.0);
    (lo, hi)
}

/// A line through `points` with a dot on each, named `name` in the legend.
fn marked_line<X, Y>(
    chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<X, Y>>,
    name: &str,
    points: &[(f64, f64)],
    color: RGBColor,
) -> Result<(), Error>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .draw_series(LineSeries::new(
            points.iter().copied(),
            color.stroke_width(2),
        ))
        .map_err(plot_error)?
        .label(name)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    chart
        .draw_series(
            points
                .iter()
                .map(|point| Circle::new(*point, 3, color.filled())),
        )
        .map_err(plot_error)?;
    Ok(())
}

/// An axis label: whole numbers with k and M for thousands and millions,
/// small ones as they are.
pub fn tick(value: f64) -> String {
    let trim = |v: f64| {
        let text = format!("{v:.2}");
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    };
    match value {
        v if v >= 1e6 => format!("{}M", trim(v / 1e6)),
        v if v >= 1e3 => format!("{}k", trim(v / 1e3)),
        v if v >= 1.0 => trim(v),
        v => format!("{v}"),
    }
}

pub(crate) fn color(index: usize) -> RGBColor {
    let (r, g, b) = Palette99::pick(index).rgb();
    RGBColor(r, g, b)
}

pub(crate) fn plot_error(error: impl std::fmt::Display) -> Error {
    format!("drawing a chart: {error}").into()
}

/// p50 and p99 against offered rate, side by side, with the SLO line.
fn latency_chart(
    path: &Path,
    cells: &[CellPoint],
    slo_ms: f64,
    subtitle: &str,
) -> Result<(), Error> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let root = root
        .titled(
            &format!("Ack latency against offered load ({subtitle})"),
            ("sans-serif", 20),
        )
        .map_err(plot_error)?;
    let (left, right) = root.split_horizontally(SIZE.0 / 2);
    let x = decades(cells.iter().map(|c| c.offered_rate));
    let y = decades(
        cells
            .iter()
            .flat_map(|c| [c.p50_ms, c.p99_ms])
            .chain([slo_ms]),
    );
    for (area, title, value) in [
        (
            &left,
            "p50",
            (|c: &CellPoint| c.p50_ms) as fn(&CellPoint) -> f64,
        ),
        (&right, "p99", |c: &CellPoint| c.p99_ms),
    ] {
        let frame = LogFrame {
            title,
            x,
            y,
            descriptions: ("offered records/s", "ms"),
            reference: Some(("p99 limit", slo_ms)),
            legend: SeriesLabelPosition::UpperLeft,
        };
        log_lines(area, &frame, &by_system(cells, value))?;
    }
    root.present().map_err(plot_error)
}

/// Request cost per GB against offered rate.
fn cost_chart(path: &Path, series: &[Series<f64>], subtitle: &str) -> Result<(), Error> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let x = decades(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let y = decades(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let title = format!("Request cost per GB written, S3 Standard prices ({subtitle})");
    let frame = LogFrame {
        title: &title,
        x,
        y,
        descriptions: ("offered records/s", "USD per GB"),
        reference: None,
        legend: SeriesLabelPosition::UpperRight,
    };
    log_lines(&root, &frame, series)?;
    root.present().map_err(plot_error)
}

/// Lines with point markers on log-log axes, and an optional horizontal
/// reference line.
/// The frame of a chart on log-log axes.
struct LogFrame<'a> {
    title: &'a str,
    /// The x axis's range.
    x: (f64, f64),
    /// The y axis's range.
    y: (f64, f64),
    /// What the x and y axes show.
    descriptions: (&'a str, &'a str),
    /// A horizontal line and its legend text.
    reference: Option<(&'a str, f64)>,
    /// Where the legend goes.
    legend: SeriesLabelPosition,
}

fn log_lines(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    frame: &LogFrame<'_>,
    series: &[Series<f64>],
) -> Result<(), Error> {
    let LogFrame {
        title,
        x,
        y,
        descriptions: (x_desc, y_desc),
        reference,
        ref legend,
    } = *frame;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x.0..x.1).log_scale(), (y.0..y.1).log_scale())
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .draw()
        .map_err(plot_error)?;
    for (index, s) in series.iter().enumerate() {
        marked_line(&mut chart, &s.name, &s.points, color(index))?;
    }
    if let Some((name, level)) = reference {
        chart
            .draw_series(LineSeries::new(
                [(x.0, level), (x.1, level)],
                BLACK.stroke_width(1),
            ))
            .map_err(plot_error)?
            .label(name)
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    }
    draw_legend(&mut chart, legend.clone())
}

/// The legend of `chart`'s labelled series at `position`, on a pale box.
pub(crate) fn draw_legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    position: SeriesLabelPosition,
) -> Result<(), Error> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_error)
}

/// The highest sustained rate per system, as bars on a log axis; a system
/// that sustained no rate gets no bar and says so in its label.
fn sustained_chart(
    path: &Path,
    rates: &[(String, Option<f64>)],
    slo_ms: u64,
    subtitle: &str,
) -> Result<(), Error> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let (lo, hi) = decades(rates.iter().filter_map(|(_, rate)| *rate));
    let count = rates.len() as u32;
    let labels: Vec<String> = rates
        .iter()
        .map(|(system, rate)| match rate {
            Some(_) => system.clone(),
            None => format!("{system} (none)"),
        })
        .collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Highest offered rate sustained with p99 <= {slo_ms} ms ({subtitle})"),
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((0u32..count).into_segmented(), (lo..hi).log_scale())
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(rates.len())
        .x_label_formatter(&|value| match value {
            SegmentValue::CenterOf(index) => {
                labels.get(*index as usize).cloned().unwrap_or_default()
            }
            _ => String::new(),
        })
        .y_desc("records/s")
        .y_label_formatter(&|v| tick(*v))
        .draw()
        .map_err(plot_error)?;
    chart
        .draw_series(rates.iter().enumerate().filter_map(|(index, (_, rate))| {
            let index = index as u32;
            rate.map(|rate| {
                let mut bar = Rectangle::new(
                    [
                        (SegmentValue::Exact(index), lo),
                        (SegmentValue::Exact(index + 1), rate),
                    ],
                    color(index as usize).filled(),
                );
                bar.set_margin(0, 0, 12, 12);
                bar
            })
        }))
        .map_err(plot_error)?;
    root.present().map_err(plot_error)
}

/// Open time against sealed segments: the median as a line, the smallest
/// and largest repetition as a bar through it.
fn recovery_chart(path: &Path, series: &[Series<Spread>]) -> Result<(), Error> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    // Widened so the bars at the first and last count stay clear of the axes.
    let x = decades(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let x = (x.0 / 1.5, x.1 * 1.5);
    let top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1.max))
        .fold(0.0, f64::max)
        * 1.2;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Log open time against sealed segments (median; bars: fastest to slowest)",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x.0..x.1).log_scale(), 0.0..top.max(1.0))
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("sealed segments")
        .y_desc("open ms")
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .draw()
        .map_err(plot_error)?;
    for (index, s) in series.iter().enumerate() {
        let color = color(index);
        let medians: Vec<(f64, f64)> = s.points.iter().map(|(x, p)| (*x, p.median)).collect();
        marked_line(&mut chart, &s.name, &medians, color)?;
        chart
            .draw_series(s.points.iter().map(|(x, spread)| {
                PathElement::new(
                    vec![(*x, spread.min), (*x, spread.max)],
                    color.stroke_width(2),
                )
            }))
            .map_err(plot_error)?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(plot_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(system: &str, rate: f64, p99: f64) -> CellPoint {
        CellPoint {
            scenario: "fixed".into(),
            system: system.into(),
            offered_rate: rate,
            p50_ms: p99 / 2.0,
            p99_ms: p99,
            usd_per_gb_s3_standard: 1.0,
        }
    }

    #[test]
    fn cells_group_by_system_in_first_seen_order_and_sort_by_rate() {
        let cells = [
            cell("b", 300.0, 3.0),
            cell("a", 100.0, 1.0),
            cell("b", 100.0, 2.0),
        ];
        let series = by_system(&cells, |c| c.p99_ms);
        assert_eq!(
            series,
            vec![
                Series {
                    name: "b".into(),
                    points: vec![(100.0, 2.0), (300.0, 3.0)]
                },
                Series {
                    name: "a".into(),
                    points: vec![(100.0, 1.0)]
                },
            ]
        );
    }

    #[test]
    fn decades_widen_to_powers_of_ten_and_survive_empty_input() {
        assert_eq!(decades([150.0, 30_000.0].into_iter()), (100.0, 100_000.0));
        assert_eq!(decades([100.0].into_iter()), (100.0, 1000.0));
        assert_eq!(decades(std::iter::empty()), (1.0, 10.0));
        assert_eq!(decades([0.0, f64::NAN].into_iter()), (1.0, 10.0));
    }

    #[test]
    fn rows_parse_by_kind_and_unknown_kinds_are_ignored() {
        let lines = [
            r#"{"kind":"config","latency_ms":10,"slo_p99_ms":30,"record_bytes":4096}"#,
            r#"{"kind":"floor","scenario":"fixed","stores":3,"quorum":2}"#,
            r#"{"kind":"headline","scenario":"fixed","system":"chorus-3","highest_sustained_rate":null}"#,
        ];
        let rows: Vec<CompareRow> = lines
            .iter()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert!(matches!(
            rows[0],
            CompareRow::Config {
                latency_ms: 10,
                slo_p99_ms: 30
            }
        ));
        assert!(matches!(rows[1], CompareRow::Other));
        assert_eq!(sustained(&rows, "fixed"), vec![("chorus-3".into(), None)]);
    }

    #[test]
    fn ticks_are_short() {
        assert_eq!(tick(100.0), "100");
        assert_eq!(tick(1500.0), "1.5k");
        assert_eq!(tick(150_000.0), "150k");
        assert_eq!(tick(1e6), "1M");
        assert_eq!(tick(12.5), "12.5");
        assert_eq!(tick(0.001), "0.001");
    }

    #[test]
    fn sizes_print_in_whole_binary_units() {
        assert_eq!(size(0), "empty");
        assert_eq!(size(64 << 20), "64 MiB");
        assert_eq!(size(1536), "1536 B");
        assert_eq!(size(3 << 10), "3 KiB");
    }
}
