//! Exactly-once writes: the table of idempotency keys the key-value machine
//! keeps, and the stamp a record carries to enter it.
//!
//! A client that does not know whether its write applied (a timeout, a
//! dropped connection, a `503` with `may_have_committed`) retries it with
//! the same key. The key travels inside the write's own record, so every
//! replica that applies the record remembers the key, the digest of the
//! request and its outcome, and a snapshot carries the table across
//! restarts and failovers. A later record with a remembered key applies as
//! a no-op that answers the original outcome ([`Lookup::Same`]) or, for a
//! different request, a refusal ([`Lookup::Different`]).
//!
//! Retention is judged from the log alone, so every replica forgets the
//! same keys at the same record: each stamp carries the primary's wall
//! clock and the retention the primary runs with. The table's clock is the
//! newest stamp applied so far (a primary whose clock is behind its
//! predecessor's neither resurrects nor prolongs keys), and a key is
//! forgotten once it is older than the stamp's `max_age_ms` by that clock,
//! or once more than `max_keys` newer keys were recorded, or once the table
//! with the newer keys holds more than `max_bytes` (each entry counted as
//! its key, the key of a remembered failed condition, and
//! [`ENTRY_OVERHEAD_BYTES`]).
//!
//! The byte budget bounds the table's memory and its share of every
//! snapshot, whatever
//! keys and failed conditions clients send: by count alone, 100,000 keys of
//! 255 bytes that each remember a failed condition on a 1,024-byte key took
//! about 160 MB.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use imbl::{OrdMap, Vector};

use super::command::CommandError;
use super::etcd::Revision;
use crate::ids::RecordIndex;

/// The longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;
/// The most keys a retention may keep.
pub const MAX_RETAINED_KEYS: u64 = 10_000_000;
/// The longest a retention may keep a key: 30 days.
pub const MAX_RETENTION_AGE_MS: u64 = 30 * 24 * 3600 * 1000;
/// Keys kept by default.
pub const DEFAULT_RETAINED_KEYS: u64 = 100_000;
/// How long a key is kept by default: 24 h.
pub const DEFAULT_RETENTION_AGE_MS: u64 = 24 * 3600 * 1000;
/// What one remembered key costs beyond its variable bytes (its key, and
/// the key of a remembered failed condition): the entry itself, its place
/// in the map and in the order, and the allocations of its keys. An
/// estimate of the memory, on the high side; it is fixed, so that every
/// replica counts the same.
pub const ENTRY_OVERHEAD_BYTES: u64 = 320;
/// The largest entry: the longest key remembering a failed condition on
/// the longest key-value key.
pub const MAX_ENTRY_BYTES: u64 =
    MAX_IDEMPOTENCY_KEY_BYTES as u64 + super::MAX_KEY_BYTES as u64 + ENTRY_OVERHEAD_BYTES;
/// Table bytes kept by default: 100,000 keys of a UUID's 36 characters
/// (about 36 MB) fit; keys and failed conditions at their largest fit about
/// 42,000.
pub const DEFAULT_RETAINED_BYTES: u64 = 64 << 20;
/// The most table bytes a retention may keep: 4 GiB.
pub const MAX_RETAINED_BYTES: u64 = 4 << 30;
/// The byte budget of a stamp that carries none (format 2 records, written
/// before byte budgets existed): no bound, as the builds that wrote them
/// applied them, so a replay of their records ends in the state they did.
pub const UNBOUNDED_RETAINED_BYTES: u64 = u64::MAX;

const _: () = assert!(DEFAULT_RETAINED_KEYS <= MAX_RETAINED_KEYS);
const _: () = assert!(DEFAULT_RETENTION_AGE_MS <= MAX_RETENTION_AGE_MS);
const _: () = assert!(MAX_ENTRY_BYTES <= DEFAULT_RETAINED_BYTES);
const _: () = assert!(DEFAULT_RETAINED_BYTES <= MAX_RETAINED_BYTES);
// A key's length is stored in one byte.
const _: () = assert!(MAX_IDEMPOTENCY_KEY_BYTES <= u8::MAX as usize);

/// The SHA-256 digest of a request (see [`Record::digest`](super::Record::digest)).
pub type RequestDigest = [u8; 32];

/// A client's idempotency key: 1 to [`MAX_IDEMPOTENCY_KEY_BYTES`] printable
/// ASCII characters (`!` to `~`, no spaces), as HTTP headers carry them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IdempotencyKey(Bytes);

