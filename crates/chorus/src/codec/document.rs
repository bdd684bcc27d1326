//! The checksum every JSON document Chorus keeps in a store carries (the
//! object register's `manifest.json`, `lease.json`, `HEAD.json`): a bit
//! flipped at rest or in transit can leave valid JSON with a plausible value
//! (a digit of `chorus.tail_base` or `expires_at_ms`), which field validation
//! alone would accept.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use serde::Serialize;

/// The field holding a document's checksum: the CRC32C, as 8 lowercase hex
/// digits, of the compact JSON of every other field with keys sorted, so it
/// survives re-indentation but not a changed value.
pub const DOCUMENT_CHECKSUM_FIELD: &str = "crc32c";

/// Why a document failed its checksum check, led by the format it claims
/// (`claimed`, in its `field`) when that is not `supported`: another format
/// may checksum differently, or not at all, so "damaged" may be wrong.
pub fn checksum_failure(
    field: &str,
    claimed: Option<&str>,
    supported: &str,
    reason: String,
) -> String {
    match claimed {
        Some(found) if found != supported => format!(
            "unsupported format: field={field} value={found} supported={supported}, or {reason}"
        ),
        _ => reason,
    }
}

/// The formats a build reads, as error messages spell them: `1`, or `1-2`.
pub fn formats_text(formats: &RangeInclusive<u64>) -> String {
    if formats.start() == formats.end() {
        formats.start().to_string()
    } else {
        format!("{}-{}", formats.start(), formats.end())
    }
}

/// The checksum of a document's `fields`, ignoring
/// [`DOCUMENT_CHECKSUM_FIELD`].
pub fn document_checksum<'a, V: Serialize + 'a>(
    fields: impl IntoIterator<Item = (&'a String, &'a V)>,
) -> String {
    let canonical: BTreeMap<&str, &V> = fields
        .into_iter()
        .filter(|(name, _)| name.as_str() != DOCUMENT_CHECKSUM_FIELD)
        .map(|(name, value)| (name.as_str(), value))
        .collect();
    let canonical = serde_json::to_vec(&canonical).expect("JSON values encode");
    format!("{:08x}", crc32c::crc32c(&canonical))
}
