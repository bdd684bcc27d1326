//! The etcd service as a whole: what its RPCs share, the routes of every
//! service, and a server on a listener.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chorus::kv::etcd::{AlarmAction, AlarmMember, AlarmRequest, AlarmType};
use chorus::kv::quota::NoSpace;
use chorus::kv::{Applied, EtcdCommand, EtcdError, EtcdResponse, KvState};
use chorus::runtime::{Runtime, Unavailable};
use tokio::net::TcpListener;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::service::{Routes, RoutesBuilder};
use tonic::transport::ServerTlsConfig;
use tonic::{Code, Response, Status};
use tower::util::MapResponseLayer;

use crate::cluster::{ClusterService, announce};
use crate::config::EtcdConfig;
use crate::error;
use crate::follow::{FollowService, follow_primary};
use crate::forward::Forwarder;
use crate::identity::{Identity, raft_term};
use crate::incoming::admitted;
use crate::kv::KvService;
use crate::lease::{LeaseClock, LeaseService, expire_leases};
use crate::maintenance::MaintenanceService;
use crate::proto::chorusfollowpb::follow_server::FollowServer;
use crate::proto::etcdserverpb::{
    ResponseHeader, auth_server, cluster_server, kv_server, lease_server, maintenance_server,
    watch_server,
};
use crate::unserved::AuthService;
use crate::watch::WatchService;

/// What every RPC of the service reads: the runtime, the settings and the ids.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) runtime: Arc<Runtime<KvState>>,
    pub(crate) config: EtcdConfig,
    pub(crate) identity: Identity,
    /// The primary's lease deadlines.
    pub(crate) leases: LeaseClock,
    /// On a standby: the channel to the primary.
    pub(crate) forwarder: Forwarder,
    /// Turns true when the node shuts down: LeaseKeepAlive streams end.
    pub(crate) closing: tokio::sync::watch::Sender<bool>,
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

    /// Appends `command` once it passes etcd's checks against the applied
    /// state and the space quota, and answers what applying it answered. A
    /// write over the quota is refused with etcd's NOSPACE error, and this
    /// node raises the NOSPACE alarm for itself (a record) unless raised.
    pub(crate) async fn write(&self, command: EtcdCommand) -> Result<EtcdResponse, Status> {
        let max_txn_ops = self.config.max_txn_ops;
        let quota = self.config.quota_backend_bytes;
        let mut over_quota = false;
        let written = self
            .runtime
            .write(|state| {
                command.validate(state, max_txn_ops)?;
                match state.check_space(command.quota_cost(), quota) {
                    Ok(()) => Ok(command.encode()),
                    // `validate` refused already if the alarm is raised, so
                    // a refusal here is the quota's: raise the alarm.
                    Err(refusal) => {
                        over_quota = matches!(refusal, NoSpace::OverQuota { .. });
                        Err(EtcdError::NoSpace)
                    }
                }
            })
            .await;
        if over_quota {
            self.raise_no_space().await;
        }
        let written = written.map_err(error::write_failed)?;
        match written.output {
            Applied::Etcd(Ok(response)) => Ok(response),
            Applied::Etcd(Err(refusal)) => Err(error::refused(&refusal)),
            other => Err(Status::internal(format!(
                "chorus: record {} applied as {other:?}, not as an etcd request",
                written.index
            ))),
        }
    }

    /// Raises NOSPACE for this node, as etcd's quota check does; a failure
    /// is logged (the next write over the quota tries again).
    async fn raise_no_space(&self) {
        let member = AlarmMember {
            member_id: self.identity.member_id,
            alarm: AlarmType::NoSpace,
        };
        let alarm = EtcdCommand::Alarm(AlarmRequest {
            action: AlarmAction::Activate,
            member,
        });
        let raised = self
            .runtime
            .write(|_| Ok::<_, EtcdError>(alarm.encode()))
            .await;
        match raised {
            Ok(_) => tracing::warn!(
                quota_backend_bytes = self.config.quota_backend_bytes,
                "NOSPACE alarm raised: the state reached the space quota; writes that add data \
                 are refused until `etcdctl alarm disarm`"
            ),
            Err(error) => tracing::warn!(%error, "cannot raise the NOSPACE alarm"),
        }
    }

    /// `response` with its header filled in.
    pub(crate) fn answer<T>(
        &self,
        mut response: T,
        header: impl FnOnce(&mut T) -> &mut Option<ResponseHeader>,
    ) -> Response<T> {
        self.fill_header(header(&mut response), 0);
        Response::new(response)
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

/// Runs `task` every `interval` (the first time at once; a late tick is
/// delayed, not bunched) until `stop` resolves, never cutting a run short.
pub(crate) async fn every<F, Fut>(interval: Duration, stop: impl Future<Output = ()>, mut task: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = &mut stop => return,
        }
        task().await;
    }
}

/// The answer of a write whose response kind did not match its request.
pub(crate) fn mismatched(response: &EtcdResponse) -> Status {
    Status::internal(format!("chorus: an etcd request answered {response:?}"))
}

