//! etcd's Lease and Auth services, registered so that each of their
//! RPCs answers `Unimplemented` naming itself (an unregistered service would
//! answer the same code, but with no word on what is missing). Clients such
//! as Kubernetes' fall back on `Unimplemented`; they must never see `Unknown`.

use std::pin::Pin;

use tonic::codegen::tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::proto::etcdserverpb as pb;

/// The answer of an RPC not served yet; `rpc` is its gRPC path.
pub fn not_served(rpc: &str) -> Status {
    Status::unimplemented(format!("chorus: {rpc} is not served yet"))
}

/// A server stream that is never produced (the RPC is refused first).
pub type NoStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Implements unary RPCs of `service` as [`not_served`], inside an
/// `#[tonic::async_trait]` impl. Written in the form that attribute gives
/// an `async fn`, because it rewrites only the methods it sees, not those a
/// macro expands to later.
macro_rules! not_served_unary {
    ($service:literal: $($method:ident($request:ty) -> $response:ty = $name:literal;)*) => {
        $(
            fn $method<'life0, 'async_trait>(
                &'life0 self,
                _: ::tonic::Request<$request>,
            ) -> ::std::pin::Pin<
                Box<
                    dyn ::std::future::Future<
                            Output = Result<::tonic::Response<$response>, ::tonic::Status>,
                        > + Send
                        + 'async_trait,
                >,
            >
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(async move {
                    Err($crate::unserved::not_served(concat!(
                        "etcdserverpb.", $service, "/", $name
                    )))
                })
            }
        )*
    };
}
pub(crate) use not_served_unary;

/// etcd's Lease service: not served yet.
#[derive(Debug, Clone, Copy, Default)]
pub struct LeaseService;

#[tonic::async_trait]
impl pb::lease_server::Lease for LeaseService {
    type LeaseKeepAliveStream = NoStream<pb::LeaseKeepAliveResponse>;

    not_served_unary! { "Lease":
        lease_grant(pb::LeaseGrantRequest) -> pb::LeaseGrantResponse = "LeaseGrant";
        lease_revoke(pb::LeaseRevokeRequest) -> pb::LeaseRevokeResponse = "LeaseRevoke";
        lease_time_to_live(pb::LeaseTimeToLiveRequest) -> pb::LeaseTimeToLiveResponse = "LeaseTimeToLive";
        lease_leases(pb::LeaseLeasesRequest) -> pb::LeaseLeasesResponse = "LeaseLeases";
    }

    async fn lease_keep_alive(
        &self,
        _: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        Err(not_served("etcdserverpb.Lease/LeaseKeepAlive"))
    }
}

/// etcd's Auth service: not served (authentication is off, as on an etcd
/// that never enabled it; these RPCs manage it).
#[derive(Debug, Clone, Copy, Default)]
pub struct AuthService;

#[tonic::async_trait]
impl pb::auth_server::Auth for AuthService {
    not_served_unary! { "Auth":
        auth_enable(pb::AuthEnableRequest) -> pb::AuthEnableResponse = "AuthEnable";
        auth_disable(pb::AuthDisableRequest) -> pb::AuthDisableResponse = "AuthDisable";
        auth_status(pb::AuthStatusRequest) -> pb::AuthStatusResponse = "AuthStatus";
        authenticate(pb::AuthenticateRequest) -> pb::AuthenticateResponse = "Authenticate";
        user_add(pb::AuthUserAddRequest) -> pb::AuthUserAddResponse = "UserAdd";
        user_get(pb::AuthUserGetRequest) -> pb::AuthUserGetResponse = "UserGet";
        user_list(pb::AuthUserListRequest) -> pb::AuthUserListResponse = "UserList";
        user_delete(pb::AuthUserDeleteRequest) -> pb::AuthUserDeleteResponse = "UserDelete";
        user_change_password(pb::AuthUserChangePasswordRequest) -> pb::AuthUserChangePasswordResponse = "UserChangePassword";
        user_grant_role(pb::AuthUserGrantRoleRequest) -> pb::AuthUserGrantRoleResponse = "UserGrantRole";
        user_revoke_role(pb::AuthUserRevokeRoleRequest) -> pb::AuthUserRevokeRoleResponse = "UserRevokeRole";
        role_add(pb::AuthRoleAddRequest) -> pb::AuthRoleAddResponse = "RoleAdd";
        role_get(pb::AuthRoleGetRequest) -> pb::AuthRoleGetResponse = "RoleGet";
        role_list(pb::AuthRoleListRequest) -> pb::AuthRoleListResponse = "RoleList";
        role_delete(pb::AuthRoleDeleteRequest) -> pb::AuthRoleDeleteResponse = "RoleDelete";
        role_grant_permission(pb::AuthRoleGrantPermissionRequest) -> pb::AuthRoleGrantPermissionResponse = "RoleGrantPermission";
        role_revoke_permission(pb::AuthRoleRevokePermissionRequest) -> pb::AuthRoleRevokePermissionResponse = "RoleRevokePermission";
    }
}

#[cfg(test)]
mod tests {
    use pb::auth_server::Auth;
    use pb::lease_server::Lease;
    use tonic::Code;

    use super::*;

    #[tokio::test]
    async fn every_unserved_rpc_names_itself_as_unimplemented() {
        let status = LeaseService
            .lease_grant(Request::new(pb::LeaseGrantRequest::default()))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unimplemented);
        assert_eq!(
            status.message(),
            "chorus: etcdserverpb.Lease/LeaseGrant is not served yet"
        );
        let status = AuthService
            .role_revoke_permission(Request::new(Default::default()))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unimplemented);
        assert!(status.message().contains("Auth/RoleRevokePermission"));
    }
}
