//! The etcd part of the workload: etcd v3 writes (`Put`, `DeleteRange`,
//! `Txn`, `Compact`) on a few keys under [`ETCD_PREFIX`], apart from every
//! other kind's keys, so compares and deletes meet keys that exist.
//!
//! A request is drawn at prepare time from its own seed and the applied
//! state it is checked against, as a client that just read the store would
//! build it: compares name the keys' current versions, revisions and values
//! half the time (so both branches run), historical ranges and compactions
//! name revisions within the bounds the state has. A draw that
//! `EtcdCommand::validate` refuses (a key written twice in one transaction)
//! is drawn again; the prepare then validates and encodes it exactly as the
//! gRPC service does.

use bytes::Bytes;
use chorus::kv::etcd::{
    CompactionRequest, Compare, CompareResult, CompareTarget, DeleteRangeRequest, PutRequest,
    RangeRequest, RequestOp, SortOrder, SortTarget, TxnRequest,
};
use chorus::kv::{DEFAULT_MAX_TXN_OPS, EtcdCommand, KvState};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Every etcd write's keys start with this; no other kind's key does.
pub(super) const ETCD_PREFIX: &[u8] = b"e/";

/// The keys etcd writes touch: few, so transactions meet each other's.
const KEYS: [&str; 8] = [
    "e/a", "e/b", "e/c", "e/d", "e/p/0", "e/p/1", "e/p/2", "e/p/3",
];

/// The prefixes ranges, range deletes and range compares cover, with
/// etcd's `range_end` for each (the prefix with its last byte + 1).
const PREFIXES: [(&str, &str); 2] = [("e/p/", "e/p0"), ("e/", "e0")];

/// The values etcd puts set: few, so value compares hold now and then.
const VALUES: [&str; 4] = ["v0", "v1", "v22", "v333"];

/// The most operations in one branch of a drawn transaction.
const MAX_BRANCH_OPS: usize = 3;
/// The deepest nesting of drawn transactions (1: none nested).
const MAX_TXN_DEPTH_DRAWN: u32 = 3;
/// Draws before falling back to a plain put (which always validates).
const MAX_DRAWS: usize = 16;

/// The etcd request for `seed` against `state`: one that
/// `EtcdCommand::validate` accepts there.
pub(super) fn draw_request(seed: u64, state: &KvState) -> EtcdCommand {
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..MAX_DRAWS {
        let command = draw(&mut rng, state);
        if command.validate(state, DEFAULT_MAX_TXN_OPS).is_ok() {
            return command;
        }
    }
    EtcdCommand::Put(put(&mut rng))
}

fn draw(rng: &mut StdRng, state: &KvState) -> EtcdCommand {
    match rng.random_range(0..100) {
        0..=29 => EtcdCommand::Put(put(rng)),
        30..=44 => EtcdCommand::DeleteRange(delete(rng)),
        45..=95 => EtcdCommand::Txn(txn(rng, state, 1)),
        _ => match compaction(rng, state) {
            Some(compaction) => EtcdCommand::Compact(compaction),
            None => EtcdCommand::Put(put(rng)),
        },
    }
}

fn pick<'a>(rng: &mut StdRng, items: &[&'a str]) -> &'a str {
    items[rng.random_range(0..items.len())]
}

fn key(rng: &mut StdRng) -> Bytes {
    Bytes::from_static(pick(rng, &KEYS).as_bytes())
}

/// A key, or a prefix with its `range_end` (one time in `1 / prefix_odds`).
fn key_or_prefix(rng: &mut StdRng, prefix_odds: u32) -> (Bytes, Bytes) {
    if rng.random_ratio(1, prefix_odds) {
        let (prefix, end) = PREFIXES[rng.random_range(0..PREFIXES.len())];
        (
            Bytes::from_static(prefix.as_bytes()),
            Bytes::from_static(end.as_bytes()),
        )
    } else {
        (key(rng), Bytes::new())
    }
}

fn put(rng: &mut StdRng) -> PutRequest {
    PutRequest {
        key: key(rng),
        value: Bytes::from_static(pick(rng, &VALUES).as_bytes()),
        prev_kv: rng.random_bool(0.5),
        ..PutRequest::default()
    }
}

fn delete(rng: &mut StdRng) -> DeleteRangeRequest {
    let (key, range_end) = key_or_prefix(rng, 4);
    DeleteRangeRequest {
        key,
        range_end,
        prev_kv: rng.random_bool(0.5),
    }
}

/// A range read: current, or at a revision the state still holds.
fn range(rng: &mut StdRng, state: &KvState) -> RangeRequest {
    let (key, range_end) = key_or_prefix(rng, 2);
    let revision = if rng.random_bool(0.3) {
        let oldest = state.compact_revision().max(1);
        rng.random_range(oldest..=state.revision())
    } else {
        0
    };
    let sort_target = match rng.random_range(0..4) {
        0 => SortTarget::Mod,
        1 => SortTarget::Version,
        2 => SortTarget::Value,
        _ => SortTarget::Key,
    };
    RangeRequest {
        key,
        range_end,
        revision,
        limit: rng.random_range(0..=3),
        sort_order: pick_sort_order(rng),
        sort_target,
        keys_only: rng.random_ratio(1, 6),
        count_only: rng.random_ratio(1, 8),
        ..RangeRequest::default()
    }
}

fn pick_sort_order(rng: &mut StdRng) -> SortOrder {
    match rng.random_range(0..3) {
        0 => SortOrder::Ascend,
        1 => SortOrder::Descend,
        _ => SortOrder::None,
    }
}

