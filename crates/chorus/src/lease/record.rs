//! The lease document, `<db>/lease.json` (docs/design/0002, Objects).

use std::time::Duration;

use bytes::Bytes;
use serde_json::json;

use super::document::{self, DocumentError, Fields};
use super::{DatabaseKey, FencingToken, Generation, HolderId, Incarnation, Term};

/// The lease document format this build writes. Format 2 added
/// `incarnation`; this build still reads format 1 (written by older builds),
/// whose leases no process of this build counts as its own.
pub const LEASE_FORMAT: u64 = 2;

/// The oldest lease document format this build reads.
const OLDEST_LEASE_FORMAT: u64 = 1;

/// The key of a database's lease document: `<db>/lease.json`.
pub fn lease_key(database: &DatabaseKey) -> String {
    database.child("lease.json")
}

/// One state of a database's lease document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The database the lease guards.
    pub database_key: DatabaseKey,
    /// Who acquired it (and, once released, who released it).
    pub holder_id: HolderId,
    /// The process that acquired it; `None` in a format-1 document.
    pub incarnation: Option<Incarnation>,
    /// The holder's term.
    pub term: Term,
    /// The acquisition's generation; kept by refresh and release.
    pub generation: Generation,
    /// Holder's wall clock when it acquired the lease, in ms since the epoch.
    pub acquired_at_ms: u64,
    /// Holder's wall clock plus the lease duration at the last acquire or
    /// refresh (the release time once released), in ms since the epoch.
    pub expires_at_ms: u64,
    /// Whether the holder released the lease; anyone may acquire it then.
    pub released: bool,
}

impl LeaseRecord {
    /// The fencing token `(term, generation)`.
    pub fn token(&self) -> FencingToken {
        FencingToken {
            term: self.term,
            generation: self.generation,
        }
    }

    /// Whether the lease still binds others at wall time `wall_ms`.
    pub fn is_live(&self, wall_ms: u64) -> bool {
        !self.released && wall_ms < self.expires_at_ms
    }

    /// How long until the lease expires at wall time `wall_ms` (zero if it has).
    pub fn expires_in(&self, wall_ms: u64) -> Duration {
        Duration::from_millis(self.expires_at_ms.saturating_sub(wall_ms))
    }

    /// Whether `other` is the same acquisition: same holder, incarnation,
    /// term and generation.
    pub fn same_incarnation(&self, other: &LeaseRecord) -> bool {
        self.holder_id == other.holder_id
            && self.incarnation == other.incarnation
            && self.term == other.term
            && self.generation == other.generation
    }

    /// Whether this lease was acquired by `incarnation` (never true of a
    /// format-1 document, which names no incarnation).
    pub fn is_held_by(&self, holder: &HolderId, incarnation: Incarnation) -> bool {
        self.holder_id == *holder && self.incarnation == Some(incarnation)
    }

    /// This lease extended to `wall_ms + ttl`.
    pub(crate) fn refreshed(&self, wall_ms: u64, ttl: Duration) -> LeaseRecord {
        LeaseRecord {
            expires_at_ms: expiry(wall_ms, ttl),
            ..self.clone()
        }
    }

    /// This lease released at `wall_ms`, keeping its generation.
    pub(crate) fn released_at(&self, wall_ms: u64) -> LeaseRecord {
        LeaseRecord {
            expires_at_ms: wall_ms.max(self.acquired_at_ms),
            released: true,
            ..self.clone()
        }
    }

    /// Encodes the document: in format 2, or in format 1 for a record that
    /// came from a format-1 document (an older build's lease released by
    /// this one keeps its format).
    pub fn encode(&self) -> Bytes {
        let mut document = json!({
            "format": OLDEST_LEASE_FORMAT,
            "database_key": self.database_key.as_str(),
            "holder_id": self.holder_id.as_str(),
            "term": self.term.0,
            "generation": self.generation.0,
            "acquired_at_ms": self.acquired_at_ms,
            "expires_at_ms": self.expires_at_ms,
            "released": self.released,
        });
        if let Some(incarnation) = self.incarnation {
            document["format"] = LEASE_FORMAT.into();
            document["incarnation"] = incarnation.to_string().into();
        }
        document::encode(document)
    }

    /// Decodes and validates the lease document of `database` stored at `key`.
    pub fn decode(
        database: &DatabaseKey,
        key: &str,
        bytes: &Bytes,
    ) -> Result<LeaseRecord, DocumentError> {
        let mut fields = Fields::parse("lease", key, bytes, OLDEST_LEASE_FORMAT..=LEASE_FORMAT)?;
        let database_key = fields.string("database_key")?;
        if database_key != database.as_str() {
            let reason = format!("names database={database_key:?}, expected {database}");
            return Err(fields.invalid("database_key", reason));
        }
        let holder_id = fields.string("holder_id")?;
        let holder_id =
            HolderId::new(&holder_id).map_err(|e| fields.invalid("holder_id", e.to_string()))?;
        let incarnation = match fields.format_version() {
            OLDEST_LEASE_FORMAT => None,
            _ => {
                let text = fields.string("incarnation")?;
                let incarnation = text
                    .parse::<Incarnation>()
                    .map_err(|e| fields.invalid("incarnation", e.to_string()))?;
                Some(incarnation)
            }
        };
        let record = LeaseRecord {
            database_key: database.clone(),
            holder_id,
            incarnation,
            term: Term(fields.positive("term")?),
            generation: Generation(fields.positive("generation")?),
            acquired_at_ms: fields.u64("acquired_at_ms")?,
            expires_at_ms: fields.u64("expires_at_ms")?,
            released: fields.bool("released")?,
        };
        fields.finish()?;
        Ok(record)
    }
}

