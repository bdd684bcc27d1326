//! A checker of etcd histories recorded by a fault test: pure, no I/O.
//!
//! The workload touches a few keys of one prefix that nothing else writes,
//! so the store revision rises by exactly one per write that changed
//! something, and every revision from the first write on carries exactly one
//! event. That makes the committed history (every event, read back at the end
//! by a watch from revision 1) the linearization order of the writes, and the
//! checks below a complete test of linearizability for this workload:
//!
//! - (a) Writes: each acknowledged write's revision is unique and carries its
//!   event; every event is accounted for by a request that wrote it
//!   (acknowledged, or of unknown outcome; never one that failed
//!   definitely); positions respect real time: an operation that completed
//!   before another started is ordered before it (a write at revision `r`
//!   sits at `2r`, a read answered at header revision `h` at `2h + 1`).
//! - (b) Reads: a read of key `k` at header revision `h` returns `k` as the
//!   committed history has it at `h`. Linearizable reads are ordered by real
//!   time as above; serializable reads (a standby's) may be stale, but never
//!   see a write that started after they completed.
//! - (c) A compare-and-set or create-if-absent that applied at revision `r`
//!   held against the state at `r - 1`; one that did not apply was answered
//!   with a state against which its compare failed.
//! - (d) The final state and the states at past revisions read by Range equal
//!   the committed history replayed to them (so every acknowledged write,
//!   present in the history, is present at the end).
//! - (e) Watchers: the events each watcher received, concatenated across its
//!   reconnects, equal the committed history from its start revision on:
//!   ordered, gap-free, no duplicates.
//!
//! Retries are separate operations carrying the same request (the same
//! value): the report counts how often one request applied more than once.
#![allow(dead_code)] // the unit tests and the fault test use different parts

use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// An etcd store revision.
pub type Revision = i64;

/// A key's entry as etcd answers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The value.
    pub value: String,
    /// The revision that last wrote it.
    pub mod_revision: Revision,
    /// The revision that created it (since its last delete).
    pub create_revision: Revision,
    /// Writes since it was created, this one included.
    pub version: i64,
}

/// What a client asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Range of one key.
    Get { key: String, serializable: bool },
    /// An unguarded Put.
    Put { key: String, value: String },
    /// DeleteRange of one key.
    Delete { key: String },
    /// Txn: if `mod_revision(key) == expected` then put, else get.
    Cas {
        key: String,
        expected_mod_revision: Revision,
        value: String,
    },
    /// Txn: if `create_revision(key) == 0` then put, else get.
    Create { key: String, value: String },
}

impl Request {
    /// The key it touches.
    pub fn key(&self) -> &str {
        match self {
            Request::Get { key, .. }
            | Request::Put { key, .. }
            | Request::Delete { key }
            | Request::Cas { key, .. }
            | Request::Create { key, .. } => key,
        }
    }

    /// The value it writes, if it writes one.
    pub fn value(&self) -> Option<&str> {
        match self {
            Request::Put { value, .. }
            | Request::Cas { value, .. }
            | Request::Create { value, .. } => Some(value),
            Request::Get { .. } | Request::Delete { .. } => None,
        }
    }

    /// A short name for the report.
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Get { .. } => "get",
            Request::Put { .. } => "put",
            Request::Delete { .. } => "delete",
            Request::Cas { .. } => "cas",
            Request::Create { .. } => "create",
        }
    }
}

/// What an answered request said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A Get's entry, or `None` for an absent key.
    Read(Option<Entry>),
    /// A Put, or a Cas/Create whose compare held: written at the header
    /// revision.
    Written,
    /// A Delete, with how many keys it deleted (0: it changed nothing).
    Deleted(i64),
    /// A Cas/Create whose compare failed, with the key as its else-branch
    /// read it.
    CompareFailed(Option<Entry>),
}

/// How a request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Answered, at this header revision.
    Ok { revision: Revision, answer: Answer },
    /// Refused with nothing written (a standby's or a lease-uncertain
    /// primary's `Unavailable`, a refused connection).
    Failed,
    /// No answer, or one saying the write may have applied.
    Unknown,
}

