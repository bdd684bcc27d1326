//! One watch of a stream: its key range, options and position, and the
//! events it makes of one revision's changes.

use std::ops::Bound;

use bytes::Bytes;
use chorus::kv::mvcc::Change;
use chorus::kv::{Entry, Revision};

use crate::convert;
use crate::proto::etcdserverpb as pb;
use crate::proto::mvccpb::{self, event::EventType};

/// etcd's cancel reason for a create naming an id in use on the stream.
pub const DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";
/// etcd's cancel reason for a create whose key is not below its range end.
pub const EMPTY_RANGE: &str = "mvcc: watcher range is empty";
/// etcd's cancel reason for a create with a negative start revision.
pub const NEGATIVE_START: &str = "etcdserver: mvcc: required revision has been compacted";

/// A watched key range, with etcd's conventions: an empty key is `"\0"`,
/// an empty range end the key alone, `"\0"` every key from the key on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyRange {
    start: Bytes,
    end: Bound<Bytes>,
}

impl KeyRange {
    /// The range of a create request, or etcd's reason to refuse it.
    pub(crate) fn new(key: Bytes, range_end: Bytes) -> Result<KeyRange, &'static str> {
        let start = if key.is_empty() {
            Bytes::from_static(b"\0")
        } else {
            key
        };
        let end = match range_end.as_ref() {
            [] => Bound::Included(start.clone()),
            [0] => Bound::Unbounded,
            _ if start >= range_end => return Err(EMPTY_RANGE),
            _ => Bound::Excluded(range_end),
        };
        Ok(KeyRange { start, end })
    }

    fn contains(&self, key: &[u8]) -> bool {
        key >= self.start.as_ref()
            && match &self.end {
                Bound::Unbounded => true,
                Bound::Excluded(end) => key < end.as_ref(),
                Bound::Included(end) => key == end.as_ref(),
            }
    }
}

/// One watch; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct Watcher {
    /// Its id on the stream.
    pub(crate) id: i64,
    range: KeyRange,
    /// The start revision asked for, 0 for "from now": progress is
    /// withheld until the store reaches it (etcd's fix of issue 20221).
    start_revision: Revision,
    /// The first revision not delivered yet.
    pub(crate) next: Revision,
    no_put: bool,
    no_delete: bool,
    prev_kv: bool,
    /// Split a response larger than the message limit (etcd's `fragment`).
    pub(crate) fragment: bool,
    /// Periodic progress notifications asked for.
    pub(crate) progress_notify: bool,
    /// etcd's `progress[id]`: nothing was sent since the last tick.
    pub(crate) progress_due: bool,
    /// Whether it had every revision up to the store's at the previous
    /// delivery: such a watch gets one response per revision, as etcd's
    /// synced watchers do; one catching up gets its revisions batched.
    pub(crate) caught_up: bool,
    /// Canceled because its next revision was compacted away: it delivers
    /// nothing more, but keeps its id until canceled, as etcd keeps it.
    pub(crate) compacted: bool,
}

impl Watcher {
    /// The watch `id` of `request` on a store at revision `current`.
    pub(crate) fn new(
        id: i64,
        range: KeyRange,
        request: &pb::WatchCreateRequest,
        current: Revision,
    ) -> Watcher {
        let next = if request.start_revision == 0 {
            current + 1
        } else {
            request.start_revision
        };
        let filters = |filter| request.filters.contains(&(filter as i32));
        Watcher {
            id,
            range,
            start_revision: request.start_revision,
            next,
            no_put: filters(pb::watch_create_request::FilterType::Noput),
            no_delete: filters(pb::watch_create_request::FilterType::Nodelete),
            prev_kv: request.prev_kv,
            fragment: request.fragment,
            progress_notify: request.progress_notify,
            progress_due: true,
            caught_up: next > current,
            compacted: false,
        }
    }

    /// Whether a progress notification at `current` may go out: every
    /// revision up to it delivered, and the start revision reached.
    pub(crate) fn synced(&self, current: Revision) -> bool {
        !self.compacted && self.next > current && current >= self.start_revision
    }

