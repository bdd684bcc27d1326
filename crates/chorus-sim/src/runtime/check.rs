//! The checkers that run after every step: R1 (agreement), R2
//! (acknowledgements), R3 and R4 (current reads), R6 (snapshots), R8 (only a
//! shutdown stops a runtime), R9 (exactly-once), with the lease phase's L2 and S1–S3 and the
//! log phases' register checkers; R5 is in `fencing.rs`, R10 in
//! `revisions.rs`, R11 and R12 in `mvcc.rs`, R13 in `etcd_model.rs` (fed
//! from here). They compare
//! what the processes applied and answer with what the workload was told.

use bytes::Bytes;
use chorus::ids::RecordIndex;
use chorus::kv::idempotency::Lookup;
use chorus::kv::{Applied, Command, EtcdError, IdempotencyKey, KvState, Operation, Outcome};
use chorus::lease::HolderId;
use chorus::runtime::{RuntimeError, WriteError, Written};
use futures::FutureExt;

use super::etcd::ETCD_PREFIX;
use super::etcd_model::Known;
use super::workload::{
    COUNTER, WriteKind, counter_value, is_etcd, keyed_digest, put_value, record_label, stamp_key,
};
use super::{PendingWrite, Process, RuntimePhase};
use crate::model::Violation;
use crate::trace::label;
use crate::world::raw_bytes;

/// How often a current read's whole state is checked (R4).
const FULL_CHECK_EVERY_STEPS: u64 = 16;

/// What is known of a put.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PutState {
    /// Its write has not ended.
    Pending,
    /// Acknowledged at this index.
    Acked(u64),
    /// Failed with `may_have_committed`.
    Ambiguous,
    /// Refused, or failed without committing: it must never be applied.
    NotCommitted,
}

/// An exactly-once operation (R9): the put every attempt carries, and
/// the index where it applied once known.
#[derive(Debug, Clone)]
pub(super) struct KeyedOp {
    /// The key it puts, which no other operation writes.
    pub(super) target: Bytes,
    /// The value it puts.
    pub(super) value: Bytes,
    /// The index of its key's first (and only) application.
    pub(super) first: Option<u64>,
}

impl KeyedOp {
    /// An attempt of it with `key`: the same put every time.
    pub(super) fn attempt(&self, key: &IdempotencyKey) -> WriteKind {
        WriteKind::Keyed {
            key: key.clone(),
            target: self.target.clone(),
            value: self.value.clone(),
        }
    }
}

