//! Checkers over the raw stores and the raw register (checkers 1, 5 and 6).
//!
//! A *mirror* of every raw replica is kept up to date from the keys the
//! recording layer saw written, and fully re-synchronised (and compared)
//! every [`RESYNC_EVERY_STEPS`] steps and at the end. All reads use
//! `now_or_never`: the in-memory stores answer at once, so a check sees one
//! instant of the whole cluster, with no task running in between.
//!
//! - **1, durability**: every known-committed record (acknowledged,
//!   recovered or returned by a reader) is on at least Q replicas with
//!   identical bytes: below the register's `tail_base` inside the sealed
//!   object its directory entry names, verified (CRC, id, base) on at least
//!   Q replicas; at or above it as a data fragment of the segment's own epoch
//!   in the tail or pending segment on at least Q replicas.
//! - **5, register invariants**: the raw register decodes
//!   (`Manifest::from_fields` validates every invariant).
//! - **6, register history**: the epoch never decreases; one epoch has one
//!   owner; the directory only grows at its end; `tail_base`, `trunc` and the
//!   tail segment's epoch never decrease; replicas and window never change.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use chorus::codec::{Fragment, SealedSegment};
use chorus::ids::{Epoch, FragmentIndex, OwnerId, SegmentId};
use chorus::log::layout::{sealed_key, segment_prefix};
use chorus::log::quorum::quorum;
use chorus::register::{DirectoryEntry, Manifest};
use futures::FutureExt;

use crate::model::{Model, Violation};
use crate::trace::label;
use crate::world::{World, raw_bytes};

/// How often the mirror is compared with a full listing of every replica.
pub const RESYNC_EVERY_STEPS: u64 = 256;

/// Checkers 1, 5 and 6 with their caches; see the module docs.
#[derive(Debug)]
pub struct StoreChecker {
    quorum: usize,
    mirror: Vec<BTreeMap<String, Bytes>>,
    /// Decoded fragments per replica, by key (`None`: does not decode).
    fragments: Vec<BTreeMap<String, Option<Fragment>>>,
    /// Sealed keys verified on Q replicas and not written since.
    durable: BTreeSet<String>,
    /// The records of every sealed key ever verified, kept after truncation
    /// deletes the objects (a key names its content: id and CRC32C), so a
    /// recovery view the checkers see late is still checked from its floor.
    verified: BTreeMap<String, Arc<Vec<Bytes>>>,
    /// The directory prefix whose entries have been checked.
    checked: Vec<DirectoryEntry>,
    /// Directory position of each checked entry's sealed key.
    key_positions: BTreeMap<String, usize>,
    /// Sealed keys written since the last check.
    dirty_sealed: BTreeSet<String>,
    /// The last register version read, with its decoded record.
    register_version: Option<chorus::register::RegisterVersion>,
    /// Segments whose fragments changed since the last active check.
    touched_segments: BTreeSet<String>,
    /// The tail and pending segments the last active check looked at, and
    /// every data copy of their records: index → (replica, bytes).
    active: Option<(SegmentId, Option<SegmentId>)>,
    active_copies: BTreeMap<u64, Vec<(usize, Bytes)>>,
    last: Option<Manifest>,
    owners: BTreeMap<Epoch, OwnerId>,
    /// How often the floor was seen to rise.
    floor_raises: u64,
}

impl StoreChecker {
    /// A checker for a cluster of `replicas` empty replicas.
    pub fn new(replicas: usize) -> StoreChecker {
        StoreChecker {
            quorum: quorum(replicas),
            mirror: vec![BTreeMap::new(); replicas],
            fragments: vec![BTreeMap::new(); replicas],
            durable: BTreeSet::new(),
            verified: BTreeMap::new(),
            checked: Vec::new(),
            key_positions: BTreeMap::new(),
            dirty_sealed: BTreeSet::new(),
            register_version: None,
            touched_segments: BTreeSet::new(),
            active: None,
            active_copies: BTreeMap::new(),
            last: None,
            owners: BTreeMap::new(),
            floor_raises: 0,
        }
    }

