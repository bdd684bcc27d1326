//! Fragment objects: the immutable unit a writer creates under
//! `segments/<segment-id>/<fragment-index>` on each replica.
//!
//! Header, 48 bytes, all little-endian:
//!
//! | offset | size | field                                        |
//! |-------:|-----:|----------------------------------------------|
//! |      0 |    4 | magic `CHFR`                                 |
//! |      4 |    1 | format version (1)                           |
//! |      5 |    1 | kind: 1 = data, 2 = fence                    |
//! |      6 |    2 | reserved, zero                               |
//! |      8 |    8 | writer epoch (a fence: the fencing epoch)    |
//! |     16 |    8 | fragment index                               |
//! |     24 |    8 | first record index (a fence: 0)              |
//! |     32 |    4 | record count (a fence: 0)                    |
//! |     36 |    4 | payload length in bytes (a fence: 0)         |
//! |     40 |    4 | payload CRC32C                               |
//! |     44 |    4 | header CRC32C of bytes 0..44                 |
//!
//! Then the payload: the records as frames (see [`super::frame`]).

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::check;
use super::crc::CrcRun;
use super::error::{CodecError, Format};
use super::frame::{decode_frames, framed_len, put_frames};
use crate::ids::{Epoch, FragmentIndex, RecordIndex};

/// The first four bytes of every fragment.
pub const FRAGMENT_MAGIC: [u8; 4] = *b"CHFR";
/// The fragment format version this build writes and reads.
pub const FRAGMENT_VERSION: u8 = 1;
/// Length of the fixed fragment header.
pub const FRAGMENT_HEADER_BYTES: usize = 48;
/// The largest fragment payload (frames) the codec encodes or decodes. Bounds
/// what a corrupt length field can make a reader expect.
pub const MAX_FRAGMENT_PAYLOAD_BYTES: u64 = 1 << 30;

const _: () = assert!(MAX_FRAGMENT_PAYLOAD_BYTES <= u32::MAX as u64);

const KIND_DATA: u8 = 1;
const KIND_FENCE: u8 = 2;
const RESERVED_OFFSET: usize = 6;
const FORMAT: Format = Format::Fragment;

/// One fragment object, as written to a replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fragment {
    /// Records appended by the writer of `epoch`, holding indices
    /// `first .. first + records.len()`. Never empty.
    Data {
        /// The epoch of the writer that created the fragment.
        epoch: Epoch,
        /// The fragment's position in its segment.
        index: FragmentIndex,
        /// The log index of `records[0]`.
        first: RecordIndex,
        /// The record payloads, in index order.
        records: Vec<Bytes>,
    },
    /// Placed by a recovering writer of `epoch` at a position the old writer had
    /// not filled, so the old writer can never fill it.
    Fence {
        /// The fencing (recovering) epoch.
        epoch: Epoch,
        /// The fragment's position in its segment.
        index: FragmentIndex,
    },
}

impl Fragment {
    /// The writer epoch of a data fragment, or the fencing epoch of a fence.
    pub fn epoch(&self) -> Epoch {
        match self {
            Fragment::Data { epoch, .. } | Fragment::Fence { epoch, .. } => *epoch,
        }
    }

    /// The fragment's position in its segment.
    pub fn index(&self) -> FragmentIndex {
        match self {
            Fragment::Data { index, .. } | Fragment::Fence { index, .. } => *index,
        }
    }

    /// Whether this is a fence.
    pub fn is_fence(&self) -> bool {
        matches!(self, Fragment::Fence { .. })
    }

    /// The records of a data fragment; empty for a fence.
    pub fn records(&self) -> &[Bytes] {
        match self {
            Fragment::Data { records, .. } => records,
            Fragment::Fence { .. } => &[],
        }
    }

    /// The object bytes.
    ///
    /// # Panics
    /// On a data fragment without records, with a record above
    /// [`MAX_RECORD_BYTES`](super::MAX_RECORD_BYTES), with frames above
    /// [`MAX_FRAGMENT_PAYLOAD_BYTES`], or whose record indices overflow `u64`:
    /// the writer must never build one, and no reader would accept it.
    pub fn encode(&self) -> Bytes {
        self.encode_with_payload().0
    }

    /// The object bytes and the checksum run of its payload (the frames),
    /// from which a seal computes its own payload checksum without reading
    /// the records again.
    pub fn encode_with_payload(&self) -> (Bytes, CrcRun) {
        let mut header = Header::of(self);
        let records = self.records();
        let payload_len = usize::try_from(header.payload_len).expect("checked by Header::of");
        let mut out = BytesMut::with_capacity(FRAGMENT_HEADER_BYTES + payload_len);
        out.resize(FRAGMENT_HEADER_BYTES, 0);
        put_frames(&mut out, records);
        assert_eq!(out.len(), FRAGMENT_HEADER_BYTES + payload_len);
        let payload = CrcRun::of(&out[FRAGMENT_HEADER_BYTES..]);
        header.payload_crc = payload.crc();
        header.write(&mut out[..FRAGMENT_HEADER_BYTES]);
        (out.freeze(), payload)
    }

