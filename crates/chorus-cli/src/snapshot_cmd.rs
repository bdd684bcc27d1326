//! `chorus snapshot …`: list, publish and restore a database's snapshots.
//!
//! `publish` acts as a short-lived writer: it takes the writer lease, boots a
//! publication store (observe, claim), publishes, runs retention and releases
//! the lease, so it is fenced exactly like a runtime would be.

use std::io::Write;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use chorus::blob::DynBlobStore;
use chorus::clock::SystemClock;
use chorus::ids::RecordIndex;
use chorus::lease::{Contender, LeaseConfig, LeaseHolder, Term};
use chorus::snapshot::{
    ClaimOutcome, DEFAULT_KEEP_PAYLOADS, Head, NewSnapshot, SnapshotConfig, SnapshotStore,
    StoredPayload,
};
use serde_json::json;

use crate::CommandError;
use crate::config::{DatabaseArgs, DatabaseLocation};
use crate::lease_cmd::{HolderArgs, lease_store, open_for_read, open_for_write};
use crate::output::{out, outln};

/// The `snapshot` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCommand {
    /// List the payloads and what HEAD points at.
    List(ListArgs),
    /// Publish a file as the current snapshot (takes the writer lease for the call).
    Publish(PublishArgs),
    /// Download the current snapshot into a file, verifying its checksum.
    Restore(RestoreArgs),
}

/// Arguments of `snapshot list`.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    database: DatabaseArgs,

    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Arguments of `snapshot publish`.
#[derive(Debug, clap::Args)]
pub struct PublishArgs {
    #[command(flatten)]
    database: DatabaseArgs,

    #[command(flatten)]
    holder: HolderArgs,

    /// The payload to publish.
    #[arg(long)]
    file: PathBuf,

    /// Log index replay resumes at: the snapshot reflects every record below it.
    #[arg(long)]
    wal_index: u64,

    /// Lease term [default: the stored lease's term, or 1].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    term: Option<u64>,

    /// How long the lease taken for this call lasts; the upload must finish
    /// well within it (the holder stops a fifth of it early).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    lease_ttl_secs: u64,

    /// Allow a --wal-index below the current HEAD's. Replay then resumes
    /// below what HEAD's state reflects; only for replacing the state on purpose.
    #[arg(long)]
    allow_rewind: bool,

    /// Newest payloads retention keeps (HEAD's payload is kept even when older).
    #[arg(long, default_value_t = DEFAULT_KEEP_PAYLOADS)]
    keep: NonZeroUsize,
}

/// Arguments of `snapshot restore`.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    database: DatabaseArgs,

    /// Where to write the payload (replaced atomically once verified).
    #[arg(long)]
    to: PathBuf,
}

impl SnapshotCommand {
    /// Runs the command.
    pub async fn run(self) -> Result<(), CommandError> {
        match self {
            SnapshotCommand::List(args) => list(args).await,
            SnapshotCommand::Publish(args) => publish(args).await,
            SnapshotCommand::Restore(args) => restore(args).await,
        }
    }
}

fn snapshot_store(store: DynBlobStore, location: &DatabaseLocation) -> SnapshotStore {
    SnapshotStore::new(
        store,
        location.database.clone(),
        SnapshotConfig::default(),
        SystemClock::shared(),
    )
}

/// The lease timing of a CLI call: a fifth of the ttl as safety margin, and
/// store calls bounded by a quarter of it.
fn lease_config(ttl_secs: u64) -> LeaseConfig {
    let ttl = Duration::from_secs(ttl_secs);
    LeaseConfig {
        ttl,
        safety_margin: ttl / 5,
        store_call_timeout: ttl / 4,
    }
}

async fn list(args: ListArgs) -> Result<(), CommandError> {
    let location = args.database.resolve()?;
    let (head, payloads) = match open_for_read(&location)? {
        Some(store) => {
            let snapshots = snapshot_store(store, &location);
            let head = snapshots
                .read_head()
                .await
                .map_err(|e| format!("cannot read HEAD: {e}"))?;
            let listed = snapshots
                .list()
                .await
                .map_err(|e| format!("cannot list snapshots: {e}"))?;
            // One damaged payload is shown as such; the listing goes on.
            let mut payloads = Vec::new();
            for payload in listed {
                let damage = snapshots.check_payload(&payload).await.err();
                payloads.push((payload, damage.map(|e| e.to_string())));
            }
            (head.map(|current| current.head), payloads)
        }
        None => (None, Vec::new()),
    };
    if args.json {
        outln!("{}", list_json(&location, head.as_ref(), &payloads))?;
    } else {
        out!("{}", list_text(&location, head.as_ref(), &payloads))?;
    }
    Ok(())
}

