//! The control store (the lease, `HEAD.json`, snapshot payloads) and each
//! process's view of it, with a wall clock of its own: what the lease phase
//! (`lease.rs`) and the runtime phase (`runtime/`) build their processes
//! from. The store is layered like a log replica (`world.rs`): a raw
//! in-memory store the checkers read, a recording layer, a fault injector
//! every process sees, and one fault injector per process.

use std::collections::BTreeSet;
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chorus::blob::{DynBlobStore, FaultController, FaultyStore};
use chorus::clock::{Clock, DynClock};
use chorus::lease::{DatabaseKey, LeaseConfig, LeaseStore};
use chorus::snapshot::{SnapshotConfig, SnapshotStore};
use rand::Rng;
use rand::rngs::StdRng;
use tokio::time::Instant;

use crate::world::{DirtyKeys, RecordedStore, WriteObserver};

/// Wall clock = virtual time since the run began + a base + this process's
/// skew; the monotonic face is virtual time, so lease deadlines follow the
/// paused tokio clock.
#[derive(Debug)]
pub struct SimClock {
    origin: Instant,
    origin_std: std::time::Instant,
    skew_ms: AtomicI64,
}

/// The wall clock's reading when a run begins (2026-01-01).
const WALL_BASE_MS: u64 = 1_767_225_600_000;

impl SimClock {
    /// A clock reading the base wall time at `origin`, with no skew.
    pub fn new(origin: Instant) -> SimClock {
        SimClock {
            origin,
            origin_std: std::time::Instant::now(),
            skew_ms: AtomicI64::new(0),
        }
    }

    /// Sets this clock's wall-clock skew.
    pub fn set_skew(&self, skew_ms: i64) {
        self.skew_ms.store(skew_ms, Ordering::Relaxed);
    }

    fn skew(&self) -> i64 {
        self.skew_ms.load(Ordering::Relaxed)
    }
}

impl Clock for SimClock {
    fn wall_ms(&self) -> u64 {
        let elapsed = self.origin.elapsed().as_millis() as u64;
        (WALL_BASE_MS + elapsed).saturating_add_signed(self.skew())
    }

    fn now(&self) -> std::time::Instant {
        self.origin_std + self.origin.elapsed()
    }
}

/// A phase's lease settings and how far apart its clocks may drift.
#[derive(Debug, Clone, Copy)]
pub struct LeaseTiming {
    /// The lease settings every process uses.
    pub config: LeaseConfig,
    /// The largest |skew| any clock is given.
    pub max_skew_ms: i64,
}

impl LeaseTiming {
    /// Draws a ttl from `ttl_ms`, a safety margin of 15–40 % of it, store
    /// calls of at most half the rest (and 1 s), and the skew bound: in nine
    /// seeds in ten ±(margin − 2 ms)/2, so no two clocks ever disagree by the
    /// margin; in the tenth twice the margin.
    pub fn draw(rng: &mut StdRng, ttl_ms: RangeInclusive<u64>) -> LeaseTiming {
        let ttl = Duration::from_millis(rng.random_range(ttl_ms));
        let safety_margin = ttl.mul_f64(rng.random_range(0.15..0.4));
        let store_call_timeout = ((ttl - safety_margin) / 2).min(Duration::from_secs(1));
        let config = LeaseConfig {
            ttl,
            safety_margin,
            store_call_timeout,
        };
        config
            .validate()
            .expect("the simulator draws valid lease settings");
        let margin_ms = safety_margin.as_millis() as i64;
        let max_skew_ms = if rng.random_bool(0.9) {
            (margin_ms - 2) / 2
        } else {
            margin_ms * 2
        };
        LeaseTiming {
            config,
            max_skew_ms,
        }
    }

    /// Whether every two clocks stay within the safety margin of each other
    /// for the whole phase, so that the checkers that assume it apply.
    /// Decided per seed: a lease acquired while two clocks disagreed may
    /// overlap another long after they agree again.
    pub fn clocks_agree(&self) -> bool {
        2 * self.max_skew_ms < self.config.safety_margin.as_millis() as i64
    }

    /// A skew for one clock, within the bound.
    pub fn draw_skew(&self, rng: &mut StdRng) -> i64 {
        rng.random_range(-self.max_skew_ms..=self.max_skew_ms)
    }

    /// A pause of 10 ms up to two ttls: long enough for leases to expire.
    pub fn draw_sleep(&self, rng: &mut StdRng) -> Duration {
        let ttl_ms = self.config.ttl.as_millis() as u64;
        Duration::from_millis(rng.random_range(10..=ttl_ms * 2))
    }
}

/// A phase's control store, shared by its processes.
#[derive(Debug)]
pub struct ControlStore {
    /// The raw store: what the checkers read.
    pub raw: DynBlobStore,
    dirty: DirtyKeys,
    /// Faults every process sees.
    pub faults: FaultController,
    shared: DynBlobStore,
}

impl ControlStore {
    /// A fresh store named `identity`, whose writes `observer` sees land;
    /// `fault_seed` seeds its shared fault controller.
    pub fn new(
        identity: &str,
        fault_seed: u64,
        observer: Option<Arc<dyn WriteObserver>>,
    ) -> ControlStore {
        let recorded = RecordedStore::new(identity, observer);
        let faults = FaultController::new(fault_seed);
        let shared: DynBlobStore = Arc::new(FaultyStore::new(recorded.store, faults.clone()));
        ControlStore {
            raw: recorded.raw,
            dirty: recorded.dirty,
            faults,
            shared,
        }
    }

    /// The keys written since the last call.
    pub fn take_dirty(&self) -> BTreeSet<String> {
        std::mem::take(&mut *self.dirty.lock().expect("dirty set"))
    }

    /// A new process's view: its own clock (no skew yet) and its own fault
    /// controller (seeded by `fault_seed`) over the shared store, and the
    /// lease and snapshot stores of `database` through them.
    pub fn view(
        &self,
        origin: Instant,
        database: &DatabaseKey,
        lease: LeaseConfig,
        snapshot: SnapshotConfig,
        fault_seed: u64,
    ) -> ControlView {
        let clock = Arc::new(SimClock::new(origin));
        let faults = FaultController::new(fault_seed);
        let store: DynBlobStore = Arc::new(FaultyStore::new(self.shared.clone(), faults.clone()));
        let dyn_clock: DynClock = clock.clone();
        let leases = LeaseStore::new(store.clone(), database.clone(), lease, dyn_clock.clone())
            .expect("valid lease settings");
        let snapshots = SnapshotStore::new(store, database.clone(), snapshot, dyn_clock);
        ControlView {
            clock,
            faults,
            leases,
            snapshots,
        }
    }
}

/// One process's view of the control store.
#[derive(Debug)]
pub struct ControlView {
    /// Its wall clock.
    pub clock: Arc<SimClock>,
    /// Faults only it sees (its partition, its lost responses).
    pub faults: FaultController,
    /// The lease, through its faults and on its clock.
    pub leases: LeaseStore,
    /// HEAD and payloads, likewise.
    pub snapshots: SnapshotStore,
}
