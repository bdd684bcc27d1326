//! Which payloads retention deletes: a pure decision, unit-tested on its own.

use std::collections::HashSet;
use std::num::NonZeroUsize;

use super::{Head, PayloadId};

/// Newest payloads retention keeps by default (HEAD's payload is kept even when older).
pub const DEFAULT_KEEP_PAYLOADS: NonZeroUsize = NonZeroUsize::new(3).expect("3 is not zero");

/// What a retention pass kept and deleted, each oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// Payloads left in place.
    pub kept: Vec<PayloadId>,
    /// Payloads deleted (or to delete, for a plan).
    pub deleted: Vec<PayloadId>,
}

/// Splits `payloads` into kept and deleted. Deleted are exactly those that are
/// not among the newest `keep`, not named by `head`, and below `head`'s
/// sequence: a payload at or above it may be a publication in flight whose
/// HEAD CAS is still to come, so it is never deleted. No HEAD, no deletion.
pub(crate) fn plan(
    payloads: &[PayloadId],
    head: Option<&Head>,
    keep: NonZeroUsize,
) -> RetentionReport {
    let mut sorted = payloads.to_vec();
    sorted.sort();
    sorted.dedup();
    let newest: HashSet<PayloadId> = sorted.iter().rev().take(keep.get()).copied().collect();
    let (deleted, kept) = sorted.into_iter().partition(|id| {
        head.is_some_and(|head| {
            !newest.contains(id) && *id != head.snapshot && id.sequence < head.publication_sequence
        })
    });
    RetentionReport { kept, deleted }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::RecordIndex;
    use crate::lease::{DatabaseKey, Generation, HolderId, Term};
    use crate::snapshot::{PublicationSequence, PublisherId, Sha256Digest};

    fn id(generation: u64, sequence: u64) -> PayloadId {
        PayloadId {
            generation: Generation(generation),
            sequence: PublicationSequence(sequence),
        }
    }

    fn head(names: PayloadId, sequence: u64) -> Head {
        Head {
            database_key: DatabaseKey::new("db").unwrap(),
            holder_id: HolderId::new("h").unwrap(),
            term: Term(1),
            lease_generation: Generation(9),
            publication_sequence: PublicationSequence(sequence),
            snapshot: names,
            wal_index: RecordIndex(0),
            payload_size_bytes: 0,
            payload_sha256: Sha256Digest::of(b""),
            publisher_id: PublisherId(1),
            updated_at_ms: 0,
        }
    }

    fn keep(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).unwrap()
    }

    #[test]
    fn keeps_the_newest_and_deletes_the_rest_below_head() {
        let all = [id(1, 1), id(1, 2), id(2, 4), id(2, 5), id(3, 7)];
        let report = plan(&all, Some(&head(id(3, 7), 7)), keep(2));
        assert_eq!(report.deleted, [id(1, 1), id(1, 2), id(2, 4)]);
        assert_eq!(report.kept, [id(2, 5), id(3, 7)]);
    }

    #[test]
    fn never_deletes_what_head_names_even_when_old() {
        // A restart re-stamps HEAD (sequence 9) over an old payload (sequence 2).
        let all = [id(1, 1), id(1, 2), id(2, 5), id(2, 6), id(2, 7)];
        let report = plan(&all, Some(&head(id(1, 2), 9)), keep(1));
        assert_eq!(report.deleted, [id(1, 1), id(2, 5), id(2, 6)]);
        assert_eq!(report.kept, [id(1, 2), id(2, 7)]);
    }

    #[test]
    fn never_deletes_at_or_above_heads_sequence() {
        // (3, 8) and (4, 9) may be publications in flight; (2, 7) is HEAD's.
        let all = [id(1, 1), id(2, 7), id(3, 8), id(4, 9), id(3, 3)];
        let report = plan(&all, Some(&head(id(2, 7), 7)), keep(1));
        assert_eq!(report.deleted, [id(1, 1), id(3, 3)]);
        assert_eq!(report.kept, [id(2, 7), id(3, 8), id(4, 9)]);
    }

    #[test]
    fn no_head_deletes_nothing() {
        let all = [id(1, 1), id(1, 2), id(1, 3)];
        let report = plan(&all, None, keep(1));
        assert!(report.deleted.is_empty());
        assert_eq!(report.kept.len(), 3);
    }
}
