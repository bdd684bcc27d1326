//! The fault injector.
//!
//! # Fault model
//!
//! Faults are injected below the system under test, through the product's own
//! `FaultyStore` / `FaultyRegister` wrappers, at two scopes: *replica-wide*
//! (every actor sees it: an outage, a slow zone) and *per actor* (one writer,
//! recovery or reader sees it: a partition, its own lost responses).
//!
//! - **Transient errors** (`FailBefore`): a call fails with `Unavailable` and
//!   the store is untouched. Any operation, with a probability.
//! - **Lost responses** (`FailAfter`): the call applies, then fails with
//!   `Unavailable`. On fragment and sealed-object creates, on deletes, and on
//!   the register's CAS update (a lost CAS response).
//! - **Slow replicas and reordering** (`Delay`, `DelayUpTo`): a fixed or
//!   uniformly random delay before the call, so concurrent calls land out of
//!   order and lanes stall.
//! - **Corruption on read** (`Corrupt`): a `get` returns the stored bytes with
//!   one bit flipped. Stored bytes are never damaged, so a checksum-verified
//!   copy always exists on a replica that holds the object.
//! - **Outages**: a replica refuses every call until the outage ends. During
//!   the safety phase any number of replicas may be out at once; a writer or
//!   recovery then fails (`NoQuorum`, poisoned), and only safety is checked.
//! - **Crashes** are not store faults: the driver aborts writers, drops
//!   them, aborts recovery tasks at arbitrary await points and keeps
//!   superseded writers running as zombies (see `sim.rs`).
//!
//! Not modelled: data loss or rot of *stored* bytes (a replica is either
//! reachable with everything it acknowledged, or out), torn writes, listing
//! anomalies (stores are strongly consistent), register corruption, monotonic
//! clock drift. Wall-clock skew is modelled by the lease and runtime phases
//! (`control.rs`).
//! The liveness phase ends every fault, then demands progress.

use std::fmt;
use std::time::Duration;

use chorus::blob::{Fault, FaultController, FaultRule, KeyMatch, Op, OpSet, RuleId};
use rand::Rng;
use rand::rngs::StdRng;

/// A blob-store fault rule drawn at random.
pub fn draw_store_rule(rng: &mut StdRng) -> FaultRule {
    let (fault, ops) = match rng.random_range(0..10) {
        0..=2 => (Fault::FailBefore, draw_ops(rng)),
        3..=4 => (Fault::FailAfter, draw_write_ops(rng)),
        5..=6 => (Fault::DelayUpTo(draw_delay(rng)), OpSet::ALL),
        7 => (Fault::Delay(draw_delay(rng)), OpSet::ALL),
        _ => (Fault::Corrupt, OpSet::of(&[Op::Get])),
    };
    let rule = FaultRule::new(fault)
        .ops(ops)
        .keys(draw_keys(rng))
        .probability(draw_probability(rng));
    limit(rng, rule)
}

/// A register fault rule drawn at random: mostly lost CAS responses.
pub fn draw_register_rule(rng: &mut StdRng) -> FaultRule {
    let (fault, ops) = match rng.random_range(0..10) {
        0..=4 => (Fault::FailAfter, OpSet::of(&[Op::Update])),
        5..=7 => (Fault::FailBefore, OpSet::ALL),
        _ => (Fault::DelayUpTo(draw_delay(rng)), OpSet::ALL),
    };
    let rule = FaultRule::new(fault)
        .ops(ops)
        .probability(draw_probability(rng));
    limit(rng, rule)
}

fn limit(rng: &mut StdRng, rule: FaultRule) -> FaultRule {
    if rng.random_bool(0.5) {
        rule.times(rng.random_range(1..=20))
    } else {
        rule
    }
}

fn draw_ops(rng: &mut StdRng) -> OpSet {
    match rng.random_range(0..4) {
        0 => OpSet::ALL,
        1 => OpSet::WRITES,
        2 => OpSet::READS,
        _ => OpSet::of(&[Op::ALL[rng.random_range(0..Op::ALL.len())]]),
    }
}

fn draw_write_ops(rng: &mut StdRng) -> OpSet {
    match rng.random_range(0..3) {
        0 => OpSet::of(&[Op::Create]),
        1 => OpSet::WRITES,
        _ => OpSet::ALL,
    }
}

fn draw_keys(rng: &mut StdRng) -> KeyMatch {
    match rng.random_range(0..6) {
        0 => KeyMatch::Prefix("segments".into()),
        1 => KeyMatch::Prefix("sealed".into()),
        _ => KeyMatch::Any,
    }
}

fn draw_delay(rng: &mut StdRng) -> Duration {
    if rng.random_bool(0.8) {
        Duration::from_millis(rng.random_range(1..=100))
    } else {
        Duration::from_millis(rng.random_range(100..=3000))
    }
}

fn draw_probability(rng: &mut StdRng) -> f64 {
    match rng.random_range(0..4) {
        0 => 1.0,
        1 => 0.5,
        _ => rng.random_range(1..=30) as f64 / 100.0,
    }
}

/// A rule in trace form.
pub struct RuleLabel<'a>(pub &'a FaultRule);

impl fmt::Display for RuleLabel<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rule = self.0;
        write!(
            f,
            "{:?} ops={:?} keys={:?} p={} times={:?}",
            rule.fault, rule.ops, rule.keys, rule.probability, rule.times
        )
    }
}

/// Fault rules and replica outages that end at a given step: the schedules
/// install faults for a while rather than for good, so that a run passes
/// through many combinations of them.
#[derive(Debug, Default)]
pub struct Expiring {
    rules: Vec<(u64, FaultController, RuleId)>,
    outages: Vec<(u64, usize)>,
}

impl Expiring {
    /// Installs `rule` on `controller` until step `until`.
    pub fn add_rule(&mut self, until: u64, controller: FaultController, rule: FaultRule) {
        let id = controller.add(rule);
        self.rules.push((until, controller, id));
    }

    /// Starts an outage of `replica` (its replica-wide `controller`) until
    /// step `until`.
    pub fn add_outage(&mut self, until: u64, replica: usize, controller: &FaultController) {
        controller.set_outage(true);
        self.outages.push((until, replica));
    }

    /// Forgets the outages of `replica` (ended some other way).
    pub fn forget_outages(&mut self, replica: usize) {
        self.outages.retain(|(_, r)| *r != replica);
    }

    /// At `step`, removes the rules and ends the outages whose time is up;
    /// `replica_faults` are the replica-wide controllers, in replica order.
    pub fn expire(&mut self, step: u64, replica_faults: &[FaultController]) {
        for (_, replica) in self.outages.iter().filter(|(until, _)| *until <= step) {
            replica_faults[*replica].set_outage(false);
        }
        self.outages.retain(|(until, _)| *until > step);
        self.rules.retain(|(until, controller, id)| {
            let keep = *until > step;
            if !keep {
                controller.remove(*id);
            }
            keep
        });
    }

    /// Removes every rule and forgets every outage (the caller heals the
    /// controllers).
    pub fn clear(&mut self) {
        for (_, controller, id) in std::mem::take(&mut self.rules) {
            controller.remove(id);
        }
        self.outages.clear();
    }
}
