//! etcd requests as the body of a key-value record (body kind 5, see
//! [`command`](super::command)). All integers little-endian; `key`,
//! `range_end` and `value` are `length u32 | bytes`.
//!
//! ```text
//! etcd body:  request u8 | …
//! 1 put:      key | value | lease i64 | flags u8 (1 prev_kv, 2 ignore_value, 4 ignore_lease)
//! 2 delete:   key | range_end | flags u8 (1 prev_kv)
//! 3 txn:      compares u32 | compare… | success u32 | op… | failure u32 | op…
//! 4 compact:  revision i64 | physical u8 (0/1)
//! 5 grant:    id i64 | ttl i64
//! 6 revoke:   id i64
//! 7 alarm:    action u8 (1 activate, 2 deactivate) | member_id u64 | alarm u8 (1 NOSPACE, 2 CORRUPT)
//! compare:    key | range_end | result u8 (1 =, 2 >, 3 <, 4 !=)
//!             | target u8 (1 version, 2 create, 3 mod, 4 value, 5 lease) | i64 or value
//! op:         1 range | 2 put (as above) | 3 delete (as above) | 4 txn (as above)
//! range:      key | range_end | limit i64 | revision i64 | sort_order u8 (0 none, 1 ascend,
//!             2 descend) | sort_target u8 (0 key, 1 version, 2 create, 3 mod, 4 value)
//!             | flags u8 (1 serializable, 2 keys_only, 4 count_only)
//!             | min_mod i64 | max_mod i64 | min_create i64 | max_create i64
//! ```
//!
//! Nested transactions are at most [`MAX_TXN_DEPTH`] deep, so decoding
//! (and applying) never recurses without bound.

use bytes::{Buf, BufMut, BytesMut};

use super::command::CommandError;
use super::etcd::{
    AlarmAction, AlarmMember, AlarmRequest, AlarmType, CompactionRequest, Compare, CompareResult,
    CompareTarget, DeleteRangeRequest, EtcdCommand, LeaseGrantRequest, LeaseRevokeRequest,
    PutRequest, RangeRequest, RequestOp, SortOrder, SortTarget, TxnRequest,
};
use super::input::Input;

/// The deepest nesting of transactions a record may hold (etcd bounds it
/// through the operation limit: each level's budget shrinks).
pub const MAX_TXN_DEPTH: usize = 128;

const PUT: u8 = 1;
const DELETE: u8 = 2;
const TXN: u8 = 3;
const COMPACT: u8 = 4;
const LEASE_GRANT: u8 = 5;
const LEASE_REVOKE: u8 = 6;
const ALARM: u8 = 7;
const RANGE_OP: u8 = 1;
const PUT_OP: u8 = 2;
const DELETE_OP: u8 = 3;
const TXN_OP: u8 = 4;

/// Writes `command` as an etcd body (after the kind byte).
/// The number of bytes [`put_command`] writes for `command` (so a record
/// is encoded into one buffer of its size; a test holds the two together).
pub(super) fn encoded_len(command: &EtcdCommand) -> usize {
    const LENGTH: usize = 4;
    const NUMBER: usize = 8;
    fn put(put: &PutRequest) -> usize {
        2 * LENGTH + put.key.len() + put.value.len() + NUMBER + 1
    }
    fn delete(delete: &DeleteRangeRequest) -> usize {
        2 * LENGTH + delete.key.len() + delete.range_end.len() + 1
    }
    fn range(range: &RangeRequest) -> usize {
        2 * LENGTH + range.key.len() + range.range_end.len() + 2 * NUMBER + 3 + 4 * NUMBER
    }
    fn compare(compare: &Compare) -> usize {
        let target = match &compare.target {
            CompareTarget::Value(value) => LENGTH + value.len(),
            _ => NUMBER,
        };
        2 * LENGTH + compare.key.len() + compare.range_end.len() + 2 + target
    }
    fn op(op: &RequestOp) -> usize {
        1 + match op {
            RequestOp::Range(request) => range(request),
            RequestOp::Put(request) => put(request),
            RequestOp::DeleteRange(request) => delete(request),
            RequestOp::Txn(request) => txn(request),
        }
    }
    fn txn(txn: &TxnRequest) -> usize {
        3 * LENGTH
            + txn.compare.iter().map(compare).sum::<usize>()
            + txn
                .success
                .iter()
                .chain(&txn.failure)
                .map(op)
                .sum::<usize>()
    }
    1 + match command {
        EtcdCommand::Put(request) => put(request),
        EtcdCommand::DeleteRange(request) => delete(request),
        EtcdCommand::Txn(request) => txn(request),
        EtcdCommand::Compact(_) => NUMBER + 1,
        EtcdCommand::LeaseGrant(_) => 2 * NUMBER,
        EtcdCommand::LeaseRevoke(_) => NUMBER,
        EtcdCommand::Alarm(_) => 1 + NUMBER + 1,
    }
}

