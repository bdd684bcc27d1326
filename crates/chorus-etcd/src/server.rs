//! The etcd service as a whole: what its RPCs share, the routes of every
//! service, and a server on a listener.

use std::future::Future;
use std::sync::Arc;

use chorus::kv::KvState;
use chorus::runtime::{Runtime, Unavailable};
use tokio::net::TcpListener;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::service::{Routes, RoutesBuilder};
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Status};
use tower::util::MapResponseLayer;

use crate::cluster::ClusterService;
use crate::config::EtcdConfig;
use crate::error;
use crate::identity::{Identity, raft_term};
use crate::kv::KvService;
use crate::maintenance::MaintenanceService;
use crate::proto::etcdserverpb::{
    ResponseHeader, auth_server, cluster_server, kv_server, lease_server, maintenance_server,
    watch_server,
};
use crate::unserved::{AuthService, LeaseService};
use crate::watch::WatchService;

/// What every RPC of the service reads: the runtime, the settings and the ids.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) runtime: Arc<Runtime<KvState>>,
    pub(crate) config: EtcdConfig,
    pub(crate) identity: Identity,
}

impl Shared {
    /// Fills a top-level answer's header: its revision (set by the state
    /// machine's answer, or `revision` if none) and this node's ids and term.
    pub(crate) fn fill_header(&self, header: &mut Option<ResponseHeader>, revision: i64) {
        let header = header.get_or_insert_with(ResponseHeader::default);
        if header.revision == 0 {
            header.revision = revision;
        }
        header.cluster_id = self.identity.cluster_id;
        header.member_id = self.identity.member_id;
        header.raft_term = raft_term(&self.runtime.status());
    }

    /// A full header at the store revision applied here.
    pub(crate) fn header(&self) -> ResponseHeader {
        let (revision, _) = self.runtime.read_stale(KvState::revision);
        let mut header = None;
        self.fill_header(&mut header, revision);
        header.unwrap_or_default()
    }

    /// Reads the state: every acknowledged write (`serializable` false, on
    /// the primary only) or whatever was applied here.
    pub(crate) fn read<T>(
        &self,
        serializable: bool,
        read: impl FnOnce(&KvState) -> T,
    ) -> Result<T, Status> {
        if serializable {
            return Ok(self.runtime.read_stale(read).0);
        }
        self.runtime
            .read(read)
            .map(|(value, _)| value)
            .map_err(|unavailable: Unavailable| error::unavailable(&unavailable))
    }
}

/// etcd's v3 gRPC API over a runtime: KV, Watch, Maintenance and Cluster
/// (in part), Lease and Auth answering `Unimplemented`, and
/// `grpc.health.v1` reporting SERVING.
///
/// ```no_run
/// # async fn example(runtime: std::sync::Arc<chorus::runtime::Runtime<chorus::kv::KvState>>) {
/// use chorus_etcd::{EtcdConfig, EtcdService};
/// let service = EtcdService::new(runtime, EtcdConfig::new("s3://bucket/db"));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:2379").await.unwrap();
/// chorus_etcd::serve(listener, service, std::future::pending()).await.unwrap();
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct EtcdService {
    shared: Arc<Shared>,
    watch: WatchService,
}

impl EtcdService {
    /// The service of `runtime`'s database; this node's member id comes
    /// from the runtime's holder id.
    pub fn new(runtime: Arc<Runtime<KvState>>, config: EtcdConfig) -> EtcdService {
        let identity = Identity::new(&config.database, runtime.config().holder.as_str());
        let watch = WatchService::new(
            Arc::clone(&runtime),
            identity,
            config.watch.clone(),
            config.max_message_bytes(),
        );
        EtcdService {
            shared: Arc::new(Shared {
                runtime,
                config,
                identity,
            }),
            watch,
        }
    }

    /// The Watch service (its streams' pending bytes, for status).
    pub fn watch(&self) -> &WatchService {
        &self.watch
    }

    /// This node's cluster and member ids.
    pub fn identity(&self) -> Identity {
        self.shared.identity
    }

