//! Bounds, in bytes and in counts, on the memory that reads and streams
//! hold: how many event streams are open at once, how large a
//! `GET /v1/log` or `GET /v1/kv` page grows, and how many pages of each are
//! built and sent at once.
//!
//! Without them memory was bounded by record counts only: one page of
//! 10,000 records of 1 MiB rendered as JSON (base64, then the body) took
//! over a gigabyte, and every watch or `follow` stream held its batch, its
//! log reader's buffer and its store polling for as long as it stayed open,
//! with no limit on how many did.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// Event streams (`GET /v1/kv/watch`, `GET /v1/log?follow=true`) open at
/// once unless configured otherwise (further bounded by [`stream_cap`]).
pub const DEFAULT_MAX_STREAMS: usize = 256;
/// Streams may take at most 1/this of the connection cap, so that requests
/// other than streams (writes, reads, status, the readiness probe) always
/// find a connection.
pub const STREAM_SHARE_DIVISOR: usize = 2;
/// Default bound on a `GET /v1/log` page's rendered JSON, which it exceeds
/// by less than one record. Smaller pages cost less memory and more
/// requests; a page inside a sealed segment reads that whole segment
/// (64 MiB by default), so much smaller pages multiply the reads of it.
pub const DEFAULT_LOG_PAGE_BYTES: usize = 16 << 20;
/// Default number of `GET /v1/log` pages built and sent at once; a page
/// request beyond them waits for one, bounded by the request timeout.
pub const DEFAULT_MAX_LOG_PAGES: usize = 4;
/// Default bound on a `GET /v1/kv` page's rendered JSON, which it exceeds
/// by less than one item: 1,000 values of 1 MiB rendered about 1.4 GiB.
pub const DEFAULT_LIST_PAGE_BYTES: usize = 16 << 20;
/// Default number of `GET /v1/kv` pages built and sent at once; a list
/// beyond them waits for one, bounded by the request timeout.
pub const DEFAULT_MAX_LIST_PAGES: usize = 4;
/// Default bound on what `follow` streams' log readers hold at once: a
/// reader holds up to one sealed segment (64 MiB by default), so 8 of them.
pub const DEFAULT_FOLLOW_BUFFER_BYTES: u64 = 512 << 20;
/// A page body is handed to the connection in pieces of this size, so that
/// the page's permit is held until its last piece was taken.
pub const LOG_PAGE_CHUNK_BYTES: usize = 64 << 10;

const _: () = assert!(LOG_PAGE_CHUNK_BYTES <= DEFAULT_LOG_PAGE_BYTES);
const _: () = assert!(LOG_PAGE_CHUNK_BYTES <= DEFAULT_LIST_PAGE_BYTES);
const _: () = assert!(
    STREAM_SHARE_DIVISOR >= 2,
    "streams leave connections for requests"
);

/// How the service bounds the memory of its reads and streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimits {
    /// Most event streams open at once; one more is answered `503` with
    /// `Retry-After`.
    pub max_streams: usize,
    /// Bound on the rendered bytes of one `GET /v1/log` page: records are
    /// added until the page reaches it (the first record always goes in),
    /// and `next` tells the client where to continue.
    pub log_page_bytes: usize,
    /// Most `GET /v1/log` pages built or being sent at once.
    pub max_log_pages: usize,
    /// Bound on the rendered bytes of one `GET /v1/kv` page: items are
    /// added until the page reaches it (the first item always goes in), and
    /// `next` tells the client where to continue.
    pub list_page_bytes: usize,
    /// Most `GET /v1/kv` pages built or being sent at once.
    pub max_list_pages: usize,
    /// Bound on what the log readers of `follow` streams hold at once. A
    /// reader may hold a whole sealed segment, so this many bytes make
    /// [`follow_reader_slots`] slots: a follower takes one before its reader
    /// reads and gives it back once the reader holds no record.
    pub follow_buffer_bytes: u64,
}

