//! When leases expire: the primary's clock, never the machine's.
//!
//! A [`Lessor`] runs beside the state on every node but decides only on a
//! primary. It keeps a deadline per lease in memory, never in the log: a
//! lease's deadline is set to now + its TTL when this primacy first sees
//! the lease (a grant, or every lease at once on a takeover, so a failover
//! extends leases rather than expiring them, as etcd's leader change does)
//! and on each keep-alive. A lease past its deadline is handed out once by
//! [`Lessor::expired`]; the caller logs a revoke record for it, which
//! deletes its keys at one revision on every replica. Standbys expire
//! nothing: their lessor holds no deadlines.
//!
//! A keep-alive is acknowledged only while the lease's deadline has not
//! passed and the caller is a primary sure of its writer lease, so a
//! successor (which takes over only after that writer lease could have
//! expired) restarts every deadline after any acknowledged keep-alive:
//! no lease expires while its keep-alives were acknowledged within its TTL.
//!
//! Pure: the caller passes the time (milliseconds of a monotonic clock)
//! and the primacy, so the simulator drives it as the service does.

use std::collections::{BTreeMap, BTreeSet};

use super::lease::{LeaseId, LeaseTable};
use crate::ids::Epoch;

/// The deadlines of one primacy; see the module docs.
#[derive(Debug, Default)]
pub struct Lessor {
    /// The log epoch of the primacy the deadlines belong to; `None` on a
    /// standby (no deadlines).
    primacy: Option<Epoch>,
    /// Each known lease's deadline, in the caller's milliseconds.
    deadlines: BTreeMap<LeaseId, u64>,
    /// Leases handed out as expired whose revoke has not applied yet.
    expiring: BTreeSet<LeaseId>,
}

impl Lessor {
    /// Brings the deadlines up to `leases` at `now_ms`: `primacy` is the
    /// log epoch this node writes in as primary, `None` when it is not one.
    /// A new primacy starts every lease's deadline afresh; a lease seen
    /// for the first time gets now + its TTL; a lease gone is forgotten.
    ///
    /// Call it only once every revoke handed out by [`expired`](Self::expired)
    /// was appended or given back with [`retry`](Self::retry): a sync in
    /// between that passes through `None` (a primary briefly unsure of its
    /// writer lease) would forget the lease is expiring, and a keep-alive
    /// could then be acknowledged for a lease whose revoke is on its way.
    pub fn sync(&mut self, primacy: Option<Epoch>, leases: &LeaseTable, now_ms: u64) {
        self.enter(primacy);
        if self.primacy.is_none() {
            return;
        }
        self.deadlines.retain(|id, _| leases.get(*id).is_some());
        self.expiring.retain(|id| leases.get(*id).is_some());
        for (id, lease) in leases.iter() {
            self.deadlines
                .entry(id)
                .or_insert_with(|| deadline(now_ms, lease.ttl_secs));
        }
    }

    /// A keep-alive of lease `id` (granted `ttl_secs`) at `now_ms` on the
    /// primary of `primacy`: whether it is acknowledged (the deadline then
    /// moves to now + TTL). A lease already past its deadline is expiring
    /// and is not renewed, as etcd answers a renewal of an expired lease.
    pub fn keep_alive(&mut self, primacy: Epoch, id: LeaseId, ttl_secs: i64, now_ms: u64) -> bool {
        self.enter(Some(primacy));
        if self.expiring.contains(&id) {
            return false;
        }
        let renewed = deadline(now_ms, ttl_secs);
        match self.deadlines.get_mut(&id) {
            Some(current) if *current <= now_ms => false,
            Some(current) => {
                *current = renewed;
                true
            }
            None => {
                self.deadlines.insert(id, renewed);
                true
            }
        }
    }

    /// The leases whose deadline passed at `now_ms`, each handed out once
    /// (until [`retry`](Self::retry)), in id order. Empty on a standby.
    pub fn expired(&mut self, now_ms: u64) -> Vec<LeaseId> {
        let due: Vec<LeaseId> = self
            .deadlines
            .iter()
            .filter(|(id, deadline)| **deadline <= now_ms && !self.expiring.contains(id))
            .map(|(id, _)| *id)
            .collect();
        self.expiring.extend(&due);
        due
    }

    /// Hands lease `id` out again from [`expired`](Self::expired): its
    /// revoke was not appended.
    pub fn retry(&mut self, id: LeaseId) {
        self.expiring.remove(&id);
    }

