//! etcd's v3 gRPC API over the Chorus runtime.
//!
//! [`EtcdService::new`] takes a [`Runtime<KvState>`](chorus::runtime::Runtime)
//! and an [`EtcdConfig`]; [`serve`] (or [`serve_tls`]) serves it on a listener until a shutdown
//! future resolves (or [`EtcdService::routes`] mounts it on a tonic server of
//! the caller's, behind [`oversize_layer`]). Served:
//!
//! - KV: Range, Put, DeleteRange, Txn, Compact ([`kv`]).
//! - Watch: streams of any number of watches ([`watch`]).
//! - Lease: grant, revoke, keep-alive, time-to-live and the list, with
//!   expiry decided by the primary ([`lease`]).
//! - Maintenance: Status, Alarm, HashKV, Defragment ([`maintenance`]); Cluster: MemberList
//!   ([`cluster`]); `grpc.health.v1` reporting SERVING.
//! - Everything else, Auth included, answers
//!   `Unimplemented` naming the RPC ([`unserved`]).
//!
//! The protobuf messages and tonic services in [`proto`] are generated from
//! the etcd-client crate's protos and checked in (no `protoc` at build
//! time). [`convert`] maps them to and from the state machine's plain
//! requests and answers ([`chorus::kv::etcd`]); [`error`] maps every failure
//! to the status etcd answers; [`identity`] derives the header's ids.
#![warn(missing_docs)]

pub mod cluster;
pub mod config;
pub mod convert;
pub mod error;
mod follow;
pub mod forward;
pub mod identity;
pub mod incoming;
pub mod kv;
pub mod lease;
pub mod maintenance;
pub mod proto;
mod server;
pub mod unserved;
pub mod watch;

pub use config::{
    DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TXN_OPS, DEFAULT_QUOTA_BACKEND_BYTES, EtcdConfig,
    PeerTls,
};
pub use identity::Identity;
pub use maintenance::EMULATED_ETCD_VERSION;
pub use server::{EtcdService, EtcdTls, oversize_layer, serve, serve_tls};
