//! etcd's protobuf messages to and from the state machine's plain requests
//! and answers ([`chorus::kv::etcd`]), one field at a time.
//!
//! Requests convert fallibly: an enum value etcd does not define is refused
//! as etcd refuses it (an unknown sort option, an empty transaction
//! operation) or, where etcd has no message of its own, with one naming the
//! field. Answers convert infallibly; the caller fills in the top-level
//! header's identity fields (see [`crate::identity`]), while the answers
//! nested in a transaction carry only their revision, as etcd's do.

use chorus::kv::etcd;
use tonic::Status;

use crate::proto::etcdserverpb as pb;
use crate::proto::mvccpb;

/// etcd's refusal of a sort order or target it does not define.
pub const INVALID_SORT_OPTION: &str = "etcdserver: invalid sort option";

/// A request field etcd's messages allow but the request cannot mean.
fn invalid(message: impl Into<String>) -> Status {
    Status::invalid_argument(message)
}

/// etcd's `RangeRequest`.
pub fn range_request(request: pb::RangeRequest) -> Result<etcd::RangeRequest, Status> {
    use pb::range_request::{SortOrder, SortTarget};
    let sort_order = match SortOrder::try_from(request.sort_order) {
        Ok(SortOrder::None) => etcd::SortOrder::None,
        Ok(SortOrder::Ascend) => etcd::SortOrder::Ascend,
        Ok(SortOrder::Descend) => etcd::SortOrder::Descend,
        Err(_) => return Err(invalid(INVALID_SORT_OPTION)),
    };
    let sort_target = match SortTarget::try_from(request.sort_target) {
        Ok(SortTarget::Key) => etcd::SortTarget::Key,
        Ok(SortTarget::Version) => etcd::SortTarget::Version,
        Ok(SortTarget::Create) => etcd::SortTarget::Create,
        Ok(SortTarget::Mod) => etcd::SortTarget::Mod,
        Ok(SortTarget::Value) => etcd::SortTarget::Value,
        Err(_) => return Err(invalid(INVALID_SORT_OPTION)),
    };
    Ok(etcd::RangeRequest {
        key: request.key,
        range_end: request.range_end,
        limit: request.limit,
        revision: request.revision,
        sort_order,
        sort_target,
        serializable: request.serializable,
        keys_only: request.keys_only,
        count_only: request.count_only,
        min_mod_revision: request.min_mod_revision,
        max_mod_revision: request.max_mod_revision,
        min_create_revision: request.min_create_revision,
        max_create_revision: request.max_create_revision,
    })
}

/// etcd's `PutRequest`.
pub fn put_request(request: pb::PutRequest) -> etcd::PutRequest {
    etcd::PutRequest {
        key: request.key,
        value: request.value,
        lease: request.lease,
        prev_kv: request.prev_kv,
        ignore_value: request.ignore_value,
        ignore_lease: request.ignore_lease,
    }
}

/// etcd's `DeleteRangeRequest`.
pub fn delete_range_request(request: pb::DeleteRangeRequest) -> etcd::DeleteRangeRequest {
    etcd::DeleteRangeRequest {
        key: request.key,
        range_end: request.range_end,
        prev_kv: request.prev_kv,
    }
}

/// etcd's `CompactionRequest`.
pub fn compaction_request(request: pb::CompactionRequest) -> etcd::CompactionRequest {
    etcd::CompactionRequest {
        revision: request.revision,
        physical: request.physical,
    }
}

/// etcd's `TxnRequest`, nested transactions included.
pub fn txn_request(request: pb::TxnRequest) -> Result<etcd::TxnRequest, Status> {
    Ok(etcd::TxnRequest {
        compare: request
            .compare
            .into_iter()
            .map(compare)
            .collect::<Result<_, _>>()?,
        success: request_ops(request.success)?,
        failure: request_ops(request.failure)?,
    })
}

fn request_ops(ops: Vec<pb::RequestOp>) -> Result<Vec<etcd::RequestOp>, Status> {
    ops.into_iter().map(request_op).collect()
}

/// One operation of a branch. An operation with no request is refused with
/// etcd's "key not found", as etcd's request check does.
fn request_op(op: pb::RequestOp) -> Result<etcd::RequestOp, Status> {
    use pb::request_op::Request;
    Ok(match op.request {
        Some(Request::RequestRange(range)) => etcd::RequestOp::Range(range_request(range)?),
        Some(Request::RequestPut(put)) => etcd::RequestOp::Put(put_request(put)),
        Some(Request::RequestDeleteRange(delete)) => {
            etcd::RequestOp::DeleteRange(delete_range_request(delete))
        }
        Some(Request::RequestTxn(txn)) => etcd::RequestOp::Txn(txn_request(txn)?),
        None => return Err(invalid(etcd::EtcdError::KeyNotFound.to_string())),
    })
}

