//! Where a runtime's state lives and how it behaves.

use std::num::NonZeroUsize;
use std::time::Duration;

use crate::lease::{HolderId, Incarnation, LeaseStore};
use crate::log::{LogConfig, LogStores};
use crate::snapshot::{DEFAULT_KEEP_PAYLOADS, SnapshotStore};

/// Default of [`RuntimeConfig::history_records`].
pub const DEFAULT_HISTORY_RECORDS: usize = 10_000;
/// Default of [`RuntimeConfig::history_bytes`]: 64 MiB, the writer's default
/// in-flight budget, so a history of large values costs no more than that.
pub const DEFAULT_HISTORY_BYTES: usize = 64 << 20;

/// Default of [`RuntimeConfig::snapshot_min_log_percent`].
pub const DEFAULT_SNAPSHOT_MIN_LOG_PERCENT: u32 = 100;

/// The stores of one database: its log, its snapshots and its writer lease.
#[derive(Debug, Clone)]
pub struct RuntimeStores {
    /// The replicated log.
    pub log: LogStores,
    /// Snapshot payloads and `HEAD.json`.
    pub snapshots: SnapshotStore,
    /// The writer lease (its timing is the lease store's config).
    pub leases: LeaseStore,
}

/// How a runtime behaves. Every duration and count has a default that suits
/// a service on object storage; see each field for its trade-off.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// This process's name in the lease: the deployment slot it fills, shown
    /// in status and named to clients a standby redirects. Safety does not
    /// rest on it being unique: the runtime adds a random incarnation to the
    /// lease it writes, and only that incarnation re-acquires a live lease
    /// without waiting (a reboot after a lost lease or failed writer);
    /// another process, even under the same holder id, waits for expiry.
    pub holder: HolderId,
    /// The incarnation the runtime writes into the lease; `None` (the
    /// default) draws a random one at start. Set it only to make a run
    /// reproducible (simulations, tests): two processes given the same
    /// incarnation are one contender to the lease, which is the very
    /// confusion the incarnation exists to prevent.
    pub incarnation: Option<Incarnation>,
    /// The log's write-path settings.
    pub log: LogConfig,
    /// Publish a snapshot once this many records were applied since the last
    /// one (and [`snapshot_min_log_percent`](Self::snapshot_min_log_percent)
    /// allows). Lower: faster restarts and shorter logs, more uploads.
    pub snapshot_every_records: u64,
    /// …and once the log since the last snapshot holds at least this
    /// percentage of that snapshot's bytes: a snapshot costs its whole size
    /// however few records it adds, so at 100 publishing snapshots writes
    /// at most as many bytes as the log itself, and a restart replays at
    /// most about one snapshot's worth of log. 0: by record count alone.
    pub snapshot_min_log_percent: u32,
    /// Publish a snapshot at least this often while records arrive.
    pub snapshot_interval: Duration,
    /// Snapshot payloads retention keeps (HEAD's is always kept).
    pub keep_payloads: NonZeroUsize,
    /// Take the lease over even while another process's lease is live (a
    /// higher term fences it), on the runtime's first acquisition only; a
    /// later reboot waits like any contender. For an operator who knows the
    /// holder is gone: until its own deadline passes, that holder still
    /// believes it may serve.
    pub force: bool,
    /// How often a caught-up standby polls the log for new records.
    pub standby_poll_interval: Duration,
    /// How often a standby reads the lease to see whether it expired. With
    /// the lease ttl, this bounds the takeover time.
    pub lease_check_interval: Duration,
    /// The bound on a graceful shutdown before it releases the lease: the
    /// drain of admitted writes and the final snapshot together. A snapshot
    /// upload in flight at the stop is abandoned at once and the final
    /// snapshot at this bound (the next primary publishes its own), so a
    /// slow snapshot store never holds the lease from a standby.
    pub drain_timeout: Duration,
    /// Applied records kept in memory for watchers that resume from an index or
    /// a revision (0: none). More lets a watcher resume from further back instead of
    /// re-listing; each costs its record's bytes, bounded by `history_bytes`.
    pub history_records: usize,
    /// Record bytes the history keeps: it drops its oldest changes while it
    /// holds more than this or more than `history_records`. At least
    /// `log.max_record_bytes` while there is a history, so the newest record
    /// always fits. A record the history holds may keep alive the fragment
    /// or sealed segment it was read from (on a standby), so the memory
    /// bound is this plus one segment.
    pub history_bytes: usize,
    /// Pause after a failed boot step before trying again; it doubles with
    /// each consecutive failure, up to 30 s.
    pub retry_backoff: Duration,
}

impl RuntimeConfig {
    /// The defaults for `holder`.
    pub fn new(holder: HolderId) -> RuntimeConfig {
        RuntimeConfig {
            holder,
            incarnation: None,
            log: LogConfig::default(),
            snapshot_every_records: 100_000,
            snapshot_min_log_percent: DEFAULT_SNAPSHOT_MIN_LOG_PERCENT,
            snapshot_interval: Duration::from_secs(300),
            keep_payloads: DEFAULT_KEEP_PAYLOADS,
            force: false,
            standby_poll_interval: Duration::from_millis(100),
            lease_check_interval: Duration::from_millis(500),
            drain_timeout: Duration::from_secs(10),
            history_records: DEFAULT_HISTORY_RECORDS,
            history_bytes: DEFAULT_HISTORY_BYTES,
            retry_backoff: Duration::from_secs(1),
        }
    }

    /// Checks the relations between settings.
    pub fn validate(&self) -> Result<(), String> {
        self.log.validate().map_err(|e| e.to_string())?;
        if self.snapshot_every_records == 0 {
            return Err("snapshot_every_records must be at least 1".into());
        }
        if self.history_records > 0 && (self.history_bytes as u64) < self.log.max_record_bytes {
            return Err(format!(
                "history_bytes {} is below max_record_bytes {}: the newest record would not fit",
                self.history_bytes, self.log.max_record_bytes
            ));
        }
        if self.snapshot_interval.is_zero() {
            return Err("snapshot_interval must be non-zero".into());
        }
        for (name, value) in [
            ("standby_poll_interval", self.standby_poll_interval),
            ("lease_check_interval", self.lease_check_interval),
            ("retry_backoff", self.retry_backoff),
        ] {
            if value.is_zero() {
                return Err(format!("{name} must be non-zero"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_budget_holds_at_least_one_record() {
        let mut config = RuntimeConfig::new(HolderId::new("http://a:1").unwrap());
        assert!(config.validate().is_ok());
        config.history_bytes = config.log.max_record_bytes as usize - 1;
        let error = config.validate().unwrap_err();
        assert!(error.contains("history_bytes"), "{error}");
        // Without a history there is nothing to fit.
        config.history_records = 0;
        assert!(config.validate().is_ok());
    }
}
