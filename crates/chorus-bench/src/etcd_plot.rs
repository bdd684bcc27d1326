//! `chorus-bench plot-etcd`: one SVG chart per workload from saved `chorus
//! bench etcd --json` runs, every system's bar beside the others' in each
//! cell, so a reader sees Chorus against a real etcd without reading the
//! tables.
//!
//! Each run is its own file; a bar is the median over the runs and its
//! whisker spans the smallest to the largest, so run-to-run noise shows.

use std::fs;
use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use serde::Deserialize;

use crate::plot::{SIZE, Spread, color, decades, draw_legend, plot_error, read_lines, tick};
use crate::systems::Error;

/// Arguments of `plot-etcd`.
#[derive(Debug, Clone, clap::Args)]
pub struct EtcdPlotArgs {
    /// JSON lines of `chorus bench etcd --json` runs, one file per run.
    #[arg(required = true, value_name = "RUN")]
    pub runs: Vec<PathBuf>,
    /// Directory the SVG files (`etcd-<workload>.svg`) are written to
    /// (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// The parts of a `chorus bench etcd --json` row the charts use.
#[derive(Debug, Clone, Deserialize)]
pub struct EtcdRow {
    /// `etcd-3`, `chorus-3-local`, `chorus-3-10ms`.
    pub system: String,
    /// `put`, `range-linearizable`, … `failover`.
    pub workload: String,
    /// Clients of the cell.
    pub clients: u64,
    /// Successful operations per second.
    pub per_second: f64,
    /// 99th-percentile latency, milliseconds.
    pub p99_ms: f64,
    /// Ranges: keys per answer.
    #[serde(default)]
    pub keys: Option<u64>,
    /// Failover: time until the first write succeeded again, milliseconds.
    #[serde(default)]
    pub resume_ms: Option<f64>,
}

/// What a workload's chart shows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measure {
    /// The y axis's description.
    pub unit: &'static str,
    /// Whether the axis is logarithmic.
    pub log: bool,
}

/// The quantity charted for `workload`, and its value in `row` (`None`
/// when the row lacks it).
pub fn measure(workload: &str) -> (Measure, fn(&EtcdRow) -> Option<f64>) {
    match workload {
        "watch" => (
            Measure {
                unit: "delivery p99 after commit, ms",
                log: true,
            },
            |row| Some(row.p99_ms),
        ),
        "failover" => (
            Measure {
                unit: "seconds from SIGKILL until writes succeed",
                log: false,
            },
            |row| row.resume_ms.map(|ms| ms / 1000.0),
        ),
        _ => (
            Measure {
                unit: "operations/s",
                log: true,
            },
            |row| Some(row.per_second),
        ),
    }
}

/// One workload's chart: its cells in first-seen order, and per cell one
/// spread per system (in first-seen order; `None` where a system has no
/// row for the cell).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadChart {
    /// The workload.
    pub workload: String,
    /// What the bars show.
    pub measure: Measure,
    /// The systems, in legend order.
    pub systems: Vec<String>,
    /// `(cell label, spread per system)`.
    pub cells: Vec<(String, Vec<Option<Spread>>)>,
}

/// The label of a row's cell: its clients, and its keys for ranges.
pub fn cell_label(row: &EtcdRow) -> String {
    let clients = format!("{} clients", thousands(row.clients));
    match row.keys {
        Some(1) => format!("1 key, {clients}"),
        Some(keys) => format!("{}-key prefix, {clients}", thousands(keys)),
        None => clients,
    }
}

/// Groups the runs' rows into one chart per workload (first-seen order).
pub fn charts(runs: &[Vec<EtcdRow>]) -> Vec<WorkloadChart> {
    let rows: Vec<&EtcdRow> = runs.iter().flatten().collect();
    let mut workloads: Vec<&str> = Vec::new();
    for row in &rows {
        if !workloads.contains(&row.workload.as_str()) {
            workloads.push(&row.workload);
        }
    }
    workloads
        .into_iter()
        .map(|workload| {
            let (measure, value) = measure(workload);
            let of_workload: Vec<&&EtcdRow> =
                rows.iter().filter(|r| r.workload == workload).collect();
            let mut systems: Vec<String> = Vec::new();
            let mut labels: Vec<String> = Vec::new();
            for row in &of_workload {
                if !systems.contains(&row.system) {
                    systems.push(row.system.clone());
                }
                let label = cell_label(row);
                if !labels.contains(&label) {
                    labels.push(label);
                }
            }
            let cells = labels
                .into_iter()
                .map(|label| {
                    let spreads = systems
                        .iter()
                        .map(|system| {
                            let values: Vec<f64> = of_workload
                                .iter()
                                .filter(|r| &r.system == system && cell_label(r) == label)
                                .filter_map(|r| value(r))
                                .collect();
                            spread(values)
                        })
                        .collect();
                    (label, spreads)
                })
                .collect();
            WorkloadChart {
                workload: workload.to_owned(),
                measure,
                systems,
                cells,
            }
        })
        .collect()
}

