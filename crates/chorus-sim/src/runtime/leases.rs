//! etcd leases in the runtime phase, and R14.
//!
//! Every process keeps a [`Lessor`] driven as the etcd service drives its
//! own (`chorus-etcd`'s `lease.rs`), with the phase's virtual monotonic
//! clock (milliseconds since the phase began; the skewed wall clocks play
//! no part) and the process's primacy (its log epoch while it is a primary
//! sure of its writer lease, else none):
//!
//! - an expiry tick every [`EXPIRY_TICK_MS`] of virtual time (looked at
//!   after every step) brings the lessor up to the applied lease table and
//!   appends a revoke record through the runtime's write path for each
//!   lease it hands out as expired; a revoke that fails is handed out
//!   again ([`Lessor::retry`]); the next tick waits for the revokes in
//!   flight, as the service's does;
//! - a client grants leases (TTLs of 1–6 s, raised to etcd's minimum; the
//!   id the machine's choice mostly, sometimes its own), attaches keys to
//!   them with etcd puts naming the lease, keeps them alive through the
//!   process it believes is primary (a keep-alive is acknowledged only as
//!   the service acknowledges one: the lease exists in a current read, the
//!   lessor renewed it, and the process is still a primary sure of its
//!   lease after renewing), sometimes stops keeping one alive, sometimes
//!   revokes one. After a grant is acknowledged, the serving process's
//!   lessor renews it, as the service's grant does.
//!
//! **R14, leases expire only when due**, after every step:
//!
//! - (a) while the clocks agree, no lease is handed out as expired, and no
//!   revoke of it applies unless the client asked for one, before its TTL
//!   has passed since the client's grant request or the last keep-alive
//!   acknowledged (virtual time; a revoke applied at the latest when it is
//!   first seen); and no keep-alive of a lease is acknowledged once its
//!   revoke was seen applied;
//! - (b) every revoke deletes exactly the lease's attached keys, in one
//!   record at one revision, or none if no key is attached (R13's model
//!   expects each revoke's answer and the revision it leaves, R10 that it
//!   moved the revision by one at most), and every state checked by R12
//!   (each process's, each HEAD payload) has every key that names a lease
//!   among that lease's keys and every lease's keys naming it: no key
//!   names a lease that was revoked;
//! - (c) a lessor whose process is not a primary sure of its lease hands
//!   out no expiry.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chorus::ids::Epoch;
use chorus::kv::etcd::{LeaseGrantRequest, LeaseRevokeRequest, PutRequest};
use chorus::kv::lease::LeaseId;
use chorus::kv::{Applied, EtcdCommand, EtcdError, EtcdResponse, KvState};
use rand::Rng;

use super::workload::WriteKind;
use super::{Kv, PendingWrite, Process, RuntimePhase};
use crate::model::Violation;

/// How often each process's expiry tick runs, in virtual milliseconds
/// (the service's `EXPIRY_TICK`).
pub(super) const EXPIRY_TICK_MS: u64 = 500;

/// The most leases the client keeps track of at once; no grant beyond.
const MAX_CLIENT_LEASES: usize = 8;

/// The TTLs the client asks for, in seconds (1 is raised to etcd's
/// minimum of 2).
const CLIENT_TTL_SECS: std::ops::RangeInclusive<i64> = 1..=6;

/// The client's keep-alives go out every TTL / this.
const KEEP_ALIVES_PER_TTL: u64 = 3;

/// Where a lease request of the workload comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LeaseOrigin {
    /// The client's grant.
    Grant,
    /// The client's put attaching a key to a lease.
    Attach,
    /// The client's revoke.
    Revoke,
    /// A process's expiry tick.
    Expiry,
}

/// A lease request of the workload.
pub(super) fn lease_write(command: EtcdCommand, origin: LeaseOrigin) -> WriteKind {
    WriteKind::Lease { command, origin }
}

/// What the client knows of a lease it was granted.
#[derive(Debug, Clone)]
struct ClientLease {
    /// The granted TTL, in milliseconds.
    ttl_ms: u64,
    /// The lease must live at least until then (virtual milliseconds since
    /// the phase began): its grant request or its last acknowledged
    /// keep-alive, plus its TTL.
    alive_until_ms: u64,
    /// When a keep-alive of it was last answered (or it was granted).
    last_sent_ms: u64,
    /// Whether the client still keeps it alive.
    keeping: bool,
    /// Whether the client learnt it is gone (a keep-alive answered TTL 0,
    /// or its revoke answered).
    gone: bool,
    /// The primacy that acknowledged its last keep-alive.
    acked_in: Option<Epoch>,
    /// Whether keep-alives were acknowledged in two primacies (across a
    /// takeover).
    crossed: bool,
}

