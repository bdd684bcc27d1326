//! Strict decoding of the small JSON documents the lease and snapshot layers
//! keep in object stores (`lease.json`, `HEAD.json`): every field is required,
//! typed and named in errors, and unknown fields are refused, so a document
//! written by a newer format or by hand fails loudly instead of being half-read.
//! Every document carries a checksum of its fields
//! ([`document_checksum`](crate::codec::document_checksum)).

use std::ops::RangeInclusive;

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::codec::{
    DOCUMENT_CHECKSUM_FIELD as CHECKSUM_FIELD, NewerFormat, checksum_failure, document_checksum,
    formats_text,
};

/// Largest lease or HEAD document accepted, in bytes; real ones are < 1 KiB.
pub const MAX_DOCUMENT_BYTES: usize = 16 * 1024;

/// A stored document that is malformed, breaks an invariant or is in a
/// format newer than this build reads; names the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentError {
    document: &'static str,
    key: String,
    field: &'static str,
    reason: String,
    /// Set when the document claims a newer format: the message leads with
    /// that, and `reason` (if any) says why it might be damage instead.
    newer: Option<NewerFormat>,
}

impl std::fmt::Display for DocumentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (document, key, field, reason) = (self.document, &self.key, self.field, &self.reason);
        match &self.newer {
            None => write!(
                f,
                "invalid {document} document: key={key} field={field}: {reason}"
            ),
            Some(newer) if reason.is_empty() => write!(f, "{newer}: key={key}"),
            Some(newer) => write!(f, "{newer}: key={key} (unless it is damaged: {reason})"),
        }
    }
}

impl std::error::Error for DocumentError {}

impl DocumentError {
    pub(crate) fn new(
        document: &'static str,
        key: &str,
        field: &'static str,
        reason: impl Into<String>,
    ) -> DocumentError {
        DocumentError {
            document,
            key: key.to_owned(),
            field,
            reason: reason.into(),
            newer: None,
        }
    }

    /// The offending field (`document` when the whole document is unreadable).
    pub fn field(&self) -> &str {
        self.field
    }

    /// The key of the offending document.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The newer format the document claims, when that is why it was refused.
    pub fn newer_format(&self) -> Option<&NewerFormat> {
        self.newer.as_ref()
    }
}

/// The fields of one document being decoded; each accessor consumes a field.
pub(crate) struct Fields {
    document: &'static str,
    key: String,
    map: Map<String, Value>,
    /// The document's format, once checked.
    format: u64,
}

