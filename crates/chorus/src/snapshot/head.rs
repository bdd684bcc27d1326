//! `HEAD.json` and the names of snapshot payloads (docs/design/0002, Objects).

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::ids::RecordIndex;
use crate::lease::{
    DatabaseKey, DocumentError, FencingToken, Fields, Generation, HolderId, LeaseHolder, Term,
    encode,
};
use crate::log::offload::offload;

/// The HEAD document format this build writes and reads.
pub const HEAD_FORMAT: u64 = 1;

/// Digits of each number in a payload key, zero-padded so keys sort numerically.
const KEY_DIGITS: usize = 20;

/// The key of a database's HEAD document: `<db>/HEAD.json`.
pub fn head_key(database: &DatabaseKey) -> String {
    database.child("HEAD.json")
}

/// The directory of a database's payloads: `<db>/snapshots`.
pub fn payload_prefix(database: &DatabaseKey) -> String {
    database.child("snapshots")
}

/// Counts HEAD documents: every claim and publication writes a higher one, so
/// HEAD's bytes never recur (no ABA on stores whose version is a content hash,
/// like S3's ETag). Sequences start at 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PublicationSequence(pub u64);

impl PublicationSequence {
    /// The sequence of a database's first HEAD.
    pub const FIRST: PublicationSequence = PublicationSequence(1);

    /// The highest sequence a stored HEAD may carry.
    pub const MAX_STORED: PublicationSequence = PublicationSequence(u64::MAX / 2);

    /// The next sequence. Panics on overflow, which cannot happen from a
    /// decoded HEAD (at most [`MAX_STORED`](Self::MAX_STORED)) short of 2^63
    /// publications.
    pub fn next(self) -> PublicationSequence {
        PublicationSequence(
            self.0
                .checked_add(1)
                .expect("publication sequence overflow"),
        )
    }
}

impl fmt::Display for PublicationSequence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Names one payload: the lease generation that uploaded it and the sequence
/// of the HEAD it was uploaded for. Written `g<generation>-s<sequence>`, both
/// zero-padded to 20 digits. Ordered by sequence, then generation (newest last).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PayloadId {
    /// Generation of the lease that uploaded the payload.
    pub generation: Generation,
    /// Sequence of the HEAD the payload was uploaded for.
    pub sequence: PublicationSequence,
}

impl PayloadId {
    /// The payload's object key in `database`.
    pub fn key(&self, database: &DatabaseKey) -> String {
        format!("{}/{self}", payload_prefix(database))
    }

    /// The id a payload key of `database` names, if `key` is one.
    pub fn from_key(database: &DatabaseKey, key: &str) -> Option<PayloadId> {
        key.strip_prefix(&payload_prefix(database))?
            .strip_prefix('/')?
            .parse()
            .ok()
    }
}

impl Ord for PayloadId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.sequence, self.generation).cmp(&(other.sequence, other.generation))
    }
}

impl PartialOrd for PayloadId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for PayloadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "g{:020}-s{:020}", self.generation.0, self.sequence.0)
    }
}

impl FromStr for PayloadId {
    type Err = ();

    /// Accepts exactly the spelling [`Display`](fmt::Display) writes.
    fn from_str(s: &str) -> Result<Self, ()> {
        let number = |digits: &str| -> Result<u64, ()> {
            if digits.len() != KEY_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(());
            }
            digits.parse().map_err(|_| ())
        };
        let (generation, sequence) = s.strip_prefix('g').ok_or(())?.split_once("-s").ok_or(())?;
        let (generation, sequence) = (number(generation)?, number(sequence)?);
        if generation == 0 || sequence == 0 {
            return Err(());
        }
        Ok(PayloadId {
            generation: Generation(generation),
            sequence: PublicationSequence(sequence),
        })
    }
}

/// A random id of one [`PublicationStore`](super::PublicationStore) (one
/// boot), written into every HEAD it writes, as 16 lowercase hex digits. It
/// makes HEAD bytes unique per writer even when two boots share a lease
/// identity and a frozen clock, so reading back and finding identical bytes
/// really does mean "our write landed".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublisherId(pub u64);

impl PublisherId {
    /// A fresh random id.
    pub fn random() -> PublisherId {
        PublisherId(rand::random())
    }
}

impl fmt::Display for PublisherId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl FromStr for PublisherId {
    type Err = ();

