//! How the etcd service behaves: etcd's request limits and this node's
//! identity.

use crate::watch::WatchConfig;

/// etcd's default `--max-request-bytes`: 1.5 MiB.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 3 << 19;
/// etcd's default `--max-txn-ops`: operations in one transaction branch.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;
/// etcd's default `--quota-backend-bytes`: 2 GiB.
pub const DEFAULT_QUOTA_BACKEND_BYTES: usize = chorus::kv::quota::DEFAULT_QUOTA_BYTES;
/// The default of [`EtcdConfig::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// What etcd's gRPC server accepts beyond `--max-request-bytes` before it
/// refuses a message outright (etcd's `grpcOverheadBytes`): a message between
/// the two reaches the request check and gets "request is too large".
pub const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

/// The etcd service's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// A write request (Put, DeleteRange, Txn, Compact) whose encoding is
    /// larger is refused with etcd's "request is too large"; a message more
    /// than [`GRPC_OVERHEAD_BYTES`] larger is refused before it is decoded.
    /// Larger: bigger values and transactions, more memory per request.
    pub max_request_bytes: usize,
    /// Most operations in one transaction branch (nested ones counted
    /// separately, as etcd does).
    pub max_txn_ops: usize,
    /// The database's identity, hashed into the cluster id: the same for
    /// every node serving the database, different between databases.
    pub database: String,
    /// This node's etcd client URLs, listed by MemberList.
    pub client_urls: Vec<String>,
    /// The Watch service's progress interval and send buffers.
    pub watch: WatchConfig,
    /// The space quota: a write whose quota cost would take the state (keys,
    /// values and retained history) to this many bytes is refused, and the
    /// primary raises the NOSPACE alarm, as etcd does at its quota.
    pub quota_backend_bytes: usize,
    /// How a standby reaches an `https://` primary when it forwards to it;
    /// `None`: it cannot, and answers `Unavailable` saying so.
    pub peer_tls: Option<PeerTls>,
    /// Most client connections served at once; further clients wait in the
    /// listen backlog until one closes (see [`incoming`](crate::incoming)).
    pub max_connections: usize,
}

/// What a standby trusts and presents when it forwards to the primary's
/// etcd endpoint over TLS. Its `Debug` leaves the key out.
#[derive(Clone, PartialEq, Eq)]
pub struct PeerTls {
    /// PEM certificates of the CA that signed the primary's certificate.
    pub ca_pem: Vec<u8>,
    /// PEM certificate this node presents (for a primary that requires
    /// client certificates).
    pub certificate_pem: Vec<u8>,
    /// PEM private key of that certificate.
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls")
            .field("ca_pem_bytes", &self.ca_pem.len())
            .field("certificate_pem_bytes", &self.certificate_pem.len())
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl EtcdConfig {
    /// etcd's default limits for the database named `database`, with no
    /// client URL listed.
    pub fn new(database: impl Into<String>) -> EtcdConfig {
        EtcdConfig {
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_txn_ops: DEFAULT_MAX_TXN_OPS,
            database: database.into(),
            client_urls: Vec::new(),
            watch: WatchConfig::default(),
            quota_backend_bytes: DEFAULT_QUOTA_BACKEND_BYTES,
            peer_tls: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }

    /// The largest gRPC message decoded at all.
    pub fn max_message_bytes(&self) -> usize {
        self.max_request_bytes.saturating_add(GRPC_OVERHEAD_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_etcds() {
        assert_eq!(DEFAULT_MAX_REQUEST_BYTES, 1_572_864);
        let config = EtcdConfig::new("db");
        assert_eq!(config.max_txn_ops, 128);
        assert_eq!(config.max_message_bytes(), 2 << 20);
    }
}
