//! etcd's Watch service on the runtime: one bidirectional stream carries
//! any number of watches, each answered as etcd answers it.
//!
//! - Create: a key, a prefix (`range_end`) or every key from a key
//!   (`"\0"`); `start_revision` anywhere in the retained history (0: from
//!   the next revision); `prev_kv`; the NOPUT and NODELETE filters;
//!   `progress_notify`; `fragment`; a client-chosen `watch_id`, or etcd's
//!   automatic ids (0, 1, ... skipping ids in use). A refused create is
//!   answered `created` and `canceled` with watch id -1 and etcd's reason
//!   (a duplicate id, an empty range, a negative start revision).
//! - Cancel: answered `canceled`; a cancel of an unknown id, nothing.
//! - Progress request: one response with watch id -1 at the store
//!   revision, sent only once every watch of the stream has every event up
//!   to it (and reached its start revision).
//! - A watch whose next revision is compacted away (at create or while
//!   falling behind) is canceled with `compact_revision`.
//!
//! Events come from the state machine's retained history
//! ([`chorus::kv::mvcc::History::changes`]) through
//! [`Runtime::read_stale`], woken by [`Runtime::applied`]: a standby serves
//! watches from the records it applied, like the primary. A watch that had
//! every event when its stream last ran takes the revisions a compaction
//! dropped since from the [`feed`](self::feed), as etcd's synced watchers
//! have theirs pushed at apply. The events of
//! one revision are never split across responses (unless the watch asked
//! for fragments), and header revisions never go back within a stream.
//!
//! When the node shuts down every stream ends `Unavailable`
//! ([`WatchService::close_streams`]); clients resume elsewhere.
//!
//! Memory: each stream has a send buffer of
//! [`WatchConfig::send_buffer_bytes`]; see [`stream`](self) for what
//! happens when a client stops reading.

mod feed;
mod outbox;
mod stream;
mod watcher;

#[cfg(test)]
#[path = "../../../chorus/tests/support/memory_runtime.rs"]
mod memory_runtime;

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chorus::kv::KvState;
use chorus::runtime::Runtime;
use tonic::codegen::tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::identity::Identity;
use crate::proto::etcdserverpb as pb;

pub use watcher::{DUPLICATE_ID, EMPTY_RANGE, NEGATIVE_START};

/// etcd's default interval between progress notifications (its
/// `--experimental-watch-progress-notify-interval`): 10 minutes.
pub const DEFAULT_PROGRESS_NOTIFY_INTERVAL: Duration = Duration::from_secs(600);
/// The shortest interval etcd accepts; a shorter one is raised to it.
pub const MIN_PROGRESS_NOTIFY_INTERVAL: Duration = Duration::from_millis(100);
/// The default send buffer of one stream: responses made but not yet
/// taken by the client's connection, in encoded bytes.
pub const DEFAULT_SEND_BUFFER_BYTES: usize = 4 << 20;
/// How long a stream's buffer may stay full with nothing taken before the
/// stream is closed.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Most revisions read from the history at once (etcd's
/// `watchBatchMaxRevs`): bounds how long one read holds the state.
pub const MAX_REVISIONS_PER_READ: usize = 1000;
/// Read no more revisions at once once this many bytes of keys and values
/// were read: bounds one read's copy (a revision is never split).
pub const READ_BATCH_BYTES: usize = 1 << 20;

/// How the Watch service behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchConfig {
    /// Between progress notifications to a watch that asked for them
    /// (plus up to a tenth of it at random per stream, as etcd adds).
    /// Raised to [`MIN_PROGRESS_NOTIFY_INTERVAL`].
    pub progress_notify_interval: Duration,
    /// A stream makes no more responses while this many bytes are
    /// waiting to be sent (it may exceed it by one revision's responses).
    pub send_buffer_bytes: usize,
    /// A stream whose buffer stays full this long with nothing taken is
    /// closed with `ResourceExhausted`.
    pub stall_timeout: Duration,
}

impl Default for WatchConfig {
    fn default() -> WatchConfig {
        WatchConfig {
            progress_notify_interval: DEFAULT_PROGRESS_NOTIFY_INTERVAL,
            send_buffer_bytes: DEFAULT_SEND_BUFFER_BYTES,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
        }
    }
}

impl WatchConfig {
    /// One stream's progress interval: the configured one (at least the
    /// minimum) plus up to a tenth at random, so streams opened together
    /// do not notify together.
    fn progress_interval_with_jitter(&self) -> Duration {
        let interval = self
            .progress_notify_interval
            .max(MIN_PROGRESS_NOTIFY_INTERVAL);
        let tenth = (interval.as_nanos() / 10).max(1);
        let random = u128::from(RandomState::new().hash_one(0u8));
        interval + Duration::from_nanos((random % tenth) as u64)
    }
}

