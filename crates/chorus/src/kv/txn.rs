//! etcd's requests on the multi-version map: reads, the checks etcd makes
//! before applying, and transactions — with etcd v3.4's exact answers
//! (`etcdserver/apply.go`, `etcdserver/api/v3rpc/key.go`, `mvcc/kvstore_txn.go`).
//!
//! A transaction is one write: its compares (nested ones included) are all
//! evaluated against the state before it, then the taken branch's operations
//! run in order, each seeing the earlier ones' writes, and every key written
//! gets the one revision the transaction writes. A transaction that changed
//! nothing leaves the store revision where it was.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashSet};
use std::ops::Bound;

use bytes::Bytes;

use super::etcd::{
    AlarmAction, AlarmRequest, AlarmResponse, AlarmType, CompactionResponse, Compare,
    CompareResult, CompareTarget, DeleteRangeRequest, DeleteRangeResponse, EtcdCommand, EtcdError,
    EtcdResponse, KeyValue, LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, RequestOp, ResponseOp, Revision, SortOrder,
    SortTarget, TxnRequest, TxnResponse,
};
use super::lease::{MAX_LEASE_TTL_SECS, MAX_LEASES};
use super::mvcc::{Change, key_range};
use super::quota::{GRANT_OVERHEAD_BYTES, put_cost};
use super::{Entry, KvState};
use crate::ids::RecordIndex;

/// etcd's default for the most operations in one transaction branch
/// (`--max-txn-ops`).
pub const DEFAULT_MAX_TXN_OPS: usize = 128;

/// One write (a record) in progress: the revision it writes and whether it
/// changed anything yet.
pub(super) struct Write {
    index: RecordIndex,
    revision: Revision,
    changed: bool,
}

impl Write {
    /// The revision a read inside this write answers as current: the one
    /// being written once something changed, else the store's.
    fn read_revision(&self) -> Revision {
        if self.changed {
            self.revision
        } else {
            self.revision - 1
        }
    }
}

/// The branches a transaction takes: its own, then its nested
/// transactions' in the taken branch's order.
pub(super) struct Path {
    /// Whether every compare of this transaction held.
    pub(super) succeeded: bool,
    /// The nested transactions' paths.
    nested: Vec<Path>,
}

impl KvState {
    /// The current store revision (1 on an empty store).
    pub fn revision(&self) -> Revision {
        self.history.revision()
    }

    /// The compaction revision: 0 until the first compaction.
    pub fn compact_revision(&self) -> Revision {
        self.history.compact_revision()
    }

    /// The bytes charged for the retained (non-current) history.
    pub fn history_bytes(&self) -> usize {
        self.history.bytes()
    }

    /// The retained history (for watches: the changes of a revision range).
    pub fn history(&self) -> &super::mvcc::History {
        &self.history
    }

    /// etcd's Range, read from the state as it is (no log record).
    pub fn range(&self, request: &RangeRequest) -> Result<RangeResponse, EtcdError> {
        if request.key.is_empty() {
            return Err(EtcdError::EmptyKey);
        }
        self.range_as_of(request, self.history.revision())
    }

    /// A read whose current revision is `current` (the header's revision).
    fn range_as_of(
        &self,
        request: &RangeRequest,
        current: Revision,
    ) -> Result<RangeResponse, EtcdError> {
        let revision = match request.revision {
            revision if revision > current => return Err(EtcdError::FutureRevision),
            revision if revision <= 0 => current,
            revision => revision,
        };
        if revision < self.history.compacted {
            return Err(EtcdError::Compacted);
        }
        let (mut kvs, count) = self.collect(request, revision, fetch_limit(request));
        retain_revision_filters(&mut kvs, request);
        sort(&mut kvs, request);
        let mut more = false;
        if request.limit > 0 && kvs.len() as u64 > request.limit as u64 {
            kvs.truncate(request.limit as usize);
            more = true;
        }
        if request.keys_only {
            kvs.iter_mut().for_each(|kv| kv.value = Bytes::new());
        }
        Ok(RangeResponse {
            header_revision: current,
            kvs,
            more,
            count,
        })
    }

