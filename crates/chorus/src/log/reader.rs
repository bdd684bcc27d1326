//! Readers (docs/protocol.md, Readers): read committed records from any index
//! without claiming, fencing or writing anything.
//!
//! A reader serves sealed segments from the directory, then the active
//! segment's *committed* fragments: present and identical on a quorum of
//! replicas, in an unbroken prefix. Recovery keeps every such fragment, so
//! nothing a reader returns can later disappear. It follows rotation into the
//! pending segment when that continues exactly where the tail's committed
//! prefix ends.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::join_all;

use super::LogStores;
use super::error::LogError;
use super::quorum::quorum;
use super::replay::read_sealed_or_truncated;
use super::replica::Replica;
use crate::codec::Fragment;
use crate::ids::{FragmentIndex, RecordIndex, SegmentId};
use crate::register::{Manifest, ManifestStore};

/// Default pause between polls when a reader has caught up.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Register reads one fill may follow the tail through while folds race it.
const MAX_FILL_ROUNDS: usize = 3;

/// The most fragments of an active segment a reader that is behind reads at
/// once. A reader reads one fragment per round trip while it keeps up (one
/// read per poll when caught up) and doubles the window each time every
/// fragment it asked for was there, so a standby far behind a fast writer
/// catches up at up to this many fragments per round trip instead of one.
pub const MAX_READ_AHEAD_FRAGMENTS: u64 = 16;

/// Where scanning of an active segment resumes: fragment `fragment` of
/// `segment` starts at record `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cursor {
    segment: SegmentId,
    fragment: u64,
    first: RecordIndex,
}

/// Reads committed records in index order, starting anywhere at or above the
/// truncation floor.
#[derive(Debug)]
pub struct Reader {
    register: Arc<dyn ManifestStore>,
    replicas: Vec<Replica>,
    next: RecordIndex,
    buffered: VecDeque<(RecordIndex, Bytes)>,
    cursor: Option<Cursor>,
    poll_interval: Duration,
    /// The caller knows every record below its starting index is committed.
    resuming: bool,
    /// Fragments the next scan reads at once (see [`MAX_READ_AHEAD_FRAGMENTS`]).
    read_ahead: u64,
}

impl Reader {
    /// A reader of the log in `stores` whose first record will be `from`.
    pub fn new(stores: &LogStores, from: RecordIndex) -> Reader {
        Reader {
            register: Arc::clone(&stores.register),
            replicas: stores.replicas(),
            next: from,
            buffered: VecDeque::new(),
            cursor: None,
            poll_interval: DEFAULT_POLL_INTERVAL,
            resuming: false,
            read_ahead: 1,
        }
    }

    /// A reader whose first record will be `from`, for a caller that knows
    /// every record below `from` is committed (it applied them, or restored
    /// a snapshot of them). It finds `from` in an active segment in
    /// O(log fragments) quorum reads instead of scanning the segment from
    /// its start: within a committed prefix, fragment starts increase, so
    /// "committed and starting at or before `from`" holds up to the fragment
    /// holding `from` and fails after it.
    pub fn resuming(stores: &LogStores, from: RecordIndex) -> Reader {
        Reader {
            resuming: true,
            ..Reader::new(stores, from)
        }
    }

    /// The first index not known to be committed: the end of the sealed
    /// directory plus the committed prefix of the active segments. Reads the
    /// active segments' data; for maintenance without a writer.
    pub async fn committed_end(stores: &LogStores) -> Result<RecordIndex, LogError> {
        let probe = Reader::new(stores, RecordIndex(0));
        let manifest = probe.read_manifest().await?;
        let mut reader = Reader::new(stores, manifest.tail_base.max(manifest.trunc));
        let mut end = reader.position();
        while let Some((index, _)) = reader.try_next().await? {
            end = RecordIndex(index.0 + 1);
        }
        Ok(end)
    }