impl IdempotencyKey {
    /// Checks `key` against the rules above.
    pub fn new(key: impl Into<Bytes>) -> Result<IdempotencyKey, CommandError> {
        let key = key.into();
        let printable = key.iter().all(|byte| (b'!'..=b'~').contains(byte));
        if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_BYTES || !printable {
            return Err(CommandError::InvalidIdempotencyKey { length: key.len() });
        }
        Ok(IdempotencyKey(key))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("printable ASCII is UTF-8")
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How long the table remembers keys: the primary writes the retention it
/// runs with into every stamp, so replicas agree whatever their own flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// At most this many keys (the oldest are forgotten first).
    pub max_keys: u64,
    /// Keys older than this, by the table's clock, are forgotten.
    pub max_age_ms: u64,
    /// At most this many table bytes (see [`IdempotencyTable::bytes`]; the
    /// oldest keys are forgotten first); at least [`MAX_ENTRY_BYTES`], so
    /// the newest key always stays.
    pub max_bytes: u64,
}

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            max_keys: DEFAULT_RETAINED_KEYS,
            max_age_ms: DEFAULT_RETENTION_AGE_MS,
            max_bytes: DEFAULT_RETAINED_BYTES,
        }
    }
}

impl Retention {
    /// Checks every limit is within its minimum and its maximum (a byte
    /// budget may also be [`UNBOUNDED_RETAINED_BYTES`], as format 2 stamps
    /// are read).
    pub fn validate(&self) -> Result<(), CommandError> {
        let invalid = |reason: String| Err(CommandError::InvalidRetention { reason });
        if !(1..=MAX_RETAINED_KEYS).contains(&self.max_keys) {
            return invalid(format!(
                "max_keys={} (1 to {MAX_RETAINED_KEYS})",
                self.max_keys
            ));
        }
        if !(1..=MAX_RETENTION_AGE_MS).contains(&self.max_age_ms) {
            return invalid(format!(
                "max_age_ms={} (1 to {MAX_RETENTION_AGE_MS})",
                self.max_age_ms
            ));
        }
        let bytes = MAX_ENTRY_BYTES..=MAX_RETAINED_BYTES;
        if !bytes.contains(&self.max_bytes) && self.max_bytes != UNBOUNDED_RETAINED_BYTES {
            return invalid(format!(
                "max_bytes={} ({MAX_ENTRY_BYTES} to {MAX_RETAINED_BYTES})",
                self.max_bytes
            ));
        }
        Ok(())
    }

    /// Appends the retention to a stamp: `max_keys u64 | max_age_ms u64`,
    /// then `max_bytes u64` when `with_bytes` (format 3 records).
    pub(super) fn put(&self, out: &mut BytesMut, with_bytes: bool) {
        out.put_u64_le(self.max_keys);
        out.put_u64_le(self.max_age_ms);
        if with_bytes {
            out.put_u64_le(self.max_bytes);
        }
    }

    /// Reads what [`put`](Self::put) wrote and validates it; without the
    /// byte budget (format 2), the budget is [`UNBOUNDED_RETAINED_BYTES`].
    pub(super) fn take(input: &mut &[u8], with_bytes: bool) -> Result<Retention, CommandError> {
        let truncated = || CommandError::Malformed {
            reason: "truncated idempotency retention".to_owned(),
        };
        let max_keys = take_u64(input).ok_or_else(truncated)?;
        let max_age_ms = take_u64(input).ok_or_else(truncated)?;
        let max_bytes = match with_bytes {
            true => take_u64(input).ok_or_else(truncated)?,
            false => UNBOUNDED_RETAINED_BYTES,
        };
        let retention = Retention {
            max_keys,
            max_age_ms,
            max_bytes,
        };
        retention.validate()?;
        Ok(retention)
    }
}

/// What a record carries to make its write exactly-once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// The client's key.
    pub key: IdempotencyKey,
    /// The primary's wall clock when it prepared the record, in ms since
    /// the Unix epoch: the only time the machine ever sees.
    pub at_ms: u64,
    /// The retention the primary runs with.
    pub retention: Retention,
}

/// The outcome of a remembered write, as a retry is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It applied (`200` with its index and revision).
    Done {
        /// The store revision after it applied (see [`Applied::Done`](super::Applied::Done)).
        revision: Revision,
    },
    /// A condition failed; nothing changed (`412`).
    ConditionFailed {
        /// The key whose condition failed.
        key: Bytes,
        /// Its `mod_revision` then (`None`: absent).
        current: Option<Revision>,
    },
}