    /// The keys in the request's range as of `revision`: at most `limit`
    /// of them (0: all; none for `count_only`) in key order, and how many
    /// there are in all.
    fn collect(
        &self,
        request: &RangeRequest,
        revision: Revision,
        limit: usize,
    ) -> (Vec<KeyValue>, i64) {
        let mut kvs = Vec::new();
        let mut count = 0;
        let mut visit = |key: &Bytes, entry: &Entry| {
            count += 1;
            if !request.count_only && (limit == 0 || kvs.len() < limit) {
                kvs.push(entry.key_value(key));
            }
        };
        let Some(current) = self.entries_in(&request.key, &request.range_end) else {
            return (kvs, 0);
        };
        let end = key_range(&request.key, &request.range_end);
        let past = self.history.undo_after(revision, &request.key, &end);
        if past.is_empty() {
            current.for_each(|(key, entry)| visit(key, entry));
        } else {
            let mut view: BTreeMap<&Bytes, &Entry> = current
                .filter(|(key, _)| !past.contains_key(*key))
                .collect();
            for (key, entry) in &past {
                if let Some(entry) = entry {
                    view.insert(key, entry);
                }
            }
            view.into_iter().for_each(|(key, entry)| visit(key, entry));
        }
        (kvs, count)
    }

    /// The current entries in etcd's range `key`..`range_end`, `None` for
    /// an empty range.
    fn entries_in<'a>(
        &'a self,
        key: &Bytes,
        range_end: &Bytes,
    ) -> Option<impl Iterator<Item = (&'a Bytes, &'a Entry)> + 'a> {
        let end = key_range(key, range_end);
        if matches!(&end, Bound::Excluded(end) if end <= key) {
            return None;
        }
        Some(self.entries.range((Bound::Included(key.clone()), end)))
    }

    /// Applies an etcd command as one write at record `index`. A refused
    /// command changes nothing.
    pub(super) fn apply_etcd(
        &mut self,
        index: RecordIndex,
        command: &EtcdCommand,
    ) -> Result<EtcdResponse, EtcdError> {
        // The operation limit is the proposer's configuration; the log holds
        // what it accepted.
        command.check_request(i64::MAX)?;
        self.check_state(command)?;
        let mut write = self.begin_write(index);
        let response = match command {
            EtcdCommand::Put(put) => EtcdResponse::Put(self.execute_put(&mut write, put)),
            EtcdCommand::DeleteRange(delete) => {
                EtcdResponse::DeleteRange(self.execute_delete(&mut write, delete))
            }
            EtcdCommand::Txn(txn) => {
                let path = self.plan(txn);
                let mut response = self.execute_txn(&mut write, txn, &path);
                response.header_revision = write.read_revision();
                EtcdResponse::Txn(response)
            }
            EtcdCommand::Compact(compaction) => {
                self.history.compact(compaction.revision);
                EtcdResponse::Compact(CompactionResponse {
                    header_revision: self.history.revision(),
                })
            }
            EtcdCommand::LeaseGrant(grant) => EtcdResponse::LeaseGrant(self.grant(index, grant)),
            EtcdCommand::Alarm(alarm) => EtcdResponse::Alarm(self.alarm(alarm)),
            EtcdCommand::LeaseRevoke(revoke) => {
                let lease = self.leases.remove(revoke.id).expect("checked to exist");
                // etcd deletes a revoked lease's keys in key order, in one write.
                for key in &lease.keys {
                    self.delete_key(&mut write, key);
                }
                EtcdResponse::LeaseRevoke(LeaseRevokeResponse {
                    header_revision: write.read_revision(),
                    deleted: lease.keys.len() as i64,
                })
            }
        };
        self.finish_write(write);
        Ok(response)
    }

    /// Raises or clears an alarm: the answer names it, unless a clear
    /// found it not raised (etcd's answers).
    fn alarm(&mut self, request: &AlarmRequest) -> AlarmResponse {
        let changed = match request.action {
            AlarmAction::Activate => {
                self.alarms.insert(request.member);
                true
            }
            AlarmAction::Deactivate => self.alarms.remove(&request.member),
        };
        AlarmResponse {
            header_revision: self.history.revision(),
            alarms: changed.then_some(request.member).into_iter().collect(),
        }
    }

    /// Whether the NOSPACE alarm is raised (for any member): writes that
    /// add data are refused, as etcd's capped applier refuses them.
    pub fn out_of_space(&self) -> bool {
        self.alarms.iter().any(|a| a.alarm == AlarmType::NoSpace)
    }

    /// Creates the lease a grant at record `index` asks for; it changes no
    /// key, so no revision.
    fn grant(&mut self, index: RecordIndex, grant: &LeaseGrantRequest) -> LeaseGrantResponse {
        let id = match grant.id {
            0 => self.leases.choose_id(index),
            id => id,
        };
        let ttl = self.leases.grant(id, grant.ttl).ttl_secs;
        LeaseGrantResponse {
            header_revision: self.history.revision(),
            id,
            ttl,
        }
    }

    /// etcd's HashKV at `revision` (0 or less: the current one): a CRC32C
    /// over every key's entry as of that revision and every retained
    /// change at or below it, so two replicas that applied the same log
    /// agree whatever they applied since. Returns the hash, the compaction
    /// revision and the revision hashed.
    pub fn hash_kv(&self, revision: Revision) -> Result<(u32, Revision, Revision), EtcdError> {
        let current = self.history.revision();
        let all = RangeRequest {
            key: Bytes::from_static(b"\0"),
            range_end: Bytes::from_static(b"\0"),
            revision,
            ..RangeRequest::default()
        };
        let at = self.range_as_of(&all, current)?;
        let revision = if revision <= 0 { current } else { revision };
        let mut hash = 0;
        let mut add = |bytes: &[u8]| hash = crc32c::crc32c_append(hash, bytes);
        for kv in &at.kvs {
            add(&kv.key);
            add(&kv.value);
            for number in [kv.create_revision, kv.mod_revision, kv.version, kv.lease] {
                add(&number.to_le_bytes());
            }
        }
        for (at, changes) in self.history.changes(0, revision) {
            add(&at.to_le_bytes());
            for change in changes {
                add(&change.key);
                let entry = change.after.as_ref();
                add(&entry.map_or(0, |entry| entry.mod_revision).to_le_bytes());
            }
        }
        Ok((hash, self.compact_revision(), revision))
    }

    /// The checks etcd makes against the state before applying.
    fn check_state(&self, command: &EtcdCommand) -> Result<(), EtcdError> {
        if self.out_of_space() && command.quota_cost() > 0 {
            return Err(EtcdError::NoSpace);
        }
        match command {
            EtcdCommand::Put(put) => {
                self.check_lease(put.lease)?;
                self.check_ignored_fields(put)
            }
            EtcdCommand::DeleteRange(_) => Ok(()),
            EtcdCommand::Txn(txn) => {
                let path = self.plan(txn);
                if !is_read_only(txn) {
                    self.check_path(txn, &path, &mut |op| match op {
                        RequestOp::Put(put) => {
                            self.check_ignored_fields(put)?;
                            self.check_lease(put.lease)
                        }
                        _ => Ok(()),
                    })?;
                }
                self.check_path(txn, &path, &mut |op| match op {
                    RequestOp::Range(range) => self.check_range_revision(range.revision),
                    _ => Ok(()),
                })
            }
            EtcdCommand::Compact(compaction) => {
                if compaction.revision <= self.history.compacted {
                    Err(EtcdError::Compacted)
                } else if compaction.revision > self.history.revision() {
                    Err(EtcdError::FutureRevision)
                } else {
                    Ok(())
                }
            }
            // etcd's order: the TTL, then the id.
            EtcdCommand::LeaseGrant(grant) => {
                if grant.ttl > MAX_LEASE_TTL_SECS {
                    Err(EtcdError::LeaseTtlTooLarge)
                } else if grant.id != 0 && self.leases.get(grant.id).is_some() {
                    Err(EtcdError::LeaseExists)
                } else if self.leases.len() >= MAX_LEASES {
                    Err(EtcdError::NoSpace)
                } else {
                    Ok(())
                }
            }
            EtcdCommand::LeaseRevoke(revoke) => match self.leases.get(revoke.id) {
                Some(_) => Ok(()),
                None => Err(EtcdError::LeaseNotFound),
            },
            EtcdCommand::Alarm(_) => Ok(()),
        }
    }

    /// A lease a request names must exist (0 names none).
    fn check_lease(&self, lease: i64) -> Result<(), EtcdError> {
        if lease != 0 && self.leases.get(lease).is_none() {
            return Err(EtcdError::LeaseNotFound);
        }
        Ok(())
    }

    /// `ignore_value` and `ignore_lease` need the key to exist.
    fn check_ignored_fields(&self, put: &PutRequest) -> Result<(), EtcdError> {
        if (put.ignore_value || put.ignore_lease) && !self.entries.contains_key(&put.key) {
            return Err(EtcdError::KeyNotFound);
        }
        Ok(())
    }

    /// A range's revision inside a transaction, checked before it runs.
    fn check_range_revision(&self, revision: Revision) -> Result<(), EtcdError> {
        if revision == 0 {
            Ok(())
        } else if revision > self.history.revision() {
            Err(EtcdError::FutureRevision)
        } else if revision < self.history.compacted {
            Err(EtcdError::Compacted)
        } else {
            Ok(())
        }
    }

    /// Runs `check` on every non-transaction operation of the taken branches.
    fn check_path(
        &self,
        txn: &TxnRequest,
        path: &Path,
        check: &mut dyn FnMut(&RequestOp) -> Result<(), EtcdError>,
    ) -> Result<(), EtcdError> {
        let mut nested = path.nested.iter();
        for op in branch(txn, path.succeeded) {
            match op {
                RequestOp::Txn(inner) => {
                    let inner_path = nested.next().expect("one path per nested txn");
                    self.check_path(inner, inner_path, check)?;
                }
                op => check(op)?,
            }
        }
        Ok(())
    }

    /// A transaction whose branches hold only ranges, answered from the
    /// state as it is, without a record: etcd serves such a transaction as a
    /// read (`isTxnReadonly`), and it changes nothing. Refusals are
    /// [`EtcdCommand::validate`]'s: call it first.
    ///
    /// Panics on a transaction with any other operation (a nested one
    /// included): that is a write, and goes through the log.
    pub fn read_txn(&self, txn: &TxnRequest) -> Result<TxnResponse, EtcdError> {
        let current = self.history.revision();
        let succeeded = txn.compare.iter().all(|compare| self.holds(compare));
        let responses = branch(txn, succeeded)
            .iter()
            .map(|op| match op {
                RequestOp::Range(range) => self.range_as_of(range, current).map(ResponseOp::Range),
                other => panic!("read_txn on a transaction that is not read-only: {other:?}"),
            })
            .collect::<Result<_, _>>()?;
        Ok(TxnResponse {
            header_revision: current,
            succeeded,
            responses,
        })
    }

    /// Evaluates every compare the transaction reaches, against the state now.
    pub(super) fn plan(&self, txn: &TxnRequest) -> Path {
        let succeeded = txn.compare.iter().all(|compare| self.holds(compare));
        let nested = branch(txn, succeeded)
            .iter()
            .filter_map(|op| match op {
                RequestOp::Txn(inner) => Some(self.plan(inner)),
                _ => None,
            })
            .collect();
        Path { succeeded, nested }
    }

    /// Whether `compare` holds for every key in its range; an empty range
    /// compares as an absent key (every field 0, and a value compare fails).
    fn holds(&self, compare: &Compare) -> bool {
        let mut keys = self
            .entries_in(&compare.key, &compare.range_end)
            .into_iter()
            .flatten()
            .peekable();
        if keys.peek().is_none() {
            return !matches!(compare.target, CompareTarget::Value(_))
                && compare_entry(compare, None);
        }
        keys.all(|(_, entry)| compare_entry(compare, Some(entry)))
    }

    fn execute_txn(&mut self, write: &mut Write, txn: &TxnRequest, path: &Path) -> TxnResponse {
        let mut nested = path.nested.iter();
        let mut responses = Vec::new();
        for op in branch(txn, path.succeeded) {
            let response = match op {
                RequestOp::Range(range) => {
                    // Checked before anything ran, as etcd does.
                    let answer = self.range_as_of(range, write.read_revision());
                    ResponseOp::Range(answer.unwrap_or_default())
                }
                RequestOp::Put(put) => ResponseOp::Put(self.execute_put(write, put)),
                RequestOp::DeleteRange(delete) => {
                    ResponseOp::DeleteRange(self.execute_delete(write, delete))
                }
                RequestOp::Txn(inner) => {
                    let inner_path = nested.next().expect("one path per nested txn");
                    // etcd leaves a nested transaction's header revision 0.
                    ResponseOp::Txn(self.execute_txn(write, inner, inner_path))
                }
            };
            responses.push(response);
        }
        TxnResponse {
            header_revision: 0,
            succeeded: path.succeeded,
            responses,
        }
    }

    fn execute_put(&mut self, write: &mut Write, put: &PutRequest) -> PutResponse {
        let before = self.entries.get(&put.key).cloned();
        // A key deleted earlier in the same transaction (a from-key delete,
        // which etcd's duplicate check lets through) keeps nothing: etcd
        // would stop there; this machine writes the empty value, lease 0.
        let value = match (&before, put.ignore_value) {
            (Some(entry), true) => entry.value.clone(),
            (None, true) => Bytes::new(),
            (_, false) => put.value.clone(),
        };
        let lease = match (&before, put.ignore_lease) {
            (Some(entry), true) => entry.lease,
            (None, true) => 0,
            (_, false) => put.lease,
        };
        self.put_key(write, &put.key, value, lease);
        PutResponse {
            header_revision: write.revision,
            prev_kv: before
                .filter(|_| put.prev_kv)
                .map(|entry| entry.key_value(&put.key)),
        }
    }

    fn execute_delete(
        &mut self,
        write: &mut Write,
        delete: &DeleteRangeRequest,
    ) -> DeleteRangeResponse {
        let keys: Vec<Bytes> = self
            .entries_in(&delete.key, &delete.range_end)
            .into_iter()
            .flatten()
            .map(|(key, _)| key.clone())
            .collect();
        let mut prev_kvs = Vec::new();
        for key in &keys {
            let before = self.delete_key(write, key).expect("a listed key exists");
            if delete.prev_kv {
                prev_kvs.push(before.key_value(key));
            }
        }
        DeleteRangeResponse {
            // etcd's `txn.Rev()`: the revision being written once anything in
            // the transaction changed (an earlier operation included), even
            // when this delete found nothing.
            header_revision: write.read_revision(),
            deleted: keys.len() as i64,
            prev_kvs,
        }
    }

    /// Starts the write of record `index`, at the next revision.
    pub(super) fn begin_write(&self, index: RecordIndex) -> Write {
        Write {
            index,
            revision: self.history.revision() + 1,
            changed: false,
        }
    }

    /// Ends a write: the store revision moves only if it changed something.
    pub(super) fn finish_write(&mut self, write: Write) {
        if write.changed {
            self.history.revision = write.revision;
            self.history.keep_within(super::mvcc::HISTORY_BUDGET_BYTES);
        }
    }

    /// Sets `key` within `write`; returns its entry before.
    pub(super) fn put_key(
        &mut self,
        write: &mut Write,
        key: &Bytes,
        value: Bytes,
        lease: i64,
    ) -> Option<Entry> {
        let mut entry = Entry {
            value,
            index: write.index,
            create_revision: write.revision,
            mod_revision: write.revision,
            version: 1,
            lease,
        };
        // One search of the map for a key that exists (most puts), two for
        // a new one.
        let before = match self.entries.get_mut(key) {
            Some(slot) => {
                entry.create_revision = slot.create_revision;
                entry.version = slot.version + 1;
                Some(std::mem::replace(slot, entry.clone()))
            }
            None => {
                self.entries.insert(key.clone(), entry.clone());
                None
            }
        };
        if let Some(before) = before.as_ref().filter(|before| before.lease != lease) {
            self.leases.detach(key, before.lease);
        }
        self.size_bytes -= before.as_ref().map_or(0, |b| key.len() + b.value.len());
        self.size_bytes += key.len() + entry.value.len();
        self.leases.attach(key, lease);
        self.record(write, key, before.clone(), Some(entry));
        before
    }

    /// Removes `key` within `write`; returns its entry before (`None`:
    /// absent, nothing changed).
    pub(super) fn delete_key(&mut self, write: &mut Write, key: &Bytes) -> Option<Entry> {
        let before = self.entries.remove(key)?;
        self.leases.detach(key, before.lease);
        self.size_bytes -= key.len() + before.value.len();
        self.record(write, key, Some(before.clone()), None);
        Some(before)
    }

    fn record(
        &mut self,
        write: &mut Write,
        key: &Bytes,
        before: Option<Entry>,
        after: Option<Entry>,
    ) {
        write.changed = true;
        let change = Change {
            key: key.clone(),
            before,
            after,
        };
        self.history.record(write.revision, change);
    }
}

