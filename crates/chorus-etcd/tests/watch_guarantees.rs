//! etcd's watch guarantees (ordered, unique, atomic, reliable, resumable,
//! bookmarkable, exact prev_kv) checked on recorded streams against the
//! committed history, under a random workload with compactions and a
//! takeover: one writer, several watchers that cancel and resume from their
//! last revision + 1, some pausing long enough for a compaction to pass
//! them. Half the watchers start on the primary, half on the standby;
//! halfway through the writes the primary shuts down, the standby takes
//! over, and the primary's watchers reconnect with their last revision + 1,
//! one to the new primary and one to a new standby.
//!
//! The seed is printed; set `CHORUS_WATCH_SEED` to replay one.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use etcd_client::{Client, DeleteOptions, EventType, Txn, TxnOp, WatchOptions, WatchStream};
use support::Served;
use support::memory_runtime::{MemoryStores, PATIENCE, wait_for_takeover, wait_until};
use tokio::sync::watch;

/// Writes of one run.
const WRITES: usize = 300;
/// Keys k0..k7.
const KEYS: u64 = 8;
/// Concurrent watchers.
const WATCHERS: u64 = 4;
/// How long a watcher waits for a response before looking whether the
/// writes ended.
const IDLE_READ: Duration = Duration::from_millis(200);

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound
    }
}

/// A key's entry in the model: value, create, mod revision, version.
type Entry = (String, i64, i64, i64);

/// One committed event: key, the entry after (`None`: deleted), before.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Committed {
    key: String,
    after: Option<Entry>,
    before: Option<Entry>,
}

/// The committed history as the writer saw it applied.
#[derive(Debug, Default)]
struct Model {
    revision: i64,
    entries: BTreeMap<String, Entry>,
    events: BTreeMap<i64, Vec<Committed>>,
    /// Every compaction revision, in order.
    compactions: Vec<i64>,
}

impl Model {
    /// Applies one transaction's puts and deletes (already in etcd's order).
    fn apply(&mut self, writes: Vec<(String, Option<String>)>) {
        let revision = self.revision + 1;
        let mut changed = Vec::new();
        for (key, value) in writes {
            let before = self.entries.get(&key).cloned();
            let after = match value {
                Some(value) => {
                    let (create, version) =
                        before.as_ref().map_or((revision, 1), |b| (b.1, b.3 + 1));
                    Some((value, create, revision, version))
                }
                None if before.is_none() => continue,
                None => None,
            };
            match &after {
                Some(entry) => self.entries.insert(key.clone(), entry.clone()),
                None => self.entries.remove(&key),
            };
            changed.push(Committed { key, after, before });
        }
        if !changed.is_empty() {
            self.revision = revision;
            self.events.insert(revision, changed);
        }
    }
}

fn key(index: u64) -> String {
    format!("k{index}")
}

/// The writer: its random choices, the model of what it committed, and
/// where it publishes the model's revision.
struct Writer {
    rng: Rng,
    model: Model,
    published: watch::Sender<i64>,
}

impl Writer {
    fn new(seed: u64, published: watch::Sender<i64>) -> Writer {
        Writer {
            rng: Rng(seed | 1),
            model: Model {
                revision: 1,
                ..Model::default()
            },
            published,
        }
    }

    /// Runs `writes` writes through `client`, publishing the model's
    /// revision after each.
    async fn write(&mut self, client: &mut Client, writes: usize) {
        for _ in 0..writes {
            self.write_one(client).await;
            self.published.send_replace(self.model.revision);
        }
    }