pub(super) fn put_command(out: &mut BytesMut, command: &EtcdCommand) {
    match command {
        EtcdCommand::Put(put) => {
            out.put_u8(PUT);
            put_put(out, put);
        }
        EtcdCommand::DeleteRange(delete) => {
            out.put_u8(DELETE);
            put_delete(out, delete);
        }
        EtcdCommand::Txn(txn) => {
            out.put_u8(TXN);
            put_txn(out, txn);
        }
        EtcdCommand::Compact(compaction) => {
            out.put_u8(COMPACT);
            out.put_i64_le(compaction.revision);
            out.put_u8(compaction.physical as u8);
        }
        EtcdCommand::LeaseGrant(grant) => {
            out.put_u8(LEASE_GRANT);
            out.put_i64_le(grant.id);
            out.put_i64_le(grant.ttl);
        }
        EtcdCommand::LeaseRevoke(revoke) => {
            out.put_u8(LEASE_REVOKE);
            out.put_i64_le(revoke.id);
        }
        EtcdCommand::Alarm(alarm) => {
            out.put_u8(ALARM);
            out.put_u8(match alarm.action {
                AlarmAction::Activate => 1,
                AlarmAction::Deactivate => 2,
            });
            out.put_u64_le(alarm.member.member_id);
            out.put_u8(match alarm.member.alarm {
                AlarmType::NoSpace => 1,
                AlarmType::Corrupt => 2,
            });
        }
    }
}

/// Reads what [`put_command`] wrote.
pub(super) fn take_command(input: &mut Input) -> Result<EtcdCommand, CommandError> {
    Ok(match take_u8(input)? {
        PUT => EtcdCommand::Put(take_put(input)?),
        DELETE => EtcdCommand::DeleteRange(take_delete(input)?),
        TXN => EtcdCommand::Txn(take_txn(input, 0)?),
        COMPACT => EtcdCommand::Compact(CompactionRequest {
            revision: take_i64(input)?,
            physical: take_flag(input)?,
        }),
        LEASE_GRANT => EtcdCommand::LeaseGrant(LeaseGrantRequest {
            id: take_i64(input)?,
            ttl: take_i64(input)?,
        }),
        LEASE_REVOKE => EtcdCommand::LeaseRevoke(LeaseRevokeRequest {
            id: take_i64(input)?,
        }),
        ALARM => EtcdCommand::Alarm(take_alarm(input)?),
        _ => return Err(malformed("unknown etcd request")),
    })
}

fn take_alarm(input: &mut &[u8]) -> Result<AlarmRequest, CommandError> {
    let action = match take_u8(input)? {
        1 => AlarmAction::Activate,
        2 => AlarmAction::Deactivate,
        _ => return Err(malformed("unknown alarm action")),
    };
    let member_id = take_i64(input)? as u64;
    let alarm = match take_u8(input)? {
        1 => AlarmType::NoSpace,
        2 => AlarmType::Corrupt,
        _ => return Err(malformed("unknown alarm")),
    };
    Ok(AlarmRequest {
        action,
        member: AlarmMember { member_id, alarm },
    })
}