impl EtcdCommand {
    /// Checks a request the way etcd does before proposing it (an empty
    /// key, too many operations for `max_txn_ops`, a duplicate key, the
    /// ignore flags) and against the state where etcd checks before
    /// applying (a missing key for the ignore flags, an unknown lease, a
    /// grant's TTL and id, the revisions a compaction or a range inside a
    /// transaction names). `Err`: nothing is to be appended.
    pub fn validate(&self, state: &KvState, max_txn_ops: usize) -> Result<(), EtcdError> {
        self.check_request(i64::try_from(max_txn_ops).unwrap_or(i64::MAX))?;
        state.check_state(self)
    }

    /// The checks that need no state (etcd's `v3rpc/key.go`).
    fn check_request(&self, max_txn_ops: i64) -> Result<(), EtcdError> {
        match self {
            EtcdCommand::Put(put) => check_put(put),
            EtcdCommand::DeleteRange(delete) => check_key(&delete.key),
            EtcdCommand::Txn(txn) => {
                if super::etcd_codec::txn_depth(txn) > super::MAX_TXN_DEPTH {
                    return Err(EtcdError::TooManyOps);
                }
                check_txn(txn, max_txn_ops)?;
                check_intervals(&txn.success)?;
                check_intervals(&txn.failure)?;
                Ok(())
            }
            EtcdCommand::Compact(_)
            | EtcdCommand::LeaseGrant(_)
            | EtcdCommand::LeaseRevoke(_)
            | EtcdCommand::Alarm(_) => Ok(()),
        }
    }
}

