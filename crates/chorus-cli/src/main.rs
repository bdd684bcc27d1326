//! `chorus`: the command-line tool. A thin layer over the `chorus` library:
//! argument parsing and configuration, then one library call per command.

mod bench_cmd;
mod config;
mod lease_cmd;
mod log_cmd;
mod open;
mod output;
mod progress;
mod serve_cmd;
mod snapshot_cmd;
mod store_cmd;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of the system allocator: under load the service spent a
/// sixth of its CPU in glibc malloc and free (per-request buffers, records
/// and fragments freed on other threads than allocated them).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Chorus: a quorum-replicated write-ahead log over object storage.
#[derive(Debug, Parser)]
#[command(name = "chorus", version, about, long_about = None)]
struct Cli {
    /// Diagnostics on stderr as text (for terminals) or JSON lines (for log
    /// collectors); the level comes from CHORUS_LOG (e.g. `info`, `chorus=debug`).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

/// How diagnostics are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the key-value service (HTTP) on the log: primary or standby.
    Serve(Box<serve_cmd::ServeArgs>),
    /// Create and inspect logs.
    #[command(subcommand)]
    Log(log_cmd::LogCommand),
    /// Measure the write path's latency and throughput.
    #[command(subcommand)]
    Bench(bench_cmd::BenchCommand),
    /// List, publish and restore snapshots of a database.
    #[command(subcommand)]
    Snapshot(snapshot_cmd::SnapshotCommand),
    /// Inspect and release a database's writer lease.
    #[command(subcommand)]
    Lease(lease_cmd::LeaseCommand),
    /// Maintain the stores themselves (upgrade a local directory's layout).
    #[command(subcommand)]
    Store(store_cmd::StoreCommand),
}

/// The error a command fails with; printed as one line with its causes.
pub type CommandError = Box<dyn std::error::Error + Send + Sync>;

/// Arguments that contradict each other where clap cannot see it: exits 2,
/// like clap's own usage errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A service reports its phases by default; one-shot commands only warn.
    let default_level = match cli.command {
        Command::Serve(_) => "info",
        _ => "warn",
    };
    init_logging(cli.log_format, default_level);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => return fail(&error),
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => args.run().await,
            Command::Log(command) => command.run().await,
            Command::Bench(command) => command.run().await,
            Command::Snapshot(command) => command.run().await,
            Command::Lease(command) => command.run().await,
            Command::Store(command) => command.run().await,
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(error.as_ref()),
    }
}

/// Diagnostics go to stderr, filtered by `CHORUS_LOG` (for example `info` or
/// `chorus=debug`), at `default_level` without it.
fn init_logging(format: LogFormat, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CHORUS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Prints `chorus: <error>: <cause>: …` on one line and picks the exit code.
/// A closed stdout (`chorus … | head`) is not an error.
fn fail(error: &(dyn std::error::Error + 'static)) -> ExitCode {
    let mut chain = Vec::new();
    let mut current = Some(error);
    while let Some(error) = current {
        let text = error.to_string();
        // Many errors repeat their source's message; print each part once.
        if !chain
            .last()
            .is_some_and(|last: &String| last.contains(&text))
        {
            chain.push(text);
        }
        current = error.source();
    }
    if let Some(io) = error.downcast_ref::<std::io::Error>()
        && io.kind() == std::io::ErrorKind::BrokenPipe
    {
        return ExitCode::SUCCESS;
    }
    let _ = writeln!(std::io::stderr(), "chorus: {}", chain.join(": "));
    if error.downcast_ref::<UsageError>().is_some() {
        return ExitCode::from(2);
    }
    ExitCode::FAILURE
}
