//! `chorus log read`: print committed records as JSON lines.
//!
//! Output contract, one line per record in index order, flushed per line:
//! `{"index":N,"data":"<record as UTF-8>"}`, or with `--base64`
//! `{"index":N,"data_b64":"<standard base64 with padding>"}`. The reader only
//! reads: it never recovers, fences or writes, and opens the replicas without
//! the capability probe (which writes).

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use chorus::ids::RecordIndex;
use chorus::log::Reader;
use serde::Serialize;

use crate::config::StoreArgs;
use crate::open::{Access, open_log};
use crate::output::{json_line, output_error};
use crate::{CommandError, UsageError};

/// Arguments of `log read`.
#[derive(Debug, clap::Args)]
pub struct ReadArgs {
    #[command(flatten)]
    store: StoreArgs,

    /// First index to print; defaults to the truncation floor (the first
    /// retained record). An index below the floor is an error.
    #[arg(long)]
    from: Option<u64>,

    /// Stop before this index (exclusive): `--from 5 --to 8` prints 5, 6 and 7.
    #[arg(long)]
    to: Option<u64>,

    /// Keep printing new committed records as they appear, instead of
    /// stopping once caught up (stops at --to if given).
    #[arg(long)]
    follow: bool,

    /// Print records as base64 in `data_b64` instead of UTF-8 text in `data`
    /// (needed for records that are not valid UTF-8).
    #[arg(long)]
    base64: bool,

    /// With --follow, how long to wait between polls once caught up. Each
    /// poll reads the register and one fragment per replica (requests cost).
    #[arg(long, default_value_t = 100)]
    poll_interval_ms: u64,
}

/// One output line.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Line<'a> {
    Text { index: u64, data: &'a str },
    Base64 { index: u64, data_b64: String },
}

/// Where printing starts when `--from` is not given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// The truncation floor (`log read`).
    Floor,
    /// The committed end (`log tail`).
    End,
}

/// Runs `log read`.
pub async fn read(args: ReadArgs) -> Result<(), CommandError> {
    run(args, Start::Floor).await
}

/// Runs `log tail`: follows new committed records from the current end (or
/// from `--from`), like `tail -f`.
pub async fn tail(mut args: ReadArgs) -> Result<(), CommandError> {
    args.follow = true;
    run(args, Start::End).await
}

async fn run(args: ReadArgs, start: Start) -> Result<(), CommandError> {
    let location = args.store.resolve()?;
    if let (Some(from), Some(to)) = (args.from, args.to)
        && to < from
    {
        return Err(UsageError(format!("--to {to} is below --from {from}")).into());
    }
    if args.poll_interval_ms == 0 {
        return Err(UsageError("--poll-interval-ms must be positive".into()).into());
    }
    let log = open_log(&location, Access::Read).await?;
    let from = match (args.from, start) {
        (Some(from), _) => from,
        (None, Start::Floor) => log.manifest.trunc.0,
        (None, Start::End) => Reader::committed_end(&log.stores).await?.0,
    };
    let mut reader = Reader::new(&log.stores, RecordIndex(from))
        .with_poll_interval(Duration::from_millis(args.poll_interval_ms));
    let mut printed = false;
    while args.to.is_none_or(|to| reader.position().0 < to) {
        let next = if args.follow {
            Some(reader.next().await)
        } else {
            reader.try_next().await.transpose()
        };
        let Some(next) = next else {
            break;
        };
        let (index, record) =
            next.map_err(|e| format!("cannot read index {}: {e}", reader.position()))?;
        let line = encode(index, &record, args.base64)?;
        json_line(&line).map_err(output_error)?;
        printed = true;
    }
    if !printed && !args.follow {
        // An empty answer is not an error, but say why there is nothing.
        let end = Reader::committed_end(&log.stores).await?;
        if RecordIndex(from) >= end {
            eprintln!("chorus: nothing to read: the log ends at index {end} (--from {from})");
        }
    }
    Ok(())
}

fn encode(index: RecordIndex, record: &[u8], base64: bool) -> Result<Line<'_>, CommandError> {
    if base64 {
        return Ok(Line::Base64 {
            index: index.0,
            data_b64: BASE64.encode(record),
        });
    }
    match std::str::from_utf8(record) {
        Ok(data) => Ok(Line::Text {
            index: index.0,
            data,
        }),
        Err(e) => Err(format!(
            "record {index} is not valid UTF-8 (at byte {}); read it with --base64",
            e.valid_up_to()
        )
        .into()),
    }
}
