//! Newtypes for the numbers the protocol juggles, so that an epoch can never be
//! passed where a record index is expected.

use std::fmt;
use std::str::FromStr;

/// A writer incarnation number. Each recovery claims `epoch + 1` by CAS on the
/// register; epoch 0 belongs to no writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Epoch(pub u64);

impl Epoch {
    /// The epoch of a freshly created register, owned by no writer.
    pub const NONE: Epoch = Epoch(0);

    /// The next epoch, or `None` on overflow.
    pub fn next(self) -> Option<Epoch> {
        self.0.checked_add(1).map(Epoch)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The position of a record in the log. Indices are dense and start at 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RecordIndex(pub u64);

impl fmt::Display for RecordIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The position of a fragment object inside its segment. Dense, starts at 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct FragmentIndex(pub u64);

impl FragmentIndex {
    /// Width of the zero-padded decimal form used in object keys, so that keys
    /// sort in index order.
    pub const KEY_DIGITS: usize = 20;

    /// The zero-padded decimal form used as the last component of a fragment key.
    pub fn key_component(self) -> String {
        format!("{:020}", self.0)
    }
}

impl fmt::Display for FragmentIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The random 128-bit identity of one writer incarnation (the register's
/// `owner`). Zero means "no owner".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct OwnerId(pub u128);

impl OwnerId {
    /// The owner of a register that no writer has claimed yet.
    pub const NONE: OwnerId = OwnerId(0);

    /// A fresh random owner id (never zero).
    pub fn random() -> OwnerId {
        loop {
            let id: u128 = rand::random();
            if id != 0 {
                return OwnerId(id);
            }
        }
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl FromStr for OwnerId {
    type Err = IdParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 32 || !is_lower_hex(s) {
            return Err(IdParseError::new(
                "owner id",
                s,
                "expected 32 lowercase hex digits",
            ));
        }
        u128::from_str_radix(s, 16)
            .map(OwnerId)
            .map_err(|_| IdParseError::new("owner id", s, "expected 32 hex digits"))
    }
}

/// Names a segment: the epoch of the writer that created it plus a counter, so
/// ids sort by creation and never repeat. Written `<epoch, 16 hex>-<counter, 8 hex>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentId {
    /// The epoch of the writer that named this segment; only it writes data here.
    pub epoch: Epoch,
    /// Distinguishes the segments named by one epoch.
    pub counter: u32,
}

impl SegmentId {
    /// Builds a segment id.
    pub fn new(epoch: Epoch, counter: u32) -> SegmentId {
        SegmentId { epoch, counter }
    }

    /// The id after this one in the same epoch, or `None` when the counter is exhausted.
    pub fn successor(self) -> Option<SegmentId> {
        self.counter
            .checked_add(1)
            .map(|counter| SegmentId::new(self.epoch, counter))
    }
}

impl fmt::Display for SegmentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}-{:08x}", self.epoch.0, self.counter)
    }
}

impl FromStr for SegmentId {
    type Err = IdParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || IdParseError::new("segment id", s, "expected <16 hex>-<8 hex>");
        let (epoch, counter) = s.split_once('-').ok_or_else(bad)?;
        if epoch.len() != 16 || counter.len() != 8 || !is_lower_hex(epoch) || !is_lower_hex(counter)
        {
            return Err(bad());
        }
        let epoch = u64::from_str_radix(epoch, 16).map_err(|_| bad())?;
        let counter = u32::from_str_radix(counter, 16).map_err(|_| bad())?;
        Ok(SegmentId::new(Epoch(epoch), counter))
    }
}

/// Lowercase hex only, so every id has exactly one spelling.
fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// An id that did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value:?}: {reason}")]
pub struct IdParseError {
    what: &'static str,
    value: String,
    reason: &'static str,
}

impl IdParseError {
    fn new(what: &'static str, value: &str, reason: &'static str) -> IdParseError {
        IdParseError {
            what,
            value: value.chars().take(80).collect(),
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_id_round_trips_and_sorts_by_creation() {
        let a = SegmentId::new(Epoch(1), 2);
        let b = SegmentId::new(Epoch(2), 0);
        assert_eq!(a.to_string(), "0000000000000001-00000002");
        assert_eq!(a.to_string().parse::<SegmentId>().unwrap(), a);
        assert!(a < b);
        assert!(a.to_string() < b.to_string());
    }

    #[test]
    fn segment_id_rejects_other_spellings() {
        for bad in [
            "",
            "1-2",
            "0000000000000001-0000000",
            "0000000000000001_00000002",
            "000000000000000A-00000002",
            "0000000000000001-00000002-",
            "+000000000000001-00000002",
        ] {
            assert!(bad.parse::<SegmentId>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn owner_id_round_trips() {
        let id = OwnerId(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        assert_eq!(id.to_string().parse::<OwnerId>().unwrap(), id);
        assert!("xyz".parse::<OwnerId>().is_err());
        assert_ne!(OwnerId::random(), OwnerId::NONE);
    }

    #[test]
    fn fragment_key_component_sorts_numerically() {
        assert_eq!(FragmentIndex(7).key_component(), "00000000000000000007");
        assert!(FragmentIndex(9).key_component() < FragmentIndex(10).key_component());
    }
}
