//! The digest of a sealed object that the register keeps with the newest seal
//! (`chorus.seal_digest`).
//!
//! Register format 1 stored SHA-256 as 64 bare hex digits. Format 2 names the
//! algorithm: `blake3:<64 hex>` for every seal this build writes, and
//! `sha256:<64 hex>` for a seal made under format 1 that is still the newest
//! when a format-2 writer rewrites the register (the digest is never
//! recomputed: the register keeps what the sealer wrote). BLAKE3 because a
//! seal hashes the whole segment on the write path, and with SIMD it costs a
//! fraction of SHA-256's CPU per byte on one core.

use std::fmt;

use super::ManifestError;

/// The register field this module encodes.
pub(crate) const FIELD: &str = "chorus.seal_digest";

/// A sealed object's digest, with the algorithm that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SealDigest {
    /// BLAKE3 (256-bit output): what this build writes.
    Blake3([u8; 32]),
    /// SHA-256: read from registers written in format 1.
    Sha256([u8; 32]),
}

impl SealDigest {
    /// The digest this build records for a sealed object's bytes.
    pub fn of(sealed_object: &[u8]) -> SealDigest {
        SealDigest::of_parts([sealed_object])
    }

    /// [`of`](SealDigest::of) the concatenation of `parts`, without making it.
    pub fn of_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> SealDigest {
        let mut hasher = blake3::Hasher::new();
        for part in parts {
            hasher.update(part);
        }
        SealDigest::Blake3(*hasher.finalize().as_bytes())
    }

    /// The algorithm's name as the register spells it.
    pub fn algorithm(&self) -> &'static str {
        match self {
            SealDigest::Blake3(_) => "blake3",
            SealDigest::Sha256(_) => "sha256",
        }
    }

    /// The digest's bytes.
    pub fn bytes(&self) -> &[u8; 32] {
        match self {
            SealDigest::Blake3(bytes) | SealDigest::Sha256(bytes) => bytes,
        }
    }

    /// Parses the field's value as register `format` (1 or 2) spells it;
    /// anything else, including the other format's spelling, is refused
    /// naming the field.
    pub(crate) fn decode(format: u32, value: &str) -> Result<SealDigest, ManifestError> {
        if format == 1 {
            return hex_digest(
                value,
                "expected 64 lowercase hex digits (SHA-256, format 1)",
            )
            .map(SealDigest::Sha256);
        }
        let expected =
            "expected blake3:<64 lowercase hex digits> or sha256:<64 lowercase hex digits>";
        match value.split_once(':') {
            Some(("blake3", hex)) => hex_digest(hex, expected).map(SealDigest::Blake3),
            Some(("sha256", hex)) => hex_digest(hex, expected).map(SealDigest::Sha256),
            _ => Err(ManifestError::invalid(
                FIELD,
                format!("malformed value {value:?}: {expected}"),
            )),
        }
    }
}

/// The field's value in register format 2: `<algorithm>:<64 hex>`.
impl fmt::Display for SealDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.algorithm(), hex::encode(self.bytes()))
    }
}

/// Exactly 64 lowercase hex digits, one spelling per digest.
fn hex_digest(value: &str, expected: &str) -> Result<[u8; 32], ManifestError> {
    let mut bytes = [0u8; 32];
    let lowercase = value
        .bytes()
        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !lowercase || hex::decode_to_slice(value, &mut bytes).is_err() {
        return Err(ManifestError::invalid(
            FIELD,
            format!("malformed value {value:?}: {expected}"),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn bytes() -> [u8; 32] {
        std::array::from_fn(|i| i as u8)
    }

    #[test]
    fn this_build_writes_blake3_of_the_object() {
        // BLAKE3's published digest of the empty input.
        assert_eq!(
            SealDigest::of(b"").to_string(),
            "blake3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        assert_ne!(SealDigest::of(b"a"), SealDigest::of(b"b"));
    }

    #[test]
    fn format_two_names_the_algorithm() {
        for digest in [SealDigest::Blake3(bytes()), SealDigest::Sha256(bytes())] {
            let value = digest.to_string();
            assert_eq!(value, format!("{}:{HEX}", digest.algorithm()));
            assert_eq!(SealDigest::decode(2, &value), Ok(digest));
        }
    }

    #[test]
    fn format_one_is_bare_sha256() {
        assert_eq!(SealDigest::decode(1, HEX), Ok(SealDigest::Sha256(bytes())));
    }

    #[test]
    fn every_other_spelling_is_refused_naming_the_field() {
        let refused = [
            (1, format!("sha256:{HEX}")),
            (1, format!("blake3:{HEX}")),
            (1, HEX.to_uppercase()),
            (1, HEX[..62].to_owned()),
            (2, HEX.to_owned()),
            (2, format!("md5:{HEX}")),
            (2, format!("BLAKE3:{HEX}")),
            (2, format!("blake3:{}", HEX.to_uppercase())),
            (2, format!("blake3:{HEX}00")),
            (2, format!("blake3:{}", &HEX[..62])),
            (2, format!("blake3:0x{}", &HEX[2..])),
            (2, format!("blake3: {}", &HEX[1..])),
            (2, "blake3:".to_owned()),
            (2, String::new()),
        ];
        for (format, value) in refused {
            let error = SealDigest::decode(format, &value).unwrap_err();
            assert_eq!(error.field(), FIELD, "{value:?}");
        }
    }

    proptest! {
        #[test]
        fn prop_every_digest_round_trips(raw: [u8; 32], blake3: bool) {
            let digest = if blake3 { SealDigest::Blake3(raw) } else { SealDigest::Sha256(raw) };
            prop_assert_eq!(SealDigest::decode(2, &digest.to_string()), Ok(digest));
        }

        #[test]
        fn prop_arbitrary_text_never_panics(format in 1u32..=2, value in ".{0,80}") {
            let _ = SealDigest::decode(format, &value);
        }
    }
}