/// A remembered key: which request it was used for, where and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remembered {
    /// The digest of the request.
    pub digest: RequestDigest,
    /// The index of the record that applied it.
    pub index: RecordIndex,
    /// The table's clock when it was recorded.
    pub recorded_ms: u64,
    /// How it ended.
    pub outcome: Outcome,
}

/// What the table knows of a key for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// The key is not remembered: the write is new.
    New,
    /// The key was used for this very request: a retry.
    Same(&'a Remembered),
    /// The key was used for a different request.
    Different(&'a Remembered),
}

/// The remembered keys; see the module docs. Persistent collections: a
/// snapshot's checkpoint copies the table in constant time, whatever it
/// remembers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdempotencyTable {
    entries: OrdMap<IdempotencyKey, Remembered>,
    /// The keys in the order they were recorded (ascending index).
    order: Vector<IdempotencyKey>,
    /// The newest stamp's time applied so far.
    clock_ms: u64,
    /// The sum of [`entry_bytes`] over the entries.
    bytes: u64,
}

impl IdempotencyTable {
    /// The number of remembered keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The table's size as retention counts it: per entry, its key, the key
    /// of a remembered failed condition, and [`ENTRY_OVERHEAD_BYTES`].
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The table's clock: the newest stamp applied, in ms since the epoch.
    pub fn clock_ms(&self) -> u64 {
        self.clock_ms
    }

    /// The oldest remembered key and its entry.
    pub fn oldest(&self) -> Option<(&IdempotencyKey, &Remembered)> {
        let key = self.order.front()?;
        Some((key, &self.entries[key]))
    }

    /// What the table knows of `key` for a request with `digest`.
    pub fn lookup(&self, key: &IdempotencyKey, digest: &RequestDigest) -> Lookup<'_> {
        match self.entries.get(key) {
            None => Lookup::New,
            Some(remembered) if remembered.digest == *digest => Lookup::Same(remembered),
            Some(remembered) => Lookup::Different(remembered),
        }
    }

    /// Moves the clock to `stamp`'s time (never backwards) and forgets the
    /// keys its retention no longer covers by age. Runs before the stamped
    /// record's key is looked up, so an expired key is a new write.
    pub(super) fn advance(&mut self, stamp: &Stamp) {
        self.clock_ms = self.clock_ms.max(stamp.at_ms);
        let horizon = self.clock_ms.saturating_sub(stamp.retention.max_age_ms);
        // Entries are recorded at a clock that never goes back, so the
        // oldest come first.
        while let Some(key) = self.order.front() {
            if self.entries[key].recorded_ms > horizon {
                break;
            }
            self.forget_oldest();
        }
    }

    /// Remembers `key` for the record `index` that just applied, then
    /// forgets the oldest keys beyond `retention.max_keys` and
    /// `retention.max_bytes`.
    pub(super) fn record(
        &mut self,
        key: IdempotencyKey,
        digest: RequestDigest,
        index: RecordIndex,
        outcome: Outcome,
        retention: &Retention,
    ) {
        let remembered = Remembered {
            digest,
            index,
            recorded_ms: self.clock_ms,
            outcome,
        };
        self.bytes += entry_bytes(&key, &remembered);
        let previous = self.entries.insert(key.clone(), remembered);
        assert!(previous.is_none(), "a remembered key is recorded again");
        self.order.push_back(key);
        while self.order.len() as u64 > retention.max_keys || self.bytes > retention.max_bytes {
            self.forget_oldest();
        }
    }

    fn forget_oldest(&mut self) {
        if let Some(key) = self.order.pop_front() {
            let remembered = self.entries.remove(&key).expect("ordered keys are entries");
            self.bytes -= entry_bytes(&key, &remembered);
        }
    }

    /// Appends the table to a snapshot: `clock_ms u64 | count u64 | count
    /// × entry`, oldest first, its outcomes with revisions (see the snapshot
    /// format in the `kv::snapshot` module docs).
    pub(super) fn encode(&self, out: &mut BytesMut) {
        out.put_u64_le(self.clock_ms);
        out.put_u64_le(self.order.len() as u64);
        for key in &self.order {
            let remembered = &self.entries[key];
            out.put_u8(key.0.len() as u8);
            out.put_slice(&key.0);
            out.put_slice(&remembered.digest);
            out.put_u64_le(remembered.index.0);
            out.put_u64_le(remembered.recorded_ms);
            match &remembered.outcome {
                Outcome::Done { revision } => {
                    out.put_u8(OUTCOME_DONE);
                    out.put_i64_le(*revision);
                }
                Outcome::ConditionFailed { key, current } => {
                    out.put_u8(OUTCOME_CONDITION_FAILED);
                    out.put_u32_le(key.len() as u32);
                    out.put_slice(key);
                    match current {
                        None => out.put_u8(0),
                        Some(revision) => {
                            out.put_u8(1);
                            out.put_i64_le(*revision);
                        }
                    }
                }
            }
        }
    }

    /// Reads what [`encode`](Self::encode) wrote (or, for
    /// [`TableVersions::Indices`], a table of earlier formats), checking
    /// every entry against the state's `applied_end`, its revisions and the
    /// order the table keeps.
    pub(super) fn decode(
        input: &mut &[u8],
        applied_end: RecordIndex,
        versions: TableVersions,
    ) -> Result<IdempotencyTable, &'static str> {
        let clock_ms = take_u64(input).ok_or("truncated idempotency clock")?;
        let count = take_u64(input).ok_or("truncated idempotency count")?;
        if count > MAX_RETAINED_KEYS {
            return Err("more idempotency keys than any retention keeps");
        }
        let mut table = IdempotencyTable {
            clock_ms,
            ..IdempotencyTable::default()
        };
        let mut previous: Option<(RecordIndex, u64)> = None;
        for _ in 0..count {
            let (key, remembered) = take_entry(input, versions)?;
            if remembered.index >= applied_end {
                return Err("an idempotency key recorded at or past the applied end");
            }
            if remembered.recorded_ms > clock_ms {
                return Err("an idempotency key recorded after the table's clock");
            }
            if let Some((index, recorded_ms)) = previous
                && (remembered.index <= index || remembered.recorded_ms < recorded_ms)
            {
                return Err("idempotency keys out of order");
            }
            previous = Some((remembered.index, remembered.recorded_ms));
            table.bytes += entry_bytes(&key, &remembered);
            if table.entries.insert(key.clone(), remembered).is_some() {
                return Err("an idempotency key appears twice");
            }
            table.order.push_back(key);
        }
        Ok(table)
    }
}

