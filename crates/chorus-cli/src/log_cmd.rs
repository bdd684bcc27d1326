//! `chorus log …`: create, append to, read and inspect logs.

mod append;
mod maintain;
mod read;
mod recover;

use std::sync::Arc;

use chorus::blob::{DynBlobStore, StoreUrl, open_store};
use chorus::log::maintenance::first_log_object;
use chorus::register::{
    DEFAULT_WINDOW, Initialized, MAX_WINDOW, Manifest, ManifestStore, OpenMode, RegisterUrl,
    initialize, open_register,
};
use serde_json::json;

use crate::CommandError;
use crate::config::{Location, StoreArgs, ensure_data_dir};
use crate::open::{Access, StoredManifest, open_existing_register, open_log, read_manifest};
use crate::output::{out, outln};

/// The `log` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum LogCommand {
    /// Create the register and bind the ordered replica list (idempotent).
    Init(InitArgs),
    /// Append newline-delimited records (stdin or --file); print `{"index":N}`
    /// per ack, in order, as acks arrive.
    Append(append::AppendArgs),
    /// Print committed records as JSON lines `{"index":N,"data":"…"}`.
    Read(read::ReadArgs),
    /// Follow new committed records from the current end (`read --follow`
    /// starting at the end unless --from is given).
    Tail(read::ReadArgs),
    /// Print the register's fields and the replica binding.
    Inspect(InspectArgs),
    /// Raise the truncation floor and delete what lies wholly below it.
    Truncate(maintain::TruncateArgs),
    /// Heal missing or damaged sealed copies, finish deletions, sweep orphans.
    Repair(maintain::RepairArgs),
    /// Check every object of every replica; non-zero exit on any problem.
    Verify(maintain::VerifyArgs),
    /// Rebuild a lost register from what the replicas hold (stop every
    /// writer first); --dry-run prints it without writing.
    RecoverRegister(recover::RecoverRegisterArgs),
}

/// Arguments of `log init`.
#[derive(Debug, clap::Args)]
pub struct InitArgs {
    #[command(flatten)]
    store: StoreArgs,

    /// Fragments each replica may have in flight; fixed for the log's lifetime.
    #[arg(long, default_value_t = DEFAULT_WINDOW)]
    window: u32,
}

/// Arguments of `log inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    #[command(flatten)]
    store: StoreArgs,

    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

impl LogCommand {
    /// Runs the command.
    pub async fn run(self) -> Result<(), CommandError> {
        match self {
            LogCommand::Init(args) => init(args).await,
            LogCommand::Append(args) => append::append(args).await,
            LogCommand::Read(args) => read::read(args).await,
            LogCommand::Tail(args) => read::tail(args).await,
            LogCommand::Inspect(args) => inspect(args).await,
            LogCommand::Truncate(args) => maintain::truncate(args).await,
            LogCommand::Repair(args) => maintain::repair(args).await,
            LogCommand::Verify(args) => maintain::verify(args).await,
            LogCommand::RecoverRegister(args) => recover::recover_register(args).await,
        }
    }
}

async fn init(args: InitArgs) -> Result<(), CommandError> {
    let location = args.store.resolve()?;
    let outcome = create_log(&location, args.window).await?;
    let (verb, committed) = match outcome {
        Initialized::Created(committed) => ("initialized", committed),
        Initialized::Existing(committed) => ("already initialized", committed),
    };
    let manifest = &committed.manifest;
    outln!(
        "{verb} log: {} replicas (quorum {}), window {}, register {}",
        manifest.replica_count(),
        manifest.quorum(),
        manifest.window,
        location.register
    )?;
    Ok(())
}

/// Creates the log at `location` (register and replica binding), or finds
/// it already there. Every remote location must answer (replicas probed, a
/// remote register connected) before anything is created on the local disk,
/// and every replica must pass the probe before the register is initialized:
/// a failure leaves nothing behind but, at most, PostgreSQL's (idempotent)
/// register table.
pub async fn create_log(location: &Location, window: u32) -> Result<Initialized, CommandError> {
    if !(1..=MAX_WINDOW).contains(&window) {
        return Err(format!("--window {window} is outside 1..={MAX_WINDOW}").into());
    }
    let (local, remote): (Vec<_>, Vec<_>) = location
        .replicas
        .iter()
        .partition(|replica| replica.local_dir().is_some());
    let mut stores = open_replicas(&remote).await?;
    let remote_register = match location.register.is_local() {
        true => None,
        false => Some(open_register_for_init(&location.register).await?),
    };
    if let Some(dir) = &location.data_dir {
        ensure_data_dir(dir)?;
    }
    stores.extend(open_replicas(&local).await?);
    let register = match remote_register {
        Some(register) => register,
        None => open_register_for_init(&location.register).await?,
    };
    let has_log = register
        .read()
        .await
        .map_err(|e| format!("cannot read register {}: {e}", location.register))?
        .is_some();
    if !has_log {
        refuse_replicas_with_data(&stores, location).await?;
    }
    Ok(
        initialize(register.as_ref(), location.replica_identities(), window)
            .await
            .map_err(|e| format!("cannot initialize register {}: {e}", location.register))?,
    )
}

