//! The model: what the simulated application was told, and the checkers that
//! compare it with what recoveries and readers return. Pure bookkeeping, no
//! I/O; every method returns the first violated rule.
//!
//! Rules (numbers as in docs/testing.md):
//!
//! - **2, recovery content**: every successful recovery's content is dense
//!   from its truncation floor (0 until the log is truncated), never ends
//!   below that floor, agrees with every lower epoch's content where both
//!   retain records and ends no earlier; it holds every record at or above
//!   its floor acknowledged by a lower epoch with identical bytes ("never
//!   fewer"); every other record in it was admitted at that index and its
//!   append did not fail with `may_have_committed() == false` (the ambiguous
//!   ones). Records below a floor were released by the application and may
//!   go.
//! - **3, superseded acks**: an ack from epoch e observed after a recovery of
//!   epoch f > e must be for a record inside f's content (or below its floor) (a late ack of a
//!   record already on Q replicas, docs/protocol.md); anything else is an ack
//!   the fence should have prevented.
//! - **4, readers**: a record a reader returned agrees with every ack and
//!   recovery at its index, was admitted there, never fails with
//!   `may_have_committed() == false`, and is in the content of every recovery
//!   that started after the read returned (unless below its floor).
//! - **order**: per writer, admitted indices are dense from its recovery's
//!   end (refusals consume none), and acks never follow a failure.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use chorus::ids::Epoch;

use crate::trace::label;

/// Identifies one writer incarnation in the simulation.
pub type WriterId = u64;

/// A broken guarantee, described for the report.
pub type Violation = String;

/// What the application knows about one admitted record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Its completion has not resolved.
    Pending,
    /// Acknowledged.
    Acked,
    /// Failed with `may_have_committed() == true`.
    Ambiguous,
    /// Failed with `may_have_committed() == false`: must never appear.
    NotCommitted,
    /// The application dropped its completion; the outcome is unknown.
    Dropped,
}

#[derive(Debug, Clone)]
struct Candidate {
    writer: WriterId,
    bytes: Bytes,
    status: Status,
}

#[derive(Debug, Clone)]
struct WriterModel {
    epoch: Epoch,
    next_index: u64,
    first_failure: Option<u64>,
    acked: u64,
}

#[derive(Debug, Clone, Copy)]
struct RecoveredView {
    /// The truncation floor the view was committed with.
    start: u64,
    end: u64,
    started_at: Duration,
}

impl RecoveredView {
    /// The record of `content` (this view's records) at `index`.
    fn get<'a>(&self, index: u64, content: &'a [Bytes]) -> Option<&'a Bytes> {
        let offset = index.checked_sub(self.start)?;
        content.get(usize::try_from(offset).ok()?)
    }

    /// Whether this view keeps `bytes` at `index` (`log` holds every
    /// recovered record), or released it below its floor.
    fn holds(&self, index: u64, bytes: &Bytes, log: &BTreeMap<u64, Bytes>) -> bool {
        index < self.start || (index < self.end && log.get(&index) == Some(bytes))
    }
}

/// The model of one run; see the module docs.
#[derive(Debug, Default)]
pub struct Model {
    candidates: BTreeMap<u64, Vec<Candidate>>,
    writers: BTreeMap<WriterId, WriterModel>,
    acks: BTreeMap<u64, (Epoch, Bytes)>,
    /// Every record some recovery returned, by index; recoveries agree
    /// wherever two of them retain an index.
    log: BTreeMap<u64, Bytes>,
    /// One past the highest recovered index.
    log_end: u64,
    recovered: BTreeMap<Epoch, RecoveredView>,
    reads: BTreeMap<u64, (Bytes, Duration)>,
    /// Indices that became known-committed since the store checker last looked.
    fresh: BTreeSet<u64>,
}

