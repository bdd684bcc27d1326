//! When the primary publishes a snapshot: a pure decision on what was
//! applied since the newest one.
//!
//! A snapshot costs its whole size (encoding, digest, upload), however few
//! records it adds, while replay after a restart costs the log since the
//! last one. A snapshot is therefore due once enough records arrived
//! (`snapshot_every_records`) *and* the log since the last snapshot holds
//! at least `snapshot_min_log_percent` of that snapshot's bytes, so that
//! publishing snapshots never writes more than that share of the log's own
//! bytes, however large the state grows; or, whatever the counts, once
//! `snapshot_interval` passed with anything new.

use std::time::Duration;

use super::config::RuntimeConfig;

/// What was applied since the newest snapshot, and how long ago the last
/// publication started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SinceSnapshot {
    /// Records applied since.
    pub(super) records: u64,
    /// Their bytes, as far as this process counted them.
    pub(super) log_bytes: u64,
    /// The newest snapshot's payload size (0 when there is none).
    pub(super) snapshot_bytes: u64,
    /// Time since the last publication started (or serving did).
    pub(super) elapsed: Duration,
}

/// Whether a snapshot is due under `config`; see the module docs.
pub(super) fn snapshot_due(config: &RuntimeConfig, since: &SinceSnapshot) -> bool {
    if since.records == 0 {
        return false;
    }
    if since.elapsed >= config.snapshot_interval {
        return true;
    }
    let log_share = u128::from(since.log_bytes) * 100;
    let wanted = u128::from(since.snapshot_bytes) * u128::from(config.snapshot_min_log_percent);
    since.records >= config.snapshot_every_records && log_share >= wanted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::HolderId;

    fn config(every_records: u64, min_log_percent: u32) -> RuntimeConfig {
        RuntimeConfig {
            snapshot_every_records: every_records,
            snapshot_min_log_percent: min_log_percent,
            snapshot_interval: Duration::from_secs(300),
            ..RuntimeConfig::new(HolderId::new("schedule").unwrap())
        }
    }

    fn since(
        records: u64,
        log_bytes: u64,
        snapshot_bytes: u64,
        elapsed_secs: u64,
    ) -> SinceSnapshot {
        SinceSnapshot {
            records,
            log_bytes,
            snapshot_bytes,
            elapsed: Duration::from_secs(elapsed_secs),
        }
    }

    #[test]
    fn nothing_new_is_never_due() {
        for percent in [0, 100, 400] {
            assert!(!snapshot_due(&config(1, percent), &since(0, 0, 0, 10_000)));
        }
    }

    #[test]
    fn by_records_alone_when_the_share_is_zero() {
        let config = config(100, 0);
        assert!(!snapshot_due(&config, &since(99, 1, u64::MAX, 0)));
        assert!(snapshot_due(&config, &since(100, 1, u64::MAX, 0)));
    }

    #[test]
    fn records_and_the_logs_share_of_the_snapshot_are_both_needed() {
        let config = config(100, 100);
        // Enough records, too few bytes for a 1 MB snapshot.
        assert!(!snapshot_due(&config, &since(1_000, 999_999, 1_000_000, 0)));
        assert!(snapshot_due(
            &config,
            &since(1_000, 1_000_000, 1_000_000, 0)
        ));
        // Enough bytes, too few records.
        assert!(!snapshot_due(&config, &since(99, 10_000_000, 1_000_000, 0)));
        // Half the snapshot at 50 %.
        let half = self::config(100, 50);
        assert!(!snapshot_due(&half, &since(100, 499_999, 1_000_000, 0)));
        assert!(snapshot_due(&half, &since(100, 500_000, 1_000_000, 0)));
        // No snapshot yet: records alone.
        assert!(snapshot_due(&config, &since(100, 0, 0, 0)));
    }

    #[test]
    fn the_interval_overrides_both_counts() {
        let config = config(100, 100);
        assert!(!snapshot_due(&config, &since(1, 1, 1_000_000, 299)));
        assert!(snapshot_due(&config, &since(1, 1, 1_000_000, 300)));
    }

    #[test]
    fn extreme_sizes_do_not_overflow() {
        let config = config(1, u32::MAX);
        assert!(!snapshot_due(&config, &since(1, u64::MAX, u64::MAX, 0)));
        assert!(snapshot_due(&config, &since(1, u64::MAX, 0, 0)));
    }
}
