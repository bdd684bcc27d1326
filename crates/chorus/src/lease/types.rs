//! Newtypes of the lease: who holds it, for which database, under which token.

use std::fmt;
use std::str::FromStr;

use crate::blob::validate_key;

/// Longest accepted holder id, in bytes.
pub const MAX_HOLDER_ID_BYTES: usize = 256;

/// Longest accepted database key, in bytes (it prefixes every object key).
pub const MAX_DATABASE_KEY_BYTES: usize = 128;

/// A name that is not acceptable as a database key or holder id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what}: value={value:?}: {reason}")]
pub struct NameError {
    what: &'static str,
    value: String,
    reason: &'static str,
}

impl NameError {
    fn new(what: &'static str, value: &str, reason: &'static str) -> NameError {
        NameError {
            what,
            value: value.chars().take(80).collect(),
            reason,
        }
    }
}

/// Names one database: the first path segment of its lease, HEAD and payload
/// keys (`<db>/lease.json`). One path segment of key characters (ASCII letters,
/// digits, `-`, `_`, `.`, `=`), not starting with `.`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DatabaseKey(String);

impl DatabaseKey {
    /// Validates `name` as a database key.
    pub fn new(name: &str) -> Result<DatabaseKey, NameError> {
        let invalid = |reason| NameError::new("database key", name, reason);
        if name.len() > MAX_DATABASE_KEY_BYTES {
            return Err(invalid("longer than 128 bytes"));
        }
        if name.contains('/') {
            return Err(invalid("must be a single path segment (no '/')"));
        }
        validate_key(name).map_err(|_| {
            invalid("only ASCII letters, digits and - _ . = are allowed, not first '.'")
        })?;
        Ok(DatabaseKey(name.to_owned()))
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key of an object of this database: `<db>/<rest>`.
    pub fn child(&self, rest: &str) -> String {
        format!("{}/{rest}", self.0)
    }
}

impl fmt::Display for DatabaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for DatabaseKey {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DatabaseKey::new(s)
    }
}

/// Identifies a lease contender (for example `hostname-pid`). Non-empty, at most
/// [`MAX_HOLDER_ID_BYTES`], printable ASCII without whitespace, so it reads
/// unambiguously in messages and `key=value` pairs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HolderId(String);

impl HolderId {
    /// Validates `id` as a holder id.
    pub fn new(id: &str) -> Result<HolderId, NameError> {
        let invalid = |reason| NameError::new("holder id", id, reason);
        if id.is_empty() {
            return Err(invalid("empty"));
        }
        if id.len() > MAX_HOLDER_ID_BYTES {
            return Err(invalid("longer than 256 bytes"));
        }
        if !id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(
                "only printable ASCII without whitespace is allowed",
            ));
        }
        Ok(HolderId(id.to_owned()))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for HolderId {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HolderId::new(s)
    }
}

/// One process's lifetime as a lease contender: a random 128-bit id drawn
/// when the process (its runtime) starts and written into every lease
/// document it writes. A live lease is re-acquired without waiting only by
/// the incarnation that wrote it, so two processes that share a holder id
/// never hold the lease at once. Written as 32 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Incarnation(pub u128);

impl Incarnation {
    /// A fresh random incarnation.
    pub fn random() -> Incarnation {
        Incarnation(rand::random())
    }
}

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl FromStr for Incarnation {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || NameError::new("incarnation", s, "expected 32 lowercase hex digits");
        let hex = s.len() == 32
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hex {
            return Err(invalid());
        }
        u128::from_str_radix(s, 16)
            .map(Incarnation)
            .map_err(|_| invalid())
    }
}

/// Who contends for a lease: the holder id it is known by (a deployment
/// slot, shown to operators and clients) and the incarnation of the process
/// behind it. Make one per process and keep it: every acquisition by the
/// same `Contender` is the same incarnation, so a reboot inside the process
/// re-acquires its own live lease at once, while another process with the
/// same holder id waits for the lease to expire.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Contender {
    holder: HolderId,
    incarnation: Incarnation,
}

