//! R5, fenced publication: every write of `lease.json` and `HEAD.json` is
//! seen the instant it lands, under every fault injector, and each HEAD
//! write is checked against the lease document as it stood then.

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use chorus::lease::{DatabaseKey, FencingToken, HolderId, LeaseRecord, lease_key};
use chorus::snapshot::{Head, head_key};
use tokio::time::Instant;

use super::RuntimePhase;
use crate::model::Violation;
use crate::world::WriteObserver;

/// One write that landed on the control store.
#[derive(Debug)]
enum Landed {
    Lease(Duration, LeaseRecord),
    Head(Duration, Head),
    Undecodable(Duration, String, String),
}

/// Notes every lease and HEAD document as it lands, with the time since
/// the phase began. It observes the recording layer, under every fault
/// injector, so it sees exactly the writes that applied, lost responses
/// included.
#[derive(Debug)]
pub(super) struct Audit {
    database: DatabaseKey,
    head_key: String,
    lease_key: String,
    origin: Instant,
    landed: Mutex<Vec<Landed>>,
}

impl Audit {
    pub(super) fn new(database: &DatabaseKey, origin: Instant) -> Audit {
        Audit {
            database: database.clone(),
            head_key: head_key(database),
            lease_key: lease_key(database),
            origin,
            landed: Mutex::new(Vec::new()),
        }
    }

    /// What landed since the last call, in order.
    fn take(&self) -> Vec<Landed> {
        std::mem::take(&mut *self.landed.lock().expect("audit log"))
    }
}

impl WriteObserver for Audit {
    fn landed(&self, key: &str, bytes: &Bytes) {
        let at = self.origin.elapsed();
        let landed = if key == self.lease_key {
            match LeaseRecord::decode(&self.database, key, bytes) {
                Ok(record) => Landed::Lease(at, record),
                Err(error) => Landed::Undecodable(at, key.into(), error.to_string()),
            }
        } else if key == self.head_key {
            match Head::decode(&self.database, key, bytes) {
                Ok(head) => Landed::Head(at, head),
                Err(error) => Landed::Undecodable(at, key.into(), error.to_string()),
            }
        } else {
            return;
        };
        self.landed.lock().expect("audit log").push(landed);
    }
}

/// A change of the lease document, as far as R5 cares.
#[derive(Debug, Clone)]
pub(super) struct Reign {
    pub(super) start: Duration,
    pub(super) token: FencingToken,
    pub(super) holder: HolderId,
    pub(super) live: bool,
}

impl RuntimePhase<'_> {
    /// R5 on every lease and HEAD document that landed since the last step.
    pub(super) fn check_landed(&mut self) -> Result<(), Violation> {
        let landed = self.audit.take();
        for event in landed {
            match event {
                Landed::Lease(at, record) => self.on_lease_landed(at, record),
                Landed::Head(at, head) => self.on_head_landed(at, head)?,
                Landed::Undecodable(at, key, error) => {
                    return Err(format!(
                        "a write of {key} that landed at {at:?} does not decode: {error}"
                    ));
                }
            }
        }
        Ok(())
    }

    pub(super) fn on_lease_landed(&mut self, at: Duration, record: LeaseRecord) {
        let live = !record.released;
        let token = record.token();
        let last = self.reigns.last();
        if last.is_some_and(|last| last.token == token && last.live == live) {
            return;
        }
        let takeover = last.is_some_and(|last| last.holder != record.holder_id);
        self.stats.takeovers += u64::from(takeover);
        self.event_at(
            at,
            format!(
                "runtime lease {} {} {}",
                record.holder_id,
                token,
                if live { "acquired" } else { "released" }
            ),
        );
        self.reigns.push(Reign {
            start: at,
            token,
            holder: record.holder_id,
            live,
        });
    }

    /// R5 for one HEAD write, at the instant `at` it landed.
    pub(super) fn on_head_landed(&mut self, at: Duration, head: Head) -> Result<(), Violation> {
        let token = head.lease_token();
        self.stats.head_writes += 1;
        self.event_at(
            at,
            format!(
                "runtime HEAD sequence {} token {} by {} wal_index {}",
                head.publication_sequence.0, token, head.holder_id, head.wal_index
            ),
        );
        if let Some(last) = &self.last_head_write
            && (head.publication_sequence <= last.publication_sequence
                || token < last.lease_token())
        {
            return Err(format!(
                "HEAD history: sequence {} token {} landed over sequence {} token {}",
                head.publication_sequence.0,
                token,
                last.publication_sequence.0,
                last.lease_token()
            ));
        }
        let Some(current) = self.reigns.last() else {
            return Err(format!("HEAD stamped {token} landed before any lease"));
        };
        let (current_token, current_live) = (current.token, current.live);
        if token > current_token {
            return Err(format!(
                "HEAD stamped {token} landed while the lease document's token is {current_token}"
            ));
        }
        let Some(ours) = self.reigns.iter().rposition(|r| r.token == token && r.live) else {
            return Err(format!("HEAD stamped {token}, a token never acquired"));
        };
        if self.reigns[ours].holder != head.holder_id {
            return Err(format!(
                "HEAD stamped {token} names holder {} but the lease was {}'s",
                head.holder_id, self.reigns[ours].holder
            ));
        }
        if token == current_token && current_live {
            self.last_head_write = Some(head);
            return Ok(());
        }
        // The lease moved on: the write must have been sent while it
        // vouched, at most one HEAD call timeout before it landed.
        let ended = self.reigns[ours + 1].start;
        let window = self.settings.snapshot.head_call_timeout;
        self.stats.late_head_writes += 1;
        self.event_at(
            at,
            format!(
                "runtime HEAD stamped {token} landed {:?} after that lease ended",
                at.saturating_sub(ended)
            ),
        );
        if self.clocks_agree() && at > ended + window {
            return Err(format!(
                "fenced publication: HEAD stamped {token} by {} landed at {at:?}, {:?} after \
                 that lease stopped being the lease (head_call_timeout {window:?})",
                head.holder_id,
                at - ended
            ));
        }
        self.last_head_write = Some(head);
        Ok(())
    }
}
