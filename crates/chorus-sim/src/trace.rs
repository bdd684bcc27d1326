//! The event trace of one run and its digest.
//!
//! Every decision and every observation (actions, acks, errors, recoveries,
//! reads, with indices, byte checksums and virtual timestamps) is hashed in
//! order. Two runs of one seed must produce the same digest; a difference is
//! nondeterminism in the system under test or in the simulator.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use sha2::{Digest, Sha256};

/// How many recent events a failure report shows.
const RECENT_EVENTS: usize = 40;

/// A running digest of events, with the most recent ones kept for reports.
#[derive(Debug, Clone)]
pub struct Trace {
    hasher: Sha256,
    events: u64,
    recent: VecDeque<String>,
    verbose: bool,
}

impl Trace {
    /// An empty trace; `verbose` also prints every event to stderr.
    pub fn new(verbose: bool) -> Trace {
        Trace {
            hasher: Sha256::new(),
            events: 0,
            recent: VecDeque::with_capacity(RECENT_EVENTS),
            verbose,
        }
    }

    /// Records one event at virtual time `now` during `step`.
    pub fn event(&mut self, step: u64, now: Duration, what: impl fmt::Display) {
        let line = format!("{step} {}us {what}", now.as_micros());
        self.hasher.update(line.as_bytes());
        self.hasher.update(b"\n");
        self.events += 1;
        if self.verbose {
            eprintln!("{line}");
        }
        if self.recent.len() == RECENT_EVENTS {
            self.recent.pop_front();
        }
        self.recent.push_back(line);
    }

    /// The digest of every event so far.
    pub fn digest(&self) -> [u8; 32] {
        self.hasher.clone().finalize().into()
    }

    /// Events recorded so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// The most recent events, oldest first.
    pub fn recent(&self) -> Vec<String> {
        self.recent.iter().cloned().collect()
    }
}

/// A short, stable label for a record's bytes: length and CRC32C.
pub fn label(bytes: &[u8]) -> String {
    format!("{}b/{:08x}", bytes.len(), crc32c::crc32c(bytes))
}
