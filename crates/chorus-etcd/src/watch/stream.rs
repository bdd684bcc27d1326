//! One watch stream: a task that reads the client's requests, and delivers
//! each watch's events from the retained history as the runtime applies
//! records, into the stream's bounded send buffer.
//!
//! Delivery pulls: a watch keeps only the next revision it owes, and the
//! events are read from the history when the buffer has room. A client
//! that stops reading therefore costs its buffer and nothing else; its
//! watches fall behind, and one that falls below the compaction revision is
//! canceled with `compact_revision`, as etcd cancels a watcher that cannot
//! catch up. A buffer that stays full, nothing taken, for the stall timeout
//! closes the stream with `ResourceExhausted`.
//!
//! A watch that is synced (it had every revision when the stream last ran,
//! and the buffer never stopped it since) is not canceled by a compaction
//! that passed it before the stream ran again: those revisions come from
//! the [`feed`](super::feed), as etcd pushes its synced watchers their
//! events at apply.

use std::collections::BTreeMap;
use std::sync::Arc;

use chorus::kv::Revision;
use chorus::kv::mvcc::Change;
use prost::Message;
use tokio::time::Instant;
use tonic::{Status, Streaming};

use super::outbox::Outbox;
use super::watcher::{DUPLICATE_ID, KeyRange, NEGATIVE_START, Watcher};
use super::{MAX_REVISIONS_PER_READ, READ_BATCH_BYTES, WatchShared};
use crate::identity::raft_term;
use crate::proto::etcdserverpb::{self as pb, ResponseHeader, watch_request::RequestUnion};
use crate::proto::mvccpb;

/// The watch id of a response that is no watch's: a refused create, or a
/// progress response for the whole stream (etcd's `InvalidWatchID`).
const STREAM_WIDE_ID: i64 = -1;

/// What one read of the history gave.
struct Read {
    /// The store revision.
    current: Revision,
    /// The compaction revision.
    compacted: Revision,
    /// The oldest revision a synced watch may be owed and still get: below
    /// the compaction revision when the feed held what it dropped.
    synced_floor: Revision,
    /// The retained changes read, by revision, in order.
    revisions: Vec<(Revision, Vec<Change>)>,
    /// The last revision the read covers: the store revision, or the
    /// last one read when the read bounds cut it short.
    covered: Revision,
}

/// The responses of one stream, each with a full header whose revision
/// never goes back.
struct Responses {
    outbox: Outbox,
    cluster_id: u64,
    member_id: u64,
    raft_term: u64,
    /// The highest header revision sent.
    last_header: Revision,
    /// The largest response etcd sends whole to a fragmenting watch.
    max_message_bytes: usize,
}

/// One stream's state; see the module docs.
pub(crate) struct WatchStream {
    shared: Arc<WatchShared>,
    responses: Responses,
    watchers: BTreeMap<i64, Watcher>,
    /// The next id to try for a create without one (etcd starts at 0).
    next_auto_id: i64,
    /// Progress requests not answered yet.
    progress_requests: usize,
    /// The store revision up to which every watch's events were queued
    /// (those behind excepted), as of the last delivery.
    delivered: Revision,
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        self.shared.feed().close_stream();
    }
}

impl WatchStream {
    pub(crate) fn new(shared: Arc<WatchShared>, outbox: Outbox) -> WatchStream {
        shared.feed().open_stream();
        let identity = shared.identity;
        let max_message_bytes = shared.max_message_bytes;
        WatchStream {
            shared,
            responses: Responses {
                outbox,
                cluster_id: identity.cluster_id,
                member_id: identity.member_id,
                raft_term: 0,
                last_header: 0,
                max_message_bytes,
            },
            watchers: BTreeMap::new(),
            next_auto_id: 0,
            progress_requests: 0,
            delivered: 0,
        }
    }

