//! The key-value commands as log records: a versioned, checksummed binary
//! encoding (all integers little-endian, checksum CRC32C).
//!
//! ```text
//! format 1 (no idempotency key):
//! "CHKV" | format u8 = 1 | body | crc32c u32 (over everything before it)
//! format 3 (a write with an idempotency key):
//! "CHKV" | format u8 = 3 | stamp | body | crc32c u32
//! stamp:  key length u8 (1 to 255) | key (printable ASCII) | at_ms u64
//!         | retain_keys u64 | retain_age_ms u64 | retain_bytes u64
//! format 2 (read only; written by earlier builds): format 3 without
//!         retain_bytes, applied with no byte budget, as those builds did
//! body:   kind u8 | …
//! kind 1 put:    condition | key | value
//! kind 2 delete: condition | key
//! kind 3 batch:  count u32 | count × (op u8: 1 put / 2 delete, condition, key [, value])
//! kind 4 raw:    payload (stamped formats only: a `POST /v1/log` record with a key)
//! kind 5 etcd:   an etcd request (format 1 only; see `etcd_codec`)
//! condition:     0 = none | 1 = absent
//!                | 2 = index u64 (the index that last set the key; written by earlier versions)
//!                | 3 = mod revision i64 (the key's `mod_revision`, `If-Match`)
//! key, value, payload: length u32 | bytes
//! ```
//!
//! A batch is one record, so it applies all or nothing. A record without a
//! stamp is always written in format 1, byte for byte what earlier versions
//! wrote; formats 2 and 3 exist only for stamped records (see
//! [`idempotency`](super::idempotency)). A request's digest is the SHA-256
//! of its body bytes (`kind u8 | …`), the same in both formats.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use sha2::{Digest, Sha256};

use super::etcd::{EtcdCommand, Revision};
use super::etcd_codec;
use super::idempotency::{IdempotencyKey, RequestDigest, Retention, Stamp};
use super::input::Input;
use crate::codec::NewerFormat;
use crate::ids::RecordIndex;

const MAGIC: [u8; 4] = *b"CHKV";
/// Records without a stamp.
const FORMAT_PLAIN: u8 = 1;
/// Records with a stamp whose retention has no byte budget (read only).
const FORMAT_STAMPED_WITHOUT_BYTES: u8 = 2;
/// Records with a stamp.
const FORMAT_STAMPED: u8 = 3;
const KIND_PUT: u8 = 1;
const KIND_DELETE: u8 = 2;
const KIND_BATCH: u8 = 3;
const KIND_RAW: u8 = 4;
const KIND_ETCD: u8 = 5;
const CHECKSUM_BYTES: usize = 4;

/// The longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// The most operations in one batch.
pub const MAX_BATCH_OPERATIONS: usize = 1024;

/// What must hold of a key for an operation to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Nothing (an unconditional write).
    None,
    /// The key does not exist (`If-None-Match: *`).
    Absent,
    /// The key exists and the record at this index last set it: the
    /// condition earlier versions wrote (their versions were indices). Still
    /// applied as written, so replaying their records gives what they gave.
    Version(RecordIndex),
    /// The key exists and its `mod_revision` is this (`If-Match: "N"`):
    /// etcd's `Compare(MOD, =, N)` on a key that exists.
    ModRevision(Revision),
}

/// One change to one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    /// Sets `key` to `value`.
    Put {
        /// The key.
        key: Bytes,
        /// The new value.
        value: Bytes,
        /// What must hold first.
        condition: Condition,
    },
    /// Removes `key` (a no-op if absent and unconditional).
    Delete {
        /// The key.
        key: Bytes,
        /// What must hold first.
        condition: Condition,
    },
}

impl Operation {
    /// The key this operation changes.
    pub fn key(&self) -> &Bytes {
        match self {
            Operation::Put { key, .. } | Operation::Delete { key, .. } => key,
        }
    }

    /// Its condition.
    pub fn condition(&self) -> Condition {
        match self {
            Operation::Put { condition, .. } | Operation::Delete { condition, .. } => *condition,
        }
    }
}

/// One log record of the key-value machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// One operation.
    Single(Operation),
    /// Several operations on distinct keys, all or nothing.
    Batch(Vec<Operation>),
}

