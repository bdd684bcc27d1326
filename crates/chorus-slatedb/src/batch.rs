//! The Chorus record that carries one SlateDB write batch.
//!
//! A batch is all-or-nothing in SlateDB, and a Chorus record is
//! all-or-nothing in the log, so one batch is one record: a reader sees a
//! batch whole or not at all. The log checksums its stored objects already;
//! the record carries its own CRC32C too, so that a record decoded from any
//! source (a fragment, a sealed object, a copy made by a tool) is checked
//! against what the writer encoded.
//!
//! ```text
//! header, 16 bytes, little-endian:
//!    0  magic      "CSWB"
//!    4  version    u16, 1
//!    6  reserved   u16, 0
//!    8  rows       u32, at least 1
//!   12  crc32c     u32, of the body
//! body: `rows` rows, each:
//!       kind       u8: 0 value, 1 merge operand, 2 tombstone
//!       flags      u8: bit 0 create_ts present, bit 1 expire_ts present
//!       seq        u64
//!       create_ts  i64, if flagged
//!       expire_ts  i64, if flagged
//!       key        u32 length, then the bytes
//!       value      u32 length, then the bytes (values and merge operands only)
//! ```

use bytes::{Buf, BufMut, Bytes, BytesMut};
use chorus::ids::RecordIndex;
use slatedb::wal::{WalError, WalRows};
use slatedb::{RowEntry, ValueDeletable};

use crate::error::data_error;
use crate::ids::wal_id;

const MAGIC: &[u8; 4] = b"CSWB";
const VERSION: u16 = 1;
/// Bytes before the first row.
pub const HEADER_BYTES: usize = 16;
/// The smallest row: kind, flags, seq and an empty key's length.
const MIN_ROW_BYTES: usize = 1 + 1 + 8 + 4;

const KIND_VALUE: u8 = 0;
const KIND_MERGE: u8 = 1;
const KIND_TOMBSTONE: u8 = 2;

const FLAG_CREATE_TS: u8 = 1;
const FLAG_EXPIRE_TS: u8 = 2;

/// Why bytes are not a write batch record, or a batch cannot become one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// A batch with no rows: SlateDB never writes one, so a record holding
    /// none was not written by this crate.
    #[error("a write batch record holds no rows")]
    Empty,
    /// A key or value longer than the format's `u32` length prefix.
    #[error("row {row}: {what} of {len} bytes exceeds the 4 GiB a record can hold")]
    TooLarge {
        /// The row's position in the batch.
        row: usize,
        /// "key" or "value".
        what: &'static str,
        /// Its length.
        len: usize,
    },
    /// Fewer bytes than the header.
    #[error("a write batch record of {len} bytes is shorter than its 16-byte header")]
    Short {
        /// The record's length.
        len: usize,
    },
    /// The record does not start with the magic bytes.
    #[error("not a write batch record: magic {found:02x?}, expected \"CSWB\"")]
    Magic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// A format version this build cannot read.
    #[error("write batch format version {found} is not supported (this build reads version 1)")]
    Version {
        /// The version in the header.
        found: u16,
    },
    /// Reserved header bits are set.
    #[error("write batch header has reserved field {found:#06x}, expected 0")]
    Reserved {
        /// The reserved field.
        found: u16,
    },
    /// The body does not match its checksum.
    #[error(
        "write batch body checksum mismatch: header says {expected:#010x}, body has {actual:#010x}"
    )]
    Checksum {
        /// The checksum in the header.
        expected: u32,
        /// The body's checksum.
        actual: u32,
    },
    /// The body ends inside a row.
    #[error("write batch row {row} is truncated: its {field} needs {needed} bytes, {left} left")]
    Truncated {
        /// The row's position.
        row: usize,
        /// The field being read.
        field: &'static str,
        /// Bytes the field needs.
        needed: usize,
        /// Bytes left in the body.
        left: usize,
    },
    /// An unknown row kind.
    #[error("write batch row {row} has unknown kind {kind}")]
    Kind {
        /// The row's position.
        row: usize,
        /// The kind byte.
        kind: u8,
    },
    /// Unknown flag bits, or a value on a tombstone.
    #[error("write batch row {row} has unknown flags {flags:#04x}")]
    Flags {
        /// The row's position.
        row: usize,
        /// The flags byte.
        flags: u8,
    },
    /// Bytes after the last row.
    #[error("write batch record has {extra} bytes after its {rows} rows")]
    Trailing {
        /// The declared row count.
        rows: u32,
        /// Bytes left over.
        extra: usize,
    },
}