impl EtcdCommand {
    /// The bytes etcd's space quota charges this request: a put's key and
    /// value plus [`PUT_OVERHEAD_BYTES`](super::quota::PUT_OVERHEAD_BYTES);
    /// a transaction's larger branch by its direct puts (nested
    /// transactions are not charged, as in etcd); a grant
    /// [`GRANT_OVERHEAD_BYTES`]; anything else nothing. A request that costs
    /// something is refused while NOSPACE is raised.
    pub fn quota_cost(&self) -> usize {
        let put = |put: &PutRequest| put_cost(&put.key, &put.value);
        let branch = |ops: &[RequestOp]| -> usize {
            let puts = ops.iter().filter_map(|op| match op {
                RequestOp::Put(request) => Some(put(request)),
                _ => None,
            });
            puts.sum()
        };
        match self {
            EtcdCommand::Put(request) => put(request),
            EtcdCommand::Txn(txn) => branch(&txn.success).max(branch(&txn.failure)),
            EtcdCommand::LeaseGrant(_) => GRANT_OVERHEAD_BYTES,
            EtcdCommand::DeleteRange(_)
            | EtcdCommand::Compact(_)
            | EtcdCommand::LeaseRevoke(_)
            | EtcdCommand::Alarm(_) => 0,
        }
    }
}

