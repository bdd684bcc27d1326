//! The register record: the `chorus.*` fields, decoded.
//!
//! Field encodings (all values are strings):
//!
//! | field                 | value                                                   |
//! |-----------------------|---------------------------------------------------------|
//! | `chorus.format`       | `1`                                                     |
//! | `chorus.epoch`        | decimal                                                 |
//! | `chorus.owner`        | 32 hex digits (all zero: no owner)                      |
//! | `chorus.tail_id`      | segment id `<16 hex>-<8 hex>`                           |
//! | `chorus.tail_base`    | decimal record index                                    |
//! | `chorus.pending_id`   | segment id, or empty                                    |
//! | `chorus.seal_id`      | segment id, or empty (then `seal_base`/`seal_digest` too) |
//! | `chorus.seal_base`    | decimal record index, or empty                          |
//! | `chorus.seal_digest`  | 64 hex digits (SHA-256 of the sealed object), or empty  |
//! | `chorus.trunc`        | decimal record index                                    |
//! | `chorus.segments`     | space-separated `id:base:crc32c` (crc as 8 hex), base order |
//! | `chorus.replicas`     | JSON array of replica identities, in replica order      |
//! | `chorus.window`       | decimal                                                 |

use std::str::FromStr;

use super::{Fields, ManifestError, validate};
use crate::ids::{Epoch, OwnerId, RecordIndex, SegmentId};

/// The register format this build reads and writes.
pub const FORMAT: u32 = 1;

const F_FORMAT: &str = "chorus.format";
const F_EPOCH: &str = "chorus.epoch";
const F_OWNER: &str = "chorus.owner";
const F_TAIL_ID: &str = "chorus.tail_id";
const F_TAIL_BASE: &str = "chorus.tail_base";
const F_PENDING_ID: &str = "chorus.pending_id";
const F_SEAL_ID: &str = "chorus.seal_id";
const F_SEAL_BASE: &str = "chorus.seal_base";
const F_SEAL_DIGEST: &str = "chorus.seal_digest";
const F_TRUNC: &str = "chorus.trunc";
const F_SEGMENTS: &str = "chorus.segments";
const F_REPLICAS: &str = "chorus.replicas";
const F_WINDOW: &str = "chorus.window";

/// Every field of the format, so unknown ones can be refused.
const ALL_FIELDS: [&str; 13] = [
    F_FORMAT,
    F_EPOCH,
    F_OWNER,
    F_TAIL_ID,
    F_TAIL_BASE,
    F_PENDING_ID,
    F_SEAL_ID,
    F_SEAL_BASE,
    F_SEAL_DIGEST,
    F_TRUNC,
    F_SEGMENTS,
    F_REPLICAS,
    F_WINDOW,
];

/// One sealed segment in the directory: `id:base:crc32c`. It holds the records
/// from `base` up to the next entry's base (or `tail_base` for the last one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectoryEntry {
    /// The segment.
    pub id: SegmentId,
    /// Index of its first record.
    pub base: RecordIndex,
    /// CRC32C of its sealed object, which is also part of the object's key.
    pub crc32c: u32,
}

/// The newest seal: which segment, where it starts, and the SHA-256 of its
/// sealed object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seal {
    /// The sealed segment (the directory's last entry).
    pub id: SegmentId,
    /// Its first record index.
    pub base: RecordIndex,
    /// SHA-256 of the sealed object's bytes.
    pub digest: [u8; 32],
}

impl Seal {
    /// The digest as 64 lowercase hex digits.
    pub fn digest_hex(&self) -> String {
        hex::encode(self.digest)
    }
}

/// The decoded register record. Construct through [`Manifest::initial`] or
/// decoding; every instance that is written has passed [`validate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Highest epoch granted.
    pub epoch: Epoch,
    /// Incarnation id of the writer holding `epoch`.
    pub owner: OwnerId,
    /// The active segment.
    pub tail: SegmentId,
    /// First record index of the active segment.
    pub tail_base: RecordIndex,
    /// The pre-registered successor of the active segment.
    pub pending: Option<SegmentId>,
    /// The newest seal, if any segment is sealed.
    pub seal: Option<Seal>,
    /// The truncation floor: first index still retained.
    pub trunc: RecordIndex,
    /// The sealed directory, in base order.
    pub segments: Vec<DirectoryEntry>,
    /// Ordered replica identities; their count is N.
    pub replicas: Vec<String>,
    /// Per-replica fragment window, fixed at creation.
    pub window: u32,
}

