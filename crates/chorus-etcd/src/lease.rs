//! etcd's Lease service, and the primary's expiry of leases.
//!
//! - LeaseGrant, LeaseRevoke: one log record each, appended on the primary
//!   once etcd's checks pass (a revoke deletes the lease's keys at one
//!   revision, one DELETE event each).
//! - LeaseKeepAlive: a stream; each request renews the lease on the
//!   primary's [`Lessor`] (no record: etcd does not log renewals either)
//!   and answers its granted TTL, or TTL 0 for a lease that does not exist
//!   or already expired. A keep-alive is acknowledged only if this node is
//!   still a primary sure of its writer lease after renewing, so no
//!   successor can have started before the renewal (see
//!   [`chorus::kv::lessor`]). When the node shuts down the stream ends
//!   `Unavailable`, which etcd's clients take as "try another endpoint".
//! - LeaseTimeToLive: the primary's remaining TTL (whole seconds, rounded
//!   down as etcd does) and granted TTL, with the keys if asked; TTL -1 for
//!   a lease that does not exist.
//! - A standby forwards Grant, Revoke, TimeToLive and KeepAlive streams to
//!   the primary ([`forward`](crate::forward)): only the primary keeps
//!   deadlines; if it cannot, `Unavailable`.
//! - LeaseLeases: the ids, ascending, as applied on this node.
//!
//! Expiry (`expire_leases`): twice a second the primary brings its
//! lessor up to the lease table and logs a revoke record for each lease
//! past its deadline, at most [`MAX_REVOKES_IN_FLIGHT`] at a time. A
//! standby expires nothing; a new primary starts every deadline afresh, so
//! a failover extends leases by their TTL rather than expiring them.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chorus::ids::Epoch;
use chorus::kv::etcd::{LeaseGrantRequest, LeaseRevokeRequest};
use chorus::kv::lease::LeaseId;
use chorus::kv::lessor::Lessor;
use chorus::kv::{EtcdCommand, EtcdError, EtcdResponse, KvState};
use chorus::runtime::{Runtime, Unavailable};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::error;
use crate::forward::forward_if_standby;
use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::lease_client::LeaseClient;
use crate::server::{Shared, every, mismatched};

/// How often the primary looks for expired leases (etcd's lessor checks
/// twice a second too).
pub const EXPIRY_TICK: Duration = Duration::from_millis(500);

/// The most revoke records of expired leases appended at once.
pub const MAX_REVOKES_IN_FLIGHT: usize = 64;

/// Keep-alive answers queued for a client that does not read them; a
/// client that falls this far behind waits (its requests are not read).
const KEEP_ALIVE_QUEUE: usize = 16;

/// The primary's lease deadlines, and the clock they are kept in.
#[derive(Debug)]
pub(crate) struct LeaseClock {
    lessor: Mutex<Lessor>,
    started: Instant,
}

impl Default for LeaseClock {
    fn default() -> LeaseClock {
        LeaseClock {
            lessor: Mutex::default(),
            started: Instant::now(),
        }
    }
}

impl LeaseClock {
    /// Milliseconds since the clock started (monotonic).
    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn lessor(&self) -> MutexGuard<'_, Lessor> {
        // The lessor holds no invariant a panic elsewhere could break halfway.
        self.lessor.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The leases past their deadline, each once, after bringing the
    /// deadlines up to the applied lease table.
    fn expired(&self, runtime: &Runtime<KvState>) -> Vec<LeaseId> {
        let primacy = primacy(runtime);
        let now = self.now_ms();
        let mut lessor = self.lessor();
        runtime.read_stale(|state| lessor.sync(primacy, state.leases(), now));
        lessor.expired(now)
    }
}

/// The log epoch this node writes in, if it is a primary sure of its lease.
fn primacy(runtime: &Runtime<KvState>) -> Option<Epoch> {
    if !runtime.is_primary_and_sure() {
        return None;
    }
    runtime.status().epoch
}

/// The primacy, or the `Unavailable` a standby answers.
fn require_primacy(runtime: &Runtime<KvState>) -> Result<Epoch, Status> {
    primacy(runtime).ok_or_else(|| not_primary(runtime))
}

fn not_primary(runtime: &Runtime<KvState>) -> Status {
    match runtime.read(|_| ()) {
        Err(unavailable) => error::unavailable(&unavailable),
        Ok(_) => error::unavailable(&Unavailable::LeaseUncertain),
    }
}

