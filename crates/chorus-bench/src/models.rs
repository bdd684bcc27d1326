//! The latency scenarios of a comparison: which [`Latency`] each replica's
//! store gets, around one base latency.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chorus::blob::Latency;

/// Spread of the log-normal model (σ of the log): its p99 is 3.2× and its
/// p99.9 4.7× the median, a heavy tail of the kind object stores show.
pub const LOG_NORMAL_SIGMA: f64 = 0.5;

/// How much slower the slow replica of [`Scenario::OneSlow`] is.
pub const SLOW_FACTOR: u32 = 10;

/// The stall of [`Scenario::OneSpiky`]'s spiky replica.
pub const SPIKE: Duration = Duration::from_millis(500);

/// The fraction of [`Scenario::OneSpiky`]'s requests that stall.
pub const SPIKE_PROBABILITY: f64 = 0.01;

/// Latency models per replica, around a base latency `L`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scenario {
    /// Every request on every store takes `L`.
    Fixed,
    /// Every store log-normal with median `L` and σ [`LOG_NORMAL_SIGMA`].
    LogNormal,
    /// Replica 0 takes [`SLOW_FACTOR`]·`L`, the others `L`.
    OneSlow,
    /// Replica 0 takes [`SPIKE`] on [`SPIKE_PROBABILITY`] of its requests
    /// and `L` otherwise; the others `L`.
    OneSpiky,
}

impl Scenario {
    /// Every scenario, in report order.
    pub const ALL: [Scenario; 4] = [
        Scenario::Fixed,
        Scenario::LogNormal,
        Scenario::OneSlow,
        Scenario::OneSpiky,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Fixed => "fixed",
            Scenario::LogNormal => "log-normal",
            Scenario::OneSlow => "one-slow",
            Scenario::OneSpiky => "one-spiky",
        }
    }

    /// Whether the replicas differ, so that a single-store system has no
    /// meaningful place in the scenario (which store would it be?).
    pub fn replicas_differ(self) -> bool {
        matches!(self, Scenario::OneSlow | Scenario::OneSpiky)
    }

    /// The latency of the store at `position` (0 is the odd one out).
    pub fn replica(self, base: Duration, position: usize) -> Latency {
        match (self, position) {
            (Scenario::Fixed, _) | (Scenario::OneSlow | Scenario::OneSpiky, 1..) => {
                Latency::Fixed(base)
            }
            (Scenario::LogNormal, _) => Latency::LogNormal {
                median: base,
                sigma: LOG_NORMAL_SIGMA,
            },
            (Scenario::OneSlow, 0) => Latency::Fixed(base * SLOW_FACTOR),
            (Scenario::OneSpiky, 0) => Latency::Spiky {
                base,
                spike: SPIKE,
                probability: SPIKE_PROBABILITY,
            },
        }
    }

    /// The latencies of `count` replicas.
    pub fn replicas(self, base: Duration, count: usize) -> Vec<Latency> {
        (0..count)
            .map(|position| self.replica(base, position))
            .collect()
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scenario {
    type Err = String;

    fn from_str(name: &str) -> Result<Scenario, String> {
        by_name("scenario", &Scenario::ALL, name, |s| s.name().to_owned())
    }
}

/// The one of `all` whose `name_of` is `name`; the error lists the known
/// names, calling them `what`s.
pub fn by_name<T: Copy>(
    what: &str,
    all: &[T],
    name: &str,
    name_of: impl Fn(T) -> String,
) -> Result<T, String> {
    all.iter()
        .copied()
        .find(|item| name_of(*item) == name)
        .ok_or_else(|| {
            let known: Vec<_> = all.iter().map(|item| name_of(*item)).collect();
            format!("unknown {what} {name:?} (known: {})", known.join(", "))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Duration = Duration::from_millis(10);

    #[test]
    fn only_replica_zero_is_the_odd_one_out() {
        assert_eq!(
            Scenario::OneSlow.replicas(L, 3),
            vec![
                Latency::Fixed(Duration::from_millis(100)),
                Latency::Fixed(L),
                Latency::Fixed(L)
            ]
        );
        let spiky = Scenario::OneSpiky.replicas(L, 5);
        assert!(matches!(spiky[0], Latency::Spiky { base, .. } if base == L));
        assert!(
            spiky[1..]
                .iter()
                .all(|latency| *latency == Latency::Fixed(L))
        );
        assert!(
            Scenario::LogNormal
                .replicas(L, 3)
                .windows(2)
                .all(|pair| pair[0] == pair[1])
        );
        assert_eq!(Scenario::Fixed.replicas(L, 1), vec![Latency::Fixed(L)]);
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for scenario in Scenario::ALL {
            assert_eq!(scenario.name().parse::<Scenario>(), Ok(scenario));
        }
        let error = "slow".parse::<Scenario>().unwrap_err();
        assert!(error.contains("one-slow"), "{error}");
        assert!(Scenario::OneSpiky.replicas_differ() && !Scenario::LogNormal.replicas_differ());
    }
}
