//! What a cell's numbers mean: whether a system sustained an offered rate,
//! whether to go on to higher rates, and the headline per system.

use std::time::Duration;

/// The latency objective: p99 at most this many times the injected latency.
pub const SLO_FACTOR: u32 = 3;

/// A cell that achieved less than this fraction of its offered rate is
/// overloaded even without drops (the system falls further behind each second).
pub const MIN_ACHIEVED_FRACTION: f64 = 0.9;

/// The counts a verdict looks at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CellCounts {
    /// Offered rate, records per second.
    pub offered_rate: f64,
    /// Achieved rate, acknowledged records per second.
    pub achieved_rate: f64,
    /// Records not sent because the outstanding cap was reached.
    pub dropped: u64,
    /// Records the system refused to admit (backpressure).
    pub refused: u64,
    /// Records that failed or were still unacknowledged at the drain deadline.
    pub failed: u64,
    /// Measured p99 acknowledgement latency.
    pub p99: Duration,
}

/// Whether a cell sustained its offered rate: every record acknowledged,
/// nothing dropped or refused, and p99 within [`SLO_FACTOR`] × `injected`.
pub fn sustained(cell: &CellCounts, injected: Duration) -> bool {
    cell.dropped == 0 && cell.refused == 0 && cell.failed == 0 && cell.p99 <= injected * SLO_FACTOR
}

/// Whether a cell shows the system cannot keep up at all (higher rates are
/// then skipped): records were lost, or it fell well short of the offered
/// rate. A system that keeps up but misses the latency objective is not
/// overloaded: its latency at higher rates is still worth measuring.
pub fn overloaded(cell: &CellCounts) -> bool {
    cell.dropped > 0
        || cell.refused > 0
        || cell.failed > 0
        || cell.achieved_rate < cell.offered_rate * MIN_ACHIEVED_FRACTION
}

/// The headline rate: the highest offered rate sustained. `cells` are
/// (offered rate, sustained) in any order; `None` if none was sustained.
/// A lower rate that missed does not disqualify a higher one: at light load
/// a few slow requests weigh more in the p99, and the issue asks for the
/// highest rate sustained, not the top of an unbroken run.
pub fn highest_sustained(cells: &[(f64, bool)]) -> Option<f64> {
    cells
        .iter()
        .filter(|(_, ok)| *ok)
        .map(|(rate, _)| *rate)
        .max_by(f64::total_cmp)
}

/// For each offered rate measured in both, `other`'s p99 as a multiple of
/// `baseline`'s: how much a latency scenario moves a system's tail against
/// the all-fast case. Both are (offered rate, p99) pairs; the result is
/// (rate, ratio) in `other`'s order.
pub fn p99_ratios(baseline: &[(f64, f64)], other: &[(f64, f64)]) -> Vec<(f64, f64)> {
    other
        .iter()
        .filter_map(|(rate, p99)| {
            let (_, base) = baseline.iter().find(|(r, _)| r == rate)?;
            Some((*rate, p99 / base))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Duration = Duration::from_millis(10);

    fn cell(p99_ms: u64) -> CellCounts {
        CellCounts {
            offered_rate: 1000.0,
            achieved_rate: 1000.0,
            dropped: 0,
            refused: 0,
            failed: 0,
            p99: Duration::from_millis(p99_ms),
        }
    }

    #[test]
    fn sustained_needs_every_record_and_the_latency_objective() {
        assert!(sustained(&cell(30), L));
        assert!(!sustained(&cell(31), L));
        assert!(!sustained(
            &CellCounts {
                dropped: 1,
                ..cell(5)
            },
            L
        ));
        assert!(!sustained(
            &CellCounts {
                refused: 1,
                ..cell(5)
            },
            L
        ));
        assert!(!sustained(
            &CellCounts {
                failed: 1,
                ..cell(5)
            },
            L
        ));
    }

    #[test]
    fn slow_but_keeping_up_is_not_overloaded() {
        assert!(!overloaded(&cell(500)));
        assert!(overloaded(&CellCounts {
            dropped: 1,
            ..cell(5)
        }));
        assert!(overloaded(&CellCounts {
            achieved_rate: 899.0,
            ..cell(5)
        }));
        assert!(!overloaded(&CellCounts {
            achieved_rate: 900.0,
            ..cell(5)
        }));
    }

    #[test]
    fn the_headline_is_the_highest_rate_sustained() {
        let cells = [(1e4, true), (100.0, true), (1e3, true), (3e4, false)];
        assert_eq!(highest_sustained(&cells), Some(1e4));
        let noisy_light_load = [(100.0, false), (1e3, true), (1e4, false)];
        assert_eq!(highest_sustained(&noisy_light_load), Some(1e3));
        assert_eq!(highest_sustained(&[(100.0, false)]), None);
        assert_eq!(highest_sustained(&[]), None);
    }

    #[test]
    fn p99_ratios_pair_up_equal_rates() {
        let fixed = [(100.0, 12.0), (1e3, 15.0), (1e4, 20.0)];
        let slow = [(100.0, 12.6), (1e4, 40.0), (1e5, 90.0)];
        let ratios = p99_ratios(&fixed, &slow);
        assert_eq!(ratios.len(), 2);
        assert_eq!(ratios[0].0, 100.0);
        assert!((ratios[0].1 - 1.05).abs() < 1e-12);
        assert_eq!(ratios[1], (1e4, 2.0));
        assert!(p99_ratios(&[], &slow).is_empty());
    }
}
