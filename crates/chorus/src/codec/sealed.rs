//! Sealed segment objects: one consolidated, content-addressed object per sealed
//! segment, stored under `sealed/<segment-id>-<crc32c, 8 hex>`.
//!
//! Header, 56 bytes, all little-endian:
//!
//! | offset | size | field                                  |
//! |-------:|-----:|----------------------------------------|
//! |      0 |    4 | magic `CHSG`                           |
//! |      4 |    2 | format version (1)                     |
//! |      6 |    2 | reserved, zero                         |
//! |      8 |    8 | segment id: epoch                      |
//! |     16 |    4 | segment id: counter                    |
//! |     20 |    4 | reserved, zero                         |
//! |     24 |    8 | base record index                      |
//! |     32 |    8 | record count                           |
//! |     40 |    8 | payload length in bytes                |
//! |     48 |    4 | payload CRC32C                         |
//! |     52 |    4 | header CRC32C of bytes 0..52           |
//!
//! Then the payload: the records as frames (see [`super::frame`]). Nothing else
//! (no timestamp, no writer identity) goes in, so the bytes are a pure function
//! of (segment id, base, records): every writer that seals the same committed
//! content produces the same object and the same key.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::check;
use super::crc::CrcRun;
use super::error::{CodecError, Format};
use super::frame::{decode_frames, framed_len, put_frames};
use crate::ids::{Epoch, RecordIndex, SegmentId};

/// The first four bytes of every sealed segment object.
pub const SEALED_MAGIC: [u8; 4] = *b"CHSG";
/// The sealed segment format version this build writes and reads.
pub const SEALED_VERSION: u16 = 1;
/// Length of the fixed sealed segment header.
pub const SEALED_HEADER_BYTES: usize = 56;
/// The largest sealed payload (frames) the codec encodes or decodes. A sealed
/// object is held in memory whole, so segments must rotate well below this.
pub const MAX_SEALED_PAYLOAD_BYTES: u64 = 4 << 30;

const FIRST_RESERVED_OFFSET: usize = 6;
const SECOND_RESERVED_OFFSET: usize = 20;
const FORMAT: Format = Format::Sealed;
/// Hex digits of the checksum in a sealed object's key name.
const NAME_CRC_DIGITS: usize = 8;

/// The content of one sealed segment: records `base .. base + records.len()`.
/// Never empty (an empty segment has nothing to seal, and a directory entry must
/// end after it begins).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedSegment {
    /// The segment sealed.
    pub id: SegmentId,
    /// The log index of `records[0]`.
    pub base: RecordIndex,
    /// The record payloads, in index order.
    pub records: Vec<Bytes>,
}

impl SealedSegment {
    /// The index after the last record.
    ///
    /// # Panics
    /// If that index overflows `u64` (decode refuses such a segment).
    pub fn end(&self) -> RecordIndex {
        let count = self.records.len() as u64;
        RecordIndex(
            self.base
                .0
                .checked_add(count)
                .expect("record indices overflow"),
        )
    }

    /// The object bytes. Compute the key with [`object_crc32c`] and
    /// [`sealed_key_name`].
    ///
    /// Refuses, as `decode` would, a segment with no records, frames above
    /// [`MAX_SEALED_PAYLOAD_BYTES`], or record indices that overflow `u64`:
    /// recovery seals what it read from the replicas, so this is reachable
    /// from stored bytes and must not panic.
    ///
    /// # Panics
    /// With a record above [`MAX_RECORD_BYTES`](super::MAX_RECORD_BYTES),
    /// which no decoded fragment and no admitted append holds.
    pub fn encode(&self) -> Result<Bytes, CodecError> {
        self.encode_keyed().map(|(bytes, _)| bytes)
    }

    /// The object bytes and their [`object_crc32c`], which names the key,
    /// combined from the header's and the payload's checksums rather than
    /// read from the bytes a second time.
    ///
    /// Refuses and panics as [`SealedSegment::encode`] does.
    pub fn encode_keyed(&self) -> Result<(Bytes, u32), CodecError> {
        let mut header = Header::new(
            self.id,
            self.base,
            self.records.len() as u64,
            framed_len(&self.records),
        )?;
        let payload_len =
            usize::try_from(header.payload_len).map_err(|_| CodecError::PayloadTooLarge {
                format: FORMAT,
                declared: header.payload_len,
                max: usize::MAX as u64,
            })?;
        let mut out = BytesMut::with_capacity(SEALED_HEADER_BYTES + payload_len);
        out.resize(SEALED_HEADER_BYTES, 0);
        put_frames(&mut out, &self.records);
        assert_eq!(out.len(), SEALED_HEADER_BYTES + payload_len);
        let payload = CrcRun::of(&out[SEALED_HEADER_BYTES..]);
        header.payload_crc = payload.crc();
        header.write(&mut out[..SEALED_HEADER_BYTES]);
        let object = CrcRun::of(&out[..SEALED_HEADER_BYTES]).then(payload);
        Ok((out.freeze(), object.crc()))
    }

