//! How the Chorus WAL behaves under SlateDB.

use std::time::Duration;

use chorus::log::LogConfig;

/// Settings of a [`ChorusWal`](crate::ChorusWal).
#[derive(Debug, Clone)]
pub struct ChorusWalOptions {
    /// The Chorus writer's configuration (fragment sizes, window pacing,
    /// segment size, timeouts).
    pub log: LogConfig,
    /// How long closing waits for appended batches to become durable.
    pub shutdown_timeout: Duration,
    /// WAL bytes after the newest memtable flush above which the WAL asks
    /// SlateDB to flush its memtable: bounds what a restart replays.
    pub max_unflushed_bytes: u64,
}

impl Default for ChorusWalOptions {
    fn default() -> ChorusWalOptions {
        ChorusWalOptions {
            log: LogConfig::default(),
            shutdown_timeout: Duration::from_secs(30),
            max_unflushed_bytes: 64 << 20,
        }
    }
}
