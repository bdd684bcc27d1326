//! etcd's KV service on the runtime.
//!
//! - Range: a linearizable read on the primary (`Unavailable` elsewhere), or
//!   with `serializable` the state as applied on this node, whatever its role.
//! - Put, DeleteRange, Txn, Compact: one log record each, appended only once
//!   the request passes etcd's checks against the applied state, and
//!   answered with what applying it answered.
//! - A Txn whose branches hold only ranges is a read: answered from the
//!   state without a record, linearizable unless every range in it is
//!   serializable, as etcd does.
//! - RangeStream (etcd 3.7) answers `Unimplemented`; clients fall back on
//!   Range.

use std::sync::Arc;

use chorus::kv::etcd::{EtcdCommand, EtcdError, EtcdResponse, RequestOp, TxnRequest};
use prost::Message;
use tonic::{Request, Response, Status};

use crate::convert;
use crate::error;
use crate::forward::forward_if_standby;
use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::kv_client::KvClient;
use crate::server::{Shared, mismatched};
use crate::unserved::{NoStream, not_served};

/// etcd's KV service; see the module docs.
#[derive(Debug)]
pub struct KvService {
    shared: Arc<Shared>,
}

impl KvService {
    pub(crate) fn new(shared: Arc<Shared>) -> KvService {
        KvService { shared }
    }

    /// Refuses a write request larger than the configured limit, as etcd
    /// refuses a proposal larger than `--max-request-bytes`.
    fn check_size(&self, message: &impl Message) -> Result<(), Status> {
        if message.encoded_len() > self.shared.config.max_request_bytes {
            return Err(error::refused(&EtcdError::RequestTooLarge));
        }
        Ok(())
    }

    /// Appends `command` once it passes etcd's checks, and answers what
    /// applying it answered.
    async fn write(&self, command: EtcdCommand) -> Result<EtcdResponse, Status> {
        self.shared.write(command).await
    }

    /// A read-only transaction, evaluated on the state without a record.
    fn read_txn(&self, txn: TxnRequest) -> Result<pb::TxnResponse, Status> {
        let max_txn_ops = self.shared.config.max_txn_ops;
        let serializable = every_range_serializable(&txn);
        let command = EtcdCommand::Txn(txn);
        let answer = self.shared.read(serializable, |state| {
            command.validate(state, max_txn_ops)?;
            let EtcdCommand::Txn(txn) = &command else {
                unreachable!("built as a transaction")
            };
            state.read_txn(txn)
        })?;
        let response = answer.map_err(|refusal| error::refused(&refusal))?;
        Ok(convert::txn_response(response))
    }

    /// Whether a transaction is a read this node answers itself: read-only,
    /// every range in it serializable (a standby forwards the rest).
    fn serializable_read(&self, txn: &pb::TxnRequest) -> bool {
        let ops = txn.success.iter().chain(&txn.failure);
        ops.clone().all(|op| {
            matches!(&op.request, Some(pb::request_op::Request::RequestRange(range)) if range.serializable)
        })
    }

    /// `response` with its header filled in.
    fn answer<T>(
        &self,
        response: T,
        header: impl FnOnce(&mut T) -> &mut Option<pb::ResponseHeader>,
    ) -> Response<T> {
        self.shared.answer(response, header)
    }
}

/// Whether every operation of both branches is a range: etcd's test for a
/// transaction it serves as a read (a nested transaction, even one that only
/// reads, makes it a proposal there, so a record here).
fn is_read_only(txn: &TxnRequest) -> bool {
    txn.success
        .iter()
        .chain(&txn.failure)
        .all(|op| matches!(op, RequestOp::Range(_)))
}

/// Whether every range of a read-only transaction asks for a serializable
/// read (then no part of it needs the primary).
fn every_range_serializable(txn: &TxnRequest) -> bool {
    txn.success
        .iter()
        .chain(&txn.failure)
        .all(|op| matches!(op, RequestOp::Range(range) if range.serializable))
}

#[tonic::async_trait]
impl pb::kv_server::Kv for KvService {
    type RangeStreamStream = NoStream<pb::RangeStreamResponse>;

    async fn range(
        &self,
        request: Request<pb::RangeRequest>,
    ) -> Result<Response<pb::RangeResponse>, Status> {
        if !request.get_ref().serializable {
            forward_if_standby!(self.shared, request, KvClient, range);
        }
        let request = convert::range_request(request.into_inner())?;
        let answer = self
            .shared
            .read(request.serializable, |state| state.range(&request))?;
        let response = answer.map_err(|refusal| error::refused(&refusal))?;
        Ok(self.answer(convert::range_response(response), |r| &mut r.header))
    }