/// Encodes `rows` (one write batch) as one record.
pub fn encode(rows: &[RowEntry]) -> Result<Bytes, BatchError> {
    if rows.is_empty() {
        return Err(BatchError::Empty);
    }
    let count = u32::try_from(rows.len()).map_err(|_| BatchError::TooLarge {
        row: rows.len() - 1,
        what: "row count",
        len: rows.len(),
    })?;
    let body: usize = rows.iter().map(row_len).sum();
    let mut out = BytesMut::with_capacity(HEADER_BYTES + body);
    out.put_slice(MAGIC);
    out.put_u16_le(VERSION);
    out.put_u16_le(0);
    out.put_u32_le(count);
    out.put_u32_le(0); // the checksum, once the body is written
    for (position, row) in rows.iter().enumerate() {
        put_row(&mut out, position, row)?;
    }
    let crc = crc32c::crc32c(&out[HEADER_BYTES..]);
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    Ok(out.freeze())
}

/// Decodes a record written by [`encode`]. Keys and values are zero-copy
/// slices of `record`.
pub fn decode(record: &Bytes) -> Result<Vec<RowEntry>, BatchError> {
    if record.len() < HEADER_BYTES {
        return Err(BatchError::Short { len: record.len() });
    }
    let mut header = &record[..HEADER_BYTES];
    let mut magic = [0; 4];
    header.copy_to_slice(&mut magic);
    if &magic != MAGIC {
        return Err(BatchError::Magic { found: magic });
    }
    let version = header.get_u16_le();
    if version != VERSION {
        return Err(BatchError::Version { found: version });
    }
    let reserved = header.get_u16_le();
    if reserved != 0 {
        return Err(BatchError::Reserved { found: reserved });
    }
    let count = header.get_u32_le();
    let expected = header.get_u32_le();
    let actual = crc32c::crc32c(&record[HEADER_BYTES..]);
    if actual != expected {
        return Err(BatchError::Checksum { expected, actual });
    }
    if count == 0 {
        return Err(BatchError::Empty);
    }
    let mut body = Body {
        bytes: record.slice(HEADER_BYTES..),
        row: 0,
    };
    // A corrupt count cannot make this allocate more than the body could hold.
    let mut rows = Vec::with_capacity((count as usize).min(body.bytes.len() / MIN_ROW_BYTES));
    for row in 0..count as usize {
        body.row = row;
        rows.push(body.row_entry()?);
    }
    if !body.bytes.is_empty() {
        return Err(BatchError::Trailing {
            rows: count,
            extra: body.bytes.len(),
        });
    }
    Ok(rows)
}

/// Record `index` as the WAL file it is, in SlateDB's terms; a record that
/// does not decode is a `DataError` naming the file and the record.
pub(crate) fn wal_file(index: RecordIndex, record: &Bytes) -> Result<WalRows, WalError> {
    let rows = decode(record).map_err(|error| {
        data_error(format!(
            "WAL file {} (record {index}): {error}",
            wal_id(index)
        ))
    })?;
    Ok(WalRows {
        rows,
        last_consumed_wal_file_id: wal_id(index),
    })
}