    /// Accepts 16 lowercase hex digits only.
    fn from_str(s: &str) -> Result<Self, ()> {
        let lower_hex = s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if s.len() != 16 || !lower_hex {
            return Err(());
        }
        u64::from_str_radix(s, 16).map(PublisherId).map_err(|_| ())
    }
}

/// A SHA-256 digest, written as 64 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sha256Digest(pub [u8; 32]);

impl Sha256Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Sha256Digest {
        Sha256Digest(Sha256::digest(bytes).into())
    }

    /// The digest of a whole snapshot payload, computed off the async
    /// workers: at a large state it takes tens of milliseconds, during
    /// which a worker would serve nothing else.
    pub(crate) async fn of_payload(bytes: &Bytes) -> Sha256Digest {
        let bytes = bytes.clone();
        offload(move || Sha256Digest::of(&bytes)).await
    }
}

impl fmt::Display for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl FromStr for Sha256Digest {
    type Err = ();

    /// Accepts 64 lowercase hex digits only, so each digest has one spelling.
    fn from_str(s: &str) -> Result<Self, ()> {
        if s.len() != 64 || s.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(());
        }
        let mut digest = [0u8; 32];
        hex::decode_to_slice(s, &mut digest).map_err(|_| ())?;
        Ok(Sha256Digest(digest))
    }
}

/// The contents of `HEAD.json`: which payload is current, and which lease
/// incarnation wrote this HEAD (its stamp).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The database.
    pub database_key: DatabaseKey,
    /// The holder whose lease stamped this HEAD.
    pub holder_id: HolderId,
    /// That lease's term.
    pub term: Term,
    /// That lease's generation.
    pub lease_generation: Generation,
    /// This HEAD's sequence; strictly higher than every earlier HEAD's.
    pub publication_sequence: PublicationSequence,
    /// The current payload.
    pub snapshot: PayloadId,
    /// Replay resumes here: the payload reflects every log record below it.
    pub wal_index: RecordIndex,
    /// The payload's size.
    pub payload_size_bytes: u64,
    /// The payload's SHA-256, verified on download.
    pub payload_sha256: Sha256Digest,
    /// The publication store (boot) that wrote this HEAD.
    pub publisher_id: PublisherId,
    /// Writer's wall clock when this HEAD was written, in ms since the epoch.
    pub updated_at_ms: u64,
}

impl Head {
    /// A HEAD naming a payload of `payload_size_bytes` whose digest is
    /// `payload_sha256`, stamped with `lease`.
    pub(crate) fn for_payload(
        lease: &LeaseHolder,
        publisher_id: PublisherId,
        snapshot: PayloadId,
        (payload_size_bytes, payload_sha256): (u64, Sha256Digest),
        wal_index: RecordIndex,
        updated_at_ms: u64,
    ) -> Head {
        Head {
            database_key: lease.database().clone(),
            holder_id: lease.holder_id().clone(),
            term: lease.term(),
            lease_generation: lease.generation(),
            publication_sequence: snapshot.sequence,
            snapshot,
            wal_index,
            payload_size_bytes,
            payload_sha256,
            publisher_id,
            updated_at_ms,
        }
    }

    /// This HEAD's payload under a new stamp: `lease`, `publisher_id` and the
    /// next sequence.
    pub(crate) fn restamped(
        &self,
        lease: &LeaseHolder,
        publisher_id: PublisherId,
        updated_at_ms: u64,
    ) -> Head {
        Head {
            holder_id: lease.holder_id().clone(),
            term: lease.term(),
            lease_generation: lease.generation(),
            publication_sequence: self.publication_sequence.next(),
            publisher_id,
            updated_at_ms,
            ..self.clone()
        }
    }

    /// The key of the current payload.
    pub fn snapshot_key(&self) -> String {
        self.snapshot.key(&self.database_key)
    }

    /// The fencing token of the lease that stamped this HEAD.
    pub fn lease_token(&self) -> FencingToken {
        FencingToken {
            term: self.term,
            generation: self.lease_generation,
        }
    }

    /// Whether `lease`'s incarnation (holder, term, generation) stamped this HEAD.
    pub fn is_stamped_by(&self, lease: &LeaseHolder) -> bool {
        self.database_key == *lease.database()
            && self.holder_id == *lease.holder_id()
            && self.lease_token() == lease.token()
    }

