//! How the Chorus WAL behaves under SlateDB.

use std::time::Duration;

use chorus::codec::FRAME_HEADER_BYTES;
use chorus::log::LogConfig;

/// Settings of a [`ChorusWal`](crate::ChorusWal).
#[derive(Debug, Clone)]
pub struct ChorusWalOptions {
    /// The Chorus writer's configuration (fragment sizes, window pacing,
    /// segment size, timeouts). Its `max_record_bytes` bounds one write
    /// batch: a larger one stops the database with an error naming it.
    pub log: LogConfig,
    /// How long closing the WAL waits for appended batches, queued or in
    /// flight, to become durable; past it, the rest fail and close reports
    /// an error naming this setting. (SlateDB's `Db::close` first flushes
    /// the WAL without a bound of its own.)
    pub shutdown_timeout: Duration,
    /// Acknowledged WAL bytes after the newest frozen memtable at or above
    /// which the WAL asks SlateDB to flush its memtable: bounds what a
    /// restart replays.
    pub max_unflushed_bytes: u64,
}

impl Default for ChorusWalOptions {
    fn default() -> ChorusWalOptions {
        let log = LogConfig::default();
        ChorusWalOptions {
            // SlateDB cannot split a write batch, so a record may fill a
            // whole fragment (4 MiB) instead of the log's default 1 MiB.
            log: LogConfig {
                max_record_bytes: log.max_fragment_bytes - FRAME_HEADER_BYTES as u64,
                ..log
            },
            shutdown_timeout: Duration::from_secs(30),
            max_unflushed_bytes: 64 << 20,
        }
    }
}