    /// One random write (or compaction), applied to the model once
    /// acknowledged.
    async fn write_one(&mut self, client: &mut Client) {
        let (rng, model) = (&mut self.rng, &mut self.model);
        // Let the watchers start in between (the first ones in the past).
        tokio::task::yield_now().await;
        let roll = rng.below(100);
        let revision = if roll < 45 {
            let (k, v) = (key(rng.below(KEYS)), format!("v{}", rng.below(1000)));
            let answer = client.put(k.clone(), v.clone(), None).await.unwrap();
            model.apply(vec![(k, Some(v))]);
            answer.header().unwrap().revision()
        } else if roll < 60 {
            let k = key(rng.below(KEYS));
            let answer = client.delete(k.clone(), None).await.unwrap();
            model.apply(vec![(k, None)]);
            answer.header().unwrap().revision()
        } else if roll < 70 {
            // Delete [k3, k6).
            let options = DeleteOptions::new().with_range("k6");
            let answer = client.delete("k3", Some(options)).await.unwrap();
            model.apply((3..6).map(|i| (key(i), None)).collect());
            answer.header().unwrap().revision()
        } else if roll < 90 {
            let first = rng.below(KEYS - 2);
            let writes: Vec<(String, Option<String>)> = (first..first + 2 + rng.below(2))
                .map(|i| (key(i), Some(format!("t{}", rng.below(1000)))))
                .collect();
            let ops: Vec<TxnOp> = writes
                .iter()
                .map(|(k, v)| TxnOp::put(k.clone(), v.clone().unwrap(), None))
                .collect();
            let answer = client.txn(Txn::new().and_then(ops)).await.unwrap();
            model.apply(writes);
            answer.header().unwrap().revision()
        } else {
            let floor = model.compactions.last().copied().unwrap_or(0) + 1;
            if floor <= model.revision {
                let at = floor + rng.below((model.revision - floor + 1) as u64) as i64;
                client.compact(at, None).await.unwrap();
                model.compactions.push(at);
            }
            model.revision
        };
        assert_eq!(revision, model.revision, "the store and the model agree");
    }
}

/// One session of a watcher: one watch, from its create to its cancel, its
/// compaction, or the watcher leaving the node.
#[derive(Debug)]
struct Session {
    /// The start revision asked for.
    start: i64,
    /// Whether the session opened a new stream (on another node), so its
    /// headers start afresh: etcd's monotonic headers are per stream.
    new_stream: bool,
    responses: Vec<etcd_client::WatchResponse>,
}

/// What one watcher recorded: every session and every response read.
#[derive(Debug, Default)]
struct Record {
    sessions: Vec<Session>,
}

/// Why a session ended.
enum SessionEnd {
    /// Canceled by the watcher itself: resume on the same stream.
    Canceled,
    /// Canceled by a compaction at this revision: resume from it.
    Compacted(i64),
    /// The watcher was told to move to another node (its stream may have
    /// failed first): resume there on a new stream.
    Moved,
}

/// A client of the etcd API at `endpoint`.
async fn connect(endpoint: &str) -> Client {
    Client::connect([endpoint], None)
        .await
        .expect("etcd-client connects")
}