/// Encoded bytes of `row`.
fn row_len(row: &RowEntry) -> usize {
    let timestamps =
        8 * (usize::from(row.create_ts.is_some()) + usize::from(row.expire_ts.is_some()));
    let value = match &row.value {
        ValueDeletable::Value(value) | ValueDeletable::Merge(value) => 4 + value.len(),
        ValueDeletable::Tombstone => 0,
    };
    MIN_ROW_BYTES + timestamps + row.key.len() + value
}

fn put_row(out: &mut BytesMut, position: usize, row: &RowEntry) -> Result<(), BatchError> {
    let (kind, value) = match &row.value {
        ValueDeletable::Value(value) => (KIND_VALUE, Some(value)),
        ValueDeletable::Merge(value) => (KIND_MERGE, Some(value)),
        ValueDeletable::Tombstone => (KIND_TOMBSTONE, None),
    };
    let flags = if row.create_ts.is_some() {
        FLAG_CREATE_TS
    } else {
        0
    } | if row.expire_ts.is_some() {
        FLAG_EXPIRE_TS
    } else {
        0
    };
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u64_le(row.seq);
    if let Some(created) = row.create_ts {
        out.put_i64_le(created);
    }
    if let Some(expires) = row.expire_ts {
        out.put_i64_le(expires);
    }
    put_sized(out, position, "key", &row.key)?;
    if let Some(value) = value {
        put_sized(out, position, "value", value)?;
    }
    Ok(())
}

fn put_sized(
    out: &mut BytesMut,
    row: usize,
    what: &'static str,
    bytes: &[u8],
) -> Result<(), BatchError> {
    let len = u32::try_from(bytes.len()).map_err(|_| BatchError::TooLarge {
        row,
        what,
        len: bytes.len(),
    })?;
    out.put_u32_le(len);
    out.put_slice(bytes);
    Ok(())
}

/// The unread part of a record's body.
struct Body {
    bytes: Bytes,
    /// The row being read, for errors.
    row: usize,
}

impl Body {
    fn row_entry(&mut self) -> Result<RowEntry, BatchError> {
        let kind = self.take(1, "kind")?.get_u8();
        let flags = self.take(1, "flags")?.get_u8();
        if flags & !(FLAG_CREATE_TS | FLAG_EXPIRE_TS) != 0 {
            return Err(BatchError::Flags {
                row: self.row,
                flags,
            });
        }
        let seq = self.take(8, "seq")?.get_u64_le();
        let create_ts = if flags & FLAG_CREATE_TS != 0 {
            Some(self.take(8, "create_ts")?.get_i64_le())
        } else {
            None
        };
        let expire_ts = if flags & FLAG_EXPIRE_TS != 0 {
            Some(self.take(8, "expire_ts")?.get_i64_le())
        } else {
            None
        };
        let key = self.sized("key")?;
        let value = match kind {
            KIND_VALUE => ValueDeletable::Value(self.sized("value")?),
            KIND_MERGE => ValueDeletable::Merge(self.sized("value")?),
            KIND_TOMBSTONE => ValueDeletable::Tombstone,
            kind => {
                return Err(BatchError::Kind {
                    row: self.row,
                    kind,
                });
            }
        };
        Ok(RowEntry {
            key,
            value,
            seq,
            create_ts,
            expire_ts,
        })
    }

    /// The next `len` bytes.
    fn take(&mut self, len: usize, field: &'static str) -> Result<Bytes, BatchError> {
        if self.bytes.len() < len {
            return Err(BatchError::Truncated {
                row: self.row,
                field,
                needed: len,
                left: self.bytes.len(),
            });
        }
        Ok(self.bytes.split_to(len))
    }

    /// A `u32` length and that many bytes.
    fn sized(&mut self, field: &'static str) -> Result<Bytes, BatchError> {
        let len = self.take(4, field)?.get_u32_le() as usize;
        self.take(len, field)
    }
}

#[cfg(test)]
mod tests;
