//! R13, etcd answers follow a model: a model of the etcd keys, written
//! from etcd's rules apart from the machine, replays every etcd record in
//! index order (as far as the records applied so far reach without a gap)
//! and expects, record by record: a put's answer (header revision,
//! `prev_kv`), a delete's (how many, which `prev_kv`s), a transaction's
//! `succeeded` and every answer of the branch it took (nested ones too;
//! ranges at the current revision in full, with limit, sort, `keys_only`
//! and `count_only`), a compaction's, etcd's `Compacted` refusal where a
//! compaction applied first, and the store revision the record leaves.
//!
//! The model keeps only the current entries of the etcd keys and the
//! compaction revision; the store revision before each record is the one
//! R10 has every process agree on (the other kinds' records move it too).
//! Ranges at a past revision are left to R12, which compares the history
//! they read.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use bytes::Bytes;
use chorus::kv::etcd::{
    CompactionResponse, Compare, CompareResult, CompareTarget, DeleteRangeRequest,
    DeleteRangeResponse, KeyValue, PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp,
    ResponseOp, Revision, SortOrder, SortTarget, TxnRequest, TxnResponse,
};
use chorus::kv::{Applied, EtcdCommand, EtcdError, EtcdResponse};

use super::workload::record_label;
use crate::model::Violation;

/// The model: see the module docs.
#[derive(Debug)]
pub(super) struct EtcdModel {
    /// The next index to replay.
    next: u64,
    /// The etcd keys' entries (`lease` always 0).
    entries: BTreeMap<Bytes, KeyValue>,
    /// etcd's compaction revision, -1 before the first compaction.
    compacted: Revision,
    /// etcd records whose answer was checked.
    pub(super) checked: u64,
}

impl Default for EtcdModel {
    fn default() -> EtcdModel {
        EtcdModel {
            next: 0,
            entries: BTreeMap::new(),
            compacted: -1,
            checked: 0,
        }
    }
}

/// What the model needs of an index: the record, the store revision
/// before and after it, and (for an etcd record) its answer.
pub(super) struct Known<'a> {
    pub(super) record: &'a Bytes,
    pub(super) before: u64,
    pub(super) after: u64,
    pub(super) answer: Option<&'a Applied>,
}

/// One etcd write being replayed: the revision it writes, and whether it
/// changed anything yet.
struct Write {
    revision: Revision,
    changed: bool,
}

impl Write {
    fn read_revision(&self) -> Revision {
        self.revision - i64::from(!self.changed)
    }
}

