//! Latency percentiles.

use std::time::Duration;

use serde::Serialize;

/// The `p`-th quantile (`p` in `[0, 1]`) of `sorted` by nearest rank: the
/// smallest sample with at least a fraction `p` of samples at or below it.
/// Zero for no samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The percentiles a cell reports, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest sample.
    pub max_ms: f64,
}

impl Summary {
    /// Summarizes `sorted` samples.
    pub fn of(sorted: &[Duration]) -> Summary {
        let ms = |p| millis(percentile(sorted, p));
        Summary {
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            max_ms: ms(1.0),
        }
    }
}

/// `duration` in (fractional) milliseconds.
pub fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|v| Duration::from_millis(*v)).collect()
    }

    #[test]
    fn nearest_rank_percentiles() {
        let samples = ms(&(1..=1000).collect::<Vec<_>>());
        let summary = Summary::of(&samples);
        assert_eq!(
            (summary.p50_ms, summary.p99_ms, summary.p999_ms),
            (500.0, 990.0, 999.0)
        );
        assert_eq!(summary.max_ms, 1000.0);
        // With fewer than 1,000 samples the p99.9 is the maximum.
        assert_eq!(Summary::of(&ms(&[1, 2, 3])).p999_ms, 3.0);
        assert_eq!(Summary::of(&[]), Summary::default());
    }

    proptest! {
        /// A percentile is one of the samples, and grows with `p`.
        #[test]
        fn percentiles_are_samples_and_monotone(
            mut values in prop::collection::vec(0u64..10_000, 1..200),
            p in 0.0f64..=1.0,
            q in 0.0f64..=1.0,
        ) {
            values.sort_unstable();
            let sorted = ms(&values);
            let (low, high) = if p <= q { (p, q) } else { (q, p) };
            prop_assert!(sorted.contains(&percentile(&sorted, low)));
            prop_assert!(percentile(&sorted, low) <= percentile(&sorted, high));
            prop_assert_eq!(percentile(&sorted, 1.0), *sorted.last().unwrap());
            prop_assert_eq!(percentile(&sorted, 0.0), sorted[0]);
        }
    }
}
