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

#[cfg(test)]
mod tests {
    //! Each documented behaviour of the fault model, over an in-memory store;
    //! delays are measured in tokio's paused (virtual) time only.

    use object_store::memory::InMemory;
    use tokio::time::Instant;

    use super::*;
    use crate::blob::{ObjectStoreBlobs, Version};
    use crate::register::{
        FaultyRegister, Fields, ManifestStore, MemoryRegister, REGISTER_FAULT_KEY, RegisterError,
    };

    const CONTENTS: &[u8] = b"the stored contents";

    fn memory() -> DynBlobStore {
        Arc::new(ObjectStoreBlobs::new(
            Arc::new(InMemory::new()),
            "",
            "memory",
        ))
    }

    /// An in-memory store, the same store behind a fault wrapper, and its controller.
    fn wrapped(seed: u64) -> (DynBlobStore, FaultyStore, FaultController) {
        let inner = memory();
        let controller = FaultController::new(seed);
        let faulty = FaultyStore::new(inner.clone(), controller.clone());
        (inner, faulty, controller)
    }

    /// Asserts `result` is an injected `Unavailable` for `op` on `key` whose
    /// cause mentions `cause`.
    fn assert_injected<T: std::fmt::Debug>(
        result: Result<T, BlobError>,
        op: Op,
        key: &str,
        cause: &str,
    ) {
        match result {
            Err(BlobError::Unavailable {
                op: failed,
                key: failed_key,
                source,
                ..
            }) => {
                assert_eq!(failed, op);
                assert_eq!(failed_key, key);
                assert!(source.to_string().contains(cause), "cause: {source}");
            }
            other => panic!("expected an injected failure of {op} on {key}, got {other:?}"),
        }
    }

    fn is_injected<T>(result: &Result<T, BlobError>) -> bool {
        matches!(result, Err(BlobError::Unavailable { .. }))
    }

    /// Runs one call of `op` on `key` (a listing prefix for `List`) and says
    /// whether it failed with an injected `Unavailable`; the precondition
    /// errors a call may meet count as not injected.
    async fn injected_on(store: &FaultyStore, op: Op, key: &str) -> bool {
        let bytes = Bytes::from_static(CONTENTS);
        match op {
            Op::Create => is_injected(&store.create(key, bytes).await),
            Op::Update => is_injected(&store.update(key, &Version::default(), bytes).await),
            Op::Get => is_injected(&store.get(key).await),
            Op::Head => is_injected(&store.head(key).await),
            Op::List => is_injected(&store.list(key).await),
            Op::Delete => is_injected(&store.delete(key).await),
        }
    }

    fn differing_bits(a: &[u8], b: &[u8]) -> u32 {
        assert_eq!(a.len(), b.len(), "corruption keeps the length");
        a.iter().zip(b).map(|(x, y)| (x ^ y).count_ones()).sum()
    }

    /// A fail-before create or update returns the injected error and leaves the store as it was.
    #[tokio::test]
    async fn fail_before_leaves_the_store_untouched() {
        let (inner, faulty, controller) = wrapped(1);
        let id = controller.add(FaultRule::new(Fault::FailBefore).ops(OpSet::of(&[Op::Create])));
        let created = faulty.create("a", Bytes::from_static(CONTENTS)).await;
        assert_injected(created, Op::Create, "a", "failed before applying");
        assert!(matches!(
            inner.head("a").await,
            Err(BlobError::NotFound { .. })
        ));

        controller.remove(id);
        let version = faulty
            .create("a", Bytes::from_static(CONTENTS))
            .await
            .unwrap();
        controller.add(FaultRule::new(Fault::FailBefore).ops(OpSet::WRITES));
        let updated = faulty
            .update("a", &version, Bytes::from_static(b"new"))
            .await;
        assert_injected(updated, Op::Update, "a", "failed before applying");
        assert_injected(faulty.delete("a").await, Op::Delete, "a", "failed before");
        let stored = inner.get("a").await.unwrap();
        assert_eq!(stored.bytes, CONTENTS);
        assert_eq!(stored.version, version);
        assert_eq!(controller.injected(), 3);
    }