/// What every stream of the service shares.
#[derive(Debug)]
pub(crate) struct WatchShared {
    pub(crate) runtime: Arc<Runtime<KvState>>,
    pub(crate) identity: Identity,
    pub(crate) config: WatchConfig,
    /// A fragmenting watch's response of this many encoded bytes or more
    /// is split (etcd's `--max-request-bytes` plus its gRPC overhead).
    pub(crate) max_message_bytes: usize,
    /// Bytes waiting in every stream's send buffer.
    pub(crate) pending_bytes: Arc<AtomicUsize>,
    /// Turns true when the node shuts down: every stream ends.
    pub(crate) closing: tokio::sync::watch::Sender<bool>,
    /// The newest revisions' changes, taken as they apply.
    feed: Arc<Mutex<feed::AppliedFeed>>,
}

impl WatchShared {
    /// The feed; taken under the runtime's state lock, never the other
    /// way round (the runtime takes it under its lock after each record).
    pub(crate) fn feed(&self) -> MutexGuard<'_, feed::AppliedFeed> {
        lock(&self.feed)
    }
}

fn lock(feed: &Mutex<feed::AppliedFeed>) -> MutexGuard<'_, feed::AppliedFeed> {
    feed.lock().expect("watch feed lock poisoned")
}

/// etcd's Watch service; see the module docs.
#[derive(Debug, Clone)]
pub struct WatchService {
    shared: Arc<WatchShared>,
}

/// The response stream of one Watch call.
pub type WatchResponses = Pin<Box<dyn Stream<Item = Result<pb::WatchResponse, Status>> + Send>>;

impl WatchService {
    /// The service of `runtime`'s state, answering with `identity`'s ids;
    /// a fragmenting watch's responses of `max_message_bytes` or more are
    /// split ([`EtcdConfig::max_message_bytes`](crate::EtcdConfig::max_message_bytes)).
    pub fn new(
        runtime: Arc<Runtime<KvState>>,
        identity: Identity,
        config: WatchConfig,
        max_message_bytes: usize,
    ) -> WatchService {
        let feed = Arc::<Mutex<feed::AppliedFeed>>::default();
        let taker = Arc::downgrade(&feed);
        runtime.observe_applied(move |state| match taker.upgrade() {
            Some(feed) => {
                lock(&feed).take(state.history());
                true
            }
            None => false,
        });
        WatchService {
            shared: Arc::new(WatchShared {
                runtime,
                identity,
                config,
                max_message_bytes,
                pending_bytes: Arc::default(),
                closing: tokio::sync::watch::Sender::new(false),
                feed,
            }),
        }
    }

    /// Ends every stream, open or opened later, with `Unavailable` (see
    /// [`SHUTTING_DOWN`](crate::error::SHUTTING_DOWN)), so a node that shuts down is not held up
    /// by watches that would never end and their clients resume on
    /// another node from their last revision + 1.
    pub fn close_streams(&self) {
        self.shared.closing.send_replace(true);
    }

    /// Bytes waiting in the send buffers of every open stream.
    pub fn pending_bytes(&self) -> usize {
        self.shared.pending_bytes.load(Ordering::Acquire)
    }
}

#[tonic::async_trait]
impl pb::watch_server::Watch for WatchService {
    type WatchStream = WatchResponses;

    async fn watch(
        &self,
        request: Request<Streaming<pb::WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let shared = Arc::clone(&self.shared);
        let (outbox, responses) = outbox::Outbox::new(
            shared.config.send_buffer_bytes,
            Arc::clone(&shared.pending_bytes),
        );
        let stream = stream::WatchStream::new(shared, outbox);
        tokio::spawn(stream.run(request.into_inner()));
        Ok(Response::new(Box::pin(responses)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_interval_is_raised_to_etcds_minimum_and_jittered_by_a_tenth() {
        let config = WatchConfig {
            progress_notify_interval: Duration::from_millis(1),
            ..WatchConfig::default()
        };
        let interval = config.progress_interval_with_jitter();
        assert!(interval >= MIN_PROGRESS_NOTIFY_INTERVAL);
        assert!(interval < MIN_PROGRESS_NOTIFY_INTERVAL * 11 / 10);
        let default = WatchConfig::default().progress_interval_with_jitter();
        assert!(default >= Duration::from_secs(600) && default < Duration::from_secs(660));
    }
}
