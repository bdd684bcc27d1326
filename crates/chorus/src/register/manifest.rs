//! The register record: the `chorus.*` fields, decoded.
//!
//! Field encodings (all values are strings):
//!
//! | field                 | value                                                   |
//! |-----------------------|---------------------------------------------------------|
//! | `chorus.format`       | `3` (this build writes); `1` and `2` are still read     |
//! | `chorus.epoch`        | decimal                                                 |
//! | `chorus.owner`        | 32 hex digits (all zero: no owner)                      |
//! | `chorus.tail_id`      | segment id `<16 hex>-<8 hex>`                           |
//! | `chorus.tail_base`    | decimal record index                                    |
//! | `chorus.pending_id`   | segment id, or empty                                    |
//! | `chorus.seal_id`      | segment id, or empty (then `seal_base`/`seal_digest` too) |
//! | `chorus.seal_base`    | decimal record index, or empty                          |
//! | `chorus.seal_digest`  | `xxh3-128:<32 hex>`, `blake3:<64 hex>` or `sha256:<64 hex>` (format 1: bare SHA-256 hex), or empty |
//! | `chorus.trunc`        | decimal record index                                    |
//! | `chorus.segments`     | space-separated `id:base:crc32c` (crc as 8 hex), base order |
//! | `chorus.replicas`     | JSON array of replica identities, in replica order      |
//! | `chorus.window`       | decimal                                                 |

use std::str::FromStr;

use super::seal_digest::{self, SealDigest};
use super::{Fields, ManifestError, validate};
use crate::codec::formats_text;
use crate::ids::{Epoch, OwnerId, RecordIndex, SegmentId};

/// The register format this build writes. It reads this one and formats 1
/// and 2, which differ only in `chorus.seal_digest` (see [`SealDigest`]):
/// format 1 spells it as bare SHA-256 hex, format 2 never holds XXH3-128. Any
/// write turns an older register into format 3, keeping the digest it had.
pub const FORMAT: u32 = 3;

/// The oldest register format this build reads.
pub const OLDEST_READABLE_FORMAT: u32 = 1;

/// The formats this build reads, as error messages spell them (`1-3`).
pub(crate) fn readable_formats_text() -> String {
    formats_text(&(u64::from(OLDEST_READABLE_FORMAT)..=u64::from(FORMAT)))
}

/// The register field naming the document's format.
pub(crate) const F_FORMAT: &str = "chorus.format";
const F_EPOCH: &str = "chorus.epoch";
const F_OWNER: &str = "chorus.owner";
const F_TAIL_ID: &str = "chorus.tail_id";
const F_TAIL_BASE: &str = "chorus.tail_base";
const F_PENDING_ID: &str = "chorus.pending_id";
const F_SEAL_ID: &str = "chorus.seal_id";
const F_SEAL_BASE: &str = "chorus.seal_base";
const F_SEAL_DIGEST: &str = seal_digest::FIELD;
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