    /// Checks the relations between fields: the payload is no newer than the
    /// HEAD naming it, in both sequence and lease generation.
    fn check(&self) -> Result<(), (&'static str, String)> {
        if self.snapshot.sequence > self.publication_sequence {
            let reason = format!(
                "payload sequence={} is above publication_sequence={}",
                self.snapshot.sequence, self.publication_sequence
            );
            return Err(("snapshot_key", reason));
        }
        if self.snapshot.generation > self.lease_generation {
            let reason = format!(
                "payload generation={} is above lease_generation={}",
                self.snapshot.generation, self.lease_generation
            );
            return Err(("snapshot_key", reason));
        }
        Ok(())
    }

    /// Encodes the document; panics if the HEAD breaks its own invariants,
    /// because writing it would wedge every reader.
    pub fn encode(&self) -> Bytes {
        if let Err((field, reason)) = self.check() {
            panic!("refusing to write an invalid HEAD: field={field}: {reason}");
        }
        encode(json!({
            "format": HEAD_FORMAT,
            "database_key": self.database_key.as_str(),
            "holder_id": self.holder_id.as_str(),
            "term": self.term.0,
            "lease_generation": self.lease_generation.0,
            "publication_sequence": self.publication_sequence.0,
            "snapshot_key": self.snapshot_key(),
            "wal_index": self.wal_index.0,
            "payload_size_bytes": self.payload_size_bytes,
            "payload_sha256": self.payload_sha256.to_string(),
            "publisher_id": self.publisher_id.to_string(),
            "updated_at_ms": self.updated_at_ms,
        }))
    }

