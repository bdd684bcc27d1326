//! The digest of a sealed object that the register keeps with the newest seal
//! (`chorus.seal_digest`).
//!
//! Register format 1 stored SHA-256 as 64 bare hex digits. Later formats name
//! the algorithm: format 2 wrote `blake3:<64 hex>`, format 3 (this build)
//! writes `xxh3-128:<32 hex>`. A register keeps what its sealer wrote: a seal
//! made under an older format that is still the newest when a newer writer
//! rewrites the register keeps its digest, so format 2 also reads
//! `sha256:<64 hex>`, and format 3 all three.
//!
//! The digest is of the sealed object's payload: its records' frames, in
//! order, without the header (which the object's CRC32C and the register's
//! own seal fields cover). Every byte of a segment is hashed on the write
//! path, so the digest's cost per byte matters: XXH3-128 (AVX2 or NEON chosen
//! at run time) costs about a tenth of BLAKE3's CPU per byte here, and a
//! writer hashes each fragment's frames as it cuts them ([`SealHasher`]),
//! while they are still in cache, instead of reading the whole segment back
//! at the seal. Formats 1 and 2 hashed the whole object, header included.
//!
//! The digest identifies the records that were sealed and catches accidental
//! change; it was never a defence against someone who can write the buckets:
//! readers do not check it, and the sealed directory names every older
//! segment by a CRC32C alone.

use std::fmt;

use super::ManifestError;
use crate::codec::SEALED_HEADER_BYTES;

/// The register field this module encodes.
pub(crate) const FIELD: &str = "chorus.seal_digest";

/// A sealed object's digest, with the algorithm that made it (see the module
/// docs for what each format hashed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SealDigest {
    /// XXH3-128 (seed 0) of the sealed payload, in its canonical big-endian
    /// byte order: what this build writes (register format 3).
    Xxh3_128([u8; 16]),
    /// BLAKE3 (256-bit output) of the whole object: written by register
    /// format 2.
    Blake3([u8; 32]),
    /// SHA-256 of the whole object: written by register format 1.
    Sha256([u8; 32]),
}

impl SealDigest {
    /// The digest this build records for a sealed object whose payload (the
    /// object after its header) is `frames`.
    pub fn of_frames(frames: &[u8]) -> SealDigest {
        let mut hasher = SealHasher::new();
        hasher.update(frames);
        hasher.finish()
    }

    /// The digest this build records for the whole sealed object `object`:
    /// [`of_frames`](Self::of_frames) of what follows its header.
    ///
    /// # Panics
    /// If `object` is shorter than a sealed object's header.
    pub fn of_sealed_object(object: &[u8]) -> SealDigest {
        SealDigest::of_frames(&object[SEALED_HEADER_BYTES..])
    }

    /// The algorithm's name as the register spells it.
    pub fn algorithm(&self) -> &'static str {
        match self {
            SealDigest::Xxh3_128(_) => "xxh3-128",
            SealDigest::Blake3(_) => "blake3",
            SealDigest::Sha256(_) => "sha256",
        }
    }

    /// The digest's bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            SealDigest::Xxh3_128(bytes) => bytes,
            SealDigest::Blake3(bytes) | SealDigest::Sha256(bytes) => bytes,
        }
    }

    /// Parses the field's value as register `format` (1, 2 or 3) spells it;
    /// anything else, including a spelling only a later format writes, is
    /// refused naming the field.
    pub(crate) fn decode(format: u32, value: &str) -> Result<SealDigest, ManifestError> {
        if format == 1 {
            return hex_digest(
                value,
                "expected 64 lowercase hex digits (SHA-256, format 1)",
            )
            .map(SealDigest::Sha256);
        }
        let expected = if format == 2 {
            "expected blake3:<64 lowercase hex digits> or sha256:<64 lowercase hex digits>"
        } else {
            "expected xxh3-128:<32 lowercase hex digits>, blake3:<64 lowercase hex digits> \
             or sha256:<64 lowercase hex digits>"
        };
        match value.split_once(':') {
            Some(("xxh3-128", hex)) if format >= 3 => {
                hex_digest(hex, expected).map(SealDigest::Xxh3_128)
            }
            Some(("blake3", hex)) => hex_digest(hex, expected).map(SealDigest::Blake3),
            Some(("sha256", hex)) => hex_digest(hex, expected).map(SealDigest::Sha256),
            _ => Err(ManifestError::invalid(
                FIELD,
                format!("malformed value {value:?}: {expected}"),
            )),
        }
    }
}

/// [`SealDigest::of_frames`] of frames fed piece by piece, in order.
pub struct SealHasher(twox_hash::XxHash3_128);

impl SealHasher {
    /// A hasher of no frames yet.
    pub fn new() -> SealHasher {
        SealHasher(twox_hash::XxHash3_128::new())
    }

    /// Feeds the next frames of the payload.
    pub fn update(&mut self, frames: &[u8]) {
        self.0.write(frames);
    }

    /// The digest of everything fed so far.
    pub fn finish(&self) -> SealDigest {
        SealDigest::Xxh3_128(self.0.finish_128().to_be_bytes())
    }
}

impl Default for SealHasher {
    fn default() -> SealHasher {
        SealHasher::new()
    }
}