fn check_key(key: &Bytes) -> Result<(), EtcdError> {
    if key.is_empty() {
        return Err(EtcdError::EmptyKey);
    }
    Ok(())
}

fn check_put(put: &PutRequest) -> Result<(), EtcdError> {
    check_key(&put.key)?;
    if put.ignore_value && !put.value.is_empty() {
        return Err(EtcdError::ValueProvided);
    }
    if put.ignore_lease && put.lease != 0 {
        return Err(EtcdError::LeaseProvided);
    }
    Ok(())
}

/// etcd's `checkTxnRequest`: the largest of the compare and branch counts
/// within the limit, which nested transactions inherit reduced by it.
fn check_txn(txn: &TxnRequest, max_txn_ops: i64) -> Result<(), EtcdError> {
    let ops = txn
        .compare
        .len()
        .max(txn.success.len())
        .max(txn.failure.len()) as i64;
    if ops > max_txn_ops {
        return Err(EtcdError::TooManyOps);
    }
    for compare in &txn.compare {
        check_key(&compare.key)?;
    }
    for op in txn.success.iter().chain(&txn.failure) {
        match op {
            RequestOp::Range(range) => check_key(&range.key)?,
            RequestOp::Put(put) => check_put(put)?,
            RequestOp::DeleteRange(delete) => check_key(&delete.key)?,
            RequestOp::Txn(inner) => check_txn(inner, max_txn_ops - ops)?,
        }
    }
    Ok(())
}