    /// Where the committed records end, if the register's floor lies beyond
    /// that end; `None` for a consistent register. The floor may rise into
    /// the active segment (truncation below a snapshot), but only up to the
    /// committed end, so a floor beyond it means the register does not
    /// describe these replicas. Checks the record just below the floor with
    /// the binary search of [`Reader::resuming`], in O(log fragments) reads.
    pub async fn floor_beyond_end(stores: &LogStores) -> Result<Option<RecordIndex>, LogError> {
        let probe = Reader::new(stores, RecordIndex(0));
        let mut manifest = probe.read_manifest().await?;
        for _ in 0..MAX_FILL_ROUNDS {
            if manifest.trunc <= manifest.tail_base {
                return Ok(None);
            }
            let below_floor = RecordIndex(manifest.trunc.0 - 1);
            let mut reader = Reader::resuming(stores, below_floor);
            // Straight to the active segments: the floor check of `fill_from`
            // would refuse an index below the floor.
            reader.fill_active(&manifest).await?;
            if reader
                .buffered
                .front()
                .is_some_and(|(index, _)| *index == below_floor)
            {
                return Ok(None);
            }
            // A writer may have folded the tail (and deleted its fragments)
            // under the scan: judge only against an unchanged register.
            let newer = probe.read_manifest().await?;
            if newer.tail == manifest.tail {
                return Ok(Some(reader.cursor.map_or(manifest.tail_base, |c| c.first)));
            }
            manifest = newer;
        }
        Ok(None)
    }

    /// Sets the pause between polls of [`Reader::next`].
    pub fn with_poll_interval(mut self, interval: Duration) -> Reader {
        self.poll_interval = interval;
        self
    }

    /// The index of the next record this reader returns.
    pub fn position(&self) -> RecordIndex {
        self.next
    }

    /// Records read from the stores and not yet returned. While there are
    /// any, the reader holds their fragment, or their whole sealed segment.
    pub fn buffered_records(&self) -> usize {
        self.buffered.len()
    }

    /// Waits until the next committed record exists and returns it.
    pub async fn next(&mut self) -> Result<(RecordIndex, Bytes), LogError> {
        loop {
            if let Some(record) = self.try_next().await? {
                return Ok(record);
            }
            tokio::time::sleep(self.poll_interval).await;
        }
    }

    /// The next record if it is committed now, `None` if the reader has caught up.
    pub async fn try_next(&mut self) -> Result<Option<(RecordIndex, Bytes)>, LogError> {
        if self.buffered.is_empty() {
            self.fill().await?;
        }
        let record = self.buffered.pop_front();
        if let Some((index, _)) = &record {
            self.next = RecordIndex(index.0 + 1);
        }
        Ok(record)
    }

    async fn fill(&mut self) -> Result<(), LogError> {
        let mut manifest = self.read_manifest().await?;
        for _ in 0..MAX_FILL_ROUNDS {
            self.fill_from(&manifest).await?;
            if !self.buffered.is_empty() || self.next < manifest.tail_base {
                return Ok(());
            }
            // Caught up in the active segments `manifest` names. The writer
            // may have folded the tail and deleted its fragments under the
            // scan; then a newer register holds the rest in its directory.
            let newer = self.read_manifest().await?;
            if newer.tail == manifest.tail {
                return Ok(());
            }
            manifest = newer;
        }
        Ok(())
    }

    async fn fill_from(&mut self, manifest: &Manifest) -> Result<(), LogError> {
        if self.next < manifest.trunc {
            return Err(LogError::Truncated {
                requested: self.next,
                floor: manifest.trunc,
            });
        }
        if self.next < manifest.tail_base {
            return self.fill_sealed(manifest).await;
        }
        self.fill_active(manifest).await
    }

    async fn read_manifest(&self) -> Result<Manifest, LogError> {
        let current = self
            .register
            .read()
            .await?
            .ok_or_else(|| LogError::Transition("register not initialized".into()))?;
        Ok(Manifest::from_fields(&current.fields)?)
    }

    async fn fill_sealed(&mut self, manifest: &Manifest) -> Result<(), LogError> {
        let position = manifest
            .segments
            .iter()
            .rposition(|entry| entry.base <= self.next)
            .expect("the directory covers everything from the floor to tail_base");
        let entry = manifest.segments[position];
        let records =
            read_sealed_or_truncated(&self.replicas, self.register.as_ref(), &entry, self.next)
                .await?;
        let skip = (self.next.0 - entry.base.0) as usize;
        self.buffered = records
            .into_iter()
            .enumerate()
            .skip(skip)
            .map(|(offset, record)| (RecordIndex(entry.base.0 + offset as u64), record))
            .collect();
        Ok(())
    }