/// One request of one client, with its real-time bounds (microseconds since
/// the test began; `end` is when the answer arrived, `None` if none did).
#[derive(Clone, Debug)]
pub struct Op {
    /// The client that sent it.
    pub client: usize,
    /// The node it was sent to (for reports; the checks ignore it).
    pub node: usize,
    /// When it was sent.
    pub start_micros: u64,
    /// When it was answered.
    pub end_micros: Option<u64>,
    /// What it asked.
    pub request: Request,
    /// How it ended.
    pub outcome: Outcome,
}

/// What a revision did to its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The key as written.
    Put(Entry),
    /// The key was deleted.
    Delete,
}

/// One event of the committed history or of a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The revision that made it.
    pub revision: Revision,
    /// The key.
    pub key: String,
    /// What happened to it.
    pub change: Change,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.change {
            Change::Put(entry) => write!(
                f,
                "rev {} put {}={} (version {})",
                self.revision, self.key, entry.value, entry.version
            ),
            Change::Delete => write!(f, "rev {} delete {}", self.revision, self.key),
        }
    }
}

/// Every key's entry at one revision, as a Range answered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateAt {
    /// The revision read at.
    pub revision: Revision,
    /// Every key of the prefix with its entry.
    pub entries: BTreeMap<String, Entry>,
}

/// What one watcher received over all its connections.
#[derive(Clone, Debug)]
pub struct WatchLog {
    /// The watcher's name, for messages.
    pub name: String,
    /// The revision its first watch started from.
    pub start_revision: Revision,
    /// Every event received, in order, across reconnects.
    pub events: Vec<Event>,
}

/// Everything recorded by one run.
#[derive(Clone, Debug, Default)]
pub struct Recorded {
    /// Every client request.
    pub ops: Vec<Op>,
    /// The committed history: every event from the first write on.
    pub committed: Vec<Event>,
    /// The revision of the first write (the store's revision + 1 when the
    /// workload began).
    pub first_revision: Revision,
    /// States read at past revisions and at the end (the last is the final
    /// state).
    pub states: Vec<StateAt>,
    /// Every watcher's events.
    pub watches: Vec<WatchLog>,
}

/// Counts the checker found, for the report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Requests per kind and outcome (`ok`, `failed`, `unknown`).
    pub outcomes: BTreeMap<(&'static str, &'static str), usize>,
    /// Writes of unknown outcome found in the committed history.
    pub unknown_applied: usize,
    /// Writes of unknown outcome not in it.
    pub unknown_not_applied: usize,
    /// Requests (by kind) whose value was written more than once, counting
    /// the extra applications: a retried unguarded Put may apply twice.
    pub applied_twice: BTreeMap<&'static str, usize>,
    /// Events in the committed history.
    pub committed_events: usize,
}

/// The committed history indexed by key: each key's entries in revision
/// order (`None` after a delete).
struct Timeline(HashMap<String, Vec<(Revision, Option<Entry>)>>);

impl Timeline {
    fn at(&self, key: &str, revision: Revision) -> Option<&Entry> {
        let changes = self.0.get(key)?;
        let after = changes.partition_point(|(at, _)| *at <= revision);
        after
            .checked_sub(1)
            .and_then(|index| changes[index].1.as_ref())
    }

    /// Every key's entry at `revision`.
    fn state(&self, revision: Revision) -> BTreeMap<String, Entry> {
        self.0
            .keys()
            .filter_map(|key| Some((key.clone(), self.at(key, revision)?.clone())))
            .collect()
    }
}

/// Checks `recorded`; returns the summary, or every violation found.
pub fn check(recorded: &Recorded) -> Result<Summary, Vec<String>> {
    let mut violations = Vec::new();
    let timeline = replay(recorded, &mut violations);
    let positions = attribute_events(recorded, &timeline, &mut violations);
    check_real_time(&recorded.ops, &positions, &mut violations);
    check_answers(recorded, &timeline, &mut violations);
    check_states(recorded, &timeline, &mut violations);
    check_watches(recorded, &mut violations);
    if violations.is_empty() {
        Ok(summarize(recorded, &positions))
    } else {
        Err(violations)
    }
}