    /// Re-reads every raw key written since the last call.
    pub fn refresh(&mut self, world: &World) -> Result<(), Violation> {
        for replica in 0..world.replica_count() {
            let dirty = std::mem::take(&mut *world.dirty[replica].lock().expect("dirty set"));
            for key in dirty {
                let found = raw_bytes(&world.raw[replica], &key)?;
                self.forget(replica, &key);
                match found {
                    Some(bytes) => self.mirror[replica].insert(key, bytes),
                    None => self.mirror[replica].remove(&key),
                };
            }
        }
        Ok(())
    }

    fn forget(&mut self, replica: usize, key: &str) {
        self.fragments[replica].remove(key);
        if self.durable.remove(key) || key.starts_with("sealed/") {
            self.dirty_sealed.insert(key.to_owned());
        }
        if let Some(rest) = key.strip_prefix("segments/") {
            let segment = rest.split('/').next().unwrap_or_default();
            self.touched_segments.insert(segment.to_owned());
        }
    }

    /// Compares the mirror with a full listing of every raw replica.
    pub fn resync(&mut self, world: &World) -> Result<(), Violation> {
        for replica in 0..world.replica_count() {
            let listed = world.raw[replica]
                .list("")
                .now_or_never()
                .expect("in-memory stores answer at once")
                .map_err(|error| format!("raw list failed on replica {replica}: {error}"))?;
            let keys: BTreeSet<&str> = listed.iter().map(|meta| meta.key.as_str()).collect();
            let mirrored: BTreeSet<&str> =
                self.mirror[replica].keys().map(String::as_str).collect();
            if keys != mirrored {
                return Err(format!(
                    "harness: mirror of replica {replica} lists {} keys, the store {}",
                    mirrored.len(),
                    keys.len()
                ));
            }
            for (key, bytes) in &self.mirror[replica] {
                if raw_bytes(&world.raw[replica], key)?.as_ref() != Some(bytes) {
                    return Err(format!(
                        "harness: mirror of replica {replica} differs at {key}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Checkers 5 and 6; returns the current register record.
    pub fn check_register(&mut self, world: &World) -> Result<Manifest, Violation> {
        let current = world.register_now()?;
        if let Some(last) = self
            .last
            .as_ref()
            .filter(|_| self.register_version.as_ref() == Some(&current.version))
        {
            return Ok(last.clone());
        }
        self.register_version = Some(current.version.clone());
        let manifest = Manifest::from_fields(&current.fields)
            .map_err(|error| format!("register invariant: {error}"))?;
        let previous = self.owners.insert(manifest.epoch, manifest.owner);
        if let Some(owner) = previous.filter(|owner| *owner != manifest.owner) {
            return Err(format!(
                "register history: epoch {} changed owner from {owner} to {}",
                manifest.epoch, manifest.owner
            ));
        }
        if let Some(last) = &self.last {
            check_history(last, &manifest)?;
            self.floor_raises += u64::from(manifest.trunc > last.trunc);
        }
        self.last = Some(manifest.clone());
        Ok(manifest)
    }

    /// Checker 1 against the register record `manifest`.
    pub fn check_durability(
        &mut self,
        manifest: &Manifest,
        model: &Model,
        fresh: &BTreeSet<u64>,
    ) -> Result<(), Violation> {
        self.check_sealed(manifest, model, fresh)?;
        self.check_tail(manifest, model, fresh)
    }

    /// Checker 1 below `tail_base`. An entry checked once stays checked
    /// until its sealed key is written again on some replica or a newly
    /// committed record falls into its range, so each step looks only at
    /// what changed.
    fn check_sealed(
        &mut self,
        manifest: &Manifest,
        model: &Model,
        fresh: &BTreeSet<u64>,
    ) -> Result<(), Violation> {
        if !manifest.segments.starts_with(&self.checked) {
            // The directory changed other than by appending (truncation):
            // check everything again.
            self.checked.clear();
            self.key_positions.clear();
        }
        let mut recheck: BTreeSet<usize> = std::mem::take(&mut self.dirty_sealed)
            .iter()
            .filter_map(|key| self.key_positions.get(key).copied())
            .filter(|position| *position < self.checked.len())
            .collect();
        recheck.extend(self.checked.len()..manifest.segments.len());
        let bases = &manifest.segments;
        for index in fresh.range(..manifest.tail_base.0) {
            let position = bases.partition_point(|entry| entry.base.0 <= *index);
            if position > 0 {
                recheck.insert(position - 1);
            }
        }
        for position in recheck {
            self.check_entry(manifest, position, model)?;
        }
        let known = self.checked.len();
        self.checked.extend_from_slice(&manifest.segments[known..]);
        Ok(())
    }

    /// Verifies directory entry `position` and the committed records in it.
    fn check_entry(
        &mut self,
        manifest: &Manifest,
        position: usize,
        model: &Model,
    ) -> Result<(), Violation> {
        let end = manifest.entry_end(position).0;
        if end <= manifest.trunc.0 {
            return Ok(());
        }
        let entry = manifest.segments[position];
        let key = sealed_key(entry.id, entry.crc32c);
        let records = self.durable_records(&entry, end)?;
        self.key_positions.insert(key, position);
        check_records(
            &entry,
            &records,
            entry.base.0.max(manifest.trunc.0)..end,
            model,
        )
    }

    /// Checker 1 at and above `tail_base`.
    fn check_tail(
        &mut self,
        manifest: &Manifest,
        model: &Model,
        fresh: &BTreeSet<u64>,
    ) -> Result<(), Violation> {
        let active_fresh = fresh.range(manifest.tail_base.0..).next().is_some();
        let active = Some((manifest.tail, manifest.pending));
        let touched = [Some(manifest.tail), manifest.pending]
            .into_iter()
            .flatten()
            .any(|segment| self.touched_segments.contains(&segment.to_string()));
        self.touched_segments.clear();
        if touched || self.active != active {
            self.active = active;
            self.collect_active_copies(manifest);
        } else if !active_fresh {
            return Ok(());
        }
        self.check_active(manifest, model)
    }

    /// Indexes every data copy of the tail and pending segments' records.
    fn collect_active_copies(&mut self, manifest: &Manifest) {
        let mut copies: BTreeMap<u64, Vec<(usize, Bytes)>> = BTreeMap::new();
        for segment in [Some(manifest.tail), manifest.pending]
            .into_iter()
            .flatten()
        {
            for replica in 0..self.mirror.len() {
                for (first, records) in self.data_fragments(replica, segment) {
                    for (offset, record) in records.into_iter().enumerate() {
                        copies
                            .entry(first + offset as u64)
                            .or_default()
                            .push((replica, record));
                    }
                }
            }
        }
        self.active_copies = copies;
    }

    /// The records of directory entry `entry` (ending at `end`), verified on
    /// Q replicas now or since its sealed key was last written.
    fn durable_records(
        &mut self,
        entry: &DirectoryEntry,
        end: u64,
    ) -> Result<Arc<Vec<Bytes>>, Violation> {
        let key = sealed_key(entry.id, entry.crc32c);
        match self
            .verified
            .get(&key)
            .filter(|_| self.durable.contains(&key))
        {
            Some(records) => Ok(Arc::clone(records)),
            None => self.verify_entry(entry, end),
        }
    }

    /// Verifies the sealed object `entry` names on every replica; it must be
    /// valid on at least Q and hold exactly `end - base` records.
    fn verify_entry(
        &mut self,
        entry: &DirectoryEntry,
        end: u64,
    ) -> Result<Arc<Vec<Bytes>>, Violation> {
        let key = sealed_key(entry.id, entry.crc32c);
        let mut valid: Vec<(usize, &Bytes, SealedSegment)> = Vec::new();
        for (replica, mirror) in self.mirror.iter().enumerate() {
            let Some(bytes) = mirror.get(&key) else {
                continue;
            };
            if let Ok(segment) =
                SealedSegment::decode_verified(bytes, entry.id, entry.base, entry.crc32c)
            {
                valid.push((replica, bytes, segment));
            }
        }
        if valid.len() < self.quorum {
            return Err(format!(
                "durability: directory entry {}:{} ({key}) has {} valid copies, quorum {}",
                entry.id,
                entry.base,
                valid.len(),
                self.quorum
            ));
        }
        if let Some((replica, _, _)) = valid.iter().find(|(_, bytes, _)| *bytes != valid[0].1) {
            return Err(format!(
                "durability: valid copies of {key} differ (replica {} and {replica})",
                valid[0].0
            ));
        }
        let records = valid.swap_remove(0).2.records;
        if records.len() as u64 != end - entry.base.0 {
            return Err(format!(
                "durability: {key} holds {} records but its directory entry spans {}..{end}",
                records.len(),
                entry.base
            ));
        }
        let records = Arc::new(records);
        self.verified.insert(key.clone(), Arc::clone(&records));
        self.durable.insert(key);
        Ok(records)
    }

    /// Known-committed records at or above `tail_base` must each be a data
    /// fragment record on at least Q replicas, in the tail or pending segment.
    fn check_active(&mut self, manifest: &Manifest, model: &Model) -> Result<(), Violation> {
        let committed = model.committed_from(manifest.tail_base.max(manifest.trunc).0);
        for (index, bytes) in committed {
            let holders: BTreeSet<usize> = self
                .active_copies
                .get(&index)
                .into_iter()
                .flatten()
                .filter(|(_, record)| *record == bytes)
                .map(|(replica, _)| *replica)
                .collect();
            if holders.len() < self.quorum {
                return Err(format!(
                    "durability: committed index {index} ({}) is on {} replicas in segments \
                     {}/{:?} (tail_base {}), quorum {}",
                    label(&bytes),
                    holders.len(),
                    manifest.tail,
                    manifest.pending.map(|p| p.to_string()),
                    manifest.tail_base,
                    self.quorum
                ));
            }
        }
        Ok(())
    }

    /// `(first record, records)` of each valid data fragment of `segment`
    /// written by the segment's own epoch on `replica`.
    fn data_fragments(&mut self, replica: usize, segment: SegmentId) -> Vec<(u64, Vec<Bytes>)> {
        let prefix = format!("{}/", segment_prefix(segment));
        let keys: Vec<String> = self.mirror[replica]
            .range(prefix.clone()..)
            .take_while(|(key, _)| key.starts_with(&prefix))
            .map(|(key, _)| key.clone())
            .collect();
        let mut found = Vec::new();
        for key in keys {
            // The prefix matched; the rest must be the 20-digit index.
            let Some(index) = parse_index(&key[prefix.len()..]) else {
                continue;
            };
            let decoded = self.fragments[replica]
                .entry(key.clone())
                .or_insert_with(|| Fragment::decode(&self.mirror[replica][&key]).ok());
            if let Some(Fragment::Data {
                epoch,
                index: at,
                first,
                records,
            }) = decoded
                && *epoch == segment.epoch
                && *at == index
            {
                found.push((first.0, records.clone()));
            }
        }
        found
    }

    /// The records the directory of a committed recovery view names, from
    /// its floor to `tail_base`, with the index they start at. Entries still
    /// retained at the current floor `current_floor` are verified on Q
    /// replicas; the view may be older than the stores (its notice is handled
    /// after the step), so entries a later truncation released come from what
    /// the checkers verified before. If one of those was never seen, the
    /// content starts after it.
    pub fn content(
        &mut self,
        manifest: &Manifest,
        current_floor: u64,
    ) -> Result<(u64, Vec<Bytes>), Violation> {
        let floor = manifest.trunc.0;
        let mut start = floor;
        let mut content = Vec::new();
        for position in 0..manifest.segments.len() {
            let entry = manifest.segments[position];
            let end = manifest.entry_end(position).0;
            if end <= floor {
                continue;
            }
            let key = sealed_key(entry.id, entry.crc32c);
            let records = if end <= current_floor {
                match self.verified.get(&key) {
                    Some(records) => Arc::clone(records),
                    None => {
                        start = end;
                        content.clear();
                        continue;
                    }
                }
            } else {
                self.durable_records(&entry, end)?
            };
            let skip = start.saturating_sub(entry.base.0) as usize;
            content.extend(records.iter().skip(skip).cloned());
        }
        Ok((start, content))
    }

    /// Copies of retained sealed objects that could be lost without leaving
    /// fewer than Q valid ones: `(replica, key)` for every valid copy of an
    /// object with more than Q. Damaging one stays inside the fault model.
    pub fn spare_sealed_copies(&self, manifest: &Manifest) -> Vec<(usize, String)> {
        let mut spare = Vec::new();
        for (position, entry) in manifest.segments.iter().enumerate() {
            if manifest.is_tombstone(position) {
                continue;
            }
            let key = sealed_key(entry.id, entry.crc32c);
            let valid: Vec<usize> = (0..self.mirror.len())
                .filter(|replica| {
                    self.mirror[*replica].get(&key).is_some_and(|bytes| {
                        SealedSegment::decode_verified(bytes, entry.id, entry.base, entry.crc32c)
                            .is_ok()
                    })
                })
                .collect();
            if valid.len() > self.quorum {
                spare.extend(valid.into_iter().map(|replica| (replica, key.clone())));
            }
        }
        spare
    }

    /// How often the checks saw the truncation floor rise.
    pub fn floor_raises(&self) -> u64 {
        self.floor_raises
    }

    /// The register record the last check read.
    pub fn last_manifest(&self) -> Option<&Manifest> {
        self.last.as_ref()
    }
}

/// Whether `now`'s directory is `last`'s without some leading entries that
/// lie wholly below `now`'s floor (removed tombstones), plus new entries.
fn directory_followed(last: &Manifest, now: &Manifest) -> bool {
    let kept = now
        .segments
        .first()
        .and_then(|first| last.segments.iter().position(|entry| entry == first))
        .unwrap_or(last.segments.len());
    let removed_below_floor = (0..kept).all(|position| last.entry_end(position) <= now.trunc);
    let rest = &last.segments[kept..];
    removed_below_floor && now.segments.starts_with(rest)
}

/// A fragment key's last component: exactly 20 decimal digits.
fn parse_index(component: &str) -> Option<FragmentIndex> {
    let digits = component.len() == FragmentIndex::KEY_DIGITS
        && component.bytes().all(|b| b.is_ascii_digit());
    digits
        .then(|| component.parse().ok().map(FragmentIndex))
        .flatten()
}

fn check_records(
    entry: &DirectoryEntry,
    records: &[Bytes],
    indices: impl Iterator<Item = u64>,
    model: &Model,
) -> Result<(), Violation> {
    for index in indices {
        let Some(bytes) = model.committed_at(index) else {
            continue;
        };
        let sealed = &records[(index - entry.base.0) as usize];
        if sealed != bytes {
            return Err(format!(
                "durability: committed index {index} is {} but sealed segment {} holds {}",
                label(bytes),
                entry.id,
                label(sealed)
            ));
        }
    }
    Ok(())
}

fn check_history(last: &Manifest, now: &Manifest) -> Result<(), Violation> {
    let checks = [
        (now.epoch >= last.epoch, "the epoch decreased"),
        (
            directory_followed(last, now),
            "the directory changed other than by dropping tombstones and appending",
        ),
        (now.tail_base >= last.tail_base, "tail_base decreased"),
        (now.trunc >= last.trunc, "trunc decreased"),
        (
            now.tail.epoch >= last.tail.epoch,
            "the tail segment's epoch decreased",
        ),
        (now.replicas == last.replicas, "the replica list changed"),
        (now.window == last.window, "the window changed"),
    ];
    match checks.iter().find(|(ok, _)| !ok) {
        Some((_, what)) => Err(format!(
            "register history: {what}: epoch {}→{} tail {}@{}→{}@{} entries {}→{}",
            last.epoch,
            now.epoch,
            last.tail,
            last.tail_base,
            now.tail,
            now.tail_base,
            last.segments.len(),
            now.segments.len()
        )),
        None => Ok(()),
    }
}
