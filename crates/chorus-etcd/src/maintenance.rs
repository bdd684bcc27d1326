//! etcd's Maintenance service, as much as tools need to connect: Status
//! (`etcdctl endpoint status`, Kubernetes' version and size checks) and
//! Alarm (`etcdctl endpoint health` lists the alarms). The rest answers
//! `Unimplemented`.
//!
//! Status maps etcd's raft fields onto the runtime: the leader is the lease
//! holder's member id, `raft_index` and `raft_applied_index` the applied end
//! of the log (how many records are applied here), `raft_term` the lease's
//! term, `db_size` and `db_size_in_use` the bytes of the current keys and
//! values plus the retained history.

use std::sync::Arc;

use chorus::kv::KvState;
use tonic::{Request, Response, Status};

use crate::identity::{leader_id, raft_term};
use crate::proto::etcdserverpb as pb;
use crate::server::Shared;
use crate::unserved::{NoStream, not_served, not_served_unary};

/// The etcd version Status reports: the API this service emulates. Clients
/// gate features on it (Kubernetes needs a parseable 3.5.8 or later for
/// watch progress requests).
pub const EMULATED_ETCD_VERSION: &str = "3.5.17";

/// etcd's Status error while no leader is known.
const NO_LEADER: &str = "etcdserver: no leader";

/// etcd's Maintenance service; see the module docs.
#[derive(Debug)]
pub struct MaintenanceService {
    shared: Arc<Shared>,
}

impl MaintenanceService {
    pub(crate) fn new(shared: Arc<Shared>) -> MaintenanceService {
        MaintenanceService { shared }
    }
}

/// The bytes of the current keys and values plus the retained history: the
/// state's size, as etcd's `db_size` is its database file's. It walks every
/// key, so it costs time in proportion to the keys (Status is rare).
fn state_size_bytes(state: &KvState) -> i64 {
    let (entries, _) = state.list(b"", None, usize::MAX);
    let current: usize = entries
        .iter()
        .map(|(key, entry)| key.len() + entry.value.len())
        .sum();
    i64::try_from(current.saturating_add(state.history_bytes())).unwrap_or(i64::MAX)
}

#[tonic::async_trait]
impl pb::maintenance_server::Maintenance for MaintenanceService {
    type SnapshotStream = NoStream<pb::SnapshotResponse>;

    async fn status(
        &self,
        _: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let runtime = &self.shared.runtime;
        let ((revision, size), applied) =
            runtime.read_stale(|state| (state.revision(), state_size_bytes(state)));
        let status = runtime.status();
        let leader = leader_id(&status);
        let mut header = None;
        self.shared.fill_header(&mut header, revision);
        Ok(Response::new(pb::StatusResponse {
            header,
            version: EMULATED_ETCD_VERSION.to_owned(),
            db_size: size,
            leader: leader.unwrap_or(0),
            raft_index: applied.0,
            raft_term: raft_term(&status),
            raft_applied_index: applied.0,
            errors: leader.map_or_else(|| vec![NO_LEADER.to_owned()], |_| Vec::new()),
            db_size_in_use: size,
            is_learner: false,
            ..Default::default()
        }))
    }

    /// There are no alarms: GET lists none; DEACTIVATE finds none to clear,
    /// and ACTIVATE of no alarm does nothing, both answering the empty list
    /// as etcd does. Raising an alarm is not served.
    async fn alarm(
        &self,
        request: Request<pb::AlarmRequest>,
    ) -> Result<Response<pb::AlarmResponse>, Status> {
        use pb::alarm_request::AlarmAction;
        let request = request.into_inner();
        match AlarmAction::try_from(request.action) {
            Ok(AlarmAction::Get | AlarmAction::Deactivate) => {}
            Ok(AlarmAction::Activate) if request.alarm == pb::AlarmType::None as i32 => {}
            Ok(AlarmAction::Activate) => {
                return Err(not_served(
                    "etcdserverpb.Maintenance/Alarm (raising an alarm)",
                ));
            }
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "unknown alarm action: {}",
                    request.action
                )));
            }
        }
        Ok(Response::new(pb::AlarmResponse {
            header: Some(self.shared.header()),
            alarms: Vec::new(),
        }))
    }

    not_served_unary! { "Maintenance":
        defragment(pb::DefragmentRequest) -> pb::DefragmentResponse = "Defragment";
        hash(pb::HashRequest) -> pb::HashResponse = "Hash";
        hash_kv(pb::HashKvRequest) -> pb::HashKvResponse = "HashKV";
        move_leader(pb::MoveLeaderRequest) -> pb::MoveLeaderResponse = "MoveLeader";
        downgrade(pb::DowngradeRequest) -> pb::DowngradeResponse = "Downgrade";
    }

    async fn snapshot(
        &self,
        _: Request<pb::SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        Err(not_served("etcdserverpb.Maintenance/Snapshot"))
    }
}