/// etcd's v3 gRPC API over a runtime: KV, Watch, Lease, Maintenance and
/// Cluster (in part), Auth answering `Unimplemented`, and
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
                leases: LeaseClock::default(),
                forwarder: Forwarder::default(),
                closing: tokio::sync::watch::Sender::new(false),
            }),
            watch,
        }
    }

    /// The Watch service (its streams' pending bytes, for status).
    pub fn watch(&self) -> &WatchService {
        &self.watch
    }

    /// Expires leases while this node is the primary, until `stop`
    /// resolves: logs a revoke for each lease past its deadline (see
    /// [`lease`](crate::lease)). [`serve`] runs it; run it beside
    /// [`routes`](Self::routes) mounted elsewhere, or with no listener at
    /// all, so leases granted through another node still expire here.
    pub fn expire_leases<S: Future<Output = ()>>(
        &self,
        stop: S,
    ) -> impl Future<Output = ()> + use<S> {
        expire_leases(Arc::clone(&self.shared), stop)
    }

    /// Ends every Watch and LeaseKeepAlive stream, open or opened later,
    /// with `Unavailable` ([`SHUTTING_DOWN`](crate::error::SHUTTING_DOWN)),
    /// as a node shutting down must: those streams never end on their
    /// own, so a graceful stop waiting for them would hold the writer lease
    /// (and keep every client from writing) for its whole grace period.
    /// [`serve`] calls it when its shutdown future resolves.
    pub fn close_streams(&self) {
        self.watch.close_streams();
        self.shared.closing.send_replace(true);
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
                lease_server::LeaseServer::new(LeaseService::new(Arc::clone(shared)))
                    .max_decoding_message_size(limit),
            )
            .add_service(auth_server::AuthServer::new(AuthService).max_decoding_message_size(limit))
            .add_service(
                FollowServer::new(FollowService::new(Arc::clone(shared)))
                    .max_decoding_message_size(limit),
            );
        routes.routes()
    }
}

/// Serves `service` on `listener` until `shutdown` resolves, then stops
/// accepting, ends the streams ([`EtcdService::close_streams`]) and waits
/// for the RPCs in flight. Beside it, expires leases while this node leads
/// and announces this node in the member directory.
pub async fn serve(
    listener: TcpListener,
    service: EtcdService,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    serve_with(
        tonic::transport::Server::builder(),
        listener,
        service,
        shutdown,
    )
    .await
}

/// TLS on the etcd listener, as etcd's `--cert-file`, `--key-file` and
/// `--trusted-ca-file` set it: PEM text read (and checked) by the caller.
/// Its `Debug` leaves the key out.
#[derive(Clone)]
pub struct EtcdTls {
    /// The certificate chain the server presents, its own first.
    pub certificate_pem: Vec<u8>,
    /// The private key of that certificate.
    pub key_pem: Vec<u8>,
    /// The CA certificates that must have signed every client's
    /// certificate; `None`: clients present none.
    pub trusted_ca_pem: Option<Vec<u8>>,
    /// Bound on a client's TLS handshake; the connection is closed after it.
    pub handshake_timeout: Duration,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("certificate_pem_bytes", &self.certificate_pem.len())
            .field("key_pem", &"<redacted>")
            .field("trusted_ca", &self.trusted_ca_pem.is_some())
            .field("handshake_timeout", &self.handshake_timeout)
            .finish()
    }
}

/// [`serve`] over TLS: a client that presents no certificate, or one the
/// trusted CA did not sign, when one is required, fails the handshake and
/// reaches no RPC.
pub async fn serve_tls(
    listener: TcpListener,
    service: EtcdService,
    tls: &EtcdTls,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let mut config = ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(
            &tls.certificate_pem,
            &tls.key_pem,
        ))
        .timeout(tls.handshake_timeout);
    if let Some(ca) = &tls.trusted_ca_pem {
        config = config
            .client_ca_root(tonic::transport::Certificate::from_pem(ca))
            .client_auth_optional(false);
    }
    let builder = tonic::transport::Server::builder().tls_config(config)?;
    serve_with(builder, listener, service, shutdown).await
}

/// Serves `service` with `builder`'s transport; beside it, until the
/// server stops, expires leases, announces this node and, on a standby,
/// takes the primary's records ([`follow`](crate::follow)).
async fn serve_with(
    builder: tonic::transport::Server,
    listener: TcpListener,
    service: EtcdService,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let closer = service.clone();
    let shutdown = async move {
        shutdown.await;
        closer.close_streams();
    };
    let (stopped, stop) = tokio::sync::watch::channel(false);
    let until_stopped = move || {
        let mut stop = stop.clone();
        async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        }
    };
    let expiry = tokio::spawn(service.expire_leases(until_stopped()));
    let shared = Arc::clone(&service.shared);
    let incoming = admitted(listener, shared.config.max_connections);
    let announcing = tokio::spawn(announce(Arc::clone(&shared), until_stopped()));
    let following = tokio::spawn(follow_primary(shared, until_stopped()));
    let served = builder
        .layer(oversize_layer())
        .add_routes(service.routes())
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    let _ = stopped.send(true);
    let _ = tokio::join!(expiry, announcing, following);
    served
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