/// A command that cannot be encoded or a record that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// A key that is empty or longer than [`MAX_KEY_BYTES`].
    #[error(
        "invalid key: length_bytes={length} max_bytes={MAX_KEY_BYTES} (keys are 1 to {MAX_KEY_BYTES} bytes)"
    )]
    InvalidKey {
        /// The key's length.
        length: usize,
    },
    /// A batch that is empty, too long, or names a key twice.
    #[error("invalid batch: {reason}")]
    InvalidBatch {
        /// What is wrong.
        reason: String,
    },
    /// Bytes that are not a command of this format.
    #[error("malformed key-value record: {reason}")]
    Malformed {
        /// What is wrong.
        reason: String,
    },
    /// An idempotency key that is empty, too long or not printable ASCII.
    #[error(
        "invalid idempotency key: length_bytes={length} max_bytes={max} (1 to {max} printable ASCII characters, no spaces)",
        max = super::idempotency::MAX_IDEMPOTENCY_KEY_BYTES
    )]
    InvalidIdempotencyKey {
        /// The key's length.
        length: usize,
    },
    /// A retention outside its limits.
    #[error("invalid idempotency retention: {reason}")]
    InvalidRetention {
        /// What is wrong.
        reason: String,
    },
    /// A raw payload without a stamp: it is its own record, not a command.
    #[error("invalid record: a raw payload is wrapped only with an idempotency key")]
    UnstampedRaw,
    /// An etcd request with an idempotency stamp (etcd has no such key).
    #[error("invalid record: an etcd request carries no idempotency key")]
    StampedEtcd,
}

/// What a record does: a key-value command, or a raw payload the machine
/// does not interpret (a `POST /v1/log` append that carries an idempotency
/// key, so the key can be remembered).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// A command.
    Command(Command),
    /// A raw payload.
    Raw(Bytes),
    /// An etcd request, applied as one transaction.
    Etcd(EtcdCommand),
}

/// One log record of the key-value machine: a body and, for an
/// exactly-once write, the stamp with its idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The idempotency stamp (`None`: an ordinary write, format 1).
    pub stamp: Option<Stamp>,
    /// What the record does.
    pub body: Body,
}

impl Record {
    /// The prefix every record of the machine begins with, in every format
    /// and kind (see [`is_reserved`](Self::is_reserved)).
    pub const PREFIX: &'static [u8] = &MAGIC;

    /// Whether `bytes` lie in the machine's own record space: they begin
    /// with [`PREFIX`](Self::PREFIX), whatever follows. Every record the
    /// machine reads as its own begins so (the envelope checks it first),
    /// including formats and kinds a later build adds; bytes that do not
    /// are skipped as not its own. A raw append of such bytes could forge
    /// a key-value write, now or after an upgrade, so the service refuses
    /// it.
    pub fn is_reserved(bytes: &[u8]) -> bool {
        bytes.starts_with(Self::PREFIX)
    }

    /// The record bytes: format 1 without a stamp, format 3 with one.
    /// Refuses a command that breaks the limits, a stamp outside its
    /// limits, and a raw payload without a stamp.
    pub fn encode(&self) -> Result<Bytes, CommandError> {
        validate_body(&self.body)?;
        // One buffer of about the record's size: the value is copied once
        // and no buffer grows (a put's record is most of its allocations).
        let room = self.encoded_len_hint();
        let mut out = BytesMut::with_capacity(room);
        out.put_slice(&MAGIC);
        match &self.stamp {
            None if matches!(self.body, Body::Raw(_)) => return Err(CommandError::UnstampedRaw),
            None => out.put_u8(FORMAT_PLAIN),
            Some(_) if matches!(self.body, Body::Etcd(_)) => return Err(CommandError::StampedEtcd),
            Some(stamp) => {
                stamp.retention.validate()?;
                out.put_u8(FORMAT_STAMPED);
                put_stamp(&mut out, stamp);
            }
        }
        put_body(&mut out, &self.body);
        let crc = crc32c::crc32c(&out);
        out.put_u32_le(crc);
        debug_assert!(
            out.len() <= room,
            "record of {} bytes, {room} estimated",
            out.len()
        );
        Ok(out.freeze())
    }

