//! CRC32C of byte runs that are written in pieces: the checksum of a
//! concatenation from the checksums of its parts, without reading the bytes
//! again.
//!
//! A sealed segment's payload is its fragments' payloads end to end, and
//! every fragment's payload checksum was computed when it was cut; combining
//! them costs a few dozen word operations per fragment instead of a pass over
//! every byte of the segment at seal time.
//!
//! The combination multiplies the first checksum by x^(8·len) modulo the
//! CRC32C polynomial (the effect of appending `len` zero bytes) and adds the
//! second. x^(8·len) is assembled from a table of x^(2^k), so the cost grows
//! with the number of set bits in `len`, not with `len`.

/// The CRC32C (Castagnoli) polynomial, bit-reflected as the checksum uses it.
const POLY: u32 = 0x82f6_3b78;

/// x^0 in the reflected representation (the most significant bit is x^0).
const ONE: u32 = 1 << 31;

/// Entries of [`X2N`]: x^(2^k) for every k a byte length of up to 2^64 can
/// ask for (8·len has at most 67 bits).
const X2N_ENTRIES: usize = 67;

/// `X2N[k]` = x^(2^k) mod the polynomial.
const X2N: [u32; X2N_ENTRIES] = x2n_table();

/// a·b mod the polynomial, both in the reflected representation.
const fn multiply(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut bit = ONE;
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        bit >>= 1;
    }
    product
}

const fn x2n_table() -> [u32; X2N_ENTRIES] {
    let mut table = [0; X2N_ENTRIES];
    // x^1 sits one bit below x^0.
    let mut power = ONE >> 1;
    let mut k = 0;
    while k < X2N_ENTRIES {
        table[k] = power;
        power = multiply(power, power);
        k += 1;
    }
    table
}

/// x^(8·len) mod the polynomial: the operator that appends `len` zero bytes.
fn zero_bytes_operator(len: u64) -> u32 {
    let mut operator = ONE;
    let mut remaining = len;
    // 8·len = len shifted up by three bits: start the table at x^(2^3).
    let mut k = 3;
    while remaining != 0 {
        if remaining & 1 != 0 {
            operator = multiply(X2N[k], operator);
        }
        remaining >>= 1;
        k += 1;
    }
    operator
}

/// The CRC32C of `a` followed by `b`, from `crc32c(a)`, `crc32c(b)` and the
/// length of `b` in bytes.
pub fn combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    multiply(zero_bytes_operator(len_b), crc_a) ^ crc_b
}

/// The CRC32C and length of a run of bytes, extended run by run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CrcRun {
    crc: u32,
    len: u64,
}

impl CrcRun {
    /// The run of `bytes`, read once.
    pub fn of(bytes: &[u8]) -> CrcRun {
        CrcRun {
            crc: crc32c::crc32c(bytes),
            len: bytes.len() as u64,
        }
    }

    /// This run followed by `next`.
    pub fn then(self, next: CrcRun) -> CrcRun {
        CrcRun {
            crc: combine(self.crc, next.crc, next.len),
            len: self.len + next.len,
        }
    }

    /// The run's CRC32C.
    pub fn crc(self) -> u32 {
        self.crc
    }

    /// The run's length in bytes.
    pub fn len(self) -> u64 {
        self.len
    }

    /// Whether the run holds no bytes.
    pub fn is_empty(self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_empty_run_is_neutral() {
        let run = CrcRun::of(b"123456789");
        assert_eq!(run.crc(), 0xe306_9283, "the CRC32C check value");
        assert_eq!(CrcRun::default().then(run), run);
        assert_eq!(run.then(CrcRun::default()), run);
        assert!(CrcRun::default().is_empty());
    }

    #[test]
    fn long_runs_combine_as_the_reference_does() {
        // The crate's own combine (zlib's matrix method) is the reference for
        // lengths too long to checksum here.
        for len in [1u64 << 20, (1 << 32) + 7, (1 << 40) - 1, u64::MAX >> 3] {
            for (a, b) in [(0u32, 0u32), (0xdead_beef, 0x1234_5678), (u32::MAX, 1)] {
                let reference = crc32c::crc32c_combine(a, b, len as usize);
                assert_eq!(combine(a, b, len), reference, "len {len}");
            }
        }
    }

    proptest! {
        #[test]
        fn combining_parts_equals_checksumming_the_whole(
            parts in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..3000), 0..8),
        ) {
            let whole: Vec<u8> = parts.concat();
            let combined = parts
                .iter()
                .fold(CrcRun::default(), |run, part| run.then(CrcRun::of(part)));
            prop_assert_eq!(combined, CrcRun::of(&whole));
        }

        #[test]
        fn combine_matches_the_reference_at_any_length(
            a in any::<u32>(),
            b in any::<u32>(),
            len in any::<u32>(),
        ) {
            prop_assert_eq!(
                combine(a, b, u64::from(len)),
                crc32c::crc32c_combine(a, b, len as usize)
            );
        }
    }
}