/// `wall_ms + ttl`, saturating.
pub(crate) fn expiry(wall_ms: u64, ttl: Duration) -> u64 {
    wall_ms.saturating_add(ttl.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn record() -> LeaseRecord {
        LeaseRecord {
            database_key: DatabaseKey::new("db").unwrap(),
            holder_id: HolderId::new("node-a").unwrap(),
            incarnation: Some(Incarnation(0x5eed)),
            term: Term(2),
            generation: Generation(7),
            acquired_at_ms: 1_000,
            expires_at_ms: 11_000,
            released: false,
        }
    }

    fn decode(bytes: &Bytes) -> Result<LeaseRecord, DocumentError> {
        LeaseRecord::decode(&DatabaseKey::new("db").unwrap(), "db/lease.json", bytes)
    }

    fn with(field: &str, value: serde_json::Value) -> Bytes {
        let mut doc: serde_json::Value = serde_json::from_slice(&record().encode()).unwrap();
        doc[field] = value;
        // Re-signed: each case must fail on its field, not on the checksum.
        crate::lease::document::encode(doc)
    }

    #[test]
    fn round_trips() {
        let record = record();
        assert_eq!(decode(&record.encode()).unwrap(), record);
        let released = record.released_at(5_000);
        assert_eq!(decode(&released.encode()).unwrap(), released);
        assert_eq!(released.generation, record.generation);
        assert!(!released.is_live(0));
    }

    #[test]
    fn a_format_1_document_is_read_with_no_incarnation_and_kept_in_format_1() {
        // The bytes an older build wrote, with the checksum it computed.
        let legacy = crate::lease::document::encode(json!({
            "format": 1, "database_key": "db", "holder_id": "node-a", "term": 2,
            "generation": 7, "acquired_at_ms": 1_000, "expires_at_ms": 11_000,
            "released": false,
        }));
        let record = decode(&legacy).unwrap();
        assert_eq!(record.incarnation, None);
        assert_eq!(record.generation, Generation(7));
        let holder = HolderId::new("node-a").unwrap();
        assert!(!record.is_held_by(&holder, Incarnation(0)));
        assert_eq!(record.encode(), legacy, "re-encoded as it was written");
        let released = record.released_at(5_000);
        assert_eq!(decode(&released.encode()).unwrap(), released);
        // A format-2 document must name its incarnation.
        let mut missing: serde_json::Value = serde_json::from_slice(&legacy).unwrap();
        missing["format"] = json!(2);
        let missing = crate::lease::document::encode(missing);
        assert_eq!(decode(&missing).unwrap_err().field(), "incarnation");
    }

    /// What an older build's standby says on meeting a newer build's lease:
    /// one line naming both formats (here, this build meets format 3).
    #[test]
    fn a_newer_lease_format_is_said_in_one_line() {
        let newer = with("format", json!(LEASE_FORMAT + 1));
        let error = decode(&newer).unwrap_err();
        assert_eq!(error.field(), "format");
        assert_eq!(
            error.to_string(),
            format!(
                "lease document written by a newer Chorus: format {}; this build reads up to \
                 {LEASE_FORMAT}: key=db/lease.json",
                LEASE_FORMAT + 1
            )
        );
    }

    #[test]
    fn liveness_follows_the_wall_clock() {
        let record = record();
        assert!(record.is_live(10_999));
        assert!(!record.is_live(11_000));
        assert_eq!(record.expires_in(10_000), Duration::from_secs(1));
        assert_eq!(record.expires_in(20_000), Duration::ZERO);
        assert_eq!(
            record
                .refreshed(50_000, Duration::from_secs(3))
                .expires_at_ms,
            53_000
        );
    }

    #[test]
    fn decode_names_the_bad_field() {
        let cases = [
            ("format", json!(9), "format"),
            ("database_key", json!("other"), "database_key"),
            ("holder_id", json!("two words"), "holder_id"),
            ("holder_id", json!(5), "holder_id"),
            ("incarnation", json!("5eed"), "incarnation"),
            ("incarnation", json!(5), "incarnation"),
            ("term", json!(0), "term"),
            ("generation", json!("7"), "generation"),
            ("expires_at_ms", json!(-1), "expires_at_ms"),
            ("released", json!("no"), "released"),
            ("surprise", json!(1), "document"),
        ];
        for (field, value, named) in cases {
            let error = decode(&with(field, value)).unwrap_err();
            assert_eq!(error.field(), named, "{field}: {error}");
            assert_eq!(error.key(), "db/lease.json");
        }
    }
}
