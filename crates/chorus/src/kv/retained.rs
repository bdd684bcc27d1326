//! The retained changes of the history, in revision order, kept in blocks
//! so that copying them is cheap.
//!
//! A snapshot's checkpoint copies the whole state while writes wait. With
//! the changes in one ordered map, that copy allocated once per retained
//! revision (about 85 ms for 300,000 of them, every request stalled
//! meanwhile). Here every full block is immutable and shared (`Arc`), so a
//! copy takes the block pointers and the open block (at most
//! [`BLOCK_REVISIONS`] revisions), whatever the history's size. Nothing
//! ever changes a sealed block: compaction drops whole blocks from the front
//! and rebuilds at most the one it cuts into.

use std::collections::VecDeque;
use std::sync::Arc;

use super::etcd::Revision;
use super::mvcc::Change;

/// Revisions per block: small enough that the open block's copy is
/// negligible, large enough that the block pointers are few. Tests use
/// blocks of four, so that every case of a block boundary occurs in short
/// histories.
pub const BLOCK_REVISIONS: usize = if cfg!(test) { 4 } else { 1024 };

/// The changes of consecutive revisions, each revision's together.
#[derive(Debug, Clone, Default)]
struct Block {
    /// Each revision, ascending, with the index of its first change.
    starts: Vec<(Revision, usize)>,
    /// Every revision's changes, in order.
    changes: Vec<Change>,
}

impl Block {
    /// Revision `i` of the block and its changes.
    fn revision(&self, i: usize) -> (Revision, &[Change]) {
        let (revision, start) = self.starts[i];
        (revision, &self.changes[start..self.first_change(i + 1)])
    }

    /// Where the changes of revision `i` start (the end past the last).
    fn first_change(&self, i: usize) -> usize {
        self.starts
            .get(i)
            .map_or(self.changes.len(), |&(_, start)| start)
    }

    /// The first of its revisions at or above `revision`.
    fn position(&self, revision: Revision) -> usize {
        self.starts.partition_point(|&(at, _)| at < revision)
    }

    /// The newest of its revisions, if it has any.
    fn last_revision(&self) -> Option<Revision> {
        self.starts.last().map(|&(at, _)| at)
    }

    /// The block without its first `cut` revisions (a new one), their
    /// changes handed to `forgotten` in order.
    fn without_first(&self, cut: usize, forgotten: &mut impl FnMut(&Change)) -> Block {
        let first = self.first_change(cut);
        self.changes[..first].iter().for_each(forgotten);
        Block {
            starts: self.starts[cut..]
                .iter()
                .map(|&(at, start)| (at, start - first))
                .collect(),
            changes: self.changes[first..].to_vec(),
        }
    }

    /// Its revisions from the `from`th on, with their changes.
    fn iter(&self, from: usize) -> impl Iterator<Item = (Revision, &[Change])> {
        (from..self.starts.len()).map(|i| self.revision(i))
    }
}

/// The retained changes: per revision, ascending, the changes it made.
#[derive(Debug, Clone, Default)]
pub struct RetainedChanges {
    /// Full blocks, oldest first; shared by every copy.
    sealed: VecDeque<Arc<Block>>,
    /// The newest revisions, up to [`BLOCK_REVISIONS`] of them.
    open: Block,
    /// Revisions retained, in all blocks.
    revisions: usize,
}

impl RetainedChanges {
    /// How many revisions have changes retained.
    pub fn len(&self) -> usize {
        self.revisions
    }

    /// Appends `change` to `revision`, which is the newest retained
    /// revision or above it.
    pub fn push(&mut self, revision: Revision, change: Change) {
        let newest = self
            .open
            .last_revision()
            .or_else(|| self.sealed.back().and_then(|block| block.last_revision()));
        debug_assert!(newest.is_none_or(|newest| newest <= revision));
        if newest != Some(revision) {
            if self.open.starts.len() >= BLOCK_REVISIONS {
                self.sealed
                    .push_back(Arc::new(std::mem::take(&mut self.open)));
            }
            self.open.starts.push((revision, self.open.changes.len()));
            self.revisions += 1;
        }
        self.open.changes.push(change);
    }

    /// Forgets the revisions below `revision`; the changes forgotten, in
    /// order, are handed to `forgotten`.
    pub fn forget_below(&mut self, revision: Revision, mut forgotten: impl FnMut(&Change)) {
        while let Some(front) = self.sealed.front() {
            let cut = front.position(revision);
            if cut == 0 {
                return;
            }
            self.revisions -= cut;
            let kept = front.without_first(cut, &mut forgotten);
            if kept.starts.is_empty() {
                self.sealed.pop_front();
            } else {
                self.sealed[0] = Arc::new(kept);
                return;
            }
        }
        let cut = self.open.position(revision);
        if cut > 0 {
            self.revisions -= cut;
            self.open = self.open.without_first(cut, &mut forgotten);
        }
    }