/// A delete's interval as etcd's duplicate check sees it: `[key, end)`,
/// where `end` is the key itself plus `\0` for a single key. A from-key
/// end `"\0"` is taken literally, so it contains no key: etcd lets a
/// from-key delete and a put of a key in its range share a transaction.
#[derive(Clone)]
struct Interval {
    start: Bytes,
    end: Bytes,
}

impl Interval {
    fn of(delete: &DeleteRangeRequest) -> Interval {
        let end = if delete.range_end.is_empty() {
            let mut end = delete.key.to_vec();
            end.push(0);
            Bytes::from(end)
        } else {
            delete.range_end.clone()
        };
        Interval {
            start: delete.key.clone(),
            end,
        }
    }

    fn contains(&self, key: &Bytes) -> bool {
        self.start <= *key && *key < self.end
    }
}

/// etcd's `checkIntervals`: no key put twice and no key both put and
/// deleted, across one branch and the branches of its nested transactions.
fn check_intervals(ops: &[RequestOp]) -> Result<(HashSet<Bytes>, Vec<Interval>), EtcdError> {
    let mut deletes: Vec<Interval> = ops
        .iter()
        .filter_map(|op| match op {
            RequestOp::DeleteRange(delete) => Some(Interval::of(delete)),
            _ => None,
        })
        .collect();
    let deleted = |deletes: &[Interval], key: &Bytes| deletes.iter().any(|d| d.contains(key));
    let mut puts = HashSet::new();
    for op in ops {
        let RequestOp::Txn(inner) = op else { continue };
        let (puts_then, deletes_then) = check_intervals(&inner.success)?;
        let (puts_else, deletes_else) = check_intervals(&inner.failure)?;
        for key in &puts_then {
            if puts.contains(key) || deleted(&deletes, key) {
                return Err(EtcdError::DuplicateKey);
            }
            puts.insert(key.clone());
        }
        for key in &puts_else {
            let twice = puts.contains(key) && !puts_then.contains(key);
            if twice || deleted(&deletes, key) {
                return Err(EtcdError::DuplicateKey);
            }
            puts.insert(key.clone());
        }
        deletes.extend(deletes_then);
        deletes.extend(deletes_else);
    }
    for op in ops {
        let RequestOp::Put(put) = op else { continue };
        if puts.contains(&put.key) || deleted(&deletes, &put.key) {
            return Err(EtcdError::DuplicateKey);
        }
        puts.insert(put.key.clone());
    }
    Ok((puts, deletes))
}

