//! etcd's watch guarantees (ordered, unique, atomic, reliable, resumable,
//! bookmarkable, exact prev_kv) checked on recorded streams against the
//! committed history, under a random workload with compactions: one writer,
//! several watchers that cancel and resume from their last revision + 1,
//! some pausing long enough for a compaction to pass them.
//!
//! The seed is printed; set `CHORUS_WATCH_SEED` to replay one.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use etcd_client::{Client, DeleteOptions, EventType, Txn, TxnOp, WatchOptions, WatchStream};
use support::memory_runtime::PATIENCE;
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

/// Runs the writes, publishing the model's revision after each.
async fn write(mut client: Client, seed: u64, published: watch::Sender<i64>) -> Model {
    let mut rng = Rng(seed | 1);
    let mut model = Model {
        revision: 1,
        ..Model::default()
    };
    for _ in 0..WRITES {
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
        published.send_replace(model.revision);
    }
    model
}

/// What one watcher recorded: per session, its start revision and every
/// response read.
#[derive(Debug, Default)]
struct Record {
    sessions: Vec<(i64, Vec<etcd_client::WatchResponse>)>,
}

/// One watcher: a range, sessions that end by its own cancel or by a
/// compaction, each resumed from the last revision seen + 1.
async fn watcher(
    mut client: Client,
    seed: u64,
    range: (String, String),
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
    let mut start = 1 + rng.below(*written.borrow_and_update() as u64) as i64;
    let mut stream: WatchStream = client
        .watch(range.0.clone(), Some(options(start)))
        .await
        .unwrap();
    let mut idle_reads = 0;
    loop {
        let mut responses = Vec::new();
        let mut bookmark = start - 1;
        let mut final_progress_asked = false;
        let mut session_id = None;
        let ended_by_compaction = loop {
            if *done.borrow() && !final_progress_asked {
                stream.request_progress().await.unwrap();
                final_progress_asked = true;
            }
            if rng.below(10) == 0 {
                stream.request_progress().await.unwrap();
            }
            // Short waits, so the end of the writes is noticed.
            let message = match tokio::time::timeout(IDLE_READ, stream.message()).await {
                Ok(message) => message.unwrap().expect("the stream is open"),
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
                break Some(compacted);
            }
            if canceled {
                break None;
            }
            if final_progress_asked && progress && watch_id == -1 {
                let model_end = *written.borrow();
                if bookmark >= model_end {
                    record.sessions.push((start, responses));
                    return record;
                }
                final_progress_asked = false;
            }
            if !final_progress_asked && rng.below(40) == 0 {
                // Cancel, then read up to the cancel's answer.
                let id = session_id.expect("the create is answered first");
                stream.cancel(id).await.unwrap();
            }
        };
        record
            .sessions
            .push((start, std::mem::take(&mut responses)));
        if rng.below(3) == 0 {
            // Long enough for a compaction to pass the bookmark, maybe.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        start = ended_by_compaction.unwrap_or(bookmark + 1);
        stream
            .watch(range.0.clone(), Some(options(start)))
            .await
            .unwrap();
    }
}

/// Checks one watcher's record against the model; returns the violations.
fn check(record: &Record, model: &Model, range: &(String, String)) -> Vec<String> {
    let mut violations = Vec::new();
    let in_range = |k: &str| k >= range.0.as_str() && k < range.1.as_str();
    let max_compaction = model.compactions.iter().copied().max().unwrap_or(0);
    let mut last_header = 0;
    let mut previous_end = None::<i64>;
    for (session, (start, responses)) in record.sessions.iter().enumerate() {
        let mut v =
            |text: String| violations.push(format!("session {session} from {start}: {text}"));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_guarantees_hold_under_a_random_workload_with_compactions() {
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
    let served = support::serve("watch-guarantees", |_| {}).await;
    let (published, written) = watch::channel(1);
    let (finished, done) = watch::channel(false);
    let ranges = [("k0", "k8"), ("k2", "k5"), ("\0", "\u{7f}"), ("k5", "k6")];
    let mut watchers = Vec::new();
    for index in 0..WATCHERS {
        let range = (
            ranges[index as usize].0.to_owned(),
            ranges[index as usize].1.to_owned(),
        );
        let client = served.client().await;
        let task = watcher(
            client,
            seed.wrapping_add(index + 1),
            range.clone(),
            written.clone(),
            done.clone(),
        );
        watchers.push((range, tokio::spawn(task)));
    }
    let model = write(served.client().await, seed, published).await;
    finished.send_replace(true);
    // Writes outside every range, so a watch resumed at the store revision
    // + 1 reaches its start and its final progress request is answered
    // (etcd withholds progress below a watch's start revision).
    let mut ticker_client = served.client().await;
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
        violations.extend(
            check(&record, &model, &range)
                .into_iter()
                .map(|v| format!("{range:?} {v}")),
        );
    }
    ticker.abort();
    // Every stream ended with its watcher: nothing is left buffered.
    support::memory_runtime::wait_until("no bytes pending", || {
        served.service.watch().pending_bytes() == 0
    })
    .await;
    assert!(served.runtime.read_stale(|state| state.revision()).0 > model.revision);
    assert!(
        violations.is_empty(),
        "seed {seed}:\n{}",
        violations.join("\n")
    );
}