/// How a snapshot's table states its outcomes' versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TableVersions {
    /// Snapshot formats 2 and 3: a failed condition's current version is
    /// the index that last set the key, and a done write has none. They map
    /// as the machine maps index versions: index `i` is revision `i + 1`,
    /// and a write at record `i` answers revision `i + 1`.
    Indices,
    /// Revisions, each within `1..=revision` (the store revision).
    Revisions {
        /// The store revision of the state the table belongs to.
        revision: Revision,
    },
}

impl TableVersions {
    /// A revision read from the table, checked.
    fn take_revision(self, input: &mut &[u8]) -> Result<Revision, &'static str> {
        let Self::Revisions { revision } = self else {
            unreachable!("index versions are mapped, not read as revisions")
        };
        let read = take_u64(input).ok_or("truncated idempotency outcome")? as i64;
        if !(1..=revision).contains(&read) {
            return Err("an idempotency outcome's revision out of bounds");
        }
        Ok(read)
    }
}

/// Revision `index + 1`: where the machine maps an index version.
fn index_revision(index: u64) -> Revision {
    (index as Revision).saturating_add(1)
}

/// What one entry counts for in [`IdempotencyTable::bytes`].
fn entry_bytes(key: &IdempotencyKey, remembered: &Remembered) -> u64 {
    let failed_key = match &remembered.outcome {
        Outcome::Done { .. } => 0,
        Outcome::ConditionFailed { key, .. } => key.len(),
    };
    (key.0.len() + failed_key) as u64 + ENTRY_OVERHEAD_BYTES
}

const OUTCOME_DONE: u8 = 0;
const OUTCOME_CONDITION_FAILED: u8 = 1;

fn take_u64(input: &mut &[u8]) -> Option<u64> {
    (input.len() >= 8).then(|| input.get_u64_le())
}

