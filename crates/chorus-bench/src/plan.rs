//! Which systems run in which latency scenario, at which rates, for how long.

use std::time::Duration;

use crate::models::Scenario;
use crate::schedule::{CellLength, FULL_RATES, QUICK_RATES, TAIL_RATES};
use crate::systems::SystemKind;

/// Records a full-run cell aims for: enough for a p99.9 at 100 records/s
/// would take 20 s, so slow rates settle for their longest cell instead.
const TARGET_RECORDS: u64 = 2000;

/// What the command line asked for; empty lists mean "the default".
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// `--quick`.
    pub quick: bool,
    /// `--rates`.
    pub rates: Vec<f64>,
    /// `--systems`.
    pub systems: Vec<SystemKind>,
    /// `--scenarios`.
    pub scenarios: Vec<Scenario>,
}

/// One system in one scenario, swept over rates in ascending order.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// The latency scenario.
    pub scenario: Scenario,
    /// The system.
    pub system: SystemKind,
    /// Offered rates, ascending.
    pub rates: Vec<f64>,
}

/// Whether `system` belongs in `scenario` by default. The `fixed` scenario
/// has everything; the tail scenarios keep the systems that show what a
/// quorum hides (and, where stores are alike, SlateDB's fastest-flushing
/// configuration and Chorus on one store for contrast).
fn by_default(scenario: Scenario, system: SystemKind, quick: bool) -> bool {
    match (scenario, system) {
        (Scenario::Fixed, _) => true,
        (_, SystemKind::Chorus(3) | SystemKind::Naive(3)) => true,
        _ if quick => false,
        (_, SystemKind::Chorus(5)) => true,
        (Scenario::LogNormal, SystemKind::Chorus(1) | SystemKind::Naive(1)) => true,
        (Scenario::LogNormal, SystemKind::SlateDb(flush)) => flush == Duration::from_millis(1),
        _ => false,
    }
}

/// The groups to run, in report order (scenario, then system).
pub fn groups(request: &Request) -> Vec<Group> {
    let scenarios = if request.scenarios.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        request.scenarios.clone()
    };
    let mut groups = Vec::new();
    for scenario in scenarios {
        for system in SystemKind::ALL {
            let wanted = if request.systems.is_empty() {
                by_default(scenario, system, request.quick)
            } else {
                request.systems.contains(&system)
            };
            let (stores, _) = system.quorum();
            // One store cannot stand in for "one of the replicas is slow".
            if !wanted || (stores == 1 && scenario.replicas_differ()) {
                continue;
            }
            groups.push(Group {
                scenario,
                system,
                rates: rates(request, scenario),
            });
        }
    }
    groups
}

/// The rates of a scenario's sweep, ascending.
fn rates(request: &Request, scenario: Scenario) -> Vec<f64> {
    let mut rates = match (request.rates.is_empty(), request.quick, scenario) {
        (false, _, _) => request.rates.clone(),
        (true, true, Scenario::Fixed) => QUICK_RATES.to_vec(),
        (true, true, _) => vec![QUICK_RATES[1]],
        (true, false, Scenario::Fixed) => FULL_RATES.to_vec(),
        (true, false, _) => TAIL_RATES.to_vec(),
    };
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    rates
}

/// How long cells last: `cell` exactly if given, else 1 s for `--quick` and
/// 3 to 10 s (aiming at `TARGET_RECORDS`) for the full run; at most
/// `max_bytes` of records either way.
pub fn cell_length(quick: bool, cell: Option<Duration>, max_bytes: u64) -> CellLength {
    let (min, max) = match (cell, quick) {
        (Some(cell), _) => (cell, cell),
        (None, true) => (Duration::from_secs(1), Duration::from_secs(1)),
        (None, false) => (Duration::from_secs(3), Duration::from_secs(10)),
    };
    CellLength {
        min,
        max,
        target_records: TARGET_RECORDS,
        max_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(quick: bool) -> Request {
        Request {
            quick,
            rates: vec![],
            systems: vec![],
            scenarios: vec![],
        }
    }

    fn names(groups: &[Group], scenario: Scenario) -> Vec<String> {
        groups
            .iter()
            .filter(|g| g.scenario == scenario)
            .map(|g| g.system.name())
            .collect()
    }

    #[test]
    fn the_full_run_sweeps_everything_at_fixed_latency_and_quorums_in_the_tails() {
        let groups = groups(&request(false));
        assert_eq!(names(&groups, Scenario::Fixed).len(), SystemKind::ALL.len());
        assert_eq!(
            names(&groups, Scenario::LogNormal),
            [
                "chorus-1",
                "chorus-3",
                "chorus-5",
                "slatedb-1ms",
                "naive-1",
                "naive-3"
            ]
        );
        for scenario in [Scenario::OneSlow, Scenario::OneSpiky] {
            assert_eq!(
                names(&groups, scenario),
                ["chorus-3", "chorus-5", "naive-3"]
            );
        }
        assert_eq!(groups[0].rates, FULL_RATES);
        assert_eq!(groups.last().unwrap().rates, TAIL_RATES);
    }

    #[test]
    fn quick_keeps_three_rates_and_two_systems_in_the_tails() {
        let groups = groups(&request(true));
        assert_eq!(groups.len(), SystemKind::ALL.len() + 3 * 2);
        assert_eq!(groups[0].rates, QUICK_RATES);
        // One rate the fixed sweep has too, so the two compare.
        assert_eq!(groups.last().unwrap().rates, vec![3e3]);
    }

    #[test]
    fn explicit_choices_override_but_single_stores_skip_differing_replicas() {
        let groups = groups(&Request {
            quick: false,
            rates: vec![300.0, 100.0, 300.0],
            systems: vec![SystemKind::Chorus(1), SystemKind::Naive(3)],
            scenarios: vec![Scenario::OneSlow, Scenario::Fixed],
        });
        let picked: Vec<_> = groups
            .iter()
            .map(|g| (g.scenario.name(), g.system.name()))
            .collect();
        assert_eq!(
            picked,
            [
                ("one-slow", "naive-3".to_owned()),
                ("fixed", "chorus-1".to_owned()),
                ("fixed", "naive-3".to_owned())
            ]
        );
        assert!(groups.iter().all(|g| g.rates == [100.0, 300.0]));
    }

    #[test]
    fn cell_lengths() {
        let exact = cell_length(false, Some(Duration::from_millis(200)), 1 << 20);
        assert_eq!(
            (exact.min, exact.max),
            (Duration::from_millis(200), Duration::from_millis(200))
        );
        assert_eq!(cell_length(true, None, 1).max, Duration::from_secs(1));
        assert_eq!(cell_length(false, None, 1).max, Duration::from_secs(10));
    }
}