/// etcd's `isTxnReadonly`: only ranges in both branches (nested
/// transactions count as writes).
fn is_read_only(txn: &TxnRequest) -> bool {
    txn.success
        .iter()
        .chain(&txn.failure)
        .all(|op| matches!(op, RequestOp::Range(_)))
}

fn branch(txn: &TxnRequest, succeeded: bool) -> &[RequestOp] {
    if succeeded {
        &txn.success
    } else {
        &txn.failure
    }
}

fn compare_entry(compare: &Compare, entry: Option<&Entry>) -> bool {
    let number = |field: fn(&Entry) -> i64| entry.map_or(0, field);
    let ordering = match &compare.target {
        CompareTarget::Value(value) => entry
            .map_or(&[][..], |entry| &entry.value[..])
            .cmp(&value[..]),
        CompareTarget::Version(version) => number(|entry| entry.version).cmp(version),
        CompareTarget::Create(revision) => number(|entry| entry.create_revision).cmp(revision),
        CompareTarget::Mod(revision) => number(|entry| entry.mod_revision).cmp(revision),
        CompareTarget::Lease(lease) => number(|entry| entry.lease).cmp(lease),
    };
    match compare.result {
        CompareResult::Equal => ordering == Ordering::Equal,
        CompareResult::NotEqual => ordering != Ordering::Equal,
        CompareResult::Greater => ordering == Ordering::Greater,
        CompareResult::Less => ordering == Ordering::Less,
    }
}