    /// An upper estimate of [`encode`](Self::encode)'s length.
    fn encoded_len_hint(&self) -> usize {
        const STAMP_FIXED: usize = 1 + 8 + 3 * 8;
        let stamp = self
            .stamp
            .as_ref()
            .map_or(0, |stamp| STAMP_FIXED + stamp.key.as_bytes().len());
        let body = match &self.body {
            Body::Command(command) => {
                let operations: usize = command
                    .operations()
                    .iter()
                    .map(|operation| {
                        let value = match operation {
                            Operation::Put { value, .. } => 4 + value.len(),
                            Operation::Delete { .. } => 0,
                        };
                        OPERATION_FIXED + operation.key().len() + value
                    })
                    .sum();
                1 + 4 + operations
            }
            Body::Raw(payload) => 1 + 4 + payload.len(),
            Body::Etcd(command) => 1 + etcd_codec::encoded_len(command),
        };
        MAGIC.len() + 1 + stamp + body + CHECKSUM_BYTES
    }

    /// Decodes a record of either format, checking its checksum, every
    /// length and the limits. Keys and values are copied out of `record`.
    pub fn decode(record: &[u8]) -> Result<Record, CommandError> {
        Record::decode_from(record, None)
    }

    /// [`decode`](Self::decode), with keys and values slices of `record`'s
    /// buffer instead of copies: they keep all of it alive, so `record`
    /// should be a buffer of its own, not a slice of a larger one.
    pub fn decode_shared(record: &Bytes) -> Result<Record, CommandError> {
        Record::decode_from(record, Some(record))
    }

    fn decode_from(record: &[u8], buffer: Option<&Bytes>) -> Result<Record, CommandError> {
        let malformed = |reason: &str| CommandError::Malformed {
            reason: reason.to_owned(),
        };
        let formats = [FORMAT_PLAIN, FORMAT_STAMPED_WITHOUT_BYTES, FORMAT_STAMPED];
        let (format, body) = open_envelope(record, &MAGIC, &formats, 1, "key-value record")
            .map_err(|reason| malformed(&reason))?;
        let mut input = Input::new(body, buffer);
        let stamp = match format {
            FORMAT_STAMPED => Some(take_stamp(&mut input, true)?),
            FORMAT_STAMPED_WITHOUT_BYTES => Some(take_stamp(&mut input, false)?),
            _ => None,
        };
        let body = take_body(&mut input)?;
        if !input.is_empty() {
            return Err(malformed("trailing bytes"));
        }
        if stamp.is_none() && matches!(body, Body::Raw(_)) {
            return Err(malformed("a raw payload in a record without a stamp"));
        }
        if stamp.is_some() && matches!(body, Body::Etcd(_)) {
            return Err(malformed("an etcd request in a record with a stamp"));
        }
        if let Body::Command(command) = &body {
            command.validate()?;
        }
        Ok(Record { stamp, body })
    }

    /// The digest of the request this record carries out: SHA-256 of its
    /// body bytes, so two requests share it exactly when they are the same
    /// operations on the same keys with the same values and conditions (a
    /// single put and a batch of one put differ; a raw payload differs from
    /// every command).
    pub fn digest(&self) -> Result<RequestDigest, CommandError> {
        validate_body(&self.body)?;
        let mut body = BytesMut::new();
        put_body(&mut body, &self.body);
        Ok(Sha256::digest(body).into())
    }
}

impl Command {
    /// The operations, in order.
    pub fn operations(&self) -> &[Operation] {
        match self {
            Command::Single(operation) => std::slice::from_ref(operation),
            Command::Batch(operations) => operations,
        }
    }

    /// Checks the limits a record must meet before it is appended.
    pub fn validate(&self) -> Result<(), CommandError> {
        if let Command::Batch(operations) = self {
            if operations.is_empty() || operations.len() > MAX_BATCH_OPERATIONS {
                return Err(CommandError::InvalidBatch {
                    reason: format!(
                        "operations={} (1 to {MAX_BATCH_OPERATIONS})",
                        operations.len()
                    ),
                });
            }
            let mut keys: Vec<&Bytes> = operations.iter().map(Operation::key).collect();
            keys.sort();
            if keys.windows(2).any(|pair| pair[0] == pair[1]) {
                return Err(CommandError::InvalidBatch {
                    reason: "a key appears twice".into(),
                });
            }
        }
        for operation in self.operations() {
            let length = operation.key().len();
            if length == 0 || length > MAX_KEY_BYTES {
                return Err(CommandError::InvalidKey { length });
            }
        }
        Ok(())
    }