    /// Serves the stream until the client goes away or stalls.
    pub(crate) async fn run(mut self, mut requests: Streaming<pb::WatchRequest>) {
        let mut applied = self.shared.runtime.applied();
        let interval = self.shared.config.progress_interval_with_jitter();
        let mut ticker = tokio::time::interval_at(Instant::now() + interval, interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reading = true;
        let mut closing = self.shared.closing.subscribe();
        // (responses taken, when the stream is closed if none more are)
        let mut stall: Option<(u64, Instant)> = None;
        loop {
            applied.borrow_and_update();
            let behind = self.deliver();
            let full = self.responses.outbox.is_full();
            stall = self.stall_deadline(full, stall);
            let deadline = stall.map(|(_, at)| at);
            tokio::select! {
                biased;
                () = self.responses.outbox.closed() => return,
                () = crate::error::closed(&mut closing) => {
                    self.responses.outbox.fail(crate::error::shutting_down());
                    return;
                }
                () = sleep_until(deadline), if deadline.is_some() => {
                    self.close_stalled();
                    return;
                }
                request = requests.message(), if reading && !full => match request {
                    Ok(Some(request)) => self.handle(request),
                    // A half-closed stream keeps its watches, as etcd's does.
                    Ok(None) => reading = false,
                    Err(_) => return,
                },
                () = self.responses.outbox.drained(), if full => {}
                changed = applied.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = ticker.tick() => self.progress_tick(),
                // More to deliver: go on, letting other tasks run first.
                () = tokio::task::yield_now(), if behind && !full => {}
            }
        }
    }

    /// When the stream is closed for stalling: `stall_timeout` after the
    /// buffer was last seen full with a new count of responses taken.
    fn stall_deadline(&self, full: bool, stall: Option<(u64, Instant)>) -> Option<(u64, Instant)> {
        if !full {
            return None;
        }
        let taken = self.responses.outbox.taken();
        match stall {
            Some((seen, at)) if seen == taken => Some((seen, at)),
            _ => Some((taken, Instant::now() + self.shared.config.stall_timeout)),
        }
    }

    fn close_stalled(&self) {
        let config = &self.shared.config;
        let bytes = self.responses.outbox.bytes();
        tracing::warn!(bytes, "closing a watch stream whose client stopped reading");
        self.responses
            .outbox
            .fail(Status::resource_exhausted(format!(
                "chorus: watch stream closed: the client took none of its {bytes} pending bytes \
             (send buffer {} bytes) within {:?}",
                config.send_buffer_bytes, config.stall_timeout
            )));
    }

    fn handle(&mut self, request: pb::WatchRequest) {
        match request.request_union {
            Some(RequestUnion::CreateRequest(create)) => self.create(create),
            Some(RequestUnion::CancelRequest(cancel)) => self.cancel(cancel.watch_id),
            Some(RequestUnion::ProgressRequest(_)) => {
                self.progress_requests = self.progress_requests.saturating_add(1);
            }
            // etcd ignores a request it does not know.
            None => {}
        }
    }

    fn current_revision(&mut self) -> Revision {
        self.responses.raft_term = raft_term(&self.shared.runtime.status());
        self.shared.runtime.read_stale(|state| state.revision()).0
    }

    fn create(&mut self, request: pb::WatchCreateRequest) {
        let current = self.current_revision();
        let created = self.add_watcher(&request, current);
        let (watch_id, reason) = match created {
            Ok(id) => (id, None),
            Err(reason) => (STREAM_WIDE_ID, Some(reason)),
        };
        self.responses.push(
            current,
            pb::WatchResponse {
                watch_id,
                created: true,
                canceled: reason.is_some(),
                cancel_reason: reason.unwrap_or_default().to_owned(),
                ..Default::default()
            },
        );
    }

    /// Adds the watch `request` asks for, checked as etcd checks it, and
    /// returns its id.
    fn add_watcher(
        &mut self,
        request: &pb::WatchCreateRequest,
        current: Revision,
    ) -> Result<i64, &'static str> {
        if request.start_revision < 0 {
            return Err(NEGATIVE_START);
        }
        let range = KeyRange::new(request.key.clone(), request.range_end.clone())?;
        let id = if request.watch_id == 0 {
            while self.watchers.contains_key(&self.next_auto_id) {
                self.next_auto_id += 1;
            }
            self.next_auto_id += 1;
            self.next_auto_id - 1
        } else if self.watchers.contains_key(&request.watch_id) {
            return Err(DUPLICATE_ID);
        } else {
            request.watch_id
        };
        self.watchers
            .insert(id, Watcher::new(id, range, request, current));
        Ok(id)
    }

    fn cancel(&mut self, watch_id: i64) {
        // etcd answers nothing to a cancel of an unknown id.
        if self.watchers.remove(&watch_id).is_some() {
            let current = self.current_revision();
            self.responses.push(
                current,
                pb::WatchResponse {
                    watch_id,
                    canceled: true,
                    ..Default::default()
                },
            );
        }
    }

