//! The writer lease: a time-bounded claim on a database, kept as the document
//! `<db>/lease.json` in any CAS-capable [`BlobStore`](crate::blob::BlobStore).
//!
//! - [`LeaseStore::acquire`] creates the document if absent, or CASes over a
//!   released, expired or own lease with generation + 1. "Own" means written
//!   by the same [`Contender`]: holder id *and* incarnation, a random id per
//!   process, so two processes that share a holder id never both hold it. A
//!   live lease of another process is
//!   [`LeaseError::Held`]; a stored term above the contender's is
//!   [`LeaseError::Fenced`] even when expired; a lost CAS is
//!   [`LeaseError::LostRace`].
//! - [`LeaseHolder::refresh`] CASes the expiry forward, keeping the generation;
//!   a holder whose document changed underneath is [`LeaseError::Stale`].
//! - [`LeaseHolder::release`] CASes to a *released* record that keeps the
//!   generation, so the next acquisition's generation is higher still:
//!   generations never repeat, even across clean restarts.
//!
//! The fencing token is `(term, generation)`. The holder measures its own
//! expiry on the monotonic face of its [`Clock`](crate::clock::Clock), from the
//! instant *before* it sent the write, minus a safety margin;
//! [`LeaseHolder::may_write`] answers "may I still write?". Contenders judge
//! expiry by their own wall clock against `expires_at_ms`, so the margin must
//! cover the wall-clock skew between nodes (docs/design/0002).
//!
//! Every store call is bounded by [`LeaseConfig::store_call_timeout`]. Unknown
//! outcomes of conditional writes are settled by reading back: the document we
//! wrote carries our identity and exact expiry, so finding exactly our bytes
//! means our write landed.

mod config;
mod document;
mod error;
mod holder;
mod record;
mod types;

use std::sync::Arc;

use crate::blob::{
    BlobError, DynBlobStore, TimeoutStore, Version, create_resolving, update_resolving,
};
use crate::clock::DynClock;

pub use config::{LeaseConfig, LeaseConfigError};
pub use document::{DocumentError, MAX_DOCUMENT_BYTES, encode as encode_document};
pub use error::LeaseError;
pub use holder::{LeaseHolder, MAX_REFRESH_ROUNDS};
pub use record::{LEASE_FORMAT, LeaseRecord, lease_key};
pub use types::{
    Contender, DatabaseKey, FencingToken, Generation, HolderId, Incarnation,
    MAX_DATABASE_KEY_BYTES, MAX_HOLDER_ID_BYTES, NameError, Term,
};

pub(crate) use document::{Fields, encode};

/// Whether [`LeaseStore::release_holder`] may release a live lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveLease {
    /// Refuse: only an expired lease is released.
    Refuse,
    /// Release it: its process is known to be gone.
    Release,
}

/// Which term an acquisition asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TermChoice {
    /// The contender's own term.
    Given(Term),
    /// The stored lease's term, [`Term::FIRST`] if there is none.
    Stored,
    /// One above the stored lease's term: a take-over.
    AboveStored,
}

impl TermChoice {
    fn term(self, stored: Option<Term>) -> Term {
        match self {
            TermChoice::Given(term) => term,
            TermChoice::Stored => stored.unwrap_or(Term::FIRST),
            TermChoice::AboveStored => Term(stored.map_or(0, |term| term.0).saturating_add(1)),
        }
    }
}

/// What [`LeaseStore::release_holder`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The holder's lease is now released; this is the released record.
    Released(LeaseRecord),
    /// The holder had nothing to release: no lease document, an already
    /// released lease, or another holder's expired lease.
    NotHeld(Option<LeaseRecord>),
}

/// The lease of one database in one store; cheap to clone.
#[derive(Debug, Clone)]
pub struct LeaseStore {
    store: DynBlobStore,
    database: DatabaseKey,
    key: String,
    config: LeaseConfig,
    clock: DynClock,
}

