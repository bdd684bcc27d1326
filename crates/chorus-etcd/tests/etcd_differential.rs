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
//! answer. Keep-alives go through the generated gRPC client on both sides
//! ([`WholeKeepAlives`]), so their whole answer is compared. Both sides
//! serve watches, so the workload's seeded watches are drawn, compared and
//! closed before the takeover and at the end of each seed.

#[path = "../../chorus/tests/support/etcd_watch_answers.rs"]
mod etcd_watch_answers;
#[path = "../../chorus/tests/support/etcd_workload.rs"]
mod etcd_workload;
mod support;

/// The real etcd, where the shared workload expects it.
use support::etcd as etcd_server;

use chorus_etcd::proto::etcdserverpb as pb;
use etcd_client::WatchClient;
use etcd_client::proto::{PbLeaseKeepAliveResponse, PbResponseHeader};
use etcd_workload::{
    Answer, Clients, RealEtcd, Request, Side, check_coverage, connect, ops_per_seed, run_seed,
    seeds, send,
};
use support::Served;
use support::memory_runtime::{MemoryStores, wait_for_takeover, wait_until};
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;

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

    fn watch_client(&self) -> Option<WatchClient> {
        Some(self.clients.watch.clone())
    }
}

/// A side with a gRPC endpoint.
trait Endpoint {
    /// The URL its clients connect to now.
    fn endpoint(&self) -> String;
}

impl Endpoint for RealEtcd {
    fn endpoint(&self) -> String {
        self.server.endpoint().to_owned()
    }
}

impl Endpoint for ChorusOverGrpc {
    fn endpoint(&self) -> String {
        self.primary.endpoint()
    }
}

/// A side whose keep-alives go through the generated gRPC client, so the
/// whole first answer of the stream is compared: `etcd-client` reads it
/// itself and keeps only whether its TTL was above 0.
struct WholeKeepAlives<S>(S);

impl<S: Side + Endpoint> Side for WholeKeepAlives<S> {
    fn name(&self) -> String {
        self.0.name()
    }

    async fn answer(&mut self, request: &Request) -> Answer {
        match request {
            Request::LeaseKeepAlive { id } => keep_alive_once(&self.0.endpoint(), *id).await,
            _ => self.0.answer(request).await,
        }
    }

    fn serves_lease_reads(&self) -> bool {
        self.0.serves_lease_reads()
    }

    async fn midpoint(&mut self) {
        self.0.midpoint().await
    }

    async fn before(&mut self, op: usize) {
        self.0.before(op).await
    }

    fn log_tail(&self) -> String {
        self.0.log_tail()
    }

    fn watch_client(&self) -> Option<WatchClient> {
        self.0.watch_client()
    }
}

/// One keep-alive of lease `id` on a stream of its own, its first answer
/// with the deployment's ids zeroed (the stream stays open until then).
async fn keep_alive_once(endpoint: &str, id: i64) -> Answer {
    let channel = match tonic::transport::Endpoint::from_shared(endpoint.to_owned())
        .expect("a valid endpoint")
        .connect()
        .await
    {
        Ok(channel) => channel,
        Err(error) => return Answer::Failed(format!("cannot connect to {endpoint}: {error}")),
    };
    let mut lease = pb::lease_client::LeaseClient::new(channel);
    let (requests, stream) = mpsc::channel(1);
    requests
        .send(pb::LeaseKeepAliveRequest { id })
        .await
        .expect("the stream is open");
    let answer = match lease.lease_keep_alive(ReceiverStream::new(stream)).await {
        Ok(answers) => answers.into_inner().message().await,
        Err(status) => Err(status),
    };
    drop(requests);
    match answer {
        Ok(Some(answer)) => Answer::LeaseKeepAlive(PbLeaseKeepAliveResponse {
            header: answer.header.map(|header| PbResponseHeader {
                revision: header.revision,
                ..PbResponseHeader::default()
            }),
            id: answer.id,
            ttl: answer.ttl,
        }),
        Ok(None) => Answer::Failed("the keep-alive stream ended unanswered".into()),
        Err(status) if status.code() == tonic::Code::Unavailable => {
            Answer::Failed(format!("unavailable: {}", status.message()))
        }
        Err(status) => Answer::Refused {
            code: format!("{:?}", status.code()),
            message: status.message().to_owned(),
        },
    }
}

/// Chorus over gRPC answers every seed as the real etcd does, through a
/// takeover in the middle of each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chorus_over_grpc_answers_every_seed_as_etcd_does() {
    let ops = ops_per_seed();
    for seed in seeds(DEFAULT_SEEDS) {
        let Some(etcd) = RealEtcd::start("oracle").await else {
            return;
        };
        let mut etcd = WholeKeepAlives(etcd);
        let mut chorus = WholeKeepAlives(ChorusOverGrpc::start(seed).await);
        let outcome = run_seed(seed, ops, &mut etcd, &mut chorus).await;
        chorus.0.shut_down().await;
        match outcome {
            Ok(tally) => check_coverage(seed, ops, &tally),
            Err(difference) => panic!("{difference}"),
        }
    }
}