impl Model {
    /// A writer of `epoch` whose first index will be `end`.
    pub fn writer_started(&mut self, writer: WriterId, epoch: Epoch, end: u64) {
        self.writers.insert(
            writer,
            WriterModel {
                epoch,
                next_index: end,
                first_failure: None,
                acked: 0,
            },
        );
    }

    /// `writer` admitted `bytes` at `index`.
    pub fn admitted(
        &mut self,
        writer: WriterId,
        index: u64,
        bytes: &Bytes,
    ) -> Result<(), Violation> {
        let model = self.writers.get_mut(&writer).expect("known writer");
        if index != model.next_index {
            return Err(format!(
                "order: writer {writer} (epoch {}) admitted index {index}, expected {} \
                 (indices must be dense; refusals consume none)",
                model.epoch, model.next_index
            ));
        }
        model.next_index += 1;
        self.candidates.entry(index).or_default().push(Candidate {
            writer,
            bytes: bytes.clone(),
            status: Status::Pending,
        });
        Ok(())
    }

    fn set_status(&mut self, writer: WriterId, index: u64, status: Status) {
        let candidate = self
            .candidates
            .get_mut(&index)
            .and_then(|all| all.iter_mut().find(|c| c.writer == writer))
            .expect("admitted records are known");
        candidate.status = status;
    }

    /// The application dropped the completion of `index`.
    pub fn dropped(&mut self, writer: WriterId, index: u64) {
        self.set_status(writer, index, Status::Dropped);
    }

    /// The record known committed at `index`, if any.
    pub fn committed_at(&self, index: u64) -> Option<&Bytes> {
        self.log
            .get(&index)
            .or_else(|| self.acks.get(&index).map(|(_, bytes)| bytes))
            .or_else(|| self.reads.get(&index).map(|(bytes, _)| bytes))
    }

    /// Checks that `bytes` agrees with everything known committed at `index`.
    fn agree(&self, index: u64, bytes: &Bytes, what: &str) -> Result<(), Violation> {
        let known = [
            ("recovered", self.log.get(&index)),
            ("acknowledged", self.acks.get(&index).map(|(_, b)| b)),
            ("read", self.reads.get(&index).map(|(b, _)| b)),
        ];
        for (source, existing) in known {
            if let Some(existing) = existing.filter(|existing| *existing != bytes) {
                return Err(format!(
                    "{what} at index {index} is {} but a {source} record there is {}",
                    label(bytes),
                    label(existing)
                ));
            }
        }
        Ok(())
    }

    /// Rule 3: an ack from `epoch` at `index` is inside every higher epoch's
    /// recovered content, or below its floor.
    fn check_superseded_ack(
        &self,
        epoch: Epoch,
        index: u64,
        bytes: &Bytes,
    ) -> Result<(), Violation> {
        let newer = self.recovered.range(Epoch(epoch.0 + 1)..).next();
        if let Some((newer, view)) = newer
            && !view.holds(index, bytes, &self.log)
        {
            return Err(format!(
                "superseded ack: epoch {epoch} acknowledged index {index} ({}) but epoch \
                 {newer} recovered {} records without it",
                label(bytes),
                view.end
            ));
        }
        Ok(())
    }

    /// `writer`'s append at `index` was acknowledged with `receipt`.
    pub fn acked(
        &mut self,
        writer: WriterId,
        index: u64,
        receipt: u64,
        bytes: &Bytes,
    ) -> Result<(), Violation> {
        let model = &self.writers[&writer];
        if receipt != index {
            return Err(format!(
                "order: writer {writer} admitted index {index} but its receipt says {receipt}"
            ));
        }
        if let Some(failed) = model.first_failure.filter(|failed| *failed < index) {
            return Err(format!(
                "order: writer {writer} acknowledged index {index} after index {failed} failed"
            ));
        }
        self.check_superseded_ack(model.epoch, index, bytes)?;
        self.agree(index, bytes, "acknowledged record")?;
        self.acks.insert(index, (model.epoch, bytes.clone()));
        self.writers.get_mut(&writer).expect("known writer").acked += 1;
        self.fresh.insert(index);
        self.set_status(writer, index, Status::Acked);
        Ok(())
    }

