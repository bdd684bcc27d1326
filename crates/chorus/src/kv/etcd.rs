//! etcd v3's key-value requests and answers, as plain data.
//!
//! These mirror the fields of etcd's `KV` service (`RangeRequest`,
//! `PutRequest`, `DeleteRangeRequest`, `TxnRequest`, `CompactionRequest` and
//! their responses) without any protobuf or gRPC type, so the state machine
//! stays independent of the transport. The gRPC service converts between
//! etcd's messages and these one field at a time.
//!
//! Revisions are `i64` as in etcd's API: the store revision starts at 1 on an
//! empty store and rises by exactly 1 per transaction that changes something.
//! A `range_end` follows etcd's conventions: empty means the single key
//! `key`; `"\0"` means every key `>= key`; otherwise the half-open range
//! `[key, range_end)`.

use bytes::Bytes;

/// A store revision (etcd's `int64`).
pub type Revision = i64;

/// One key's current (or historical) value and metadata, as etcd's
/// `mvccpb.KeyValue`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyValue {
    /// The key.
    pub key: Bytes,
    /// The value (empty in a `keys_only` answer).
    pub value: Bytes,
    /// The revision of the transaction that created the key (since its last delete).
    pub create_revision: Revision,
    /// The revision of the transaction that last changed the key.
    pub mod_revision: Revision,
    /// 1 on creation, +1 per put; a delete resets it (the key is gone).
    pub version: i64,
    /// The etcd lease the key is attached to, 0 for none.
    pub lease: i64,
}

/// How a range answer is ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortOrder {
    /// Key order (etcd's default).
    #[default]
    None,
    /// Ascending by the sort target.
    Ascend,
    /// Descending by the sort target.
    Descend,
}

/// What a range answer is sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortTarget {
    /// The key.
    #[default]
    Key,
    /// The key's version.
    Version,
    /// The key's create revision.
    Create,
    /// The key's mod revision.
    Mod,
    /// The value's bytes.
    Value,
}

/// etcd's `RangeRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RangeRequest {
    /// The first key (or the only one, with an empty `range_end`).
    pub key: Bytes,
    /// The end of the range; see the module docs.
    pub range_end: Bytes,
    /// The most keys answered, 0 for no limit.
    pub limit: i64,
    /// The revision to read at, 0 or less for the current one.
    pub revision: Revision,
    /// The order of the answer.
    pub sort_order: SortOrder,
    /// What the answer is sorted by.
    pub sort_target: SortTarget,
    /// A serializable (possibly stale) read rather than a linearizable one.
    pub serializable: bool,
    /// Answer keys without values.
    pub keys_only: bool,
    /// Answer only the count.
    pub count_only: bool,
    /// Keys with a lower mod revision are left out (0: no bound).
    pub min_mod_revision: Revision,
    /// Keys with a higher mod revision are left out (0: no bound).
    pub max_mod_revision: Revision,
    /// Keys with a lower create revision are left out (0: no bound).
    pub min_create_revision: Revision,
    /// Keys with a higher create revision are left out (0: no bound).
    pub max_create_revision: Revision,
}

/// etcd's `RangeResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RangeResponse {
    /// The store revision the answer was read at (the header's revision).
    pub header_revision: Revision,
    /// The keys, at most `limit` of them.
    pub kvs: Vec<KeyValue>,
    /// Whether more keys match than were answered.
    pub more: bool,
    /// How many keys match.
    pub count: i64,
}

/// etcd's `PutRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PutRequest {
    /// The key.
    pub key: Bytes,
    /// The value.
    pub value: Bytes,
    /// The etcd lease to attach, 0 for none.
    pub lease: i64,
    /// Answer the key's previous value.
    pub prev_kv: bool,
    /// Keep the current value (the key must exist).
    pub ignore_value: bool,
    /// Keep the current lease (the key must exist).
    pub ignore_lease: bool,
}

/// etcd's `PutResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PutResponse {
    /// The store revision after the put.
    pub header_revision: Revision,
    /// The previous value, if asked for and the key existed.
    pub prev_kv: Option<KeyValue>,
}

/// etcd's `DeleteRangeRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeleteRangeRequest {
    /// The first key (or the only one, with an empty `range_end`).
    pub key: Bytes,
    /// The end of the range; see the module docs.
    pub range_end: Bytes,
    /// Answer the deleted keys' values.
    pub prev_kv: bool,
}

/// etcd's `DeleteRangeResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeleteRangeResponse {
    /// The store revision after the delete.
    pub header_revision: Revision,
    /// How many keys were deleted.
    pub deleted: i64,
    /// The deleted keys, if asked for.
    pub prev_kvs: Vec<KeyValue>,
}

/// One operation of a transaction branch (etcd's `RequestOp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestOp {
    /// A read.
    Range(RangeRequest),
    /// A put.
    Put(PutRequest),
    /// A delete.
    DeleteRange(DeleteRangeRequest),
    /// A nested transaction.
    Txn(TxnRequest),
}