/// One compare. Its value is read from the union member its target names;
/// a union holding another member (or none) reads as zero or empty, as
/// etcd's generated getters do.
fn compare(compare: pb::Compare) -> Result<etcd::Compare, Status> {
    use pb::compare::{CompareResult, CompareTarget, TargetUnion};
    let result = match CompareResult::try_from(compare.result) {
        Ok(CompareResult::Equal) => etcd::CompareResult::Equal,
        Ok(CompareResult::Greater) => etcd::CompareResult::Greater,
        Ok(CompareResult::Less) => etcd::CompareResult::Less,
        Ok(CompareResult::NotEqual) => etcd::CompareResult::NotEqual,
        Err(_) => {
            return Err(invalid(format!(
                "unknown compare result: {}",
                compare.result
            )));
        }
    };
    let union = compare.target_union;
    let number =
        |wanted: fn(&TargetUnion) -> Option<i64>| union.as_ref().and_then(wanted).unwrap_or(0);
    let target = match CompareTarget::try_from(compare.target) {
        Ok(CompareTarget::Version) => etcd::CompareTarget::Version(number(|u| match u {
            TargetUnion::Version(v) => Some(*v),
            _ => None,
        })),
        Ok(CompareTarget::Create) => etcd::CompareTarget::Create(number(|u| match u {
            TargetUnion::CreateRevision(v) => Some(*v),
            _ => None,
        })),
        Ok(CompareTarget::Mod) => etcd::CompareTarget::Mod(number(|u| match u {
            TargetUnion::ModRevision(v) => Some(*v),
            _ => None,
        })),
        Ok(CompareTarget::Lease) => etcd::CompareTarget::Lease(number(|u| match u {
            TargetUnion::Lease(v) => Some(*v),
            _ => None,
        })),
        Ok(CompareTarget::Value) => etcd::CompareTarget::Value(match union {
            Some(TargetUnion::Value(value)) => value,
            _ => Default::default(),
        }),
        Err(_) => {
            return Err(invalid(format!(
                "unknown compare target: {}",
                compare.target
            )));
        }
    };
    Ok(etcd::Compare {
        key: compare.key,
        range_end: compare.range_end,
        result,
        target,
    })
}

/// A header carrying only a revision: the top-level one gets its identity
/// fields from the service, nested ones keep only this.
pub fn revision_header(revision: etcd::Revision) -> Option<pb::ResponseHeader> {
    Some(pb::ResponseHeader {
        revision,
        ..Default::default()
    })
}

/// etcd's `mvccpb.KeyValue`.
pub fn key_value(kv: etcd::KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: kv.key,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: kv.value,
        lease: kv.lease,
    }
}

/// etcd's `RangeResponse`.
pub fn range_response(response: etcd::RangeResponse) -> pb::RangeResponse {
    pb::RangeResponse {
        header: revision_header(response.header_revision),
        kvs: response.kvs.into_iter().map(key_value).collect(),
        more: response.more,
        count: response.count,
    }
}

/// etcd's `PutResponse`.
pub fn put_response(response: etcd::PutResponse) -> pb::PutResponse {
    pb::PutResponse {
        header: revision_header(response.header_revision),
        prev_kv: response.prev_kv.map(key_value),
    }
}

/// etcd's `DeleteRangeResponse`.
pub fn delete_range_response(response: etcd::DeleteRangeResponse) -> pb::DeleteRangeResponse {
    pb::DeleteRangeResponse {
        header: revision_header(response.header_revision),
        deleted: response.deleted,
        prev_kvs: response.prev_kvs.into_iter().map(key_value).collect(),
    }
}

/// etcd's `TxnResponse`, nested answers included.
pub fn txn_response(response: etcd::TxnResponse) -> pb::TxnResponse {
    pb::TxnResponse {
        header: revision_header(response.header_revision),
        succeeded: response.succeeded,
        responses: response.responses.into_iter().map(response_op).collect(),
    }
}

fn response_op(op: etcd::ResponseOp) -> pb::ResponseOp {
    use pb::response_op::Response;
    let response = match op {
        etcd::ResponseOp::Range(range) => Response::ResponseRange(range_response(range)),
        etcd::ResponseOp::Put(put) => Response::ResponsePut(put_response(put)),
        etcd::ResponseOp::DeleteRange(delete) => {
            Response::ResponseDeleteRange(delete_range_response(delete))
        }
        etcd::ResponseOp::Txn(txn) => Response::ResponseTxn(txn_response(txn)),
    };
    pb::ResponseOp {
        response: Some(response),
    }
}

