//! R10, revisions: every process that applied a record left the store
//! revision at the same value after it (the runtime tags each applied record
//! with `StateMachine::revision`), and a record moved it by exactly 1 when
//! the machine's output reports a change and by 0 otherwise.

use std::collections::BTreeMap;

use chorus::kv::etcd::{EtcdResponse, ResponseOp};
use chorus::kv::{Applied, Command};
use chorus::runtime::Change;

use crate::model::Violation;

/// The revision after each applied record, as the first process to apply
/// it reported it.
#[derive(Debug, Default)]
pub(super) struct Revisions {
    after: BTreeMap<u64, u64>,
    /// Records whose revision was checked against another process's.
    pub(super) compared: u64,
    /// Records whose move was checked against their output.
    pub(super) moves: u64,
}

impl Revisions {
    /// The store revision after the record at `index`, once known.
    pub(super) fn after(&self, index: u64) -> Option<u64> {
        self.after.get(&index).copied()
    }

    /// R10 for one record `node` applied.
    pub(super) fn on_applied(
        &mut self,
        node: usize,
        change: &Change<Applied>,
    ) -> Result<(), Violation> {
        let index = change.index.0;
        if let Some(&agreed) = self.after.get(&index) {
            self.compared += 1;
            if agreed != change.revision {
                return Err(format!(
                    "n{node} is at revision {} after index {index}, another process was at \
                     {agreed}",
                    change.revision
                ));
            }
        }
        self.after.insert(index, change.revision);
        let Some(before) = index.checked_sub(1).and_then(|i| self.after.get(&i)) else {
            return Ok(());
        };
        self.moves += 1;
        let changed = reports_change(&change.record, &change.output);
        let moved = change.revision.checked_sub(*before);
        if moved != Some(u64::from(changed)) {
            return Err(format!(
                "n{node}: the record at index {index} moved the revision from {before} to {} \
                 while its output {:?} reports {}",
                change.revision,
                change.output,
                if changed { "a change" } else { "no change" }
            ));
        }
        Ok(())
    }
}

/// Whether the machine's output for `record` says it changed a key.
fn reports_change(record: &[u8], output: &Applied) -> bool {
    match output {
        Applied::Done { unchanged, .. } => Command::decode(record)
            .is_ok_and(|command| command.operations().len() > unchanged.len()),
        Applied::Etcd(Ok(response)) => etcd_changed(response),
        Applied::Etcd(Err(_))
        | Applied::ConditionFailed { .. }
        | Applied::Malformed(_)
        | Applied::Duplicate { .. }
        | Applied::KeyReused { .. } => false,
    }
}

fn etcd_changed(response: &EtcdResponse) -> bool {
    match response {
        EtcdResponse::Put(_) => true,
        EtcdResponse::DeleteRange(delete) => delete.deleted > 0,
        EtcdResponse::Txn(txn) => txn.responses.iter().any(op_changed),
        EtcdResponse::LeaseRevoke(revoke) => revoke.deleted > 0,
        EtcdResponse::Compact(_) | EtcdResponse::LeaseGrant(_) | EtcdResponse::Alarm(_) => false,
    }
}

fn op_changed(op: &ResponseOp) -> bool {
    match op {
        ResponseOp::Range(_) => false,
        ResponseOp::Put(_) => true,
        ResponseOp::DeleteRange(delete) => delete.deleted > 0,
        ResponseOp::Txn(txn) => txn.responses.iter().any(op_changed),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use chorus::ids::RecordIndex;
    use chorus::kv::{Condition, Operation};

    use super::*;

    fn change(index: u64, revision: u64, unchanged: Vec<usize>) -> Change<Applied> {
        let record = Command::Single(Operation::Delete {
            key: Bytes::from_static(b"k"),
            condition: Condition::None,
        })
        .encode()
        .unwrap();
        Change {
            index: RecordIndex(index),
            record,
            output: Applied::Done {
                unchanged,
                revision: revision as i64,
            },
            revision,
        }
    }

    #[test]
    fn a_revision_moves_by_one_exactly_when_a_change_is_reported_and_replicas_agree() {
        let mut revisions = Revisions::default();
        revisions.on_applied(0, &change(0, 2, vec![])).unwrap();
        // A delete of nothing stays; a change moves by one.
        revisions.on_applied(0, &change(1, 2, vec![0])).unwrap();
        revisions.on_applied(0, &change(2, 3, vec![])).unwrap();
        // Another process agrees, or is caught.
        revisions.on_applied(1, &change(2, 3, vec![])).unwrap();
        assert!(revisions.on_applied(1, &change(2, 4, vec![])).is_err());
        // A change that did not move, a no-op that moved, a jump of two.
        assert!(revisions.on_applied(0, &change(3, 3, vec![])).is_err());
        let mut fresh = Revisions::default();
        fresh.on_applied(0, &change(0, 2, vec![])).unwrap();
        assert!(fresh.on_applied(0, &change(1, 3, vec![0])).is_err());
        assert!(fresh.on_applied(0, &change(2, 5, vec![])).is_err());
        assert_eq!((revisions.compared, revisions.moves), (2, 4));
    }
}
