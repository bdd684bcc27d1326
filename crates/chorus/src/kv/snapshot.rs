//! The key-value state's snapshot encoding (little-endian, CRC32C over
//! everything before it).
//!
//! ```text
//! format 5:
//! "CHKS" | 5 | applied_end u64 | revision i64 | compacted i64
//!        | count u64 | count × (key | entry)
//!        | idempotency table
//!        | revisions u64 | revisions × (revision i64 | changes u32 | changes × (key | before))
//!        | leases u64 | leases × (id i64 | ttl_secs i64), ids ascending
//!        | alarms u64 | alarms × (member_id u64 | alarm u8 (1 NOSPACE, 2 CORRUPT)), ascending
//!        | crc32c u32
//! entry:  index u64 | create_revision i64 | mod_revision i64 | version i64 | lease i64 | value
//! before: 0 (absent) | 1 entry
//! key, value: length u32 | bytes
//! idempotency table: clock_ms u64 | count u64 | count × remembered, oldest first
//! remembered: key length u8 | key | digest [32] | index u64 | recorded_ms u64 | outcome
//! outcome: 0 done | revision i64
//!        | 1 condition failed | key | 0 (absent) or 1 and mod_revision i64
//! ```
//!
//! Each lease's keys are the entries naming it; an entry naming a lease
//! the snapshot does not hold is refused. Format 4 is format 5 without
//! leases and alarms (none existed). Format 3 is format 4 with the idempotency table of format 2, whose
//! outcomes hold index versions: a done write none, a failed condition the
//! index that last set the key. Those map as the entries of formats 1 and 2
//! do (below): index `i` is revision `i + 1`, and a write at record `i`
//! answers revision `i + 1`.
//!
//! Keys in order, revisions ascending, each revision's changes in the order
//! they applied. A change stores only the key's entry before it: the entry
//! after it is the key's next change's entry before, or, for its last
//! change, its current entry (absent if deleted), so decoding rebuilds it.
//!
//! Formats 1 and 2 (before revisions) hold `key | index u64 | value` per
//! entry, format 2 then the idempotency table. They decode onto revisions
//! deterministically, so every replica restoring one agrees: each key's
//! create and mod revision become its index + 1 and its version 1, the
//! store revision `max(1, applied_end)` (at least every key's), and the
//! history starts empty at the store revision (it is the compaction
//! revision: a read below it answers "compacted", never a guess).

use std::collections::{BTreeMap, BTreeSet};

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::command;
use super::etcd::{AlarmMember, AlarmType, Revision};
use super::idempotency::TableVersions;
use super::lease::{LeaseTable, MAX_LEASE_TTL_SECS, granted_ttl};
use super::mvcc::{Change, History};
use super::{Entries, Entry, IdempotencyTable, KvState, SnapshotError};
use crate::ids::RecordIndex;

const SNAPSHOT_MAGIC: [u8; 4] = *b"CHKS";
/// Snapshots before idempotency keys: entries only.
const FORMAT_ENTRIES: u8 = 1;
/// Entries and the idempotency table.
const FORMAT_IDEMPOTENCY: u8 = 2;
/// Revisions, entries with their metadata, the table (with index
/// versions) and the history.
const FORMAT_REVISIONS_INDEX_TABLE: u8 = 3;
/// Format 3 with the table's outcomes in revisions.
const FORMAT_REVISIONS: u8 = 4;
/// Format 4 with etcd's leases and alarms.
pub(super) const FORMAT_LEASES: u8 = 5;

fn fail(reason: &str) -> SnapshotError {
    SnapshotError {
        reason: reason.to_owned(),
    }
}

/// The snapshot bytes of `state` (format 5).
pub(super) fn encode(state: &KvState) -> Bytes {
    let mut out = BytesMut::with_capacity(encoded_bytes_hint(state));
    out.put_slice(&SNAPSHOT_MAGIC);
    out.put_u8(FORMAT_LEASES);
    out.put_u64_le(state.applied_end.0);
    out.put_i64_le(state.history.revision);
    out.put_i64_le(state.history.compacted);
    out.put_u64_le(state.entries.len() as u64);
    for (key, entry) in &state.entries {
        put_sized(&mut out, key);
        put_entry(&mut out, entry);
    }
    state.idempotency.encode(&mut out);
    out.put_u64_le(state.history.changes.len() as u64);
    for (revision, changes) in state.history.changes.iter() {
        out.put_i64_le(revision);
        out.put_u32_le(changes.len() as u32);
        for change in changes {
            put_sized(&mut out, &change.key);
            match &change.before {
                None => out.put_u8(0),
                Some(entry) => {
                    out.put_u8(1);
                    put_entry(&mut out, entry);
                }
            }
        }
    }
    out.put_u64_le(state.leases.len() as u64);
    for (id, lease) in state.leases.iter() {
        out.put_i64_le(id);
        out.put_i64_le(lease.ttl_secs);
    }
    out.put_u64_le(state.alarms.len() as u64);
    for alarm in &state.alarms {
        out.put_u64_le(alarm.member_id);
        out.put_u8(match alarm.alarm {
            AlarmType::NoSpace => 1,
            AlarmType::Corrupt => 2,
        });
    }
    let crc = crc32c::crc32c(&out);
    out.put_u32_le(crc);
    out.freeze()
}