/// The answer to one [`RequestOp`] (etcd's `ResponseOp`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseOp {
    /// A read's answer.
    Range(RangeResponse),
    /// A put's answer.
    Put(PutResponse),
    /// A delete's answer.
    DeleteRange(DeleteRangeResponse),
    /// A nested transaction's answer.
    Txn(TxnResponse),
}

/// How a compare relates the key's field to the given value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareResult {
    /// `field == value`.
    Equal,
    /// `field > value`.
    Greater,
    /// `field < value`.
    Less,
    /// `field != value`.
    NotEqual,
}

/// The field a compare reads and the value it is compared with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompareTarget {
    /// The key's version (0: absent).
    Version(i64),
    /// The key's create revision (0: absent).
    Create(Revision),
    /// The key's mod revision (0: absent).
    Mod(Revision),
    /// The key's value (an absent key fails every value compare).
    Value(Bytes),
    /// The key's lease (0: none or absent).
    Lease(i64),
}

/// etcd's `Compare`: holds if it holds for every key in the range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    /// The first key (or the only one, with an empty `range_end`).
    pub key: Bytes,
    /// The end of the range; see the module docs.
    pub range_end: Bytes,
    /// The relation.
    pub result: CompareResult,
    /// The field and the value.
    pub target: CompareTarget,
}

/// etcd's `TxnRequest`: if every compare holds, `success` runs, else `failure`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TxnRequest {
    /// The conditions, all evaluated against the state before the transaction.
    pub compare: Vec<Compare>,
    /// The operations run when every compare holds, in order.
    pub success: Vec<RequestOp>,
    /// The operations run otherwise, in order.
    pub failure: Vec<RequestOp>,
}

/// etcd's `TxnResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TxnResponse {
    /// The store revision after the transaction.
    pub header_revision: Revision,
    /// Whether every compare held.
    pub succeeded: bool,
    /// One answer per operation of the branch that ran.
    pub responses: Vec<ResponseOp>,
}

/// etcd's `CompactionRequest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompactionRequest {
    /// History below this revision is dropped.
    pub revision: Revision,
    /// Answer only once the compaction is physically done (always so here).
    pub physical: bool,
}

/// etcd's `CompactionResponse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompactionResponse {
    /// The store revision when the compaction applied.
    pub header_revision: Revision,
}

/// etcd's `LeaseGrantRequest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseGrantRequest {
    /// The lease id to create, 0 to let the server choose.
    pub id: i64,
    /// The TTL asked for, in seconds.
    pub ttl: i64,
}

/// etcd's `LeaseGrantResponse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseGrantResponse {
    /// The store revision when the grant applied.
    pub header_revision: Revision,
    /// The lease's id (the server's choice if the request named none).
    pub id: i64,
    /// The granted TTL in seconds (raised to the minimum).
    pub ttl: i64,
}

/// etcd's `LeaseRevokeRequest`: the lease ends and its keys are deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseRevokeRequest {
    /// The lease to revoke.
    pub id: i64,
}

/// etcd's `LeaseRevokeResponse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseRevokeResponse {
    /// The store revision after the revoke (the one its deletes were
    /// written at, or the unchanged one if no key was attached).
    pub header_revision: Revision,
    /// How many keys were attached, and deleted with it (not part of
    /// etcd's answer; it tells whether the revoke changed the store).
    pub deleted: i64,
}

/// etcd's alarm kinds (`etcdserverpb.AlarmType`, but for `NONE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AlarmType {
    /// The store is out of space: writes that add data are refused until
    /// it is deactivated.
    NoSpace,
    /// A member found its data corrupt (never raised by Chorus itself).
    Corrupt,
}

/// An alarm raised for one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AlarmMember {
    /// The member the alarm is raised for.
    pub member_id: u64,
    /// Which alarm.
    pub alarm: AlarmType,
}

/// What an alarm record does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlarmAction {
    /// Raises the alarm (a no-op if raised).
    Activate,
    /// Clears the alarm (a no-op if not raised).
    Deactivate,
}

/// etcd's `AlarmRequest` that changes the alarms (a `GET` reads the state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlarmRequest {
    /// Raise or clear.
    pub action: AlarmAction,
    /// The member and the alarm.
    pub member: AlarmMember,
}

/// etcd's `AlarmResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AlarmResponse {
    /// The store revision when the alarm record applied.
    pub header_revision: Revision,
    /// The alarm raised or cleared; empty if nothing changed on a clear.
    pub alarms: Vec<AlarmMember>,
}