fn take_entry(
    input: &mut &[u8],
    versions: TableVersions,
) -> Result<(IdempotencyKey, Remembered), &'static str> {
    let length = *input.first().ok_or("truncated idempotency key")? as usize;
    input.advance(1);
    if input.len() < length + 32 + 8 + 8 + 1 {
        return Err("truncated idempotency entry");
    }
    let key = IdempotencyKey::new(Bytes::copy_from_slice(&input[..length]))
        .map_err(|_| "an invalid idempotency key")?;
    input.advance(length);
    let mut digest = [0u8; 32];
    input.copy_to_slice(&mut digest);
    let index = RecordIndex(input.get_u64_le());
    let recorded_ms = input.get_u64_le();
    let outcome = match (input.get_u8(), versions) {
        (OUTCOME_DONE, TableVersions::Indices) => Outcome::Done {
            revision: index_revision(index.0),
        },
        (OUTCOME_DONE, TableVersions::Revisions { .. }) => Outcome::Done {
            revision: versions.take_revision(input)?,
        },
        (OUTCOME_CONDITION_FAILED, _) => take_condition_failed(input, index, versions)?,
        _ => return Err("unknown idempotency outcome"),
    };
    let remembered = Remembered {
        digest,
        index,
        recorded_ms,
        outcome,
    };
    Ok((key, remembered))
}

