//! etcd's protobuf messages and tonic services, generated from the protos
//! the etcd-client crate ships by `scripts/generate-etcd-proto.sh` (no
//! `protoc` needed at build time; see that script to regenerate).
#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// `authpb`: users and roles (used by the Auth service's messages).
pub mod authpb {
    include!("authpb.rs");
}

/// `mvccpb`: `KeyValue` and watch `Event`.
pub mod mvccpb {
    include!("mvccpb.rs");
}

/// `etcdserverpb`: the KV, Watch, Lease, Cluster, Maintenance and Auth services.
pub mod etcdserverpb {
    include!("etcdserverpb.rs");
}

/// `chorusfollowpb`: Chorus's own Follow service, by which a standby takes
/// the records its primary applied (not part of etcd's API).
pub mod chorusfollowpb {
    include!("chorusfollowpb.rs");
}