    /// Every revision from `from` on, ascending, with its changes.
    pub fn iter_from(&self, from: Revision) -> impl Iterator<Item = (Revision, &[Change])> {
        let first_block = self
            .sealed
            .partition_point(|block| block.last_revision().is_some_and(|last| last < from));
        self.sealed
            .range(first_block..)
            .map(|block| &**block)
            .chain(std::iter::once(&self.open))
            .flat_map(move |block| block.iter(block.position(from)))
    }

    /// Every revision, ascending, with its changes.
    pub fn iter(&self) -> impl Iterator<Item = (Revision, &[Change])> {
        self.iter_from(Revision::MIN)
    }
}

impl PartialEq for RetainedChanges {
    /// The same revisions with the same changes, however they are blocked.
    fn eq(&self, other: &RetainedChanges) -> bool {
        self.revisions == other.revisions && self.iter().eq(other.iter())
    }
}

impl Eq for RetainedChanges {}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;

    fn change(n: u64) -> Change {
        Change {
            key: Bytes::from(n.to_string()),
            before: None,
            after: None,
        }
    }

    /// What the retained changes must equal: one ordered map.
    type Model = BTreeMap<Revision, Vec<Change>>;

    fn flat(model: &Model) -> Vec<(Revision, Vec<Change>)> {
        model.iter().map(|(at, c)| (*at, c.clone())).collect()
    }

    fn listed<'a>(
        changes: impl Iterator<Item = (Revision, &'a [Change])>,
    ) -> Vec<(Revision, Vec<Change>)> {
        changes.map(|(at, c)| (at, c.to_vec())).collect()
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// Changes at the newest revision plus this (0: the same one).
        Push { ahead: i64, changes: usize },
        /// Forget below the newest revision minus this.
        Forget { behind: i64 },
        /// Copy, then go on with the copy (the original must not move).
        Copy,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            8 => (0..3i64, 1..4usize).prop_map(|(ahead, changes)| Step::Push { ahead, changes }),
            1 => (0..300i64).prop_map(|behind| Step::Forget { behind }),
            1 => Just(Step::Copy),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn blocks_behave_as_one_ordered_map(steps in proptest::collection::vec(step(), 1..400)) {
            let mut retained = RetainedChanges::default();
            let mut model = Model::new();
            let mut newest: Revision = 1;
            let mut serial = 0;
            for step in steps {
                match step {
                    Step::Push { ahead, changes } => {
                        newest += ahead;
                        for _ in 0..changes {
                            serial += 1;
                            retained.push(newest, change(serial));
                            model.entry(newest).or_default().push(change(serial));
                        }
                    }
                    Step::Forget { behind } => {
                        let below = newest - behind;
                        let mut forgotten = Vec::new();
                        retained.forget_below(below, |c| forgotten.push(c.clone()));
                        let kept = model.split_off(&below);
                        let dropped: Vec<Change> = std::mem::replace(&mut model, kept)
                            .into_values()
                            .flatten()
                            .collect();
                        prop_assert_eq!(forgotten, dropped);
                    }
                    Step::Copy => {
                        let before = listed(retained.iter());
                        let copy = retained.clone();
                        prop_assert!(copy == retained);
                        retained.push(newest + 1, change(u64::MAX));
                        prop_assert_eq!(listed(copy.iter()), before);
                        retained = copy;
                    }
                }
                prop_assert_eq!(retained.len(), model.len());
            }
            prop_assert_eq!(listed(retained.iter()), flat(&model));
            for from in std::iter::once(Revision::MIN).chain(0..=newest + 1) {
                let expected: Vec<_> = model
                    .range(from..)
                    .map(|(at, c)| (*at, c.clone()))
                    .collect();
                prop_assert_eq!(listed(retained.iter_from(from)), expected);
            }
        }
    }

    #[test]
    fn a_copy_shares_every_full_block() {
        let mut retained = RetainedChanges::default();
        for revision in 0..(3 * BLOCK_REVISIONS as i64 + 2) {
            retained.push(revision, change(revision as u64));
        }
        let copy = retained.clone();
        assert_eq!(copy.sealed.len(), 3);
        for (ours, theirs) in retained.sealed.iter().zip(&copy.sealed) {
            assert!(Arc::ptr_eq(ours, theirs));
        }
        assert_eq!(copy.open.starts.len(), 2);
    }
}