    /// Queues every watch's events up to the store revision, revision by
    /// revision, until the buffer is full; then cancels the compacted
    /// watches and answers the progress requests if every watch is synced.
    /// Returns whether a watch is still behind.
    fn deliver(&mut self) -> bool {
        let read = self.read_history();
        self.responses.raft_term = raft_term(&self.shared.runtime.status());
        self.cancel_compacted(&read);
        let mut batches: BTreeMap<i64, Vec<mvccpb::Event>> = BTreeMap::new();
        let mut covered = read.covered;
        for (revision, changes) in &read.revisions {
            if self.responses.outbox.is_full() {
                covered = revision - 1;
                break;
            }
            for watcher in self.watchers.values_mut() {
                if !watcher.behind(*revision) {
                    continue;
                }
                watcher.next = revision + 1;
                // etcd sends a synced watcher a revision as it applies,
                // reading the previous entries then: above the compaction
                // of that time, whatever compacted since.
                let compacted = if watcher.caught_up {
                    read.compacted.min(revision - 1)
                } else {
                    read.compacted
                };
                let events = watcher.events(*revision, changes, compacted);
                if events.is_empty() {
                    continue;
                }
                watcher.progress_due = false;
                if watcher.caught_up {
                    self.responses.events(watcher, *revision, events);
                } else {
                    batches.entry(watcher.id).or_default().extend(events);
                }
            }
        }
        // Revisions without changes (the empty store's first) owe nothing.
        for watcher in self.watchers.values_mut() {
            if watcher.behind(covered) {
                watcher.next = covered + 1;
            }
        }
        for (id, events) in batches {
            if let Some(watcher) = self.watchers.get(&id) {
                // As etcd's catching-up watchers: the store revision.
                self.responses.events(watcher, read.current, events);
            }
        }
        // A synced watch stays synced through a read cut short by its
        // bounds, but not once the buffer stopped it (etcd's watcher whose
        // send queue filled).
        let stopped = covered < read.covered;
        for watcher in self.watchers.values_mut() {
            watcher.caught_up = !watcher.behind(read.current) || (watcher.caught_up && !stopped);
        }
        self.delivered = read.current;
        self.answer_progress_requests();
        self.watchers.values().any(|w| w.behind(read.current))
    }

    /// The store and compaction revisions, and the changes from the
    /// earliest revision a watch owes, up to the read bounds: those a
    /// synced watch owes below the compaction revision from the feed.
    fn read_history(&self) -> Read {
        let owing = self.watchers.values().filter(|w| !w.compacted);
        let from = owing.clone().map(|w| w.next).min();
        let synced_from = owing.filter(|w| w.caught_up).map(|w| w.next).min();
        self.shared
            .runtime
            .read_stale(|state| {
                let history = state.history();
                let current = history.revision();
                let compacted = history.compact_revision();
                let feed = self.shared.feed();
                let fed = synced_from
                    .filter(|&from| from < compacted)
                    .and_then(|from| Some((from, feed.changes(from, compacted - 1)?)));
                let (synced_floor, fed) = match fed {
                    Some((from, changes)) => (from, Some(changes)),
                    None => (compacted, None),
                };
                let mut revisions = Vec::new();
                let mut bytes = 0;
                let mut covered = current;
                let from = from.unwrap_or(current + 1).max(compacted);
                let retained = history.changes(from, current);
                for (revision, changes) in fed.into_iter().flatten().chain(retained) {
                    if revisions.len() >= MAX_REVISIONS_PER_READ || bytes >= READ_BATCH_BYTES {
                        covered = revision - 1;
                        break;
                    }
                    bytes += changes.iter().map(change_bytes).sum::<usize>();
                    revisions.push((revision, changes.to_vec()));
                }
                Read {
                    current,
                    compacted,
                    synced_floor,
                    revisions,
                    covered,
                }
            })
            .0
    }

    /// Cancels, with `compact_revision`, each watch whose next revision was
    /// compacted away (and, for a synced watch, is not in the feed either).
    fn cancel_compacted(&mut self, read: &Read) {
        for watcher in self.watchers.values_mut() {
            let floor = if watcher.caught_up {
                read.synced_floor
            } else {
                read.compacted
            };
            if watcher.compacted || watcher.next >= floor {
                continue;
            }
            watcher.compacted = true;
            self.responses.push(
                read.current,
                pb::WatchResponse {
                    watch_id: watcher.id,
                    canceled: true,
                    compact_revision: read.compacted,
                    ..Default::default()
                },
            );
        }
    }