/// Smallest, median (the lower middle of an even count) and largest.
pub fn spread(mut values: Vec<f64>) -> Option<Spread> {
    values.retain(|v| v.is_finite());
    values.sort_by(f64::total_cmp);
    Some(Spread {
        min: *values.first()?,
        median: values[(values.len() - 1) / 2],
        max: *values.last()?,
    })
}

/// `n` with thousands separated by commas.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// Draws every workload's chart; returns the files written.
pub fn run(args: EtcdPlotArgs) -> Result<Vec<PathBuf>, Error> {
    let runs = args
        .runs
        .iter()
        .map(|path| read_lines::<EtcdRow>(path))
        .collect::<Result<Vec<_>, _>>()?;
    let charts = charts(&runs);
    if charts.is_empty() {
        return Err("the runs hold no rows".into());
    }
    fs::create_dir_all(&args.out)
        .map_err(|error| format!("--out {}: {error}", args.out.display()))?;
    let mut written = Vec::new();
    for chart in &charts {
        let path = args.out.join(format!("etcd-{}.svg", chart.workload));
        draw(&path, chart, runs.len())?;
        written.push(path);
    }
    Ok(written)
}

/// Bars grouped by cell: one segment per (cell, system), an empty one
/// between cells; the cell's label under its middle bar.
fn draw(path: &Path, chart: &WorkloadChart, runs: usize) -> Result<(), Error> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let systems = chart.systems.len() as u32;
    let per_cell = systems + 1;
    let segments = chart.cells.len() as u32 * per_cell;
    let spreads = || chart.cells.iter().flat_map(|(_, s)| s.iter().flatten());
    let top = spreads().map(|s| s.max).fold(0.0, f64::max);
    let (lo, hi) = if chart.measure.log {
        decades(spreads().flat_map(|s| [s.min, s.max]))
    } else {
        (0.0, (top * 1.15).max(1.0))
    };
    let caption = format!(
        "etcd API, {}: {} (median of {runs} run(s); whiskers: smallest to largest)",
        chart.workload, chart.measure.unit
    );
    let label_of = |index: u32| {
        let (cell, position) = (index / per_cell, index % per_cell);
        (position == systems / 2)
            .then(|| {
                chart
                    .cells
                    .get(cell as usize)
                    .map(|(label, _)| label.clone())
            })
            .flatten()
            .unwrap_or_default()
    };
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70);
    let x = (0u32..segments).into_segmented();
    if chart.measure.log {
        let mut context = builder
            .build_cartesian_2d(x, (lo..hi).log_scale())
            .map_err(plot_error)?;
        mesh(&mut context, chart, segments, &label_of)?;
        bars(&mut context, chart, lo)?;
        draw_legend(&mut context, SeriesLabelPosition::UpperRight)
    } else {
        let mut context = builder.build_cartesian_2d(x, lo..hi).map_err(plot_error)?;
        mesh(&mut context, chart, segments, &label_of)?;
        bars(&mut context, chart, lo)?;
        draw_legend(&mut context, SeriesLabelPosition::UpperRight)
    }?;
    root.present().map_err(plot_error)
}

type Segmented<'a, Y> = ChartContext<
    'a,
    SVGBackend<'a>,
    Cartesian2d<
        plotters::coord::ranged1d::SegmentedCoord<plotters::coord::types::RangedCoordu32>,
        Y,
    >,
>;

fn mesh<Y>(
    context: &mut Segmented<'_, Y>,
    chart: &WorkloadChart,
    segments: u32,
    label_of: &dyn Fn(u32) -> String,
) -> Result<(), Error>
where
    Y: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
{
    context
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(segments as usize)
        .x_label_formatter(&|value| match value {
            SegmentValue::CenterOf(index) => label_of(*index),
            _ => String::new(),
        })
        .y_desc(chart.measure.unit)
        .y_label_formatter(&|v| tick(*v))
        .draw()
        .map_err(plot_error)
}