/// Replays the committed history: one event per revision from the first
/// on, each entry consistent with the key's previous one.
fn replay(recorded: &Recorded, violations: &mut Vec<String>) -> Timeline {
    let mut keys: HashMap<String, Vec<(Revision, Option<Entry>)>> = HashMap::new();
    for (offset, event) in recorded.committed.iter().enumerate() {
        let expected_revision = recorded.first_revision + offset as Revision;
        if event.revision != expected_revision {
            violations.push(format!(
                "committed history: expected revision {expected_revision}, found {event}"
            ));
        }
        let changes = keys.entry(event.key.clone()).or_default();
        let before = changes.last().and_then(|(_, entry)| entry.clone());
        let after = match (&event.change, &before) {
            (Change::Delete, None) => {
                violations.push(format!("committed history: {event} of an absent key"));
                None
            }
            (Change::Delete, Some(_)) => None,
            (Change::Put(entry), before) => {
                let (create_revision, version) = match before {
                    Some(before) => (before.create_revision, before.version + 1),
                    None => (event.revision, 1),
                };
                if entry.mod_revision != event.revision
                    || entry.create_revision != create_revision
                    || entry.version != version
                {
                    violations.push(format!(
                        "committed history: {event} has {entry:?}, expected mod_revision {}, \
                         create_revision {create_revision}, version {version}",
                        event.revision
                    ));
                }
                Some(entry.clone())
            }
        };
        changes.push((event.revision, after));
    }
    Timeline(keys)
}

/// Whether `event` is what `request` writes.
fn writes(request: &Request, event: &Event) -> bool {
    if request.key() != event.key {
        return false;
    }
    match (&event.change, request) {
        (Change::Delete, Request::Delete { .. }) => true,
        (Change::Put(entry), request) => request.value() == Some(entry.value.as_str()),
        _ => false,
    }
}

/// The revision an answered write changed the store at, if it did.
fn acknowledged_revision(op: &Op) -> Option<Revision> {
    match &op.outcome {
        Outcome::Ok {
            revision,
            answer: Answer::Written,
        } => Some(*revision),
        Outcome::Ok {
            revision,
            answer: Answer::Deleted(deleted),
        } if *deleted > 0 => Some(*revision),
        _ => None,
    }
}

/// Finds the request behind every committed event: an acknowledged write
/// at its revision, else a write of unknown outcome with the same request
/// (earliest sent first). Returns each attributed op's revision.
fn attribute_events(
    recorded: &Recorded,
    timeline: &Timeline,
    violations: &mut Vec<String>,
) -> HashMap<usize, Revision> {
    let by_revision: HashMap<Revision, &Event> = recorded
        .committed
        .iter()
        .map(|event| (event.revision, event))
        .collect();
    let mut attributed: HashMap<usize, Revision> = HashMap::new();
    let mut claimed: HashMap<Revision, usize> = HashMap::new();
    for (index, op) in recorded.ops.iter().enumerate() {
        let Some(revision) = acknowledged_revision(op) else {
            continue;
        };
        if let Some(other) = claimed.insert(revision, index) {
            violations.push(format!(
                "revision {revision} acknowledged to two writes: {:?} and {:?}",
                recorded.ops[other], op
            ));
        }
        match by_revision.get(&revision) {
            Some(event) if writes(&op.request, event) => {}
            Some(event) => violations.push(format!(
                "acknowledged write {op:?} is not in the committed history: revision {revision} \
                 holds {event}"
            )),
            None => violations.push(format!(
                "acknowledged write {op:?} is not in the committed history: no revision {revision}"
            )),
        }
        attributed.insert(index, revision);
    }
    let mut unknown: Vec<usize> = (0..recorded.ops.len())
        .filter(|index| recorded.ops[*index].outcome == Outcome::Unknown)
        .collect();
    unknown.sort_by_key(|index| recorded.ops[*index].start_micros);
    for event in &recorded.committed {
        if claimed.contains_key(&event.revision) {
            continue;
        }
        let candidate = unknown.iter().position(|index| {
            !attributed.contains_key(index) && writes(&recorded.ops[*index].request, event)
        });
        match candidate {
            Some(position) => {
                attributed.insert(unknown[position], event.revision);
            }
            None => {
                let failed = recorded.ops.iter().find(|op| {
                    op.outcome == Outcome::Failed
                        && op.request.value().is_some()
                        && writes(&op.request, event)
                });
                violations.push(match failed {
                    Some(op) => format!("{event} was written by a request that failed: {op:?}"),
                    None => format!("{event} has no request left to account for it"),
                });
            }
        }
    }
    for (index, revision) in &attributed {
        check_compare(&recorded.ops[*index], *revision, timeline, violations);
    }
    attributed
}