/// How deep `txn`'s nested transactions go (1: none).
pub(super) fn txn_depth(txn: &TxnRequest) -> usize {
    let nested = txn
        .success
        .iter()
        .chain(&txn.failure)
        .filter_map(|op| match op {
            RequestOp::Txn(inner) => Some(txn_depth(inner)),
            _ => None,
        });
    1 + nested.max().unwrap_or(0)
}

fn put_put(out: &mut BytesMut, put: &PutRequest) {
    put_bytes(out, &put.key);
    put_bytes(out, &put.value);
    out.put_i64_le(put.lease);
    out.put_u8(flags(&[put.prev_kv, put.ignore_value, put.ignore_lease]));
}

fn take_put(input: &mut Input) -> Result<PutRequest, CommandError> {
    let key = input.take_bytes()?;
    let value = input.take_bytes()?;
    let lease = take_i64(input)?;
    let [prev_kv, ignore_value, ignore_lease] = take_flags(input)?;
    Ok(PutRequest {
        key,
        value,
        lease,
        prev_kv,
        ignore_value,
        ignore_lease,
    })
}

fn put_delete(out: &mut BytesMut, delete: &DeleteRangeRequest) {
    put_bytes(out, &delete.key);
    put_bytes(out, &delete.range_end);
    out.put_u8(flags(&[delete.prev_kv]));
}

fn take_delete(input: &mut Input) -> Result<DeleteRangeRequest, CommandError> {
    let key = input.take_bytes()?;
    let range_end = input.take_bytes()?;
    let [prev_kv] = take_flags(input)?;
    Ok(DeleteRangeRequest {
        key,
        range_end,
        prev_kv,
    })
}

fn put_txn(out: &mut BytesMut, txn: &TxnRequest) {
    out.put_u32_le(txn.compare.len() as u32);
    for compare in &txn.compare {
        put_compare(out, compare);
    }
    for branch in [&txn.success, &txn.failure] {
        out.put_u32_le(branch.len() as u32);
        for op in branch {
            put_op(out, op);
        }
    }
}

fn take_txn(input: &mut Input, depth: usize) -> Result<TxnRequest, CommandError> {
    if depth >= MAX_TXN_DEPTH {
        return Err(malformed("transactions nested too deep"));
    }
    let count = take_count(input)?;
    let compare = (0..count)
        .map(|_| take_compare(input))
        .collect::<Result<_, _>>()?;
    let count = take_count(input)?;
    let success = (0..count)
        .map(|_| take_op(input, depth))
        .collect::<Result<_, _>>()?;
    let count = take_count(input)?;
    let failure = (0..count)
        .map(|_| take_op(input, depth))
        .collect::<Result<_, _>>()?;
    Ok(TxnRequest {
        compare,
        success,
        failure,
    })
}

fn put_op(out: &mut BytesMut, op: &RequestOp) {
    match op {
        RequestOp::Range(range) => {
            out.put_u8(RANGE_OP);
            put_range(out, range);
        }
        RequestOp::Put(put) => {
            out.put_u8(PUT_OP);
            put_put(out, put);
        }
        RequestOp::DeleteRange(delete) => {
            out.put_u8(DELETE_OP);
            put_delete(out, delete);
        }
        RequestOp::Txn(txn) => {
            out.put_u8(TXN_OP);
            put_txn(out, txn);
        }
    }
}

fn take_op(input: &mut Input, depth: usize) -> Result<RequestOp, CommandError> {
    Ok(match take_u8(input)? {
        RANGE_OP => RequestOp::Range(take_range(input)?),
        PUT_OP => RequestOp::Put(take_put(input)?),
        DELETE_OP => RequestOp::DeleteRange(take_delete(input)?),
        TXN_OP => RequestOp::Txn(take_txn(input, depth + 1)?),
        _ => return Err(malformed("unknown etcd operation")),
    })
}