/// One watcher: a range, sessions that end by its own cancel, by a
/// compaction or by a move to another node (the endpoint `node` names),
/// each resumed from the last revision seen + 1.
async fn watcher(
    seed: u64,
    range: (String, String),
    mut node: watch::Receiver<String>,
    mut written: watch::Receiver<i64>,
    done: watch::Receiver<bool>,
) -> Record {
    let mut rng = Rng(seed | 1);
    let mut record = Record::default();
    let options = |start: i64| {
        WatchOptions::new()
            .with_range(range.1.clone())
            .with_prev_key()
            .with_start_revision(start)
    };
    let endpoint = node.borrow_and_update().clone();
    let mut client = connect(&endpoint).await;
    let mut start = 1 + rng.below(*written.borrow_and_update() as u64) as i64;
    let mut stream: WatchStream = client
        .watch(range.0.clone(), Some(options(start)))
        .await
        .unwrap();
    let mut new_stream = true;
    let mut idle_reads = 0;
    loop {
        let mut responses = Vec::new();
        let mut bookmark = start - 1;
        let mut final_progress_asked = false;
        let mut session_id = None;
        let ended = loop {
            if node.has_changed().unwrap() {
                break SessionEnd::Moved;
            }
            // A request to a node that stopped may fail: the read says so.
            if *done.borrow() && !final_progress_asked {
                let _ = stream.request_progress().await;
                final_progress_asked = true;
            }
            if rng.below(10) == 0 {
                let _ = stream.request_progress().await;
            }
            // Short waits, so the end of the writes and a move are noticed.
            let message = match tokio::time::timeout(IDLE_READ, stream.message()).await {
                Ok(Ok(Some(message))) => message,
                Ok(_) => {
                    // The stream failed or ended with its node: wait to be
                    // told where to go.
                    tokio::time::timeout(PATIENCE, node.changed())
                        .await
                        .expect("a lost watcher is moved")
                        .unwrap();
                    break SessionEnd::Moved;
                }
                Err(_) => {
                    idle_reads += 1;
                    assert!(
                        IDLE_READ * idle_reads < PATIENCE * 5,
                        "the watcher got stuck"
                    );
                    continue;
                }
            };
            let watch_id = message.watch_id();
            if message.created() && session_id.is_none() {
                session_id = Some(watch_id);
            }
            if watch_id == -1 && session_id.is_none() {
                // A progress answer from before this session's create was
                // read (for the stream as it was then): not this watch's.
                continue;
            }
            if watch_id != -1 && Some(watch_id) != session_id {
                // A late answer to an earlier session's cancel.
                continue;
            }
            let progress = message.events().is_empty() && !message.created() && !message.canceled();
            if let Some(last) = message.events().last() {
                bookmark = last.kv().unwrap().mod_revision();
            }
            if progress {
                bookmark = bookmark.max(message.header().unwrap().revision());
            }
            let compacted = message.compact_revision();
            let canceled = message.canceled();
            responses.push(message);
            if compacted != 0 {
                break SessionEnd::Compacted(compacted);
            }
            if canceled {
                break SessionEnd::Canceled;
            }
            if final_progress_asked && progress && watch_id == -1 {
                let model_end = *written.borrow();
                if bookmark >= model_end {
                    record.sessions.push(Session {
                        start,
                        new_stream,
                        responses,
                    });
                    return record;
                }
                final_progress_asked = false;
            }
            if !final_progress_asked && rng.below(40) == 0 {
                // Cancel, then read up to the cancel's answer.
                let id = session_id.expect("the create is answered first");
                let _ = stream.cancel(id).await;
            }
        };
        record.sessions.push(Session {
            start,
            new_stream,
            responses: std::mem::take(&mut responses),
        });
        new_stream = false;
        if rng.below(3) == 0 {
            // Long enough for a compaction to pass the bookmark, maybe.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        start = match ended {
            SessionEnd::Compacted(revision) => revision,
            SessionEnd::Canceled | SessionEnd::Moved => bookmark + 1,
        };
        if let SessionEnd::Moved = ended {
            let endpoint = node.borrow_and_update().clone();
            client = connect(&endpoint).await;
            stream = client
                .watch(range.0.clone(), Some(options(start)))
                .await
                .unwrap();
            new_stream = true;
        } else {
            stream
                .watch(range.0.clone(), Some(options(start)))
                .await
                .unwrap();
        }
    }
}