    /// Decodes and fully validates a sealed object, in the order: length, magic,
    /// version, header checksum, reserved fields, header consistency, exact
    /// length, payload checksum, frames. Records are zero-copy slices of `bytes`.
    pub fn decode(bytes: &Bytes) -> Result<SealedSegment, CodecError> {
        check::header_present(FORMAT, bytes, SEALED_HEADER_BYTES)?;
        check::magic(FORMAT, bytes, SEALED_MAGIC)?;
        let header = Header::read(&bytes[..SEALED_HEADER_BYTES]);
        check::version(FORMAT, header.version, SEALED_VERSION)?;
        check::header_checksum(FORMAT, &bytes[..SEALED_HEADER_BYTES])?;
        check::reserved(FORMAT, FIRST_RESERVED_OFFSET, header.first_reserved.into())?;
        check::reserved(
            FORMAT,
            SECOND_RESERVED_OFFSET,
            header.second_reserved.into(),
        )?;
        header.check_consistent()?;
        check::exact_length(FORMAT, bytes.len(), SEALED_HEADER_BYTES, header.payload_len)?;
        let payload = bytes.slice(SEALED_HEADER_BYTES..);
        check::payload_checksum(FORMAT, &payload, header.payload_crc)?;
        header.into_segment(&payload)
    }

    /// Decodes an object read from the key that the directory entry
    /// `id:base:object_crc32c` names, and checks it is exactly that content:
    /// valid, matching the key's checksum, and naming the same segment and base.
    pub fn decode_verified(
        bytes: &Bytes,
        id: SegmentId,
        base: RecordIndex,
        object_crc32c: u32,
    ) -> Result<SealedSegment, CodecError> {
        let segment = SealedSegment::decode(bytes)?;
        let actual = self::object_crc32c(bytes);
        if actual != object_crc32c {
            return Err(CodecError::ObjectChecksum {
                expected: object_crc32c,
                actual,
            });
        }
        if segment.id != id {
            return Err(CodecError::SegmentMismatch {
                expected: id,
                actual: segment.id,
            });
        }
        if segment.base != base {
            return Err(CodecError::BaseMismatch {
                expected: base,
                actual: segment.base,
            });
        }
        Ok(segment)
    }
}

/// A sealed object whose payload was framed elsewhere: a writer's committed
/// fragments carry exactly the frames of their records, in order, so its
/// sealed object is a new header followed by those fragments' payloads,
/// written from their buffers instead of copied into one (see
/// [`Fragment::encode_with_payload`](super::Fragment::encode_with_payload)).
/// The same object, byte for byte, as [`SealedSegment::encode`] makes from
/// the records.
#[derive(Debug, Clone)]
pub struct FramedSegment {
    /// The segment sealed.
    pub id: SegmentId,
    /// The log index of the first record.
    pub base: RecordIndex,
    /// How many records the frames hold.
    pub count: u64,
    /// The records' frames, in index order, split anywhere.
    pub frames: Vec<Bytes>,
    /// The checksum run of the frames' concatenation.
    pub checksum: CrcRun,
}

impl FramedSegment {
    /// The object as parts to write back to back, the header first, and its
    /// [`object_crc32c`]. Refuses what [`SealedSegment::encode`] refuses.
    ///
    /// # Panics
    /// If `checksum` is not as long as `frames`: it describes other bytes.
    /// In debug builds also unless the parts decode as a sealed object of
    /// `count` records with that checksum.
    pub fn encode(self) -> Result<(Vec<Bytes>, u32), CodecError> {
        let framed: u64 = self.frames.iter().map(|part| part.len() as u64).sum();
        assert_eq!(framed, self.checksum.len(), "a checksum of other bytes");
        let mut header = Header::new(self.id, self.base, self.count, framed)?;
        header.payload_crc = self.checksum.crc();
        let mut head = [0u8; SEALED_HEADER_BYTES];
        header.write(&mut head);
        let object = CrcRun::of(&head).then(self.checksum).crc();
        let mut parts = Vec::with_capacity(1 + self.frames.len());
        parts.push(Bytes::copy_from_slice(&head));
        parts.extend(self.frames);
        #[cfg(debug_assertions)]
        {
            let joined = Bytes::from(parts.concat());
            let decoded = SealedSegment::decode_verified(&joined, self.id, self.base, object)
                .expect("framed parts make a valid sealed object");
            assert_eq!(decoded.records.len() as u64, self.count);
        }
        Ok((parts, object))
    }
}

/// The CRC32C of a whole encoded sealed object: the checksum its key carries.
pub fn object_crc32c(encoded: &[u8]) -> u32 {
    crc32c::crc32c(encoded)
}

/// The last key component of a sealed object: `<segment-id>-<crc32c, 8 hex>`,
/// lowercase, so each object has exactly one name.
pub fn sealed_key_name(id: SegmentId, object_crc32c: u32) -> String {
    format!("{id}-{object_crc32c:08x}")
}