    /// Decodes and fully validates a fragment object, in the order: length,
    /// magic, version, header checksum, reserved field, kind and header
    /// consistency, exact length, payload checksum, frames. Records are
    /// zero-copy slices of `bytes`.
    pub fn decode(bytes: &Bytes) -> Result<Fragment, CodecError> {
        check::header_present(FORMAT, bytes, FRAGMENT_HEADER_BYTES)?;
        check::magic(FORMAT, bytes, FRAGMENT_MAGIC)?;
        let header = Header::read(&bytes[..FRAGMENT_HEADER_BYTES]);
        check::version(FORMAT, header.version.into(), FRAGMENT_VERSION.into())?;
        check::header_checksum(FORMAT, &bytes[..FRAGMENT_HEADER_BYTES])?;
        check::reserved(FORMAT, RESERVED_OFFSET, header.reserved.into())?;
        header.check_consistent()?;
        let declared = u64::from(header.payload_len);
        check::exact_length(FORMAT, bytes.len(), FRAGMENT_HEADER_BYTES, declared)?;
        let payload = bytes.slice(FRAGMENT_HEADER_BYTES..);
        check::payload_checksum(FORMAT, &payload, header.payload_crc)?;
        header.into_fragment(&payload)
    }
}

/// The header fields, as written or as read (before validation).
#[derive(Debug)]
struct Header {
    version: u8,
    kind: u8,
    reserved: u16,
    epoch: u64,
    index: u64,
    first: u64,
    count: u32,
    payload_len: u32,
    payload_crc: u32,
}

impl Header {
    /// The header for `fragment`, with the payload checksum still to fill in.
    /// Asserts everything `decode` would reject.
    fn of(fragment: &Fragment) -> Header {
        let (kind, first, records) = match fragment {
            Fragment::Data { first, records, .. } => (KIND_DATA, first.0, records.as_slice()),
            Fragment::Fence { .. } => (KIND_FENCE, 0, &[][..]),
        };
        assert!(
            kind == KIND_FENCE || !records.is_empty(),
            "data fragment without records: index={}",
            fragment.index()
        );
        let payload_len = framed_len(records);
        assert!(
            payload_len <= MAX_FRAGMENT_PAYLOAD_BYTES,
            "fragment payload too large: payload_bytes={payload_len} max_bytes={MAX_FRAGMENT_PAYLOAD_BYTES}"
        );
        let count = records.len() as u64;
        assert!(
            first.checked_add(count).is_some(),
            "record indices overflow: first={first}"
        );
        Header {
            version: FRAGMENT_VERSION,
            kind,
            reserved: 0,
            epoch: fragment.epoch().0,
            index: fragment.index().0,
            first,
            count: u32::try_from(count).expect("bounded by the payload limit"),
            payload_len: u32::try_from(payload_len).expect("bounded by the payload limit"),
            payload_crc: 0,
        }
    }

    /// Writes the header, including its checksum, into `out` (exactly
    /// [`FRAGMENT_HEADER_BYTES`] long).
    fn write(&self, out: &mut [u8]) {
        let mut cursor = &mut out[..];
        cursor.put_slice(&FRAGMENT_MAGIC);
        cursor.put_u8(self.version);
        cursor.put_u8(self.kind);
        cursor.put_u16_le(self.reserved);
        cursor.put_u64_le(self.epoch);
        cursor.put_u64_le(self.index);
        cursor.put_u64_le(self.first);
        cursor.put_u32_le(self.count);
        cursor.put_u32_le(self.payload_len);
        cursor.put_u32_le(self.payload_crc);
        let covered = FRAGMENT_HEADER_BYTES - check::CHECKSUM_BYTES;
        let crc = crc32c::crc32c(&out[..covered]);
        out[covered..].copy_from_slice(&crc.to_le_bytes());
    }

    /// Reads the fields of a header of exactly [`FRAGMENT_HEADER_BYTES`].
    fn read(header: &[u8]) -> Header {
        assert_eq!(header.len(), FRAGMENT_HEADER_BYTES);
        let mut fields = &header[FRAGMENT_MAGIC.len()..];
        Header {
            version: fields.get_u8(),
            kind: fields.get_u8(),
            reserved: fields.get_u16_le(),
            epoch: fields.get_u64_le(),
            index: fields.get_u64_le(),
            first: fields.get_u64_le(),
            count: fields.get_u32_le(),
            payload_len: fields.get_u32_le(),
            payload_crc: fields.get_u32_le(),
        }
    }

    fn check_consistent(&self) -> Result<(), CodecError> {
        match self.kind {
            KIND_DATA => self.check_data(),
            KIND_FENCE => self.check_fence(),
            kind => Err(CodecError::BadKind { kind }),
        }
    }

    fn check_data(&self) -> Result<(), CodecError> {
        if self.count == 0 {
            return Err(inconsistent(format!(
                "data fragment holds no records: index={}",
                self.index
            )));
        }
        let payload_len = u64::from(self.payload_len);
        check::payload_limit(FORMAT, payload_len, MAX_FRAGMENT_PAYLOAD_BYTES)?;
        check::count_fits_payload(FORMAT, self.count.into(), payload_len)?;
        check::end_index_fits(FORMAT, self.first, self.count.into())
    }

    fn check_fence(&self) -> Result<(), CodecError> {
        if self.count != 0 || self.payload_len != 0 || self.first != 0 {
            return Err(inconsistent(format!(
                "fence carries records: records={} payload_bytes={} first={}",
                self.count, self.payload_len, self.first
            )));
        }
        Ok(())
    }

    /// Builds the fragment from a header that passed every check and its
    /// checksum-verified payload.
    fn into_fragment(self, payload: &Bytes) -> Result<Fragment, CodecError> {
        let epoch = Epoch(self.epoch);
        let index = FragmentIndex(self.index);
        if self.kind == KIND_FENCE {
            return Ok(Fragment::Fence { epoch, index });
        }
        let records = decode_frames(payload, self.count.into())?;
        let first = RecordIndex(self.first);
        Ok(Fragment::Data {
            epoch,
            index,
            first,
            records,
        })
    }
}

fn inconsistent(reason: String) -> CodecError {
    CodecError::Inconsistent {
        format: FORMAT,
        reason,
    }
}

#[cfg(test)]
mod tests;
