//! R11 and R12, the multi-version state the etcd writes exercise.
//!
//! - **R11, etcd answers agree**: every process applies an etcd record
//!   with the same answer (`Applied::Etcd`, the whole response: header
//!   revision, `prev_kv`s, `succeeded`, nested answers), the acknowledged
//!   answer is that one too, and an answer's header revision is the store
//!   revision the process was at after the record.
//! - **R12, replicas hold one history**: every state seen at one applied
//!   end (each process's whenever its end moved, and each new HEAD's
//!   payload) has the same store revision, compaction revision, retained
//!   history and key map — compared as a fingerprint over every retained
//!   change (revision, key, entry before and after) and every key's value,
//!   index, create and mod revision, version and lease. Each state's
//!   history must also obey etcd's rules on its own: every change lies
//!   within the compaction and store revisions; a change's entry before is
//!   the key's entry after its previous change; a put gives the key
//!   `mod_revision` = the change's revision, `version` + 1 (1 on create),
//!   and keeps its `create_revision` (the change's on create); a key's last
//!   change leaves the entry the map holds.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use bytes::Bytes;
use chorus::kv::etcd::Revision;
use chorus::kv::{Applied, Entry, EtcdResponse, KvState};
use chorus::runtime::Change;

use super::workload::{is_etcd, record_label};
use crate::model::Violation;

/// R11: the first answer known for each etcd record, by index.
#[derive(Debug, Default)]
pub(super) struct Answers {
    by_index: BTreeMap<u64, Applied>,
    /// Answers compared with another process's or the acknowledged one.
    pub(super) compared: u64,
}

impl Answers {
    /// The answer to the etcd record at `index`, once known.
    pub(super) fn get(&self, index: u64) -> Option<&Applied> {
        self.by_index.get(&index)
    }

    /// R11 for one record `node` applied.
    pub(super) fn on_applied(
        &mut self,
        node: usize,
        change: &Change<Applied>,
    ) -> Result<(), Violation> {
        if !is_etcd(&change.record) {
            return Ok(());
        }
        let index = change.index.0;
        let what = format!(
            "n{node}'s answer to {} at index {index}",
            record_label(&change.record)
        );
        match &change.output {
            Applied::Etcd(Ok(response)) => {
                let header = header_revision(response);
                if u64::try_from(header).ok() != Some(change.revision) {
                    return Err(format!(
                        "{what} has header revision {header}, but the store revision after it \
                         is {}",
                        change.revision
                    ));
                }
            }
            Applied::Etcd(Err(_)) => {}
            other => return Err(format!("{what} is not an etcd answer: {other:?}")),
        }
        self.agree(index, &change.output, &what)
    }

    /// R11 for an acknowledged etcd write's answer.
    pub(super) fn on_acked(&mut self, index: u64, output: &Applied) -> Result<(), Violation> {
        self.agree(
            index,
            output,
            &format!("the acknowledged answer at index {index}"),
        )
    }

    fn agree(&mut self, index: u64, output: &Applied, what: &str) -> Result<(), Violation> {
        match self.by_index.get(&index) {
            Some(known) if known != output => Err(format!(
                "{what} is {output:?}, another answer at that index is {known:?}"
            )),
            Some(_) => {
                self.compared += 1;
                Ok(())
            }
            None => {
                self.by_index.insert(index, output.clone());
                Ok(())
            }
        }
    }
}

/// The header revision of an etcd answer.
fn header_revision(response: &EtcdResponse) -> Revision {
    match response {
        EtcdResponse::Put(put) => put.header_revision,
        EtcdResponse::DeleteRange(delete) => delete.header_revision,
        EtcdResponse::Txn(txn) => txn.header_revision,
        EtcdResponse::Compact(compaction) => compaction.header_revision,
        EtcdResponse::LeaseGrant(grant) => grant.header_revision,
        EtcdResponse::LeaseRevoke(revoke) => revoke.header_revision,
        EtcdResponse::Alarm(alarm) => alarm.header_revision,
    }
}

/// What R12 compares of a state: its revisions and fingerprints of its
/// retained history and its key map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StateDigest {
    revision: Revision,
    compact_revision: Revision,
    /// Retained changes, and their fingerprint.
    changes: usize,
    history: u64,
    /// Keys, and the map's fingerprint.
    keys: usize,
    map: u64,
}

