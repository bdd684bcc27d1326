//! A fault-injecting wrapper around any [`BlobStore`].
//!
//! Fault model, each targetable per operation and per key, with a probability
//! and an optional count, drawn from one seeded random generator so a schedule
//! replays exactly:
//!
//! - **fail before apply**: the call returns `Unavailable` and the store is untouched;
//! - **fail after apply** (lost response): the call reaches the store, then
//!   returns `Unavailable` as if the response was lost;
//! - **delay**: a fixed or uniformly random delay before the call (reordering
//!   arises from different delays on concurrent calls);
//! - **corrupt on read**: one random bit of the returned bytes is flipped;
//! - **outage**: while on, every call fails before applying.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use futures::future::BoxFuture;

use super::layer::Layer;
use super::{BlobError, BlobStore, DynBlobStore, Op};

/// A set of [`Op`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpSet(u8);

impl OpSet {
    /// Every operation.
    pub const ALL: OpSet = OpSet(0b11_1111);
    /// Create, update and delete.
    pub const WRITES: OpSet = OpSet(0b10_0011);
    /// Get, head and list.
    pub const READS: OpSet = OpSet(0b01_1100);

    /// Exactly the given operations.
    pub fn of(ops: &[Op]) -> OpSet {
        OpSet(ops.iter().fold(0, |bits, op| bits | Self::bit(*op)))
    }

    /// Whether `op` is in the set.
    pub fn contains(self, op: Op) -> bool {
        self.0 & Self::bit(op) != 0
    }

    fn bit(op: Op) -> u8 {
        1 << Op::ALL.iter().position(|o| *o == op).expect("op is listed")
    }
}

/// Which keys a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyMatch {
    /// Every key (and every listing).
    Any,
    /// Keys (or listing prefixes) starting with this string.
    Prefix(String),
    /// Exactly this key.
    Exact(String),
}

impl KeyMatch {
    fn matches(&self, key: &str) -> bool {
        match self {
            KeyMatch::Any => true,
            KeyMatch::Prefix(prefix) => key.starts_with(prefix.as_str()),
            KeyMatch::Exact(exact) => key == exact,
        }
    }
}

/// One kind of injected fault; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Fail with `Unavailable` without touching the store.
    FailBefore,
    /// Apply the call, then fail with `Unavailable` (a lost response).
    FailAfter,
    /// Wait this long before the call.
    Delay(Duration),
    /// Wait a uniformly random time in `[0, max]` before the call.
    DelayUpTo(Duration),
    /// Flip one random bit of the bytes a read returns.
    Corrupt,
}

/// When and where to inject a [`Fault`].
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    /// The operations it applies to.
    pub ops: OpSet,
    /// The keys it applies to.
    pub keys: KeyMatch,
    /// What to inject.
    pub fault: Fault,
    /// Chance of injecting on a matching call, in `[0, 1]`.
    pub probability: f64,
    /// How many more times it may fire; `None` for no limit.
    pub times: Option<u32>,
}

impl FaultRule {
    /// A rule that injects `fault` on every call, every key, every time.
    pub fn new(fault: Fault) -> FaultRule {
        FaultRule {
            ops: OpSet::ALL,
            keys: KeyMatch::Any,
            fault,
            probability: 1.0,
            times: None,
        }
    }

    /// Restricts the rule to `ops`.
    pub fn ops(mut self, ops: OpSet) -> FaultRule {
        self.ops = ops;
        self
    }

    /// Restricts the rule to `keys`.
    pub fn keys(mut self, keys: KeyMatch) -> FaultRule {
        self.keys = keys;
        self
    }

    /// Fires with chance `probability` per matching call.
    pub fn probability(mut self, probability: f64) -> FaultRule {
        assert!(
            (0.0..=1.0).contains(&probability),
            "probability out of range"
        );
        self.probability = probability;
        self
    }

    /// Fires at most `times` times.
    pub fn times(mut self, times: u32) -> FaultRule {
        self.times = Some(times);
        self
    }
}

/// Identifies an installed rule so it can be removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleId(u64);

#[derive(Debug)]
struct FaultState {
    rules: Vec<(RuleId, FaultRule)>,
    next_rule: u64,
    outage: bool,
    rng: StdRng,
    /// Calls seen per operation, in [`Op::ALL`] order.
    calls: [u64; Op::ALL.len()],
    /// Faults injected so far.
    injected: u64,
}

/// The handle that controls a [`FaultyStore`]; cheap to clone and share.
#[derive(Debug, Clone)]
pub struct FaultController {
    state: Arc<Mutex<FaultState>>,
}

impl FaultController {
    /// A controller with no rules whose random choices follow `seed`.
    pub fn new(seed: u64) -> FaultController {
        FaultController {
            state: Arc::new(Mutex::new(FaultState {
                rules: Vec::new(),
                next_rule: 0,
                outage: false,
                rng: StdRng::seed_from_u64(seed),
                calls: [0; Op::ALL.len()],
                injected: 0,
            })),
        }
    }