    /// The record bytes (format 1); refuses a command that breaks the limits.
    pub fn encode(&self) -> Result<Bytes, CommandError> {
        self.validate()?;
        let mut out = BytesMut::new();
        out.put_slice(&MAGIC);
        out.put_u8(FORMAT_PLAIN);
        put_command_body(&mut out, self);
        let crc = crc32c::crc32c(&out);
        out.put_u32_le(crc);
        Ok(out.freeze())
    }

    /// Decodes the command of a record of either format (a stamp is
    /// ignored), checking its checksum, every length and the limits.
    pub fn decode(record: &[u8]) -> Result<Command, CommandError> {
        match Record::decode(record)?.body {
            Body::Command(command) => Ok(command),
            Body::Raw(_) | Body::Etcd(_) => Err(CommandError::Malformed {
                reason: "not a key-value command".into(),
            }),
        }
    }
}

impl EtcdCommand {
    /// The log record of this request: format 1, body kind 5.
    pub fn encode(&self) -> Bytes {
        Record {
            stamp: None,
            body: Body::Etcd(self.clone()),
        }
        .encode()
        .expect("an unstamped etcd request always encodes")
    }

    /// Decodes a record that holds an etcd request.
    pub fn decode(record: &[u8]) -> Result<EtcdCommand, CommandError> {
        match Record::decode(record)?.body {
            Body::Etcd(command) => Ok(command),
            Body::Raw(_) | Body::Command(_) => Err(CommandError::Malformed {
                reason: "not an etcd request".into(),
            }),
        }
    }
}

/// An operation's encoded bytes besides its key and value: kind, condition
/// tag and number, the key's length.
const OPERATION_FIXED: usize = 1 + 1 + 8 + 4;

/// Checks a body against the limits before it is written.
fn validate_body(body: &Body) -> Result<(), CommandError> {
    match body {
        Body::Command(command) => command.validate(),
        Body::Raw(_) | Body::Etcd(_) => Ok(()),
    }
}

/// Writes the body bytes, `kind u8 | …` ([`validate_body`] first).
fn put_body(out: &mut BytesMut, body: &Body) {
    match body {
        Body::Command(command) => put_command_body(out, command),
        Body::Raw(payload) => {
            out.put_u8(KIND_RAW);
            put_bytes(out, payload);
        }
        Body::Etcd(command) => {
            out.put_u8(KIND_ETCD);
            etcd_codec::put_command(out, command);
        }
    }
}

fn put_command_body(out: &mut BytesMut, command: &Command) {
    match command {
        Command::Single(operation) => {
            out.put_u8(kind_of(operation));
            put_operation_body(out, operation);
        }
        Command::Batch(operations) => {
            out.put_u8(KIND_BATCH);
            out.put_u32_le(operations.len() as u32);
            for operation in operations {
                out.put_u8(kind_of(operation));
                put_operation_body(out, operation);
            }
        }
    }
}

fn take_body(input: &mut Input) -> Result<Body, CommandError> {
    let body = match take_u8(input)? {
        KIND_BATCH => {
            let count = take_u32(input)? as usize;
            if count > MAX_BATCH_OPERATIONS {
                return Err(CommandError::Malformed {
                    reason: "batch longer than the limit".into(),
                });
            }
            let mut operations = Vec::with_capacity(count);
            for _ in 0..count {
                let kind = take_u8(input)?;
                operations.push(take_operation(input, kind)?);
            }
            Body::Command(Command::Batch(operations))
        }
        KIND_RAW => Body::Raw(input.take_bytes()?),
        KIND_ETCD => Body::Etcd(etcd_codec::take_command(input)?),
        kind => Body::Command(Command::Single(take_operation(input, kind)?)),
    };
    Ok(body)
}

fn put_stamp(out: &mut BytesMut, stamp: &Stamp) {
    let key = stamp.key.as_bytes();
    out.put_u8(key.len() as u8);
    out.put_slice(key);
    out.put_u64_le(stamp.at_ms);
    stamp.retention.put(out, true);
}

/// A stamp; `with_bytes`: its retention carries a byte budget (format 3).
fn take_stamp(input: &mut &[u8], with_bytes: bool) -> Result<Stamp, CommandError> {
    let length = take_u8(input)? as usize;
    if input.len() < length + 8 {
        return Err(truncated());
    }
    let key = IdempotencyKey::new(Bytes::copy_from_slice(&input[..length]))?;
    input.advance(length);
    let at_ms = input.get_u64_le();
    let retention = Retention::take(input, with_bytes)?;
    Ok(Stamp {
        key,
        at_ms,
        retention,
    })
}