/// A compare-and-set or create that applied at `revision` held against the
/// state just before.
fn check_compare(op: &Op, revision: Revision, timeline: &Timeline, violations: &mut Vec<String>) {
    let before = timeline.at(op.request.key(), revision - 1);
    let held = match &op.request {
        Request::Cas {
            expected_mod_revision,
            ..
        } => before.map_or(0, |entry| entry.mod_revision) == *expected_mod_revision,
        Request::Create { .. } => before.is_none(),
        _ => true,
    };
    if !held {
        violations.push(format!(
            "{op:?} applied at revision {revision} against {before:?}, which fails its compare"
        ));
    }
}

/// Where an operation sits in the linearization, if it has a place: a write
/// that changed the store at `2r`, an answered read at `2h + 1`.
fn position(op: &Op, index: usize, attributed: &HashMap<usize, Revision>) -> Option<i64> {
    if let Some(revision) = attributed.get(&index) {
        return Some(2 * revision);
    }
    match &op.outcome {
        Outcome::Ok { revision, .. } => Some(2 * revision + 1),
        _ => None,
    }
}

fn is_serializable_read(op: &Op) -> bool {
    matches!(
        op.request,
        Request::Get {
            serializable: true,
            ..
        }
    )
}

/// Real-time order: an operation that completed before another started sits
/// no later in the linearization. A serializable read is only held to not
/// seeing writes sent after it completed.
fn check_real_time(
    ops: &[Op],
    attributed: &HashMap<usize, Revision>,
    violations: &mut Vec<String>,
) {
    let placed: Vec<(usize, i64)> = (0..ops.len())
        .filter_map(|index| Some((index, position(&ops[index], index, attributed)?)))
        .collect();
    let mut completed: Vec<&(usize, i64)> = placed
        .iter()
        .filter(|(index, _)| ops[*index].end_micros.is_some())
        .collect();
    completed.sort_by_key(|(index, _)| ops[*index].end_micros);
    let mut started: Vec<&(usize, i64)> = placed.iter().collect();
    started.sort_by_key(|(index, _)| ops[*index].start_micros);
    // The highest positions among operations completed so far: of any
    // operation, and of those bound by real time both ways.
    let mut highest_any: Option<(i64, usize)> = None;
    let mut highest_linearizable: Option<(i64, usize)> = None;
    let mut next = 0;
    for &&(index, place) in &started {
        let start = ops[index].start_micros;
        while next < completed.len() && ops[completed[next].0].end_micros < Some(start) {
            let (done, done_place) = *completed[next];
            highest_any = highest_any.max(Some((done_place, done)));
            if !is_serializable_read(&ops[done]) {
                highest_linearizable = highest_linearizable.max(Some((done_place, done)));
            }
            next += 1;
        }
        let bound = if place % 2 == 0 {
            highest_any
        } else if is_serializable_read(&ops[index]) {
            None
        } else {
            highest_linearizable
        };
        if let Some((before_place, before)) = bound
            && before_place > place
        {
            violations.push(format!(
                "real-time order violated: {:?} (at {}) completed before {:?} (at {}) started",
                ops[before],
                describe_position(before_place),
                ops[index],
                describe_position(place)
            ));
        }
    }
}