/// One etcd write request as a log record carries it: each applies as one
/// transaction, at most one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdCommand {
    /// A put.
    Put(PutRequest),
    /// A delete of a key or a range.
    DeleteRange(DeleteRangeRequest),
    /// A transaction.
    Txn(TxnRequest),
    /// A compaction of the history.
    Compact(CompactionRequest),
    /// A lease's creation.
    LeaseGrant(LeaseGrantRequest),
    /// A lease's end, by a client or by expiry: its keys are deleted.
    LeaseRevoke(LeaseRevokeRequest),
    /// An alarm raised or cleared.
    Alarm(AlarmRequest),
}

/// The answer to an applied [`EtcdCommand`], one variant per request kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdResponse {
    /// A put's answer.
    Put(PutResponse),
    /// A delete's answer.
    DeleteRange(DeleteRangeResponse),
    /// A transaction's answer.
    Txn(TxnResponse),
    /// A compaction's answer.
    Compact(CompactionResponse),
    /// A lease grant's answer.
    LeaseGrant(LeaseGrantResponse),
    /// A lease revoke's answer.
    LeaseRevoke(LeaseRevokeResponse),
    /// An alarm record's answer.
    Alarm(AlarmResponse),
}

/// The gRPC status class of an [`EtcdError`], as etcd answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdErrorCode {
    /// `InvalidArgument`.
    InvalidArgument,
    /// `OutOfRange`.
    OutOfRange,
    /// `NotFound`.
    NotFound,
    /// `FailedPrecondition`.
    FailedPrecondition,
    /// `ResourceExhausted`.
    ResourceExhausted,
}

/// A request etcd refuses, with etcd's own message (clients match on it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EtcdError {
    /// A read or compaction below the compaction revision.
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted,
    /// A read or compaction above the current revision.
    #[error("etcdserver: mvcc: required revision is a future revision")]
    FutureRevision,
    /// An empty key.
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    /// Two writes to one key in one transaction (nested ones included).
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    /// More operations in a transaction branch than allowed.
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    /// `ignore_value` or `ignore_lease` on a key that does not exist.
    #[error("etcdserver: key not found")]
    KeyNotFound,
    /// `ignore_value` with a non-empty value.
    #[error("etcdserver: value is provided")]
    ValueProvided,
    /// `ignore_lease` with a non-zero lease.
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    /// A put naming a lease that does not exist.
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    /// A request larger than the configured limit.
    #[error("etcdserver: request is too large")]
    RequestTooLarge,
    /// A grant naming a lease id that exists.
    #[error("etcdserver: lease already exists")]
    LeaseExists,
    /// A grant asking for more than the longest TTL.
    #[error("etcdserver: too large lease TTL")]
    LeaseTtlTooLarge,
    /// A write beyond the machine's budget (etcd's space quota error).
    #[error("etcdserver: mvcc: database space exceeded")]
    NoSpace,
}

impl EtcdError {
    /// The gRPC status class etcd answers this refusal with.
    pub fn code(&self) -> EtcdErrorCode {
        match self {
            EtcdError::Compacted | EtcdError::FutureRevision | EtcdError::LeaseTtlTooLarge => {
                EtcdErrorCode::OutOfRange
            }
            EtcdError::EmptyKey
            | EtcdError::DuplicateKey
            | EtcdError::TooManyOps
            | EtcdError::KeyNotFound
            | EtcdError::ValueProvided
            | EtcdError::LeaseProvided
            | EtcdError::RequestTooLarge => EtcdErrorCode::InvalidArgument,
            EtcdError::LeaseNotFound => EtcdErrorCode::NotFound,
            EtcdError::LeaseExists => EtcdErrorCode::FailedPrecondition,
            EtcdError::NoSpace => EtcdErrorCode::ResourceExhausted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_carry_etcds_status_class() {
        let cases = [
            (EtcdError::Compacted, EtcdErrorCode::OutOfRange),
            (EtcdError::FutureRevision, EtcdErrorCode::OutOfRange),
            (EtcdError::EmptyKey, EtcdErrorCode::InvalidArgument),
            (EtcdError::DuplicateKey, EtcdErrorCode::InvalidArgument),
            (EtcdError::TooManyOps, EtcdErrorCode::InvalidArgument),
            (EtcdError::KeyNotFound, EtcdErrorCode::InvalidArgument),
            (EtcdError::ValueProvided, EtcdErrorCode::InvalidArgument),
            (EtcdError::LeaseProvided, EtcdErrorCode::InvalidArgument),
            (EtcdError::LeaseNotFound, EtcdErrorCode::NotFound),
            (EtcdError::RequestTooLarge, EtcdErrorCode::InvalidArgument),
            (EtcdError::LeaseExists, EtcdErrorCode::FailedPrecondition),
            (EtcdError::LeaseTtlTooLarge, EtcdErrorCode::OutOfRange),
            (EtcdError::NoSpace, EtcdErrorCode::ResourceExhausted),
        ];
        for (error, code) in cases {
            assert_eq!(error.code(), code, "{error}");
        }
    }
}
