//! Byte formats of stored objects (docs/overview.md, Encodings): record frames,
//! fragment objects and sealed segment objects; and the checksum of the JSON
//! documents (`document`). All integers are little-endian; checksums are
//! CRC32C.
//!
//! Stored objects outlive the code that wrote them, so these formats are fixed:
//! the unit tests pin every byte offset, and a change needs a new format version.
//!
//! Decoders trust nothing. They check, in this order, and stop at the first
//! failure with a precise [`CodecError`]:
//!
//! 1. the object is at least a header long;
//! 2. magic, then format version;
//! 3. header checksum;
//! 4. reserved fields are zero;
//! 5. the header is consistent (kind, record count against payload length,
//!    index overflow, the hard payload limit);
//! 6. the object is exactly header plus declared payload (shorter: truncated;
//!    longer: trailing bytes);
//! 7. payload checksum;
//! 8. the payload is exactly the declared number of frames.
//!
//! No decoder allocates from an unvalidated length: record vectors are sized
//! from bytes actually present, and records are zero-copy slices of the input.
//! Encoders assert the same limits, so nothing written can be refused on read.

mod check;
mod crc;
mod document;
mod error;
pub mod fragment;
pub mod frame;
pub mod sealed;
#[cfg(test)]
mod testing;
mod version;

pub use crc::CrcRun;
pub use document::{DOCUMENT_CHECKSUM_FIELD, checksum_failure, document_checksum, formats_text};
pub use error::{CodecError, Format};
pub use fragment::{FRAGMENT_HEADER_BYTES, Fragment, MAX_FRAGMENT_PAYLOAD_BYTES};
pub use frame::{FRAME_HEADER_BYTES, MAX_RECORD_BYTES, decode_frames, encode_frames};
pub use sealed::{
    FramedSegment, MAX_SEALED_PAYLOAD_BYTES, SEALED_HEADER_BYTES, SealedSegment, object_crc32c,
    parse_sealed_key_name, sealed_key_name,
};
pub use version::NewerFormat;

// A maximal record fits in one fragment, and a maximal fragment in one sealed
// segment, so anything admitted can always be written and sealed.
const _: () = assert!(FRAME_HEADER_BYTES as u64 + MAX_RECORD_BYTES <= MAX_FRAGMENT_PAYLOAD_BYTES);
const _: () = assert!(MAX_FRAGMENT_PAYLOAD_BYTES <= MAX_SEALED_PAYLOAD_BYTES);