fn head_json(head: &Head) -> serde_json::Value {
    json!({
        "snapshot_key": head.snapshot_key(),
        "publication_sequence": head.publication_sequence.0,
        "wal_index": head.wal_index.0,
        "payload_size_bytes": head.payload_size_bytes,
        "payload_sha256": head.payload_sha256.to_string(),
        "holder_id": head.holder_id.as_str(),
        "term": head.term.0,
        "lease_generation": head.lease_generation.0,
        "updated_at_ms": head.updated_at_ms,
    })
}

/// A listed payload and, if it cannot be read, why.
type Listed = (StoredPayload, Option<String>);

fn list_json(
    location: &DatabaseLocation,
    head: Option<&Head>,
    payloads: &[Listed],
) -> serde_json::Value {
    let payloads: Vec<_> = payloads
        .iter()
        .map(|(payload, damage)| {
            json!({
                "key": payload.key,
                "generation": payload.id.generation.0,
                "sequence": payload.id.sequence.0,
                "size_bytes": payload.size_bytes,
                "head": head.is_some_and(|head| head.snapshot == payload.id),
                "damaged": damage,
            })
        })
        .collect();
    json!({
        "store": location.store.to_string(),
        "database": location.database.as_str(),
        "head": head.map(head_json),
        "payloads": payloads,
    })
}

fn list_text(location: &DatabaseLocation, head: Option<&Head>, payloads: &[Listed]) -> String {
    let mut out = String::new();
    let mut line = |key: &str, value: String| out.push_str(&format!("{key:<9} {value}\n"));
    line("store", location.store.to_string());
    line("database", location.database.to_string());
    match head {
        None => line("head", "none (nothing published)".to_owned()),
        Some(head) => {
            line(
                "head",
                format!(
                    "{} (sequence {}, wal_index {}, {} bytes)",
                    head.snapshot_key(),
                    head.publication_sequence,
                    head.wal_index,
                    head.payload_size_bytes
                ),
            );
            line("sha256", head.payload_sha256.to_string());
            line(
                "stamp",
                format!(
                    "holder {} term {} generation {}",
                    head.holder_id, head.term, head.lease_generation
                ),
            );
        }
    }
    line("payloads", payloads.len().to_string());
    for (payload, damage) in payloads {
        let marker = if head.is_some_and(|head| head.snapshot == payload.id) {
            "  HEAD"
        } else {
            ""
        };
        let damage = damage
            .as_ref()
            .map(|why| format!("  DAMAGED: {why}"))
            .unwrap_or_default();
        line(
            "",
            format!(
                "{}  {} bytes{marker}{damage}",
                payload.key, payload.size_bytes
            ),
        );
    }
    out
}