impl EtcdModel {
    /// Replays every index from the next one on that `known` knows.
    pub(super) fn advance<'a>(
        &mut self,
        mut known: impl FnMut(u64) -> Option<Known<'a>>,
    ) -> Result<(), Violation> {
        loop {
            let index = self.next;
            let Some(known) = known(index) else {
                return Ok(());
            };
            if let Ok(command) = EtcdCommand::decode(known.record) {
                let Some(answer) = known.answer else {
                    return Ok(());
                };
                self.replay(index, &command, &known, answer)
                    .map_err(|error| {
                        format!(
                            "etcd model: {} at index {index}: {error}",
                            record_label(known.record)
                        )
                    })?;
                self.checked += 1;
            }
            self.next += 1;
        }
    }

    fn replay(
        &mut self,
        index: u64,
        command: &EtcdCommand,
        known: &Known<'_>,
        answer: &Applied,
    ) -> Result<(), Violation> {
        let before = known.before as Revision;
        let mut write = Write {
            revision: before + 1,
            changed: false,
        };
        if matches!(
            command,
            EtcdCommand::LeaseGrant(_) | EtcdCommand::LeaseRevoke(_) | EtcdCommand::Alarm(_)
        ) {
            return Err("a lease or alarm request, which the workload never draws".into());
        }
        let expected = match self.refusal(command, before) {
            Some(refusal) => Err(refusal),
            None => Ok(self.execute(&mut write, command)),
        };
        let after = write.read_revision();
        if after != known.after as Revision {
            return Err(format!(
                "it leaves the store revision at {}, the model at {after} (from {before})",
                known.after
            ));
        }
        let Applied::Etcd(found) = answer else {
            return Err(format!("it applied as {answer:?}"));
        };
        match (found, &expected) {
            (Ok(found), Ok(expected)) if same_response(command, found, expected) => Ok(()),
            (Err(found), Err(expected)) if found == expected => Ok(()),
            _ => Err(format!(
                "index {index} answered {found:?}, the model expects {expected:?}"
            )),
        }
    }

    /// etcd's refusal at apply time: a compaction at or below the
    /// compaction revision, or a range in the taken branches below it.
    fn refusal(&self, command: &EtcdCommand, current: Revision) -> Option<EtcdError> {
        match command {
            EtcdCommand::Compact(compaction) if compaction.revision <= self.compacted => {
                Some(EtcdError::Compacted)
            }
            EtcdCommand::Compact(compaction) if compaction.revision > current => {
                Some(EtcdError::FutureRevision)
            }
            EtcdCommand::Txn(txn) => self.range_refusal(txn, current),
            _ => None,
        }
    }

    fn range_refusal(&self, txn: &TxnRequest, current: Revision) -> Option<EtcdError> {
        self.taken(txn).iter().find_map(|op| match op {
            RequestOp::Range(range) if range.revision > current => Some(EtcdError::FutureRevision),
            RequestOp::Range(range) if range.revision != 0 && range.revision < self.compacted => {
                Some(EtcdError::Compacted)
            }
            RequestOp::Txn(inner) => self.range_refusal(inner, current),
            _ => None,
        })
    }

    fn execute(&mut self, write: &mut Write, command: &EtcdCommand) -> EtcdResponse {
        match command {
            EtcdCommand::Put(put) => EtcdResponse::Put(self.put(write, put)),
            EtcdCommand::DeleteRange(delete) => {
                EtcdResponse::DeleteRange(self.delete(write, delete))
            }
            EtcdCommand::Txn(txn) => {
                let plan = self.plan(txn);
                let mut response = self.txn(write, txn, &plan);
                response.header_revision = write.read_revision();
                EtcdResponse::Txn(response)
            }
            EtcdCommand::Compact(compaction) => {
                self.compacted = compaction.revision;
                EtcdResponse::Compact(CompactionResponse {
                    header_revision: write.read_revision(),
                })
            }
            other => unreachable!("replay refuses {other:?} first"),
        }
    }

    fn put(&mut self, write: &mut Write, put: &PutRequest) -> PutResponse {
        write.changed = true;
        let revision = write.revision;
        let before = self.entries.get(&put.key).cloned();
        let entry = KeyValue {
            key: put.key.clone(),
            value: put.value.clone(),
            create_revision: before.as_ref().map_or(revision, |kv| kv.create_revision),
            mod_revision: revision,
            version: before.as_ref().map_or(1, |kv| kv.version + 1),
            lease: 0,
        };
        self.entries.insert(put.key.clone(), entry);
        PutResponse {
            header_revision: revision,
            prev_kv: before.filter(|_| put.prev_kv),
        }
    }

    fn delete(&mut self, write: &mut Write, delete: &DeleteRangeRequest) -> DeleteRangeResponse {
        let keys: Vec<Bytes> = self
            .in_range(&delete.key, &delete.range_end)
            .map(|kv| kv.key.clone())
            .collect();
        let mut prev_kvs = Vec::new();
        for key in &keys {
            let before = self.entries.remove(key).expect("a listed key");
            write.changed = true;
            if delete.prev_kv {
                prev_kvs.push(before);
            }
        }
        DeleteRangeResponse {
            header_revision: write.read_revision(),
            deleted: keys.len() as i64,
            prev_kvs,
        }
    }

    /// The model's entries in etcd's range `key`..`range_end` (no
    /// from-key range: the workload draws none).
    fn in_range<'a>(
        &'a self,
        key: &Bytes,
        range_end: &Bytes,
    ) -> impl Iterator<Item = &'a KeyValue> {
        let single = range_end.is_empty();
        let (key, range_end) = (key.clone(), range_end.clone());
        self.entries
            .range(key.clone()..)
            .take_while(move |(at, _)| {
                if single {
                    **at == key
                } else {
                    **at < range_end
                }
            })
            .map(|(_, kv)| kv)
    }

    fn holds(&self, compare: &Compare) -> bool {
        let mut keys = self.in_range(&compare.key, &compare.range_end).peekable();
        if keys.peek().is_none() {
            return !matches!(compare.target, CompareTarget::Value(_)) && compared(compare, None);
        }
        keys.all(|kv| compared(compare, Some(kv)))
    }

    /// The branches a transaction takes, every compare (nested ones too)
    /// evaluated before anything runs: `(succeeded, nested plans)`.
    fn plan(&self, txn: &TxnRequest) -> Plan {
        let succeeded = txn.compare.iter().all(|compare| self.holds(compare));
        let ops = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        let nested = ops
            .iter()
            .filter_map(|op| match op {
                RequestOp::Txn(inner) => Some(self.plan(inner)),
                _ => None,
            })
            .collect();
        Plan { succeeded, nested }
    }

    /// The branch `txn` takes now (for the refusal check, before anything runs).
    fn taken<'t>(&self, txn: &'t TxnRequest) -> &'t [RequestOp] {
        if txn.compare.iter().all(|compare| self.holds(compare)) {
            &txn.success
        } else {
            &txn.failure
        }
    }

    fn txn(&mut self, write: &mut Write, txn: &TxnRequest, plan: &Plan) -> TxnResponse {
        let ops = if plan.succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        let mut nested = plan.nested.iter();
        let responses = ops
            .iter()
            .map(|op| match op {
                RequestOp::Range(range) => ResponseOp::Range(self.range(write, range)),
                RequestOp::Put(put) => ResponseOp::Put(self.put(write, put)),
                RequestOp::DeleteRange(delete) => {
                    ResponseOp::DeleteRange(self.delete(write, delete))
                }
                RequestOp::Txn(inner) => {
                    let inner_plan = nested.next().expect("one plan per nested txn");
                    ResponseOp::Txn(self.txn(write, inner, inner_plan))
                }
            })
            .collect();
        TxnResponse {
            header_revision: 0,
            succeeded: plan.succeeded,
            responses,
        }
    }

    /// A range at the current revision (of one at a past revision only
    /// the header is compared: see `same_op`).
    fn range(&self, write: &Write, range: &RangeRequest) -> RangeResponse {
        let mut kvs: Vec<KeyValue> = self
            .in_range(&range.key, &range.range_end)
            .cloned()
            .collect();
        let count = kvs.len() as i64;
        // etcd reads one key more than the limit, in key order, unless an
        // order is asked for: a non-key target with no order sorts only
        // those (etcd's `apply.go` Range; the workload draws no revision
        // filters, which read everything too).
        if range.sort_order == SortOrder::None && range.limit > 0 {
            kvs.truncate(range.limit as usize + 1);
        }
        sort(&mut kvs, range);
        let more = range.limit > 0 && kvs.len() as i64 > range.limit;
        if range.limit > 0 {
            kvs.truncate(range.limit as usize);
        }
        if range.keys_only {
            kvs.iter_mut().for_each(|kv| kv.value = Bytes::new());
        }
        if range.count_only {
            kvs.clear();
        }
        RangeResponse {
            header_revision: write.read_revision(),
            kvs,
            more: more && !range.count_only,
            count,
        }
    }
}

