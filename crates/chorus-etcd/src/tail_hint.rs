//! A standby hears of new writes from the primary at once instead of at its
//! next poll of the log.
//!
//! A standby's state (and so every watch served there) follows the log by
//! polling the replicas, every 100 ms once caught up: a watcher on a
//! standby saw an event up to that long after its commit. Here the standby
//! watches every key on the primary's etcd endpoint (found as forwarding
//! finds it) and, at each response carrying events, tells its runtime the
//! log grew ([`Runtime::hint_log_grew`](chorus::runtime::Runtime::hint_log_grew)),
//! which reads it at once.
//!
//! Only a hint: the standby still reads and applies the records from the
//! replicas, and nothing of the primary's answer is applied, so a lost,
//! late or wrong hint costs latency, never correctness. Without a primary
//! to watch (none known, unreachable, another role) the standby polls as
//! before. The price is one more watcher on the primary per standby, whose
//! events carry the values.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chorus::runtime::Role;
use futures::StreamExt;
use tonic::transport::Channel;

use crate::proto::etcdserverpb::watch_client::WatchClient;
use crate::proto::etcdserverpb::watch_request::RequestUnion;
use crate::proto::etcdserverpb::{WatchCreateRequest, WatchRequest};
use crate::server::Shared;

/// Between attempts to watch the primary, and between checks of the role
/// while not a standby.
const RETRY: Duration = Duration::from_millis(250);

/// Follows the primary while this node is a standby, until `stop`
/// resolves.
pub(crate) async fn follow_primary(shared: Arc<Shared>, stop: impl Future<Output = ()>) {
    tokio::select! {
        () = stop => {}
        () = follow(&shared) => {}
    }
}

async fn follow(shared: &Shared) {
    loop {
        if is_standby(shared)
            && let Ok(channel) = shared.primary_channel().await
            && let Err(status) = hint_from(shared, channel).await
        {
            tracing::debug!(%status, "standby: watching the primary for new writes failed");
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

/// Watches every key on the primary through `channel` and hints the
/// runtime at each response with events, until the stream ends or this
/// node is no longer a standby.
async fn hint_from(shared: &Shared, channel: Channel) -> Result<(), tonic::Status> {
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            // From "\0" with range end "\0": every key.
            key: Bytes::from_static(b"\0"),
            range_end: Bytes::from_static(b"\0"),
            ..WatchCreateRequest::default()
        })),
    };
    // The request side stays open: a closed one ends the stream.
    let requests = futures::stream::iter([create]).chain(futures::stream::pending());
    let mut responses = WatchClient::new(channel)
        .watch(requests)
        .await?
        .into_inner();
    let mut role_check = tokio::time::interval(RETRY);
    loop {
        tokio::select! {
            response = responses.message() => match response? {
                Some(response) if response.canceled => return Ok(()),
                Some(response) => {
                    if !response.events.is_empty() {
                        shared.runtime.hint_log_grew();
                    }
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