impl Manifest {
    /// The record of a freshly created log: epoch 0 with no owner, an empty tail
    /// segment and its pending successor (both named by epoch 0, which never
    /// writes), nothing sealed or truncated.
    pub fn initial(replicas: Vec<String>, window: u32) -> Manifest {
        Manifest {
            epoch: Epoch::NONE,
            owner: OwnerId::NONE,
            tail: SegmentId::new(Epoch::NONE, 0),
            tail_base: RecordIndex(0),
            pending: Some(SegmentId::new(Epoch::NONE, 1)),
            seal: None,
            trunc: RecordIndex(0),
            segments: Vec::new(),
            replicas,
            window,
        }
    }

    /// N, the number of replicas.
    pub fn replica_count(&self) -> usize {
        self.replicas.len()
    }

    /// Q = N/2 + 1, the write quorum.
    pub fn quorum(&self) -> usize {
        self.replicas.len() / 2 + 1
    }

    /// Where directory entry `position` ends (exclusive): the next entry's base,
    /// or `tail_base` for the last one.
    pub fn entry_end(&self, position: usize) -> RecordIndex {
        self.segments
            .get(position + 1)
            .map_or(self.tail_base, |next| next.base)
    }

    /// Whether directory entry `position` lies wholly below the truncation
    /// floor: a tombstone kept until its objects are gone from every replica.
    pub fn is_tombstone(&self, position: usize) -> bool {
        self.entry_end(position) <= self.trunc
    }

    /// Encodes the record as register fields, validating it first.
    pub fn to_fields(&self) -> Result<Fields, ManifestError> {
        validate(self)?;
        let seal = self.seal.as_ref();
        let pairs = [
            (F_FORMAT, FORMAT.to_string()),
            (F_EPOCH, self.epoch.0.to_string()),
            (F_OWNER, self.owner.to_string()),
            (F_TAIL_ID, self.tail.to_string()),
            (F_TAIL_BASE, self.tail_base.0.to_string()),
            (F_PENDING_ID, opt(self.pending.map(|id| id.to_string()))),
            (F_SEAL_ID, opt(seal.map(|s| s.id.to_string()))),
            (F_SEAL_BASE, opt(seal.map(|s| s.base.0.to_string()))),
            (F_SEAL_DIGEST, opt(seal.map(Seal::digest_hex))),
            (F_TRUNC, self.trunc.0.to_string()),
            (F_SEGMENTS, encode_segments(&self.segments)),
            (
                F_REPLICAS,
                serde_json::to_string(&self.replicas).expect("strings encode"),
            ),
            (F_WINDOW, self.window.to_string()),
        ];
        Ok(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
    }

    /// Decodes register fields, refusing unknown formats and fields, malformed
    /// values and any invariant violation.
    pub fn from_fields(fields: &Fields) -> Result<Manifest, ManifestError> {
        let format = required(fields, F_FORMAT)?;
        if format != FORMAT.to_string() {
            return Err(ManifestError::UnsupportedFormat {
                found: format.to_owned(),
                supported: FORMAT,
            });
        }
        if let Some(unknown) = fields.keys().find(|k| !ALL_FIELDS.contains(&k.as_str())) {
            return Err(ManifestError::UnknownField {
                field: unknown.clone(),
            });
        }
        let manifest = Manifest {
            epoch: Epoch(parse(fields, F_EPOCH)?),
            owner: parse(fields, F_OWNER)?,
            tail: parse(fields, F_TAIL_ID)?,
            tail_base: RecordIndex(parse(fields, F_TAIL_BASE)?),
            pending: parse_optional(fields, F_PENDING_ID)?,
            seal: decode_seal(fields)?,
            trunc: RecordIndex(parse(fields, F_TRUNC)?),
            segments: decode_segments(required(fields, F_SEGMENTS)?)?,
            replicas: serde_json::from_str(required(fields, F_REPLICAS)?).map_err(|e| {
                ManifestError::invalid(F_REPLICAS, format!("not a JSON array of strings: {e}"))
            })?,
            window: parse(fields, F_WINDOW)?,
        };
        validate(&manifest)?;
        Ok(manifest)
    }
}

fn opt(value: Option<String>) -> String {
    value.unwrap_or_default()
}

fn required<'a>(fields: &'a Fields, field: &'static str) -> Result<&'a str, ManifestError> {
    fields
        .get(field)
        .map(String::as_str)
        .ok_or_else(|| ManifestError::invalid(field, "missing"))
}

fn parse<T>(fields: &Fields, field: &'static str) -> Result<T, ManifestError>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    let value = required(fields, field)?;
    parse_value(field, value)
}

fn parse_value<T>(field: &'static str, value: &str) -> Result<T, ManifestError>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    // Rust's integer parsing accepts a leading '+'; the format has one spelling.
    if value.starts_with('+') {
        return Err(ManifestError::invalid(
            field,
            format!("malformed value {value:?}"),
        ));
    }
    value
        .parse()
        .map_err(|e| ManifestError::invalid(field, format!("malformed value {value:?}: {e}")))
}

fn parse_optional<T>(fields: &Fields, field: &'static str) -> Result<Option<T>, ManifestError>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    match required(fields, field)? {
        "" => Ok(None),
        value => parse_value(field, value).map(Some),
    }
}