    /// Decodes and validates the HEAD of `database` stored at `key`.
    pub fn decode(database: &DatabaseKey, key: &str, bytes: &Bytes) -> Result<Head, DocumentError> {
        let mut fields = Fields::parse("HEAD", key, bytes, HEAD_FORMAT..=HEAD_FORMAT)?;
        let database_key = fields.string("database_key")?;
        if database_key != database.as_str() {
            let reason = format!("names database={database_key:?}, expected {database}");
            return Err(fields.invalid("database_key", reason));
        }
        let holder_id = HolderId::new(&fields.string("holder_id")?)
            .map_err(|e| fields.invalid("holder_id", e.to_string()))?;
        let term = Term(fields.positive("term")?);
        let lease_generation = Generation(fields.positive("lease_generation")?);
        let publication_sequence = PublicationSequence(fields.positive("publication_sequence")?);
        // Far beyond any real count, and it keeps `next` from overflowing on
        // a document that claims the last sequence.
        if publication_sequence > PublicationSequence::MAX_STORED {
            let reason = format!(
                "{publication_sequence} is above {}",
                PublicationSequence::MAX_STORED
            );
            return Err(fields.invalid("publication_sequence", reason));
        }
        let snapshot_key = fields.string("snapshot_key")?;
        let snapshot = PayloadId::from_key(database, &snapshot_key).ok_or_else(|| {
            let reason =
                format!("{snapshot_key:?} is not {database}/snapshots/g<20 digits>-s<20 digits>");
            fields.invalid("snapshot_key", reason)
        })?;
        let head = Head {
            database_key: database.clone(),
            holder_id,
            term,
            lease_generation,
            publication_sequence,
            snapshot,
            wal_index: RecordIndex(fields.u64("wal_index")?),
            payload_size_bytes: fields.u64("payload_size_bytes")?,
            payload_sha256: fields.string("payload_sha256")?.parse().map_err(|()| {
                fields.invalid("payload_sha256", "expected 64 lowercase hex digits")
            })?,
            publisher_id: fields
                .string("publisher_id")?
                .parse()
                .map_err(|()| fields.invalid("publisher_id", "expected 16 lowercase hex digits"))?,
            updated_at_ms: fields.u64("updated_at_ms")?,
        };
        head.check()
            .map_err(|(field, reason)| fields.invalid(field, reason))?;
        fields.finish()?;
        Ok(head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> DatabaseKey {
        DatabaseKey::new("db").unwrap()
    }

    fn head() -> Head {
        Head {
            database_key: db(),
            holder_id: HolderId::new("node-a").unwrap(),
            term: Term(1),
            lease_generation: Generation(4),
            publication_sequence: PublicationSequence(9),
            snapshot: PayloadId {
                generation: Generation(3),
                sequence: PublicationSequence(8),
            },
            wal_index: RecordIndex(120),
            payload_size_bytes: 5,
            payload_sha256: Sha256Digest::of(b"hello"),
            publisher_id: PublisherId(0x0123_4567_89ab_cdef),
            updated_at_ms: 1_700_000_000_000,
        }
    }

    fn decode(bytes: &Bytes) -> Result<Head, DocumentError> {
        Head::decode(&db(), "db/HEAD.json", bytes)
    }

    fn with(field: &str, value: serde_json::Value) -> Bytes {
        let mut doc: serde_json::Value = serde_json::from_slice(&head().encode()).unwrap();
        doc[field] = value;
        // Re-signed: each case must fail on its field, not on the checksum.
        encode(doc)
    }

    #[test]
    fn head_round_trips_with_the_designed_fields() {
        let encoded = head().encode();
        assert_eq!(decode(&encoded).unwrap(), head());
        let doc: serde_json::Value = serde_json::from_slice(&encoded).unwrap();
        assert_eq!(
            doc["snapshot_key"],
            "db/snapshots/g00000000000000000003-s00000000000000000008"
        );
        assert_eq!(
            doc["payload_sha256"],
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        for field in [
            "holder_id",
            "term",
            "lease_generation",
            "wal_index",
            "updated_at_ms",
        ] {
            assert!(doc.get(field).is_some(), "{field} missing");
        }
    }

    /// What an older build's boot says on meeting a newer build's HEAD.
    #[test]
    fn a_newer_head_format_is_said_in_one_line() {
        let error = decode(&with("format", json!(HEAD_FORMAT + 1))).unwrap_err();
        assert_eq!(error.field(), "format");
        assert_eq!(
            error.to_string(),
            format!(
                "HEAD document written by a newer Chorus: format {}; this build reads up to \
                 {HEAD_FORMAT}: key=db/HEAD.json",
                HEAD_FORMAT + 1
            )
        );
    }

    #[test]
    fn decode_names_the_bad_field() {
        let cases = [
            ("format", json!(2), "format"),
            ("database_key", json!("other"), "database_key"),
            ("term", json!(0), "term"),
            ("publication_sequence", json!(null), "publication_sequence"),
            // The last sequence would panic the next claim's bump.
            (
                "publication_sequence",
                json!(u64::MAX),
                "publication_sequence",
            ),
            ("snapshot_key", json!("db/snapshots/g3-s8"), "snapshot_key"),
            (
                "snapshot_key",
                json!("other/snapshots/g00000000000000000003-s00000000000000000008"),
                "snapshot_key",
            ),
            (
                "snapshot_key",
                json!("db/snapshots/g00000000000000000003-s00000000000000000010"),
                "snapshot_key",
            ),
            (
                "snapshot_key",
                json!("db/snapshots/g00000000000000000005-s00000000000000000008"),
                "snapshot_key",
            ),
            ("payload_sha256", json!("ABC"), "payload_sha256"),
            (
                "payload_sha256",
                json!("2CF24DBA5FB0A30E26E83B2AC5B9E29E1B161E5C1FA7425E73043362938B9824"),
                "payload_sha256",
            ),
            ("wal_index", json!(-3), "wal_index"),
            ("publisher_id", json!("0123456789ABCDEF"), "publisher_id"),
            ("publisher_id", json!(7), "publisher_id"),
            ("extra", json!(true), "document"),
        ];
        for (field, value, named) in cases {
            let error = decode(&with(field, value)).unwrap_err();
            assert_eq!(error.field(), named, "{field}: {error}");
        }
    }

    #[test]
    fn payload_ids_have_one_spelling_and_sort_newest_last() {
        let id = PayloadId {
            generation: Generation(2),
            sequence: PublicationSequence(10),
        };
        let key = id.key(&db());
        assert_eq!(
            key,
            "db/snapshots/g00000000000000000002-s00000000000000000010"
        );
        assert_eq!(PayloadId::from_key(&db(), &key), Some(id));
        for bad in [
            "db/snapshots/g2-s10",
            "db/snapshots/g00000000000000000000-s00000000000000000010",
            "db/snapshots/g0000000000000000000x-s00000000000000000010",
            "db/snapshots/x",
            "other/snapshots/g00000000000000000002-s00000000000000000010",
            "db/snapshotsg00000000000000000002-s00000000000000000010",
        ] {
            assert_eq!(PayloadId::from_key(&db(), bad), None, "{bad}");
        }
        let older_sequence_newer_generation = PayloadId {
            generation: Generation(9),
            sequence: PublicationSequence(9),
        };
        assert!(older_sequence_newer_generation < id);
    }

    #[test]
    #[should_panic(expected = "refusing to write an invalid HEAD")]
    fn encode_refuses_a_payload_newer_than_its_head() {
        let mut head = head();
        head.snapshot.sequence = PublicationSequence(10);
        head.encode();
    }
}
