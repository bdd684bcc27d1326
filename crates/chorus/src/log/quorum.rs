//! Quorum arithmetic and the committed-prefix choice of recovery
//! (docs/protocol.md, Recovering, step 3), as pure functions.

/// Q = N/2 + 1: the copies an acknowledged fragment has.
pub fn quorum(replicas: usize) -> usize {
    replicas / 2 + 1
}

/// How many valid data copies a position needs among `observed` of `replicas`
/// replicas to have possibly been acknowledged: Q − (N − k), since at most
/// N − k of its Q copies can hide on unobserved replicas.
///
/// # Panics
/// If fewer than Q replicas were observed (recovery needs a quorum) or more
/// than N.
pub fn copies_needed(replicas: usize, observed: usize) -> usize {
    let q = quorum(replicas);
    assert!(
        (q..=replicas).contains(&observed),
        "observed {observed} of {replicas} replicas; need at least {q}"
    );
    // 2Q > N and k ≥ Q make this at least 1.
    q - (replicas - observed)
}

/// The number of leading positions with at least `needed` copies each.
pub fn passing_prefix(copies: &[usize], needed: usize) -> usize {
    copies.iter().take_while(|c| **c >= needed).count()
}

/// What recovery keeps of the tail and pending segments, in fragments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovered {
    /// Leading tail fragments kept.
    pub tail: usize,
    /// Leading pending fragments kept.
    pub pending: usize,
}

/// Chooses the committed prefix of the tail and then the pending segment.
///
/// `tail_copies[i]` / `pending_copies[i]` count the valid data copies of
/// fragment `i` among the `observed` replicas. Everything after the first
/// failing position is discarded (acks are in order). If the tail loses any
/// data that way, the pending segment is discarded whole: the writer moves to
/// the pending segment only once the tail is fully committed, so pending data
/// after a tail gap was never acknowledged.
pub fn choose_recovered(
    replicas: usize,
    observed: usize,
    tail_copies: &[usize],
    pending_copies: &[usize],
) -> Recovered {
    let needed = copies_needed(replicas, observed);
    let tail = passing_prefix(tail_copies, needed);
    let tail_has_gap = tail_copies[tail..].iter().any(|c| *c > 0);
    let pending = if tail_has_gap {
        0
    } else {
        passing_prefix(pending_copies, needed)
    };
    Recovered { tail, pending }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorum_sizes() {
        assert_eq!([1, 3, 5].map(quorum), [1, 2, 3]);
        assert_eq!(copies_needed(3, 3), 2);
        assert_eq!(copies_needed(3, 2), 1);
        assert_eq!(copies_needed(5, 3), 1);
        assert_eq!(copies_needed(5, 4), 2);
        assert_eq!(copies_needed(1, 1), 1);
    }

    #[test]
    #[should_panic(expected = "need at least 2")]
    fn recovery_needs_a_quorum_of_observations() {
        copies_needed(3, 1);
    }

    /// All subsets of `0..n` as bit masks.
    fn subsets(n: usize) -> impl Iterator<Item = u32> {
        0..(1u32 << n)
    }

    /// Exhaustively: a fragment on at least Q replicas (possibly acknowledged)
    /// passes for every observed set of at least Q replicas, and a fragment on
    /// fewer than Q − (N − k) observed replicas had fewer than Q copies in all.
    #[test]
    fn an_acknowledged_fragment_always_passes() {
        for n in [1usize, 3, 5] {
            for placed in subsets(n) {
                for observed in subsets(n).filter(|o| o.count_ones() as usize >= quorum(n)) {
                    let k = observed.count_ones() as usize;
                    let seen = (placed & observed).count_ones() as usize;
                    let passes = seen >= copies_needed(n, k);
                    if placed.count_ones() as usize >= quorum(n) {
                        assert!(passes, "n={n} placed={placed:b} observed={observed:b}");
                    }
                    if !passes {
                        assert!((placed.count_ones() as usize) < quorum(n));
                    }
                }
            }
        }
    }

    /// Exhaustively over small histories: whatever the writer had acknowledged
    /// (an in-order prefix of fragments on ≥ Q replicas each) is kept, for every
    /// observed set, with or without partial copies of later fragments.
    #[test]
    fn the_acknowledged_prefix_is_always_kept() {
        let n = 3;
        let positions = 3;
        // Each position is placed on a subset of replicas.
        let placements: Vec<Vec<u32>> = (0..(1u32 << (n * positions)))
            .map(|bits| (0..positions).map(|p| (bits >> (p * n)) & 0b111).collect())
            .collect();
        for placement in placements {
            let acked = placement
                .iter()
                .take_while(|p| p.count_ones() as usize >= quorum(n))
                .count();
            for observed in subsets(n).filter(|o| o.count_ones() as usize >= quorum(n)) {
                let k = observed.count_ones() as usize;
                let copies: Vec<usize> = placement
                    .iter()
                    .map(|p| (p & observed).count_ones() as usize)
                    .collect();
                let kept = choose_recovered(n, k, &copies, &[]).tail;
                assert!(
                    kept >= acked,
                    "placement={placement:?} observed={observed:b}"
                );
            }
        }
    }

    #[test]
    fn pending_data_after_a_tail_gap_is_discarded() {
        // Tail fragment 1 failed but fragment 2 has a copy: a gap.
        let chosen = choose_recovered(3, 3, &[2, 1, 1], &[3, 3]);
        assert_eq!(
            chosen,
            Recovered {
                tail: 1,
                pending: 0
            }
        );
        // A clean tail end: pending continues.
        let chosen = choose_recovered(3, 3, &[2, 2, 0], &[3, 2, 1]);
        assert_eq!(
            chosen,
            Recovered {
                tail: 2,
                pending: 2
            }
        );
        // With one replica unobserved, a single copy may have been acknowledged.
        let chosen = choose_recovered(3, 2, &[1, 1], &[1, 0, 1]);
        assert_eq!(
            chosen,
            Recovered {
                tail: 2,
                pending: 1
            }
        );
    }
}
