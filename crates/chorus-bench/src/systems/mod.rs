//! The systems compared: each opened fresh over latency-injected in-memory
//! stores, then fed records one at a time by the open-loop driver.

mod chorus_log;

pub use chorus_log::Settings as ChorusSettings;
mod naive;
mod slate;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chorus::blob::DynBlobStore;
use chorus::timer::Timer;
use futures::future::BoxFuture;

use crate::floor::majority;
use crate::models::{Scenario, by_name};
use crate::store::{Charger, Counters, InjectedBlobs, InjectedStore};

/// Any error a system reports.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The acknowledgement of one record: resolves once it is durable.
pub type Ack = BoxFuture<'static, Result<(), Error>>;

/// The system turned a record away at once (its own backpressure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused;

/// One system under test, open and ready for records.
pub trait System: Send + Sync {
    /// Starts writing record number `seq`; the returned future resolves when
    /// the record is durable. Must not block: the driver calls it on schedule.
    fn submit(&self, seq: u64, record: Bytes) -> Result<Ack, Refused>;

    /// Stops the system cleanly once everything submitted has resolved.
    fn close(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>>;
}

/// The systems a comparison can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SystemKind {
    /// Chorus over this many replicas (1, 3 or 5), register in its own store.
    Chorus(usize),
    /// SlateDB on one store, each put awaited until durable, flushing its
    /// write-ahead log at this interval.
    SlateDb(Duration),
    /// SlateDB on one store with its write-ahead log on a Chorus log over
    /// this many replicas (`chorus-slatedb`), each put awaited until durable.
    SlateDbOnChorus(usize),
    /// One object per record, created on this many stores, acknowledged
    /// by a majority. On one store it is the measured floor: one store
    /// request per record, nothing else.
    Naive(usize),
}

impl SystemKind {
    /// Every system, in report order.
    pub const ALL: [SystemKind; 9] = [
        SystemKind::Chorus(1),
        SystemKind::Chorus(3),
        SystemKind::Chorus(5),
        SystemKind::SlateDb(slate::DEFAULT_FLUSH_INTERVAL),
        SystemKind::SlateDb(Duration::from_millis(10)),
        SystemKind::SlateDb(Duration::from_millis(1)),
        SystemKind::SlateDbOnChorus(3),
        SystemKind::Naive(1),
        SystemKind::Naive(3),
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> String {
        match self {
            SystemKind::Chorus(replicas) => format!("chorus-{replicas}"),
            SystemKind::SlateDb(flush) => format!("slatedb-{}ms", flush.as_millis()),
            SystemKind::SlateDbOnChorus(replicas) => format!("slatedb-chorus-{replicas}"),
            SystemKind::Naive(stores) => format!("naive-{stores}"),
        }
    }

    /// How many stores a record goes to and how many must acknowledge it:
    /// what the physical floor of this system is computed over.
    pub fn quorum(self) -> (usize, usize) {
        match self {
            SystemKind::Chorus(replicas)
            | SystemKind::SlateDbOnChorus(replicas)
            | SystemKind::Naive(replicas) => (replicas, majority(replicas)),
            SystemKind::SlateDb(_) => (1, 1),
        }
    }

    /// Whether this is one of SlateDB's configurations with its own WAL.
    pub fn is_slatedb(self) -> bool {
        matches!(self, SystemKind::SlateDb(_))
    }

    /// Whether it runs on a paused clock (`compare --virtual-time`): SlateDB
    /// keeps threads and timers of its own, which the clock would not wait
    /// for.
    pub fn runs_on_virtual_time(self) -> bool {
        matches!(self, SystemKind::Chorus(_) | SystemKind::Naive(_))
    }

    /// Opens a fresh instance whose stores follow `scenario` around `base`
    /// (store `i` seeded with `seed + i`, its delays ended by `timer`),
    /// counting requests into `counters`.
    pub async fn open(
        self,
        scenario: Scenario,
        base: Duration,
        seed: u64,
        counters: &Arc<Counters>,
        chorus: &ChorusSettings,
        timer: Timer,
    ) -> Result<Box<dyn System>, Error> {
        let (replicas, _) = self.quorum();
        // Store `position`'s delays and counts, whichever face it gets.
        let charger = |position: usize| {
            let latency = scenario.replica(base, position);
            Charger::new(latency, seed + position as u64, Arc::clone(counters), timer)
        };
        let store = |position: usize| InjectedStore::memory(charger(position));
        let blobs = |position: usize, name: String| InjectedBlobs::memory(name, charger(position));
        let replica_blobs = |prefix: &str| -> Vec<DynBlobStore> {
            (0..replicas)
                .map(|position| blobs(position, format!("memory://{prefix}-{position}")))
                .collect()
        };
        // The register lives in a store of its own, past the odd one out.
        let register = || blobs(replicas, "memory://register".to_owned());
        Ok(match self {
            SystemKind::Chorus(_) => {
                Box::new(chorus_log::open(replica_blobs("replica"), register(), chorus).await?)
            }
            SystemKind::SlateDb(flush) => {
                Box::new(slate::open((0..replicas).map(store).collect(), flush).await?)
            }
            // SlateDB's bucket next, past the register: fast like the others
            // in every scenario but the slow-replica ones' odd one out.
            SystemKind::SlateDbOnChorus(_) => Box::new(
                slate::open_on_chorus(
                    store(replicas + 1),
                    replica_blobs("replica"),
                    register(),
                    chorus,
                )
                .await?,
            ),
            SystemKind::Naive(_) => Box::new(naive::open(replica_blobs("naive"))),
        })
    }
}

impl fmt::Display for SystemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl FromStr for SystemKind {
    type Err = String;

