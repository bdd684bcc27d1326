//! The writer's background maintenance: repair, tombstone deletion and the
//! orphan sweep at start, every `repair_interval` and right after a degraded
//! seal; truncations merged to the highest requested floor; and refreshes of
//! the directory room while it is tight, so truncation by another process
//! unblocks a full directory.
//! Failures are counted and logged; they never reach appends.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::Shared;
use crate::ids::RecordIndex;
use crate::log::config::LogConfig;
use crate::log::error::LogError;
use crate::log::maintenance::{Maintenance, NoProgress, TruncateReport};

/// How often a writer whose directory is tight re-reads the register.
const TIGHT_DIRECTORY_REFRESH: Duration = Duration::from_secs(1);

/// Runs until the writer stops.
pub(super) async fn run(shared: Weak<Shared>, maintenance: Maintenance, config: LogConfig) {
    let mut next_repair = Some(tokio::time::Instant::now());
    loop {
        let Some(current) = shared.upgrade() else {
            return;
        };
        if current.admission().stopped.is_some() {
            return;
        }
        if next_repair.is_some_and(|due| tokio::time::Instant::now() >= due) {
            repair_and_sweep(&maintenance).await;
            next_repair = config
                .repair_interval
                .map(|every| tokio::time::Instant::now() + every);
        }
        if !current.admission().directory.fits(2) {
            refresh_directory(&current, &maintenance).await;
        }
        let repair_wanted = Arc::clone(&current);
        drop(current);
        let wait = next_repair
            .map(|due| due.saturating_duration_since(tokio::time::Instant::now()))
            .unwrap_or(TIGHT_DIRECTORY_REFRESH)
            .min(TIGHT_DIRECTORY_REFRESH);
        tokio::select! {
            _ = repair_wanted.repair_wanted.notified() => next_repair = Some(tokio::time::Instant::now()),
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

async fn repair_and_sweep(maintenance: &Maintenance) {
    match maintenance.repair(&NoProgress).await {
        Ok(report) if report.restored + report.replaced > 0 => tracing::info!(
            restored = report.restored,
            replaced = report.replaced,
            "repair healed sealed copies"
        ),
        Ok(_) => {}
        Err(error) => super::super::maintenance::failed("repair", &error),
    }
    // Tombstones a failed truncation left behind are finished here too.
    let tombstones = match maintenance.manifest().await {
        Ok(manifest) => maintenance
            .sweep_tombstones(&manifest, &NoProgress)
            .await
            .map(drop),
        Err(error) => Err(error),
    };
    if let Err(error) = tombstones {
        super::super::maintenance::failed("truncate", &error);
    }
    if let Err(error) = maintenance.sweep_orphans(&NoProgress).await {
        super::super::maintenance::failed("sweep", &error);
    }
}

/// Re-reads the directory room from the register.
pub(super) async fn refresh_directory(shared: &Shared, maintenance: &Maintenance) {
    match maintenance.manifest().await {
        Ok(manifest) => shared.admission().directory.refresh(&manifest),
        Err(error) => super::super::maintenance::failed("directory_refresh", &error),
    }
}

/// Serialises truncations and merges the ones queued meanwhile into the
/// highest requested floor.
#[derive(Debug, Default)]
pub(super) struct Truncations {
    requested: std::sync::Mutex<Queued>,
    running: tokio::sync::Mutex<Option<TruncateReport>>,
}

/// The floors waiting for, and running in, the truncation lock.
#[derive(Debug, Default)]
struct Queued {
    /// The highest floor requested and not yet taken by a pass.
    waiting: Option<RecordIndex>,
    /// The floor of the pass holding the lock, if any.
    running: Option<RecordIndex>,
}

impl Truncations {
    /// Truncates below `floor` (at most `durable_end`), or joins a queued or
    /// running truncation to a floor at least as high.
    pub(super) async fn truncate(
        &self,
        shared: &Shared,
        maintenance: &Maintenance,
        floor: RecordIndex,
    ) -> Result<TruncateReport, LogError> {
        {
            let mut queued = self.requested.lock().expect("truncation queue poisoned");
            // A floor at or below the running pass's merges into that pass.
            if queued.running.is_none_or(|running| running < floor) {
                queued.waiting = Some(queued.waiting.map_or(floor, |w| w.max(floor)));
            }
        }
        let mut last = self.running.lock().await;
        let target = {
            let mut queued = self.requested.lock().expect("truncation queue poisoned");
            // Nothing waiting: another caller ran our floor (or a higher one)
            // while we waited, unless that pass failed; then we run our own.
            let target = queued.waiting.take().or_else(|| match last.as_ref() {
                Some(report) if report.floor >= floor => None,
                _ => Some(floor),
            });
            queued.running = target;
            target
        };
        let Some(target) = target else {
            return Ok(last.clone().expect("a merged truncation left its report"));
        };
        let durable_end = shared.admission().durable_end;
        let outcome = maintenance
            .truncate_before(target, durable_end, &NoProgress)
            .await;
        self.requested
            .lock()
            .expect("truncation queue poisoned")
            .running = None;
        let report = outcome?;
        refresh_directory(shared, maintenance).await;
        *last = Some(report.clone());
        Ok(report)
    }
}