/// R12: the digest of `state`, after checking its history against etcd's
/// rules (see the module docs).
pub(super) fn digest(state: &KvState) -> Result<StateDigest, Violation> {
    let (revision, compact_revision) = (state.revision(), state.compact_revision());
    let mut history = DefaultHasher::new();
    let mut changes = 0;
    // Each key's entry after its latest retained change.
    let mut latest: BTreeMap<&Bytes, Option<&Entry>> = BTreeMap::new();
    for (at, at_changes) in state.history().changes(0, Revision::MAX) {
        if at < compact_revision || at > revision {
            return Err(format!(
                "a change at revision {at}, outside the retained {compact_revision}..={revision}"
            ));
        }
        for change in at_changes {
            let (before, after) = (change.before.as_ref(), change.after.as_ref());
            if let Some(previous) = latest.get(&change.key)
                && *previous != before
            {
                return Err(format!(
                    "the change of {:?} at revision {at} starts from {before:?}, but its \
                     previous change left {previous:?}",
                    change.key
                ));
            }
            check_put(&change.key, at, before, after)?;
            latest.insert(&change.key, after);
            (at, &change.key).hash(&mut history);
            hash_entry(before, &mut history);
            hash_entry(after, &mut history);
            changes += 1;
        }
    }
    for (key, after) in latest {
        if state.get(key) != after {
            return Err(format!(
                "the last change of {key:?} left {after:?}, but the map holds {:?}",
                state.get(key)
            ));
        }
    }
    let mut map = DefaultHasher::new();
    let (entries, _) = state.list(b"", None, usize::MAX);
    for (key, entry) in &entries {
        key.hash(&mut map);
        hash_entry(Some(entry), &mut map);
    }
    Ok(StateDigest {
        revision,
        compact_revision,
        changes,
        history: history.finish(),
        keys: entries.len(),
        map: map.finish(),
    })
}

/// etcd's rules for the entry a change at revision `at` leaves.
fn check_put(
    key: &Bytes,
    at: Revision,
    before: Option<&Entry>,
    after: Option<&Entry>,
) -> Result<(), Violation> {
    let Some(after) = after else {
        return Ok(());
    };
    let expected = (
        at,
        before.map_or(1, |entry| entry.version + 1),
        before.map_or(at, |entry| entry.create_revision),
    );
    let found = (after.mod_revision, after.version, after.create_revision);
    if found != expected {
        return Err(format!(
            "the put of {key:?} at revision {at} left (mod_revision, version, create_revision) = \
             {found:?}, etcd's rules give {expected:?} (entry before: {before:?})"
        ));
    }
    Ok(())
}

fn hash_entry(entry: Option<&Entry>, hasher: &mut DefaultHasher) {
    match entry {
        None => 0u8.hash(hasher),
        Some(entry) => {
            1u8.hash(hasher);
            entry.value.hash(hasher);
            entry.index.0.hash(hasher);
            (
                entry.create_revision,
                entry.mod_revision,
                entry.version,
                entry.lease,
            )
                .hash(hasher);
        }
    }
}

/// R12: the digest of the first state seen at each applied end.
#[derive(Debug, Default)]
pub(super) struct Digests {
    by_end: BTreeMap<u64, (String, StateDigest)>,
    /// States compared with another seen at their end.
    pub(super) compared: u64,
}

impl Digests {
    /// R12 for `state`, described as `what`.
    pub(super) fn check(&mut self, state: &KvState, what: &str) -> Result<(), Violation> {
        let end = state.applied_end().0;
        let found = digest(state).map_err(|error| format!("{what} (below {end}): {error}"))?;
        match self.by_end.get(&end) {
            Some((first, known)) if *known != found => Err(format!(
                "{what} and {first}, both below {end}, differ: {found:?} and {known:?}"
            )),
            Some(_) => {
                self.compared += 1;
                Ok(())
            }
            None => {
                self.by_end.insert(end, (what.to_owned(), found));
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use chorus::ids::RecordIndex;

    use super::*;

    fn entry(create_revision: Revision, mod_revision: Revision, version: i64) -> Entry {
        Entry {
            value: Bytes::from_static(b"v"),
            index: RecordIndex(0),
            create_revision,
            mod_revision,
            version,
            lease: 0,
        }
    }

    #[test]
    fn a_put_that_breaks_etcds_per_key_rules_is_caught() {
        let key = Bytes::from_static(b"e/a");
        // A create, an update and a delete keep the rules.
        check_put(&key, 2, None, Some(&entry(2, 2, 1))).unwrap();
        check_put(&key, 5, Some(&entry(2, 2, 1)), Some(&entry(2, 5, 2))).unwrap();
        check_put(&key, 6, Some(&entry(2, 5, 2)), None).unwrap();
        // A version that skips, a create revision that moves, a stale mod.
        let before = entry(2, 2, 1);
        for after in [entry(2, 5, 3), entry(5, 5, 2), entry(2, 4, 2)] {
            let error = check_put(&key, 5, Some(&before), Some(&after)).unwrap_err();
            assert!(error.contains("etcd's rules"), "{error}");
        }
        assert!(check_put(&key, 2, None, Some(&entry(1, 2, 1))).is_err());
    }
}