async fn publish(args: PublishArgs) -> Result<(), CommandError> {
    let location = args.database.resolve()?;
    let holder = args.holder.resolve()?;
    let bytes = std::fs::read(&args.file)
        .map_err(|e| format!("cannot read {}: {e}", args.file.display()))?;
    let store = open_for_write(&location).await?;
    let leases = lease_store(store.clone(), &location, lease_config(args.lease_ttl_secs))?;
    let contender = Contender::new(holder);
    let acquired = match args.term {
        Some(term) => leases.acquire(&contender, Term(term)).await,
        None => leases.acquire_at_stored_term(&contender).await,
    };
    let lease = acquired.map_err(|e| format!("cannot publish snapshot: {e}"))?;
    let snapshot = NewSnapshot {
        bytes: Bytes::from(bytes),
        wal_index: RecordIndex(args.wal_index),
    };
    let snapshots = snapshot_store(store, &location);
    // Nothing refreshes the lease during the call: once it may no longer
    // write, nothing more can be published, so a stalled store call is not
    // worth waiting for (its own timeout and retries take minutes).
    let budget = lease.remaining(std::time::Instant::now());
    let publishing = publish_under(&lease, &snapshots, snapshot, args.allow_rewind);
    let Ok(published) = tokio::time::timeout(budget, publishing).await else {
        // A cancelled store call may still land: the lease is left to expire
        // rather than released, so no next writer starts before it could.
        return Err(format!(
            "cannot publish snapshot: the lease (--lease-ttl-secs {}) ran out before the store \
             answered; HEAD may or may not name the new payload (see `chorus snapshot list`); \
             the lease is left to expire",
            args.lease_ttl_secs
        )
        .into());
    };
    // Release even after a failure, so the next writer need not wait out the ttl.
    let released = lease.release().await;
    let head = published.map_err(|e| format!("cannot publish snapshot: {e}"))?;
    outln!(
        "published snapshot {}: sequence {}, wal_index {}, {} bytes, sha256 {}, holder {} generation {}",
        head.snapshot_key(),
        head.publication_sequence,
        head.wal_index,
        head.payload_size_bytes,
        head.payload_sha256,
        head.holder_id,
        head.lease_generation
    )?;
    released.map_err(|e| format!("published, but cannot release the lease: {e}"))?;
    // Retention needs no lease: it deletes only payloads below HEAD's sequence.
    // The exit status says whether the publication happened; a retention
    // failure is reported and left to the next publish.
    match snapshots.retain(args.keep).await {
        Ok(report) if !report.deleted.is_empty() => {
            outln!("retention deleted {} old payload(s)", report.deleted.len())?
        }
        Ok(_) => {}
        Err(error) => eprintln!("chorus: warning: published, but retention failed: {error}"),
    }
    Ok(())
}

/// Boots a publication store under `lease` and publishes `snapshot`: on the
/// first boot the claim itself installs it; otherwise claim, then publish.
/// A rewind is refused before the claim, so a refused publish changes nothing.
async fn publish_under(
    lease: &LeaseHolder,
    snapshots: &SnapshotStore,
    snapshot: NewSnapshot,
    allow_rewind: bool,
) -> Result<Head, CommandError> {
    let mut publication = snapshots.publication();
    let observed = publication.observe_for_boot().await?;
    if let Some(head) = observed
        && !allow_rewind
        && snapshot.wal_index < head.wal_index
    {
        return Err(format!(
            "refusing to move HEAD's wal_index back from {} to {}: replay would resume below \
             what the current snapshot reflects (--allow-rewind to do it anyway)",
            head.wal_index, snapshot.wal_index
        )
        .into());
    }
    Ok(
        match publication.claim(lease, Some(snapshot.clone())).await? {
            ClaimOutcome::Installed(head) => head,
            ClaimOutcome::Adopted(_) if allow_rewind => {
                publication.publish_rewinding(lease, snapshot).await?
            }
            ClaimOutcome::Adopted(_) => publication.publish(lease, snapshot).await?,
        },
    )
}

async fn restore(args: RestoreArgs) -> Result<(), CommandError> {
    let location = args.database.resolve()?;
    let nothing = || {
        format!(
            "no snapshot published: database={} store={}",
            location.database, location.store
        )
    };
    let store = open_for_read(&location)?.ok_or_else(nothing)?;
    let (head, bytes) = snapshot_store(store, &location)
        .restore()
        .await
        .map_err(|e| format!("cannot restore snapshot: {e}"))?
        .ok_or_else(nothing)?;
    write_atomically(&args.to, &bytes)
        .map_err(|e| format!("cannot write {}: {e}", args.to.display()))?;
    outln!(
        "restored snapshot {} to {}: {} bytes, wal_index {}, sha256 {} verified",
        head.snapshot_key(),
        args.to.display(),
        bytes.len(),
        head.wal_index,
        head.payload_sha256
    )?;
    Ok(())
}

/// Writes `bytes` to a temporary file beside `path`, syncs it and renames it
/// over `path`, so `path` is never left half-written.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path"))?;
    let mut staging_name = std::ffi::OsString::from(".");
    staging_name.push(name);
    staging_name.push(format!(".chorus-restore-{}", std::process::id()));
    let staging = path.with_file_name(staging_name);
    let mut file = std::fs::File::create(&staging)?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    if let Err(error) = written.and_then(|()| std::fs::rename(&staging, path)) {
        let _ = std::fs::remove_file(&staging);
        return Err(error);
    }
    Ok(())
}
