//! What can go wrong in a runtime, in the shape its callers act on.

use std::fmt;

use crate::lease::HolderId;
use crate::log::LogError;

/// The role a runtime plays right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Hydrating, waiting for the lease, or recovering the log.
    Booting,
    /// Holds the lease and the log's writer: serves writes and reads.
    Primary,
    /// Another process holds the lease: tails the log to stay warm.
    Standby,
    /// Shutting down or stopped.
    Stopped,
}

impl Role {
    /// The role's name in status and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Booting => "booting",
            Role::Primary => "primary",
            Role::Standby => "standby",
            Role::Stopped => "stopped",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a runtime cannot serve a write, or a read that must be current, now.
/// The client should retry later, or at the primary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// This process is not the primary.
    #[error("not the primary: role={role}")]
    NotPrimary {
        /// What it is instead.
        role: Role,
        /// The lease holder, if known.
        primary: Option<HolderId>,
    },
    /// The primary cannot be sure it still holds the lease (a refresh is
    /// overdue); it serves nothing until a refresh proves the lease again.
    #[error("lease uncertain: this process cannot be sure it still holds the writer lease")]
    LeaseUncertain,
}

/// Why a write did not happen, or may have.
#[derive(Debug, thiserror::Error)]
pub enum WriteError<E> {
    /// The caller's `prepare` refused the write against the applied state;
    /// nothing was appended.
    #[error("rejected: {0}")]
    Rejected(E),
    /// Not served here now; nothing was appended.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// The log refused or failed the append. Refusals (backpressure, too
    /// large) appended nothing; a failure after admission may have committed:
    /// see [`LogError::may_have_committed`].
    #[error(transparent)]
    Log(LogError),
}

/// A boot or steady-state step that failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{phase} failed: {message}")]
pub struct RuntimeError {
    /// The step.
    pub phase: Phase,
    /// What went wrong, with the causes.
    pub message: String,
    /// Whether trying again may succeed: a store outage, a lost race, or
    /// damaged data a later read or an operator's repair may fix.
    pub transient: bool,
}

impl RuntimeError {
    pub(crate) fn new(phase: Phase, error: impl fmt::Display, transient: bool) -> RuntimeError {
        RuntimeError {
            phase,
            message: error.to_string(),
            transient,
        }
    }
}

/// The steps of a boot, each timed (`chorus_runtime_phase_seconds{phase}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Reading `HEAD.json`.
    ObserveHead,
    /// Downloading, verifying and restoring the snapshot it names.
    Restore,
    /// Acquiring the writer lease.
    AcquireLease,
    /// Stamping HEAD with the lease.
    ClaimHead,
    /// Recovering the log (claims its epoch, fencing any old writer).
    RecoverLog,
    /// Applying the log from the snapshot's index to its end.
    Replay,
    /// Starting the log's writer.
    StartWriter,
    /// Publishing a snapshot and truncating the log below it.
    Snapshot,
    /// Tailing the log as a standby.
    Standby,
}

impl Phase {
    /// The phase's name in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::ObserveHead => "observe_head",
            Phase::Restore => "restore",
            Phase::AcquireLease => "acquire_lease",
            Phase::ClaimHead => "claim_head",
            Phase::RecoverLog => "recover_log",
            Phase::Replay => "replay",
            Phase::StartWriter => "start_writer",
            Phase::Snapshot => "snapshot",
            Phase::Standby => "standby",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