/// Restores a state from [`encode`]'s bytes, or a format 1 to 4 snapshot.
pub(super) fn decode(bytes: &[u8]) -> Result<KvState, SnapshotError> {
    let formats = [
        FORMAT_ENTRIES,
        FORMAT_IDEMPOTENCY,
        FORMAT_REVISIONS_INDEX_TABLE,
        FORMAT_REVISIONS,
        FORMAT_LEASES,
    ];
    let (format, mut input) =
        command::open_envelope(bytes, &SNAPSHOT_MAGIC, &formats, 16, "key-value snapshot")
            .map_err(|reason| fail(&reason))?;
    let input = &mut input;
    let applied_end = RecordIndex(input.get_u64_le());
    let state = match format {
        FORMAT_LEASES | FORMAT_REVISIONS | FORMAT_REVISIONS_INDEX_TABLE => {
            decode_revisions(input, applied_end, format)?
        }
        _ => decode_index_versions(input, applied_end, format)?,
    };
    if !input.is_empty() {
        return Err(fail("trailing bytes"));
    }
    Ok(state)
}

fn decode_revisions(
    input: &mut &[u8],
    applied_end: RecordIndex,
    format: u8,
) -> Result<KvState, SnapshotError> {
    let revision = take_i64(input).ok_or_else(|| fail("truncated revision"))?;
    let compacted = take_i64(input).ok_or_else(|| fail("truncated compaction revision"))?;
    if revision < 1 || compacted < -1 || compacted > revision {
        return Err(fail("revisions out of bounds"));
    }
    let count = take_u64(input).ok_or_else(|| fail("truncated count"))?;
    let mut entries = Entries::new();
    for _ in 0..count {
        let key = take_key(input, entries.get_max().map(|(key, _)| key))?;
        let entry = take_entry(input, applied_end, revision)?;
        entries.insert(key, entry);
    }
    let versions = match format {
        FORMAT_REVISIONS_INDEX_TABLE => TableVersions::Indices,
        _ => TableVersions::Revisions { revision },
    };
    let idempotency = IdempotencyTable::decode(input, applied_end, versions).map_err(fail)?;
    let history = take_history(input, applied_end, &entries, revision, compacted)?;
    let (leases, alarms) = match format {
        FORMAT_LEASES => (take_leases(input)?, take_alarms(input)?),
        _ => (LeaseTable::default(), BTreeSet::new()),
    };
    let leases = attach_keys(leases, &entries)?;
    Ok(KvState {
        size_bytes: size_bytes(&entries),
        entries,
        applied_end,
        idempotency,
        history,
        leases,
        alarms,
    })
}

/// The bytes of the entries' keys and values.
fn size_bytes(entries: &Entries) -> usize {
    let sizes = entries
        .iter()
        .map(|(key, entry)| key.len() + entry.value.len());
    sizes.sum()
}

/// The raised alarms, ascending and unique.
fn take_alarms(input: &mut &[u8]) -> Result<BTreeSet<AlarmMember>, SnapshotError> {
    let count = take_u64(input).ok_or_else(|| fail("truncated alarm count"))?;
    let mut alarms = BTreeSet::new();
    for _ in 0..count {
        let member_id = take_u64(input).ok_or_else(|| fail("truncated alarm member"))?;
        let alarm = match take_u8(input) {
            Some(1) => AlarmType::NoSpace,
            Some(2) => AlarmType::Corrupt,
            _ => return Err(fail("an unknown alarm")),
        };
        let alarm = AlarmMember { member_id, alarm };
        if alarms.last().is_some_and(|last| *last >= alarm) {
            return Err(fail("alarms out of order"));
        }
        alarms.insert(alarm);
    }
    Ok(alarms)
}