impl Fields {
    /// Parses `bytes` as a JSON object of at most [`MAX_DOCUMENT_BYTES`], in
    /// one of the `supported` formats, with an intact checksum.
    pub(crate) fn parse(
        document: &'static str,
        key: &str,
        bytes: &Bytes,
        supported: RangeInclusive<u64>,
    ) -> Result<Fields, DocumentError> {
        let mut fields = Fields {
            document,
            key: key.to_owned(),
            map: Map::new(),
            format: 0,
        };
        if bytes.len() > MAX_DOCUMENT_BYTES {
            let reason = format!("size_bytes={} exceeds {MAX_DOCUMENT_BYTES}", bytes.len());
            return Err(fields.invalid("document", reason));
        }
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(map)) => fields.map = map,
            Ok(_) => return Err(fields.invalid("document", "not a JSON object")),
            Err(error) => return Err(fields.invalid("document", format!("not JSON: {error}"))),
        }
        // A newer build's document may checksum differently: say that first.
        let newer = fields
            .map
            .get("format")
            .and_then(Value::as_u64)
            .and_then(|found| {
                NewerFormat::check(&format!("{document} document"), found, *supported.end())
            });
        // Another claimed format is worth naming only when this build cannot
        // read it.
        let claimed = fields
            .map
            .get("format")
            .filter(|format| !format.as_u64().is_some_and(|f| supported.contains(&f)))
            .map(Value::to_string);
        let supported_text = formats_text(&supported);
        let refuse = |fields: &Fields, field: &'static str, reason: String| match &newer {
            Some(newer) => fields.newer(newer.clone(), format!("{field} {reason}")),
            None => fields.invalid(
                field,
                checksum_failure("format", claimed.as_deref(), &supported_text, reason),
            ),
        };
        if !fields.map.contains_key(CHECKSUM_FIELD) {
            let reason = "missing (written by hand, or by a build before checksums)";
            return Err(refuse(&fields, CHECKSUM_FIELD, reason.into()));
        }
        let stored = fields.string(CHECKSUM_FIELD)?;
        let computed = document_checksum(&fields.map);
        if stored != computed {
            let reason = format!(
                "checksum mismatch: stored {stored:?}, the fields give {computed:?} \
                 (the document is damaged, or was edited by hand)"
            );
            return Err(refuse(&fields, CHECKSUM_FIELD, reason));
        }
        if let Some(newer) = newer {
            return Err(fields.newer(newer, String::new()));
        }
        fields.format = fields.format(&supported)?;
        Ok(fields)
    }

    /// The document's format (one of those `parse` was given).
    pub(crate) fn format_version(&self) -> u64 {
        self.format
    }

    /// The document claims a `newer` format; `reason`, if not empty, says
    /// why it might be damaged instead.
    fn newer(&self, newer: NewerFormat, reason: String) -> DocumentError {
        DocumentError {
            newer: Some(newer),
            ..self.invalid("format", reason)
        }
    }

    /// An error about `field` of this document.
    pub(crate) fn invalid(&self, field: &'static str, reason: impl Into<String>) -> DocumentError {
        DocumentError::new(self.document, &self.key, field, reason)
    }

    fn take(&mut self, field: &'static str) -> Result<Value, DocumentError> {
        self.map
            .remove(field)
            .ok_or_else(|| self.invalid(field, "missing"))
    }

    /// An unsigned integer field.
    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, DocumentError> {
        let value = self.take(field)?;
        value.as_u64().ok_or_else(|| {
            self.invalid(
                field,
                format!("expected an unsigned integer, found {value}"),
            )
        })
    }

    /// An unsigned integer field that must be at least 1.
    pub(crate) fn positive(&mut self, field: &'static str) -> Result<u64, DocumentError> {
        match self.u64(field)? {
            0 => Err(self.invalid(field, "must be at least 1")),
            value => Ok(value),
        }
    }

    /// A string field.
    pub(crate) fn string(&mut self, field: &'static str) -> Result<String, DocumentError> {
        match self.take(field)? {
            Value::String(text) => Ok(text),
            other => Err(self.invalid(field, format!("expected a string, found {other}"))),
        }
    }

    /// A boolean field.
    pub(crate) fn bool(&mut self, field: &'static str) -> Result<bool, DocumentError> {
        let value = self.take(field)?;
        value
            .as_bool()
            .ok_or_else(|| self.invalid(field, format!("expected true or false, found {value}")))
    }

    /// The `format` field, which must be one of `supported`.
    fn format(&mut self, supported: &RangeInclusive<u64>) -> Result<u64, DocumentError> {
        match self.u64("format")? {
            found if supported.contains(&found) => Ok(found),
            found => Err(self.invalid(
                "format",
                format!(
                    "unsupported format={found} (this build reads {})",
                    formats_text(supported)
                ),
            )),
        }
    }

    /// Fails if any field was not consumed.
    pub(crate) fn finish(self) -> Result<(), DocumentError> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(unknown) => Err(self.invalid("document", format!("unknown field {unknown:?}"))),
        }
    }
}

