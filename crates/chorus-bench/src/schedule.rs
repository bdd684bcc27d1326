//! Open-loop schedules: when each record of a cell is due, how many records a
//! cell has, and which offered rates a sweep visits.

use std::time::Duration;

/// Offered rates of the full sweep, records per second: steps of about 1.5-2x
/// where the systems part ways, up to 150,000 records/s (614 MB/s of 4 KiB
/// records) to find the peak.
pub const FULL_RATES: [f64; 12] = [
    100.0, 300.0, 1e3, 2e3, 3e3, 5e3, 1e4, 2e4, 3e4, 5e4, 1e5, 1.5e5,
];

/// Offered rates of the full run's scenarios other than `fixed`: light,
/// moderate and heavy load, enough to see what the quorum hides.
pub const TAIL_RATES: [f64; 3] = [100.0, 1e3, 1e4];

/// Offered rates of `--quick`.
pub const QUICK_RATES: [f64; 3] = [100.0, 3e3, 3e4];

/// When record `index` is due, measured from the cell's start, at `rate`
/// records per second: evenly spaced, the first at once.
pub fn due(index: u64, rate: f64) -> Duration {
    Duration::from_secs_f64(index as f64 / rate)
}

/// How long a cell runs and how much it may write.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CellLength {
    /// Shortest cell.
    pub min: Duration,
    /// Longest cell.
    pub max: Duration,
    /// Records a cell aims for, so that slow rates still yield a p99.9.
    pub target_records: u64,
    /// Most record bytes one cell writes: every byte stays in the in-memory
    /// stores until the cell ends, once per replica.
    pub max_bytes: u64,
}

impl CellLength {
    /// Records in a cell at `rate`: `target_records`, stretched or cut to
    /// last between `min` and `max`, then cut to `max_bytes`; at least one.
    pub fn records(&self, rate: f64, record_bytes: u64) -> u64 {
        let span = |duration: Duration| (rate * duration.as_secs_f64()).round() as u64;
        let by_time = self.target_records.clamp(span(self.min), span(self.max));
        let by_bytes = self.max_bytes / record_bytes.max(1);
        by_time.min(by_bytes).max(1)
    }
}

/// Records at the start of a cell that are written but left out of the
/// latency percentiles: the first tenth, while a fresh system warms up.
pub fn warmup(records: u64) -> u64 {
    records / 10
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const FULL: CellLength = CellLength {
        min: Duration::from_secs(3),
        max: Duration::from_secs(10),
        target_records: 2000,
        max_bytes: 512 << 20,
    };

    #[test]
    fn records_are_spread_evenly_from_the_start() {
        assert_eq!(due(0, 100.0), Duration::ZERO);
        assert_eq!(due(1, 100.0), Duration::from_millis(10));
        assert_eq!(due(250, 1000.0), Duration::from_millis(250));
    }

    #[test]
    fn cells_last_long_enough_for_a_tail_and_stay_within_memory() {
        // 2,000 records at 100/s would take 20 s: capped at 10 s.
        assert_eq!(FULL.records(100.0, 4096), 1000);
        // At 1,000/s, 2 s would do: stretched to 3 s.
        assert_eq!(FULL.records(1000.0, 4096), 3000);
        // At 100,000/s, 3 s is 1.2 GB: cut to 512 MiB.
        assert_eq!(FULL.records(1e5, 4096), 131_072);
        assert_eq!(FULL.records(1e-6, 4096), 1, "always at least one record");
        assert_eq!(warmup(1000), 100);
    }

    proptest! {
        /// Due times never go backwards and track index / rate.
        #[test]
        fn due_times_are_monotone(index in 0u64..10_000_000, rate in 1.0f64..1e6) {
            prop_assert!(due(index, rate) <= due(index + 1, rate));
            let expected = index as f64 / rate;
            prop_assert!((due(index, rate).as_secs_f64() - expected).abs() < 1e-6);
        }

        /// A cell never exceeds its byte budget (beyond one record) or runs
        /// longer than its maximum.
        #[test]
        fn cells_respect_their_bounds(rate in 1.0f64..1e6, record_bytes in 1u64..1_000_000) {
            let records = FULL.records(rate, record_bytes);
            prop_assert!(records >= 1);
            prop_assert!(records == 1 || records * record_bytes <= FULL.max_bytes);
            prop_assert!(due(records - 1, rate) <= FULL.max);
        }
    }
}