/// Logs a revoke for every expired lease, every [`EXPIRY_TICK`], until
/// `stop` resolves. [`serve`](crate::serve) runs it; a caller mounting
/// [`routes`](crate::EtcdService::routes) itself runs
/// [`EtcdService::expire_leases`](crate::EtcdService::expire_leases).
pub(crate) async fn expire_leases(shared: Arc<Shared>, stop: impl Future<Output = ()>) {
    every(EXPIRY_TICK, stop, || async {
        let mut revokes = JoinSet::new();
        for id in shared.leases.expired(&shared.runtime) {
            if revokes.len() >= MAX_REVOKES_IN_FLIGHT {
                revokes.join_next().await;
            }
            revokes.spawn(revoke_expired(Arc::clone(&shared), id));
        }
        revokes.join_all().await;
    })
    .await;
}

/// Appends the revoke of expired lease `id`; hands it out again if the
/// append failed (it stays past its deadline).
async fn revoke_expired(shared: Arc<Shared>, id: LeaseId) {
    let command = EtcdCommand::LeaseRevoke(LeaseRevokeRequest { id });
    match shared.write(command).await {
        Ok(_) => tracing::info!(lease = id, "lease expired: revoked with its keys"),
        // Revoked by a client meanwhile.
        Err(status) if status.message() == EtcdError::LeaseNotFound.to_string() => {}
        Err(status) => {
            tracing::warn!(lease = id, error = %status.message(), "cannot revoke an expired lease; retrying");
            shared.leases.lessor().retry(id);
        }
    }
}

/// etcd's Lease service; see the module docs.
#[derive(Debug)]
pub struct LeaseService {
    shared: Arc<Shared>,
}

impl LeaseService {
    pub(crate) fn new(shared: Arc<Shared>) -> LeaseService {
        LeaseService { shared }
    }
}

