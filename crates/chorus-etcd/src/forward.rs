//! A standby forwards what only the primary can answer, as an etcd
//! follower forwards proposals to its leader.
//!
//! etcd's clients spread requests over every endpoint they are given
//! (round robin in Go's clientv3, power-of-two-choices in the Rust
//! client) and do not retry a write elsewhere, so a standby that refused
//! writes would fail about half of a multi-endpoint client's writes even
//! with a healthy primary. Instead a standby sends writes, linearizable
//! reads and the lease RPCs that need the primary's deadlines to the
//! primary's etcd endpoint, found from the writer lease's holder and the
//! member directory ([`chorus::members`]), and relays the answer.
//!
//! - A forwarded request carries [`FORWARDED`]; it is never forwarded
//!   again, so two nodes that each think the other leads (during a
//!   takeover) answer `Unavailable` rather than pass it back and forth.
//! - No primary known, or no endpoint announced for it: `Unavailable`
//!   naming why, nothing sent, as before.
//! - An `https://` primary is reached over TLS: the standby trusts the CA
//!   of [`PeerTls`](crate::PeerTls) and presents its certificate; without
//!   one it answers `Unavailable` saying so.
//! - The primary's own answers (refusals included) are relayed as they are.
//!   A connection that could not be made (refused, unreachable) sent
//!   nothing: `Unavailable`, "the primary cannot be reached (nothing was
//!   sent)". A connection lost mid-call, or no answer in time, is
//!   `Unavailable` with etcd's "request timed out, possibly due to previous
//!   leader failure": the request may have reached it, so a write's outcome
//!   is unknown.

use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use chorus::runtime::Role;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Status};

use crate::cluster::ETCD;
use crate::server::Shared;

/// The metadata key a forwarded request carries.
pub const FORWARDED: &str = "chorus-forwarded";

/// How long a forwarded call may take before it is answered as unknown.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

/// How long connecting to the primary may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Returns from the enclosing RPC with the primary's answer when `$request`
/// should be forwarded (see [`Shared::should_forward`]): `$client` is the
/// generated client type, `$method` the RPC.
macro_rules! forward_if_standby {
    ($shared:expr, $request:ident, $client:ident, $method:ident) => {
        if $shared.should_forward(&$request) {
            return $shared
                .forward($request.into_inner(), |channel, request| async move {
                    $client::new(channel).$method(request).await
                })
                .await;
        }
    };
}
pub(crate) use forward_if_standby;

/// The channel to the primary last forwarded to.
#[derive(Debug, Default)]
pub(crate) struct Forwarder {
    primary: Mutex<Option<(String, Channel)>>,
}

impl Forwarder {
    fn cached(&self, holder: &str) -> Option<Channel> {
        let cached = self.primary.lock().unwrap_or_else(PoisonError::into_inner);
        match cached.as_ref() {
            Some((cached, channel)) if cached == holder => Some(channel.clone()),
            _ => None,
        }
    }

    fn remember(&self, holder: &str, channel: Channel) {
        let mut cached = self.primary.lock().unwrap_or_else(PoisonError::into_inner);
        *cached = Some((holder.to_owned(), channel));
    }

    /// Drops the cached channel: the next call connects afresh (the
    /// primary may have moved to another endpoint).
    pub(crate) fn forget(&self) {
        *self.primary.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl Shared {
    /// Whether `request` should go to the primary: this node is a standby
    /// (or still booting, when another node may lead) and the request was
    /// not forwarded to it already.
    pub(crate) fn should_forward<T>(&self, request: &Request<T>) -> bool {
        request.metadata().get(FORWARDED).is_none()
            && !self.runtime.is_primary_and_sure()
            && matches!(self.runtime.status().role, Role::Standby | Role::Booting)
    }

    /// The primary's etcd channel, or why there is none.
    pub(crate) async fn primary_channel(&self) -> Result<Channel, Status> {
        let status = self.runtime.status();
        let own = status.holder.as_str();
        let holder = status
            .lease
            .as_ref()
            .filter(|lease| !lease.released && lease.holder_id.as_str() != own)
            .map(|lease| lease.holder_id.as_str().to_owned())
            .ok_or_else(|| {
                Status::unavailable("chorus: not the primary, and no primary is known")
            })?;
        if let Some(channel) = self.forwarder.cached(&holder) {
            return Ok(channel);
        }
        let members = self
            .runtime
            .member_directory()
            .list()
            .await
            .map_err(|error| {
                Status::unavailable(format!(
                    "chorus: not the primary; the primary {holder} cannot be looked up: {error}"
                ))
            })?;
        let url = members
            .iter()
            .find(|member| member.holder == holder)
            .and_then(|member| member.endpoints.get(ETCD)?.first().cloned())
            .ok_or_else(|| {
                Status::unavailable(format!(
                    "chorus: not the primary; the primary {holder} announces no etcd endpoint"
                ))
            })?;
        let endpoint = Endpoint::from_shared(url.clone()).map_err(|error| {
            Status::unavailable(format!(
                "chorus: not the primary; the primary's endpoint {url} is not a URL: {error}"
            ))
        })?;
        let endpoint = self.secured(endpoint, &url)?;
        let channel = endpoint.connect_timeout(CONNECT_TIMEOUT).connect_lazy();
        self.forwarder.remember(&holder, channel.clone());
        Ok(channel)
    }

    /// `endpoint` (at `url`) over TLS when `url` is `https://`: trusting the
    /// configured CA and presenting this node's certificate.
    fn secured(&self, endpoint: Endpoint, url: &str) -> Result<Endpoint, Status> {
        if !url.starts_with("https://") {
            return Ok(endpoint);
        }
        let tls = self.config.peer_tls.as_ref().ok_or_else(|| {
            Status::unavailable(format!(
                "chorus: not the primary; the primary's endpoint {url} is TLS and this node has \
                 no CA to verify it (--trusted-ca-file)"
            ))
        })?;
        let config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&tls.ca_pem))
            .identity(Identity::from_pem(&tls.certificate_pem, &tls.key_pem));
        endpoint.tls_config(config).map_err(|error| {
            Status::unavailable(format!(
                "chorus: not the primary; cannot set up TLS to the primary's endpoint {url}: {error}"
            ))
        })
    }