    /// A fail-after write applies, then returns an error as if the response was lost.
    #[tokio::test]
    async fn fail_after_applies_the_write_and_loses_the_response() {
        let (inner, faulty, controller) = wrapped(1);
        controller.add(FaultRule::new(Fault::FailAfter).ops(OpSet::WRITES));
        let created = faulty.create("a", Bytes::from_static(CONTENTS)).await;
        assert_injected(created, Op::Create, "a", "response lost after applying");
        let stored = inner.get("a").await.unwrap();
        assert_eq!(stored.bytes, CONTENTS);

        let updated = faulty
            .update("a", &stored.version, Bytes::from_static(b"new"))
            .await;
        assert_injected(updated, Op::Update, "a", "response lost");
        assert_eq!(inner.get("a").await.unwrap().bytes, &b"new"[..]);

        assert_injected(faulty.delete("a").await, Op::Delete, "a", "response lost");
        assert!(matches!(
            inner.get("a").await,
            Err(BlobError::NotFound { .. })
        ));
    }

    /// A fixed delay holds the call back exactly that long in virtual time, then runs it.
    #[tokio::test(start_paused = true)]
    async fn delay_holds_the_call_back() {
        let (inner, faulty, controller) = wrapped(1);
        let started = Instant::now();
        faulty
            .create("a", Bytes::from_static(CONTENTS))
            .await
            .unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO);

        let delay = Duration::from_millis(250);
        controller.add(FaultRule::new(Fault::Delay(delay)).ops(OpSet::READS));
        let started = Instant::now();
        assert_eq!(faulty.get("a").await.unwrap().bytes, CONTENTS);
        let elapsed = started.elapsed();
        assert!(elapsed >= delay && elapsed < delay + Duration::from_millis(1));

