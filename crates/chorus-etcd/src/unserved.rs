//! etcd's Auth service, registered so that each of its
//! RPCs answers `Unimplemented` naming itself (an unregistered service would
//! answer the same code, but with no word on what is missing). Clients such
//! as Kubernetes' fall back on `Unimplemented`; they must never see `Unknown`.

use std::pin::Pin;

use tonic::Status;
use tonic::codegen::tokio_stream::Stream;

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
    use tonic::{Code, Request};

    use super::*;

    #[tokio::test]
    async fn every_unserved_rpc_names_itself_as_unimplemented() {
        let status = AuthService
            .role_revoke_permission(Request::new(Default::default()))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unimplemented);
        assert!(status.message().contains("Auth/RoleRevokePermission"));
    }
}