impl Default for MemoryLimits {
    fn default() -> MemoryLimits {
        MemoryLimits {
            max_streams: DEFAULT_MAX_STREAMS,
            log_page_bytes: DEFAULT_LOG_PAGE_BYTES,
            max_log_pages: DEFAULT_MAX_LOG_PAGES,
            list_page_bytes: DEFAULT_LIST_PAGE_BYTES,
            max_list_pages: DEFAULT_MAX_LIST_PAGES,
            follow_buffer_bytes: DEFAULT_FOLLOW_BUFFER_BYTES,
        }
    }
}

/// The stream cap for `requested` streams under a cap of `connections`:
/// at most 1/[`STREAM_SHARE_DIVISOR`] of the connections, never below 1.
pub fn stream_cap(requested: usize, connections: usize) -> usize {
    requested.min(connections / STREAM_SHARE_DIVISOR).max(1)
}

/// How many `follow` readers may hold records at once under a budget of
/// `buffer_bytes` when a reader holds up to `segment_bytes` (one sealed
/// segment): never below 1, so followers are slow rather than refused.
pub fn follow_reader_slots(buffer_bytes: u64, segment_bytes: u64) -> usize {
    let slots = buffer_bytes / segment_bytes.max(1);
    usize::try_from(slots).unwrap_or(usize::MAX).max(1)
}

/// Whether a page of `records` records rendered in `bytes` bytes takes one
/// more under bounds of `max_records` and `max_bytes`. The first record
/// always goes in (a record is larger than a small budget), so a page
/// exceeds `max_bytes` by less than one rendered record.
pub fn page_has_room(records: usize, bytes: usize, max_records: usize, max_bytes: usize) -> bool {
    records < max_records && (records == 0 || bytes < max_bytes)
}

/// The permits behind [`MemoryLimits`], shared by every handler.
#[derive(Debug, Clone)]
pub struct Permits {
    limits: MemoryLimits,
    streams: Arc<Semaphore>,
    log_pages: Arc<Semaphore>,
    list_pages: Arc<Semaphore>,
    follow_readers: Arc<Semaphore>,
}

impl Permits {
    /// Permits for `limits` over a log whose sealed segments are at most
    /// `segment_bytes` (what one `follow` reader may hold).
    pub fn new(limits: MemoryLimits, segment_bytes: u64) -> Permits {
        assert!(limits.max_streams > 0, "max_streams must be at least 1");
        assert!(limits.max_log_pages > 0, "max_log_pages must be at least 1");
        assert!(
            limits.log_page_bytes > 0,
            "log_page_bytes must be at least 1"
        );
        assert!(
            limits.max_list_pages > 0,
            "max_list_pages must be at least 1"
        );
        assert!(
            limits.list_page_bytes > 0,
            "list_page_bytes must be at least 1"
        );
        Permits {
            limits,
            streams: Arc::new(Semaphore::new(limits.max_streams)),
            log_pages: Arc::new(Semaphore::new(limits.max_log_pages)),
            list_pages: Arc::new(Semaphore::new(limits.max_list_pages)),
            follow_readers: Arc::new(Semaphore::new(follow_reader_slots(
                limits.follow_buffer_bytes,
                segment_bytes,
            ))),
        }
    }

    /// The limits these permits enforce.
    pub fn limits(&self) -> &MemoryLimits {
        &self.limits
    }

    /// A place for one more event stream, held for as long as the stream
    /// is open; `503` when every place is taken.
    pub fn stream(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        Arc::clone(&self.streams)
            .try_acquire_owned()
            .map_err(|_| ApiError::too_many_streams(self.limits.max_streams))
    }

