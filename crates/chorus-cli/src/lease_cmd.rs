//! `chorus lease …`: inspect and release a database's writer lease, plus the
//! helpers the `snapshot` commands share (holder identity, opening the store).

use chorus::blob::{DynBlobStore, open_store, open_store_unprobed};
use chorus::clock::{Clock, SystemClock};
use chorus::lease::{
    HolderId, LeaseConfig, LeaseError, LeaseRecord, LeaseStore, LiveLease, ReleaseOutcome,
};
use serde_json::json;

use crate::CommandError;
use crate::config::{DatabaseArgs, DatabaseLocation};
use crate::output::{out, outln};

/// The `lease` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum LeaseCommand {
    /// Print who holds the writer lease and until when.
    Status(StatusArgs),
    /// Release the lease if --holder holds it (an expired lease too).
    Release(ReleaseArgs),
}

/// Arguments of `lease status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    database: DatabaseArgs,

    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Arguments of `lease release`.
#[derive(Debug, clap::Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    database: DatabaseArgs,

    /// The holder whose lease to release, as it acquired it. Required, and
    /// never taken from the environment: a default would name this very
    /// process, or the `chorus serve` on this host.
    #[arg(long, required = true)]
    holder: String,

    /// Release the lease even while it is live. Only when its process is
    /// known to be gone: a live process keeps serving until its own deadline,
    /// while a standby takes over at once.
    #[arg(long)]
    force: bool,
}

/// Who the CLI acts as when it takes a lease (`snapshot publish`).
#[derive(Debug, Clone, clap::Args)]
pub struct HolderArgs {
    /// Lease holder id this command acts as [default: <hostname>-<pid>].
    /// Its own variable, not `CHORUS_HOLDER` (which names a `chorus serve`
    /// process); either way the command is a process of its own and never
    /// takes over a live lease, whatever the holder id.
    #[arg(long, env = "CHORUS_CLI_HOLDER")]
    pub holder: Option<String>,
}

impl HolderArgs {
    /// The holder id: the flag, or `<hostname>-<pid>`.
    pub fn resolve(&self) -> Result<HolderId, CommandError> {
        let id = match &self.holder {
            Some(id) => id.clone(),
            None => format!("{}-{}", hostname(), std::process::id()),
        };
        Ok(HolderId::new(&id).map_err(|e| format!("holder: {e}"))?)
    }
}

/// The host name from the kernel or the environment, `localhost` if neither
/// says (no extra dependency for one string).
pub fn hostname() -> String {
    let from_kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    let name = from_kernel
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_owned())
        .unwrap_or_default();
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
        "localhost".to_owned()
    } else {
        name
    }
}

/// Opens the database's store for writing: it must pass the capability probe,
/// since leases and HEAD rely on conditional writes.
pub async fn open_for_write(location: &DatabaseLocation) -> Result<DynBlobStore, CommandError> {
    if let Some(dir) = &location.data_dir {
        crate::config::ensure_data_dir(dir)?;
    }
    Ok(open_store(&location.store)
        .await
        .map_err(|e| format!("cannot open store {}: {e}", location.store))?)
}

/// Opens the database's store for reading, without the probe (which writes).
/// `None` when a local store's directory does not exist: reading creates nothing.
pub fn open_for_read(location: &DatabaseLocation) -> Result<Option<DynBlobStore>, CommandError> {
    if let Some(dir) = location.store.local_dir()
        && !std::path::Path::new(dir).is_dir()
    {
        return Ok(None);
    }
    Ok(Some(open_store_unprobed(&location.store).map_err(|e| {
        format!("cannot open store {}: {e}", location.store)
    })?))
}

/// The lease of the database at `location` in `store`.
pub fn lease_store(
    store: DynBlobStore,
    location: &DatabaseLocation,
    config: LeaseConfig,
) -> Result<LeaseStore, CommandError> {
    Ok(LeaseStore::new(
        store,
        location.database.clone(),
        config,
        SystemClock::shared(),
    )?)
}

impl LeaseCommand {
    /// Runs the command.
    pub async fn run(self) -> Result<(), CommandError> {
        match self {
            LeaseCommand::Status(args) => status(args).await,
            LeaseCommand::Release(args) => release(args).await,
        }
    }
}