    /// `writer`'s append at `index` failed.
    pub fn failed(
        &mut self,
        writer: WriterId,
        index: u64,
        bytes: &Bytes,
        may_have_committed: bool,
    ) -> Result<(), Violation> {
        let model = self.writers.get_mut(&writer).expect("known writer");
        model.first_failure = Some(model.first_failure.map_or(index, |f| f.min(index)));
        if may_have_committed {
            self.set_status(writer, index, Status::Ambiguous);
            return Ok(());
        }
        self.set_status(writer, index, Status::NotCommitted);
        if self.committed_at(index) == Some(bytes) {
            return Err(format!(
                "ambiguity: index {index} ({}) failed without may_have_committed, yet it is \
                 committed (recovered, acknowledged or read)",
                label(bytes)
            ));
        }
        Ok(())
    }

    /// Rule 2's "admitted and not definitely failed" test for one record.
    fn check_admissible(&self, index: u64, bytes: &Bytes, what: &str) -> Result<(), Violation> {
        let candidate = self
            .candidates
            .get(&index)
            .and_then(|all| all.iter().find(|c| c.bytes == *bytes));
        match candidate {
            None => Err(format!(
                "{what} at index {index} ({}) was never admitted there",
                label(bytes)
            )),
            Some(c) if c.status == Status::NotCommitted => Err(format!(
                "{what} at index {index} ({}) failed without may_have_committed",
                label(bytes)
            )),
            Some(_) => Ok(()),
        }
    }

    /// A recovery of `epoch`, started at `started_at`, committed `content`,
    /// the records from its truncation floor `start` on.
    pub fn recovered(
        &mut self,
        epoch: Epoch,
        start: u64,
        content: &[Bytes],
        started_at: Duration,
    ) -> Result<(), Violation> {
        let end = start + content.len() as u64;
        if self.recovered.contains_key(&epoch) {
            return Err(format!("two recoveries committed epoch {epoch}"));
        }
        for (other, view) in &self.recovered {
            let ordered = if *other < epoch {
                view.end <= end
            } else {
                view.end >= end
            };
            if !ordered {
                return Err(format!(
                    "recovery of epoch {epoch} ended at {end}, but epoch {other} ended at {}",
                    view.end
                ));
            }
        }
        let view = RecoveredView {
            start,
            end,
            started_at,
        };
        self.check_agreement(epoch, &view, content)?;
        self.check_acks_kept(epoch, &view, content)?;
        self.check_reads_kept(epoch, &view, content)?;
        for (index, record) in (start..).zip(content) {
            if !self.log.contains_key(&index) {
                self.check_admissible(index, record, "recovered record")?;
                self.log.insert(index, record.clone());
                self.fresh.insert(index);
            }
        }
        self.log_end = self.log_end.max(end);
        self.recovered.insert(epoch, view);
        Ok(())
    }

    /// `content` agrees with every record an earlier recovery returned.
    fn check_agreement(
        &self,
        epoch: Epoch,
        view: &RecoveredView,
        content: &[Bytes],
    ) -> Result<(), Violation> {
        let earlier = self.log.range(view.start..view.end);
        match earlier
            .into_iter()
            .find(|(index, record)| content[(**index - view.start) as usize] != **record)
        {
            Some((index, record)) => Err(format!(
                "recovery of epoch {epoch} holds {} at index {index}, an earlier recovery {}",
                label(&content[(index - view.start) as usize]),
                label(record)
            )),
            None => Ok(()),
        }
    }

