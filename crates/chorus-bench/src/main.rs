//! `chorus-bench`: see the library's documentation.

use std::process::ExitCode;

use chorus_bench::compare::{self, CompareArgs};
use chorus_bench::etcd_plot::{self, EtcdPlotArgs};
use chorus_bench::plot::{self, PlotArgs};
use clap::Parser;

// The allocator of the `chorus` binary, so CPU and memory per record match
// what the product would spend.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Benchmarks Chorus side by side with the alternatives.
#[derive(Debug, Parser)]
#[command(name = "chorus-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Open-loop comparison of Chorus (1, 3, 5 replicas), SlateDB (three
    /// flush intervals), a naive log and the physical floor, over
    /// latency-injected in-memory stores: latency against offered rate, the
    /// highest sustained rate, requests and their cost per GB, CPU and memory.
    /// Tables on stdout, progress on stderr.
    Compare(CompareArgs),
    /// SVG charts from saved runs (`compare --save`, `chorus bench recovery
    /// --json`): latency against offered load, the highest sustained rate,
    /// request cost per GB, open time against log length.
    Plot(PlotArgs),
    /// SVG charts from saved `chorus bench etcd --json` runs, one per
    /// workload: each system's bar beside the others' in every cell.
    PlotEtcd(EtcdPlotArgs),
}

/// Names each chart written, on stderr.
fn report_written(written: Vec<std::path::PathBuf>) {
    for path in written {
        eprintln!("wrote {}", path.display());
    }
}

fn main() -> ExitCode {
    let Cli { command } = Cli::parse();
    let outcome = match command {
        Command::Compare(args) => compare::runtime(args.virtual_time).block_on(compare::run(args)),
        Command::Plot(args) => plot::run(args).map(report_written),
        Command::PlotEtcd(args) => etcd_plot::run(args).map(report_written),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("chorus-bench: {error}");
            ExitCode::FAILURE
        }
    }
}