    /// Whether it still has revisions up to `current` to deliver.
    pub(crate) fn behind(&self, current: Revision) -> bool {
        !self.compacted && self.next <= current
    }

    /// The events it reports of the changes of `revision`, with previous
    /// entries only above the compaction revision `compacted` (etcd reads
    /// them at `revision - 1`, which must not be compacted).
    pub(crate) fn events(
        &self,
        revision: Revision,
        changes: &[Change],
        compacted: Revision,
    ) -> Vec<mvccpb::Event> {
        changes
            .iter()
            .filter(|change| self.range.contains(&change.key))
            .filter_map(|change| self.event(revision, change, changes, compacted))
            .collect()
    }

    /// The event of `change`, one of the `changes` of `revision`. Its
    /// previous entry is the key's at `revision - 1`, as etcd reads it, not
    /// the one an earlier operation of the same transaction wrote (a put
    /// then a from-key delete of that key).
    fn event(
        &self,
        revision: Revision,
        change: &Change,
        changes: &[Change],
        compacted: Revision,
    ) -> Option<mvccpb::Event> {
        let (kind, kv) = match &change.after {
            Some(after) if !self.no_put => (
                EventType::Put,
                convert::key_value(after.key_value(&change.key)),
            ),
            Some(_) => return None,
            None if self.no_delete || change.before.is_none() => return None,
            // etcd's tombstone: the key and the deleting revision only.
            None => (
                EventType::Delete,
                mvccpb::KeyValue {
                    key: change.key.clone(),
                    mod_revision: revision,
                    ..Default::default()
                },
            ),
        };
        let is_create = kind == EventType::Put && kv.create_revision == kv.mod_revision;
        let prev_kv = if self.prev_kv && !is_create && revision > compacted {
            entry_before_revision(revision, change, changes)
                .map(|before| convert::key_value(before.key_value(&change.key)))
        } else {
            None
        };
        Some(mvccpb::Event {
            r#type: kind as i32,
            kv: Some(kv),
            prev_kv,
        })
    }
}

/// The entry `change`'s key had before `revision`, whose `changes` it is
/// one of: its own previous entry, unless an earlier change of the same
/// revision wrote that (then that change's previous entry).
fn entry_before_revision<'a>(
    revision: Revision,
    change: &'a Change,
    changes: &'a [Change],
) -> Option<&'a Entry> {
    let before = change.before.as_ref()?;
    if before.mod_revision != revision {
        return Some(before);
    }
    let first = changes.iter().find(|earlier| earlier.key == change.key);
    first.and_then(|first| first.before.as_ref())
}

#[cfg(test)]
mod tests {
    use chorus::ids::RecordIndex;

    use super::*;

    fn bytes(text: &str) -> Bytes {
        Bytes::copy_from_slice(text.as_bytes())
    }

    fn entry(value: &str, create_revision: Revision, mod_revision: Revision) -> Entry {
        Entry {
            value: bytes(value),
            index: RecordIndex(0),
            create_revision,
            mod_revision,
            version: mod_revision - create_revision + 1,
            lease: 0,
        }
    }

    fn watcher(request: pb::WatchCreateRequest) -> Watcher {
        let range = KeyRange::new(request.key.clone(), request.range_end.clone()).unwrap();
        Watcher::new(0, range, &request, 10)
    }

    #[test]
    fn ranges_follow_etcds_conventions() {
        let single = KeyRange::new(bytes("a"), Bytes::new()).unwrap();
        assert!(single.contains(b"a") && !single.contains(b"a\0"));
        let from = KeyRange::new(bytes("a"), bytes("\0")).unwrap();
        assert!(from.contains(b"zz") && !from.contains(b"\0"));
        let prefix = KeyRange::new(bytes("a"), bytes("b")).unwrap();
        assert!(prefix.contains(b"a/1") && !prefix.contains(b"b"));
        let everything = KeyRange::new(Bytes::new(), bytes("\0")).unwrap();
        assert!(everything.contains(b"\0") && everything.contains(b"zz"));
        assert_eq!(KeyRange::new(bytes("b"), bytes("a")), Err(EMPTY_RANGE));
        assert_eq!(KeyRange::new(bytes("a"), bytes("a")), Err(EMPTY_RANGE));
    }

