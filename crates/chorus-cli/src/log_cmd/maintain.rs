//! `chorus log truncate`, `log repair` and `log verify`: maintenance against a
//! log, with or without a live writer.

use chorus::ids::RecordIndex;
use chorus::log::Reader;
use chorus::log::maintenance::{Maintenance, VerifyReport};

use crate::CommandError;
use crate::config::StoreArgs;
use crate::open::{Access, open_log};
use crate::output::{out, outln};
use crate::progress::CliProgress;

/// Arguments of `log truncate`.
#[derive(Debug, clap::Args)]
pub struct TruncateArgs {
    #[command(flatten)]
    store: StoreArgs,

    /// The new floor: records below this index are deleted. Must not be below
    /// the current floor nor beyond the committed end.
    #[arg(long)]
    before: u64,
}

/// Arguments of `log repair`.
#[derive(Debug, clap::Args)]
pub struct RepairArgs {
    #[command(flatten)]
    store: StoreArgs,
}

/// Arguments of `log verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    store: StoreArgs,

    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Raises the floor, then deletes what lies wholly below it.
pub async fn truncate(args: TruncateArgs) -> Result<(), CommandError> {
    let log = open_log(&args.store.resolve()?, Access::Write).await?;
    let end = Reader::committed_end(&log.stores).await?;
    let maintenance = Maintenance::new(&log.stores);
    let report = maintenance
        .truncate_before(RecordIndex(args.before), end, &CliProgress::stderr())
        .await
        .map_err(|e| format!("cannot truncate: {e}"))?;
    outln!(
        "truncated: floor={} removed_segments={} deleted_objects={} tombstones_left={}",
        report.floor,
        report.removed.len(),
        report.deleted_objects,
        report.tombstones.len()
    )?;
    Ok(())
}

/// Heals sealed copies, finishes pending deletions and sweeps orphans.
pub async fn repair(args: RepairArgs) -> Result<(), CommandError> {
    let log = open_log(&args.store.resolve()?, Access::Write).await?;
    let maintenance = Maintenance::new(&log.stores);
    let progress = CliProgress::stderr();
    let repaired = maintenance.repair(&progress).await?;
    let manifest = maintenance.manifest().await?;
    let tombstones = maintenance.sweep_tombstones(&manifest, &progress).await?;
    let swept = maintenance.sweep_orphans(&progress).await?;
    outln!(
        "repaired: checked={} restored={} replaced={} tombstones_removed={} orphans_deleted={} failures={}",
        repaired.checked,
        repaired.restored,
        repaired.replaced,
        tombstones.removed.len(),
        swept.deleted,
        repaired.failures.len() + swept.failures.len()
    )?;
    let failures: Vec<String> = repaired
        .failures
        .into_iter()
        .chain(swept.failures)
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("repair incomplete: {}", failures.join("; ")).into())
    }
}

/// Reads every object of every replica and reports; non-zero on any problem.
pub async fn verify(args: VerifyArgs) -> Result<(), CommandError> {
    let log = open_log(&args.store.resolve()?, Access::Read).await?;
    let report = Maintenance::new(&log.stores)
        .verify(&CliProgress::stderr())
        .await?;
    if args.json {
        outln!(
            "{}",
            serde_json::to_string(&report).expect("reports encode")
        )?;
    } else {
        out!("{}", verify_text(&report))?;
    }
    if report.is_healthy() {
        Ok(())
    } else if report.replicas.iter().any(|r| r.has_problems()) {
        Err("verify found missing, corrupt or unreadable objects; run `chorus log repair`".into())
    } else if !report.below_quorum.is_empty() {
        Err(
            "verify found records held by fewer than a quorum of replicas; \
             repair cannot restore them (docs/protocol.md, \"What repair does not do\")"
                .into(),
        )
    } else {
        Err(
            "verify found active-segment fragments missing on some replicas (a quorum holds \
             them); the next rotation or recovery seals them onto every replica"
                .into(),
        )
    }
}

fn verify_text(report: &VerifyReport) -> String {
    let mut out = format!("sealed segments: {}\n", report.sealed_segments);
    for replica in &report.replicas {
        let verdict = if replica.has_problems() {
            "PROBLEMS"
        } else if replica.lacks_fragments() {
            "UNDER-REPLICATED"
        } else {
            "healthy"
        };
        out.push_str(&format!(
            "replica {} {}: {verdict}: healthy={} missing={} corrupt={} orphans={} fences={} tombstones={} errors={}\n",
            replica.position,
            replica.store,
            replica.healthy,
            replica.missing.len() + replica.missing_fragments.len(),
            replica.corrupt.len(),
            replica.orphans.len(),
            replica.fences,
            replica.tombstones,
            replica.errors.len()
        ));
        let details = replica.missing.iter().map(|k| ("missing", k));
        let details = details.chain(replica.missing_fragments.iter().map(|k| ("missing", k)));
        let details = details.chain(replica.corrupt.iter().map(|k| ("corrupt", k)));
        let details = details.chain(replica.errors.iter().map(|k| ("error", k)));
        for (kind, detail) in details {
            out.push_str(&format!("  {kind}: {detail}\n"));
        }
    }
    for run in &report.below_quorum {
        out.push_str(&format!("below quorum: {run}\n"));
    }
    out
}