/// A transaction at nesting `depth` (1: the outermost).
fn txn(rng: &mut StdRng, state: &KvState, depth: u32) -> TxnRequest {
    let compares = rng.random_range(0..=3);
    TxnRequest {
        compare: (0..compares).map(|_| compare(rng, state)).collect(),
        success: branch(rng, state, depth),
        failure: branch(rng, state, depth),
    }
}

fn branch(rng: &mut StdRng, state: &KvState, depth: u32) -> Vec<RequestOp> {
    let ops = rng.random_range(0..=MAX_BRANCH_OPS);
    (0..ops)
        .map(|_| match rng.random_range(0..10) {
            0..=1 => RequestOp::Range(range(rng, state)),
            2..=5 => RequestOp::Put(put(rng)),
            6..=7 => RequestOp::DeleteRange(delete(rng)),
            _ if depth < MAX_TXN_DEPTH_DRAWN => RequestOp::Txn(txn(rng, state, depth + 1)),
            _ => RequestOp::Put(put(rng)),
        })
        .collect()
}

/// A compare on a key (or a prefix): half the time against the key's
/// current field, so an `Equal` holds.
fn compare(rng: &mut StdRng, state: &KvState) -> Compare {
    let (key, range_end) = key_or_prefix(rng, 5);
    let entry = state.get(&key);
    let current = rng.random_bool(0.5);
    let revision = |rng: &mut StdRng, field: Option<i64>| match field {
        Some(field) if current => field,
        _ => rng.random_range(0..=state.revision()),
    };
    let target = match rng.random_range(0..4) {
        0 => CompareTarget::Version(match entry {
            Some(entry) if current => entry.version,
            _ => rng.random_range(0..=3),
        }),
        1 => CompareTarget::Create(revision(rng, entry.map(|entry| entry.create_revision))),
        2 => CompareTarget::Mod(revision(rng, entry.map(|entry| entry.mod_revision))),
        _ => CompareTarget::Value(match entry {
            Some(entry) if current => entry.value.clone(),
            _ => Bytes::from_static(pick(rng, &VALUES).as_bytes()),
        }),
    };
    let result = match rng.random_range(0..6) {
        0 => CompareResult::Greater,
        1 => CompareResult::Less,
        2 => CompareResult::NotEqual,
        _ => CompareResult::Equal,
    };
    Compare {
        key,
        range_end,
        result,
        target,
    }
}

/// A compaction at a revision within bounds, in the older half of the
/// retained history so most of it stays to be compared; `None` when
/// there is nothing to compact.
fn compaction(rng: &mut StdRng, state: &KvState) -> Option<CompactionRequest> {
    let (oldest, newest) = (state.compact_revision() + 1, state.revision());
    if oldest > newest {
        return None;
    }
    let revision = rng.random_range(oldest..=oldest + (newest - oldest) / 2);
    Some(CompactionRequest {
        revision,
        physical: rng.random_bool(0.5),
    })
}

#[cfg(test)]
mod tests {
    use chorus::ids::RecordIndex;
    use chorus::kv::{Applied, EtcdResponse};

    use super::*;

    /// What a run of drawn requests exercised.
    #[derive(Debug, Default)]
    struct Coverage {
        puts: u64,
        deletes: u64,
        compactions: u64,
        txns_taken: [u64; 2],
        nested: u64,
        past_reads: u64,
        prev_kvs: u64,
    }

    fn note_txn(txn: &TxnRequest, coverage: &mut Coverage) {
        for op in txn.success.iter().chain(&txn.failure) {
            match op {
                RequestOp::Txn(inner) => {
                    coverage.nested += 1;
                    note_txn(inner, coverage);
                }
                RequestOp::Range(range) => coverage.past_reads += u64::from(range.revision > 0),
                _ => {}
            }
        }
    }

    fn note(command: &EtcdCommand, output: &Applied, coverage: &mut Coverage) {
        match (command, output) {
            (EtcdCommand::Put(_), Applied::Etcd(Ok(EtcdResponse::Put(put)))) => {
                coverage.puts += 1;
                coverage.prev_kvs += u64::from(put.prev_kv.is_some());
            }
            (EtcdCommand::DeleteRange(_), Applied::Etcd(Ok(EtcdResponse::DeleteRange(_)))) => {
                coverage.deletes += 1;
            }
            (EtcdCommand::Txn(txn), Applied::Etcd(Ok(EtcdResponse::Txn(answer)))) => {
                coverage.txns_taken[usize::from(answer.succeeded)] += 1;
                note_txn(txn, coverage);
            }
            (EtcdCommand::Compact(_), Applied::Etcd(Ok(EtcdResponse::Compact(_)))) => {
                coverage.compactions += 1;
            }
            other => panic!("a drawn request applied as {other:?}"),
        }
    }

    #[test]
    fn drawn_requests_validate_apply_and_cover_every_kind() {
        let mut state = KvState::default();
        let mut coverage = Coverage::default();
        for seed in 0..2000 {
            let command = draw_request(seed, &state);
            command.validate(&state, DEFAULT_MAX_TXN_OPS).unwrap();
            let output = state.apply(RecordIndex(seed), &command.encode());
            note(&command, &output, &mut coverage);
        }
        let seen = &coverage;
        let counts = [
            seen.puts,
            seen.deletes,
            seen.compactions,
            seen.txns_taken[0],
            seen.txns_taken[1],
        ];
        let more = [seen.nested, seen.past_reads, seen.prev_kvs];
        assert!(counts.iter().chain(&more).all(|n| *n > 0), "{coverage:?}");
        assert!(state.revision() > 100 && state.compact_revision() > 0);
        let (entries, _) = state.list(b"", None, usize::MAX);
        assert!(entries.iter().all(|(key, _)| key.starts_with(ETCD_PREFIX)));
    }
}