fn has_revision_filters(request: &RangeRequest) -> bool {
    request.min_mod_revision != 0
        || request.max_mod_revision != 0
        || request.min_create_revision != 0
        || request.max_create_revision != 0
}

/// How many keys etcd reads before filtering and sorting: all of them when
/// it sorts or filters, else one more than the limit (to answer `more`).
fn fetch_limit(request: &RangeRequest) -> usize {
    if request.sort_order != SortOrder::None || has_revision_filters(request) || request.limit <= 0
    {
        return 0;
    }
    usize::try_from(request.limit)
        .unwrap_or(usize::MAX)
        .saturating_add(1)
}

/// The min/max mod and create revision filters (0: no bound), applied
/// after the range is read, as etcd does: `count` is before them.
fn retain_revision_filters(kvs: &mut Vec<KeyValue>, request: &RangeRequest) {
    let bound = |limit: Revision| (limit != 0).then_some(limit);
    let (max_mod, min_mod) = (
        bound(request.max_mod_revision),
        bound(request.min_mod_revision),
    );
    let (max_create, min_create) = (
        bound(request.max_create_revision),
        bound(request.min_create_revision),
    );
    kvs.retain(|kv| {
        max_mod.is_none_or(|max| kv.mod_revision <= max)
            && min_mod.is_none_or(|min| kv.mod_revision >= min)
            && max_create.is_none_or(|max| kv.create_revision <= max)
            && min_create.is_none_or(|min| kv.create_revision >= min)
    });
}

/// etcd's sort: a non-key target with no order sorts ascending; key order
/// (what the range read gives) needs no sorting.
fn sort(kvs: &mut [KeyValue], request: &RangeRequest) {
    let order = match (request.sort_target, request.sort_order) {
        (target, SortOrder::None) if target != SortTarget::Key => SortOrder::Ascend,
        (_, order) => order,
    };
    let by: fn(&KeyValue, &KeyValue) -> Ordering = match request.sort_target {
        SortTarget::Key => |a, b| a.key.cmp(&b.key),
        SortTarget::Version => |a, b| a.version.cmp(&b.version),
        SortTarget::Create => |a, b| a.create_revision.cmp(&b.create_revision),
        SortTarget::Mod => |a, b| a.mod_revision.cmp(&b.mod_revision),
        SortTarget::Value => |a, b| a.value.cmp(&b.value),
    };
    match order {
        SortOrder::None => {}
        SortOrder::Ascend => kvs.sort_by(by),
        SortOrder::Descend => kvs.sort_by(|a, b| by(b, a)),
    }
}