fn bars<Y>(context: &mut Segmented<'_, Y>, chart: &WorkloadChart, floor: f64) -> Result<(), Error>
where
    Y: Ranged<ValueType = f64>,
{
    let per_cell = chart.systems.len() as u32 + 1;
    for (system_index, system) in chart.systems.iter().enumerate() {
        let color = color(system_index);
        let placed: Vec<(u32, Spread)> = chart
            .cells
            .iter()
            .enumerate()
            .filter_map(|(cell, (_, spreads))| {
                spreads[system_index]
                    .map(|spread| (cell as u32 * per_cell + system_index as u32, spread))
            })
            .collect();
        context
            .draw_series(placed.iter().map(|(segment, spread)| {
                let mut bar = Rectangle::new(
                    [
                        (SegmentValue::Exact(*segment), floor),
                        (SegmentValue::Exact(segment + 1), spread.median),
                    ],
                    color.filled(),
                );
                bar.set_margin(0, 0, 4, 4);
                bar
            }))
            .map_err(plot_error)?
            .label(system)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
        context
            .draw_series(placed.iter().map(|(segment, spread)| {
                PathElement::new(
                    vec![
                        (SegmentValue::CenterOf(*segment), spread.min),
                        (SegmentValue::CenterOf(*segment), spread.max),
                    ],
                    BLACK.stroke_width(2),
                )
            }))
            .map_err(plot_error)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(system: &str, workload: &str, clients: u64, per_second: f64) -> EtcdRow {
        EtcdRow {
            system: system.into(),
            workload: workload.into(),
            clients,
            per_second,
            p99_ms: per_second / 100.0,
            keys: None,
            resume_ms: None,
        }
    }

    #[test]
    fn runs_group_by_workload_cell_and_system_in_first_seen_order() {
        let run1 = vec![
            row("etcd-3", "put", 1, 100.0),
            row("etcd-3", "put", 64, 1000.0),
            row("chorus-3-local", "put", 1, 300.0),
            row("chorus-3-local", "watch", 100, 500.0),
        ];
        let run2 = vec![
            row("etcd-3", "put", 1, 200.0),
            row("chorus-3-local", "put", 1, 100.0),
        ];
        let run3 = vec![row("etcd-3", "put", 1, 150.0)];
        let charts = charts(&[run1, run2, run3]);
        assert_eq!(charts.len(), 2);
        let put = &charts[0];
        assert_eq!(put.workload, "put");
        assert_eq!(put.systems, ["etcd-3", "chorus-3-local"]);
        let labels: Vec<&str> = put.cells.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["1 clients", "64 clients"]);
        assert_eq!(
            put.cells[0].1,
            [
                Some(Spread {
                    min: 100.0,
                    median: 150.0,
                    max: 200.0
                }),
                Some(Spread {
                    min: 100.0,
                    median: 100.0,
                    max: 300.0
                }),
            ]
        );
        // chorus-3-local has no 64-client row.
        assert_eq!(put.cells[1].1[1], None);
        let watch = &charts[1];
        assert_eq!(watch.measure.unit, "delivery p99 after commit, ms");
        assert_eq!(watch.cells[0].1[0].map(|s| s.median), Some(5.0));
    }

    #[test]
    fn range_cells_are_labelled_by_keys_and_failover_charts_seconds() {
        let mut prefix = row("etcd-3", "range-serializable", 64, 1.0);
        prefix.keys = Some(1_000);
        assert_eq!(cell_label(&prefix), "1,000-key prefix, 64 clients");
        prefix.keys = Some(1);
        prefix.clients = 1_000;
        assert_eq!(cell_label(&prefix), "1 key, 1,000 clients");
        let mut failover = row("etcd-3", "failover", 16, 1.0);
        failover.resume_ms = Some(2_500.0);
        let (measure, value) = measure("failover");
        assert!(!measure.log);
        assert_eq!(value(&failover), Some(2.5));
    }

    #[test]
    fn a_spread_of_nothing_is_none_and_an_even_count_takes_the_lower_middle() {
        assert_eq!(spread(Vec::new()), None);
        assert_eq!(
            spread(vec![4.0, 1.0, 3.0, 2.0]),
            Some(Spread {
                min: 1.0,
                median: 2.0,
                max: 4.0
            })
        );
    }

    #[test]
    fn charts_are_drawn_as_svg_files() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run.jsonl");
        let lines = [
            r#"{"system":"etcd-3","workload":"put","clients":1,"per_second":500.0,"p50_ms":1.0,"p99_ms":2.0,"errors":0}"#,
            r#"{"system":"chorus-3-local","workload":"put","clients":1,"per_second":400.0,"p50_ms":1.0,"p99_ms":2.0,"errors":0}"#,
            r#"{"system":"etcd-3","workload":"failover","clients":16,"per_second":9.0,"p50_ms":1.0,"p99_ms":2.0,"errors":3,"resume_ms":1500.0}"#,
        ];
        fs::write(&run, lines.join("\n")).unwrap();
        let out = dir.path().join("charts");
        let written = run_charts(&run, &out);
        assert_eq!(
            written,
            [out.join("etcd-put.svg"), out.join("etcd-failover.svg")]
        );
        for path in written {
            let svg = fs::read_to_string(path).unwrap();
            assert!(svg.contains("<svg") && svg.contains("etcd-3"), "{svg}");
        }
    }

    fn run_charts(run: &Path, out: &Path) -> Vec<PathBuf> {
        super::run(EtcdPlotArgs {
            runs: vec![run.to_owned()],
            out: out.to_owned(),
        })
        .unwrap()
    }
}