    #[test]
    fn events_carry_etcds_fields_filters_and_previous_entries() {
        let put = Change {
            key: bytes("k"),
            before: Some(entry("old", 2, 5)),
            after: Some(entry("new", 2, 11)),
        };
        let delete = Change {
            key: bytes("k"),
            before: Some(entry("new", 2, 11)),
            after: None,
        };
        let all = watcher(pb::WatchCreateRequest {
            key: bytes("k"),
            prev_kv: true,
            ..Default::default()
        });
        let events = all.events(11, std::slice::from_ref(&put), 0);
        assert_eq!(events[0].r#type, EventType::Put as i32);
        assert_eq!(events[0].kv.as_ref().unwrap().value, bytes("new"));
        assert_eq!(events[0].prev_kv.as_ref().unwrap().mod_revision, 5);
        // At the compaction revision, the entry before is compacted away.
        assert_eq!(
            all.events(11, std::slice::from_ref(&put), 11)[0].prev_kv,
            None
        );
        let tombstone = &all.events(12, std::slice::from_ref(&delete), 0)[0];
        assert_eq!(tombstone.r#type, EventType::Delete as i32);
        assert_eq!(
            tombstone.kv,
            Some(mvccpb::KeyValue {
                key: bytes("k"),
                mod_revision: 12,
                ..Default::default()
            })
        );
        let no_put = watcher(pb::WatchCreateRequest {
            key: bytes("k"),
            filters: vec![0],
            ..Default::default()
        });
        assert!(no_put.events(11, std::slice::from_ref(&put), 0).is_empty());
        assert_eq!(no_put.events(12, std::slice::from_ref(&delete), 0).len(), 1);
        let no_delete = watcher(pb::WatchCreateRequest {
            key: bytes("k"),
            filters: vec![1],
            ..Default::default()
        });
        assert!(
            no_delete
                .events(12, std::slice::from_ref(&delete), 0)
                .is_empty()
        );
        let other = watcher(pb::WatchCreateRequest {
            key: bytes("j"),
            ..Default::default()
        });
        assert!(other.events(11, &[put], 0).is_empty());
    }

    #[test]
    fn previous_entries_are_the_keys_before_the_revision_not_before_the_operation() {
        // One txn at revision 12: "k" (at 5 before it) put, "j" created,
        // then both deleted by a from-key delete. etcd reads each previous
        // entry at revision 11: "k" as of 5, "j" absent.
        let changes = [
            Change {
                key: bytes("k"),
                before: Some(entry("old", 2, 5)),
                after: Some(entry("new", 2, 12)),
            },
            Change {
                key: bytes("j"),
                before: None,
                after: Some(entry("x", 12, 12)),
            },
            Change {
                key: bytes("j"),
                before: Some(entry("x", 12, 12)),
                after: None,
            },
            Change {
                key: bytes("k"),
                before: Some(entry("new", 2, 12)),
                after: None,
            },
        ];
        let all = watcher(pb::WatchCreateRequest {
            key: bytes("a"),
            range_end: bytes("\0"),
            prev_kv: true,
            ..Default::default()
        });
        let events = all.events(12, &changes, 0);
        let prev_values: Vec<_> = events
            .iter()
            .map(|event| event.prev_kv.as_ref().map(|kv| kv.value.clone()))
            .collect();
        let old = Some(bytes("old"));
        assert_eq!(prev_values, [old.clone(), None, None, old]);
    }

    #[test]
    fn progress_waits_for_delivery_and_the_start_revision() {
        let now = watcher(pb::WatchCreateRequest::default());
        assert!(now.synced(10) && now.caught_up);
        let past = watcher(pb::WatchCreateRequest {
            start_revision: 4,
            ..Default::default()
        });
        assert!(!past.synced(10) && past.behind(10) && !past.caught_up);
        let future = watcher(pb::WatchCreateRequest {
            start_revision: 12,
            ..Default::default()
        });
        assert!(!future.synced(10) && !future.behind(10) && future.caught_up);
        // Not even once every revision up to the store's was delivered.
        assert!(!future.synced(11));
    }
}
