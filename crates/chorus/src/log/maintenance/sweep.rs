//! The orphan sweep: deletes objects under the log prefixes that belong to no
//! live or sealed segment and can never become named (see `classify`).
//! Never anything the register names, never a fence, never a foreign key.

use super::classify::{ObjectClass, classify};
use super::{Maintenance, Progress, delete_all, failed};
use crate::log::error::LogError;
use crate::log::layout::{SEALED_PREFIX, SEGMENTS_PREFIX};

/// What a sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Orphans deleted.
    pub deleted: usize,
    /// Failures (listing or deleting), with why.
    pub failures: Vec<String>,
}

impl Maintenance {
    /// Deletes orphans on every replica.
    pub async fn sweep_orphans(&self, progress: &dyn Progress) -> Result<SweepReport, LogError> {
        // Read the register first: anything named later is newer than this
        // view and is classified as active (see `classify`).
        let manifest = self.manifest().await?;
        let mut report = SweepReport::default();
        progress.begin("sweeping orphans", self.replicas.len() as u64);
        for replica in &self.replicas {
            for prefix in [SEGMENTS_PREFIX, SEALED_PREFIX] {
                let listed = match replica.store.list(prefix).await {
                    Ok(listed) => listed,
                    Err(error) => {
                        failed("sweep", &format!("{replica:?}: {error}"));
                        report
                            .failures
                            .push(format!("replica {}: {error}", replica.position));
                        continue;
                    }
                };
                let orphans: Vec<String> = listed
                    .into_iter()
                    .filter(|meta| classify(&manifest, &meta.key, meta.size) == ObjectClass::Orphan)
                    .map(|meta| meta.key)
                    .collect();
                for (key, outcome) in delete_all(&replica.store, orphans).await {
                    match outcome {
                        Ok(()) => report.deleted += 1,
                        Err(error) => {
                            failed("sweep", &format!("{replica:?}: {error}"));
                            report
                                .failures
                                .push(format!("replica {}: {key}: {error}", replica.position));
                        }
                    }
                }
            }
            progress.advance(1);
        }
        progress.end();
        metrics::counter!("chorus_sweep_deleted_total").increment(report.deleted as u64);
        Ok(report)
    }
}