/// A transaction's taken branch and its nested transactions' plans.
struct Plan {
    succeeded: bool,
    nested: Vec<Plan>,
}

fn compared(compare: &Compare, kv: Option<&KeyValue>) -> bool {
    let number = |field: fn(&KeyValue) -> i64| kv.map_or(0, field);
    let ordering = match &compare.target {
        CompareTarget::Value(value) => kv.map_or(&[][..], |kv| &kv.value[..]).cmp(&value[..]),
        CompareTarget::Version(version) => number(|kv| kv.version).cmp(version),
        CompareTarget::Create(revision) => number(|kv| kv.create_revision).cmp(revision),
        CompareTarget::Mod(revision) => number(|kv| kv.mod_revision).cmp(revision),
        CompareTarget::Lease(lease) => number(|kv| kv.lease).cmp(lease),
    };
    match compare.result {
        CompareResult::Equal => ordering == Ordering::Equal,
        CompareResult::NotEqual => ordering != Ordering::Equal,
        CompareResult::Greater => ordering == Ordering::Greater,
        CompareResult::Less => ordering == Ordering::Less,
    }
}

/// etcd's sort: key order as read; another target with no order ascends.
fn sort(kvs: &mut [KeyValue], range: &RangeRequest) {
    let order = match (range.sort_target, range.sort_order) {
        (SortTarget::Key, order) => order,
        (_, SortOrder::None) => SortOrder::Ascend,
        (_, order) => order,
    };
    let key = |kv: &KeyValue| -> (i64, Bytes) {
        match range.sort_target {
            SortTarget::Key => (0, kv.key.clone()),
            SortTarget::Version => (kv.version, Bytes::new()),
            SortTarget::Create => (kv.create_revision, Bytes::new()),
            SortTarget::Mod => (kv.mod_revision, Bytes::new()),
            SortTarget::Value => (0, kv.value.clone()),
        }
    };
    match order {
        SortOrder::None => {}
        SortOrder::Ascend => kvs.sort_by_key(key),
        SortOrder::Descend => kvs.sort_by_key(|kv| std::cmp::Reverse(key(kv))),
    }
}

/// Whether an answer equals the model's; of a range at a past revision,
/// only the header revision is compared.
fn same_response(command: &EtcdCommand, found: &EtcdResponse, expected: &EtcdResponse) -> bool {
    match (command, found, expected) {
        (EtcdCommand::Txn(txn), EtcdResponse::Txn(found), EtcdResponse::Txn(expected)) => {
            same_txn(txn, found, expected)
        }
        _ => found == expected,
    }
}

fn same_txn(txn: &TxnRequest, found: &TxnResponse, expected: &TxnResponse) -> bool {
    let ops = if expected.succeeded {
        &txn.success
    } else {
        &txn.failure
    };
    found.header_revision == expected.header_revision
        && found.succeeded == expected.succeeded
        && found.responses.len() == ops.len()
        && expected.responses.len() == ops.len()
        && ops
            .iter()
            .zip(found.responses.iter().zip(&expected.responses))
            .all(|(op, (found, expected))| same_op(op, found, expected))
}

fn same_op(op: &RequestOp, found: &ResponseOp, expected: &ResponseOp) -> bool {
    match (op, found, expected) {
        (RequestOp::Txn(txn), ResponseOp::Txn(found), ResponseOp::Txn(expected)) => {
            same_txn(txn, found, expected)
        }
        (RequestOp::Range(range), ResponseOp::Range(found), ResponseOp::Range(expected))
            if range.revision != 0 =>
        {
            found.header_revision == expected.header_revision
        }
        _ => found == expected,
    }
}