impl fmt::Debug for SealHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealHasher").finish_non_exhaustive()
    }
}

/// The field's value in register formats 2 and 3: `<algorithm>:<hex>`.
impl fmt::Display for SealDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.algorithm(), hex::encode(self.bytes()))
    }
}

/// Exactly `2 * N` lowercase hex digits, one spelling per digest.
fn hex_digest<const N: usize>(value: &str, expected: &str) -> Result<[u8; N], ManifestError> {
    let mut bytes = [0u8; N];
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
    fn this_build_writes_xxh3_128_of_the_frames() {
        // XXH3-128's published digest of the empty input (seed 0, canonical
        // byte order).
        assert_eq!(
            SealDigest::of_frames(b"").to_string(),
            "xxh3-128:99aa06d3014798d86001c324468d497f"
        );
        assert_ne!(SealDigest::of_frames(b"a"), SealDigest::of_frames(b"b"));
        // A whole object's digest leaves its header out.
        let mut object = vec![0xee; SEALED_HEADER_BYTES];
        object.extend_from_slice(b"frames");
        assert_eq!(
            SealDigest::of_sealed_object(&object),
            SealDigest::of_frames(b"frames")
        );
    }

    proptest! {
        /// Frames fed in pieces, split anywhere, hash as the whole.
        #[test]
        fn prop_pieces_hash_as_the_whole(
            whole in proptest::collection::vec(any::<u8>(), 0..5_000),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let mut cuts: Vec<usize> = cuts.iter().map(|cut| cut.index(whole.len() + 1)).collect();
            cuts.sort_unstable();
            let mut hasher = SealHasher::new();
            let mut start = 0;
            for cut in cuts.into_iter().chain([whole.len()]) {
                hasher.update(&whole[start..cut]);
                start = cut;
            }
            prop_assert_eq!(hasher.finish(), SealDigest::of_frames(&whole));
        }
    }

    #[test]
    fn later_formats_name_the_algorithm() {
        let xxh3 = SealDigest::Xxh3_128(std::array::from_fn(|i| i as u8));
        assert_eq!(xxh3.to_string(), format!("xxh3-128:{}", &HEX[..32]));
        assert_eq!(SealDigest::decode(3, &xxh3.to_string()), Ok(xxh3));
        for digest in [SealDigest::Blake3(bytes()), SealDigest::Sha256(bytes())] {
            let value = digest.to_string();
            assert_eq!(value, format!("{}:{HEX}", digest.algorithm()));
            assert_eq!(SealDigest::decode(2, &value), Ok(digest));
            assert_eq!(SealDigest::decode(3, &value), Ok(digest));
        }
    }

    #[test]
    fn format_one_is_bare_sha256() {
        assert_eq!(SealDigest::decode(1, HEX), Ok(SealDigest::Sha256(bytes())));
    }

    #[test]
    fn every_other_spelling_is_refused_naming_the_field() {
        let xxh3 = &HEX[..32];
        let mut refused = vec![
            (1, format!("sha256:{HEX}")),
            (1, format!("blake3:{HEX}")),
            (1, format!("xxh3-128:{xxh3}")),
            (1, HEX.to_uppercase()),
            (1, HEX[..62].to_owned()),
            // Format 2 never wrote XXH3-128.
            (2, format!("xxh3-128:{xxh3}")),
            (3, format!("xxh3-128:{HEX}")),
            (3, format!("xxh3-128:{}", &xxh3[..30])),
            (3, format!("xxh3-128:{}", xxh3.to_uppercase())),
            (3, format!("xxh3:{xxh3}")),
            (3, format!("XXH3-128:{xxh3}")),
            (3, format!("blake3:{xxh3}")),
            (3, "xxh3-128:".to_owned()),
        ];
        for format in [2, 3] {
            refused.extend([
                (format, HEX.to_owned()),
                (format, format!("md5:{HEX}")),
                (format, format!("BLAKE3:{HEX}")),
                (format, format!("blake3:{}", HEX.to_uppercase())),
                (format, format!("blake3:{HEX}00")),
                (format, format!("blake3:{}", &HEX[..62])),
                (format, format!("blake3:0x{}", &HEX[2..])),
                (format, format!("blake3: {}", &HEX[1..])),
                (format, "blake3:".to_owned()),
                (format, String::new()),
            ]);
        }
        for (format, value) in refused {
            let error = SealDigest::decode(format, &value).unwrap_err();
            assert_eq!(error.field(), FIELD, "format {format}: {value:?}");
        }
    }

    proptest! {
        #[test]
        fn prop_every_digest_round_trips(raw: [u8; 32], algorithm in 0..3u8) {
            let digest = match algorithm {
                0 => SealDigest::Xxh3_128(raw[..16].try_into().unwrap()),
                1 => SealDigest::Blake3(raw),
                _ => SealDigest::Sha256(raw),
            };
            prop_assert_eq!(SealDigest::decode(3, &digest.to_string()), Ok(digest));
        }

        #[test]
        fn prop_arbitrary_text_never_panics(format in 1u32..=3, value in ".{0,80}") {
            let _ = SealDigest::decode(format, &value);
        }
    }
}