    fn state(&self) -> MutexGuard<'_, FaultState> {
        self.state.lock().expect("fault state poisoned")
    }

    /// Installs `rule`.
    pub fn add(&self, rule: FaultRule) -> RuleId {
        let mut state = self.state();
        let id = RuleId(state.next_rule);
        state.next_rule += 1;
        state.rules.push((id, rule));
        id
    }

    /// Removes one rule (no-op if it is gone).
    pub fn remove(&self, id: RuleId) {
        self.state().rules.retain(|(rule, _)| *rule != id);
    }

    /// Removes every rule and ends any outage.
    pub fn clear(&self) {
        let mut state = self.state();
        state.rules.clear();
        state.outage = false;
    }

    /// Turns the outage on or off.
    pub fn set_outage(&self, outage: bool) {
        self.state().outage = outage;
    }

    /// Whether an outage is on.
    pub fn outage(&self) -> bool {
        self.state().outage
    }

    /// How many calls of `op` reached the wrapper.
    pub fn calls(&self, op: Op) -> u64 {
        let index = Op::ALL.iter().position(|o| *o == op).expect("op is listed");
        self.state().calls[index]
    }

    /// How many faults (including outage refusals) were injected.
    pub fn injected(&self) -> u64 {
        self.state().injected
    }

    /// Fires the matching rules whose fault passes `wanted`, consuming rule
    /// counts and randomness; returns each fired fault with a random number for it.
    fn fire(&self, op: Op, key: &str, wanted: impl Fn(&Fault) -> bool) -> Vec<(Fault, u64)> {
        let mut guard = self.state();
        let state = &mut *guard;
        let mut fired = Vec::new();
        for (_, rule) in state.rules.iter_mut() {
            let eligible = wanted(&rule.fault)
                && rule.ops.contains(op)
                && rule.keys.matches(key)
                && rule.times != Some(0);
            if eligible && state.rng.random_bool(rule.probability) {
                if let Some(times) = rule.times.as_mut() {
                    *times -= 1;
                }
                fired.push((rule.fault.clone(), state.rng.random()));
            }
        }
        let injects = fired
            .iter()
            .any(|(fault, _)| !matches!(fault, Fault::Delay(_) | Fault::DelayUpTo(_)));
        if injects {
            state.injected += 1;
        }
        fired
    }

    /// Decides what one call suffers before and after it runs (not corruption,
    /// which applies to the bytes a read returns).
    pub(crate) fn plan(&self, op: Op, key: &str) -> Plan {
        let outage = {
            let mut state = self.state();
            let index = Op::ALL.iter().position(|o| *o == op).expect("op is listed");
            state.calls[index] += 1;
            if state.outage {
                state.injected += 1;
            }
            state.outage
        };
        let mut plan = Plan {
            fail_before: outage,
            ..Plan::default()
        };
        for (fault, random) in self.fire(op, key, |fault| *fault != Fault::Corrupt) {
            match fault {
                Fault::FailBefore => plan.fail_before = true,
                Fault::FailAfter => plan.fail_after = true,
                Fault::Delay(delay) => plan.delay += delay,
                Fault::DelayUpTo(max) => {
                    plan.delay += Duration::from_nanos(random % (max.as_nanos() as u64 + 1));
                }
                Fault::Corrupt => unreachable!("filtered out"),
            }
        }
        plan
    }
}

/// What one call suffers.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    fail_before: bool,
    fail_after: bool,
    delay: Duration,
}

impl Plan {
    /// Runs `call` under this plan; `injected` turns an injected failure into
    /// the caller's transient error.
    pub(crate) async fn run<T, E>(
        self,
        call: impl Future<Output = Result<T, E>>,
        injected: impl Fn(InjectedFault) -> E,
    ) -> Result<T, E> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if self.fail_before {
            return Err(injected(InjectedFault("failed before applying")));
        }
        let result = call.await;
        if self.fail_after {
            return Err(injected(InjectedFault("response lost after applying")));
        }
        result
    }
}

/// The cause of an injected failure.
#[derive(Debug, thiserror::Error)]
#[error("injected fault: {0}")]
pub(crate) struct InjectedFault(&'static str);

/// A [`BlobStore`] that injects the faults its [`FaultController`] plans.
#[derive(Debug, Clone)]
pub struct FaultyStore {
    inner: DynBlobStore,
    controller: FaultController,
}

impl FaultyStore {
    /// Wraps `inner`; faults are controlled through `controller`.
    pub fn new(inner: DynBlobStore, controller: FaultController) -> FaultyStore {
        FaultyStore { inner, controller }
    }

    /// The controller of this store's faults.
    pub fn controller(&self) -> &FaultController {
        &self.controller
    }
}

fn flip_bit(bytes: Bytes, random: u64) -> Bytes {
    let mut copy = BytesMut::from(bytes.as_ref());
    let bit = random % (copy.len() as u64 * 8);
    copy[(bit / 8) as usize] ^= 1 << (bit % 8);
    copy.freeze()
}

#[async_trait]
impl Layer for FaultyStore {
    fn inner(&self) -> &DynBlobStore {
        &self.inner
    }

    async fn around<T: Send + 'static>(
        &self,
        op: Op,
        key: &str,
        call: BoxFuture<'_, Result<T, BlobError>>,
    ) -> Result<T, BlobError> {
        let plan = self.controller.plan(op, key);
        plan.run(call, |cause| {
            BlobError::unavailable(self.name(), op, key, cause)
        })
        .await
    }

    /// Corruption applies to the bytes a read returns.
    fn received(&self, key: &str, bytes: Bytes) -> Bytes {
        let fired = self
            .controller
            .fire(Op::Get, key, |fault| *fault == Fault::Corrupt);
        match fired.first() {
            Some((_, random)) if !bytes.is_empty() => flip_bit(bytes, *random),
            _ => bytes,
        }
    }
}