/// The leases, ids ascending and unique, TTLs within what a grant gives.
fn take_leases(input: &mut &[u8]) -> Result<LeaseTable, SnapshotError> {
    let count = take_u64(input).ok_or_else(|| fail("truncated lease count"))?;
    let mut leases = LeaseTable::default();
    let mut previous = None;
    for _ in 0..count {
        let id = take_i64(input).ok_or_else(|| fail("truncated lease id"))?;
        let ttl_secs = take_i64(input).ok_or_else(|| fail("truncated lease TTL"))?;
        if id == 0 || previous.is_some_and(|previous| previous >= id) {
            return Err(fail("lease ids zero or out of order"));
        }
        if ttl_secs != granted_ttl(ttl_secs) || ttl_secs > MAX_LEASE_TTL_SECS {
            return Err(fail("a lease TTL out of bounds"));
        }
        leases.grant(id, ttl_secs);
        previous = Some(id);
    }
    Ok(leases)
}

/// Attaches every entry's key to the lease it names, which must exist.
fn attach_keys(mut leases: LeaseTable, entries: &Entries) -> Result<LeaseTable, SnapshotError> {
    for (key, entry) in entries.iter().filter(|(_, entry)| entry.lease != 0) {
        if leases.get(entry.lease).is_none() {
            return Err(fail("a key attached to a lease the snapshot does not hold"));
        }
        leases.attach(key, entry.lease);
    }
    Ok(leases)
}

/// Formats 1 and 2: index versions, mapped onto revisions (module docs).
fn decode_index_versions(
    input: &mut &[u8],
    applied_end: RecordIndex,
    format: u8,
) -> Result<KvState, SnapshotError> {
    let count = take_u64(input).ok_or_else(|| fail("truncated count"))?;
    let revision = Revision::try_from(applied_end.0.max(1))
        .map_err(|_| fail("an applied end past the revision range"))?;
    let mut entries = Entries::new();
    for _ in 0..count {
        let key = take_key(input, entries.get_max().map(|(key, _)| key))?;
        let index = take_u64(input).ok_or_else(|| fail("truncated version"))?;
        let value = take_sized(input).ok_or_else(|| fail("truncated value"))?;
        if index >= applied_end.0 {
            return Err(fail("a version at or past the applied end"));
        }
        let key_revision = index as Revision + 1;
        let entry = Entry {
            value,
            index: RecordIndex(index),
            create_revision: key_revision,
            mod_revision: key_revision,
            version: 1,
            lease: 0,
        };
        entries.insert(key, entry);
    }
    let idempotency = match format {
        FORMAT_ENTRIES => IdempotencyTable::default(),
        _ => IdempotencyTable::decode(input, applied_end, TableVersions::Indices).map_err(fail)?,
    };
    let mut history = History::default();
    if applied_end.0 > 0 {
        history.revision = revision;
        history.compacted = revision;
    }
    Ok(KvState {
        size_bytes: size_bytes(&entries),
        entries,
        applied_end,
        idempotency,
        history,
        leases: LeaseTable::default(),
        alarms: BTreeSet::new(),
    })
}

/// The retained changes; rebuilds each change's entry after from the
/// key's next change or its current entry.
fn take_history(
    input: &mut &[u8],
    applied_end: RecordIndex,
    entries: &Entries,
    revision: Revision,
    compacted: Revision,
) -> Result<History, SnapshotError> {
    let revisions = take_u64(input).ok_or_else(|| fail("truncated history"))?;
    // Sized by what is read, never by the untrusted count alone.
    let mut changes: Vec<(Revision, Vec<Change>)> = Vec::new();
    for _ in 0..revisions {
        let at = take_i64(input).ok_or_else(|| fail("truncated history revision"))?;
        let in_order = changes.last().is_none_or(|(last, _)| *last < at);
        if !in_order || at < compacted.max(1) || at > revision {
            return Err(fail("a history revision out of order or bounds"));
        }
        let count = take_u32(input).ok_or_else(|| fail("truncated history count"))?;
        if count == 0 {
            return Err(fail("a history revision without changes"));
        }
        let mut list = Vec::new();
        for _ in 0..count {
            let key = take_sized(input).ok_or_else(|| fail("truncated history key"))?;
            let before = match take_u8(input) {
                Some(0) => None,
                // Up to `at` itself: a transaction may change one key twice
                // (a put, then a from-key delete over it, which etcd's
                // duplicate check lets through), the second change's
                // previous entry then being the first's, written at `at`.
                Some(1) => Some(take_entry(input, applied_end, at)?),
                _ => return Err(fail("a bad history entry flag")),
            };
            list.push(Change {
                key,
                before,
                after: None,
            });
        }
        changes.push((at, list));
    }
    let mut after: BTreeMap<Bytes, Option<Entry>> = BTreeMap::new();
    for change in changes
        .iter_mut()
        .rev()
        .flat_map(|(_, list)| list.iter_mut().rev())
    {
        let next = after
            .remove(&change.key)
            .unwrap_or_else(|| entries.get(&change.key).cloned());
        change.after = next;
        after.insert(change.key.clone(), change.before.clone());
    }
    let mut history = History {
        revision,
        compacted,
        ..History::default()
    };
    for (at, list) in changes {
        for change in list {
            history.record(at, change);
        }
    }
    Ok(history)
}

