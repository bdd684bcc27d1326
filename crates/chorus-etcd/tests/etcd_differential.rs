//! The differential suite over gRPC: the shared seeded workload
//! (`crates/chorus/tests/support/etcd_workload.rs`, whose docs say what it
//! draws, how answers are compared and which variables choose the seeds)
//! sent through the `etcd-client` crate to a real etcd and to Chorus served
//! by this crate on a loopback port, every answer compared field by field.
//!
//! Chorus runs in this process on in-memory stores. Halfway through each
//! seed a second node takes over and the client switches to its endpoint:
//! on odd seeds a warm standby, served from the start and tailing the log;
//! on even seeds a cold node started then (it restores the final snapshot
//! the first one published when it shut down). The takeover must change no
//! answer.

#[path = "../../chorus/tests/support/etcd_workload.rs"]
mod etcd_workload;
mod support;

/// The real etcd, where the shared workload expects it.
use support::etcd as etcd_server;

use etcd_workload::{
    Answer, Clients, RealEtcd, Request, Side, check_coverage, connect, ops_per_seed, run_seed,
    seeds, send,
};
use support::Served;
use support::memory_runtime::{MemoryStores, wait_for_takeover, wait_until};

/// Seeds per run unless `CHORUS_ETCD_DIFF_SEEDS` says otherwise (25 to 35 s
/// each on a loaded 2-core machine): odd ones take over warm, even ones cold.
const DEFAULT_SEEDS: u64 = 3;

/// Chorus over gRPC: the node serving as primary, the warm standby on odd
/// seeds, and clients of the primary's endpoint.
struct ChorusOverGrpc {
    seed: u64,
    stores: MemoryStores,
    primary: Served,
    standby: Option<Served>,
    clients: Clients,
}

impl ChorusOverGrpc {
    async fn start(seed: u64) -> ChorusOverGrpc {
        let database = support::unique(&format!("etcd-grpc-diff-{seed}"));
        let stores = MemoryStores::new(&database, |store| store).await;
        let runtime = stores.runtime("http://first:1");
        wait_until("primary", || runtime.is_primary_and_sure()).await;
        let primary = support::serve_runtime(runtime, &database, |_| {}).await;
        let standby = if seed % 2 == 1 {
            let runtime = stores.runtime("http://second:2");
            Some(support::serve_runtime(runtime, &database, |_| {}).await)
        } else {
            None
        };
        let clients = connect(&primary.endpoint()).await;
        ChorusOverGrpc {
            seed,
            stores,
            primary,
            standby,
            clients,
        }
    }

    async fn shut_down(self) {
        let runtime = self.primary.runtime.clone();
        drop(self.primary);
        runtime.shutdown().await.expect("a clean shutdown");
    }
}

impl Side for ChorusOverGrpc {
    fn name(&self) -> String {
        format!("chorus at {}", self.primary.endpoint())
    }

    async fn answer(&mut self, request: &Request) -> Answer {
        send(&mut self.clients, request).await
    }

    fn serves_lease_reads(&self) -> bool {
        true
    }

    /// The primary stops serving and shuts down (its lease released); the
    /// next node takes over and the client switches to its endpoint.
    async fn midpoint(&mut self) {
        let (next, how) = match self.standby.take() {
            Some(warm) => (warm, "a warm standby"),
            None => {
                let runtime = self.stores.runtime("http://second:2");
                let database = self.stores.database.clone();
                let cold = support::serve_runtime(runtime, &database, |_| {}).await;
                (cold, "a cold start")
            }
        };
        let old = std::mem::replace(&mut self.primary, next);
        let old_runtime = old.runtime.clone();
        drop(old);
        old_runtime.shutdown().await.expect("a clean shutdown");
        wait_for_takeover(&self.primary.runtime, &format!("seed {}: {how}", self.seed)).await;
        self.clients = connect(&self.primary.endpoint()).await;
        eprintln!(
            "seed {}: {how} took over at {}",
            self.seed,
            self.primary.endpoint()
        );
    }
}

/// Chorus over gRPC answers every seed as the real etcd does, through a
/// takeover in the middle of each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chorus_over_grpc_answers_every_seed_as_etcd_does() {
    let ops = ops_per_seed();
    for seed in seeds(DEFAULT_SEEDS) {
        let Some(mut etcd) = RealEtcd::start("oracle").await else {
            return;
        };
        let mut chorus = ChorusOverGrpc::start(seed).await;
        let outcome = run_seed(seed, ops, &mut etcd, &mut chorus).await;
        chorus.shut_down().await;
        match outcome {
            Ok(tally) => check_coverage(seed, ops, &tally),
            Err(difference) => panic!("{difference}"),
        }
    }
}