    async fn range_stream(
        &self,
        _: Request<pb::RangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        Err(not_served("etcdserverpb.KV/RangeStream"))
    }

    async fn put(
        &self,
        request: Request<pb::PutRequest>,
    ) -> Result<Response<pb::PutResponse>, Status> {
        forward_if_standby!(self.shared, request, KvClient, put);
        let request = request.into_inner();
        self.check_size(&request)?;
        let command = EtcdCommand::Put(convert::put_request(request));
        match self.write(command).await? {
            EtcdResponse::Put(put) => {
                Ok(self.answer(convert::put_response(put), |r| &mut r.header))
            }
            other => Err(mismatched(&other)),
        }
    }

    async fn delete_range(
        &self,
        request: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        forward_if_standby!(self.shared, request, KvClient, delete_range);
        let request = request.into_inner();
        self.check_size(&request)?;
        let command = EtcdCommand::DeleteRange(convert::delete_range_request(request));
        match self.write(command).await? {
            EtcdResponse::DeleteRange(delete) => {
                Ok(self.answer(convert::delete_range_response(delete), |r| &mut r.header))
            }
            other => Err(mismatched(&other)),
        }
    }

    async fn txn(
        &self,
        request: Request<pb::TxnRequest>,
    ) -> Result<Response<pb::TxnResponse>, Status> {
        if !self.serializable_read(request.get_ref()) {
            forward_if_standby!(self.shared, request, KvClient, txn);
        }
        let request = request.into_inner();
        let size_check = self.check_size(&request);
        let txn = convert::txn_request(request)?;
        if is_read_only(&txn) {
            // etcd checks the size of proposals only; a read is not one.
            return Ok(self.answer(self.read_txn(txn)?, |r| &mut r.header));
        }
        size_check?;
        match self.write(EtcdCommand::Txn(txn)).await? {
            EtcdResponse::Txn(txn) => {
                Ok(self.answer(convert::txn_response(txn), |r| &mut r.header))
            }
            other => Err(mismatched(&other)),
        }
    }

    async fn compact(
        &self,
        request: Request<pb::CompactionRequest>,
    ) -> Result<Response<pb::CompactionResponse>, Status> {
        forward_if_standby!(self.shared, request, KvClient, compact);
        let request = request.into_inner();
        self.check_size(&request)?;
        let command = EtcdCommand::Compact(convert::compaction_request(request));
        match self.write(command).await? {
            EtcdResponse::Compact(compact) => {
                Ok(self.answer(convert::compaction_response(compact), |r| &mut r.header))
            }
            other => Err(mismatched(&other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use chorus::kv::etcd::{PutRequest, RangeRequest};

    use super::*;

    fn range(serializable: bool) -> RequestOp {
        RequestOp::Range(RangeRequest {
            key: Bytes::from_static(b"k"),
            serializable,
            ..Default::default()
        })
    }

    fn put() -> RequestOp {
        RequestOp::Put(PutRequest {
            key: Bytes::from_static(b"k"),
            ..Default::default()
        })
    }

    fn txn(success: Vec<RequestOp>, failure: Vec<RequestOp>) -> TxnRequest {
        TxnRequest {
            compare: Vec::new(),
            success,
            failure,
        }
    }

    #[test]
    fn a_transaction_is_read_only_when_both_branches_only_range() {
        assert!(is_read_only(&txn(vec![range(false)], vec![range(true)])));
        assert!(is_read_only(&txn(vec![], vec![])));
        assert!(!is_read_only(&txn(vec![range(false)], vec![put()])));
        // As in etcd, a nested transaction is proposed even if it only reads.
        let nested_read = RequestOp::Txn(txn(vec![range(true)], vec![]));
        assert!(!is_read_only(&txn(vec![nested_read], vec![])));
    }

    #[test]
    fn a_read_only_transaction_is_serializable_only_when_every_range_is() {
        assert!(every_range_serializable(&txn(
            vec![range(true)],
            vec![range(true)]
        )));
        assert!(!every_range_serializable(&txn(
            vec![range(true)],
            vec![range(false)]
        )));
        assert!(every_range_serializable(&txn(vec![], vec![])));
    }
}