/// `1`, or `1-2` for a range of formats.
/// Encodes a document (a JSON object) for storage, adding its checksum.
/// Panics if `document` is not an object.
pub fn encode(document: Value) -> Bytes {
    let Value::Object(mut fields) = document else {
        panic!("documents are JSON objects");
    };
    let sum = document_checksum(&fields);
    fields.insert(CHECKSUM_FIELD.to_owned(), Value::String(sum));
    Bytes::from(serde_json::to_vec_pretty(&fields).expect("JSON values encode"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `text` in format 1 with its checksum added (when it is a JSON
    /// object; `format` 1 is added when missing).
    fn fields(text: &str) -> Result<Fields, DocumentError> {
        let bytes = match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(mut object)) => {
                object.entry("format").or_insert(Value::from(1));
                encode(Value::Object(object))
            }
            _ => Bytes::copy_from_slice(text.as_bytes()),
        };
        Fields::parse("test", "db/doc.json", &bytes, 1..=1)
    }

    #[test]
    fn a_changed_value_fails_the_checksum_and_layout_does_not() {
        let bytes = encode(serde_json::json!({"format": 1, "expires_at_ms": 1_700_000_000_000u64}));
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let compact: Value = serde_json::from_str(&text).unwrap();
        let relaid = Bytes::from(serde_json::to_vec(&compact).unwrap());
        Fields::parse("test", "k", &relaid, 1..=1).expect("whitespace is not content");
        let damaged = text.replace("1700000000000", "1700000090000");
        let error = Fields::parse("test", "k", &Bytes::from(damaged), 1..=1)
            .err()
            .expect("a changed digit is caught");
        assert_eq!(error.field(), CHECKSUM_FIELD);
        assert!(error.to_string().contains("checksum mismatch"), "{error}");
        let unsigned = text.replace(CHECKSUM_FIELD, "other");
        let error = Fields::parse("test", "k", &Bytes::from(unsigned), 1..=1)
            .err()
            .expect("a document without its checksum is refused");
        assert_eq!(error.field(), CHECKSUM_FIELD);
    }

    #[test]
    fn every_single_bit_flip_is_refused() {
        let bytes = encode(serde_json::json!({
            "format": 1, "holder_id": "node-a", "term": 7, "released": false,
        }));
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.to_vec();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let Ok(mut parsed) = Fields::parse("test", "k", &Bytes::from(flipped), 1..=1) else {
                continue;
            };
            // Parsed (so in format 1): the flip only touched layout; every
            // value is intact.
            assert_eq!(parsed.string("holder_id").unwrap(), "node-a", "bit {bit}");
            assert_eq!(parsed.u64("term").unwrap(), 7, "bit {bit}");
            assert!(!parsed.bool("released").unwrap(), "bit {bit}");
        }
    }

    #[test]
    fn fields_are_typed_and_named() {
        let mut doc = fields(r#"{"n": 3, "s": "x", "b": true, "z": 0, "neg": -1}"#).unwrap();
        assert_eq!(doc.u64("n").unwrap(), 3);
        assert_eq!(doc.string("s").unwrap(), "x");
        assert!(doc.bool("b").unwrap());
        let zero = doc.positive("z").unwrap_err();
        assert_eq!(zero.field(), "z");
        let negative = doc.u64("neg").unwrap_err();
        assert_eq!(
            negative.to_string(),
            "invalid test document: key=db/doc.json field=neg: expected an unsigned integer, found -1"
        );
        let missing = doc.string("s").unwrap_err();
        assert_eq!(missing.field(), "s");
        assert!(missing.to_string().ends_with("field=s: missing"));
        doc.finish().unwrap();
    }

    #[test]
    fn unknown_fields_and_non_objects_are_refused() {
        let doc = fields(r#"{"extra": 1}"#).unwrap();
        let error = doc.finish().unwrap_err();
        assert!(
            error.to_string().contains("unknown field \"extra\""),
            "{error}"
        );
        for bad in ["[]", "nope", "", "{\"a\":"] {
            let error = fields(bad).err().expect("refused");
            assert_eq!(error.field(), "document", "{bad:?}");
        }
        let huge = format!("{{\"a\": \"{}\"}}", "x".repeat(MAX_DOCUMENT_BYTES));
        assert!(fields(&huge).err().unwrap().to_string().contains("exceeds"));
    }

    #[test]
    fn a_newer_format_is_said_in_one_line_even_when_its_checksum_does_not_fit() {
        let newer = encode(serde_json::json!({"format": 2, "s": "x"}));
        let error = Fields::parse("test", "k", &newer, 1..=1).err().unwrap();
        assert_eq!(error.field(), "format");
        assert_eq!(error.newer_format().map(|n| n.found), Some(2));
        assert_eq!(
            error.to_string(),
            "test document written by a newer Chorus: format 2; this build reads up to 1: key=k"
        );
        let text = String::from_utf8(newer.to_vec()).unwrap();
        let unchecked = Bytes::from(text.replace(CHECKSUM_FIELD, "other"));
        let error = Fields::parse("test", "k", &unchecked, 1..=1).err().unwrap();
        let message = error.to_string();
        assert!(
            message.starts_with(
                "test document written by a newer Chorus: format 2; this build reads up to 1: \
                 key=k (unless it is damaged: crc32c missing"
            ),
            "{message}"
        );
        let changed = Bytes::from(text.replace("\"x\"", "\"y\""));
        let error = Fields::parse("test", "k", &changed, 1..=1).err().unwrap();
        let message = error.to_string();
        assert!(
            message
                .contains("reads up to 1: key=k (unless it is damaged: crc32c checksum mismatch"),
            "{message}"
        );
    }

    #[test]
    fn another_unsupported_format_is_named_even_when_its_checksum_does_not_fit() {
        let older = encode(serde_json::json!({"format": 0, "s": "x"}));
        let error = Fields::parse("test", "k", &older, 1..=2).err().unwrap();
        assert_eq!(error.field(), "format");
        assert_eq!(error.newer_format(), None);
        assert!(
            error
                .to_string()
                .contains("unsupported format=0 (this build reads 1-2)"),
            "{error}"
        );
        let text = String::from_utf8(older.to_vec()).unwrap();
        let unchecked = Bytes::from(text.replace(CHECKSUM_FIELD, "other"));
        let error = Fields::parse("test", "k", &unchecked, 1..=2).err().unwrap();
        let message = error.to_string();
        assert!(
            message.contains("unsupported format: field=format value=0 supported=1-2, or missing"),
            "{message}"
        );
        let formatless = encode(serde_json::json!({"s": "x"}));
        let error = Fields::parse("test", "k", &formatless, 1..=1)
            .err()
            .unwrap();
        assert!(
            error.to_string().ends_with("field=format: missing"),
            "{error}"
        );
    }
}