impl LeaseStore {
    /// The lease of `database` in `store` (which must enforce conditional
    /// writes: open it with [`open_store`](crate::blob::open_store)).
    pub fn new(
        store: DynBlobStore,
        database: DatabaseKey,
        config: LeaseConfig,
        clock: DynClock,
    ) -> Result<LeaseStore, LeaseConfigError> {
        config.validate()?;
        let store = Arc::new(TimeoutStore::new(store, config.store_call_timeout));
        Ok(LeaseStore {
            store,
            key: lease_key(&database),
            database,
            config,
            clock,
        })
    }

    /// The database this lease guards.
    pub fn database(&self) -> &DatabaseKey {
        &self.database
    }

    /// The lease document's key, `<db>/lease.json`.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lease timing.
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// The clock this store's holders and contenders use.
    pub fn clock(&self) -> &DynClock {
        &self.clock
    }

    /// Reads the lease document (one GET), `None` if no lease was ever taken.
    pub async fn read(&self) -> Result<Option<LeaseRecord>, LeaseError> {
        Ok(self.read_versioned().await?.map(|(record, _)| record))
    }

    pub(crate) async fn read_versioned(
        &self,
    ) -> Result<Option<(LeaseRecord, Version)>, LeaseError> {
        match self.store.get(&self.key).await {
            Ok(blob) => {
                let record = LeaseRecord::decode(&self.database, &self.key, &blob.bytes)?;
                Ok(Some((record, blob.version)))
            }
            Err(BlobError::NotFound { .. }) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Acquires the lease for `contender` under `term` (at least
    /// [`Term::FIRST`]): one read, then create-if-absent or a CAS. Succeeds
    /// over no lease, a released or expired lease, or this very
    /// incarnation's live lease (a reboot inside the process); always with
    /// the stored generation + 1. Another process's live lease is
    /// [`LeaseError::Held`], even under the same holder id.
    pub async fn acquire(
        &self,
        contender: &Contender,
        term: Term,
    ) -> Result<LeaseHolder, LeaseError> {
        let result = self.try_acquire(contender, TermChoice::Given(term)).await;
        error::record("acquire", &result);
        result
    }

    /// [`acquire`](LeaseStore::acquire) under the stored lease's term (or
    /// [`Term::FIRST`] if there is none), read in the same call: for a
    /// contender that follows whatever term the deployment set, so a take-over
    /// under a higher term between two reads is a [`LeaseError::Held`] (wait),
    /// never a [`LeaseError::Fenced`].
    pub async fn acquire_at_stored_term(
        &self,
        contender: &Contender,
    ) -> Result<LeaseHolder, LeaseError> {
        let result = self.try_acquire(contender, TermChoice::Stored).await;
        error::record("acquire", &result);
        result
    }

    /// Takes the lease over for `contender` even while another process's
    /// lease is live, under the stored term + 1, so the previous holder is
    /// fenced: its refresh finds the lease changed ([`LeaseError::Stale`]),
    /// and it can no longer publish. Until its own deadline passes it still
    /// believes it may write (and serve reads), so use this only for a holder
    /// known to be gone.
    pub async fn take_over(&self, contender: &Contender) -> Result<LeaseHolder, LeaseError> {
        let result = self.try_acquire(contender, TermChoice::AboveStored).await;
        error::record("take_over", &result);
        result
    }

    async fn try_acquire(
        &self,
        contender: &Contender,
        choice: TermChoice,
    ) -> Result<LeaseHolder, LeaseError> {
        let current = self.read_versioned().await?;
        let stored = current.as_ref().map(|(record, _)| record);
        let term = choice.term(stored.map(|record| record.term));
        assert!(term >= Term::FIRST, "lease terms start at 1");
        // The deadline counts from before the wall reading that sets the expiry,
        // so the holder never believes in more time than the document grants.
        let started = self.clock.now();
        let wall_ms = self.clock.wall_ms();
        let taking_over = choice == TermChoice::AboveStored;
        let next = self.next_acquisition(stored, contender, term, wall_ms, taking_over)?;
        let written = match &current {
            None => create_resolving(self.store.as_ref(), &self.key, next.encode()).await,
            Some((_, version)) => self.write(version, &next).await,
        };
        match written {
            Ok(version) => Ok(LeaseHolder::new(self.clone(), next, version, started)),
            Err(BlobError::AlreadyExists { .. } | BlobError::Conflict { .. }) => {
                Err(LeaseError::LostRace {
                    database: self.database.clone(),
                })
            }
            Err(error) => Err(error.into()),
        }
    }

    /// The record an acquisition by `contender` writes over `current`, or
    /// why not. A take-over (under a higher term) skips the contender checks.
    fn next_acquisition(
        &self,
        current: Option<&LeaseRecord>,
        contender: &Contender,
        term: Term,
        wall_ms: u64,
        taking_over: bool,
    ) -> Result<LeaseRecord, LeaseError> {
        let generation = match current {
            None => Generation::FIRST,
            Some(current) => {
                if !taking_over {
                    self.check_contender(current, contender, term, wall_ms)?;
                }
                current.generation.next().ok_or_else(|| {
                    DocumentError::new("lease", &self.key, "generation", "cannot be incremented")
                })?
            }
        };
        Ok(LeaseRecord {
            database_key: self.database.clone(),
            holder_id: contender.holder().clone(),
            incarnation: Some(contender.incarnation()),
            term,
            generation,
            acquired_at_ms: wall_ms,
            expires_at_ms: record::expiry(wall_ms, self.config.ttl),
            released: false,
        })
    }

    /// Refuses a contender with a lower term (always) or facing a live lease
    /// of another process: another holder id, or the same one written by
    /// another incarnation.
    fn check_contender(
        &self,
        current: &LeaseRecord,
        contender: &Contender,
        term: Term,
        wall_ms: u64,
    ) -> Result<(), LeaseError> {
        if current.term > term {
            return Err(LeaseError::Fenced {
                database: self.database.clone(),
                term,
                stored_term: current.term,
            });
        }
        let own = current.is_held_by(contender.holder(), contender.incarnation());
        if !own && current.is_live(wall_ms) {
            return Err(self.held(current, wall_ms));
        }
        Ok(())
    }

    fn held(&self, current: &LeaseRecord, wall_ms: u64) -> LeaseError {
        LeaseError::Held {
            database: self.database.clone(),
            holder: current.holder_id.clone(),
            expires_in: current.expires_in(wall_ms),
        }
    }

    /// Releases `holder`'s lease on its behalf, keeping its generation: for
    /// operators and tools that act for a holder by name. An expired lease of
    /// `holder` is released; a live one only with [`LiveLease::Release`],
    /// since its process may still be serving (it believes in its lease
    /// until its own deadline), else [`LeaseError::Held`]. Another holder's
    /// live lease is always [`LeaseError::Held`].
    pub async fn release_holder(
        &self,
        holder: &HolderId,
        live: LiveLease,
    ) -> Result<ReleaseOutcome, LeaseError> {
        let Some((current, version)) = self.read_versioned().await? else {
            return Ok(ReleaseOutcome::NotHeld(None));
        };
        let wall_ms = self.clock.wall_ms();
        if current.released {
            return Ok(ReleaseOutcome::NotHeld(Some(current)));
        }
        let live_lease = current.is_live(wall_ms);
        if current.holder_id != *holder {
            if live_lease {
                return Err(self.held(&current, wall_ms));
            }
            return Ok(ReleaseOutcome::NotHeld(Some(current)));
        }
        if live_lease && live == LiveLease::Refuse {
            return Err(self.held(&current, wall_ms));
        }
        let released = current.released_at(wall_ms);
        match self.write(&version, &released).await {
            Ok(_) => Ok(ReleaseOutcome::Released(released)),
            Err(BlobError::Conflict { .. }) => Err(LeaseError::LostRace {
                database: self.database.clone(),
            }),
            Err(error) => Err(error.into()),
        }
    }

    /// Writes `next` over `version`, settling an unknown outcome by comparing
    /// the stored bytes with ours.
    pub(crate) async fn write(
        &self,
        version: &Version,
        next: &LeaseRecord,
    ) -> Result<Version, BlobError> {
        let bytes = next.encode();
        let ours = bytes.clone();
        update_resolving(self.store.as_ref(), &self.key, version, bytes, |found| {
            found == &ours
        })
        .await
    }
}

#[cfg(test)]
mod tests;