    fn from_str(name: &str) -> Result<SystemKind, String> {
        by_name("system", &SystemKind::ALL, name, SystemKind::name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let names: Vec<_> = SystemKind::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(
            names,
            [
                "chorus-1",
                "chorus-3",
                "chorus-5",
                "slatedb-100ms",
                "slatedb-10ms",
                "slatedb-1ms",
                "slatedb-chorus-3",
                "naive-1",
                "naive-3"
            ]
        );
        for system in SystemKind::ALL {
            assert_eq!(system.name().parse::<SystemKind>(), Ok(system));
        }
        assert!("chorus-2".parse::<SystemKind>().is_err());
    }

    #[test]
    fn quorums() {
        assert_eq!(SystemKind::Chorus(5).quorum(), (5, 3));
        assert_eq!(
            SystemKind::SlateDb(Duration::from_millis(1)).quorum(),
            (1, 1)
        );
        assert_eq!(SystemKind::Naive(3).quorum(), (3, 2));
    }

    /// Every system writes a record durably and closes, over fast stores.
    #[tokio::test]
    async fn every_system_acknowledges_a_record_and_closes() {
        for kind in SystemKind::ALL {
            let counters = Arc::new(Counters::default());
            let latency = Duration::from_millis(1);
            let system = kind
                .open(
                    Scenario::Fixed,
                    latency,
                    1,
                    &counters,
                    &Default::default(),
                    Timer::Precise,
                )
                .await
                .unwrap();
            let before = counters.snapshot();
            let ack = system
                .submit(0, Bytes::from_static(b"record"))
                .unwrap_or_else(|_| panic!("{kind} refused"));
            ack.await.unwrap();
            assert!(counters.snapshot().since(&before).put_class > 0, "{kind}");
            system.close().await.unwrap();
        }
    }

    /// On a paused clock (`compare --virtual-time`) a cell of chorus-3 and
    /// of naive-3 under heavy tails acknowledges every record and repeats
    /// exactly for its seed, latency for latency.
    #[test]
    fn on_a_paused_clock_a_cell_repeats_exactly() {
        let cell = |kind: SystemKind| {
            crate::compare::runtime(true).block_on(async {
                let counters = Arc::new(Counters::default());
                let base = Duration::from_millis(100);
                let system = kind
                    .open(
                        Scenario::LogNormal,
                        base,
                        7,
                        &counters,
                        &Default::default(),
                        Timer::Tokio,
                    )
                    .await
                    .unwrap();
                let load = crate::driver::Load {
                    rate: 500.0,
                    records: 400,
                    warmup: 0,
                    max_outstanding: 1000,
                    drain: Duration::from_secs(60),
                    timer: Timer::Tokio,
                };
                let run =
                    crate::driver::run(system.as_ref(), &load, &Bytes::from(vec![7; 4096])).await;
                system.close().await.unwrap();
                run
            })
        };
        for kind in [SystemKind::Chorus(3), SystemKind::Naive(3)] {
            assert!(kind.runs_on_virtual_time());
            let first = cell(kind);
            assert_eq!(first.acked, 400, "{kind}: {first:?}");
            assert_eq!(cell(kind), first, "{kind} differs between two runs");
            // The heavy tail is there (in the real clock's runs, p99 is about
            // twice p50 for both).
            let at = |q: usize| first.latencies[first.latencies.len() * q / 100];
            assert!(
                at(99) > at(50) * 3 / 2,
                "{kind}: p50 {:?}, p99 {:?}",
                at(50),
                at(99)
            );
        }
        assert!(!SystemKind::SlateDb(Duration::from_millis(1)).runs_on_virtual_time());
    }
}
