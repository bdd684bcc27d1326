//! Opens a SlateDB database whose WAL is a Chorus log, puts and gets.
//!
//! ```text
//! cargo run -p chorus-slatedb --example slatedb_on_chorus -- \
//!     --bucket file:///tmp/demo/bucket \
//!     --register sqlite:///tmp/demo/register.db \
//!     --replica file:///tmp/demo/wal-a \
//!     --replica file:///tmp/demo/wal-b \
//!     --replica file:///tmp/demo/wal-c
//! ```
//!
//! The bucket is any `object_store` URL (SlateDB's manifest and SSTs); the
//! replicas and register are Chorus locations, e.g. `s3://bucket/wal` or
//! `postgres://user@host/db`. Run it twice: the second run reads the first
//! run's keys back through WAL replay or from L0.

use std::sync::Arc;

use chorus_slatedb::{ChorusWal, ChorusWalOptions, WalLocation};
use slatedb::Db;

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    bucket: String,
    register: String,
    replicas: Vec<String>,
}

fn parse_args() -> Result<Args, Error> {
    let mut bucket = None;
    let mut register = None;
    let mut replicas = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--bucket" => bucket = Some(value()?),
            "--register" => register = Some(value()?),
            "--replica" => replicas.push(value()?),
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    Ok(Args {
        bucket: bucket.ok_or("--bucket is required")?,
        register: register.ok_or("--register is required")?,
        replicas,
    })
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = parse_args()?;
    if ![1, 3, 5].contains(&args.replicas.len()) {
        return Err("give 1, 3 or 5 --replica locations".into());
    }
    let location = WalLocation::new(
        args.replicas
            .iter()
            .map(|url| url.parse())
            .collect::<Result<_, _>>()?,
        args.register.parse()?,
    );
    let wal = ChorusWal::new(location.open().await?, ChorusWalOptions::default());
    let (bucket, path) = object_store::parse_url(&args.bucket.parse()?)?;
    let db = Db::builder(path.to_string(), Arc::from(bucket))
        .with_wal_writer(Box::new(wal))
        .build()
        .await?;

    let runs = match db.get(b"runs").await? {
        Some(count) => std::str::from_utf8(&count)?.parse::<u64>()? + 1,
        None => 1,
    };
    // Each put waits until a quorum of WAL replicas holds it.
    db.put(b"runs", runs.to_string())
        .await?
        .await_durable()
        .await?;
    db.put(format!("run-{runs}"), "hello from Chorus")
        .await?
        .await_durable()
        .await?;
    for run in 1..=runs {
        let value = db.get(format!("run-{run}")).await?;
        println!(
            "run-{run} = {:?}",
            value.map(|v| String::from_utf8_lossy(&v).into_owned())
        );
    }
    db.close().await?;
    Ok(())
}