/// Checks the envelope shared by the key-value encodings (`magic | format u8
/// | body | crc32c u32` over everything before the checksum) and returns the
/// format, one of `formats`, and the body, which holds at least `min_body`
/// bytes. A format above every one of `formats` is named as a newer build's
/// (`what` says what was being read).
pub(super) fn open_envelope<'a>(
    bytes: &'a [u8],
    magic: &[u8; 4],
    formats: &[u8],
    min_body: usize,
    what: &str,
) -> Result<(u8, &'a [u8]), String> {
    if bytes.len() < magic.len() + 1 + min_body + CHECKSUM_BYTES {
        return Err("shorter than a header".to_owned());
    }
    let (covered, stored) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
    let stored = u32::from_le_bytes(stored.try_into().expect("four bytes"));
    if crc32c::crc32c(covered) != stored {
        return Err("checksum mismatch".to_owned());
    }
    if covered[..magic.len()] != *magic {
        return Err("bad magic".to_owned());
    }
    let format = covered[magic.len()];
    let newest = formats.iter().copied().max().unwrap_or(0);
    if let Some(newer) = NewerFormat::check(what, format.into(), newest.into()) {
        return Err(newer.to_string());
    }
    if !formats.contains(&format) {
        return Err(format!("unsupported format={format}"));
    }
    Ok((format, &covered[magic.len() + 1..]))
}

fn kind_of(operation: &Operation) -> u8 {
    match operation {
        Operation::Put { .. } => KIND_PUT,
        Operation::Delete { .. } => KIND_DELETE,
    }
}

fn put_operation_body(out: &mut BytesMut, operation: &Operation) {
    match operation.condition() {
        Condition::None => out.put_u8(0),
        Condition::Absent => out.put_u8(1),
        Condition::Version(version) => {
            out.put_u8(2);
            out.put_u64_le(version.0);
        }
        Condition::ModRevision(revision) => {
            out.put_u8(3);
            out.put_i64_le(revision);
        }
    }
    put_bytes(out, operation.key());
    if let Operation::Put { value, .. } = operation {
        put_bytes(out, value);
    }
}

fn put_bytes(out: &mut BytesMut, bytes: &[u8]) {
    out.put_u32_le(bytes.len() as u32);
    out.put_slice(bytes);
}

fn truncated() -> CommandError {
    CommandError::Malformed {
        reason: "truncated".into(),
    }
}

fn take_u8(input: &mut &[u8]) -> Result<u8, CommandError> {
    if input.is_empty() {
        return Err(truncated());
    }
    Ok(input.get_u8())
}

fn take_u32(input: &mut &[u8]) -> Result<u32, CommandError> {
    if input.len() < 4 {
        return Err(truncated());
    }
    Ok(input.get_u32_le())
}