/// About as many bytes as [`encode`] writes, or more: reserving them up
/// front spares the buffer's doublings, each a copy of everything so far
/// onto fresh pages (a state of hundreds of MiB is copied several times
/// over otherwise). Reserved pages that stay unwritten are never touched.
pub(super) fn encoded_bytes_hint(state: &KvState) -> usize {
    /// A key's length, an entry's five integers and its value's length.
    const PER_ENTRY: usize = 4 + 40 + 4;
    /// A remembered idempotency key with its outcome, generously.
    const PER_REMEMBERED: usize = 320;
    /// A lease or an alarm.
    const PER_LEASE_OR_ALARM: usize = 16;
    /// The header and the counts.
    const FIXED: usize = 4096;
    FIXED
        + state.size_bytes
        + state.entries.len() * PER_ENTRY
        // Charged per change: more than a change encodes to.
        + state.history.bytes
        + state.idempotency.len() * PER_REMEMBERED
        + (state.leases.len() + state.alarms.len()) * PER_LEASE_OR_ALARM
}

fn put_sized(out: &mut BytesMut, bytes: &[u8]) {
    out.put_u32_le(bytes.len() as u32);
    out.put_slice(bytes);
}

fn put_entry(out: &mut BytesMut, entry: &Entry) {
    out.put_u64_le(entry.index.0);
    out.put_i64_le(entry.create_revision);
    out.put_i64_le(entry.mod_revision);
    out.put_i64_le(entry.version);
    out.put_i64_le(entry.lease);
    put_sized(out, &entry.value);
}

/// An entry, checked: written below `applied_end`, its revisions within
/// `1..=revision` and in order, its version positive.
fn take_entry(
    input: &mut &[u8],
    applied_end: RecordIndex,
    revision: Revision,
) -> Result<Entry, SnapshotError> {
    if input.len() < 40 {
        return Err(fail("truncated entry"));
    }
    let index = RecordIndex(input.get_u64_le());
    let create_revision = input.get_i64_le();
    let mod_revision = input.get_i64_le();
    let version = input.get_i64_le();
    let lease = input.get_i64_le();
    let value = take_sized(input).ok_or_else(|| fail("truncated value"))?;
    if index >= applied_end {
        return Err(fail("an entry at or past the applied end"));
    }
    if create_revision < 1 || create_revision > mod_revision || mod_revision > revision {
        return Err(fail("an entry's revisions out of bounds"));
    }
    if version < 1 {
        return Err(fail("an entry's version below 1"));
    }
    Ok(Entry {
        value,
        index,
        create_revision,
        mod_revision,
        version,
        lease,
    })
}

fn take_key(input: &mut &[u8], previous: Option<&Bytes>) -> Result<Bytes, SnapshotError> {
    let key = take_sized(input).ok_or_else(|| fail("truncated key"))?;
    if previous.is_some_and(|previous| *previous >= key) {
        return Err(fail("keys out of order"));
    }
    Ok(key)
}

fn take_u8(input: &mut &[u8]) -> Option<u8> {
    (!input.is_empty()).then(|| input.get_u8())
}

fn take_u32(input: &mut &[u8]) -> Option<u32> {
    (input.len() >= 4).then(|| input.get_u32_le())
}

fn take_u64(input: &mut &[u8]) -> Option<u64> {
    (input.len() >= 8).then(|| input.get_u64_le())
}

fn take_i64(input: &mut &[u8]) -> Option<i64> {
    (input.len() >= 8).then(|| input.get_i64_le())
}

fn take_sized(input: &mut &[u8]) -> Option<Bytes> {
    let length = take_u32(input)? as usize;
    if input.len() < length {
        return None;
    }
    let bytes = Bytes::copy_from_slice(&input[..length]);
    input.advance(length);
    Some(bytes)
}