/// Checks one watcher's record against the model; returns the violations.
fn check(record: &Record, model: &Model, range: &(String, String)) -> Vec<String> {
    let mut violations = Vec::new();
    let in_range = |k: &str| k >= range.0.as_str() && k < range.1.as_str();
    let max_compaction = model.compactions.iter().copied().max().unwrap_or(0);
    let mut last_header = 0;
    let mut previous_end = None::<i64>;
    for (index, session) in record.sessions.iter().enumerate() {
        let (start, responses) = (&session.start, &session.responses);
        let mut v = |text: String| violations.push(format!("session {index} from {start}: {text}"));
        if session.new_stream {
            last_header = 0;
        }
        // Resumable: a session starts right after the previous one's last
        // revision (or at the compaction that canceled it).
        if let Some(end) = previous_end
            && *start > end + 1
            && !model.compactions.contains(start)
        {
            v(format!("resumed at {start}, not {}", end + 1));
        }
        let mut received: BTreeMap<i64, usize> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        let mut last_event = start - 1;
        for (position, response) in responses.iter().enumerate() {
            let header = response.header().map_or(0, |h| h.revision());
            if header < last_header {
                v(format!("header went back from {last_header} to {header}"));
            }
            last_header = last_header.max(header);
            // (A stream-wide progress answer may come first.)
            let first_of_watch = responses[..position].iter().all(|r| r.watch_id() == -1);
            if first_of_watch && response.watch_id() != -1 && !response.created() {
                v("first response is not the create's".into());
            }
            if response.compact_revision() != 0 && response.compact_revision() <= last_event + 1 {
                v(format!(
                    "canceled at compaction {} though {} was deliverable",
                    response.compact_revision(),
                    last_event + 1
                ));
            }
            let mut revisions_here = BTreeSet::new();
            for event in response.events() {
                let kv = event.kv().unwrap();
                let revision = kv.mod_revision();
                let name = String::from_utf8_lossy(kv.key()).into_owned();
                // Ordered and unique.
                if revision < last_event || !seen.insert((name.clone(), revision)) {
                    v(format!("event {name}@{revision} after {last_event}"));
                }
                if revision > last_event
                    && received.contains_key(&revision)
                    && !revisions_here.contains(&revision)
                {
                    v(format!("revision {revision} split across responses"));
                }
                last_event = last_event.max(revision);
                revisions_here.insert(revision);
                *received.entry(revision).or_default() += 1;
                let Some(committed) = model
                    .events
                    .get(&revision)
                    .and_then(|c| c.iter().find(|c| c.key == name))
                else {
                    v(format!("event {name}@{revision} never committed"));
                    continue;
                };
                let actual_after = (event.event_type() == EventType::Put).then(|| {
                    (
                        String::from_utf8_lossy(kv.value()).into_owned(),
                        kv.create_revision(),
                        revision,
                        kv.version(),
                    )
                });
                if actual_after != committed.after {
                    v(format!(
                        "{name}@{revision}: {actual_after:?} != {:?}",
                        committed.after
                    ));
                }
                let prev = event.prev_kv().map(|p| {
                    (
                        String::from_utf8_lossy(p.value()).into_owned(),
                        p.create_revision(),
                        p.mod_revision(),
                        p.version(),
                    )
                });
                let is_create = committed.before.is_none();
                match prev {
                    Some(prev) if Some(&prev) != committed.before.as_ref() => {
                        v(format!(
                            "{name}@{revision} prev {prev:?} != {:?}",
                            committed.before
                        ));
                    }
                    None if !is_create && revision > max_compaction => {
                        v(format!("{name}@{revision} lacks its prev_kv"));
                    }
                    _ => {}
                }
            }
            // Atomic: each revision here is whole.
            for revision in &revisions_here {
                let expected = model.events[revision]
                    .iter()
                    .filter(|c| in_range(&c.key))
                    .count();
                if received[revision] != expected {
                    v(format!(
                        "revision {revision}: {} of {expected} events",
                        received[revision]
                    ));
                }
            }
            // Bookmarkable: a progress notification promises every event up
            // to its revision was sent.
            let progress =
                response.events().is_empty() && !response.created() && !response.canceled();
            if progress && *start <= header {
                let missing: Vec<i64> = model
                    .events
                    .range(*start..=header)
                    .filter(|(r, c)| {
                        c.iter().any(|c| in_range(&c.key)) && !received.contains_key(r)
                    })
                    .map(|(r, _)| *r)
                    .collect();
                if !missing.is_empty() {
                    v(format!("progress at {header} before revisions {missing:?}"));
                }
                last_event = last_event.max(header);
            }
        }
        // Reliable: no gap between the start and the last revision reached.
        let reached = last_event;
        let missing: Vec<i64> = model
            .events
            .range(*start..reached.max(*start - 1) + 1)
            .filter(|(r, c)| c.iter().any(|c| in_range(&c.key)) && !received.contains_key(r))
            .map(|(r, _)| *r)
            .collect();
        if !missing.is_empty() {
            v(format!("gaps {missing:?} up to {reached}"));
        }
        previous_end = Some(reached);
    }
    violations
}

/// The nodes of the run: a primary and a standby to begin with, a second
/// standby started after the takeover; each serving etcd.
struct Nodes {
    stores: MemoryStores,
    served: Vec<Served>,
}

impl Nodes {
    async fn start() -> Nodes {
        let stores = MemoryStores::new("watch-guarantees", |store| store).await;
        let mut nodes = Nodes {
            stores,
            served: Vec::new(),
        };
        let primary = nodes.start_node("http://first:1").await;
        wait_until("primary", || primary.runtime.is_primary_and_sure()).await;
        nodes.served.push(primary);
        let standby = nodes.start_node("http://second:1").await;
        nodes.served.push(standby);
        nodes
    }

