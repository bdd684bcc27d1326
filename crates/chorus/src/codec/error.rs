//! The one error type of every decoder in [`crate::codec`].

use std::fmt;

use super::NewerFormat;
use crate::ids::{RecordIndex, SegmentId};

/// Which byte format a [`CodecError`] is about, so a message says what was being
/// decoded without the caller adding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// A fragment object (`CHFR`).
    Fragment,
    /// A sealed segment object (`CHSG`).
    Sealed,
    /// A run of record frames (the payload of either object).
    Frames,
}

impl Format {
    /// The format's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Format::Fragment => "fragment",
            Format::Sealed => "sealed segment",
            Format::Frames => "record frames",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The message of [`CodecError::UnsupportedVersion`].
fn unsupported_version(format: Format, version: u16, supported: u16) -> String {
    match NewerFormat::check(format.name(), version.into(), supported.into()) {
        Some(newer) => newer.to_string(),
        None => format!(
            "{format} has unsupported format version: version={version} supported={supported}"
        ),
    }
}

/// Why some bytes are not a valid encoding. Every variant names one check, in the
/// order the decoders run them, so a corrupt object gets the most specific error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// Fewer bytes than the header, the declared payload or a frame needs.
    #[error("{format} truncated: needed_bytes={needed} available_bytes={available}")]
    Truncated {
        /// What was being decoded.
        format: Format,
        /// Bytes the encoding requires up to the failing point.
        needed: u64,
        /// Bytes actually present.
        available: u64,
    },
    /// The first four bytes are not this format's magic.
    #[error(
        "{format} has bad magic: expected=\"{}\" actual=\"{}\"",
        expected.escape_ascii(),
        actual.escape_ascii()
    )]
    BadMagic {
        /// What was being decoded.
        format: Format,
        /// The magic this format starts with.
        expected: [u8; 4],
        /// The bytes found instead.
        actual: [u8; 4],
    },
    /// A format version this build cannot read: a newer one (written by a
    /// newer Chorus, said in one line) or one no build ever wrote.
    #[error("{}", unsupported_version(*format, *version, *supported))]
    UnsupportedVersion {
        /// What was being decoded.
        format: Format,
        /// The version found.
        version: u16,
        /// The only version this build reads.
        supported: u16,
    },
    /// The header bytes do not match their checksum.
    #[error("{format} header checksum mismatch: stored={expected:08x} computed={actual:08x}")]
    HeaderChecksum {
        /// What was being decoded.
        format: Format,
        /// The checksum stored in the header.
        expected: u32,
        /// The checksum of the header bytes as read.
        actual: u32,
    },
    /// A reserved header field is not zero (a newer writer, or corruption).
    #[error("{format} reserved field not zero: offset={offset} value={value}")]
    ReservedNotZero {
        /// What was being decoded.
        format: Format,
        /// Byte offset of the field in the header.
        offset: usize,
        /// The value found.
        value: u64,
    },
    /// A fragment kind byte that is neither data nor fence.
    #[error("fragment has unknown kind: kind={kind}")]
    BadKind {
        /// The kind byte found.
        kind: u8,
    },
    /// Header fields that contradict each other or the protocol (for example a
    /// fence that carries records).
    #[error("{format} header inconsistent: {reason}")]
    Inconsistent {
        /// What was being decoded.
        format: Format,
        /// Which fields disagree, as `key=value` pairs.
        reason: String,
    },
    /// A declared payload length above the format's hard limit.
    #[error("{format} payload too large: declared_bytes={declared} max_bytes={max}")]
    PayloadTooLarge {
        /// What was being decoded.
        format: Format,
        /// The declared payload length.
        declared: u64,
        /// The limit for this format.
        max: u64,
    },
    /// Bytes left over after everything the encoding declares.
    #[error("{format} has trailing bytes: extra_bytes={extra}")]
    TrailingBytes {
        /// What was being decoded.
        format: Format,
        /// How many bytes follow the end of the encoding.
        extra: u64,
    },
    /// The payload bytes do not match their checksum.
    #[error("{format} payload checksum mismatch: stored={expected:08x} computed={actual:08x}")]
    PayloadChecksum {
        /// What was being decoded.
        format: Format,
        /// The checksum stored in the header.
        expected: u32,
        /// The checksum of the payload bytes as read.
        actual: u32,
    },
    /// A record frame longer than [`MAX_RECORD_BYTES`](super::MAX_RECORD_BYTES).
    #[error("record frame too large: record={record} length_bytes={length} max_bytes={max}")]
    RecordTooLarge {
        /// Position of the frame within the payload, from 0.
        record: u64,
        /// The declared record length.
        length: u64,
        /// The limit.
        max: u64,
    },
    /// The frames end cleanly but hold fewer records than declared.
    #[error("record frames end early: declared_records={declared} found_records={found}")]
    RecordCountMismatch {
        /// Records the header declares.
        declared: u64,
        /// Records actually present.
        found: u64,
    },
    /// A sealed object whose whole-object checksum is not the one its key names.
    #[error("sealed segment object checksum mismatch: key={expected:08x} computed={actual:08x}")]
    ObjectChecksum {
        /// The checksum named by the key.
        expected: u32,
        /// The checksum of the bytes as read.
        actual: u32,
    },
    /// A sealed object that belongs to another segment than the one asked for.
    #[error("sealed segment has unexpected id: expected={expected} actual={actual}")]
    SegmentMismatch {
        /// The segment asked for.
        expected: SegmentId,
        /// The segment the object names.
        actual: SegmentId,
    },
    /// A sealed object whose base index is not the one the directory names.
    #[error("sealed segment has unexpected base: expected={expected} actual={actual}")]
    BaseMismatch {
        /// The base the directory names.
        expected: RecordIndex,
        /// The base the object names.
        actual: RecordIndex,
    },
    /// A sealed object key name not of the form `<segment-id>-<crc32c, 8 hex>`.
    #[error("invalid sealed object name: name={name:?}")]
    BadSealedName {
        /// The name found (cut to 80 characters).
        name: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Epoch;

    fn one_of_each() -> Vec<CodecError> {
        let format = Format::Fragment;
        let id = SegmentId::new(Epoch(1), 2);
        vec![
            CodecError::Truncated {
                format,
                needed: 48,
                available: 3,
            },
            CodecError::BadMagic {
                format,
                expected: *b"CHFR",
                actual: [0, 1, 2, 0xff],
            },
            CodecError::UnsupportedVersion {
                format,
                version: 9,
                supported: 1,
            },
            CodecError::HeaderChecksum {
                format,
                expected: 1,
                actual: 2,
            },
            CodecError::ReservedNotZero {
                format,
                offset: 6,
                value: 1,
            },
            CodecError::BadKind { kind: 7 },
            CodecError::Inconsistent {
                format,
                reason: "records=0".into(),
            },
            CodecError::PayloadTooLarge {
                format,
                declared: 9,
                max: 8,
            },
            CodecError::TrailingBytes { format, extra: 1 },
            CodecError::PayloadChecksum {
                format,
                expected: 1,
                actual: 2,
            },
            CodecError::RecordTooLarge {
                record: 0,
                length: 9,
                max: 8,
            },
            CodecError::RecordCountMismatch {
                declared: 2,
                found: 1,
            },
            CodecError::ObjectChecksum {
                expected: 1,
                actual: 2,
            },
            CodecError::SegmentMismatch {
                expected: id,
                actual: id,
            },
            CodecError::BaseMismatch {
                expected: RecordIndex(1),
                actual: RecordIndex(2),
            },
            CodecError::BadSealedName { name: "x".into() },
        ]
    }

    #[test]
    fn messages_are_lowercase_what_failed_then_key_values() {
        for error in one_of_each() {
            let message = error.to_string();
            if let CodecError::UnsupportedVersion {
                format,
                version,
                supported,
            } = &error
                && version > supported
            {
                // The one line every reader gives for a newer format.
                let newer =
                    NewerFormat::check(format.name(), (*version).into(), (*supported).into());
                assert_eq!(Some(message), newer.map(|n| n.to_string()));
                continue;
            }
            let (what, details) = message.split_once(": ").expect("what: details");
            assert!(what.chars().all(|c| !c.is_uppercase()), "{message}");
            assert!(
                details.split(' ').all(|pair| pair.contains('=')),
                "{message}"
            );
        }
    }

    #[test]
    fn messages_name_the_format_and_escape_magic() {
        let error = &one_of_each()[1];
        assert_eq!(
            error.to_string(),
            "fragment has bad magic: expected=\"CHFR\" actual=\"\\x00\\x01\\x02\\xff\""
        );
        let truncated = CodecError::Truncated {
            format: Format::Sealed,
            needed: 56,
            available: 0,
        };
        assert_eq!(
            truncated.to_string(),
            "sealed segment truncated: needed_bytes=56 available_bytes=0"
        );
    }
}