impl LeaseService {
    /// A standby's keep-alive stream: one stream to the primary, the
    /// client's requests relayed to it and its answers back, until either
    /// side ends (the client then reconnects, as to any failed endpoint).
    async fn relay_keep_alives(
        &self,
        mut requests: Streaming<pb::LeaseKeepAliveRequest>,
    ) -> Result<Response<KeepAliveAnswers>, Status> {
        let (relayed, outbound) = mpsc::channel(KEEP_ALIVE_QUEUE);
        let mut inbound = self
            .shared
            .forward(
                ReceiverStream::new(outbound),
                |channel, request| async move {
                    LeaseClient::new(channel).lease_keep_alive(request).await
                },
            )
            .await?
            .into_inner();
        tokio::spawn(async move {
            while let Ok(Some(request)) = requests.message().await {
                if relayed.send(request).await.is_err() {
                    return;
                }
            }
        });
        let (answers, stream) = mpsc::channel(KEEP_ALIVE_QUEUE);
        let mut closing = self.shared.closing.subscribe();
        tokio::spawn(async move {
            loop {
                let answer = tokio::select! {
                    answer = inbound.message() => match answer {
                        Ok(Some(answer)) => Ok(answer),
                        Ok(None) => return,
                        Err(status) => Err(status),
                    },
                    () = error::closed(&mut closing) => Err(error::shutting_down()),
                };
                let last = answer.is_err();
                if answers.send(answer).await.is_err() || last {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(stream)))
    }
}

/// The keep-alive answers a client reads.
type KeepAliveAnswers = ReceiverStream<Result<pb::LeaseKeepAliveResponse, Status>>;

/// One keep-alive: the lease's granted TTL if renewed, 0 if it does not
/// exist or already expired.
fn keep_alive(shared: &Shared, id: LeaseId) -> Result<pb::LeaseKeepAliveResponse, Status> {
    let runtime = &shared.runtime;
    let primacy = require_primacy(runtime)?;
    let granted = shared.read(false, |state| state.leases().get(id).map(|l| l.ttl_secs))?;
    let now = shared.leases.now_ms();
    let renewed = granted.filter(|ttl| shared.leases.lessor().keep_alive(primacy, id, *ttl, now));
    // Sure after renewing: a successor starts every deadline later still.
    if !runtime.is_primary_and_sure() {
        return Err(not_primary(runtime));
    }
    Ok(pb::LeaseKeepAliveResponse {
        header: Some(shared.header()),
        id,
        ttl: renewed.unwrap_or(0),
    })
}

#[tonic::async_trait]
impl pb::lease_server::Lease for LeaseService {
    type LeaseKeepAliveStream = KeepAliveAnswers;

    async fn lease_grant(
        &self,
        request: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        forward_if_standby!(self.shared, request, LeaseClient, lease_grant);
        let request = request.into_inner();
        let command = EtcdCommand::LeaseGrant(LeaseGrantRequest {
            id: request.id,
            ttl: request.ttl,
        });
        let granted = match self.shared.write(command).await? {
            EtcdResponse::LeaseGrant(granted) => granted,
            other => return Err(mismatched(&other)),
        };
        // The deadline from now, rather than from the next expiry tick.
        if let Some(primacy) = primacy(&self.shared.runtime) {
            let now = self.shared.leases.now_ms();
            let mut lessor = self.shared.leases.lessor();
            lessor.keep_alive(primacy, granted.id, granted.ttl, now);
        }
        let mut response = pb::LeaseGrantResponse {
            header: None,
            id: granted.id,
            ttl: granted.ttl,
            error: String::new(),
        };
        self.shared
            .fill_header(&mut response.header, granted.header_revision);
        Ok(Response::new(response))
    }

    async fn lease_revoke(
        &self,
        request: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        forward_if_standby!(self.shared, request, LeaseClient, lease_revoke);
        let id = request.into_inner().id;
        let command = EtcdCommand::LeaseRevoke(LeaseRevokeRequest { id });
        match self.shared.write(command).await? {
            EtcdResponse::LeaseRevoke(revoked) => {
                let mut response = pb::LeaseRevokeResponse { header: None };
                self.shared
                    .fill_header(&mut response.header, revoked.header_revision);
                Ok(Response::new(response))
            }
            other => Err(mismatched(&other)),
        }
    }

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        if self.shared.should_forward(&request) {
            return self.relay_keep_alives(request.into_inner()).await;
        }
        require_primacy(&self.shared.runtime)?;
        let mut requests = request.into_inner();
        let (answers, stream) = mpsc::channel(KEEP_ALIVE_QUEUE);
        let shared = Arc::clone(&self.shared);
        tokio::spawn(async move {
            let mut closing = shared.closing.subscribe();
            loop {
                let request = tokio::select! {
                    request = requests.message() => request,
                    () = error::closed(&mut closing) => {
                        let _ = answers.send(Err(error::shutting_down())).await;
                        return;
                    }
                };
                let Ok(Some(request)) = request else {
                    return;
                };
                let answer = keep_alive(&shared, request.id);
                let last = answer.is_err();
                if answers.send(answer).await.is_err() || last {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(stream)))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        forward_if_standby!(self.shared, request, LeaseClient, lease_time_to_live);
        let request = request.into_inner();
        let primacy = require_primacy(&self.shared.runtime)?;
        let lease = self.shared.read(false, |state| {
            let lease = state.leases().get(request.id)?;
            let keys = match request.keys {
                true => lease.keys.iter().cloned().collect(),
                false => Vec::new(),
            };
            Some((lease.ttl_secs, keys))
        })?;
        let response = match lease {
            None => pb::LeaseTimeToLiveResponse {
                header: Some(self.shared.header()),
                id: request.id,
                ttl: -1,
                ..Default::default()
            },
            Some((granted, keys)) => {
                let now = self.shared.leases.now_ms();
                let remaining = self
                    .shared
                    .leases
                    .lessor()
                    .remaining_ms(primacy, request.id, now)
                    .map_or(granted, |ms| (ms / 1000) as i64);
                pb::LeaseTimeToLiveResponse {
                    header: Some(self.shared.header()),
                    id: request.id,
                    ttl: remaining,
                    granted_ttl: granted,
                    keys,
                }
            }
        };
        Ok(Response::new(response))
    }

    async fn lease_leases(
        &self,
        _: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        let leases = self.shared.read(true, |state| {
            let ids = state.leases().iter();
            ids.map(|(id, _)| pb::LeaseStatus { id }).collect()
        })?;
        Ok(Response::new(pb::LeaseLeasesResponse {
            header: Some(self.shared.header()),
            leases,
        }))
    }
}