    /// A node over the stores serving etcd: a standby while another holds
    /// the lease.
    async fn start_node(&self, holder: &str) -> Served {
        let runtime = self.stores.runtime_with(holder, |config| {
            config.standby_poll_interval = Duration::from_millis(50);
        });
        support::serve_runtime(runtime, &self.stores.database, |_| {}).await
    }

    /// The first node shuts down (its lease released, its etcd API left
    /// serving what it applied); the second takes over; a third starts as
    /// a standby. Returns the new primary's and the new standby's endpoints.
    async fn take_over(&mut self) -> (String, String) {
        self.served[0]
            .runtime
            .shutdown()
            .await
            .expect("a clean shutdown");
        wait_for_takeover(&self.served[1].runtime, "the standby").await;
        let standby = self.start_node("http://third:1").await;
        self.served.push(standby);
        (self.served[1].endpoint(), self.served[2].endpoint())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_guarantees_hold_under_a_random_workload_with_compactions_and_a_takeover() {
    let seed = std::env::var("CHORUS_WATCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("CHORUS_WATCH_SEED={seed}");
    let mut nodes = Nodes::start().await;
    let (published, written) = watch::channel(1);
    let (finished, done) = watch::channel(false);
    let ranges = [("k0", "k8"), ("k2", "k5"), ("\0", "\u{7f}"), ("k5", "k6")];
    let mut watchers = Vec::new();
    let mut moves = Vec::new();
    for index in 0..WATCHERS {
        let range = (
            ranges[index as usize].0.to_owned(),
            ranges[index as usize].1.to_owned(),
        );
        // Even watchers on the primary, odd ones on the standby.
        let first_node = nodes.served[(index % 2) as usize].endpoint();
        let (mover, node) = watch::channel(first_node);
        moves.push(mover);
        let task = watcher(
            seed.wrapping_add(index + 1),
            range.clone(),
            node,
            written.clone(),
            done.clone(),
        );
        watchers.push((range, tokio::spawn(task)));
    }
    let mut writer = Writer::new(seed, published);
    let mut client = nodes.served[0].client().await;
    writer.write(&mut client, WRITES / 2).await;
    let (primary, standby) = nodes.take_over().await;
    println!("taken over at revision {}", writer.model.revision);
    // The first node's watchers move: one to the new primary, one to the
    // new standby; the second node's stay where they are.
    for (index, mover) in moves.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        let next = if index % 4 == 0 { &primary } else { &standby };
        mover.send_replace(next.clone());
    }
    let mut client = connect(&primary).await;
    writer.write(&mut client, WRITES - WRITES / 2).await;
    let model = writer.model;
    finished.send_replace(true);
    // Writes outside every range, so a watch resumed at the store revision
    // + 1 reaches its start and its final progress request is answered
    // (etcd withholds progress below a watch's start revision).
    let mut ticker_client = connect(&primary).await;
    let ticker = tokio::spawn(async move {
        loop {
            ticker_client.put("\u{7f}tick", "", None).await.unwrap();
            tokio::time::sleep(IDLE_READ / 2).await;
        }
    });
    let mut violations = Vec::new();
    for (range, task) in watchers {
        let record = task.await.expect("the watcher ran");
        assert!(!record.sessions.is_empty());
        let moved = record.sessions.iter().skip(1).any(|s| s.new_stream);
        if range.0 == "k0" || range.0 == "\0" {
            assert!(moved, "{range:?}: the first node's watchers moved");
        }
        violations.extend(
            check(&record, &model, &range)
                .into_iter()
                .map(|v| format!("{range:?} {v}")),
        );
    }
    ticker.abort();
    // Every stream ended with its watcher (or its move): nothing is left
    // buffered on any node.
    for served in &nodes.served {
        wait_until("no bytes pending", || {
            served.service.watch().pending_bytes() == 0
        })
        .await;
    }
    assert!(
        nodes.served[1]
            .runtime
            .read_stale(|state| state.revision())
            .0
            > model.revision
    );
    assert!(
        violations.is_empty(),
        "seed {seed}:\n{}",
        violations.join("\n")
    );
    for served in &nodes.served[1..] {
        served.runtime.shutdown().await.expect("a clean shutdown");
    }
}