/// The newest seal: which segment, where it starts, and the digest of its
/// sealed object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seal {
    /// The sealed segment (the directory's last entry).
    pub id: SegmentId,
    /// Its first record index.
    pub base: RecordIndex,
    /// The digest of the sealed object's bytes.
    pub digest: SealDigest,
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
            (F_SEAL_DIGEST, opt(seal.map(|s| s.digest.to_string()))),
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

    /// The format register fields are in, if this build reads it.
    pub fn stored_format(fields: &Fields) -> Result<u32, ManifestError> {
        let found = required(fields, F_FORMAT)?;
        (OLDEST_READABLE_FORMAT..=FORMAT)
            .find(|format| format.to_string() == found)
            .ok_or_else(|| ManifestError::UnsupportedFormat {
                found: found.to_owned(),
                supported: FORMAT,
            })
    }

    /// Decodes register fields, refusing unknown formats and fields, malformed
    /// values and any invariant violation.
    pub fn from_fields(fields: &Fields) -> Result<Manifest, ManifestError> {
        let format = Manifest::stored_format(fields)?;
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
            seal: decode_seal(fields, format)?,
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
    T: FromStr + std::fmt::Display,
    T::Err: std::fmt::Display,
{
    let value = required(fields, field)?;
    parse_value(field, value)
}

fn parse_value<T>(field: &'static str, value: &str) -> Result<T, ManifestError>
where
    T: FromStr + std::fmt::Display,
    T::Err: std::fmt::Display,
{
    let parsed: T = value
        .parse()
        .map_err(|e| ManifestError::invalid(field, format!("malformed value {value:?}: {e}")))?;
    // One spelling per value: no '+', no leading zeros, lowercase hex.
    if parsed.to_string() != value {
        return Err(ManifestError::invalid(
            field,
            format!("malformed value {value:?}: not in canonical form"),
        ));
    }
    Ok(parsed)
}

fn parse_optional<T>(fields: &Fields, field: &'static str) -> Result<Option<T>, ManifestError>
where
    T: FromStr + std::fmt::Display,
    T::Err: std::fmt::Display,
{
    match required(fields, field)? {
        "" => Ok(None),
        value => parse_value(field, value).map(Some),
    }
}

fn decode_seal(fields: &Fields, format: u32) -> Result<Option<Seal>, ManifestError> {
    let id: Option<SegmentId> = parse_optional(fields, F_SEAL_ID)?;
    let base: Option<u64> = parse_optional(fields, F_SEAL_BASE)?;
    let digest = required(fields, F_SEAL_DIGEST)?;
    match (id, base, digest) {
        (None, None, "") => Ok(None),
        (Some(id), Some(base), digest) => Ok(Some(Seal {
            id,
            base: RecordIndex(base),
            digest: SealDigest::decode(format, digest)?,
        })),
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

#[cfg(test)]
pub(crate) mod tests {
    //! Record encoding: round trips (fixed and generated records) and every
    //! malformed encoding refused with an error naming the field. Shared
    //! fixtures for the other register unit tests live here too.

    use std::fmt::Debug;

    use proptest::prelude::*;

    use super::*;
    use crate::ids::{Epoch, OwnerId, RecordIndex, SegmentId};
    use crate::register::MAX_WINDOW;

    pub(crate) fn seg(epoch: u64, counter: u32) -> SegmentId {
        SegmentId::new(Epoch(epoch), counter)
    }

    pub(crate) fn entry(id: SegmentId, base: u64, crc32c: u32) -> DirectoryEntry {
        DirectoryEntry {
            id,
            base: RecordIndex(base),
            crc32c,
        }
    }

    /// `n` distinct replica identities.
    pub(crate) fn replicas(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("file:///tmp/chorus/zone-{i}"))
            .collect()
    }

    /// A valid record that uses every field: a claimed epoch with its owner,
    /// three directory entries (the first a tombstone below `trunc`), a seal
    /// naming the last entry, and a pending successor.
    pub(crate) fn rich() -> Manifest {
        let digest = SealDigest::Xxh3_128(std::array::from_fn(|i| {
            (i as u8).wrapping_mul(37).wrapping_add(5)
        }));
        Manifest {
            epoch: Epoch(7),
            owner: OwnerId(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210),
            tail: seg(7, 1),
            tail_base: RecordIndex(300),
            pending: Some(seg(7, 2)),
            seal: Some(Seal {
                id: seg(7, 0),
                base: RecordIndex(250),
                digest,
            }),
            trunc: RecordIndex(120),
            segments: vec![
                entry(seg(2, 0), 0, 0xdead_beef),
                entry(seg(3, 5), 100, 0x0000_0001),
                entry(seg(7, 0), 250, 0),
            ],
            replicas: replicas(3),
            window: 8,
        }
    }

    /// Asserts that `result` failed about `field`, both in [`ManifestError::field`]
    /// and in the message.
    #[track_caller]
    pub(crate) fn assert_field<T: Debug>(
        result: Result<T, ManifestError>,
        field: &str,
    ) -> ManifestError {
        let error = match result {
            Ok(value) => panic!("expected an error naming {field}, got Ok({value:?})"),
            Err(error) => error,
        };
        assert_eq!(error.field(), field, "wrong field in: {error}");
        let message = error.to_string();
        assert!(
            message.contains(field),
            "message does not name {field}: {message}"
        );
        error
    }

    fn rich_fields() -> Fields {
        rich().to_fields().expect("rich record is valid")
    }

    /// Decodes the rich record's fields with `field` set to `value`.
    fn decode_with(field: &str, value: &str) -> Result<Manifest, ManifestError> {
        let mut fields = rich_fields();
        assert!(
            fields.contains_key(field),
            "{field} is not a field of the format"
        );
        fields.insert(field.to_owned(), value.to_owned());
        Manifest::from_fields(&fields)
    }

    /// Decodes the initial record's fields with `field` set to `value`.
    fn decode_initial_with(field: &str, value: &str) -> Result<Manifest, ManifestError> {
        let mut fields = Manifest::initial(replicas(3), 4).to_fields().unwrap();
        fields.insert(field.to_owned(), value.to_owned());
        Manifest::from_fields(&fields)
    }

    fn round_trip(manifest: &Manifest) {
        let fields = manifest.to_fields().expect("valid record encodes");
        let keys: Vec<&str> = fields.keys().map(String::as_str).collect();
        let mut expected = ALL_FIELDS.to_vec();
        expected.sort_unstable();
        assert_eq!(
            keys, expected,
            "encoding writes exactly the format's fields"
        );
        assert_eq!(&Manifest::from_fields(&fields).expect("decodes"), manifest);
        // Backends store the fields as a JSON object of strings.
        let stored = serde_json::to_string(&fields).unwrap();
        let loaded: Fields = serde_json::from_str(&stored).unwrap();
        assert_eq!(&Manifest::from_fields(&loaded).expect("decodes"), manifest);
    }

    #[test]
    fn initial_record_round_trips_with_its_exact_encoding() {
        for n in [1, 3, 5] {
            round_trip(&Manifest::initial(replicas(n), 1));
            round_trip(&Manifest::initial(replicas(n), MAX_WINDOW));
        }
        let fields = Manifest::initial(vec!["s3://b/p".into()], 16)
            .to_fields()
            .unwrap();
        let expected: Fields = [
            ("chorus.format", "3"),
            ("chorus.epoch", "0"),
            ("chorus.owner", "00000000000000000000000000000000"),
            ("chorus.tail_id", "0000000000000000-00000000"),
            ("chorus.tail_base", "0"),
            ("chorus.pending_id", "0000000000000000-00000001"),
            ("chorus.seal_id", ""),
            ("chorus.seal_base", ""),
            ("chorus.seal_digest", ""),
            ("chorus.trunc", "0"),
            ("chorus.segments", ""),
            ("chorus.replicas", r#"["s3://b/p"]"#),
            ("chorus.window", "16"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(fields, expected);
    }

    #[test]
    fn rich_record_round_trips_with_its_exact_encoding() {
        let manifest = rich();
        round_trip(&manifest);
        let fields = manifest.to_fields().unwrap();
        let get = |field: &str| fields[field].as_str();
        assert_eq!(get("chorus.epoch"), "7");
        assert_eq!(get("chorus.owner"), "0123456789abcdeffedcba9876543210");
        assert_eq!(get("chorus.tail_id"), "0000000000000007-00000001");
        assert_eq!(get("chorus.tail_base"), "300");
        assert_eq!(get("chorus.pending_id"), "0000000000000007-00000002");
        assert_eq!(get("chorus.seal_id"), "0000000000000007-00000000");
        assert_eq!(get("chorus.seal_base"), "250");
        assert_eq!(
            get("chorus.seal_digest"),
            "xxh3-128:052a4f7499bee3082d52779cc1e60b30"
        );
        assert_eq!(get("chorus.trunc"), "120");
        assert_eq!(
            get("chorus.segments"),
            "0000000000000002-00000000:0:deadbeef \
             0000000000000003-00000005:100:00000001 \
             0000000000000007-00000000:250:00000000"
        );
        assert_eq!(
            get("chorus.replicas"),
            r#"["file:///tmp/chorus/zone-0","file:///tmp/chorus/zone-1","file:///tmp/chorus/zone-2"]"#
        );
        assert_eq!(get("chorus.window"), "8");
        assert_eq!(
            directory_bytes(&manifest.segments),
            get("chorus.segments").len()
        );
    }

    #[test]
    fn record_without_pending_and_with_extreme_values_round_trips() {
        let mut manifest = rich();
        manifest.pending = None;
        manifest.epoch = Epoch(u64::MAX);
        manifest.owner = OwnerId(u128::MAX);
        manifest.tail = seg(u64::MAX, u32::MAX);
        manifest.tail_base = RecordIndex(u64::MAX);
        manifest.trunc = RecordIndex(u64::MAX);
        manifest.segments[2].crc32c = u32::MAX;
        manifest.replicas = vec!["ä \"quoted\" \\ zone".into()];
        manifest.window = MAX_WINDOW;
        round_trip(&manifest);
    }

    #[test]
    fn accessors_follow_the_directory() {
        let manifest = rich();
        assert_eq!(manifest.replica_count(), 3);
        assert_eq!(manifest.quorum(), 2);
        assert_eq!(Manifest::initial(replicas(1), 1).quorum(), 1);
        assert_eq!(Manifest::initial(replicas(5), 1).quorum(), 3);
        assert_eq!(manifest.entry_end(0), RecordIndex(100));
        assert_eq!(manifest.entry_end(1), RecordIndex(250));
        assert_eq!(manifest.entry_end(2), RecordIndex(300));
        assert!(manifest.is_tombstone(0));
        assert!(!manifest.is_tombstone(1));
        assert!(!manifest.is_tombstone(2));
    }

    #[test]
    fn unknown_format_is_refused() {
        let next = (FORMAT + 1).to_string();
        for found in [next.as_str(), "0", "01", "1.0", "3.0", "", "one"] {
            let error = assert_field(decode_with("chorus.format", found), "chorus.format");
            assert_eq!(
                error,
                ManifestError::UnsupportedFormat {
                    found: found.to_owned(),
                    supported: FORMAT,
                }
            );
        }
        // A newer build's register is said to be one, in one line.
        let newer = decode_with("chorus.format", &next).unwrap_err();
        assert_eq!(
            newer.to_string(),
            format!(
                "register written by a newer Chorus: format {next}; this build reads up to \
                 {FORMAT}: field=chorus.format"
            )
        );
        let never = decode_with("chorus.format", "0").unwrap_err();
        assert_eq!(
            never.to_string(),
            "unsupported register format: field=chorus.format value=\"0\" supported=1-3"
        );
        // A future format may add fields: the format check comes first.
        let mut fields = rich_fields();
        fields.insert("chorus.format".into(), next);
        fields.insert("chorus.novelty".into(), "x".into());
        fields.remove("chorus.window");
        assert!(matches!(
            Manifest::from_fields(&fields),
            Err(ManifestError::UnsupportedFormat { .. })
        ));
    }

    /// A register as a build of format 1 or 2 stored it: the rich record's
    /// fields with that format and `seal_digest` spelled as it was.
    fn older_register(format: &str, seal_digest: &str) -> Fields {
        [
            ("chorus.format", format),
            ("chorus.epoch", "7"),
            ("chorus.owner", "0123456789abcdeffedcba9876543210"),
            ("chorus.tail_id", "0000000000000007-00000001"),
            ("chorus.tail_base", "300"),
            ("chorus.pending_id", "0000000000000007-00000002"),
            ("chorus.seal_id", "0000000000000007-00000000"),
            ("chorus.seal_base", "250"),
            ("chorus.seal_digest", seal_digest),
            ("chorus.trunc", "120"),
            (
                "chorus.segments",
                "0000000000000002-00000000:0:deadbeef 0000000000000007-00000000:250:00000000",
            ),
            ("chorus.replicas", r#"["a","b","c"]"#),
            ("chorus.window", "8"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// Registers written by builds of formats 1 (bare SHA-256) and 2
    /// (`blake3:` or `sha256:`), byte for byte as they stored them, still
    /// decode and are written back as format 3 with the digest they had.
    #[test]
    fn older_registers_are_read_and_rewritten_as_format_three() {
        let hex64 = "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9";
        let cases = [
            ("1", hex64.to_owned(), "sha256"),
            ("2", format!("blake3:{hex64}"), "blake3"),
            ("2", format!("sha256:{hex64}"), "sha256"),
        ];
        for (format, stored_digest, algorithm) in cases {
            let older = older_register(format, &stored_digest);
            let manifest = Manifest::from_fields(&older).expect("an older format decodes");
            let seal = manifest.seal.unwrap();
            assert_eq!(seal.digest.algorithm(), algorithm);
            assert_eq!(hex::encode(seal.digest.bytes()), hex64);
            let rewritten = manifest.to_fields().unwrap();
            assert_eq!(rewritten["chorus.format"], "3");
            assert_eq!(
                rewritten["chorus.seal_digest"],
                format!("{algorithm}:{hex64}")
            );
            let mut others = rewritten.clone();
            others.insert("chorus.format".into(), format.into());
            others.insert("chorus.seal_digest".into(), stored_digest);
            assert_eq!(
                others, older,
                "format {format}: only the format and the digest's spelling change"
            );
            assert_eq!(Manifest::from_fields(&rewritten).unwrap(), manifest);
        }
        // Each format's spellings belong to it alone.
        let xxh3 = "xxh3-128:0a1b2c3d4e5f60718293a4b5c6d7e8f9";
        for (format, digest) in [
            ("1", format!("sha256:{hex64}")),
            ("1", xxh3.to_owned()),
            ("2", hex64.to_owned()),
            ("2", xxh3.to_owned()),
            ("3", hex64.to_owned()),
        ] {
            let fields = older_register(format, &digest);
            assert_field(Manifest::from_fields(&fields), "chorus.seal_digest");
        }
        let current = older_register("3", xxh3);
        let manifest = Manifest::from_fields(&current).expect("format 3 decodes");
        assert_eq!(manifest.to_fields().unwrap(), current);
    }

    #[test]
    fn every_missing_field_is_named() {
        for field in ALL_FIELDS {
            let mut fields = rich_fields();
            fields.remove(field);
            let error = assert_field(Manifest::from_fields(&fields), field);
            assert!(error.to_string().contains("missing"), "{error}");
        }
        assert_field(Manifest::from_fields(&Fields::new()), "chorus.format");
    }

    #[test]
    fn unknown_fields_are_refused() {
        for unknown in ["chorus.colour", "colour", "chorus.Epoch", ""] {
            let mut fields = rich_fields();
            fields.insert(unknown.to_owned(), "x".to_owned());
            let error = assert_field(Manifest::from_fields(&fields), unknown);
            assert_eq!(
                error,
                ManifestError::UnknownField {
                    field: unknown.to_owned()
                }
            );
        }
    }

    #[test]
    fn malformed_numbers_are_named() {
        let cases = [
            ("chorus.epoch", "seven"),
            ("chorus.epoch", ""),
            ("chorus.epoch", "-7"),
            ("chorus.epoch", "7.0"),
            ("chorus.epoch", " 7"),
            ("chorus.epoch", "18446744073709551616"),
            ("chorus.tail_base", "3e2"),
            ("chorus.tail_base", ""),
            ("chorus.trunc", "0x78"),
            ("chorus.trunc", ""),
            ("chorus.window", "8 "),
            ("chorus.window", "4294967296"),
            ("chorus.window", ""),
            ("chorus.seal_base", "two-fifty"),
            ("chorus.seal_base", "-250"),
        ];
        for (field, value) in cases {
            let error = assert_field(decode_with(field, value), field);
            assert!(
                error.to_string().contains("malformed"),
                "{field}={value:?}: {error}"
            );
        }
    }

    #[test]
    fn plus_signs_are_refused() {
        let cases = [
            ("chorus.epoch", "+7"),
            ("chorus.tail_base", "+300"),
            ("chorus.trunc", "+120"),
            ("chorus.window", "+8"),
            ("chorus.seal_base", "+250"),
            ("chorus.owner", "+123456789abcdeffedcba9876543210"),
        ];
        for (field, value) in cases {
            assert_field(decode_with(field, value), field);
        }
        let segments = rich_fields()["chorus.segments"].replacen(":100:", ":+100:", 1);
        assert_field(decode_with("chorus.segments", &segments), "chorus.segments");
    }

    #[test]
    fn bad_hex_is_named() {
        let owner_cases = [
            "",
            "0",
            "0123456789abcdeffedcba987654321",
            "0123456789abcdeffedcba98765432100",
            "0123456789abcdeffedcba987654321g",
            "0123456789abcdef-edcba9876543210",
        ];
        for value in owner_cases {
            assert_field(decode_with("chorus.owner", value), "chorus.owner");
        }
        let digest = rich_fields()["chorus.seal_digest"].clone();
        let digest_cases = [
            digest[..digest.len() - 1].to_owned(),
            format!("{digest}00"),
            digest.to_uppercase(),
            format!("{}zz", &digest[..digest.len() - 2]),
            digest.replacen("xxh3-128:", "xxh3-128:0x", 1),
            digest.replacen("xxh3-128:", "blake3:", 1),
            digest.replacen("xxh3-128:", "", 1),
        ];
        for value in digest_cases {
            assert_field(
                decode_with("chorus.seal_digest", &value),
                "chorus.seal_digest",
            );
        }
        let segments = rich_fields()["chorus.segments"].clone();
        let crc_cases = [
            segments.replacen(":deadbeef", ":DEADBEEF", 1),
            segments.replacen(":deadbeef", ":deadbee", 1),
            segments.replacen(":deadbeef", ":0deadbeef", 1),
            segments.replacen(":deadbeef", ":deadbeeg", 1),
            segments.replacen(":deadbeef", ":+eadbeef", 1),
            segments.replacen(":deadbeef", "", 1),
        ];
        for value in crc_cases {
            assert_field(decode_with("chorus.segments", &value), "chorus.segments");
        }
    }

    #[test]
    fn bad_segment_ids_are_named() {
        let bad_ids = [
            "",
            "7-1",
            "0000000000000007_00000001",
            "000000000000000A-00000001",
            "0000000000000007-0000001",
            "0000000000000007-00000001 ",
        ];
        for bad in bad_ids {
            // tail_id has no empty spelling; the optional ids treat "" as unset.
            assert_field(decode_with("chorus.tail_id", bad), "chorus.tail_id");
            if !bad.is_empty() {
                assert_field(decode_with("chorus.pending_id", bad), "chorus.pending_id");
                assert_field(decode_with("chorus.seal_id", bad), "chorus.seal_id");
                let segments =
                    rich_fields()["chorus.segments"].replacen("0000000000000003-00000005", bad, 1);
                assert_field(decode_with("chorus.segments", &segments), "chorus.segments");
            }
        }
    }

    #[test]
    fn malformed_directory_entries_are_named() {
        let good = rich_fields()["chorus.segments"].clone();
        let cases = [
            " ".to_owned(),
            format!("{good} "),
            format!(" {good}"),
            good.replacen(' ', "  ", 1),
            good.replacen(' ', ",", 1),
            "0000000000000002-00000000:0".to_owned(),
            "0000000000000002-00000000:0:deadbeef:1".to_owned(),
            "0000000000000002-00000000::deadbeef".to_owned(),
            "0000000000000002-00000000:-1:deadbeef".to_owned(),
        ];
        for value in cases {
            let error = assert_field(decode_with("chorus.segments", &value), "chorus.segments");
            assert!(error.to_string().contains("entry"), "{value:?}: {error}");
        }
    }

    #[test]
    fn partially_set_seal_fields_are_named() {
        let fields = rich_fields();
        let digest = fields["chorus.seal_digest"].clone();
        // (seal_id, seal_base, seal_digest) -> the field named
        let cases = [
            ("", "250", digest.as_str(), "chorus.seal_id"),
            ("", "250", "", "chorus.seal_id"),
            ("", "", digest.as_str(), "chorus.seal_id"),
            (
                "0000000000000007-00000000",
                "",
                digest.as_str(),
                "chorus.seal_base",
            ),
            ("0000000000000007-00000000", "", "", "chorus.seal_base"),
            ("0000000000000007-00000000", "250", "", "chorus.seal_digest"),
        ];
        for (id, base, digest, field) in cases {
            let mut fields = fields.clone();
            fields.insert("chorus.seal_id".into(), id.into());
            fields.insert("chorus.seal_base".into(), base.into());
            fields.insert("chorus.seal_digest".into(), digest.into());
            assert_field(Manifest::from_fields(&fields), field);
        }
    }

    #[test]
    fn replicas_that_are_not_a_json_string_array_are_named() {
        let cases = [
            "",
            "a,b,c",
            "[a, b, c]",
            r#"["a","b","c""#,
            "[1,2,3]",
            r#"["a",null,"c"]"#,
            r#"{"0":"a"}"#,
            r#""a""#,
            "null",
        ];
        for value in cases {
            let error = assert_field(decode_with("chorus.replicas", value), "chorus.replicas");
            assert!(error.to_string().contains("JSON"), "{value:?}: {error}");
        }
    }

    #[test]
    fn decoding_checks_the_invariants() {
        // One representative per validation step; validate.rs covers each fully.
        let cases = [
            ("chorus.replicas", r#"["a","b","a"]"#, "chorus.replicas"),
            ("chorus.replicas", r#"["a","b"]"#, "chorus.replicas"),
            ("chorus.replicas", r#"["a","b","c","d"]"#, "chorus.replicas"),
            ("chorus.replicas", "[]", "chorus.replicas"),
            ("chorus.window", "0", "chorus.window"),
            ("chorus.window", "65", "chorus.window"),
            (
                "chorus.owner",
                "00000000000000000000000000000000",
                "chorus.owner",
            ),
            (
                "chorus.tail_id",
                "0000000000000008-00000000",
                "chorus.tail_id",
            ),
            (
                "chorus.pending_id",
                "0000000000000008-00000000",
                "chorus.pending_id",
            ),
            (
                "chorus.pending_id",
                "0000000000000007-00000001",
                "chorus.pending_id",
            ),
            ("chorus.tail_base", "250", "chorus.segments"),
            ("chorus.seal_base", "100", "chorus.seal_id"),
        ];
        for (field, value, named) in cases {
            assert_field(decode_with(field, value), named);
        }
        assert_field(
            decode_initial_with("chorus.owner", "0123456789abcdeffedcba9876543210"),
            "chorus.owner",
        );
        assert_field(decode_initial_with("chorus.epoch", "3"), "chorus.owner");
        // The initial record retains from tail_base 0: a floor below it is a hole.
        assert_field(decode_initial_with("chorus.tail_base", "5"), "chorus.trunc");
        assert_field(
            decode_initial_with("chorus.segments", "0000000000000000-00000000:0:00000000"),
            "chorus.tail_id",
        );
    }

    #[test]
    fn encoding_refuses_an_invalid_record() {
        let mut manifest = rich();
        manifest.window = 0;
        assert_field(manifest.to_fields(), "chorus.window");
        let mut manifest = rich();
        manifest.seal = None;
        assert_field(manifest.to_fields(), "chorus.seal_id");
    }

    /// Valid records built constructively: `sealed` directory entries, the
    /// tail and (maybe) the pending segment take strictly increasing ids named
    /// by granted epochs; directory bases strictly increase below `tail_base`;
    /// the seal names the last entry; `trunc` is at or above the lowest
    /// retained index.
    pub(crate) fn valid_manifest() -> impl Strategy<Value = Manifest> {
        let epoch = prop_oneof![Just(0u64), 1..=20u64, any::<u64>()];
        (epoch, 0usize..6, any::<bool>())
            .prop_flat_map(|(epoch, sealed, has_pending)| {
                let owner = if epoch == 0 {
                    Just(0u128).boxed()
                } else {
                    (1..=u128::MAX).boxed()
                };
                let ids = prop::collection::btree_set(
                    (0..=epoch, any::<u32>()),
                    sealed + 1 + usize::from(has_pending),
                );
                let bases = prop::collection::btree_set(any::<u64>(), sealed + 1);
                let crcs = prop::collection::vec(any::<u32>(), sealed);
                let trunc_above = prop_oneof![Just(0u64), 0..1000u64, any::<u64>()];
                let replicas = prop::sample::select(vec![1usize, 3, 5]).prop_flat_map(|n| {
                    prop::collection::btree_set("\\PC{1,12}", n)
                        .prop_map(|set| set.into_iter().collect::<Vec<_>>())
                        .prop_shuffle()
                });
                (
                    (Just(epoch), owner, Just(has_pending), ids, bases),
                    (
                        crcs,
                        any::<[u8; 32]>(),
                        trunc_above,
                        replicas,
                        1..=MAX_WINDOW,
                    ),
                )
            })
            .prop_map(
                |(
                    (epoch, owner, has_pending, ids, bases),
                    (crcs, digest, trunc_above, replicas, window),
                )| {
                    let mut ids: Vec<SegmentId> = ids.into_iter().map(|(e, c)| seg(e, c)).collect();
                    let pending = if has_pending { ids.pop() } else { None };
                    let tail = ids.pop().expect("one id per tail");
                    let mut bases: Vec<u64> = bases.into_iter().collect();
                    let tail_base = bases.pop().expect("one base per tail");
                    let segments: Vec<DirectoryEntry> = ids
                        .iter()
                        .zip(&bases)
                        .zip(&crcs)
                        .map(|((id, base), crc)| entry(*id, *base, *crc))
                        .collect();
                    let seal = segments.last().map(|last| Seal {
                        id: last.id,
                        base: last.base,
                        // Every algorithm a format-3 register may hold.
                        digest: match digest[0] % 3 {
                            0 => SealDigest::Xxh3_128(digest[..16].try_into().unwrap()),
                            1 => SealDigest::Blake3(digest),
                            _ => SealDigest::Sha256(digest),
                        },
                    });
                    let lowest = segments.first().map_or(tail_base, |first| first.base.0);
                    Manifest {
                        epoch: Epoch(epoch),
                        owner: OwnerId(owner),
                        tail,
                        tail_base: RecordIndex(tail_base),
                        pending,
                        seal,
                        trunc: RecordIndex(lowest.saturating_add(trunc_above)),
                        segments,
                        replicas,
                        window,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn generated_valid_records_round_trip(manifest in valid_manifest()) {
            prop_assert!(validate(&manifest).is_ok(), "{:?}", validate(&manifest));
            round_trip(&manifest);
        }

        #[test]
        fn a_dropped_field_is_always_named(manifest in valid_manifest(), which in 0..ALL_FIELDS.len()) {
            let mut fields = manifest.to_fields().unwrap();
            fields.remove(ALL_FIELDS[which]);
            assert_field(Manifest::from_fields(&fields), ALL_FIELDS[which]);
        }
    }
}