fn take_condition_failed(
    input: &mut &[u8],
    index: RecordIndex,
    versions: TableVersions,
) -> Result<Outcome, &'static str> {
    if input.len() < 4 {
        return Err("truncated idempotency outcome");
    }
    let length = input.get_u32_le() as usize;
    if length == 0 || length > super::MAX_KEY_BYTES {
        return Err("an invalid key in an idempotency outcome");
    }
    if input.len() < length + 1 {
        return Err("truncated idempotency outcome");
    }
    let key = Bytes::copy_from_slice(&input[..length]);
    input.advance(length);
    let current = match (input.get_u8(), versions) {
        (0, _) => None,
        (1, TableVersions::Indices) => {
            let version = take_u64(input).ok_or("truncated idempotency outcome")?;
            if version >= index.0 {
                return Err("a failed condition's version at or past its record");
            }
            Some(index_revision(version))
        }
        (1, TableVersions::Revisions { .. }) => Some(versions.take_revision(input)?),
        _ => return Err("unknown version presence in an idempotency outcome"),
    };
    Ok(Outcome::ConditionFailed { key, current })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> IdempotencyKey {
        IdempotencyKey::new(Bytes::copy_from_slice(text.as_bytes())).unwrap()
    }

    fn stamp(text: &str, at_ms: u64, max_keys: u64, max_age_ms: u64) -> Stamp {
        Stamp {
            key: key(text),
            at_ms,
            retention: Retention {
                max_keys,
                max_age_ms,
                ..Retention::default()
            },
        }
    }

    /// Applies what the machine does for a new stamped record at `index`.
    fn apply(table: &mut IdempotencyTable, stamp: &Stamp, index: u64) {
        table.advance(stamp);
        assert_eq!(table.lookup(&stamp.key, &[0; 32]), Lookup::New);
        table.record(
            stamp.key.clone(),
            [0; 32],
            RecordIndex(index),
            Outcome::Done { revision: 2 },
            &stamp.retention,
        );
    }

    fn keys(table: &IdempotencyTable) -> Vec<&str> {
        table.order.iter().map(IdempotencyKey::as_str).collect()
    }

    #[test]
    fn keys_are_printable_ascii_within_the_limit() {
        for good in [
            "a",
            "0f8c-11ee",
            "~!",
            &"k".repeat(MAX_IDEMPOTENCY_KEY_BYTES),
        ] {
            assert!(IdempotencyKey::new(good.to_owned()).is_ok(), "{good}");
        }
        let long = "k".repeat(MAX_IDEMPOTENCY_KEY_BYTES + 1);
        for bad in ["", "with space", "tab\t", "é", "\u{7f}", &long] {
            assert_eq!(
                IdempotencyKey::new(bad.to_owned()),
                Err(CommandError::InvalidIdempotencyKey { length: bad.len() }),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn retention_limits_are_checked() {
        assert!(Retention::default().validate().is_ok());
        for (max_keys, max_age_ms, max_bytes) in [
            (0, 1, MAX_ENTRY_BYTES),
            (1, 0, MAX_ENTRY_BYTES),
            (MAX_RETAINED_KEYS + 1, 1, MAX_ENTRY_BYTES),
            (1, MAX_RETENTION_AGE_MS + 1, MAX_ENTRY_BYTES),
            (1, 1, MAX_ENTRY_BYTES - 1),
            (1, 1, MAX_RETAINED_BYTES + 1),
        ] {
            let retention = Retention {
                max_keys,
                max_age_ms,
                max_bytes,
            };
            assert!(retention.validate().is_err(), "{retention:?}");
        }
        for max_bytes in [
            MAX_ENTRY_BYTES,
            MAX_RETAINED_BYTES,
            UNBOUNDED_RETAINED_BYTES,
        ] {
            let retention = Retention {
                max_bytes,
                ..Retention::default()
            };
            assert!(retention.validate().is_ok(), "{retention:?}");
        }
    }

    #[test]
    fn lookup_tells_a_retry_from_a_different_request() {
        let mut table = IdempotencyTable::default();
        let stamp = stamp("k", 10, 10, 1000);
        table.advance(&stamp);
        let failed = Outcome::ConditionFailed {
            key: Bytes::from_static(b"a"),
            current: Some(2),
        };
        table.record(
            stamp.key.clone(),
            [7; 32],
            RecordIndex(4),
            failed.clone(),
            &stamp.retention,
        );
        let Lookup::Same(same) = table.lookup(&key("k"), &[7; 32]) else {
            panic!("a retry");
        };
        assert_eq!((same.index, &same.outcome), (RecordIndex(4), &failed));
        assert!(matches!(
            table.lookup(&key("k"), &[8; 32]),
            Lookup::Different(r) if r.index == RecordIndex(4)
        ));
        assert_eq!(table.lookup(&key("other"), &[7; 32]), Lookup::New);
    }

    #[test]
    fn retention_by_count_forgets_the_oldest_keys() {
        let mut table = IdempotencyTable::default();
        for (index, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
            apply(&mut table, &stamp(name, 100, 3, 1000), index as u64);
        }
        assert_eq!(keys(&table), ["b", "c", "d"]);
        assert_eq!(table.lookup(&key("a"), &[0; 32]), Lookup::New);
        // A smaller retention in a later stamp applies from that record on.
        apply(&mut table, &stamp("e", 100, 1, 1000), 4);
        assert_eq!(keys(&table), ["e"]);
    }

    /// Records `name` at `index`, remembering a failed condition on a key
    /// of `failed_key_bytes` bytes, under a byte budget of `max_bytes`.
    fn apply_failed(
        table: &mut IdempotencyTable,
        name: &str,
        index: u64,
        failed_key_bytes: usize,
        max_bytes: u64,
    ) {
        let retention = Retention {
            max_bytes,
            ..Retention::default()
        };
        let stamp = Stamp {
            key: key(name),
            at_ms: 100,
            retention,
        };
        table.advance(&stamp);
        let failed = Outcome::ConditionFailed {
            key: Bytes::from(vec![b'x'; failed_key_bytes]),
            current: None,
        };
        table.record(stamp.key, [0; 32], RecordIndex(index), failed, &retention);
    }

    #[test]
    fn retention_by_bytes_forgets_the_oldest_keys_and_counts_failed_conditions() {
        let mut table = IdempotencyTable::default();
        let long = "k".repeat(MAX_IDEMPOTENCY_KEY_BYTES);
        // Each entry counts 255 + 1,024 + the overhead: MAX_ENTRY_BYTES.
        for index in 0..3 {
            let name = format!("{index}{}", &long[1..]);
            apply_failed(
                &mut table,
                &name,
                index,
                super::super::MAX_KEY_BYTES,
                2 * MAX_ENTRY_BYTES,
            );
        }
        assert_eq!(
            table.len(),
            2,
            "the budget holds two of the largest entries"
        );
        assert_eq!(table.bytes(), 2 * MAX_ENTRY_BYTES);
        assert_eq!(table.oldest().unwrap().1.index, RecordIndex(1));
        // Small entries fit many more under the same budget; the large ones
        // go first, oldest first.
        for index in 3..10 {
            apply_failed(
                &mut table,
                &format!("s{index}"),
                index,
                1,
                2 * MAX_ENTRY_BYTES,
            );
        }
        // 323 bytes each: both large ones were forgotten to make room.
        assert_eq!(table.len(), 7);
        assert_eq!(table.oldest().unwrap().1.index, RecordIndex(3));
        assert_eq!(table.bytes(), 7 * (3 + ENTRY_OVERHEAD_BYTES));
        // The newest key always stays, whatever the budget.
        apply_failed(
            &mut table,
            "last",
            10,
            super::super::MAX_KEY_BYTES,
            MAX_ENTRY_BYTES,
        );
        assert_eq!(keys(&table), ["last"]);
        assert_eq!(table.bytes(), 4 + 1024 + ENTRY_OVERHEAD_BYTES);
        // Decoding counts the same bytes.
        let mut out = BytesMut::new();
        table.encode(&mut out);
        let versions = TableVersions::Revisions { revision: 1 };
        let decoded = IdempotencyTable::decode(&mut &out[..], RecordIndex(11), versions).unwrap();
        assert_eq!(decoded.bytes(), table.bytes());
    }

    #[test]
    fn retentions_round_trip_with_and_without_a_byte_budget() {
        let retention = Retention {
            max_keys: 7,
            max_age_ms: 9,
            max_bytes: MAX_ENTRY_BYTES + 1,
        };
        for with_bytes in [true, false] {
            let mut out = BytesMut::new();
            retention.put(&mut out, with_bytes);
            assert_eq!(out.len(), if with_bytes { 24 } else { 16 });
            let read = Retention::take(&mut &out[..], with_bytes).unwrap();
            let expected = match with_bytes {
                true => retention,
                false => Retention {
                    max_bytes: UNBOUNDED_RETAINED_BYTES,
                    ..retention
                },
            };
            assert_eq!(read, expected);
            assert!(Retention::take(&mut &out[..out.len() - 1], with_bytes).is_err());
        }
    }

    #[test]
    fn retention_by_age_judges_by_the_stamps_never_by_a_clock_of_its_own() {
        let mut table = IdempotencyTable::default();
        apply(&mut table, &stamp("a", 1000, 10, 500), 0);
        apply(&mut table, &stamp("b", 1400, 10, 500), 1);
        // 500 ms after a: a is forgotten (the age reached max_age), b is not.
        apply(&mut table, &stamp("c", 1500, 10, 500), 2);
        assert_eq!(keys(&table), ["b", "c"]);
        // A primary whose clock is behind moves nothing back: b is judged
        // by the newest stamp (1500), and c's entry keeps that time.
        apply(&mut table, &stamp("d", 1100, 10, 500), 3);
        assert_eq!(table.clock_ms(), 1500);
        assert_eq!(keys(&table), ["b", "c", "d"]);
        assert_eq!(table.oldest().unwrap().1.recorded_ms, 1400);
        apply(&mut table, &stamp("e", 2000, 10, 500), 4);
        assert_eq!(keys(&table), ["e"]);
    }

    #[test]
    fn tables_round_trip_and_every_malformed_entry_is_refused() {
        let mut table = IdempotencyTable::default();
        apply(&mut table, &stamp("a", 1000, 10, 10_000), 2);
        table.advance(&stamp("b", 1200, 10, 10_000));
        let failed = Outcome::ConditionFailed {
            key: Bytes::from_static(&[0xff, 1]),
            current: None,
        };
        table.record(
            key("b"),
            [3; 32],
            RecordIndex(5),
            failed,
            &Retention::default(),
        );
        let failed = Outcome::ConditionFailed {
            key: Bytes::from_static(b"x"),
            current: Some(5),
        };
        table.advance(&stamp("c", 1200, 10, 10_000));
        table.record(
            key("c"),
            [4; 32],
            RecordIndex(6),
            failed,
            &Retention::default(),
        );
        let mut out = BytesMut::new();
        table.encode(&mut out);
        let revisions = TableVersions::Revisions { revision: 5 };
        let decoded = IdempotencyTable::decode(&mut &out[..], RecordIndex(7), revisions).unwrap();
        assert_eq!(decoded, table);
        // A record at or past the applied end cannot be in the table.
        assert!(IdempotencyTable::decode(&mut &out[..], RecordIndex(6), revisions).is_err());
        // Nor a revision past the store's.
        let behind = TableVersions::Revisions { revision: 4 };
        assert!(IdempotencyTable::decode(&mut &out[..], RecordIndex(7), behind).is_err());
        for cut in 0..out.len() {
            assert!(
                IdempotencyTable::decode(&mut &out[..cut], RecordIndex(7), revisions).is_err(),
                "cut {cut}"
            );
        }
    }
}
