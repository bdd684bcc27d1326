//! The key-value commands as log records: a versioned, checksummed binary
//! encoding (all integers little-endian, checksum CRC32C).
//!
//! ```text
//! "CHKV" | format u8 = 1 | kind u8 | body | crc32c u32 (over everything before it)
//! kind 1 put:    condition | key | value
//! kind 2 delete: condition | key
//! kind 3 batch:  count u32 | count × (op u8: 1 put / 2 delete, condition, key [, value])
//! condition:     0 = none | 1 = absent | 2 = version u64 (the index that last set the key)
//! key, value:    length u32 | bytes
//! ```
//!
//! A batch is one record, so it applies all or nothing.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::ids::RecordIndex;

const MAGIC: [u8; 4] = *b"CHKV";
const FORMAT: u8 = 1;
const KIND_PUT: u8 = 1;
const KIND_DELETE: u8 = 2;
const KIND_BATCH: u8 = 3;
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
    /// The key exists at this version (`If-Match: "N"`).
    Version(RecordIndex),
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

    /// The record bytes; refuses a command that breaks the limits.
    pub fn encode(&self) -> Result<Bytes, CommandError> {
        self.validate()?;
        let mut out = BytesMut::new();
        out.put_slice(&MAGIC);
        out.put_u8(FORMAT);
        match self {
            Command::Single(operation) => {
                out.put_u8(kind_of(operation));
                put_operation_body(&mut out, operation);
            }
            Command::Batch(operations) => {
                out.put_u8(KIND_BATCH);
                out.put_u32_le(operations.len() as u32);
                for operation in operations {
                    out.put_u8(kind_of(operation));
                    put_operation_body(&mut out, operation);
                }
            }
        }
        let crc = crc32c::crc32c(&out);
        out.put_u32_le(crc);
        Ok(out.freeze())
    }

    /// Decodes a record, checking its checksum, every length and the limits.
    pub fn decode(record: &[u8]) -> Result<Command, CommandError> {
        let malformed = |reason: &str| CommandError::Malformed {
            reason: reason.to_owned(),
        };
        let mut input = open_envelope(record, &MAGIC, FORMAT, 1).map_err(malformed)?;
        let command = match input.get_u8() {
            KIND_BATCH => {
                let count = take_u32(&mut input)? as usize;
                if count > MAX_BATCH_OPERATIONS {
                    return Err(malformed("batch longer than the limit"));
                }
                let mut operations = Vec::with_capacity(count);
                for _ in 0..count {
                    let kind = take_u8(&mut input)?;
                    operations.push(take_operation(&mut input, kind)?);
                }
                Command::Batch(operations)
            }
            kind => Command::Single(take_operation(&mut input, kind)?),
        };
        if !input.is_empty() {
            return Err(malformed("trailing bytes"));
        }
        command.validate()?;
        Ok(command)
    }
}

/// Checks the envelope shared by the key-value encodings (`magic | format u8
/// | body | crc32c u32` over everything before the checksum) and returns the
/// body, which holds at least `min_body` bytes.
pub(super) fn open_envelope<'a>(
    bytes: &'a [u8],
    magic: &[u8; 4],
    format: u8,
    min_body: usize,
) -> Result<&'a [u8], &'static str> {
    if bytes.len() < magic.len() + 1 + min_body + CHECKSUM_BYTES {
        return Err("shorter than a header");
    }
    let (covered, stored) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
    let stored = u32::from_le_bytes(stored.try_into().expect("four bytes"));
    if crc32c::crc32c(covered) != stored {
        return Err("checksum mismatch");
    }
    if covered[..magic.len()] != *magic {
        return Err("bad magic");
    }
    if covered[magic.len()] != format {
        return Err("unsupported format");
    }
    Ok(&covered[magic.len() + 1..])
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

fn take_bytes(input: &mut &[u8]) -> Result<Bytes, CommandError> {
    let length = take_u32(input)? as usize;
    if input.len() < length {
        return Err(truncated());
    }
    let bytes = Bytes::copy_from_slice(&input[..length]);
    input.advance(length);
    Ok(bytes)
}

fn take_operation(input: &mut &[u8], kind: u8) -> Result<Operation, CommandError> {
    let condition = match take_u8(input)? {
        0 => Condition::None,
        1 => Condition::Absent,
        2 => {
            if input.len() < 8 {
                return Err(truncated());
            }
            Condition::Version(RecordIndex(input.get_u64_le()))
        }
        _ => {
            return Err(CommandError::Malformed {
                reason: "unknown condition".into(),
            });
        }
    };
    let key = take_bytes(input)?;
    match kind {
        KIND_PUT => Ok(Operation::Put {
            key,
            value: take_bytes(input)?,
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

    fn condition() -> impl Strategy<Value = Condition> {
        prop_oneof![
            Just(Condition::None),
            Just(Condition::Absent),
            any::<u64>().prop_map(|v| Condition::Version(RecordIndex(v))),
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

    proptest! {
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