impl RuntimePhase<'_> {
    /// Collects what happened and runs every checker.
    pub(super) fn observe(&mut self) -> Result<(), Violation> {
        self.poll_writes()?;
        self.poll_processes()?;
        self.check_states()?;
        self.replay_etcd_model()?;
        self.check_landed()?;
        self.lease_checker
            .check(&self.control.raw, self.control.take_dirty())?;
        self.check_head_payload()?;
        self.register_checker.refresh(&self.world)?;
        let manifest = self.register_checker.check_register(&self.world)?;
        if manifest.trunc.0 > self.floor {
            self.floor = manifest.trunc.0;
            self.stats.floor_raises += 1;
            self.event(format!("runtime log floor {}", self.floor));
        }
        self.check_reads()?;
        if let Some(panic) = crate::runner::take_panics().first() {
            return Err(format!("panic in the system under test: {panic}"));
        }
        Ok(())
    }

    fn poll_writes(&mut self) -> Result<(), Violation> {
        for mut write in std::mem::take(&mut self.writes) {
            match (&mut write.handle).now_or_never() {
                None => self.writes.push(write),
                Some(Ok((record, result))) => self.on_write(&write, record, result)?,
                Some(Err(error)) => return Err(format!("write task W{}: {error}", write.id)),
            }
        }
        Ok(())
    }

    /// R2, R9 and the bookkeeping for R1, R4 and the final check.
    fn on_write(
        &mut self,
        write: &PendingWrite,
        record: Option<Bytes>,
        result: Result<Written<Applied>, WriteError<Applied>>,
    ) -> Result<(), Violation> {
        let written = match result {
            Ok(written) => written,
            Err(WriteError::Rejected(refused)) => return self.on_refused(write, refused),
            Err(error) => return self.on_failed(write, &error),
        };
        let (id, node) = (write.id, write.node);
        let index = written.index.0;
        let record = record.ok_or(format!("W{id} acknowledged with no record prepared"))?;
        let zombie = self.lease_holder().as_ref() != Some(&write.holder);
        self.stats.acked += 1;
        self.stats.zombie_acks += u64::from(zombie);
        self.event(format!(
            "runtime W{id} n{node} acked i{index} {} {:?}{}",
            record_label(&record),
            written.output,
            if zombie {
                " (not the lease holder)"
            } else {
                ""
            }
        ));
        if let Some(other) = self.acked.insert(index, record.clone()) {
            return Err(format!(
                "two writes acknowledged at index {index}: {} and W{id}'s {}",
                record_label(&other),
                record_label(&record)
            ));
        }
        if let Some(applied) = self.applied.get(&index)
            && *applied != record
        {
            return Err(format!(
                "W{id} acknowledged {} at index {index}, where {} was applied",
                record_label(&record),
                record_label(applied)
            ));
        }
        self.on_acked_output(write, index, &record, &written.output)
    }

    /// R2 and R9 for what an acknowledged write's record applied as.
    fn on_acked_output(
        &mut self,
        write: &PendingWrite,
        index: u64,
        record: &Bytes,
        output: &Applied,
    ) -> Result<(), Violation> {
        let id = write.id;
        match (&write.kind, output) {
            (WriteKind::Put { key, .. }, Applied::Done { .. }) => {
                self.puts.insert(key.clone(), PutState::Acked(index));
            }
            (WriteKind::Put { .. }, output) => {
                return Err(format!(
                    "W{id}, the only put of its key, acknowledged at index {index} applied as \
                     {output:?}"
                ));
            }
            (WriteKind::Increment, Applied::Done { .. }) => {
                let value = put_value(record)
                    .and_then(|value| counter_value(&value))
                    .ok_or(format!("W{id}: an increment record that does not decode"))?;
                if let Some(other) = self.acked_increments.insert(value, index) {
                    return Err(format!(
                        "lost update: increments acknowledged at indices {other} and {index} \
                         both set the counter to {value}"
                    ));
                }
            }
            (WriteKind::Increment, Applied::ConditionFailed { .. }) => self.stats.cas_lost += 1,
            (WriteKind::Keyed { key, .. }, Applied::Done { .. }) => {
                let what = format!("W{id}'s acknowledgement");
                self.note_keyed_first(key, index, &what)?;
            }
            (
                WriteKind::Keyed { key, .. },
                Applied::Duplicate {
                    original,
                    outcome: Outcome::Done { .. },
                },
            ) if original.0 < index => {
                self.stats.keyed_duplicates += 1;
                self.on_keyed_answer(write, key, original.0)?;
            }
            (WriteKind::Etcd { .. }, Applied::Etcd(Ok(_))) => {
                self.stats.etcd_acked += 1;
                self.answers.on_acked(index, output)?;
            }
            // Checked against the state before appending, but a compaction
            // that applied in between can leave the revision it names (or a
            // range inside it reads at) compacted: etcd refuses it then too.
            (WriteKind::Etcd { .. }, Applied::Etcd(Err(EtcdError::Compacted))) => {
                self.stats.etcd_compacted += 1;
                self.answers.on_acked(index, output)?;
            }
            (_, output) => {
                return Err(format!(
                    "W{id} acknowledged at {index} applied as {output:?}"
                ));
            }
        }
        Ok(())
    }

    /// A write its prepare refused: only a keyed attempt whose key the
    /// table remembers for this same put (R9); the workload builds every
    /// other write to hold against the applied state.
    fn on_refused(&mut self, write: &PendingWrite, refused: Applied) -> Result<(), Violation> {
        let (id, node) = (write.id, write.node);
        if let (
            WriteKind::Keyed { key, .. },
            Applied::Duplicate {
                original,
                outcome: Outcome::Done { .. },
            },
        ) = (&write.kind, &refused)
        {
            self.event(format!(
                "runtime W{id} n{node} key={key} answered from the table: applied at {original}"
            ));
            self.stats.keyed_replayed += 1;
            return self.on_keyed_answer(write, key, original.0);
        }
        Err(format!(
            "W{id} on n{node}: prepare refused a write the workload built to hold against the \
             applied state: {refused:?}"
        ))
    }

    /// A retry answered with its key's first application at `original`
    /// (R9); counted when the answering process has that application only
    /// through a snapshot it restored.
    fn on_keyed_answer(
        &mut self,
        write: &PendingWrite,
        key: &IdempotencyKey,
        original: u64,
    ) -> Result<(), Violation> {
        let what = format!("the answer to W{}", write.id);
        self.note_keyed_first(key, original, &what)?;
        let restored = write
            .runtime
            .changes_since(RecordIndex(original), 1)
            .is_err();
        self.stats.keyed_restored += u64::from(restored);
        Ok(())
    }

    /// A write that failed: R1's bookkeeping of what may have committed.
    fn on_failed(
        &mut self,
        write: &PendingWrite,
        error: &WriteError<Applied>,
    ) -> Result<(), Violation> {
        let (id, node) = (write.id, write.node);
        let (may, text) = match error {
            WriteError::Rejected(_) => unreachable!("refusals are handled by on_refused"),
            WriteError::Unavailable(unavailable) => (false, unavailable.to_string()),
            WriteError::Log(error) => (error.may_have_committed(), error.to_string()),
        };
        self.event(format!("runtime W{id} n{node} failed may={may}: {text}"));
        match &write.kind {
            WriteKind::Put { key, .. } => {
                let state = if may {
                    PutState::Ambiguous
                } else {
                    PutState::NotCommitted
                };
                if !may && let Some(index) = self.put_index.get(key) {
                    return Err(format!(
                        "W{id} failed without committing (may_have_committed = false) but was \
                         applied at index {index}"
                    ));
                }
                self.puts.insert(key.clone(), state);
            }
            WriteKind::Increment => self.ambiguous_increments += u64::from(may),
            // Whether it applied, R9 learns from the processes' histories;
            // an etcd write's record is checked wherever it applied (R11).
            WriteKind::Keyed { .. } | WriteKind::Etcd { .. } => {}
        }
        if may {
            self.stats.ambiguous += 1;
        } else {
            self.stats.not_committed += 1;
        }
        Ok(())
    }

    /// R9: `key`'s put applied at `index`, as `what` says; it must be the
    /// one index it ever applied at.
    pub(super) fn note_keyed_first(
        &mut self,
        key: &IdempotencyKey,
        index: u64,
        what: &str,
    ) -> Result<(), Violation> {
        let op = self.keyed.get_mut(key).ok_or(format!(
            "{what} names idempotency key {key}, which no write used"
        ))?;
        match op.first {
            None => {
                op.first = Some(index);
                Ok(())
            }
            Some(first) if first == index => Ok(()),
            Some(first) => Err(format!(
                "exactly-once: idempotency key {key} applied at index {first}, but {what} has it \
                 applied at index {index}: a retry applied twice"
            )),
        }
    }

    /// Roles, finished shutdowns and every process's history (R1); a process
    /// that stops otherwise breaks R8.
    fn poll_processes(&mut self) -> Result<(), Violation> {
        for node in 0..self.nodes.len() {
            let Some(mut process) = self.nodes[node].process.take() else {
                continue;
            };
            self.poll_history(node, &mut process)?;
            let role = process.runtime.status().role;
            if role != process.role {
                self.event(format!("runtime n{node} {} is {role}", process.holder));
                process.role = role;
            }
            let finished = process.runtime.finished().now_or_never();
            match finished {
                Some(outcome) => {
                    let asked = process.shutdown.is_some();
                    self.on_stopped(node, &process.holder, asked, outcome)?;
                    self.nodes[node].restartable = Some(process.holder.clone());
                    self.retire(node, process);
                }
                None => self.nodes[node].process = Some(process),
            }
        }
        let mut retired = std::mem::take(&mut self.retired);
        for (node, process) in &mut retired {
            self.poll_history(*node, process)?;
        }
        self.retired = retired;
        Ok(())
    }

    /// R8, a runtime stops only when asked to: every fault this phase injects
    /// passes (reads corrupted in transit, not stored bytes; outages and
    /// partitions that end; no lease term is ever bumped; the settings are
    /// valid), so a boot step that fails must be retried, not end the
    /// process. Nothing here is beyond retrying, so any error is a
    /// violation, even one the runtime classes as final.
    pub(super) fn on_stopped(
        &mut self,
        node: usize,
        holder: &HolderId,
        asked: bool,
        outcome: Result<(), RuntimeError>,
    ) -> Result<(), Violation> {
        match (outcome, asked) {
            (Ok(()), true) => {
                self.event(format!("runtime n{node} {holder} shut down"));
                Ok(())
            }
            (Ok(()), false) => Err(format!(
                "n{node} {holder} stopped with no error and no shutdown asked for"
            )),
            (Err(error), _) => Err(format!(
                "n{node} {holder} stopped with an error (transient = {}) where every fault \
                 passes, so it should have retried: {error}",
                error.transient
            )),
        }
    }

    fn poll_history(&mut self, node: usize, process: &mut Process) -> Result<(), Violation> {
        loop {
            match process.runtime.changes_since(process.seen, usize::MAX) {
                Ok(changes) => {
                    for change in &changes {
                        self.on_applied(node, change.index.0, &change.record, &change.output)?;
                        self.revisions.on_applied(node, change)?;
                        self.answers.on_applied(node, change)?;
                    }
                    if let Some(last) = changes.last() {
                        process.seen = RecordIndex(last.index.0 + 1);
                    }
                    return Ok(());
                }
                // Restored from a snapshot meanwhile: what lies below came
                // through the snapshot (R6 checks HEAD's payloads).
                Err(gap) => process.seen = gap.oldest,
            }
        }
    }

    /// R1 and R9 for one record `node` applied as `output`.
    pub(super) fn on_applied(
        &mut self,
        node: usize,
        index: u64,
        record: &Bytes,
        output: &Applied,
    ) -> Result<(), Violation> {
        self.check_agreement(node, index, record)?;
        match stamp_key(record) {
            Some(key) => self.on_keyed_applied(node, index, &key, output),
            None => Ok(()),
        }
    }

    /// R9: every process applies a keyed record as its key's one first
    /// application, or as a no-op naming it.
    fn on_keyed_applied(
        &mut self,
        node: usize,
        index: u64,
        key: &IdempotencyKey,
        output: &Applied,
    ) -> Result<(), Violation> {
        let what = format!("n{node}'s apply of index {index} ({output:?})");
        match output {
            Applied::Done { .. } => self.note_keyed_first(key, index, &what),
            Applied::Duplicate {
                original,
                outcome: Outcome::Done { .. },
            } if original.0 < index => self.note_keyed_first(key, original.0, &what),
            _ => Err(format!(
                "exactly-once: n{node} applied the record at index {index} with idempotency key \
                 {key} as {output:?}, neither its put nor a no-op naming an earlier index"
            )),
        }
    }

    /// R1 for one applied record: the same record everywhere at its index,
    /// and, the first time it is seen, a put applied at one index only.
    fn check_agreement(
        &mut self,
        node: usize,
        index: u64,
        record: &Bytes,
    ) -> Result<(), Violation> {
        if let Some(acked) = self.acked.get(&index)
            && acked != record
        {
            return Err(format!(
                "n{node} applied {} at index {index}, where {} was acknowledged",
                record_label(record),
                record_label(acked)
            ));
        }
        if let Some(applied) = self.applied.get(&index) {
            if applied != record {
                return Err(format!(
                    "n{node} applied {} at index {index}, another process applied {} there",
                    record_label(record),
                    record_label(applied)
                ));
            }
            return Ok(());
        }
        self.applied.insert(index, record.clone());
        if stamp_key(record).is_some() || is_etcd(record) {
            // A keyed put: R9 checks it, for every process; an etcd
            // request: R11 does.
            return Ok(());
        }
        let command = Command::decode(record)
            .map_err(|error| format!("n{node} applied a record that is not a command: {error}"))?;
        let Some(Operation::Put { key, .. }) = command.operations().first() else {
            return Err(format!("n{node} applied {command:?}, which no write made"));
        };
        if key.as_ref() == COUNTER {
            return Ok(());
        }
        if let Some(other) = self.put_index.insert(key.clone(), index) {
            return Err(format!(
                "the put of {key:?} was applied at indices {other} and {index}"
            ));
        }
        match self.puts.get(key) {
            Some(PutState::NotCommitted) => Err(format!(
                "n{node} applied the put of {key:?} at index {index}, whose write failed \
                 without committing (may_have_committed = false)"
            )),
            Some(PutState::Acked(acked)) if *acked != index => Err(format!(
                "n{node} applied the put of {key:?} at index {index}, acknowledged at {acked}"
            )),
            Some(_) => Ok(()),
            None => Err(format!(
                "n{node} applied a put of {key:?}, which no write made"
            )),
        }
    }

    /// R6: a new HEAD's payload is the state at its `wal_index`.
    fn check_head_payload(&mut self) -> Result<(), Violation> {
        let Some(head) = self.lease_checker.head().cloned() else {
            return Ok(());
        };
        let key = head.snapshot_key();
        if self.checked_payload.as_ref() == Some(&key) {
            return Ok(());
        }
        self.checked_payload = Some(key.clone());
        let bytes = raw_bytes(&self.control.raw, &key)?
            .ok_or(format!("HEAD names {key}, which is missing"))?;
        let state = KvState::decode_snapshot(&bytes)
            .map_err(|error| format!("HEAD's payload {key} does not restore: {error}"))?;
        self.digests.check(&state, &format!("snapshot {key}"))?;
        if state.applied_end() != head.wal_index {
            return Err(format!(
                "HEAD's payload {key} reflects records below {}, HEAD says {}",
                state.applied_end(),
                head.wal_index
            ));
        }
        self.check_state(&state, head.wal_index.0, &format!("snapshot {key}"))
    }

    /// R12 on every process (retired ones too) whose applied end moved
    /// since its state was last checked.
    fn check_states(&mut self) -> Result<(), Violation> {
        let live = self.nodes.iter_mut().enumerate();
        let live = live.filter_map(|(node, slot)| Some((node, slot.process.as_mut()?)));
        let retired = self
            .retired
            .iter_mut()
            .map(|(node, process)| (*node, process));
        for (node, process) in live.chain(retired) {
            let last = process.digested;
            let ((end, state), _) = process.runtime.read_stale(|state| {
                let end = state.applied_end();
                (end, (Some(end) != last).then(|| state.clone()))
            });
            let Some(state) = state else {
                continue;
            };
            process.digested = Some(end);
            let what = format!("n{node} {}", process.holder);
            self.digests.check(&state, &what)?;
        }
        Ok(())
    }

    /// R13: the etcd model replays every record known so far, up to the
    /// first index whose record or revisions no process reported yet.
    fn replay_etcd_model(&mut self) -> Result<(), Violation> {
        let (applied, revisions, answers) = (&self.applied, &self.revisions, &self.answers);
        self.etcd_model.advance(|index| {
            // The store revision starts at 1.
            let before = match index.checked_sub(1) {
                None => 1,
                Some(previous) => revisions.after(previous)?,
            };
            Some(Known {
                record: applied.get(&index)?,
                before,
                after: revisions.after(index)?,
                answer: answers.get(index),
            })
        })
    }

    /// R3 and R4.
    fn check_reads(&mut self) -> Result<(), Violation> {
        let full = self.step.is_multiple_of(FULL_CHECK_EVERY_STEPS);
        let mut serving = Vec::new();
        for node in 0..self.nodes.len() {
            let Some(process) = &self.nodes[node].process else {
                continue;
            };
            let answer = process.runtime.read(|state| {
                let copy = full.then(|| state.clone());
                (copy, state.get(COUNTER).map(|entry| entry.value.clone()))
            });
            if let Ok(((copy, counter), end)) = answer {
                serving.push((node, process.holder.clone(), copy, counter, end.0));
            }
        }
        self.stats.current_reads += serving.len() as u64;
        if !self.clocks_agree() {
            return Ok(());
        }
        if serving.len() > 1 {
            let who: Vec<String> = serving
                .iter()
                .map(|(node, holder, ..)| format!("n{node} {holder}"))
                .collect();
            return Err(format!(
                "exclusivity: {} processes answer current reads at once with clocks within \
                 the safety margin: {}",
                serving.len(),
                who.join(", ")
            ));
        }
        let Some((node, holder, copy, counter, end)) = serving.pop() else {
            return Ok(());
        };
        let what = format!("the current read of n{node} {holder}");
        if let Some((&index, _)) = self.acked.last_key_value()
            && end <= index
        {
            return Err(format!(
                "{what} reflects records below {end}, but index {index} was acknowledged"
            ));
        }
        if let Some((&value, &index)) = self.acked_increments.last_key_value() {
            let counter = counter.as_ref().and_then(counter_value);
            if counter.is_none_or(|counter| counter < value) {
                return Err(format!(
                    "{what} has the counter at {counter:?}, but an increment to {value} was \
                     acknowledged at index {index}"
                ));
            }
        }
        match copy {
            Some(state) => self.check_state(&state, end, &what),
            None => Ok(()),
        }
    }

    /// `state`, which reflects every record below `end`, holds every
    /// acknowledged put below `end` at its index and no put that did not
    /// commit, every key's value is the one the record at its version set,
    /// and its counter is at least every acknowledged increment below `end`.
    pub(super) fn check_state(
        &self,
        state: &KvState,
        end: u64,
        what: &str,
    ) -> Result<(), Violation> {
        for (key, put_state) in &self.puts {
            let found = state.get(key);
            match put_state {
                PutState::Acked(index) if *index < end => {
                    let value = &self.put_values[key];
                    let holds =
                        found.is_some_and(|entry| entry.value == *value && entry.index.0 == *index);
                    if !holds {
                        return Err(format!(
                            "{what} (below {end}) lost the put of {key:?} acknowledged at index \
                             {index}: it holds {:?}",
                            found.map(|entry| (label(&entry.value), entry.index))
                        ));
                    }
                }
                PutState::NotCommitted if found.is_some() => {
                    return Err(format!(
                        "{what} holds {key:?}, whose write failed without committing"
                    ));
                }
                _ => {}
            }
        }
        let (entries, _) = state.list(b"", None, usize::MAX);
        for (key, entry) in entries {
            if entry.index.0 >= end {
                return Err(format!(
                    "{what} (below {end}) holds {key:?} at version {}",
                    entry.index
                ));
            }
            let Some(record) = self.applied.get(&entry.index.0) else {
                continue;
            };
            // An etcd key is set by an etcd request (whose effect R11
            // checks); every other key by a put of this value.
            let set_by_etcd = key.starts_with(ETCD_PREFIX) && is_etcd(record);
            if !set_by_etcd && put_value(record).as_ref() != Some(&entry.value) {
                return Err(format!(
                    "{what} holds {key:?} = {} at version {}, but the record applied there is {}",
                    label(&entry.value),
                    entry.index,
                    record_label(record)
                ));
            }
        }
        let acked_below: Vec<u64> = self
            .acked_increments
            .iter()
            .filter(|(_, index)| **index < end)
            .map(|(value, _)| *value)
            .collect();
        if let Some(&highest) = acked_below.last() {
            let counter = state
                .get(COUNTER)
                .and_then(|entry| counter_value(&entry.value));
            if counter.is_none_or(|counter| counter < highest) {
                return Err(format!(
                    "{what} (below {end}) has the counter at {counter:?}, but an increment to \
                     {highest} was acknowledged below it"
                ));
            }
        }
        self.check_keyed_state(state, end, what)
    }

    /// R9 on a state: every key applied below `end` is remembered at its
    /// first index, with its put at that version, and the table holds no
    /// key that no write used.
    fn check_keyed_state(&self, state: &KvState, end: u64, what: &str) -> Result<(), Violation> {
        for (key, op) in &self.keyed {
            let Some(first) = op.first.filter(|first| *first < end) else {
                continue;
            };
            let digest = keyed_digest(&op.target, &op.value);
            let remembered = match state.idempotency().lookup(key, &digest) {
                Lookup::Same(remembered) => Some(remembered.index.0),
                _ => None,
            };
            let entry = state.get(&op.target);
            let put = entry.map(|entry| (entry.index.0, entry.value == op.value));
            if remembered != Some(first) || put != Some((first, true)) {
                return Err(format!(
                    "exactly-once: {what} (below {end}) should remember idempotency key {key} \
                     at index {first} with its put at that version; it remembers it at \
                     {remembered:?}, and holds the put at {put:?} (version, same value)"
                ));
            }
        }
        let table = state.idempotency().len();
        if table > self.keyed.len() {
            return Err(format!(
                "{what} remembers {table} idempotency keys, but only {} were used",
                self.keyed.len()
            ));
        }
        Ok(())
    }
}