fn describe_position(place: i64) -> String {
    if place % 2 == 0 {
        format!("write revision {}", place / 2)
    } else {
        format!("read revision {}", place / 2)
    }
}

/// Every answered read (a Get, a failed compare's else-branch, a delete of
/// nothing) returns the key as the committed history has it at its header
/// revision; a failed compare fails against it.
fn check_answers(recorded: &Recorded, timeline: &Timeline, violations: &mut Vec<String>) {
    let last = recorded.first_revision - 1 + recorded.committed.len() as Revision;
    for op in &recorded.ops {
        let Outcome::Ok { revision, answer } = &op.outcome else {
            continue;
        };
        let read = match answer {
            Answer::Read(entry) | Answer::CompareFailed(entry) => entry.as_ref(),
            Answer::Deleted(0) => None,
            Answer::Written | Answer::Deleted(_) => continue,
        };
        if *revision > last {
            violations.push(format!(
                "{op:?} read revision {revision}, past the last {last}"
            ));
            continue;
        }
        let committed = timeline.at(op.request.key(), *revision);
        if read != committed {
            violations.push(format!(
                "{op:?} read {read:?} at revision {revision}; the committed history has \
                 {committed:?}"
            ));
        }
        if matches!(answer, Answer::CompareFailed(_)) {
            let compare_held = match &op.request {
                Request::Cas {
                    expected_mod_revision,
                    ..
                } => read.map_or(0, |entry| entry.mod_revision) == *expected_mod_revision,
                Request::Create { .. } => read.is_none(),
                _ => false,
            };
            if compare_held {
                violations.push(format!("{op:?} failed its compare against {read:?}"));
            }
        }
    }
}

/// The states Range read equal the committed history replayed to their
/// revisions; the last is at the committed history's last revision.
fn check_states(recorded: &Recorded, timeline: &Timeline, violations: &mut Vec<String>) {
    let last = recorded.first_revision - 1 + recorded.committed.len() as Revision;
    match recorded.states.last() {
        Some(state) if state.revision == last => {}
        Some(state) => violations.push(format!(
            "the final state was read at revision {}, the committed history ends at {last}",
            state.revision
        )),
        None => violations.push("no final state was read".to_owned()),
    }
    for state in &recorded.states {
        let replayed = timeline.state(state.revision);
        if replayed != state.entries {
            violations.push(format!(
                "Range at revision {} answered {:?}; the committed history has {replayed:?}",
                state.revision, state.entries
            ));
        }
    }
}

/// Every watcher received exactly the committed history from its start
/// revision on.
fn check_watches(recorded: &Recorded, violations: &mut Vec<String>) {
    for watch in &recorded.watches {
        let expected: Vec<&Event> = recorded
            .committed
            .iter()
            .filter(|event| event.revision >= watch.start_revision)
            .collect();
        if let Some(problem) = first_watch_difference(&expected, &watch.events) {
            violations.push(format!("watcher {}: {problem}", watch.name));
        }
    }
}

/// The first place a watcher's events differ from the expected ones, named
/// as a gap, a duplicate, a reordering or a different event.
fn first_watch_difference(expected: &[&Event], received: &[Event]) -> Option<String> {
    for (position, event) in received.iter().enumerate() {
        let Some(wanted) = expected.get(position) else {
            return Some(format!("received {event} past the committed history's end"));
        };
        if *wanted == event {
            continue;
        }
        let previous = position
            .checked_sub(1)
            .map(|index| received[index].revision);
        return Some(if previous == Some(event.revision) {
            format!("duplicate: received revision {} twice", event.revision)
        } else if received[position + 1..].contains(wanted) {
            format!(
                "out of order: revision {} after {}",
                wanted.revision, event.revision
            )
        } else if event.revision > wanted.revision {
            format!("gap: expected {wanted}, received {event}")
        } else {
            format!("expected {wanted}, received {event}")
        });
    }
    expected
        .get(received.len())
        .map(|missing| format!("gap at the end: never received {missing}"))
}

