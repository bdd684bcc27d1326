//! etcd's Cluster service: MemberList names the nodes serving the database
//! as far as this node knows them; membership changes answer
//! `Unimplemented` (nodes join by starting on the same stores).
//!
//! The list holds this node (its name is its lease holder id, its client
//! URLs the configured etcd URLs) and, on a standby that knows the lease
//! holder, the primary too. A member's peer URL is its holder id when that
//! is a URL (by default, the node's advertised HTTP URL). The primary's etcd
//! client URLs are not known to a standby, so it lists none for it.

use std::sync::Arc;

use chorus::runtime::RuntimeStatus;
use tonic::{Request, Response, Status};

use crate::identity::stable_id;
use crate::proto::etcdserverpb as pb;
use crate::server::Shared;
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

    /// This node, and the primary if it is another node known here.
    fn members(&self, status: &RuntimeStatus) -> Vec<pb::Member> {
        let own = status.holder.as_str();
        let mut members = vec![pb::Member {
            id: self.shared.identity.member_id,
            name: own.to_owned(),
            peer_ur_ls: peer_urls(own),
            client_ur_ls: self.shared.config.client_urls.clone(),
            is_learner: false,
        }];
        let primary = status.lease.as_ref().filter(|lease| !lease.released);
        if let Some(lease) = primary.filter(|lease| lease.holder_id.as_str() != own) {
            let holder = lease.holder_id.as_str();
            members.push(pb::Member {
                id: stable_id(holder),
                name: holder.to_owned(),
                peer_ur_ls: peer_urls(holder),
                client_ur_ls: Vec::new(),
                is_learner: false,
            });
        }
        members
    }
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
        let status = self.shared.runtime.status();
        Ok(Response::new(pb::MemberListResponse {
            header: Some(self.shared.header()),
            members: self.members(&status),
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
