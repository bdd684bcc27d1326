//! etcd's v3 gRPC API over the Chorus runtime.
//!
//! The protobuf messages and tonic services in [`proto`] are generated from
//! the etcd-client crate's protos and checked in (no `protoc` at build
//! time). [`convert`] maps them to and from the state machine's plain
//! requests and answers ([`chorus::kv::etcd`]); [`error`] maps every failure
//! to the status etcd answers.
#![warn(missing_docs)]

pub mod config;
pub mod convert;
pub mod error;
pub mod identity;
pub mod proto;
pub mod watch;

pub use config::{DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TXN_OPS, EtcdConfig};