fn outcome_name(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Ok { .. } => "ok",
        Outcome::Failed => "failed",
        Outcome::Unknown => "unknown",
    }
}

fn summarize(recorded: &Recorded, attributed: &HashMap<usize, Revision>) -> Summary {
    let mut summary = Summary {
        committed_events: recorded.committed.len(),
        ..Summary::default()
    };
    for (index, op) in recorded.ops.iter().enumerate() {
        *summary
            .outcomes
            .entry((op.request.kind(), outcome_name(&op.outcome)))
            .or_default() += 1;
        if op.outcome == Outcome::Unknown && op.request.kind() != "get" {
            if attributed.contains_key(&index) {
                summary.unknown_applied += 1;
            } else {
                summary.unknown_not_applied += 1;
            }
        }
    }
    let mut applications: HashMap<&str, (usize, &'static str)> = HashMap::new();
    for event in &recorded.committed {
        if let Change::Put(entry) = &event.change {
            let kind = recorded
                .ops
                .iter()
                .find(|op| op.request.value() == Some(entry.value.as_str()))
                .map_or("?", |op| op.request.kind());
            applications.entry(&entry.value).or_insert((0, kind)).0 += 1;
        }
    }
    for (count, kind) in applications.into_values() {
        if count > 1 {
            *summary.applied_twice.entry(kind).or_default() += count - 1;
        }
    }
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: &str = "k";

    fn entry(
        value: &str,
        mod_revision: Revision,
        create_revision: Revision,
        version: i64,
    ) -> Entry {
        Entry {
            value: value.to_owned(),
            mod_revision,
            create_revision,
            version,
        }
    }

    fn put_event(
        revision: Revision,
        value: &str,
        create_revision: Revision,
        version: i64,
    ) -> Event {
        Event {
            revision,
            key: K.to_owned(),
            change: Change::Put(entry(value, revision, create_revision, version)),
        }
    }

    fn delete_event(revision: Revision) -> Event {
        Event {
            revision,
            key: K.to_owned(),
            change: Change::Delete,
        }
    }

    fn op(start: u64, end: Option<u64>, request: Request, outcome: Outcome) -> Op {
        Op {
            client: 0,
            node: 0,
            start_micros: start,
            end_micros: end,
            request,
            outcome,
        }
    }

    fn put(value: &str) -> Request {
        Request::Put {
            key: K.to_owned(),
            value: value.to_owned(),
        }
    }

    fn get(serializable: bool) -> Request {
        Request::Get {
            key: K.to_owned(),
            serializable,
        }
    }

    fn cas(expected: Revision, value: &str) -> Request {
        Request::Cas {
            key: K.to_owned(),
            expected_mod_revision: expected,
            value: value.to_owned(),
        }
    }

    fn written(revision: Revision) -> Outcome {
        Outcome::Ok {
            revision,
            answer: Answer::Written,
        }
    }

    fn read(revision: Revision, entry: Option<Entry>) -> Outcome {
        Outcome::Ok {
            revision,
            answer: Answer::Read(entry),
        }
    }

    /// A valid run: puts at 2 and 3, a CAS at 4, a delete at 5, reads,
    /// a write of unknown outcome that applied and one that did not.
    fn valid() -> Recorded {
        let committed = vec![
            put_event(2, "a", 2, 1),
            put_event(3, "b", 2, 2),
            put_event(4, "c", 2, 3),
            delete_event(5),
            put_event(6, "d", 6, 1),
        ];
        let ops = vec![
            op(0, Some(10), put("a"), written(2)),
            op(20, Some(30), get(false), read(2, Some(entry("a", 2, 2, 1)))),
            op(25, None, put("b"), Outcome::Unknown),
            op(40, Some(50), cas(3, "c"), written(4)),
            // A serializable read may be stale.
            op(60, Some(70), get(true), read(2, Some(entry("a", 2, 2, 1)))),
            op(
                60,
                Some(75),
                cas(3, "x"),
                Outcome::Ok {
                    revision: 4,
                    answer: Answer::CompareFailed(Some(entry("c", 4, 2, 3))),
                },
            ),
            op(
                80,
                Some(90),
                Request::Delete { key: K.to_owned() },
                Outcome::Ok {
                    revision: 5,
                    answer: Answer::Deleted(1),
                },
            ),
            op(95, None, put("never"), Outcome::Unknown),
            op(96, Some(97), put("refused"), Outcome::Failed),
            op(
                100,
                Some(110),
                Request::Create {
                    key: K.to_owned(),
                    value: "d".to_owned(),
                },
                written(6),
            ),
            op(
                120,
                Some(130),
                get(false),
                read(6, Some(entry("d", 6, 6, 1))),
            ),
        ];
        Recorded {
            ops,
            committed: committed.clone(),
            first_revision: 2,
            states: vec![
                StateAt {
                    revision: 3,
                    entries: BTreeMap::from([(K.to_owned(), entry("b", 3, 2, 2))]),
                },
                StateAt {
                    revision: 6,
                    entries: BTreeMap::from([(K.to_owned(), entry("d", 6, 6, 1))]),
                },
            ],
            watches: vec![WatchLog {
                name: "w".to_owned(),
                start_revision: 1,
                events: committed,
            }],
        }
    }

    fn violations(recorded: &Recorded) -> Vec<String> {
        check(recorded).expect_err("the checker must find a violation")
    }

    fn assert_violation(recorded: &Recorded, needle: &str) {
        let found = violations(recorded);
        assert!(
            found.iter().any(|violation| violation.contains(needle)),
            "expected a violation containing {needle:?}, found {found:#?}"
        );
    }

    #[test]
    fn a_valid_history_passes_and_is_summarized() {
        let summary = check(&valid()).unwrap_or_else(|found| panic!("{found:#?}"));
        assert_eq!(summary.unknown_applied, 1);
        assert_eq!(summary.unknown_not_applied, 1);
        assert_eq!(summary.committed_events, 5);
        assert_eq!(summary.outcomes[&("put", "ok")], 1);
        assert_eq!(summary.outcomes[&("put", "unknown")], 2);
        assert_eq!(summary.outcomes[&("put", "failed")], 1);
        assert!(summary.applied_twice.is_empty());
    }

    #[test]
    fn a_stale_linearizable_read_fails() {
        let mut recorded = valid();
        // Read after the CAS at 4 completed, answered at revision 3.
        recorded.ops.push(op(
            55,
            Some(58),
            get(false),
            read(3, Some(entry("b", 3, 2, 2))),
        ));
        assert_violation(&recorded, "real-time order violated");
    }

    #[test]
    fn a_read_answering_a_value_the_history_does_not_have_fails() {
        let mut recorded = valid();
        recorded.ops.push(op(
            55,
            Some(58),
            get(true),
            read(4, Some(entry("b", 3, 2, 2))),
        ));
        assert_violation(&recorded, "the committed history has");
    }

    #[test]
    fn a_serializable_read_from_the_future_fails() {
        let mut recorded = valid();
        // Completed before the create at 6 was sent, yet saw it.
        recorded.ops.push(op(
            91,
            Some(92),
            get(true),
            read(6, Some(entry("d", 6, 6, 1))),
        ));
        assert_violation(&recorded, "real-time order violated");
    }

    #[test]
    fn a_lost_acknowledged_write_fails() {
        let mut recorded = valid();
        recorded
            .ops
            .push(op(140, Some(150), put("lost"), written(7)));
        assert_violation(&recorded, "not in the committed history");
    }

    #[test]
    fn a_revision_order_contradicting_real_time_fails() {
        let mut recorded = valid();
        // "b" is acknowledged at 3 though it was sent after "c" (at 4)
        // completed.
        recorded.ops[2] = op(52, Some(54), put("b"), written(3));
        assert_violation(&recorded, "real-time order violated");
    }

    #[test]
    fn a_duplicate_revision_fails() {
        let mut recorded = valid();
        recorded.ops.push(op(140, Some(150), put("e"), written(6)));
        assert_violation(&recorded, "acknowledged to two writes");
    }

    #[test]
    fn a_cas_against_a_superseded_revision_fails() {
        let mut recorded = valid();
        // The CAS at 4 compared mod_revision 2, but "b" rewrote the key at 3.
        recorded.ops[3] = op(40, Some(50), cas(2, "c"), written(4));
        assert_violation(&recorded, "fails its compare");
    }

    #[test]
    fn a_failed_compare_that_should_have_held_fails() {
        let mut recorded = valid();
        recorded.ops[5].request = cas(4, "x");
        assert_violation(&recorded, "failed its compare");
    }

    #[test]
    fn a_definitely_failed_write_in_the_history_fails() {
        let mut recorded = valid();
        recorded.committed.push(put_event(7, "refused", 6, 2));
        recorded.states[1] = StateAt {
            revision: 7,
            entries: BTreeMap::from([(K.to_owned(), entry("refused", 7, 6, 2))]),
        };
        recorded.watches.clear();
        assert_violation(&recorded, "written by a request that failed");
    }

    #[test]
    fn an_unknown_write_applied_twice_fails_but_a_retry_may_apply_it_again() {
        let mut recorded = valid();
        recorded.committed.push(put_event(7, "b", 6, 2));
        recorded.states[1] = StateAt {
            revision: 7,
            entries: BTreeMap::from([(K.to_owned(), entry("b", 7, 6, 2))]),
        };
        recorded.watches.clear();
        assert_violation(&recorded, "no request left to account for it");
        // With a retry of the same request, the second application is the
        // retry's, and counted.
        recorded.ops.push(op(140, None, put("b"), Outcome::Unknown));
        let summary = check(&recorded).unwrap_or_else(|found| panic!("{found:#?}"));
        assert_eq!(summary.applied_twice[&"put"], 1);
    }

    #[test]
    fn a_final_state_missing_a_write_fails() {
        let mut recorded = valid();
        recorded.states[1].entries.clear();
        assert_violation(&recorded, "Range at revision 6");
        let mut recorded = valid();
        recorded.states[1].revision = 5;
        assert_violation(&recorded, "the final state was read at revision 5");
    }

    #[test]
    fn an_inconsistent_committed_history_fails() {
        let mut recorded = valid();
        recorded.committed[1] = put_event(3, "b", 2, 5);
        recorded.watches.clear();
        assert_violation(
            &recorded,
            "expected mod_revision 3, create_revision 2, version 2",
        );
        let mut recorded = valid();
        recorded.committed.remove(1);
        recorded.watches.clear();
        assert_violation(&recorded, "expected revision 3");
    }

    /// Breaks a watcher's events.
    type Corruption = fn(&mut Vec<Event>);

    #[test]
    fn a_watcher_gap_duplicate_or_reordering_fails() {
        let cases: [(Corruption, &str); 5] = [
            (
                |events| {
                    events.remove(2);
                },
                "gap: expected rev 4",
            ),
            (
                |events| events.insert(2, events[1].clone()),
                "duplicate: received revision 3 twice",
            ),
            (
                |events| events.swap(1, 2),
                "out of order: revision 3 after 4",
            ),
            (
                |events| {
                    events.pop();
                },
                "gap at the end",
            ),
            (
                |events| events[0] = put_event(2, "other", 2, 1),
                "expected rev 2 put k=a",
            ),
        ];
        for (corrupt, needle) in cases {
            let mut recorded = valid();
            corrupt(&mut recorded.watches[0].events);
            assert_violation(&recorded, needle);
        }
    }

    #[test]
    fn a_watcher_starting_later_expects_the_history_from_its_start() {
        let mut recorded = valid();
        recorded.watches[0].start_revision = 4;
        recorded.watches[0].events.drain(..2);
        check(&recorded).unwrap_or_else(|found| panic!("{found:#?}"));
    }
}