/// etcd's `CompactionResponse`.
pub fn compaction_response(response: etcd::CompactionResponse) -> pb::CompactionResponse {
    pb::CompactionResponse {
        header: revision_header(response.header_revision),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use pb::compare::{CompareResult, CompareTarget, TargetUnion};
    use tonic::Code;

    use super::*;

    fn put_op(key: &str) -> pb::RequestOp {
        pb::RequestOp {
            request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                key: Bytes::copy_from_slice(key.as_bytes()),
                ..Default::default()
            })),
        }
    }

    #[test]
    fn an_unknown_sort_option_is_refused_as_etcd_refuses_it() {
        for (order, target) in [(3, 0), (0, 5), (-1, 0)] {
            let request = pb::RangeRequest {
                key: Bytes::from_static(b"k"),
                sort_order: order,
                sort_target: target,
                ..Default::default()
            };
            let status = range_request(request).unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument);
            assert_eq!(status.message(), INVALID_SORT_OPTION);
        }
    }

    #[test]
    fn every_range_field_is_carried_over() {
        let request = pb::RangeRequest {
            key: Bytes::from_static(b"a"),
            range_end: Bytes::from_static(b"z"),
            limit: 3,
            revision: 9,
            sort_order: 2,
            sort_target: 3,
            serializable: true,
            keys_only: true,
            count_only: true,
            min_mod_revision: 1,
            max_mod_revision: 2,
            min_create_revision: 4,
            max_create_revision: 5,
        };
        let converted = range_request(request).unwrap();
        assert_eq!(
            converted,
            etcd::RangeRequest {
                key: Bytes::from_static(b"a"),
                range_end: Bytes::from_static(b"z"),
                limit: 3,
                revision: 9,
                sort_order: etcd::SortOrder::Descend,
                sort_target: etcd::SortTarget::Mod,
                serializable: true,
                keys_only: true,
                count_only: true,
                min_mod_revision: 1,
                max_mod_revision: 2,
                min_create_revision: 4,
                max_create_revision: 5,
            }
        );
    }

    #[test]
    fn a_compare_reads_the_union_member_its_target_names() {
        let compare_with = |target: CompareTarget, union: Option<TargetUnion>| pb::Compare {
            result: CompareResult::Greater as i32,
            target: target as i32,
            key: Bytes::from_static(b"k"),
            range_end: Bytes::new(),
            target_union: union,
        };
        let txn = pb::TxnRequest {
            compare: vec![
                compare_with(CompareTarget::Mod, Some(TargetUnion::ModRevision(7))),
                // A mismatched member reads as zero, like etcd's getters.
                compare_with(CompareTarget::Version, Some(TargetUnion::Lease(5))),
                compare_with(CompareTarget::Value, None),
            ],
            success: vec![put_op("k")],
            failure: vec![],
        };
        let converted = txn_request(txn).unwrap();
        let targets: Vec<_> = converted.compare.iter().map(|c| c.target.clone()).collect();
        assert_eq!(
            targets,
            [
                etcd::CompareTarget::Mod(7),
                etcd::CompareTarget::Version(0),
                etcd::CompareTarget::Value(Bytes::new()),
            ]
        );
        assert!(
            converted
                .compare
                .iter()
                .all(|c| c.result == etcd::CompareResult::Greater)
        );
    }

    #[test]
    fn an_empty_operation_is_refused_with_etcds_key_not_found() {
        let txn = pb::TxnRequest {
            compare: vec![],
            success: vec![put_op("a"), pb::RequestOp { request: None }],
            failure: vec![],
        };
        let status = txn_request(txn).unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "etcdserver: key not found");
    }

    #[test]
    fn nested_answers_carry_only_their_revision() {
        let response = etcd::TxnResponse {
            header_revision: 5,
            succeeded: true,
            responses: vec![etcd::ResponseOp::Put(etcd::PutResponse {
                header_revision: 5,
                prev_kv: Some(etcd::KeyValue {
                    key: Bytes::from_static(b"k"),
                    value: Bytes::from_static(b"v"),
                    create_revision: 2,
                    mod_revision: 3,
                    version: 2,
                    lease: 0,
                }),
            })],
        };
        let converted = txn_response(response);
        let Some(pb::response_op::Response::ResponsePut(put)) = &converted.responses[0].response
        else {
            panic!("a put answer: {converted:?}");
        };
        assert_eq!(put.header, revision_header(5));
        let prev = put.prev_kv.as_ref().unwrap();
        assert_eq!(
            (prev.create_revision, prev.mod_revision, prev.version),
            (2, 3, 2)
        );
        assert_eq!(prev.value, Bytes::from_static(b"v"));
    }
}