        let started = Instant::now();
        faulty.delete("a").await.unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO, "writes are not targeted");
        assert!(matches!(
            inner.head("a").await,
            Err(BlobError::NotFound { .. })
        ));
        assert_eq!(
            controller.injected(),
            0,
            "delays are not counted as injected"
        );
    }

    /// A random delay stays within `[0, max]` (plus the timer's millisecond) and varies.
    #[tokio::test(start_paused = true)]
    async fn delay_up_to_stays_within_its_bound() {
        let (_, faulty, controller) = wrapped(5);
        let max = Duration::from_millis(100);
        controller.add(FaultRule::new(Fault::DelayUpTo(max)));
        let mut delays = Vec::new();
        for _ in 0..50 {
            let started = Instant::now();
            faulty.list("").await.unwrap();
            delays.push(started.elapsed());
        }
        assert!(delays.iter().all(|d| *d <= max + Duration::from_millis(1)));
        delays.sort();
        delays.dedup();
        assert!(delays.len() > 10, "random delays vary: {delays:?}");
    }

    /// While an outage is on every operation fails before applying; once off, none do.
    #[tokio::test]
    async fn an_outage_fails_every_call_until_it_ends() {
        let (inner, faulty, controller) = wrapped(1);
        let version = faulty
            .create("a", Bytes::from_static(CONTENTS))
            .await
            .unwrap();
        controller.set_outage(true);
        assert!(controller.outage());
        let bytes = Bytes::from_static(b"new");
        let cause = "failed before applying";
        assert_injected(
            faulty.create("b", bytes.clone()).await,
            Op::Create,
            "b",
            cause,
        );
        let updated = faulty.update("a", &version, bytes.clone()).await;
        assert_injected(updated, Op::Update, "a", cause);
        assert_injected(faulty.get("a").await, Op::Get, "a", cause);
        assert_injected(faulty.get_range("a", 0..3).await, Op::Get, "a", cause);
        assert_injected(faulty.head("a").await, Op::Head, "a", cause);
        assert_injected(faulty.list("").await, Op::List, "", cause);
        assert_injected(faulty.delete("a").await, Op::Delete, "a", cause);
        assert_eq!(controller.injected(), 7);
        assert_eq!(inner.get("a").await.unwrap().version, version);
        assert!(matches!(
            inner.head("b").await,
            Err(BlobError::NotFound { .. })
        ));

        controller.set_outage(false);
        assert!(!controller.outage());
        let version = faulty.update("a", &version, bytes.clone()).await.unwrap();
        assert_eq!(faulty.get("a").await.unwrap().version, version);
        assert_eq!(faulty.get_range("a", 0..3).await.unwrap(), bytes);
        assert_eq!(faulty.head("a").await.unwrap().version, version);
        assert_eq!(faulty.list("").await.unwrap().len(), 1);
        faulty.create("b", bytes).await.unwrap();
        faulty.delete("a").await.unwrap();
        assert_eq!(controller.injected(), 7);
    }

    /// Corruption flips exactly one bit of what a read returns and never the stored object.
    #[tokio::test]
    async fn corrupt_flips_one_bit_of_a_read_only() {
        let (inner, faulty, controller) = wrapped(3);
        faulty
            .create("a", Bytes::from_static(CONTENTS))
            .await
            .unwrap();
        faulty.create("empty", Bytes::new()).await.unwrap();
        controller.add(FaultRule::new(Fault::Corrupt));
        let mut corrupted = Vec::new();
        for _ in 0..20 {
            let read = faulty.get("a").await.unwrap().bytes;
            assert_eq!(differing_bits(&read, CONTENTS), 1);
            corrupted.push(read);
            let range = faulty.get_range("a", 4..10).await.unwrap();
            assert_eq!(differing_bits(&range, &CONTENTS[4..10]), 1);
        }
        corrupted.sort();
        corrupted.dedup();
        assert!(corrupted.len() > 1, "the flipped bit is random");
        assert!(faulty.get("empty").await.unwrap().bytes.is_empty());
        assert_eq!(faulty.head("a").await.unwrap().size, CONTENTS.len() as u64);
        assert_eq!(inner.get("a").await.unwrap().bytes, CONTENTS);
    }

    /// A rule restricted to some operations fails exactly those operations.
    #[tokio::test]
    async fn op_set_targets_only_the_named_operations() {
        assert_eq!(
            OpSet::WRITES,
            OpSet::of(&[Op::Create, Op::Update, Op::Delete])
        );
        assert_eq!(OpSet::READS, OpSet::of(&[Op::Get, Op::Head, Op::List]));
        assert!(Op::ALL.iter().all(|op| OpSet::ALL.contains(*op)));
        assert!(Op::ALL.iter().all(|op| !OpSet::of(&[]).contains(*op)));

        let (_, faulty, controller) = wrapped(1);
        faulty
            .create("k", Bytes::from_static(CONTENTS))
            .await
            .unwrap();
        let targeted = [Op::Update, Op::Get, Op::List];
        controller.add(FaultRule::new(Fault::FailBefore).ops(OpSet::of(&targeted)));
        for op in Op::ALL {
            let injected = injected_on(&faulty, op, "k").await;
            assert_eq!(injected, targeted.contains(&op), "op={op}");
            assert_eq!(controller.calls(op), 1 + u64::from(op == Op::Create));
        }
        assert!(is_injected(&faulty.get_range("k", 0..1).await));
    }

    /// Which keys (and listing prefixes) `Any`, `Prefix` and `Exact` rules hit.
    #[tokio::test]
    async fn key_match_targets_only_matching_keys() {
        let keys = ["a/1", "a/10", "a/2", "b/1"];
        let cases = [
            (KeyMatch::Any, vec!["a/1", "a/10", "a/2", "b/1"]),
            (KeyMatch::Prefix("a/1".to_owned()), vec!["a/1", "a/10"]),
            (KeyMatch::Exact("a/1".to_owned()), vec!["a/1"]),
        ];
        for (keys_matched, expected) in cases {
            let (_, faulty, controller) = wrapped(1);
            controller.add(FaultRule::new(Fault::FailBefore).keys(keys_matched.clone()));
            let mut hit = Vec::new();
            for key in keys {
                if injected_on(&faulty, Op::Head, key).await {
                    hit.push(key);
                }
            }
            assert_eq!(hit, expected, "{keys_matched:?}");
        }

        let (_, faulty, controller) = wrapped(1);
        controller.add(FaultRule::new(Fault::FailBefore).keys(KeyMatch::Prefix("a".to_owned())));
        assert!(injected_on(&faulty, Op::List, "a").await);
        assert!(!injected_on(&faulty, Op::List, "b").await);
        assert!(!injected_on(&faulty, Op::List, "").await);
    }

    /// `times` caps how often a rule fires, also together with a probability.
    #[tokio::test]
    async fn times_limits_how_often_a_rule_fires() {
        let (_, faulty, controller) = wrapped(1);
        controller.add(FaultRule::new(Fault::FailBefore).times(3));
        let mut outcomes = Vec::new();
        for _ in 0..6 {
            outcomes.push(injected_on(&faulty, Op::Head, "k").await);
        }
        assert_eq!(outcomes, [true, true, true, false, false, false]);
        assert_eq!(controller.injected(), 3);

        let (_, faulty, controller) = wrapped(1);
        controller.add(FaultRule::new(Fault::FailBefore).probability(0.5).times(5));
        let mut failures = 0;
        for _ in 0..200 {
            failures += u32::from(injected_on(&faulty, Op::Head, "k").await);
        }
        assert_eq!(failures, 5);
    }

    /// Probability 0 never fires, 1 always does, and 0.5 fires on some calls only.
    #[tokio::test]
    async fn probability_sets_how_often_a_rule_fires() {
        for (probability, low, high) in [(0.0, 0, 0), (1.0, 200, 200), (0.5, 60, 140)] {
            let (_, faulty, controller) = wrapped(9);
            controller.add(FaultRule::new(Fault::FailBefore).probability(probability));
            let mut failures = 0;
            for _ in 0..200 {
                failures += u32::from(injected_on(&faulty, Op::Head, "k").await);
            }
            assert!(
                (low..=high).contains(&failures),
                "probability={probability} failures={failures}"
            );
            assert_eq!(controller.injected(), u64::from(failures));
        }
    }

    /// A probability outside `[0, 1]` is refused when the rule is built.
    #[test]
    #[should_panic(expected = "probability out of range")]
    fn probability_out_of_range_is_refused() {
        let _ = FaultRule::new(Fault::FailBefore).probability(1.5);
    }

    /// Removing a rule stops its faults; clearing drops every rule and ends the outage.
    #[tokio::test]
    async fn remove_and_clear_stop_faults() {
        let (_, faulty, controller) = wrapped(1);
        let heads = controller.add(FaultRule::new(Fault::FailBefore).ops(OpSet::of(&[Op::Head])));
        controller.add(FaultRule::new(Fault::FailBefore).ops(OpSet::of(&[Op::List])));
        controller.remove(heads);
        assert!(!injected_on(&faulty, Op::Head, "k").await);
        assert!(injected_on(&faulty, Op::List, "k").await);
        controller.set_outage(true);
        controller.clear();
        assert!(!controller.outage());
        assert!(!injected_on(&faulty, Op::Head, "k").await);
        assert!(!injected_on(&faulty, Op::List, "k").await);
    }

    /// What 200 reads under random failures, corruption and delays see, from `seed`.
    async fn trace(seed: u64) -> Vec<(Duration, Option<Bytes>)> {
        let (_, faulty, controller) = wrapped(seed);
        faulty
            .create("k", Bytes::from_static(CONTENTS))
            .await
            .unwrap();
        let rules = [
            FaultRule::new(Fault::FailBefore).probability(0.5),
            FaultRule::new(Fault::Corrupt).probability(0.5),
            FaultRule::new(Fault::DelayUpTo(Duration::from_millis(20))).probability(0.5),
        ];
        for rule in rules {
            controller.add(rule);
        }
        let mut seen = Vec::new();
        for _ in 0..200 {
            let started = Instant::now();
            let read = faulty.get("k").await;
            assert!(read.is_ok() || is_injected(&read));
            seen.push((started.elapsed(), read.ok().map(|blob| blob.bytes)));
        }
        seen
    }

    /// The same seed replays the same faults; a different seed gives different ones.
    #[tokio::test(start_paused = true)]
    async fn the_seed_decides_the_fault_sequence() {
        let first = trace(42).await;
        assert_eq!(first, trace(42).await);
        assert_ne!(first, trace(43).await);
        let clean = Some(Bytes::from_static(CONTENTS));
        assert!(first.iter().any(|(_, read)| read.is_none()));
        assert!(first.iter().any(|(_, read)| *read == clean));
        assert!(
            first
                .iter()
                .any(|(_, read)| read.is_some() && *read != clean)
        );
        assert!(first.iter().any(|(delay, _)| !delay.is_zero()));
    }

    fn fields(value: &str) -> Fields {
        Fields::from([("field".to_owned(), value.to_owned())])
    }

    fn assert_register_injected<T: std::fmt::Debug>(result: Result<T, RegisterError>) {
        assert!(
            matches!(result, Err(RegisterError::Unavailable { .. })),
            "expected an injected failure, got {result:?}"
        );
    }

    /// A fail-before register write fails and leaves the register as it was.
    #[tokio::test]
    async fn register_fail_before_leaves_the_register_untouched() {
        let inner = MemoryRegister::new();
        let controller = FaultController::new(1);
        let faulty = FaultyRegister::new(Arc::new(inner.clone()), controller.clone());
        let writes = controller.add(FaultRule::new(Fault::FailBefore).ops(OpSet::WRITES));
        assert_register_injected(faulty.create(&fields("one")).await);
        assert_eq!(inner.read().await.unwrap(), None);

        controller.remove(writes);
        let version = faulty.create(&fields("one")).await.unwrap();
        controller.add(
            FaultRule::new(Fault::FailBefore).keys(KeyMatch::Exact(REGISTER_FAULT_KEY.to_owned())),
        );
        assert_register_injected(faulty.update(&version, &fields("two")).await);
        assert_register_injected(faulty.read().await);
        let stored = inner.read().await.unwrap().unwrap();
        assert_eq!((stored.version, stored.fields), (version, fields("one")));
        assert_eq!(controller.calls(Op::Create), 2);
        assert_eq!(controller.calls(Op::Update), 1);
        assert_eq!(controller.calls(Op::Get), 1);
    }

    /// A fail-after register write applies, then fails as if the response was lost.
    #[tokio::test]
    async fn register_fail_after_applies_the_write() {
        let inner = MemoryRegister::new();
        let controller = FaultController::new(1);
        let faulty = FaultyRegister::new(Arc::new(inner.clone()), controller.clone());
        controller.add(FaultRule::new(Fault::FailAfter).ops(OpSet::WRITES));
        controller.add(FaultRule::new(Fault::Corrupt));
        assert_register_injected(faulty.create(&fields("one")).await);
        let created = inner.read().await.unwrap().unwrap();
        assert_eq!(created.fields, fields("one"));

        assert_register_injected(faulty.update(&created.version, &fields("two")).await);
        let updated = faulty.read().await.unwrap().unwrap();
        assert_ne!(updated.version, created.version);
        assert_eq!(updated.fields, fields("two"), "corruption does not apply");
    }
}