fn put_compare(out: &mut BytesMut, compare: &Compare) {
    put_bytes(out, &compare.key);
    put_bytes(out, &compare.range_end);
    out.put_u8(match compare.result {
        CompareResult::Equal => 1,
        CompareResult::Greater => 2,
        CompareResult::Less => 3,
        CompareResult::NotEqual => 4,
    });
    let (target, number) = match &compare.target {
        CompareTarget::Version(number) => (1, *number),
        CompareTarget::Create(number) => (2, *number),
        CompareTarget::Mod(number) => (3, *number),
        CompareTarget::Value(value) => {
            out.put_u8(4);
            put_bytes(out, value);
            return;
        }
        CompareTarget::Lease(number) => (5, *number),
    };
    out.put_u8(target);
    out.put_i64_le(number);
}

fn take_compare(input: &mut Input) -> Result<Compare, CommandError> {
    let key = input.take_bytes()?;
    let range_end = input.take_bytes()?;
    let result = match take_u8(input)? {
        1 => CompareResult::Equal,
        2 => CompareResult::Greater,
        3 => CompareResult::Less,
        4 => CompareResult::NotEqual,
        _ => return Err(malformed("unknown compare result")),
    };
    let target = match take_u8(input)? {
        1 => CompareTarget::Version(take_i64(input)?),
        2 => CompareTarget::Create(take_i64(input)?),
        3 => CompareTarget::Mod(take_i64(input)?),
        4 => CompareTarget::Value(input.take_bytes()?),
        5 => CompareTarget::Lease(take_i64(input)?),
        _ => return Err(malformed("unknown compare target")),
    };
    Ok(Compare {
        key,
        range_end,
        result,
        target,
    })
}

fn put_range(out: &mut BytesMut, range: &RangeRequest) {
    put_bytes(out, &range.key);
    put_bytes(out, &range.range_end);
    out.put_i64_le(range.limit);
    out.put_i64_le(range.revision);
    out.put_u8(match range.sort_order {
        SortOrder::None => 0,
        SortOrder::Ascend => 1,
        SortOrder::Descend => 2,
    });
    out.put_u8(match range.sort_target {
        SortTarget::Key => 0,
        SortTarget::Version => 1,
        SortTarget::Create => 2,
        SortTarget::Mod => 3,
        SortTarget::Value => 4,
    });
    out.put_u8(flags(&[
        range.serializable,
        range.keys_only,
        range.count_only,
    ]));
    for bound in [
        range.min_mod_revision,
        range.max_mod_revision,
        range.min_create_revision,
        range.max_create_revision,
    ] {
        out.put_i64_le(bound);
    }
}

fn take_range(input: &mut Input) -> Result<RangeRequest, CommandError> {
    let key = input.take_bytes()?;
    let range_end = input.take_bytes()?;
    let limit = take_i64(input)?;
    let revision = take_i64(input)?;
    let sort_order = match take_u8(input)? {
        0 => SortOrder::None,
        1 => SortOrder::Ascend,
        2 => SortOrder::Descend,
        _ => return Err(malformed("unknown sort order")),
    };
    let sort_target = match take_u8(input)? {
        0 => SortTarget::Key,
        1 => SortTarget::Version,
        2 => SortTarget::Create,
        3 => SortTarget::Mod,
        4 => SortTarget::Value,
        _ => return Err(malformed("unknown sort target")),
    };
    let [serializable, keys_only, count_only] = take_flags(input)?;
    Ok(RangeRequest {
        key,
        range_end,
        limit,
        revision,
        sort_order,
        sort_target,
        serializable,
        keys_only,
        count_only,
        min_mod_revision: take_i64(input)?,
        max_mod_revision: take_i64(input)?,
        min_create_revision: take_i64(input)?,
        max_create_revision: take_i64(input)?,
    })
}

fn flags(values: &[bool]) -> u8 {
    values
        .iter()
        .enumerate()
        .fold(0, |flags, (bit, set)| flags | ((*set as u8) << bit))
}

fn take_flags<const N: usize>(input: &mut &[u8]) -> Result<[bool; N], CommandError> {
    let byte = take_u8(input)?;
    if byte >> N != 0 {
        return Err(malformed("unknown flags"));
    }
    Ok(std::array::from_fn(|bit| byte & (1 << bit) != 0))
}

fn take_flag(input: &mut &[u8]) -> Result<bool, CommandError> {
    let [flag] = take_flags(input)?;
    Ok(flag)
}