    /// Answers the progress requests once every watch has every event up
    /// to the revision delivered (etcd 3.5's fix of issue 15220), one
    /// stream-wide response per request.
    fn answer_progress_requests(&mut self) {
        if self.progress_requests == 0 {
            return;
        }
        let delivered = self.delivered;
        let active = self.watchers.values().filter(|w| !w.compacted);
        if !active.clone().all(|w| w.synced(delivered)) {
            return;
        }
        while self.progress_requests > 0 && !self.responses.outbox.is_full() {
            self.progress_requests -= 1;
            self.responses.push(
                delivered,
                pb::WatchResponse {
                    watch_id: STREAM_WIDE_ID,
                    ..Default::default()
                },
            );
        }
    }

    /// etcd's progress ticker: a progress notification to each watch that
    /// asked for them, is synced, and had no events since the last tick.
    fn progress_tick(&mut self) {
        let delivered = self.delivered;
        for watcher in self.watchers.values_mut() {
            if !watcher.progress_notify {
                continue;
            }
            if watcher.progress_due && watcher.synced(delivered) {
                self.responses.push(
                    delivered,
                    pb::WatchResponse {
                        watch_id: watcher.id,
                        ..Default::default()
                    },
                );
            }
            watcher.progress_due = true;
        }
    }
}

/// What reading a change costs: its key and both values.
fn change_bytes(change: &Change) -> usize {
    let value = |entry: &Option<chorus::kv::Entry>| entry.as_ref().map_or(0, |e| e.value.len());
    change.key.len() + value(&change.before) + value(&change.after)
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

impl Responses {
    fn header(&mut self, revision: Revision) -> ResponseHeader {
        self.last_header = self.last_header.max(revision);
        ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision: self.last_header,
            raft_term: self.raft_term,
        }
    }

    fn push(&mut self, revision: Revision, mut response: pb::WatchResponse) {
        response.header = Some(self.header(revision));
        self.outbox.push(response);
    }

    /// Queues `events` of `watcher` at header revision `revision`, split
    /// as etcd splits them when the watch asked for fragments.
    fn events(&mut self, watcher: &Watcher, revision: Revision, events: Vec<mvccpb::Event>) {
        let response = pb::WatchResponse {
            header: Some(self.header(revision)),
            watch_id: watcher.id,
            events,
            ..Default::default()
        };
        if !watcher.fragment
            || response.events.len() < 2
            || response.encoded_len() < self.max_message_bytes
        {
            self.outbox.push(response);
            return;
        }
        for fragment in fragments(response, self.max_message_bytes) {
            self.outbox.push(fragment);
        }
    }
}