async fn status(args: StatusArgs) -> Result<(), CommandError> {
    let location = args.database.resolve()?;
    let record = match open_for_read(&location)? {
        Some(store) => lease_store(store, &location, LeaseConfig::default())?
            .read()
            .await
            .map_err(|e| format!("cannot read lease: {e}"))?,
        None => None,
    };
    let now_ms = SystemClock.wall_ms();
    if args.json {
        outln!("{}", status_json(&location, record.as_ref(), now_ms))?;
    } else {
        out!("{}", status_text(&location, record.as_ref(), now_ms))?;
    }
    Ok(())
}

/// `held`, `expired` or `released`, by this host's wall clock.
fn state(record: &LeaseRecord, now_ms: u64) -> &'static str {
    if record.released {
        "released"
    } else if record.is_live(now_ms) {
        "held"
    } else {
        "expired"
    }
}

fn status_json(
    location: &DatabaseLocation,
    record: Option<&LeaseRecord>,
    now_ms: u64,
) -> serde_json::Value {
    let lease = record.map(|record| {
        json!({
            "state": state(record, now_ms),
            "holder_id": record.holder_id.as_str(),
            "incarnation": record.incarnation.map(|i| i.to_string()),
            "term": record.term.0,
            "generation": record.generation.0,
            "acquired_at_ms": record.acquired_at_ms,
            "expires_at_ms": record.expires_at_ms,
            "expires_in_ms": record.expires_in(now_ms).as_millis() as u64,
            "released": record.released,
        })
    });
    json!({
        "store": location.store.to_string(),
        "database": location.database.as_str(),
        "lease": lease,
    })
}

fn status_text(location: &DatabaseLocation, record: Option<&LeaseRecord>, now_ms: u64) -> String {
    let mut out = String::new();
    let mut line = |key: &str, value: String| out.push_str(&format!("{key:<11} {value}\n"));
    line("store", location.store.to_string());
    line("database", location.database.to_string());
    let Some(record) = record else {
        line("lease", "none (never acquired)".to_owned());
        return out;
    };
    let detail = match state(record, now_ms) {
        "held" => format!(
            "held, expires in {} ms",
            record.expires_in(now_ms).as_millis()
        ),
        other => other.to_owned(),
    };
    line("lease", detail);
    line("holder", record.holder_id.to_string());
    let incarnation = record.incarnation.map(|i| i.to_string());
    line(
        "incarnation",
        incarnation.unwrap_or_else(|| "none (an older build's lease)".to_owned()),
    );
    line("term", record.term.to_string());
    line("generation", record.generation.to_string());
    line(
        "acquired",
        format!("{} ms since the epoch", record.acquired_at_ms),
    );
    let end = if record.released {
        "released"
    } else {
        "expires"
    };
    line(end, format!("{} ms since the epoch", record.expires_at_ms));
    out
}

async fn release(args: ReleaseArgs) -> Result<(), CommandError> {
    let location = args.database.resolve()?;
    let holder = HolderId::new(&args.holder).map_err(|e| format!("holder: {e}"))?;
    let store = open_for_write(&location).await?;
    let leases = lease_store(store, &location, LeaseConfig::default())?;
    let live = if args.force {
        LiveLease::Release
    } else {
        LiveLease::Refuse
    };
    let database = &location.database;
    let outcome = match leases.release_holder(&holder, live).await {
        Ok(outcome) => outcome,
        Err(LeaseError::Held {
            holder: current,
            expires_in,
            ..
        }) if current == holder => {
            return Err(format!(
                "cannot release lease: it is live: database={database} holder={holder} \
                 expires_in_ms={}; its process releases it when it shuts down, or it expires \
                 on its own; pass --force only if that process is known to be gone",
                expires_in.as_millis()
            )
            .into());
        }
        Err(error) => return Err(format!("cannot release lease: {error}").into()),
    };
    if args.force && matches!(outcome, ReleaseOutcome::Released(_)) {
        tracing::warn!(%holder, "released a lease with --force");
    }
    match outcome {
        ReleaseOutcome::Released(record) => outln!(
            "released lease: database={database} holder={holder} generation={}",
            record.generation
        )?,
        ReleaseOutcome::NotHeld(None) => outln!("no lease to release: database={database}")?,
        ReleaseOutcome::NotHeld(Some(record)) if record.holder_id != holder => {
            let state = if record.released {
                "released"
            } else {
                "expired"
            };
            return Err(format!(
                "lease not held by {holder}, nothing released: database={database} holder={} \
                 state={state} generation={}",
                record.holder_id, record.generation
            )
            .into());
        }
        ReleaseOutcome::NotHeld(Some(record)) => outln!(
            "lease already released: database={database} holder={} generation={}",
            record.holder_id,
            record.generation
        )?,
    }
    Ok(())
}