    /// The milliseconds lease `id` has left at `now_ms`, if the lessor
    /// keeps a deadline for it in `primacy`.
    pub fn remaining_ms(&self, primacy: Epoch, id: LeaseId, now_ms: u64) -> Option<u64> {
        if self.primacy != Some(primacy) {
            return None;
        }
        let deadline = self.deadlines.get(&id)?;
        Some(deadline.saturating_sub(now_ms))
    }

    /// The earliest deadline not handed out yet, for a caller that sleeps
    /// until the next expiry.
    pub fn next_deadline(&self) -> Option<u64> {
        self.deadlines
            .iter()
            .filter(|(id, _)| !self.expiring.contains(id))
            .map(|(_, deadline)| *deadline)
            .min()
    }

    /// Forgets every deadline when the primacy changes.
    fn enter(&mut self, primacy: Option<Epoch>) {
        if self.primacy != primacy {
            self.primacy = primacy;
            self.deadlines.clear();
            self.expiring.clear();
        }
    }
}

/// `now_ms` plus `ttl_secs` seconds, saturating.
fn deadline(now_ms: u64, ttl_secs: i64) -> u64 {
    let ttl_ms = u64::try_from(ttl_secs).unwrap_or(0).saturating_mul(1000);
    now_ms.saturating_add(ttl_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(leases: &[(LeaseId, i64)]) -> LeaseTable {
        let mut table = LeaseTable::default();
        for (id, ttl) in leases {
            table.grant(*id, *ttl);
        }
        table
    }

    #[test]
    fn a_standby_expires_nothing() {
        let mut lessor = Lessor::default();
        lessor.sync(None, &table(&[(1, 2)]), 0);
        assert!(lessor.expired(1_000_000).is_empty());
        assert_eq!(lessor.remaining_ms(Epoch(1), 1, 0), None);
    }

    #[test]
    fn a_lease_expires_once_at_its_deadline() {
        let mut lessor = Lessor::default();
        let leases = table(&[(1, 5), (2, 10)]);
        lessor.sync(Some(Epoch(1)), &leases, 1_000);
        assert_eq!(lessor.remaining_ms(Epoch(1), 1, 1_000), Some(5_000));
        assert_eq!(lessor.remaining_ms(Epoch(2), 1, 1_000), None);
        assert!(lessor.expired(5_999).is_empty());
        assert_eq!(lessor.expired(6_000), vec![1]);
        assert!(lessor.expired(7_000).is_empty(), "handed out once");
        assert_eq!(lessor.next_deadline(), Some(11_000));
        lessor.retry(1);
        assert_eq!(lessor.expired(7_000), vec![1]);
    }

    #[test]
    fn keep_alives_move_the_deadline_until_it_passed() {
        let mut lessor = Lessor::default();
        let leases = table(&[(1, 5)]);
        lessor.sync(Some(Epoch(1)), &leases, 0);
        assert!(lessor.keep_alive(Epoch(1), 1, 5, 4_000));
        assert!(lessor.expired(8_999).is_empty());
        assert!(
            !lessor.keep_alive(Epoch(1), 1, 5, 9_000),
            "past its deadline"
        );
        assert_eq!(lessor.expired(9_000), vec![1]);
        assert!(!lessor.keep_alive(Epoch(1), 1, 5, 9_001), "expiring");
    }

    #[test]
    fn a_new_primacy_extends_every_lease_by_its_ttl() {
        let mut lessor = Lessor::default();
        let leases = table(&[(1, 5)]);
        lessor.sync(Some(Epoch(1)), &leases, 0);
        assert_eq!(lessor.expired(5_000), vec![1]);
        // Deposed before the revoke applied, then primary again later.
        lessor.sync(None, &leases, 6_000);
        lessor.sync(Some(Epoch(2)), &leases, 20_000);
        assert!(lessor.expired(24_999).is_empty());
        assert_eq!(lessor.remaining_ms(Epoch(2), 1, 20_000), Some(5_000));
        // A keep-alive naming a newer primacy starts it too.
        assert!(lessor.keep_alive(Epoch(3), 1, 5, 30_000));
        assert_eq!(lessor.remaining_ms(Epoch(3), 1, 30_000), Some(5_000));
    }

    #[test]
    fn revoked_leases_are_forgotten() {
        let mut lessor = Lessor::default();
        lessor.sync(Some(Epoch(1)), &table(&[(1, 5), (2, 5)]), 0);
        assert_eq!(lessor.expired(5_000), vec![1, 2]);
        lessor.sync(Some(Epoch(1)), &table(&[(2, 5)]), 5_100);
        assert_eq!(lessor.remaining_ms(Epoch(1), 1, 5_100), None);
        assert_eq!(lessor.next_deadline(), None);
    }
}