/// The client's leases and what R14 knows of them.
#[derive(Debug, Default)]
pub(super) struct LeaseLedger {
    leases: BTreeMap<LeaseId, ClientLease>,
    /// When each grant write started, by write id.
    grants_started: BTreeMap<u64, u64>,
    /// Leases whose revoke the client asked for, with when.
    revoke_asked: BTreeMap<LeaseId, u64>,
    /// Leases whose revoke was seen applied.
    revoked: BTreeSet<LeaseId>,
    /// The last lease id the client chose itself.
    last_chosen_id: LeaseId,
    /// The last key number the client attached.
    last_key: u64,
    /// Leases granted since the last step, to attach keys to.
    to_attach: Vec<LeaseId>,
}

#[cfg(test)]
impl LeaseLedger {
    /// Notes lease `id` granted with `ttl_ms`, to live until `alive_until_ms`.
    pub(super) fn note_granted(&mut self, id: LeaseId, ttl_ms: u64, alive_until_ms: u64) {
        let lease = ClientLease {
            ttl_ms,
            alive_until_ms,
            last_sent_ms: 0,
            keeping: true,
            gone: false,
            acked_in: None,
            crossed: false,
        };
        self.leases.insert(id, lease);
    }

    /// Notes the client's revoke of `id` asked for at `at_ms`.
    pub(super) fn note_revoke_asked(&mut self, id: LeaseId, at_ms: u64) {
        self.revoke_asked.insert(id, at_ms);
    }
}

/// A keep-alive's answer, as the service gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeepAlive {
    /// Renewed by the primacy of this epoch: the client may count on a
    /// TTL from now.
    Renewed(Epoch),
    /// TTL 0: the lease does not exist or already expired.
    Gone,
    /// Not a primary sure of its lease (before or after renewing).
    Refused,
}

/// The log epoch `runtime` writes in, if it is a primary sure of its lease
/// (the service's `primacy`).
pub(super) fn primacy(runtime: &Kv) -> Option<Epoch> {
    if !runtime.is_primary_and_sure() {
        return None;
    }
    runtime.status().epoch
}

/// A keep-alive of lease `id` on `process` at `now_ms`, answered as the
/// service's `keep_alive` answers it.
fn keep_alive(process: &mut Process, id: LeaseId, now_ms: u64) -> KeepAlive {
    let runtime = &process.runtime;
    let Some(primacy) = primacy(runtime) else {
        return KeepAlive::Refused;
    };
    let Ok((granted, _)) = runtime.read(|state| state.leases().get(id).map(|l| l.ttl_secs)) else {
        return KeepAlive::Refused;
    };
    let renewed = granted.filter(|ttl| process.lessor.keep_alive(primacy, id, *ttl, now_ms));
    // Sure after renewing: a successor starts every deadline later still.
    if !runtime.is_primary_and_sure() {
        return KeepAlive::Refused;
    }
    match renewed {
        Some(_) => KeepAlive::Renewed(primacy),
        None => KeepAlive::Gone,
    }
}

/// Whether `write` is an expiry revoke sent to `runtime`.
fn is_expiry_on(write: &PendingWrite, runtime: &Arc<Kv>) -> bool {
    matches!(
        write.kind,
        WriteKind::Lease {
            origin: LeaseOrigin::Expiry,
            ..
        }
    ) && Arc::ptr_eq(&write.runtime, runtime)
}

