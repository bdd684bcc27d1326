//! The physical floor: the latency no protocol can beat. A record written
//! to a quorum of `Q` out of `N` stores is durable no sooner than the `Q`-th
//! fastest of `N` concurrent requests; with one store, that is one request.
//! For random models the floor is a distribution, estimated by drawing.

use std::time::Duration;

use chorus::blob::Latency;
use rand::SeedableRng;
use rand::rngs::StdRng;

/// A majority of `replicas`.
pub fn majority(replicas: usize) -> usize {
    replicas / 2 + 1
}

/// The `quorum`-th smallest of `delays` (1-based), reordering them.
pub fn kth_fastest(delays: &mut [Duration], quorum: usize) -> Duration {
    assert!(
        (1..=delays.len()).contains(&quorum),
        "quorum must be 1..=replicas"
    );
    *delays.select_nth_unstable(quorum - 1).1
}

/// `draws` samples of the time until `quorum` of requests sent at once to
/// stores with `replicas` latencies have answered, sorted; from `seed`.
pub fn quorum_floor(replicas: &[Latency], quorum: usize, draws: usize, seed: u64) -> Vec<Duration> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut delays = vec![Duration::ZERO; replicas.len()];
    let mut floor: Vec<Duration> = (0..draws)
        .map(|_| {
            for (delay, latency) in delays.iter_mut().zip(replicas) {
                *delay = latency.sample(&mut rng);
            }
            kth_fastest(&mut delays, quorum)
        })
        .collect();
    floor.sort_unstable();
    floor
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::models::Scenario;
    use crate::stats::{millis, percentile};

    const L: Duration = Duration::from_millis(10);

    #[test]
    fn a_quorum_hides_one_slow_or_spiky_replica() {
        for scenario in [Scenario::OneSlow, Scenario::OneSpiky] {
            for replicas in [3, 5] {
                let floor = quorum_floor(
                    &scenario.replicas(L, replicas),
                    majority(replicas),
                    10_000,
                    1,
                );
                assert_eq!(percentile(&floor, 1.0), L, "{scenario} {replicas}");
            }
        }
        let alone = quorum_floor(&Scenario::OneSlow.replicas(L, 1), 1, 10, 1);
        assert_eq!(alone[0], L * 10, "one store cannot hide itself");
        let spiky = quorum_floor(&Scenario::OneSpiky.replicas(L, 1), 1, 100_000, 1);
        assert_eq!(percentile(&spiky, 0.98), L);
        assert_eq!(percentile(&spiky, 0.995), Duration::from_millis(500));
    }

    #[test]
    fn a_majority_of_log_normal_stores_trims_the_tail() {
        let one = quorum_floor(&Scenario::LogNormal.replicas(L, 1), 1, 50_000, 3);
        let three = quorum_floor(&Scenario::LogNormal.replicas(L, 3), 2, 50_000, 3);
        // The median of 3 draws: same median, a much shorter tail.
        assert!((millis(percentile(&three, 0.5)) - 10.0).abs() < 0.3);
        assert!(millis(percentile(&one, 0.99)) > 28.0);
        assert!(millis(percentile(&three, 0.99)) < 24.0);
    }

    #[test]
    fn majorities() {
        assert_eq!([1, 3, 5].map(majority), [1, 2, 3]);
    }

    proptest! {
        /// The floor grows with the quorum: waiting for more answers is never faster.
        #[test]
        fn the_floor_grows_with_the_quorum(
            millis in prop::collection::vec(1u64..200, 1..6),
            seed in any::<u64>(),
        ) {
            let replicas: Vec<_> = millis
                .iter()
                .map(|ms| Latency::ShiftedExponential {
                    min: Duration::from_millis(*ms),
                    mean_extra: Duration::from_millis(*ms),
                })
                .collect();
            let floors: Vec<_> = (1..=replicas.len())
                .map(|quorum| quorum_floor(&replicas, quorum, 50, seed))
                .collect();
            for pair in floors.windows(2) {
                for (fewer, more) in pair[0].iter().zip(&pair[1]) {
                    // Same seed, same draws: sorted element-wise order holds.
                    prop_assert!(fewer <= more);
                }
            }
        }

        /// The k-th fastest is the k-th element of the sorted delays.
        #[test]
        fn kth_fastest_matches_sorting(
            mut millis in prop::collection::vec(0u64..1000, 1..8),
            pick in any::<prop::sample::Index>(),
        ) {
            let mut delays: Vec<_> = millis.iter().map(|ms| Duration::from_millis(*ms)).collect();
            let quorum = pick.index(delays.len()) + 1;
            millis.sort_unstable();
            prop_assert_eq!(
                kth_fastest(&mut delays, quorum),
                Duration::from_millis(millis[quorum - 1])
            );
        }
    }
}