    fn check_acks_kept(
        &self,
        epoch: Epoch,
        view: &RecoveredView,
        content: &[Bytes],
    ) -> Result<(), Violation> {
        for (index, (acked_by, bytes)) in self.acks.range(view.start..) {
            if *acked_by >= epoch {
                continue;
            }
            if view.get(*index, content) != Some(bytes) {
                return Err(format!(
                    "lost ack: epoch {acked_by} acknowledged index {index} ({}) but the \
                     recovery of epoch {epoch} holds {} of {} records",
                    label(bytes),
                    view.get(*index, content)
                        .map_or("nothing".into(), |b| label(b)),
                    view.end
                ));
            }
        }
        Ok(())
    }

    fn check_reads_kept(
        &self,
        epoch: Epoch,
        view: &RecoveredView,
        content: &[Bytes],
    ) -> Result<(), Violation> {
        for (index, (bytes, read_at)) in self.reads.range(view.start..) {
            if *read_at < view.started_at && view.get(*index, content) != Some(bytes) {
                return Err(format!(
                    "reader saw index {index} ({}) but a later recovery (epoch {epoch}) \
                     does not hold it",
                    label(bytes)
                ));
            }
        }
        Ok(())
    }

    /// A reader returned `bytes` at `index`; its read finished at `read_at`.
    pub fn read(&mut self, index: u64, bytes: &Bytes, read_at: Duration) -> Result<(), Violation> {
        self.agree(index, bytes, "record a reader returned")?;
        self.check_admissible(index, bytes, "record a reader returned")?;
        for (epoch, view) in &self.recovered {
            if view.started_at > read_at && !view.holds(index, bytes, &self.log) {
                return Err(format!(
                    "reader saw index {index} ({}) but the later recovery of epoch {epoch} \
                     does not hold it",
                    label(bytes)
                ));
            }
        }
        if let std::collections::btree_map::Entry::Vacant(entry) = self.reads.entry(index) {
            entry.insert((bytes.clone(), read_at));
            self.fresh.insert(index);
        }
        Ok(())
    }

    /// Indices that became known-committed since the last call.
    pub fn take_fresh(&mut self) -> BTreeSet<u64> {
        std::mem::take(&mut self.fresh)
    }

    /// Every known-committed record at or above `from` (acks, reads and
    /// recovered records).
    pub fn committed_from(&self, from: u64) -> BTreeMap<u64, Bytes> {
        let mut all: BTreeMap<u64, Bytes> = self
            .reads
            .range(from..)
            .map(|(i, (b, _))| (*i, b.clone()))
            .collect();
        for (index, (_, bytes)) in self.acks.range(from..) {
            all.insert(*index, bytes.clone());
        }
        for (index, bytes) in self.log.range(from..) {
            all.insert(*index, bytes.clone());
        }
        all
    }

    /// Appends of `writer` acknowledged so far.
    pub fn acked_by(&self, writer: WriterId) -> u64 {
        self.writers.get(&writer).map_or(0, |model| model.acked)
    }

    /// One past the highest known-committed index.
    pub fn committed_end(&self) -> u64 {
        let acked = self.acks.keys().next_back().map_or(0, |i| i + 1);
        let read = self.reads.keys().next_back().map_or(0, |i| i + 1);
        acked.max(read).max(self.log_end)
    }

    /// One past the highest recovered index.
    pub fn log_end(&self) -> u64 {
        self.log_end
    }

    /// Acknowledged records so far.
    pub fn ack_count(&self) -> usize {
        self.acks.len()
    }

    /// The highest epoch that recovered.
    pub fn last_recovered(&self) -> Option<Epoch> {
        self.recovered.keys().next_back().copied()
    }
}

#[cfg(test)]
mod tests {
    //! The checkers catch what they claim to catch.

    use super::*;

    fn bytes(text: &str) -> Bytes {
        Bytes::copy_from_slice(text.as_bytes())
    }

    /// A writer 1 of epoch 1 from index 0 that admitted `records`.
    fn admitted(records: &[&str]) -> Model {
        let mut model = Model::default();
        model.writer_started(1, Epoch(1), 0);
        for (index, record) in records.iter().enumerate() {
            model.admitted(1, index as u64, &bytes(record)).unwrap();
        }
        model
    }

