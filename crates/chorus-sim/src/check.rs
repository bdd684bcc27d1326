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
use chorus::blob::BlobError;
use chorus::codec::{Fragment, SealedSegment};
use chorus::ids::{Epoch, OwnerId, SegmentId};
use chorus::log::layout::{parse_fragment_key, sealed_key, segment_prefix};
use chorus::log::quorum::quorum;
use chorus::register::{DirectoryEntry, Manifest, ManifestStore};
use futures::FutureExt;

use crate::model::{Model, Violation};
use crate::trace::label;
use crate::world::World;

/// How often the mirror is compared with a full listing of every replica.
pub const RESYNC_EVERY_STEPS: u64 = 256;

/// Checkers 1, 5 and 6 with their caches; see the module docs.
#[derive(Debug)]
pub struct StoreChecker {
    quorum: usize,
    mirror: Vec<BTreeMap<String, Bytes>>,
    /// Decoded fragments per replica, by key (`None`: does not decode).
    fragments: Vec<BTreeMap<String, Option<Fragment>>>,
    /// Directory entries verified on Q replicas, by sealed key, with records.
    entries: BTreeMap<String, Arc<Vec<Bytes>>>,
    /// Segments whose fragments changed since the last active check.
    touched_segments: BTreeSet<String>,
    /// The tail and pending segments the last active check looked at.
    active: Option<(SegmentId, Option<SegmentId>)>,
    last: Option<Manifest>,
    owners: BTreeMap<Epoch, OwnerId>,
}

impl StoreChecker {
    /// A checker for a cluster of `replicas` empty replicas.
    pub fn new(replicas: usize) -> StoreChecker {
        StoreChecker {
            quorum: quorum(replicas),
            mirror: vec![BTreeMap::new(); replicas],
            fragments: vec![BTreeMap::new(); replicas],
            entries: BTreeMap::new(),
            touched_segments: BTreeSet::new(),
            active: None,
            last: None,
            owners: BTreeMap::new(),
        }
    }

    /// Re-reads every raw key written since the last call.
    pub fn refresh(&mut self, world: &World) -> Result<(), Violation> {
        for replica in 0..world.replica_count() {
            let dirty = std::mem::take(&mut *world.dirty[replica].lock().expect("dirty set"));
            for key in dirty {
                let found = raw_get(world, replica, &key)?;
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
        self.entries.remove(key);
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
                if raw_get(world, replica, key)?.as_ref() != Some(bytes) {
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
        let current = world
            .raw_register
            .read()
            .now_or_never()
            .expect("the in-memory register answers at once")
            .map_err(|error| format!("raw register read failed: {error}"))?
            .ok_or("the register vanished")?;
        let manifest = Manifest::from_fields(&current.fields)
            .map_err(|error| format!("register invariant: {error}"))?;
        if let Some(owner) = self.owners.insert(manifest.epoch, manifest.owner) {
            if owner != manifest.owner {
                return Err(format!(
                    "register history: epoch {} changed owner from {owner} to {}",
                    manifest.epoch, manifest.owner
                ));
            }
        }
        if let Some(last) = &self.last {
            check_history(last, &manifest)?;
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
        for position in 0..manifest.segments.len() {
            if manifest.entry_end(position) <= manifest.trunc {
                continue;
            }
            let entry = manifest.segments[position];
            let end = manifest.entry_end(position).0;
            let key = sealed_key(entry.id, entry.crc32c);
            let records = match self.entries.get(&key) {
                Some(records) => {
                    let records = Arc::clone(records);
                    let range = fresh.range(entry.base.0..end).copied();
                    check_records(&entry, &records, range, model)?;
                    continue;
                }
                None => self.verify_entry(&entry, end)?,
            };
            check_records(&entry, &records, entry.base.0..end, model)?;
        }
        let active_fresh = fresh.range(manifest.tail_base.0..).next().is_some();
        let active = Some((manifest.tail, manifest.pending));
        if active_fresh || self.active != active || !self.touched_segments.is_empty() {
            self.check_active(manifest, model)?;
        }
        self.active = active;
        self.touched_segments.clear();
        Ok(())
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
        self.entries.insert(key, Arc::clone(&records));
        Ok(records)
    }

    /// Known-committed records at or above `tail_base` must each be a data
    /// fragment record on at least Q replicas, in the tail or pending segment.
    fn check_active(&mut self, manifest: &Manifest, model: &Model) -> Result<(), Violation> {
        let committed = model.committed_from(manifest.tail_base.0);
        if committed.is_empty() {
            return Ok(());
        }
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
        for (index, bytes) in committed {
            let holders: BTreeSet<usize> = copies
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
            let Some(index) = parse_fragment_key(segment, &key) else {
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
            {
                if *epoch == segment.epoch && *at == index {
                    found.push((first.0, records.clone()));
                }
            }
        }
        found
    }

    /// The records the directory of `manifest` names, from its floor to
    /// `tail_base`, each entry verified on Q replicas.
    pub fn content(&mut self, manifest: &Manifest) -> Result<Vec<Bytes>, Violation> {
        assert_eq!(manifest.trunc.0, 0, "the simulator does not truncate yet");
        let mut content = Vec::new();
        for position in 0..manifest.segments.len() {
            let entry = manifest.segments[position];
            let end = manifest.entry_end(position).0;
            let key = sealed_key(entry.id, entry.crc32c);
            let records = match self.entries.get(&key) {
                Some(records) => Arc::clone(records),
                None => self.verify_entry(&entry, end)?,
            };
            content.extend(records.iter().cloned());
        }
        Ok(content)
    }
}

fn raw_get(world: &World, replica: usize, key: &str) -> Result<Option<Bytes>, Violation> {
    match world.raw[replica]
        .get(key)
        .now_or_never()
        .expect("in-memory stores answer at once")
    {
        Ok(blob) => Ok(Some(blob.bytes)),
        Err(BlobError::NotFound { .. }) => Ok(None),
        Err(error) => Err(format!("raw get failed on replica {replica}: {error}")),
    }
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
    let grew = now.segments.len() >= last.segments.len()
        && now.segments[..last.segments.len()] == last.segments[..];
    let checks = [
        (now.epoch >= last.epoch, "the epoch decreased"),
        (grew, "the directory changed other than by appending"),
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