    /// A place for one `GET /v1/log` page, held until its body was sent;
    /// waits for one (the request timeout bounds the wait).
    pub async fn log_page(&self) -> OwnedSemaphorePermit {
        Arc::clone(&self.log_pages)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    /// A place for one `GET /v1/kv` page, held until its body was sent;
    /// waits for one (the request timeout bounds the wait).
    pub async fn list_page(&self) -> OwnedSemaphorePermit {
        Arc::clone(&self.list_pages)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    /// A slot for one `follow` stream's log reader to read and hold
    /// records, to be dropped once it holds none; waits for one (the
    /// stream stays open meanwhile, sending keep-alives).
    pub async fn follow_reader(&self) -> OwnedSemaphorePermit {
        Arc::clone(&self.follow_readers)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    /// Event streams open now.
    pub fn streams_open(&self) -> usize {
        self.limits.max_streams - self.streams.available_permits()
    }
}

/// A rendered page as a response body that holds `place` until its last
/// piece was handed to the connection (or the connection closed). The
/// body goes out in pieces of [`LOG_PAGE_CHUNK_BYTES`], so the permit is
/// released when the client took the page, not when it was rendered.
pub fn held_body(body: Vec<u8>, place: OwnedSemaphorePermit) -> Body {
    let body = Bytes::from(body);
    let pieces: Vec<Bytes> = (0..body.len())
        .step_by(LOG_PAGE_CHUNK_BYTES)
        .map(|start| body.slice(start..body.len().min(start + LOG_PAGE_CHUNK_BYTES)))
        .collect();
    let pieces = futures::stream::iter(pieces).map(move |piece| {
        let _held = &place;
        Ok::<_, Infallible>(piece)
    });
    Body::from_stream(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn the_stream_cap_leaves_connections_for_requests() {
        assert_eq!(stream_cap(256, 4096), 256);
        assert_eq!(stream_cap(256, 128), 64);
        assert_eq!(stream_cap(10, 128), 10);
        assert_eq!(stream_cap(256, 1), 1);
        assert_eq!(stream_cap(0, 4096), 1);
    }

    #[test]
    fn a_page_stops_at_its_byte_budget_or_its_record_limit() {
        assert!(page_has_room(0, 0, 10, 100));
        assert!(
            page_has_room(0, 0, 10, 0),
            "the first record always goes in"
        );
        assert!(page_has_room(3, 99, 10, 100));
        assert!(!page_has_room(3, 100, 10, 100), "the budget is reached");
        assert!(
            !page_has_room(10, 5, 10, 100),
            "the record limit is reached"
        );
        // A page of 1 MiB records under a 16 MiB budget, each rendered in
        // about 4/3 of its bytes: cut after 13 records, not 10,000.
        let rendered = (1 << 20) * 4 / 3;
        let mut records = 0;
        while page_has_room(records, records * rendered, 10_000, DEFAULT_LOG_PAGE_BYTES) {
            records += 1;
        }
        assert_eq!(records, 13);
        assert!(records * rendered < DEFAULT_LOG_PAGE_BYTES + rendered);
    }

    #[test]
    fn follow_readers_are_bounded_by_bytes_not_by_streams() {
        const MIB: u64 = 1 << 20;
        assert_eq!(
            follow_reader_slots(DEFAULT_FOLLOW_BUFFER_BYTES, 64 * MIB),
            8
        );
        assert_eq!(follow_reader_slots(100 * MIB, 64 * MIB), 1);
        assert_eq!(follow_reader_slots(MIB, 64 * MIB), 1, "never none");
        assert_eq!(follow_reader_slots(1 << 30, 4 * MIB), 256);
        assert_eq!(follow_reader_slots(1, 0), 1);
    }

    #[tokio::test]
    async fn a_follower_waits_for_a_reader_slot_until_one_is_given_back() {
        let limits = MemoryLimits {
            follow_buffer_bytes: 128,
            ..MemoryLimits::default()
        };
        let permits = Permits::new(limits, 64);
        let first = permits.follow_reader().await;
        let _second = permits.follow_reader().await;
        let third = tokio::spawn({
            let permits = permits.clone();
            async move { permits.follow_reader().await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!third.is_finished(), "two slots of 64 bytes in 128");
        drop(first);
        let _third = third.await.unwrap();
    }

    #[test]
    fn streams_beyond_the_cap_are_refused_until_one_closes() {
        let permits = Permits::new(
            MemoryLimits {
                max_streams: 2,
                ..MemoryLimits::default()
            },
            64 << 20,
        );
        let first = permits.stream().unwrap();
        let _second = permits.stream().unwrap();
        assert_eq!(permits.streams_open(), 2);
        let refused = permits.stream().unwrap_err();
        assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.message, "too many streams: max_streams=2");
        drop(first);
        assert!(permits.stream().is_ok());
    }
}
