//! etcd's Maintenance service: Status (`etcdctl endpoint status`,
//! Kubernetes' version and size checks), Alarm (`etcdctl alarm list` and
//! `disarm`; `endpoint health` lists the alarms), HashKV (`etcdctl
//! endpoint hashkv`: the same hash on every node at one revision) and
//! Defragment (nothing to defragment: it succeeds at once). Hash, Snapshot,
//! MoveLeader and Downgrade answer `Unimplemented`.
//!
//! Alarms are etcd's: raised and cleared by log records, so every node
//! lists the same ones. The primary raises NOSPACE itself when a write
//! would take the state (keys, values and retained history) past the space
//! quota (see `Shared::write` in the server module); while it is raised, writes
//! that add data are refused with etcd's "database space exceeded" until
//! `etcdctl alarm disarm` clears it.
//!
//! Status maps etcd's raft fields onto the runtime: the leader is the lease
//! holder's member id, `raft_index` and `raft_applied_index` the applied end
//! of the log (how many records are applied here), `raft_term` the lease's
//! term, `db_size` and `db_size_in_use` the bytes of the current keys and
//! values plus the retained history.

use std::sync::Arc;

use chorus::kv::etcd::{AlarmAction, AlarmMember, AlarmRequest, AlarmType};
use chorus::kv::{EtcdCommand, EtcdResponse};
use tonic::{Request, Response, Status};

use crate::error;
use crate::forward::forward_if_standby;
use crate::identity::{leader_id, raft_term};
use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::server::{Shared, mismatched};
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

/// etcd's text for a raised alarm in Status's errors.
fn alarm_text(alarm: &AlarmMember) -> String {
    let name = match alarm.alarm {
        AlarmType::NoSpace => "NOSPACE",
        AlarmType::Corrupt => "CORRUPT",
    };
    format!("memberID:{} alarm:{name} ", alarm.member_id)
}

fn alarm_member(alarm: &AlarmMember) -> pb::AlarmMember {
    let kind = match alarm.alarm {
        AlarmType::NoSpace => pb::AlarmType::Nospace,
        AlarmType::Corrupt => pb::AlarmType::Corrupt,
    };
    pb::AlarmMember {
        member_id: alarm.member_id,
        alarm: kind as i32,
    }
}

#[tonic::async_trait]
impl pb::maintenance_server::Maintenance for MaintenanceService {
    type SnapshotStream = NoStream<pb::SnapshotResponse>;

    async fn status(
        &self,
        _: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let runtime = &self.shared.runtime;
        let ((revision, size, alarms), applied) = runtime.read_stale(|state| {
            let alarms: Vec<String> = state.alarms().iter().map(alarm_text).collect();
            (state.revision(), state.space_bytes(), alarms)
        });
        let size = i64::try_from(size).unwrap_or(i64::MAX);
        let status = runtime.status();
        let leader = leader_id(&status);
        let mut header = None;
        self.shared.fill_header(&mut header, revision);
        let mut errors = alarms;
        if leader.is_none() {
            errors.push(NO_LEADER.to_owned());
        }
        Ok(Response::new(pb::StatusResponse {
            header,
            version: EMULATED_ETCD_VERSION.to_owned(),
            db_size: size,
            leader: leader.unwrap_or(0),
            raft_index: applied.0,
            raft_term: raft_term(&status),
            raft_applied_index: applied.0,
            errors,
            db_size_in_use: size,
            is_learner: false,
            ..Default::default()
        }))
    }

    /// GET lists the raised alarms (of one kind, or all for NONE) as
    /// applied here; ACTIVATE and DEACTIVATE are records on the primary,
    /// answering the alarm raised or cleared (none for NONE, or a clear of
    /// an alarm not raised), as etcd does.
    async fn alarm(
        &self,
        request: Request<pb::AlarmRequest>,
    ) -> Result<Response<pb::AlarmResponse>, Status> {
        use pb::alarm_request::AlarmAction as Action;
        if request.get_ref().action != Action::Get as i32 {
            forward_if_standby!(self.shared, request, MaintenanceClient, alarm);
        }
        let request = request.into_inner();
        let action = Action::try_from(request.action).map_err(|_| {
            Status::invalid_argument(format!("unknown alarm action: {}", request.action))
        })?;
        let kind = match pb::AlarmType::try_from(request.alarm) {
            Ok(pb::AlarmType::None) => None,
            Ok(pb::AlarmType::Nospace) => Some(AlarmType::NoSpace),
            Ok(pb::AlarmType::Corrupt) => Some(AlarmType::Corrupt),
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "unknown alarm: {}",
                    request.alarm
                )));
            }
        };
        let (alarms, revision) = match (action, kind) {
            (Action::Get, kind) => {
                let (listed, _) = self.shared.runtime.read_stale(|state| {
                    let raised = state.alarms().iter();
                    let of_kind = raised.filter(|a| kind.is_none_or(|kind| a.alarm == kind));
                    (of_kind.copied().collect::<Vec<_>>(), state.revision())
                });
                listed
            }
            (_, None) => (Vec::new(), self.shared.header().revision),
            (Action::Activate | Action::Deactivate, Some(alarm)) => {
                let member = AlarmMember {
                    member_id: request.member_id,
                    alarm,
                };
                let action = match action {
                    Action::Activate => AlarmAction::Activate,
                    _ => AlarmAction::Deactivate,
                };
                let command = EtcdCommand::Alarm(AlarmRequest { action, member });
                match self.shared.write(command).await? {
                    EtcdResponse::Alarm(answer) => (answer.alarms, answer.header_revision),
                    other => return Err(mismatched(&other)),
                }
            }
        };
        let mut header = None;
        self.shared.fill_header(&mut header, revision);
        Ok(Response::new(pb::AlarmResponse {
            header,
            alarms: alarms.iter().map(alarm_member).collect(),
        }))
    }

    /// The hash of the state and retained history at a revision (see
    /// `KvState::hash_kv`), as applied on this node.
    async fn hash_kv(
        &self,
        request: Request<pb::HashKvRequest>,
    ) -> Result<Response<pb::HashKvResponse>, Status> {
        let revision = request.into_inner().revision;
        let (hashed, current) = self
            .shared
            .runtime
            .read_stale(|state| (state.hash_kv(revision), state.revision()))
            .0;
        let (hash, compact_revision, hash_revision) =
            hashed.map_err(|refusal| error::refused(&refusal))?;
        let mut header = None;
        self.shared.fill_header(&mut header, current);
        Ok(Response::new(pb::HashKvResponse {
            header,
            hash,
            compact_revision,
            hash_revision,
        }))
    }

    /// Nothing to defragment: the state is in memory and the log's objects
    /// are immutable; it succeeds at once, as tools expect.
    async fn defragment(
        &self,
        _: Request<pb::DefragmentRequest>,
    ) -> Result<Response<pb::DefragmentResponse>, Status> {
        Ok(Response::new(pb::DefragmentResponse {
            header: Some(self.shared.header()),
        }))
    }

    not_served_unary! { "Maintenance":
        hash(pb::HashRequest) -> pb::HashResponse = "Hash";
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