    /// Scans the tail's committed fragments, then the pending segment's if
    /// they continue the tail's committed prefix.
    async fn fill_active(&mut self, manifest: &Manifest) -> Result<(), LogError> {
        let mut cursor = match self.cursor {
            Some(cursor)
                if Some(cursor.segment) == manifest.pending || cursor.segment == manifest.tail =>
            {
                cursor
            }
            _ if self.resuming && self.next > manifest.tail_base => {
                self.seek(manifest.tail, manifest.tail_base).await?
            }
            _ => Cursor {
                segment: manifest.tail,
                fragment: 0,
                first: manifest.tail_base,
            },
        };
        loop {
            self.scan(&mut cursor).await?;
            let into_pending = cursor.segment == manifest.tail && manifest.pending.is_some();
            if !self.buffered.is_empty() || !into_pending {
                break;
            }
            let pending = manifest.pending.expect("checked");
            let candidate = Cursor {
                segment: pending,
                fragment: 0,
                first: cursor.first,
            };
            match self.committed_fragment(pending, FragmentIndex(0)).await? {
                Some(fragment) if first_record(&fragment) == cursor.first => cursor = candidate,
                _ => break,
            }
        }
        self.cursor = Some(cursor);
        Ok(())
    }

    /// The cursor at the last committed fragment of `segment` (based at
    /// `base`) that starts at or before `self.next`, found by binary search;
    /// see [`Reader::resuming`] for why the search is sound there.
    async fn seek(&self, segment: SegmentId, base: RecordIndex) -> Result<Cursor, LogError> {
        let mut found = Cursor {
            segment,
            fragment: 0,
            first: base,
        };
        // Every fragment holds at least one record, so the one holding
        // `next` is at most `next - base`.
        let (mut low, mut high) = (0u64, self.next.0 - base.0);
        while low <= high {
            let middle = low + (high - low) / 2;
            match self
                .committed_fragment(segment, FragmentIndex(middle))
                .await?
            {
                Some(fragment) if first_record(&fragment) <= self.next => {
                    found = Cursor {
                        segment,
                        fragment: middle,
                        first: first_record(&fragment),
                    };
                    low = middle + 1;
                }
                _ if middle == 0 => break,
                _ => high = middle - 1,
            }
        }
        Ok(found)
    }

    /// Buffers records from committed fragments at the cursor, advancing it.
    async fn scan(&mut self, cursor: &mut Cursor) -> Result<(), LogError> {
        loop {
            let window = self.read_ahead;
            let reads = join_all((0..window).map(|ahead| {
                self.committed_fragment(cursor.segment, FragmentIndex(cursor.fragment + ahead))
            }))
            .await;
            let mut found = 0;
            for read in reads {
                let fragment = match read {
                    Ok(Some(fragment)) => fragment,
                    Ok(None) => break,
                    // A fragment past the first is read again from the
                    // cursor by the next scan, which reports its error.
                    Err(error) if found == 0 => return Err(error),
                    Err(_) => break,
                };
                let Fragment::Data { first, records, .. } = fragment else {
                    unreachable!("committed fragments hold data");
                };
                if first != cursor.first {
                    if found > 0 {
                        break;
                    }
                    return Err(LogError::corrupt(
                        format!("segment {} fragment {}", cursor.segment, cursor.fragment),
                        format!("starts at record {first}, expected {}", cursor.first),
                    ));
                }
                found += 1;
                cursor.fragment += 1;
                cursor.first = RecordIndex(first.0 + records.len() as u64);
                for (offset, record) in records.into_iter().enumerate() {
                    let index = RecordIndex(first.0 + offset as u64);
                    if index >= self.next {
                        self.buffered.push_back((index, record));
                    }
                }
            }
            self.read_ahead = match found == window {
                true => (window * 2).min(MAX_READ_AHEAD_FRAGMENTS),
                false => 1,
            };
            if found < window || !self.buffered.is_empty() {
                return Ok(());
            }
        }
    }

    /// The fragment at `index` if a quorum of replicas holds identical valid
    /// data copies of it written by the segment's own epoch.
    async fn committed_fragment(
        &self,
        segment: SegmentId,
        index: FragmentIndex,
    ) -> Result<Option<Fragment>, LogError> {
        let reads = join_all(
            self.replicas
                .iter()
                .map(|r| r.read_fragment(segment, index)),
        )
        .await;
        let copies: Vec<Fragment> = reads
            .into_iter()
            .filter_map(|read| match read {
                Ok(Some(Ok(fragment @ Fragment::Data { .. })))
                    if fragment.epoch() == segment.epoch =>
                {
                    Some(fragment)
                }
                _ => None,
            })
            .collect();
        let needed = quorum(self.replicas.len());
        Ok(copies
            .iter()
            .find(|candidate| copies.iter().filter(|c| c == candidate).count() >= needed)
            .cloned())
    }
}

fn first_record(fragment: &Fragment) -> RecordIndex {
    match fragment {
        Fragment::Data { first, .. } => *first,
        Fragment::Fence { .. } => RecordIndex(u64::MAX),
    }
}
