//! etcd's Cluster service: MemberList names the nodes serving the database;
//! membership changes answer `Unimplemented` (nodes join by starting on the
//! same stores).
//!
//! Every node serving etcd announces itself in the database's member
//! directory ([`chorus::members`]) with its etcd client URLs, every 10 s
//! (`announce`). The list holds this node first (its name is its lease
//! holder id, its client URLs the configured etcd URLs), then every other
//! node announced within the last 30 s, and the lease holder if it is not
//! among them (with no client URL: it announced none lately). A member's
//! peer URL is its holder id when that is a URL (by default, the node's
//! advertised HTTP URL). So `etcdctl endpoint status --cluster` reaches
//! every live node, and Status's `leader` names the one that leads.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use chorus::members::{Member, REFRESH_INTERVAL};
use chorus::runtime::RuntimeStatus;
use tonic::{Request, Response, Status};

use crate::identity::stable_id;
use crate::proto::etcdserverpb as pb;
use crate::server::{Shared, every};
use crate::unserved::not_served_unary;

/// etcd's Cluster service; see the module docs.
#[derive(Debug)]
pub struct ClusterService {
    shared: Arc<Shared>,
}

impl ClusterService {
    pub(crate) fn new(shared: Arc<Shared>) -> ClusterService {
        ClusterService { shared }
    }

    /// This node, the other nodes announced lately, and the primary.
    fn members(&self, status: &RuntimeStatus, announced: Vec<Member>) -> Vec<pb::Member> {
        let own = status.holder.as_str();
        let mut members = vec![member(own, self.shared.config.client_urls.clone())];
        for other in announced.into_iter().filter(|m| m.holder != own) {
            let urls = other.endpoints.get(ETCD).cloned().unwrap_or_default();
            members.push(member(&other.holder, urls));
        }
        let primary = status.lease.as_ref().filter(|lease| !lease.released);
        if let Some(lease) = primary {
            let holder = lease.holder_id.as_str();
            if members.iter().all(|member| member.name != holder) {
                members.push(member(holder, Vec::new()));
            }
        }
        members
    }
}

/// The name of the etcd protocol's endpoints in an announcement.
pub(crate) const ETCD: &str = "etcd";

/// The member `holder`, reached on `client_urls`.
fn member(holder: &str, client_urls: Vec<String>) -> pb::Member {
    pb::Member {
        id: stable_id(holder),
        name: holder.to_owned(),
        peer_ur_ls: peer_urls(holder),
        client_ur_ls: client_urls,
        is_learner: false,
    }
}

/// Announces this node's etcd client URLs in the member directory every
/// [`REFRESH_INTERVAL`] until `stop` resolves; a failed write is logged and
/// tried again at the next interval.
pub(crate) async fn announce(shared: Arc<Shared>, stop: impl Future<Output = ()>) {
    let directory = tokio::sync::Mutex::new(shared.runtime.member_directory());
    let holder = shared.runtime.config().holder.clone();
    let endpoints = BTreeMap::from([(ETCD.to_owned(), shared.config.client_urls.clone())]);
    every(REFRESH_INTERVAL, stop, || async {
        let announced = directory.lock().await.announce(&holder, &endpoints).await;
        if let Err(error) = announced {
            tracing::warn!(%error, "cannot announce this node in the member directory");
        }
    })
    .await;
}

/// A holder id that is a URL, as the peer URL of its member.
fn peer_urls(holder: &str) -> Vec<String> {
    if holder.starts_with("http://") || holder.starts_with("https://") {
        vec![holder.to_owned()]
    } else {
        Vec::new()
    }
}

#[tonic::async_trait]
impl pb::cluster_server::Cluster for ClusterService {
    async fn member_list(
        &self,
        _: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        let announced = match self.shared.runtime.member_directory().list().await {
            Ok(announced) => announced,
            Err(error) => {
                tracing::warn!(%error, "MemberList without the member directory");
                Vec::new()
            }
        };
        let status = self.shared.runtime.status();
        Ok(Response::new(pb::MemberListResponse {
            header: Some(self.shared.header()),
            members: self.members(&status, announced),
        }))
    }

    not_served_unary! { "Cluster":
        member_add(pb::MemberAddRequest) -> pb::MemberAddResponse = "MemberAdd";
        member_remove(pb::MemberRemoveRequest) -> pb::MemberRemoveResponse = "MemberRemove";
        member_update(pb::MemberUpdateRequest) -> pb::MemberUpdateResponse = "MemberUpdate";
        member_promote(pb::MemberPromoteRequest) -> pb::MemberPromoteResponse = "MemberPromote";
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_url_holder_is_a_peer_url() {
        assert_eq!(peer_urls("http://10.0.0.1:7070"), ["http://10.0.0.1:7070"]);
        assert_eq!(peer_urls("https://node"), ["https://node"]);
        assert!(peer_urls("node-7").is_empty());
    }
}