impl Contender {
    /// `holder` with a fresh random incarnation.
    pub fn new(holder: HolderId) -> Contender {
        Contender::with_incarnation(holder, Incarnation::random())
    }

    /// `holder` with a chosen incarnation (simulations, tests).
    pub fn with_incarnation(holder: HolderId, incarnation: Incarnation) -> Contender {
        Contender {
            holder,
            incarnation,
        }
    }

    /// The holder id.
    pub fn holder(&self) -> &HolderId {
        &self.holder
    }

    /// The incarnation.
    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }
}

impl fmt::Display for Contender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (incarnation {})", self.holder, self.incarnation)
    }
}

/// The contender's term: chosen by whoever deploys the contender (a
/// configuration or deployment number), never lowered. A contender whose term is
/// below the stored one is fenced for good, even when the lease has expired.
/// Terms start at 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Term(pub u64);

impl Term {
    /// The lowest valid term.
    pub const FIRST: Term = Term(1);
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Counts acquisitions of one database's lease: each acquisition takes the
/// stored generation plus one, and release keeps it, so a generation names
/// exactly one holder incarnation and never recurs. Generations start at 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Generation(pub u64);

impl Generation {
    /// The generation of a database's first acquisition.
    pub const FIRST: Generation = Generation(1);

    /// The next generation, or `None` on overflow.
    pub fn next(self) -> Option<Generation> {
        self.0.checked_add(1).map(Generation)
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The fencing token of one lease incarnation, ordered by term, then generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken {
    /// The holder's term.
    pub term: Term,
    /// The acquisition's generation.
    pub generation: Generation,
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.term, self.generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_keys_are_one_key_segment() {
        for good in ["default", "orders-eu", "db_1.v2", "a=b"] {
            assert_eq!(DatabaseKey::new(good).unwrap().as_str(), good);
        }
        for bad in ["", "a/b", ".hidden", "sp ace", "ü", &"x".repeat(129)] {
            assert!(DatabaseKey::new(bad).is_err(), "{bad:?} accepted");
        }
        let error = DatabaseKey::new("a/b").unwrap_err().to_string();
        assert!(
            error.starts_with("invalid database key: value=\"a/b\""),
            "{error}"
        );
        assert_eq!(
            DatabaseKey::new("db").unwrap().child("lease.json"),
            "db/lease.json"
        );
    }

    #[test]
    fn holder_ids_are_printable_words() {
        for good in ["host-42", "a", "pod/x:1"] {
            assert_eq!(good.parse::<HolderId>().unwrap().to_string(), good);
        }
        for bad in ["", "two words", "tab\there", "ü", &"x".repeat(257)] {
            assert!(HolderId::new(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn incarnations_are_32_hex_digits() {
        let incarnation = Incarnation(0xabc);
        let text = incarnation.to_string();
        assert_eq!(text, format!("{:0>32}", "abc"));
        assert_eq!(text.parse::<Incarnation>().unwrap(), incarnation);
        for bad in ["", "abc", &"A".repeat(32), &"g".repeat(32), &"0".repeat(33)] {
            assert!(bad.parse::<Incarnation>().is_err(), "{bad:?} accepted");
        }
        assert_ne!(Incarnation::random(), Incarnation::random());
        let holder = HolderId::new("node-a").unwrap();
        let a = Contender::new(holder.clone());
        let b = Contender::new(holder);
        assert_eq!(a.holder(), b.holder());
        assert_ne!(a, b, "two processes with one holder id are two contenders");
    }

    #[test]
    fn fencing_tokens_order_by_term_then_generation() {
        let token = |term, generation| FencingToken {
            term: Term(term),
            generation: Generation(generation),
        };
        assert!(token(1, 9) < token(2, 1));
        assert!(token(2, 1) < token(2, 2));
        assert_eq!(token(3, 4).to_string(), "3/4");
        assert_eq!(Generation(u64::MAX).next(), None);
    }
}