/// etcd's `sendFragments`: as many events per response as keep it below
/// `max_bytes` (at least one), `fragment` set on all but the last.
fn fragments(response: pb::WatchResponse, max_bytes: usize) -> Vec<pb::WatchResponse> {
    let template = pb::WatchResponse {
        events: Vec::new(),
        fragment: true,
        ..response.clone()
    };
    let base = template.encoded_len();
    let mut fragments = Vec::new();
    let mut current = template.clone();
    let mut size = base;
    for event in response.events {
        // An event's share: its tag, its length prefix and its bytes.
        let share = prost::encoding::message::encoded_len(11, &event);
        if !current.events.is_empty() && size + share >= max_bytes {
            fragments.push(std::mem::replace(&mut current, template.clone()));
            size = base;
        }
        size += share;
        current.events.push(event);
    }
    current.fragment = false;
    fragments.push(current);
    fragments
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use bytes::Bytes;
    use chorus::kv::etcd::{CompactionRequest, PutRequest};
    use chorus::kv::{EtcdCommand, KvState};
    use chorus::runtime::Runtime;
    use futures::FutureExt;
    use tonic::codegen::tokio_stream::StreamExt;

    use super::super::memory_runtime;
    use super::super::outbox::ResponseStream;
    use super::super::{WatchConfig, WatchService};
    use super::*;
    use crate::identity::Identity;

    async fn apply(runtime: &Runtime<KvState>, command: EtcdCommand) {
        let record = command.encode();
        runtime
            .write(|_| Ok::<_, Infallible>(record))
            .await
            .expect("the record applies");
    }

    async fn put_to(runtime: &Runtime<KvState>, revision: Revision) {
        while runtime.read_stale(|state| state.revision()).0 < revision {
            let put = PutRequest {
                key: Bytes::from_static(b"k"),
                value: Bytes::from_static(b"v"),
                ..PutRequest::default()
            };
            apply(runtime, EtcdCommand::Put(put)).await;
        }
    }

    async fn compact(runtime: &Runtime<KvState>, revision: Revision) {
        let request = CompactionRequest {
            revision,
            physical: false,
        };
        apply(runtime, EtcdCommand::Compact(request)).await;
    }

    fn create(watch_id: i64, start_revision: Revision) -> pb::WatchRequest {
        pb::WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(pb::WatchCreateRequest {
                key: Bytes::from_static(b"k"),
                watch_id,
                start_revision,
                prev_kv: true,
                ..Default::default()
            })),
        }
    }

    /// A response as (watch id, header revision, event revisions with
    /// whether each has its previous entry, compact revision).
    type Summary = (i64, Revision, Vec<(Revision, bool)>, Revision);

    /// Every response queued so far.
    fn queued(responses: &mut ResponseStream) -> Vec<Summary> {
        let mut queued = Vec::new();
        while let Some(Some(response)) = responses.next().now_or_never() {
            let response = response.expect("a response");
            let events = response.events.iter().map(|event| {
                let kv = event.kv.as_ref().expect("an event's entry");
                (kv.mod_revision, event.prev_kv.is_some())
            });
            queued.push((
                response.watch_id,
                response.header.expect("a header").revision,
                events.collect(),
                response.compact_revision,
            ));
        }
        queued
    }

    /// The stream's task is not run here: the test delivers by hand, as the
    /// task would when the scheduler finally runs it.
    #[tokio::test]
    async fn a_compaction_that_passed_a_synced_watch_before_its_stream_ran_cancels_it_only_past_the_feed()
     {
        let runtime = memory_runtime::primary("watch-feed", |store| store).await;
        let identity = Identity::new("watch-feed", "http://test:1");
        let service = WatchService::new(
            Arc::clone(&runtime),
            identity,
            WatchConfig::default(),
            usize::MAX,
        );
        let (outbox, mut responses) = Outbox::new(1 << 20, Arc::default());
        let mut stream = WatchStream::new(Arc::clone(&service.shared), outbox);
        put_to(&runtime, 2).await;
        // Watch 1 is synced; watch 2 starts at revision 1 and has not run.
        stream.handle(create(1, 0));
        stream.handle(create(2, 1));
        assert_eq!(queued(&mut responses).len(), 2, "two created");

        put_to(&runtime, 6).await;
        compact(&runtime, 5).await;
        stream.deliver();
        // One response per revision, with the previous entries as etcd read
        // them when it sent each revision, before the compaction. (Headers
        // never go back within a stream: the cancel went first, at 6.)
        let one_per_revision = (3..=6).map(|revision| (1, 6, vec![(revision, true)], 0));
        let mut expected = vec![(2, 6, vec![], 5)];
        expected.extend(one_per_revision);
        assert_eq!(queued(&mut responses), expected);

        // Past the feed's bound, watch 1 falls behind as etcd's would.
        put_to(&runtime, 7 + super::super::feed::FEED_REVISIONS as Revision).await;
        compact(&runtime, 7 + super::super::feed::FEED_REVISIONS as Revision).await;
        stream.deliver();
        let current = 7 + super::super::feed::FEED_REVISIONS as Revision;
        assert_eq!(queued(&mut responses), [(1, current, vec![], current)]);
    }

    fn event(value_bytes: usize) -> mvccpb::Event {
        mvccpb::Event {
            kv: Some(mvccpb::KeyValue {
                key: Bytes::from_static(b"k"),
                value: Bytes::from(vec![b'v'; value_bytes]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn fragments_stay_below_the_limit_and_only_the_last_is_final() {
        let response = pb::WatchResponse {
            watch_id: 3,
            events: (0..10).map(|_| event(100)).collect(),
            ..Default::default()
        };
        let parts = fragments(response.clone(), 350);
        assert_eq!(parts.len(), 4);
        for part in &parts[..3] {
            assert!(part.fragment && part.encoded_len() < 350 && part.watch_id == 3);
        }
        assert!(!parts[3].fragment);
        let events: Vec<_> = parts.into_iter().flat_map(|p| p.events).collect();
        assert_eq!(events, response.events);
        // One event larger than the limit still goes, alone.
        let parts = fragments(
            pb::WatchResponse {
                events: vec![event(1000), event(1)],
                ..Default::default()
            },
            350,
        );
        assert_eq!(
            parts.iter().map(|p| p.events.len()).collect::<Vec<_>>(),
            [1, 1]
        );
    }
}
