//! The state machine a [`Runtime`](super::Runtime) runs: deterministic apply of
//! log records, snapshots to bytes and back.

use std::io;

use bytes::Bytes;

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
    ///
    /// The machine may keep slices of `record`: the runtime hands over the
    /// buffer a writer appended, or for a record read back from the log
    /// (which would be a slice of a whole fragment or segment) a copy of
    /// its own.
    fn apply(&mut self, index: RecordIndex, record: &Bytes) -> Self::Output;

    /// A consistent copy of the state. This is the only snapshot work done
    /// while writes wait, so it should be cheap.
    fn checkpoint(&self) -> Self::Checkpoint;

    /// The state a snapshot payload encodes.
    fn restore(source: &mut dyn io::Read) -> Result<Self, RestoreError>;

    /// The index of the next record this state expects (it reflects every
    /// record below), if the machine tracks it; `None` if it does not. A
    /// restored state must reflect exactly the index its snapshot was
    /// published at: the runtime refuses one that does not, because replay
    /// would skip records (state ahead) or apply them twice (state behind).
    fn reflected_end(&self) -> Option<RecordIndex> {
        None
    }

    /// The machine's own version of its state, if it keeps one: a number
    /// that never falls, rises with the records that change the state, and
    /// stays put for the others (the key-value machine's store revision).
    /// The runtime tags each applied record with it, so watchers can name
    /// a position by it. A machine without one answers 0.
    fn revision(&self) -> u64 {
        0
    }
}

/// Checks that a state restored from a snapshot published at `wal_index`
/// reflects exactly that prefix of the log (`reflected`: what the machine
/// says it reflects, `None` when it does not track it).
pub(super) fn check_restored(
    reflected: Option<RecordIndex>,
    wal_index: RecordIndex,
) -> Result<(), String> {
    match reflected {
        Some(reflected) if reflected != wal_index => Err(format!(
            "snapshot payload disagrees with HEAD: payload_applied_end={reflected} \
             head_wal_index={wal_index} (restoring it would skip or repeat records)"
        )),
        _ => Ok(()),
    }
}

/// A copy of a state machine's state, written out as a snapshot payload.
pub trait Checkpoint: Send + 'static {
    /// Writes the snapshot bytes to `sink`.
    fn write_to(&self, sink: &mut dyn io::Write) -> io::Result<()>;

    /// The snapshot bytes in one buffer, as [`write_to`](Self::write_to)
    /// writes them. A machine that builds its snapshot in memory anyway
    /// returns that buffer rather than having it copied into another.
    fn to_bytes(&self) -> io::Result<Bytes> {
        let mut bytes = Vec::new();
        self.write_to(&mut bytes)?;
        Ok(Bytes::from(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_state_must_reflect_exactly_the_snapshot_index() {
        assert_eq!(check_restored(None, RecordIndex(7)), Ok(()));
        assert_eq!(check_restored(Some(RecordIndex(7)), RecordIndex(7)), Ok(()));
        for reflected in [0, 6, 8, u64::MAX] {
            let error = check_restored(Some(RecordIndex(reflected)), RecordIndex(7)).unwrap_err();
            assert!(
                error.contains(&format!("payload_applied_end={reflected} head_wal_index=7")),
                "{error}"
            );
        }
    }
}

/// A snapshot payload that does not restore; the message names the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot restore the state from a snapshot: {0}")]
pub struct RestoreError(pub String);