/// Parses a name built by [`sealed_key_name`]; any other spelling is refused.
pub fn parse_sealed_key_name(name: &str) -> Result<(SegmentId, u32), CodecError> {
    let bad = || CodecError::BadSealedName {
        name: name.chars().take(80).collect(),
    };
    let (id, crc) = name.rsplit_once('-').ok_or_else(bad)?;
    let id: SegmentId = id.parse().map_err(|_| bad())?;
    let lower_hex = crc.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if crc.len() != NAME_CRC_DIGITS || !lower_hex {
        return Err(bad());
    }
    let crc = u32::from_str_radix(crc, 16).map_err(|_| bad())?;
    Ok((id, crc))
}

/// The header fields, as written or as read (before validation).
#[derive(Debug)]
struct Header {
    version: u16,
    first_reserved: u16,
    epoch: u64,
    counter: u32,
    second_reserved: u32,
    base: u64,
    count: u64,
    payload_len: u64,
    payload_crc: u32,
}

impl Header {
    /// The header of `count` records from `base` in segment `id`, framed in
    /// `payload_len` bytes, with the payload checksum still to fill in.
    /// Refuses everything `decode` would reject.
    fn new(
        id: SegmentId,
        base: RecordIndex,
        count: u64,
        payload_len: u64,
    ) -> Result<Header, CodecError> {
        let inconsistent = |reason: String| CodecError::Inconsistent {
            format: FORMAT,
            reason,
        };
        if count == 0 {
            return Err(inconsistent(format!("segment without records: id={id}")));
        }
        if payload_len > MAX_SEALED_PAYLOAD_BYTES {
            return Err(CodecError::PayloadTooLarge {
                format: FORMAT,
                declared: payload_len,
                max: MAX_SEALED_PAYLOAD_BYTES,
            });
        }
        if base.0.checked_add(count).is_none() {
            return Err(inconsistent(format!(
                "record indices overflow: id={id} base={base} count={count}"
            )));
        }
        Ok(Header {
            version: SEALED_VERSION,
            first_reserved: 0,
            epoch: id.epoch.0,
            counter: id.counter,
            second_reserved: 0,
            base: base.0,
            count,
            payload_len,
            payload_crc: 0,
        })
    }

    /// Writes the header, including its checksum, into `out` (exactly
    /// [`SEALED_HEADER_BYTES`] long).
    fn write(&self, out: &mut [u8]) {
        let mut cursor = &mut out[..];
        cursor.put_slice(&SEALED_MAGIC);
        cursor.put_u16_le(self.version);
        cursor.put_u16_le(self.first_reserved);
        cursor.put_u64_le(self.epoch);
        cursor.put_u32_le(self.counter);
        cursor.put_u32_le(self.second_reserved);
        cursor.put_u64_le(self.base);
        cursor.put_u64_le(self.count);
        cursor.put_u64_le(self.payload_len);
        cursor.put_u32_le(self.payload_crc);
        let covered = SEALED_HEADER_BYTES - check::CHECKSUM_BYTES;
        let crc = crc32c::crc32c(&out[..covered]);
        out[covered..].copy_from_slice(&crc.to_le_bytes());
    }

    /// Reads the fields of a header of exactly [`SEALED_HEADER_BYTES`].
    fn read(header: &[u8]) -> Header {
        assert_eq!(header.len(), SEALED_HEADER_BYTES);
        let mut fields = &header[SEALED_MAGIC.len()..];
        Header {
            version: fields.get_u16_le(),
            first_reserved: fields.get_u16_le(),
            epoch: fields.get_u64_le(),
            counter: fields.get_u32_le(),
            second_reserved: fields.get_u32_le(),
            base: fields.get_u64_le(),
            count: fields.get_u64_le(),
            payload_len: fields.get_u64_le(),
            payload_crc: fields.get_u32_le(),
        }
    }

    fn check_consistent(&self) -> Result<(), CodecError> {
        if self.count == 0 {
            return Err(CodecError::Inconsistent {
                format: FORMAT,
                reason: format!("sealed segment holds no records: id={}", self.id()),
            });
        }
        check::payload_limit(FORMAT, self.payload_len, MAX_SEALED_PAYLOAD_BYTES)?;
        check::count_fits_payload(FORMAT, self.count, self.payload_len)?;
        check::end_index_fits(FORMAT, self.base, self.count)
    }

    fn id(&self) -> SegmentId {
        SegmentId::new(Epoch(self.epoch), self.counter)
    }

    /// Builds the segment from a header that passed every check and its
    /// checksum-verified payload.
    fn into_segment(self, payload: &Bytes) -> Result<SealedSegment, CodecError> {
        let records = decode_frames(payload, self.count)?;
        Ok(SealedSegment {
            id: self.id(),
            base: RecordIndex(self.base),
            records,
        })
    }
}

#[cfg(test)]
mod tests;
