//! A standby takes the records its primary applied straight from the
//! primary, instead of waiting for the object stores to serve them.
//!
//! A standby's state (and every watch served there) follows the log. Read
//! from the replicas alone, a record reaches it one store round trip or
//! more after its commit, and a poll interval later once caught up: tens
//! of milliseconds on object stores 10 ms away. The primary holds the same
//! records in memory. So every node serves Chorus's own Follow service
//! (`chorusfollowpb.Follow/Records`, beside etcd's services on the etcd
//! listener): the records it applied, from an index on, then each as it
//! is applied, each with its CRC-32C. A standby calls it on the primary
//! (found as forwarding finds it) and hands what arrives to its runtime
//! ([`Runtime::offer_committed`]).
//!
//! Why that is safe: every record a node applied is committed (a primary
//! applies a record once a quorum of replicas holds it durably; a standby
//! once it read it as committed), and a committed record stays at its
//! index whoever recovers the log next, so even a deposed primary's
//! records are the log's. The runtime applies only the record that is
//! next, holds those ahead, still reads every record from the replicas
//! and stops if one differs from what it applied. The stream only saves
//! time: without it (no primary known, unreachable, an older version) the
//! standby reads the replicas as before.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chorus::ids::RecordIndex;
use chorus::kv::KvState;
use chorus::runtime::{Role, Runtime};
use futures::Stream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::error;
use crate::proto::chorusfollowpb::follow_client::FollowClient;
use crate::proto::chorusfollowpb::follow_server::Follow;
use crate::proto::chorusfollowpb::{Record, RecordsRequest, RecordsResponse};
use crate::server::Shared;

/// Between attempts to follow the primary, and between checks of the role
/// while following.
const RETRY: Duration = Duration::from_millis(250);

/// Between checks of the role while not a standby.
const ROLE_POLL: Duration = Duration::from_millis(20);

/// Most records in one response.
const BATCH_RECORDS: usize = 1024;

/// Most record bytes in one response (exceeded by less than one record).
const BATCH_BYTES: usize = 1 << 20;

/// Largest response a standby accepts: a batch plus one record of the
/// largest size a write may carry, with room to spare.
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// The server side: streams the records this node applied.
#[derive(Debug, Clone)]
pub(crate) struct FollowService {
    shared: Arc<Shared>,
}

impl FollowService {
    pub(crate) fn new(shared: Arc<Shared>) -> FollowService {
        FollowService { shared }
    }
}

/// The stream of one `Records` call.
pub(crate) type RecordsStream =
    std::pin::Pin<Box<dyn Stream<Item = Result<RecordsResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Follow for FollowService {
    type RecordsStream = RecordsStream;

    async fn records(
        &self,
        request: Request<RecordsRequest>,
    ) -> Result<Response<Self::RecordsStream>, Status> {
        let cursor = Cursor {
            runtime: Arc::clone(&self.shared.runtime),
            next: RecordIndex(request.into_inner().from),
            applied: self.shared.runtime.applied(),
            closing: self.shared.closing.subscribe(),
            ended: false,
        };
        Ok(Response::new(Box::pin(futures::stream::unfold(
            cursor,
            Cursor::step,
        ))))
    }
}

/// Where one `Records` stream is.
struct Cursor {
    runtime: Arc<Runtime<KvState>>,
    /// The next index to send.
    next: RecordIndex,
    applied: tokio::sync::watch::Receiver<RecordIndex>,
    /// Turns true when the node shuts down: the stream ends, as watches do.
    closing: tokio::sync::watch::Receiver<bool>,
    ended: bool,
}