impl RuntimePhase<'_> {
    /// Virtual milliseconds since the phase began: every process's
    /// monotonic clock.
    pub(super) fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The lease work after a step: every process's expiry tick, the
    /// client's keep-alives, keys attached to leases just granted.
    pub(super) fn drive_leases(&mut self) -> Result<(), Violation> {
        for node in 0..self.nodes.len() {
            self.expiry_tick(node)?;
        }
        self.keep_alives()?;
        for id in std::mem::take(&mut self.leases.to_attach) {
            for _ in 0..self.rng.random_range(0..=2) {
                self.attach_key(id);
            }
        }
        Ok(())
    }

    /// `node`'s expiry tick, if one is due and none of its revokes is in
    /// flight: R14 (a) and (c) on what its lessor hands out.
    fn expiry_tick(&mut self, node: usize) -> Result<(), Violation> {
        let now = self.now_ms();
        let Some(process) = self.nodes[node].process.as_mut() else {
            return Ok(());
        };
        let due_tick = process
            .last_expiry_ms
            .is_none_or(|last| now >= last + EXPIRY_TICK_MS);
        let runtime = Arc::clone(&process.runtime);
        let in_flight = self.writes.iter().any(|w| is_expiry_on(w, &runtime));
        if !due_tick || in_flight || process.shutdown.is_some() {
            return Ok(());
        }
        process.last_expiry_ms = Some(now);
        let primacy = primacy(&runtime);
        let lessor = &mut process.lessor;
        let (expired, _) = runtime.read_stale(|state: &KvState| {
            lessor.sync(primacy, state.leases(), now);
            lessor.expired(now)
        });
        if primacy.is_none() && !expired.is_empty() {
            return Err(format!(
                "lease expiry: n{node}, not a primary sure of its lease, had its lessor hand \
                 out leases {expired:x?} as expired"
            ));
        }
        for id in expired {
            self.on_expiry_decided(node, id, now)?;
            let command = EtcdCommand::LeaseRevoke(LeaseRevokeRequest { id });
            if self
                .start_write(node, lease_write(command, LeaseOrigin::Expiry))
                .is_none()
                && let Some(process) = self.nodes[node].process.as_mut()
            {
                process.lessor.retry(id);
            }
        }
        Ok(())
    }

    /// R14 (a) for lease `id` handed out as expired by `node` at `now`.
    pub(super) fn on_expiry_decided(
        &mut self,
        node: usize,
        id: LeaseId,
        now: u64,
    ) -> Result<(), Violation> {
        self.event(format!("runtime n{node} lease {id:#x} expired at {now} ms"));
        self.check_due(
            id,
            now,
            &format!("n{node}'s lessor handed it out as expired"),
        )
    }

    /// R14 (a): lease `id` ended at `now` (as `what` says); unless the
    /// client asked for its revoke, it must be past the time it must
    /// live until.
    fn check_due(&self, id: LeaseId, now: u64, what: &str) -> Result<(), Violation> {
        let Some(lease) = self.leases.leases.get(&id) else {
            return Ok(());
        };
        let asked = self.leases.revoke_asked.contains_key(&id);
        if asked || !self.clocks_agree() || lease.alive_until_ms <= now {
            return Ok(());
        }
        Err(format!(
            "lease expiry: lease {id:#x} (TTL {} ms) must live until {} ms (its grant request \
             or last acknowledged keep-alive, plus its TTL), but {what} at {now} ms",
            lease.ttl_ms, lease.alive_until_ms
        ))
    }

    /// The node the client believes is primary: the one answering current
    /// reads nine times in ten, else any.
    fn believed_primary(&mut self) -> usize {
        match self.primary() {
            Some(primary) if self.rng.random_bool(0.9) => primary,
            _ => self.rng.random_range(0..self.nodes.len()),
        }
    }

    /// The client's keep-alives that are due, each to the process it
    /// believes is primary.
    fn keep_alives(&mut self) -> Result<(), Violation> {
        let now = self.now_ms();
        let due: Vec<LeaseId> = self
            .leases
            .leases
            .iter()
            .filter(|(_, lease)| lease.keeping && !lease.gone)
            .filter(|(_, lease)| now >= lease.last_sent_ms + lease.ttl_ms / KEEP_ALIVES_PER_TTL)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let node = self.believed_primary();
            let answer = match self.nodes[node].process.as_mut() {
                Some(process) => keep_alive(process, id, now),
                None => KeepAlive::Refused,
            };
            let lease = self.leases.leases.get_mut(&id).expect("a due lease");
            match answer {
                // Tried again after the next step, through the process it
                // then believes is primary, as a client tries another
                // endpoint.
                KeepAlive::Refused => self.stats.lease_keep_alives_refused += 1,
                KeepAlive::Gone => {
                    lease.last_sent_ms = now;
                    lease.gone = true;
                    self.event(format!("runtime n{node} lease {id:#x} keep-alive: gone"));
                }
                KeepAlive::Renewed(epoch) => {
                    if lease.acked_in.is_some_and(|before| before != epoch) && !lease.crossed {
                        lease.crossed = true;
                        self.stats.lease_kept_across_takeovers += 1;
                    }
                    lease.acked_in = Some(epoch);
                    lease.last_sent_ms = now;
                    lease.alive_until_ms = lease.alive_until_ms.max(now + lease.ttl_ms);
                    self.stats.lease_keep_alives_acked += 1;
                    if self.leases.revoked.contains(&id) && self.clocks_agree() {
                        return Err(format!(
                            "lease expiry: n{node} acknowledged a keep-alive of lease {id:#x} \
                             at {now} ms, after its revoke was seen applied"
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// One action of the client: a grant, a key attached, a lease no
    /// longer kept alive, or a revoke.
    pub(super) fn lease_action(&mut self) {
        let live: Vec<LeaseId> = self
            .leases
            .leases
            .iter()
            .filter(|(_, lease)| !lease.gone)
            .map(|(id, _)| *id)
            .collect();
        let choice = self.rng.random_range(0..10);
        if live.is_empty() || (choice < 5 && live.len() < MAX_CLIENT_LEASES) {
            return self.grant();
        }
        let id = live[self.rng.random_range(0..live.len())];
        match choice {
            0..=5 => self.attach_key(id),
            6..=7 => {
                if let Some(lease) = self.leases.leases.get_mut(&id) {
                    lease.keeping = false;
                }
                self.event(format!("runtime lease {id:#x} no longer kept alive"));
            }
            _ => self.revoke(id),
        }
    }

    fn grant(&mut self) {
        let id = if self.rng.random_ratio(1, 5) {
            self.leases.last_chosen_id += 1;
            self.leases.last_chosen_id
        } else {
            0
        };
        let ttl = self.rng.random_range(CLIENT_TTL_SECS);
        let command = EtcdCommand::LeaseGrant(LeaseGrantRequest { id, ttl });
        let node = self.believed_primary();
        let now = self.now_ms();
        if let Some(write) = self.start_write(node, lease_write(command, LeaseOrigin::Grant)) {
            self.leases.grants_started.insert(write, now);
        }
    }

    fn attach_key(&mut self, id: LeaseId) {
        self.leases.last_key += 1;
        let command = EtcdCommand::Put(PutRequest {
            key: format!("e/l/{:04}", self.leases.last_key).into(),
            value: format!("lease {id:#x}").into(),
            lease: id,
            prev_kv: self.rng.random_bool(0.5),
            ..PutRequest::default()
        });
        let node = self.believed_primary();
        self.start_write(node, lease_write(command, LeaseOrigin::Attach));
    }

    fn revoke(&mut self, id: LeaseId) {
        let now = self.now_ms();
        self.leases.revoke_asked.entry(id).or_insert(now);
        if let Some(lease) = self.leases.leases.get_mut(&id) {
            lease.keeping = false;
        }
        let command = EtcdCommand::LeaseRevoke(LeaseRevokeRequest { id });
        let node = self.believed_primary();
        self.start_write(node, lease_write(command, LeaseOrigin::Revoke));
    }

    /// An acknowledged lease request: R11's bookkeeping, the client's, and
    /// after a grant the serving process's lessor renews it (as the
    /// service's grant does).
    pub(super) fn on_lease_acked(
        &mut self,
        write: &PendingWrite,
        origin: LeaseOrigin,
        index: u64,
        output: &Applied,
    ) -> Result<(), Violation> {
        let Applied::Etcd(answer) = output else {
            return Err(format!(
                "W{} acknowledged at {index} applied as {output:?}",
                write.id
            ));
        };
        self.answers.on_acked(index, output)?;
        match (origin, answer) {
            (LeaseOrigin::Grant, Ok(EtcdResponse::LeaseGrant(granted))) => {
                self.on_granted(write, granted.id, granted.ttl);
                Ok(())
            }
            (LeaseOrigin::Attach, Ok(EtcdResponse::Put(_))) => Ok(()),
            (LeaseOrigin::Revoke | LeaseOrigin::Expiry, Ok(EtcdResponse::LeaseRevoke(revoked))) => {
                if origin == LeaseOrigin::Revoke {
                    self.stats.lease_revokes += 1;
                } else {
                    self.stats.lease_expiries += 1;
                }
                self.stats.lease_keys_deleted += revoked.deleted as u64;
                self.on_gone(write);
                Ok(())
            }
            // The lease was revoked (or expired) between prepare and apply.
            (
                LeaseOrigin::Attach | LeaseOrigin::Revoke | LeaseOrigin::Expiry,
                Err(EtcdError::LeaseNotFound),
            ) => {
                self.on_gone(write);
                Ok(())
            }
            (_, answer) => Err(format!(
                "W{}, a lease request ({origin:?}), acknowledged at {index} as {answer:?}",
                write.id
            )),
        }
    }

    fn on_granted(&mut self, write: &PendingWrite, id: LeaseId, ttl_secs: i64) {
        let now = self.now_ms();
        let started = self.leases.grants_started.remove(&write.id).unwrap_or(now);
        let ttl_ms = u64::try_from(ttl_secs).unwrap_or(0) * 1000;
        self.stats.lease_grants += 1;
        self.event(format!("runtime lease {id:#x} granted, TTL {ttl_secs} s"));
        let keeping = self.rng.random_ratio(7, 8);
        self.leases.leases.insert(
            id,
            ClientLease {
                ttl_ms,
                alive_until_ms: started + ttl_ms,
                last_sent_ms: now,
                keeping,
                gone: false,
                acked_in: None,
                crossed: false,
            },
        );
        self.leases.to_attach.push(id);
        let process = self.nodes[write.node].process.as_mut();
        let process = process.filter(|process| Arc::ptr_eq(&process.runtime, &write.runtime));
        if let Some(process) = process
            && let Some(primacy) = primacy(&process.runtime)
        {
            process.lessor.keep_alive(primacy, id, ttl_secs, now);
        }
    }

    /// A revoke (or a put naming a lease) answered: the lease is gone.
    fn on_gone(&mut self, write: &PendingWrite) {
        let WriteKind::Lease { command, .. } = &write.kind else {
            return;
        };
        let id = match command {
            EtcdCommand::LeaseRevoke(revoke) => revoke.id,
            EtcdCommand::Put(put) => put.lease,
            _ => return,
        };
        if let Some(lease) = self.leases.leases.get_mut(&id) {
            lease.gone = true;
        }
    }

    /// A lease request its prepare refused: only because the lease it
    /// names is gone.
    pub(super) fn on_lease_refused(
        &mut self,
        write: &PendingWrite,
        refused: &Applied,
    ) -> Result<(), Violation> {
        match refused {
            Applied::Etcd(Err(EtcdError::LeaseNotFound)) => {
                self.on_gone(write);
                Ok(())
            }
            other => Err(format!(
                "W{}: prepare refused a lease request: {other:?}",
                write.id
            )),
        }
    }

    /// A lease request that failed: an expiry revoke is handed out again
    /// by its process's lessor, as the service retries it.
    pub(super) fn on_lease_failed(&mut self, write: &PendingWrite, origin: LeaseOrigin) {
        let WriteKind::Lease {
            command: EtcdCommand::LeaseRevoke(revoke),
            ..
        } = &write.kind
        else {
            return;
        };
        if origin != LeaseOrigin::Expiry {
            return;
        }
        let process = self.nodes[write.node].process.as_mut();
        if let Some(process) = process.filter(|p| Arc::ptr_eq(&p.runtime, &write.runtime)) {
            process.lessor.retry(revoke.id);
        }
    }

    /// R14 (a) for a record seen applied for the first time: a revoke the
    /// client did not ask for must come after the lease was due; it
    /// committed at the latest now.
    pub(super) fn on_lease_record_applied(
        &mut self,
        record: &[u8],
        output: &Applied,
    ) -> Result<(), Violation> {
        let Ok(EtcdCommand::LeaseRevoke(revoke)) = EtcdCommand::decode(record) else {
            return Ok(());
        };
        if !matches!(output, Applied::Etcd(Ok(EtcdResponse::LeaseRevoke(_)))) {
            return Ok(());
        }
        self.leases.revoked.insert(revoke.id);
        let now = self.now_ms();
        self.check_due(revoke.id, now, "its revoke applied")
    }
}

/// R14 (b) on a state: every key naming a lease is among that lease's
/// keys, and every lease's keys name it.
pub(super) fn check_lease_keys(state: &KvState, what: &str) -> Result<(), Violation> {
    let (entries, _) = state.list(b"", None, usize::MAX);
    for (key, entry) in &entries {
        if entry.lease == 0 {
            continue;
        }
        let attached = state.leases().get(entry.lease);
        if !attached.is_some_and(|lease| lease.keys.contains(*key)) {
            return Err(format!(
                "lease keys: {what} has {key:?} naming lease {:#x}, which {}",
                entry.lease,
                if attached.is_some() {
                    "does not list it"
                } else {
                    "does not exist"
                }
            ));
        }
    }
    for (id, lease) in state.leases().iter() {
        for key in &lease.keys {
            if state.get(key).is_none_or(|entry| entry.lease != id) {
                return Err(format!(
                    "lease keys: {what} lists {key:?} under lease {id:#x}, but the key does not \
                     name it"
                ));
            }
        }
    }
    Ok(())
}