fn take_operation(input: &mut Input, kind: u8) -> Result<Operation, CommandError> {
    let condition = match take_u8(input)? {
        0 => Condition::None,
        1 => Condition::Absent,
        2 => {
            if input.len() < 8 {
                return Err(truncated());
            }
            Condition::Version(RecordIndex(input.get_u64_le()))
        }
        3 => {
            if input.len() < 8 {
                return Err(truncated());
            }
            Condition::ModRevision(input.get_i64_le())
        }
        _ => {
            return Err(CommandError::Malformed {
                reason: "unknown condition".into(),
            });
        }
    };
    let key = input.take_bytes()?;
    match kind {
        KIND_PUT => Ok(Operation::Put {
            key,
            value: input.take_bytes()?,
            condition,
        }),
        KIND_DELETE => Ok(Operation::Delete { key, condition }),
        _ => Err(CommandError::Malformed {
            reason: "unknown operation".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// `encoded` with its format byte set to `format` and its checksum
    /// recomputed: what a newer build would write.
    fn in_format(encoded: &[u8], format: u8) -> Vec<u8> {
        let mut covered = encoded[..encoded.len() - CHECKSUM_BYTES].to_vec();
        covered[MAGIC.len()] = format;
        let crc = crc32c::crc32c(&covered);
        covered.extend_from_slice(&crc.to_le_bytes());
        covered
    }

    #[test]
    fn a_newer_record_or_snapshot_format_is_said_in_one_line() {
        let command = Command::Single(Operation::Delete {
            key: Bytes::from_static(b"k"),
            condition: Condition::None,
        });
        let newer = in_format(&command.encode().unwrap(), FORMAT_STAMPED + 1);
        let error = Record::decode(&newer).unwrap_err().to_string();
        assert_eq!(
            error,
            format!(
                "malformed key-value record: key-value record written by a newer Chorus: \
                 format {}; this build reads up to {FORMAT_STAMPED}",
                FORMAT_STAMPED + 1
            )
        );
        // Below every format written: not said to be a newer build's.
        let unknown = Record::decode(&in_format(&command.encode().unwrap(), 0)).unwrap_err();
        assert!(
            unknown.to_string().ends_with("unsupported format=0"),
            "{unknown}"
        );

        let snapshot = crate::kv::KvState::default().encode_snapshot();
        let newest = super::super::snapshot::FORMAT_LEASES;
        let newer = in_format(&snapshot, newest + 1);
        let error = crate::kv::KvState::decode_snapshot(&newer).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "malformed key-value snapshot: key-value snapshot written by a newer Chorus: \
                 format {}; this build reads up to {newest}",
                newest + 1
            )
        );
    }

    fn condition() -> impl Strategy<Value = Condition> {
        prop_oneof![
            Just(Condition::None),
            Just(Condition::Absent),
            any::<u64>().prop_map(|v| Condition::Version(RecordIndex(v))),
            any::<i64>().prop_map(Condition::ModRevision),
        ]
    }

    fn operation() -> impl Strategy<Value = Operation> {
        let key = prop::collection::vec(any::<u8>(), 1..16).prop_map(Bytes::from);
        let value = prop::collection::vec(any::<u8>(), 0..32).prop_map(Bytes::from);
        prop_oneof![
            (key.clone(), value, condition()).prop_map(|(key, value, condition)| Operation::Put {
                key,
                value,
                condition
            }),
            (key, condition()).prop_map(|(key, condition)| Operation::Delete { key, condition }),
        ]
    }

    fn command() -> impl Strategy<Value = Command> {
        prop_oneof![
            operation().prop_map(Command::Single),
            prop::collection::vec(operation(), 1..8).prop_map(|operations| {
                // Distinct keys: suffix each with its position.
                Command::Batch(
                    operations
                        .into_iter()
                        .enumerate()
                        .map(|(i, op)| with_key_suffix(op, i as u8))
                        .collect(),
                )
            }),
        ]
    }

    fn with_key_suffix(operation: Operation, suffix: u8) -> Operation {
        let extend = |key: &Bytes| {
            let mut key = key.to_vec();
            key.extend_from_slice(&[0xff, suffix]);
            Bytes::from(key)
        };
        match operation {
            Operation::Put {
                key,
                value,
                condition,
            } => Operation::Put {
                key: extend(&key),
                value,
                condition,
            },
            Operation::Delete { key, condition } => Operation::Delete {
                key: extend(&key),
                condition,
            },
        }
    }

    fn stamp() -> impl Strategy<Value = Stamp> {
        let key = prop::collection::vec(
            b'!'..=b'~',
            1..=super::super::idempotency::MAX_IDEMPOTENCY_KEY_BYTES,
        );
        let max_keys = 1..=super::super::idempotency::MAX_RETAINED_KEYS;
        let max_age_ms = 1..=super::super::idempotency::MAX_RETENTION_AGE_MS;
        let max_bytes = super::super::idempotency::MAX_ENTRY_BYTES
            ..=super::super::idempotency::MAX_RETAINED_BYTES;
        (key, any::<u64>(), (max_keys, max_age_ms, max_bytes)).prop_map(
            |(key, at_ms, (max_keys, max_age_ms, max_bytes))| Stamp {
                key: IdempotencyKey::new(key).unwrap(),
                at_ms,
                retention: Retention {
                    max_keys,
                    max_age_ms,
                    max_bytes,
                },
            },
        )
    }

    fn record() -> impl Strategy<Value = Record> {
        let raw = prop::collection::vec(any::<u8>(), 0..32)
            .prop_map(|payload| Body::Raw(Bytes::from(payload)));
        let body = prop_oneof![command().prop_map(Body::Command), raw];
        (prop::option::of(stamp()), body).prop_map(|(stamp, body)| match (stamp, body) {
            // A raw payload travels only with a stamp.
            (None, Body::Raw(_)) => Record {
                stamp: None,
                body: Body::Command(Command::Single(Operation::Delete {
                    key: Bytes::from_static(b"k"),
                    condition: Condition::None,
                })),
            },
            (stamp, body) => Record { stamp, body },
        })
    }

    proptest! {
        #[test]
        fn records_round_trip(record in record()) {
            let encoded = record.encode().unwrap();
            prop_assert_eq!(encoded[4], if record.stamp.is_some() { FORMAT_STAMPED } else { FORMAT_PLAIN });
            prop_assert_eq!(Record::decode(&encoded).unwrap(), record.clone());
            prop_assert_eq!(Record::decode_shared(&encoded).unwrap(), record.clone());
            prop_assert!(Record::is_reserved(&encoded));
            // The digest is the request's, whatever the stamp.
            let unstamped = Record { stamp: None, body: record.body.clone() };
            prop_assert_eq!(record.digest().unwrap(), unstamped.digest().unwrap());
            if let Body::Command(command) = &record.body {
                prop_assert_eq!(&Command::decode(&encoded).unwrap(), command);
            }
        }

        #[test]
        fn every_bit_flip_of_a_record_is_refused(record in record(), bit in any::<prop::sample::Index>()) {
            let mut encoded = record.encode().unwrap().to_vec();
            let bit = bit.index(encoded.len() * 8);
            encoded[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(Record::decode(&encoded).is_err());
        }

        #[test]
        fn every_truncation_of_a_record_is_refused(record in record(), cut in any::<prop::sample::Index>()) {
            let encoded = record.encode().unwrap();
            let cut = cut.index(encoded.len());
            prop_assert!(Record::decode(&encoded[..cut]).is_err());
        }

        #[test]
        fn only_reserved_bytes_decode(record in record(), position in 0..MAGIC.len(), byte in any::<u8>()) {
            // A valid record with one byte of its prefix replaced, re-signed
            // so that only the prefix can refuse it.
            let mut encoded = record.encode().unwrap().to_vec();
            encoded[position] = byte;
            let encoded = resigned(encoded);
            prop_assert_eq!(Record::is_reserved(&encoded), byte == MAGIC[position]);
            if !Record::is_reserved(&encoded) {
                prop_assert!(Record::decode(&encoded).is_err());
            }
        }

        #[test]
        fn commands_round_trip(command in command()) {
            let encoded = command.encode().unwrap();
            prop_assert_eq!(Command::decode(&encoded).unwrap(), command);
        }

        #[test]
        fn every_bit_flip_is_refused(command in command(), bit in any::<prop::sample::Index>()) {
            let mut encoded = command.encode().unwrap().to_vec();
            let bit = bit.index(encoded.len() * 8);
            encoded[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(Command::decode(&encoded).is_err());
        }

        #[test]
        fn every_truncation_is_refused(command in command(), cut in any::<prop::sample::Index>()) {
            let encoded = command.encode().unwrap();
            let cut = cut.index(encoded.len());
            prop_assert!(Command::decode(&encoded[..cut]).is_err());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = Command::decode(&bytes);
        }
    }

    /// Re-signs `bytes` after an edit, so the decoder sees past the checksum.
    fn resigned(mut bytes: Vec<u8>) -> Vec<u8> {
        let covered = bytes.len() - CHECKSUM_BYTES;
        let crc = crc32c::crc32c(&bytes[..covered]);
        bytes[covered..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    #[test]
    fn format_1_records_are_unchanged_and_stamps_are_checked_on_decode() {
        // A put of a = "1", as format 1 always wrote it.
        let mut plain = b"CHKV\x01\x01\x00\x01\0\0\0a\x01\0\0\x001".to_vec();
        plain.extend_from_slice(&crc32c::crc32c(&plain).to_le_bytes());
        let put = Command::Single(Operation::Put {
            key: Bytes::from_static(b"a"),
            value: Bytes::from_static(b"1"),
            condition: Condition::None,
        });
        assert_eq!(&put.encode().unwrap()[..], &plain[..]);
        assert_eq!(Command::decode(&plain).unwrap(), put);

        let stamp = Stamp {
            key: IdempotencyKey::new("k-1").unwrap(),
            at_ms: 7,
            retention: Retention::default(),
        };
        let record = Record {
            stamp: Some(stamp),
            body: Body::Command(put),
        };
        let encoded = record.encode().unwrap().to_vec();
        let malformed = |bytes: Vec<u8>| Record::decode(&resigned(bytes)).unwrap_err();
        // The key's length byte, then one of its characters.
        let mut empty_key = encoded.clone();
        empty_key[5] = 0;
        assert!(Record::decode(&resigned(empty_key)).is_err());
        let mut space = encoded.clone();
        space[6] = b' ';
        assert!(matches!(
            malformed(space),
            CommandError::InvalidIdempotencyKey { length: 3 }
        ));
        // retain_keys = 0, then retain_age_ms = 0, then retain_bytes = 0.
        let retain_keys = 5 + 1 + 3 + 8;
        let mut no_keys = encoded.clone();
        no_keys[retain_keys..retain_keys + 8].copy_from_slice(&0u64.to_le_bytes());
        assert!(matches!(
            malformed(no_keys),
            CommandError::InvalidRetention { .. }
        ));
        let mut no_age = encoded.clone();
        no_age[retain_keys + 8..retain_keys + 16].copy_from_slice(&0u64.to_le_bytes());
        assert!(matches!(
            malformed(no_age),
            CommandError::InvalidRetention { .. }
        ));
        let mut no_bytes = encoded.clone();
        no_bytes[retain_keys + 16..retain_keys + 24].copy_from_slice(&0u64.to_le_bytes());
        assert!(matches!(
            malformed(no_bytes),
            CommandError::InvalidRetention { .. }
        ));
        // A raw kind in format 1.
        let mut raw = b"CHKV\x01\x04\x01\0\0\0x".to_vec();
        raw.extend_from_slice(&[0; 4]);
        assert!(matches!(malformed(raw), CommandError::Malformed { .. }));
        let unstamped = Record {
            stamp: None,
            body: Body::Raw(Bytes::from_static(b"x")),
        };
        assert_eq!(unstamped.encode(), Err(CommandError::UnstampedRaw));
        let stamped_raw = Record {
            stamp: record.stamp.clone(),
            body: Body::Raw(Bytes::from_static(b"x")),
        };
        let raw = stamped_raw.encode().unwrap();
        assert!(Command::decode(&raw).is_err());
        assert_ne!(stamped_raw.digest(), record.digest());
    }

    #[test]
    fn format_2_records_still_decode_with_no_byte_budget() {
        // A stamped put of a = "1" with key "k-1", at 7 ms, retaining 3
        // keys for 9 ms, as format 2 wrote it.
        let mut format_2 = b"CHKV\x02\x03k-1".to_vec();
        for field in [7u64, 3, 9] {
            format_2.extend_from_slice(&field.to_le_bytes());
        }
        format_2.extend_from_slice(b"\x01\x00\x01\0\0\0a\x01\0\0\x001");
        let format_2 = resigned([format_2, vec![0; CHECKSUM_BYTES]].concat());
        let decoded = Record::decode(&format_2).unwrap();
        let stamp = decoded.stamp.expect("a stamp");
        assert_eq!(stamp.key.as_str(), "k-1");
        assert_eq!(stamp.at_ms, 7);
        assert_eq!(
            stamp.retention,
            Retention {
                max_keys: 3,
                max_age_ms: 9,
                max_bytes: super::super::idempotency::UNBOUNDED_RETAINED_BYTES,
            }
        );
        // Written again, it is format 3, with the budget.
        let rewritten = Record {
            stamp: Some(stamp),
            body: decoded.body,
        }
        .encode()
        .unwrap();
        assert_eq!(rewritten[4], FORMAT_STAMPED);
        assert_eq!(rewritten.len(), format_2.len() + 8);
    }

    #[test]
    fn limits_are_refused_by_name() {
        let put = |key: &[u8]| Operation::Put {
            key: Bytes::copy_from_slice(key),
            value: Bytes::new(),
            condition: Condition::None,
        };
        let empty_key = Command::Single(put(b"")).encode().unwrap_err();
        assert_eq!(empty_key, CommandError::InvalidKey { length: 0 });
        let long_key = Command::Single(put(&[b'k'; MAX_KEY_BYTES + 1])).encode();
        assert!(matches!(long_key, Err(CommandError::InvalidKey { .. })));
        let twice = Command::Batch(vec![put(b"a"), put(b"a")])
            .encode()
            .unwrap_err();
        assert!(twice.to_string().contains("a key appears twice"), "{twice}");
        let empty = Command::Batch(Vec::new()).encode().unwrap_err();
        assert!(matches!(empty, CommandError::InvalidBatch { .. }));
    }
}