impl Cursor {
    /// The next response: the records applied from `next` on (from the
    /// oldest the history holds, if it no longer holds `next`), waiting
    /// until there is one; or the end.
    async fn step(mut self) -> Option<(Result<RecordsResponse, Status>, Cursor)> {
        if self.ended {
            return None;
        }
        loop {
            let batch = self
                .runtime
                .committed_records(self.next, BATCH_RECORDS, BATCH_BYTES);
            if let Some((last, _)) = batch.last() {
                self.next = RecordIndex(last.0 + 1);
                let records = batch
                    .into_iter()
                    .map(|(index, data)| Record {
                        index: index.0,
                        crc32c: crc32c::crc32c(&data),
                        data,
                    })
                    .collect();
                return Some((Ok(RecordsResponse { records }), self));
            }
            let next = self.next;
            let open = tokio::select! {
                applied = self.applied.wait_for(|end| *end > next) => applied.is_ok(),
                () = error::closed(&mut self.closing) => false,
            };
            if !open {
                self.ended = true;
                return Some((Err(error::shutting_down()), self));
            }
        }
    }
}

/// The client side: follows the primary while this node is a standby,
/// until `stop` resolves.
pub(crate) async fn follow_primary(shared: Arc<Shared>, stop: impl Future<Output = ()>) {
    tokio::select! {
        () = stop => {}
        () = follow(&shared) => {}
    }
}

async fn follow(shared: &Shared) {
    loop {
        // A node that just became a standby starts following within a
        // role poll: until it does, its watchers wait for the replicas.
        if !is_standby(shared) {
            tokio::time::sleep(ROLE_POLL).await;
            continue;
        }
        if let Ok(channel) = shared.primary_channel().await
            && let Err(status) = take_from(shared, channel).await
        {
            tracing::debug!(%status, "standby: following the primary's records failed");
            // The next attempt connects afresh, should the primary's
            // endpoint have moved.
            shared.forwarder.forget();
        }
        tokio::time::sleep(RETRY).await;
    }
}

fn is_standby(shared: &Shared) -> bool {
    shared.runtime.status().role == Role::Standby
}

/// Takes the primary's records through `channel` from this node's applied
/// end on, until the stream ends or this node is no longer a standby.
async fn take_from(shared: &Shared, channel: Channel) -> Result<(), Status> {
    let from = *shared.runtime.applied().borrow();
    let mut responses = FollowClient::new(channel)
        .max_decoding_message_size(MAX_RESPONSE_BYTES)
        .records(RecordsRequest { from: from.0 })
        .await?
        .into_inner();
    let mut role_check = tokio::time::interval(RETRY);
    loop {
        tokio::select! {
            response = responses.message() => match response? {
                Some(response) => {
                    shared.runtime.offer_committed(checked(response)?);
                }
                None => return Ok(()),
            },
            _ = role_check.tick() => {
                if !is_standby(shared) {
                    return Ok(());
                }
            }
        }
    }
}

/// The response's records, each with its checksum verified.
fn checked(response: RecordsResponse) -> Result<Vec<(RecordIndex, Bytes)>, Status> {
    response
        .records
        .into_iter()
        .map(|record| {
            let actual = crc32c::crc32c(&record.data);
            if actual == record.crc32c {
                Ok((RecordIndex(record.index), record.data))
            } else {
                Err(Status::data_loss(format!(
                    "chorus: record {} from the primary fails its checksum (crc32c {actual:#010x}, \
                     sent {:#010x})",
                    record.index, record.crc32c
                )))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_failing_its_checksum_is_refused_by_index() {
        let record = |index: u64, data: &'static [u8], crc32c: u32| Record {
            index,
            data: Bytes::from_static(data),
            crc32c,
        };
        let good = crc32c::crc32c(b"put");
        let taken = checked(RecordsResponse {
            records: vec![record(7, b"put", good)],
        })
        .unwrap();
        assert_eq!(taken, [(RecordIndex(7), Bytes::from_static(b"put"))]);
        let refused = checked(RecordsResponse {
            records: vec![record(7, b"put", good), record(8, b"pot", good)],
        })
        .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::DataLoss);
        assert!(refused.message().contains("record 8"), "{refused}");
    }
}
