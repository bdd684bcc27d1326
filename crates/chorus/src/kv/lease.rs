//! etcd's leases as the machine keeps them: each lease's id, its granted
//! TTL and the keys attached to it.
//!
//! The machine has no clock, so a lease here never expires on its own: the
//! primary decides when one has (see [`lessor`](super::lessor)) and logs a
//! revoke record, which deletes the lease's keys at one revision on every
//! replica alike. What is replicated is only what etcd persists: the id
//! and the granted TTL; a key's lease is a field of its entry, and each
//! lease's key set is rebuilt from the entries on restore.

use bytes::Bytes;
use imbl::{OrdMap, OrdSet};

use crate::ids::RecordIndex;

/// An etcd lease id (etcd's `int64`; 0 means "no lease").
pub type LeaseId = i64;

/// The shortest TTL a lease is granted, in seconds: a shorter one (zero
/// and negative included) is raised to it, as etcd raises it to its
/// minimum (2 s with its default election timing).
pub const MIN_LEASE_TTL_SECS: i64 = 2;

/// The longest TTL a lease may ask for, in seconds (etcd's `MaxLeaseTTL`).
pub const MAX_LEASE_TTL_SECS: i64 = 9_000_000_000;

/// The most leases the machine holds at once; a grant beyond is refused
/// as etcd refuses a write beyond its space quota. Each costs about
/// [`LEASE_OVERHEAD_BYTES`] plus its attached keys' lengths.
pub const MAX_LEASES: usize = 1_000_000;

/// The memory one lease costs beyond its attached keys, in bytes (an
/// estimate: the map node, the TTL and the key set's root).
pub const LEASE_OVERHEAD_BYTES: usize = 96;

/// Server-chosen lease ids start here: the id of a grant that names none
/// is this plus the grant record's index (the next free id above, if a
/// client chose that one), so every replica chooses the same.
pub const SERVER_LEASE_ID_BASE: LeaseId = 1 << 56;

/// One lease: its granted TTL and the keys attached to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The granted TTL in seconds (at least [`MIN_LEASE_TTL_SECS`]).
    pub ttl_secs: i64,
    /// The keys attached to it, in key order (a persistent set, shared by
    /// a checkpoint's copy like the table).
    pub keys: OrdSet<Bytes>,
}

/// Every lease the machine holds, by id. A persistent map: a snapshot's
/// checkpoint copies it in constant time, whatever the leases and their
/// keys, and a write after it copies only the nodes on its path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseTable {
    leases: OrdMap<LeaseId, Lease>,
}

impl LeaseTable {
    /// The lease `id`, if it exists.
    pub fn get(&self, id: LeaseId) -> Option<&Lease> {
        self.leases.get(&id)
    }

    /// Every lease, by ascending id.
    pub fn iter(&self) -> impl Iterator<Item = (LeaseId, &Lease)> {
        self.leases.iter().map(|(id, lease)| (*id, lease))
    }

    /// How many leases there are.
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// The id a grant at record `index` gets when it names none.
    pub(super) fn choose_id(&self, index: RecordIndex) -> LeaseId {
        let mut id = SERVER_LEASE_ID_BASE.saturating_add(index.0 as LeaseId);
        while self.leases.contains_key(&id) {
            id += 1;
        }
        id
    }

    /// Adds lease `id` (checked absent) with `ttl_secs`, raised to the minimum.
    pub(super) fn grant(&mut self, id: LeaseId, ttl_secs: i64) -> &Lease {
        let lease = Lease {
            ttl_secs: granted_ttl(ttl_secs),
            keys: OrdSet::new(),
        };
        self.leases.entry(id).or_insert(lease)
    }

    /// Removes lease `id`, returning it with its keys.
    pub(super) fn remove(&mut self, id: LeaseId) -> Option<Lease> {
        self.leases.remove(&id)
    }

    /// Attaches `key` to lease `id` (no-op for 0 or an unknown lease: the
    /// machine checks a lease exists before a put names it).
    pub(super) fn attach(&mut self, key: &Bytes, id: LeaseId) {
        if let Some(lease) = self.leases.get_mut(&id) {
            lease.keys.insert(key.clone());
        }
    }

    /// Detaches `key` from lease `id`, if attached.
    pub(super) fn detach(&mut self, key: &Bytes, id: LeaseId) {
        if let Some(lease) = self.leases.get_mut(&id) {
            lease.keys.remove(key);
        }
    }
}

/// The TTL a grant asking for `ttl_secs` gets: at least the minimum.
pub fn granted_ttl(ttl_secs: i64) -> i64 {
    ttl_secs.max(MIN_LEASE_TTL_SECS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_ttls_are_raised_to_the_minimum() {
        assert_eq!(granted_ttl(-5), MIN_LEASE_TTL_SECS);
        assert_eq!(granted_ttl(0), MIN_LEASE_TTL_SECS);
        assert_eq!(granted_ttl(MIN_LEASE_TTL_SECS + 1), MIN_LEASE_TTL_SECS + 1);
    }

    #[test]
    fn server_chosen_ids_skip_ids_in_use() {
        let mut table = LeaseTable::default();
        let first = table.choose_id(RecordIndex(7));
        assert_eq!(first, SERVER_LEASE_ID_BASE + 7);
        table.grant(first, 10);
        table.grant(first + 1, 10);
        assert_eq!(table.choose_id(RecordIndex(7)), first + 2);
    }

    #[test]
    fn keys_attach_and_detach_only_on_known_leases() {
        let mut table = LeaseTable::default();
        table.grant(1, 10);
        let key = Bytes::from_static(b"k");
        table.attach(&key, 1);
        table.attach(&key, 2);
        assert_eq!(table.get(1).unwrap().keys.len(), 1);
        assert!(table.get(2).is_none());
        table.detach(&key, 1);
        assert!(table.get(1).unwrap().keys.is_empty());
        assert_eq!(table.remove(1).map(|lease| lease.ttl_secs), Some(10));
        assert!(table.is_empty());
    }
}
