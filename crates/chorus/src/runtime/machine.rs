//! The state machine a [`Runtime`](super::Runtime) runs: deterministic apply of
//! log records, snapshots to bytes and back.

use std::io;

use crate::ids::RecordIndex;

/// A deterministic state machine driven by the log.
///
/// Every process that applied the same prefix of the log holds the same
/// state, so a primary, a standby and a restarted process agree. `apply` does
/// no I/O and never fails: a record the machine cannot use is applied as a
/// no-op with an error output, because the log is the source of truth and
/// refusing a committed record would wedge every replica of the state.
pub trait StateMachine: Default + Send + 'static {
    /// What applying one record answers the writer (and watchers).
    type Output: Clone + Send + Sync + 'static;
    /// A consistent copy of the state for a snapshot, encoded after the
    /// runtime released its lock on the state.
    type Checkpoint: Checkpoint;

    /// Applies record `index`. The runtime calls it in index order, each
    /// index once, starting at the index the state was restored at.
    fn apply(&mut self, index: RecordIndex, record: &[u8]) -> Self::Output;

    /// A consistent copy of the state. This is the only snapshot work done
    /// while writes wait, so it should be cheap.
    fn checkpoint(&self) -> Self::Checkpoint;

    /// The state a snapshot payload encodes.
    fn restore(source: &mut dyn io::Read) -> Result<Self, RestoreError>;
}

/// A copy of a state machine's state, written out as a snapshot payload.
pub trait Checkpoint: Send + 'static {
    /// Writes the snapshot bytes to `sink`.
    fn write_to(&self, sink: &mut dyn io::Write) -> io::Result<()>;
}

/// A snapshot payload that does not restore; the message names the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot restore the state from a snapshot: {0}")]
pub struct RestoreError(pub String);