fn decode_seal(fields: &Fields) -> Result<Option<Seal>, ManifestError> {
    let id: Option<SegmentId> = parse_optional(fields, F_SEAL_ID)?;
    let base: Option<u64> = parse_optional(fields, F_SEAL_BASE)?;
    let digest = required(fields, F_SEAL_DIGEST)?;
    match (id, base, digest) {
        (None, None, "") => Ok(None),
        (Some(id), Some(base), digest) => {
            let mut bytes = [0u8; 32];
            hex::decode_to_slice(digest, &mut bytes).map_err(|_| {
                ManifestError::invalid(F_SEAL_DIGEST, "expected 64 lowercase hex digits")
            })?;
            if hex::encode(bytes) != digest {
                return Err(ManifestError::invalid(
                    F_SEAL_DIGEST,
                    "expected lowercase hex",
                ));
            }
            Ok(Some(Seal {
                id,
                base: RecordIndex(base),
                digest: bytes,
            }))
        }
        (None, _, _) => Err(ManifestError::invalid(
            F_SEAL_ID,
            "empty while seal_base or seal_digest is set",
        )),
        (Some(_), None, _) => Err(ManifestError::invalid(
            F_SEAL_BASE,
            "empty while seal_id is set",
        )),
    }
}

fn encode_segments(segments: &[DirectoryEntry]) -> String {
    let entries: Vec<String> = segments
        .iter()
        .map(|e| format!("{}:{}:{:08x}", e.id, e.base.0, e.crc32c))
        .collect();
    entries.join(" ")
}

fn decode_segments(value: &str) -> Result<Vec<DirectoryEntry>, ManifestError> {
    if value.is_empty() {
        return Ok(Vec::new());
    }
    value
        .split(' ')
        .enumerate()
        .map(|(position, entry)| {
            decode_entry(entry).ok_or_else(|| {
                ManifestError::invalid(
                    F_SEGMENTS,
                    format!("entry {position} {entry:?} is not <segment-id>:<base>:<crc32c 8 hex>"),
                )
            })
        })
        .collect()
}

fn decode_entry(entry: &str) -> Option<DirectoryEntry> {
    let mut parts = entry.split(':');
    let (id, base, crc) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || base.starts_with('+') || crc.len() != 8 {
        return None;
    }
    let crc32c = u32::from_str_radix(crc, 16).ok()?;
    if format!("{crc32c:08x}") != crc {
        return None;
    }
    Some(DirectoryEntry {
        id: id.parse().ok()?,
        base: RecordIndex(base.parse().ok()?),
        crc32c,
    })
}

/// The byte length of the encoded directory field, for capacity checks.
pub(crate) fn directory_bytes(segments: &[DirectoryEntry]) -> usize {
    encode_segments(segments).len()
}