fn malformed(reason: &str) -> CommandError {
    CommandError::Malformed {
        reason: reason.to_owned(),
    }
}

fn put_bytes(out: &mut BytesMut, bytes: &[u8]) {
    out.put_u32_le(bytes.len() as u32);
    out.put_slice(bytes);
}

fn take_u8(input: &mut &[u8]) -> Result<u8, CommandError> {
    if input.is_empty() {
        return Err(malformed("truncated"));
    }
    Ok(input.get_u8())
}

fn take_i64(input: &mut &[u8]) -> Result<i64, CommandError> {
    if input.len() < 8 {
        return Err(malformed("truncated"));
    }
    Ok(input.get_i64_le())
}

/// A count of items, each at least one byte: more than the bytes left is
/// malformed (so a forged count never reserves memory).
fn take_count(input: &mut &[u8]) -> Result<usize, CommandError> {
    if input.len() < 4 {
        return Err(malformed("truncated"));
    }
    let count = input.get_u32_le() as usize;
    if count > input.len() {
        return Err(malformed("a count past the record's end"));
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;
    use crate::kv::{Body, Record};

    fn bytes() -> impl Strategy<Value = Bytes> {
        prop::collection::vec(any::<u8>(), 0..6).prop_map(Bytes::from)
    }

    fn put() -> impl Strategy<Value = PutRequest> {
        (bytes(), bytes(), any::<i64>(), any::<[bool; 3]>()).prop_map(
            |(key, value, lease, [prev_kv, ignore_value, ignore_lease])| PutRequest {
                key,
                value,
                lease,
                prev_kv,
                ignore_value,
                ignore_lease,
            },
        )
    }

    fn delete() -> impl Strategy<Value = DeleteRangeRequest> {
        (bytes(), bytes(), any::<bool>()).prop_map(|(key, range_end, prev_kv)| DeleteRangeRequest {
            key,
            range_end,
            prev_kv,
        })
    }

    fn range() -> impl Strategy<Value = RangeRequest> {
        let order = prop_oneof![
            Just(SortOrder::None),
            Just(SortOrder::Ascend),
            Just(SortOrder::Descend)
        ];
        let target = prop_oneof![
            Just(SortTarget::Key),
            Just(SortTarget::Version),
            Just(SortTarget::Create),
            Just(SortTarget::Mod),
            Just(SortTarget::Value)
        ];
        (
            (bytes(), bytes(), any::<i64>(), any::<i64>()),
            (order, target, any::<[bool; 3]>()),
            any::<[i64; 4]>(),
        )
            .prop_map(
                |((key, range_end, limit, revision), (sort_order, sort_target, flags), bounds)| {
                    RangeRequest {
                        key,
                        range_end,
                        limit,
                        revision,
                        sort_order,
                        sort_target,
                        serializable: flags[0],
                        keys_only: flags[1],
                        count_only: flags[2],
                        min_mod_revision: bounds[0],
                        max_mod_revision: bounds[1],
                        min_create_revision: bounds[2],
                        max_create_revision: bounds[3],
                    }
                },
            )
    }

    fn compare() -> impl Strategy<Value = Compare> {
        let result = prop_oneof![
            Just(CompareResult::Equal),
            Just(CompareResult::Greater),
            Just(CompareResult::Less),
            Just(CompareResult::NotEqual)
        ];
        let target = prop_oneof![
            any::<i64>().prop_map(CompareTarget::Version),
            any::<i64>().prop_map(CompareTarget::Create),
            any::<i64>().prop_map(CompareTarget::Mod),
            bytes().prop_map(CompareTarget::Value),
            any::<i64>().prop_map(CompareTarget::Lease),
        ];
        (bytes(), bytes(), result, target).prop_map(|(key, range_end, result, target)| Compare {
            key,
            range_end,
            result,
            target,
        })
    }

    fn txn() -> impl Strategy<Value = TxnRequest> {
        let leaf = prop_oneof![
            range().prop_map(RequestOp::Range),
            put().prop_map(RequestOp::Put),
            delete().prop_map(RequestOp::DeleteRange),
        ];
        let op = leaf.prop_recursive(3, 12, 3, |inner| {
            (
                prop::collection::vec(compare(), 0..3),
                prop::collection::vec(inner.clone(), 0..3),
                prop::collection::vec(inner, 0..3),
            )
                .prop_map(|(compare, success, failure)| {
                    RequestOp::Txn(TxnRequest {
                        compare,
                        success,
                        failure,
                    })
                })
        });
        (
            prop::collection::vec(compare(), 0..3),
            prop::collection::vec(op.clone(), 0..4),
            prop::collection::vec(op, 0..4),
        )
            .prop_map(|(compare, success, failure)| TxnRequest {
                compare,
                success,
                failure,
            })
    }

    fn command() -> impl Strategy<Value = EtcdCommand> {
        prop_oneof![
            put().prop_map(EtcdCommand::Put),
            delete().prop_map(EtcdCommand::DeleteRange),
            txn().prop_map(EtcdCommand::Txn),
            (any::<i64>(), any::<bool>()).prop_map(|(revision, physical)| {
                EtcdCommand::Compact(CompactionRequest { revision, physical })
            }),
            (any::<i64>(), any::<i64>())
                .prop_map(|(id, ttl)| EtcdCommand::LeaseGrant(LeaseGrantRequest { id, ttl })),
            any::<i64>().prop_map(|id| EtcdCommand::LeaseRevoke(LeaseRevokeRequest { id })),
            (any::<bool>(), any::<u64>(), any::<bool>()).prop_map(
                |(activate, member_id, space)| {
                    EtcdCommand::Alarm(AlarmRequest {
                        action: if activate {
                            AlarmAction::Activate
                        } else {
                            AlarmAction::Deactivate
                        },
                        member: AlarmMember {
                            member_id,
                            alarm: if space {
                                AlarmType::NoSpace
                            } else {
                                AlarmType::Corrupt
                            },
                        },
                    })
                }
            ),
        ]
    }

    proptest! {
        #[test]
        fn etcd_records_round_trip(command in command()) {
            let mut body = BytesMut::new();
            put_command(&mut body, &command);
            prop_assert_eq!(encoded_len(&command), body.len());
            let record = command.encode();
            prop_assert_eq!(EtcdCommand::decode(&record).unwrap(), command.clone());
            let decoded = Record::decode(&record).unwrap();
            prop_assert_eq!(decoded.body, Body::Etcd(command));
        }

        #[test]
        fn every_damage_to_an_etcd_record_is_refused(
            command in command(),
            bit in any::<prop::sample::Index>(),
            cut in any::<prop::sample::Index>(),
        ) {
            let record = command.encode();
            let mut flipped = record.to_vec();
            let bit = bit.index(flipped.len() * 8);
            flipped[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(Record::decode(&flipped).is_err());
            prop_assert!(Record::decode(&record[..cut.index(record.len())]).is_err());
        }
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_refused() {
        let mut txn = TxnRequest::default();
        for _ in 0..MAX_TXN_DEPTH {
            txn = TxnRequest {
                success: vec![RequestOp::Txn(txn)],
                ..TxnRequest::default()
            };
        }
        assert_eq!(txn_depth(&txn), MAX_TXN_DEPTH + 1);
        let record = EtcdCommand::Txn(txn.clone()).encode();
        assert!(EtcdCommand::decode(&record).is_err());
        let state = crate::kv::KvState::default();
        let command = EtcdCommand::Txn(txn);
        assert_eq!(
            command.validate(&state, usize::MAX),
            Err(crate::kv::EtcdError::TooManyOps)
        );
        // A stamped etcd request is refused both ways.
        let stamped = Record {
            stamp: Some(crate::kv::Stamp {
                key: crate::kv::IdempotencyKey::new("k").unwrap(),
                at_ms: 0,
                retention: crate::kv::Retention::default(),
            }),
            body: Body::Etcd(EtcdCommand::Compact(CompactionRequest::default())),
        };
        assert_eq!(stamped.encode(), Err(CommandError::StampedEtcd));
    }
}