    #[test]
    fn a_recovery_missing_an_acknowledged_record_is_a_lost_ack() {
        let mut model = admitted(&["a"]);
        model.acked(1, 0, 0, &bytes("a")).unwrap();
        let error = model
            .recovered(Epoch(2), 0, &[], Duration::ZERO)
            .unwrap_err();
        assert!(error.contains("lost ack"), "{error}");
    }

    #[test]
    fn a_late_ack_must_be_inside_the_successors_content() {
        let mut model = admitted(&["a", "b"]);
        model
            .recovered(Epoch(2), 0, &[bytes("a")], Duration::ZERO)
            .unwrap();
        model.acked(1, 0, 0, &bytes("a")).unwrap();
        let error = model.acked(1, 1, 1, &bytes("b")).unwrap_err();
        assert!(error.contains("superseded ack"), "{error}");
    }

    #[test]
    fn recovered_records_were_admitted_and_not_refused() {
        let mut model = admitted(&["a"]);
        model.failed(1, 0, &bytes("a"), false).unwrap();
        let error = model
            .recovered(Epoch(2), 0, &[bytes("a")], Duration::ZERO)
            .unwrap_err();
        assert!(error.contains("without may_have_committed"), "{error}");
        let error = model
            .recovered(Epoch(2), 0, &[bytes("z")], Duration::ZERO)
            .unwrap_err();
        assert!(error.contains("never admitted"), "{error}");
    }

    #[test]
    fn recoveries_extend_each_other() {
        let mut model = admitted(&["a", "b"]);
        model
            .recovered(Epoch(2), 0, &[bytes("a"), bytes("b")], Duration::ZERO)
            .unwrap();
        let error = model
            .recovered(Epoch(3), 0, &[bytes("a")], Duration::ZERO)
            .unwrap_err();
        assert!(error.contains("ended at"), "{error}");
    }

    #[test]
    fn what_a_reader_saw_stays() {
        let mut model = admitted(&["a"]);
        model.read(0, &bytes("a"), Duration::from_secs(1)).unwrap();
        model
            .recovered(Epoch(2), 0, &[], Duration::from_secs(1) / 2)
            .expect("a recovery that started before the read need not hold it");
        let error = model
            .recovered(Epoch(3), 0, &[], Duration::from_secs(2))
            .unwrap_err();
        assert!(error.contains("reader saw"), "{error}");
    }

    #[test]
    fn indices_are_dense_and_acks_follow_no_failure() {
        let mut model = admitted(&["a", "b"]);
        let error = model.admitted(1, 3, &bytes("d")).unwrap_err();
        assert!(error.contains("dense"), "{error}");
        model.failed(1, 0, &bytes("a"), true).unwrap();
        let error = model.acked(1, 1, 1, &bytes("b")).unwrap_err();
        assert!(error.contains("after index 0 failed"), "{error}");
    }

    #[test]
    fn records_below_a_floor_may_go_and_records_above_it_may_not() {
        let mut model = admitted(&["a", "b"]);
        model.acked(1, 0, 0, &bytes("a")).unwrap();
        model.acked(1, 1, 1, &bytes("b")).unwrap();
        model
            .recovered(Epoch(2), 1, &[bytes("b")], Duration::ZERO)
            .expect("index 0 lies below the floor");
        let error = model
            .recovered(Epoch(3), 1, &[bytes("z")], Duration::ZERO)
            .unwrap_err();
        assert!(error.contains("earlier recovery"), "{error}");
        let mut model = admitted(&["a", "b"]);
        model.acked(1, 1, 1, &bytes("b")).unwrap();
        let error = model
            .recovered(Epoch(2), 1, &[], Duration::ZERO)
            .unwrap_err();
        assert!(error.contains("lost ack"), "{error}");
    }
}
