//! The ids etcd's answers carry: a cluster id for the database and a member
//! id per node, and the header every top-level answer starts with.
//!
//! etcd draws its ids at random when a cluster is created; Chorus derives
//! them instead, so every node of a database and every restart of a node
//! agree without storing anything:
//!
//! - `cluster_id`: a 64-bit FNV-1a hash of the database's identity (the
//!   caller's choice: `chorus serve` uses the snapshot store URL and the
//!   database name).
//! - `member_id`: the same hash of the node's lease holder id (by default
//!   the node's advertised HTTP URL). The primary's member id, which Status
//!   answers as the leader, is the hash of the holder in the lease, so a
//!   standby names the same leader the primary names itself.
//! - `raft_term`: the writer lease's term as last seen here: it rises with
//!   every takeover, as a raft term rises with every new leader.
//!
//! Neither id is ever 0, which etcd reads as "none".

use chorus::kv::KvState;
use chorus::runtime::{Runtime, RuntimeStatus};

use crate::proto::etcdserverpb::ResponseHeader;

/// A 64-bit FNV-1a hash of `text`, never 0: a stable id for a name.
pub fn stable_id(text: &str) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = text.bytes().fold(OFFSET_BASIS, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    });
    hash.max(1)
}

/// This node's ids, fixed for the service's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// The database's id.
    pub cluster_id: u64,
    /// This node's id.
    pub member_id: u64,
}

impl Identity {
    /// The ids of the node `holder` serving the database `database`.
    pub fn new(database: &str, holder: &str) -> Identity {
        Identity {
            cluster_id: stable_id(database),
            member_id: stable_id(holder),
        }
    }

    /// A top-level answer's header at store revision `revision`.
    pub fn header(&self, runtime: &Runtime<KvState>, revision: i64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision,
            raft_term: raft_term(&runtime.status()),
        }
    }
}

/// The writer lease's term as last seen here, 0 before any lease was read.
pub fn raft_term(status: &RuntimeStatus) -> u64 {
    status.lease.as_ref().map_or(0, |lease| lease.term.0)
}

/// The member id of the primary as last seen here (the lease's holder),
/// `None` while no live lease is known.
pub fn leader_id(status: &RuntimeStatus) -> Option<u64> {
    status
        .lease
        .as_ref()
        .filter(|lease| !lease.released)
        .map(|lease| stable_id(lease.holder_id.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_never_zero() {
        // FNV-1a's published test vectors: the ids never change across builds.
        assert_eq!(stable_id(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stable_id("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(stable_id("foobar"), 0x8594_4171_f739_67e8);
        let identity = Identity::new(
            "file:///data/snapshots-store/default",
            "http://127.0.0.1:7070",
        );
        assert_ne!(identity.cluster_id, identity.member_id);
        assert_eq!(
            identity,
            Identity::new(
                "file:///data/snapshots-store/default",
                "http://127.0.0.1:7070"
            )
        );
    }
}
