//! The one line every reader gives for a document or encoding in a format
//! newer than it knows: during a rolling upgrade an older process meets data
//! a newer one wrote, and its operator must learn that at once, not from a
//! checksum or field error.

/// A document or encoding in a format newer than this build reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} written by a newer Chorus: format {found}; this build reads up to {newest_known}")]
pub struct NewerFormat {
    /// What was being read (`lease document`, `snapshot HEAD`, `fragment`, …).
    pub what: String,
    /// The format found.
    pub found: u64,
    /// The newest format this build reads.
    pub newest_known: u64,
}

impl NewerFormat {
    /// `Some` when `found` is newer than `newest_known`: formats only grow,
    /// so a higher number was written by a newer build.
    pub fn check(what: &str, found: u64, newest_known: u64) -> Option<NewerFormat> {
        (found > newest_known).then(|| NewerFormat {
            what: what.to_owned(),
            found,
            newest_known,
        })
    }

    /// [`check`](Self::check) of a format stored as text (the register's
    /// fields are strings); `None` when the text is not a number.
    pub fn check_text(what: &str, found: &str, newest_known: u64) -> Option<NewerFormat> {
        let found = found.trim_matches('"').parse::<u64>().ok()?;
        NewerFormat::check(what, found, newest_known)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_higher_format_is_newer_and_the_line_names_both() {
        assert_eq!(NewerFormat::check("lease document", 2, 2), None);
        assert_eq!(NewerFormat::check("lease document", 0, 2), None);
        let newer = NewerFormat::check("lease document", 3, 2).unwrap();
        assert_eq!(
            newer.to_string(),
            "lease document written by a newer Chorus: format 3; this build reads up to 2"
        );
        assert_eq!(
            NewerFormat::check_text("register", "\"9\"", 1).map(|n| n.found),
            Some(9)
        );
        assert_eq!(NewerFormat::check_text("register", "x", 1), None);
        assert_eq!(NewerFormat::check_text("register", "1", 1), None);
    }
}