/// Refuses to bind a new register to replicas that already hold a log: their
/// register was lost, or points elsewhere, and a fresh one would start the
/// log over on top of their data.
async fn refuse_replicas_with_data(
    stores: &[(&StoreUrl, DynBlobStore)],
    location: &Location,
) -> Result<(), CommandError> {
    for (url, store) in stores {
        let found = first_log_object(store)
            .await
            .map_err(|e| format!("cannot list replica {url}: {e}"))?;
        if let Some(key) = found {
            return Err(format!(
                "replica {url} already holds log data ({key}) but register {} holds no log; \
                 nothing was created: a new register would start the log over on top of it. \
                 Restore the register from a backup, or rebuild it with `chorus log \
                 recover-register` (docs/operations.md, \"Lost or corrupt register\")",
                location.register
            )
            .into());
        }
    }
    Ok(())
}

/// Opens and probes each of `replicas`.
async fn open_replicas<'a>(
    replicas: &[&'a StoreUrl],
) -> Result<Vec<(&'a StoreUrl, DynBlobStore)>, CommandError> {
    let mut opened = Vec::new();
    for replica in replicas {
        let store = open_store(replica)
            .await
            .map_err(|e| format!("cannot open replica {replica}: {e}"))?;
        opened.push((*replica, store));
    }
    Ok(opened)
}

pub(crate) async fn open_register_for_init(
    url: &RegisterUrl,
) -> Result<Arc<dyn ManifestStore>, CommandError> {
    open_register(url, OpenMode::CreateIfMissing)
        .await
        .map_err(|e| format!("cannot open register {url}: {e}").into())
}

async fn inspect(args: InspectArgs) -> Result<(), CommandError> {
    let location = args.store.resolve()?;
    let register = open_existing_register(&location, Access::Read).await?;
    let stored = read_manifest(register.as_ref(), &location).await?;
    let manifest = &stored.manifest;
    if manifest.trunc > manifest.tail_base {
        // A floor in the active segment must not pass its committed end;
        // checking that reads the replicas (which opening the log does).
        open_log(&location, Access::Read).await?;
    }
    let text = if args.json {
        format!("{}\n", inspect_json(&stored, &location))
    } else {
        inspect_text(&stored, &location)
    };
    out!("{text}")
}

fn inspect_json(stored: &StoredManifest, location: &Location) -> serde_json::Value {
    let manifest = &stored.manifest;
    let seal = manifest.seal.map(|seal| {
        json!({
            "id": seal.id.to_string(),
            "base": seal.base.0,
            "digest": seal.digest.to_string(),
        })
    });
    let segments: Vec<_> = manifest
        .segments
        .iter()
        .enumerate()
        .map(|(position, entry)| {
            json!({
                "id": entry.id.to_string(),
                "base": entry.base.0,
                "crc32c": format!("{:08x}", entry.crc32c),
                "tombstone": manifest.is_tombstone(position),
            })
        })
        .collect();
    json!({
        "register": location.register.to_string(),
        "version": stored.version,
        "format": stored.format,
        "epoch": manifest.epoch.0,
        "owner": owner(manifest),
        "replicas": manifest.replicas,
        "quorum": manifest.quorum(),
        "window": manifest.window,
        "tail": { "id": manifest.tail.to_string(), "base": manifest.tail_base.0 },
        "pending": manifest.pending.map(|id| id.to_string()),
        "seal": seal,
        "floor": manifest.trunc.0,
        "segments": segments,
    })
}

fn inspect_text(stored: &StoredManifest, location: &Location) -> String {
    let manifest = &stored.manifest;
    let mut out = String::new();
    let mut line = |key: &str, value: String| out.push_str(&format!("{key:<10} {value}\n"));
    line(
        "register",
        format!("{} (version {})", location.register, stored.version),
    );
    line("format", stored.format.to_string());
    line(
        "epoch",
        format!(
            "{} (owner {})",
            manifest.epoch,
            owner(manifest).unwrap_or("none".into())
        ),
    );
    line(
        "replicas",
        format!(
            "{} (quorum {})",
            manifest.replica_count(),
            manifest.quorum()
        ),
    );
    for (position, replica) in manifest.replicas.iter().enumerate() {
        line("", format!("{position}  {replica}"));
    }
    line("window", manifest.window.to_string());
    line(
        "tail",
        format!("{} base {}", manifest.tail, manifest.tail_base),
    );
    line(
        "pending",
        manifest.pending.map_or("none".into(), |id| id.to_string()),
    );
    line(
        "seal",
        manifest.seal.map_or("none".into(), |seal| {
            format!("{} base {} digest {}", seal.id, seal.base, seal.digest)
        }),
    );
    line("floor", manifest.trunc.to_string());
    line("directory", format!("{} entries", manifest.segments.len()));
    for (position, entry) in manifest.segments.iter().enumerate() {
        let tombstone = if manifest.is_tombstone(position) {
            " (tombstone)"
        } else {
            ""
        };
        line(
            "",
            format!(
                "{} base {} crc32c {:08x}{tombstone}",
                entry.id, entry.base, entry.crc32c
            ),
        );
    }
    out
}

fn owner(manifest: &Manifest) -> Option<String> {
    (manifest.owner != chorus::ids::OwnerId::NONE).then(|| manifest.owner.to_string())
}