    /// Every service's routes, each decoding messages up to the configured
    /// limit (see [`EtcdConfig::max_message_bytes`]). Serve them behind
    /// [`oversize_layer`], as [`serve`] does, so an over-limit message is
    /// refused as etcd refuses it.
    pub fn routes(&self) -> Routes {
        let limit = self.shared.config.max_message_bytes();
        let shared = &self.shared;
        let (_reporter, health) = tonic_health::server::health_reporter();
        let mut routes = RoutesBuilder::default();
        routes
            .add_service(health)
            .add_service(
                kv_server::KvServer::new(KvService::new(Arc::clone(shared)))
                    .max_decoding_message_size(limit),
            )
            .add_service(
                maintenance_server::MaintenanceServer::new(MaintenanceService::new(Arc::clone(
                    shared,
                )))
                .max_decoding_message_size(limit),
            )
            .add_service(
                cluster_server::ClusterServer::new(ClusterService::new(Arc::clone(shared)))
                    .max_decoding_message_size(limit),
            )
            .add_service(
                watch_server::WatchServer::new(self.watch.clone()).max_decoding_message_size(limit),
            )
            .add_service(
                lease_server::LeaseServer::new(LeaseService).max_decoding_message_size(limit),
            )
            .add_service(
                auth_server::AuthServer::new(AuthService).max_decoding_message_size(limit),
            );
        routes.routes()
    }
}

/// Serves `service` on `listener` until `shutdown` resolves, then stops
/// accepting and waits for the RPCs in flight.
pub async fn serve(
    listener: TcpListener,
    service: EtcdService,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .layer(oversize_layer())
        .add_routes(service.routes())
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await
}

/// The connections accepted on `listener`, with Nagle's algorithm off, as
/// etcd's (Go's) are: otherwise a small response (a put's answer, a watch
/// event) written while an earlier one is unacknowledged waits for the
/// client's delayed ACK, up to 40 ms on Linux.
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// The layer that answers a message over the decoding limit as etcd's gRPC
/// server does (grpc-go's `ResourceExhausted`, "received message larger than
/// max"), where tonic would answer `OutOfRange`, the code etcd reserves for
/// compacted and future revisions.
pub fn oversize_layer() -> MapResponseLayer<fn(http::Response<Body>) -> http::Response<Body>> {
    MapResponseLayer::new(answer_oversize_as_etcd)
}

/// The start of tonic's message for a message over the decoding limit.
const TONIC_OVERSIZE: &str = "Error, decoded message length too large: found ";

fn answer_oversize_as_etcd(mut response: http::Response<Body>) -> http::Response<Body> {
    let Some(status) = Status::from_header_map(response.headers()) else {
        return response;
    };
    let Some(sizes) = status.message().strip_prefix(TONIC_OVERSIZE) else {
        return response;
    };
    if status.code() != Code::OutOfRange {
        return response;
    }
    // "N bytes, the limit is: M bytes"
    let numbers: Vec<&str> = sizes
        .split(|c: char| !c.is_ascii_digit())
        .filter(|part| !part.is_empty())
        .collect();
    let message = match numbers.as_slice() {
        [found, limit] => format!("grpc: received message larger than max ({found} vs. {limit})"),
        _ => "grpc: received message larger than max".to_owned(),
    };
    let etcd = Status::resource_exhausted(message);
    if etcd.add_header(response.headers_mut()).is_err() {
        tracing::warn!("cannot rewrite an oversize answer's status");
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_connections_have_nagles_algorithm_off() {
        use tonic::codegen::tokio_stream::StreamExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut accepted = incoming(listener);
        let _client = tokio::net::TcpStream::connect(address).await.unwrap();
        let connection = accepted.next().await.unwrap().unwrap();
        assert!(connection.nodelay().unwrap());
    }

    #[test]
    fn an_oversize_message_is_answered_as_etcds_grpc_server_does() {
        let tonic = Status::out_of_range(
            "Error, decoded message length too large: found 3145738 bytes, the limit is: 2097152 bytes",
        );
        let response = answer_oversize_as_etcd(tonic.into_http());
        let status = Status::from_header_map(response.headers()).unwrap();
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(
            status.message(),
            "grpc: received message larger than max (3145738 vs. 2097152)"
        );
        // Any other answer passes unchanged: etcd's own OutOfRange refusals too.
        let compacted =
            Status::out_of_range("etcdserver: mvcc: required revision has been compacted");
        let response = answer_oversize_as_etcd(compacted.into_http());
        let status = Status::from_header_map(response.headers()).unwrap();
        assert_eq!(status.code(), Code::OutOfRange);
    }
}