    /// Sends `message` to the primary with `call`, marked as forwarded, and
    /// relays its answer; see the module docs for the failures.
    pub(crate) async fn forward<T, R, F, Fut>(&self, message: T, call: F) -> Result<R, Status>
    where
        F: FnOnce(Channel, Request<T>) -> Fut,
        Fut: Future<Output = Result<R, Status>>,
    {
        let channel = self.primary_channel().await?;
        let mut request = Request::new(message);
        request
            .metadata_mut()
            .insert(FORWARDED, "1".parse().expect("ASCII metadata"));
        let answer = tokio::time::timeout(FORWARD_TIMEOUT, call(channel, request)).await;
        match answer {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(status)) if is_relayed(&status) => Err(status),
            Ok(Err(status)) if never_connected(&status) => {
                self.forwarder.forget();
                Err(Status::unavailable(format!(
                    "chorus: not the primary, and the primary cannot be reached (nothing was \
                     sent): {}",
                    status.message()
                )))
            }
            Ok(Err(status)) => {
                self.forwarder.forget();
                Err(unknown_outcome(&status.to_string()))
            }
            Err(_) => {
                self.forwarder.forget();
                Err(unknown_outcome("no answer in time"))
            }
        }
    }
}

/// Whether `status` is the primary's own answer rather than a failure to
/// reach it: every status etcd or Chorus answers has a message of its own;
/// a broken transport answers `Unavailable`, `Unknown` or `Cancelled` with
/// the transport's words.
fn is_relayed(status: &Status) -> bool {
    let message = status.message();
    message.starts_with("etcdserver: ")
        || message.starts_with("chorus: ")
        || message.starts_with("grpc: ")
        || !matches!(
            status.code(),
            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
        )
}

/// Whether `status` says the connection to the primary was never made, so
/// the request was never sent: a definite refusal, not an unknown outcome.
fn never_connected(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::HostUnreachable
                    | std::io::ErrorKind::NetworkUnreachable
                    | std::io::ErrorKind::AddrNotAvailable
            );
        }
        source = error.source();
    }
    false
}

/// The answer when the primary may or may not have received the request.
fn unknown_outcome(why: &str) -> Status {
    Status::unavailable(format!(
        "etcdserver: request timed out, possibly due to previous leader failure \
         (chorus: forwarded to the primary, which may have applied it; read before retrying: {why})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb as pb;

    #[tokio::test]
    async fn a_refused_connection_is_told_apart_from_a_lost_answer() {
        // Nothing listens on a port just bound and closed.
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let channel = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect_lazy();
        let mut client = pb::kv_client::KvClient::new(channel);
        let refused = client.put(pb::PutRequest::default()).await.unwrap_err();
        assert!(!is_relayed(&refused), "{refused:?}");
        assert!(never_connected(&refused), "{refused:?}");
        assert!(!never_connected(&Status::unavailable("h2 stream reset")));
    }

    #[test]
    fn the_primarys_answers_are_relayed_and_transport_failures_are_unknown() {
        let refusal = Status::invalid_argument("etcdserver: key is not provided");
        assert!(is_relayed(&refusal));
        let standby = Status::unavailable("chorus: not the primary: role=standby");
        assert!(is_relayed(&standby));
        let broken = Status::unavailable("tcp connect error: Connection refused");
        assert!(!is_relayed(&broken));
        let reset = Status::unknown("h2 protocol error: stream reset");
        assert!(!is_relayed(&reset));
        assert!(unknown_outcome("x").message().contains("may have applied"));
    }
}
