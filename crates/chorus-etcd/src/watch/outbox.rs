//! A watch stream's send buffer: the responses made but not yet taken by
//! the gRPC layer, counted in encoded bytes, so the stream can stop making
//! more once a client stops reading.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use prost::Message;
use tokio::sync::{Notify, mpsc};
use tonic::Status;
use tonic::codegen::tokio_stream::Stream;

use crate::proto::etcdserverpb as pb;

/// One queued item: its charged bytes and the response (or the status that
/// ends the stream).
type Item = (usize, Result<pb::WatchResponse, Status>);

/// What the stream's task and the gRPC layer share.
#[derive(Debug)]
struct Pending {
    /// Bytes queued on this stream.
    bytes: AtomicUsize,
    /// Responses taken so far: a stalled client takes none.
    taken: AtomicU64,
    /// Signalled whenever a response is taken.
    drained: Notify,
    /// Bytes queued on every stream of the service.
    service_bytes: Arc<AtomicUsize>,
}

/// The producing end, owned by the stream's task.
#[derive(Debug)]
pub(crate) struct Outbox {
    sender: mpsc::UnboundedSender<Item>,
    pending: Arc<Pending>,
    budget_bytes: usize,
}

/// The consuming end, handed to tonic as the response stream.
#[derive(Debug)]
pub(crate) struct ResponseStream {
    receiver: mpsc::UnboundedReceiver<Item>,
    pending: Arc<Pending>,
}

impl Outbox {
    /// A buffer that counts as full from `budget_bytes` on, adding its
    /// bytes to `service_bytes` too.
    pub(crate) fn new(
        budget_bytes: usize,
        service_bytes: Arc<AtomicUsize>,
    ) -> (Outbox, ResponseStream) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let pending = Arc::new(Pending {
            bytes: AtomicUsize::new(0),
            taken: AtomicU64::new(0),
            drained: Notify::new(),
            service_bytes,
        });
        let outbox = Outbox {
            sender,
            pending: Arc::clone(&pending),
            budget_bytes,
        };
        (outbox, ResponseStream { receiver, pending })
    }

    /// Queues `response` whatever the fill (the caller checks
    /// [`is_full`](Outbox::is_full) between revisions).
    pub(crate) fn push(&self, response: pb::WatchResponse) {
        let bytes = response.encoded_len();
        self.queue(bytes, Ok(response));
    }

    /// Queues the status that ends the stream after what is queued.
    pub(crate) fn fail(&self, status: Status) {
        self.queue(0, Err(status));
    }

    fn queue(&self, bytes: usize, item: Result<pb::WatchResponse, Status>) {
        self.pending.add(bytes);
        if self.sender.send((bytes, item)).is_err() {
            // The client is gone: nothing will take it.
            self.pending.remove(bytes);
        }
    }

    /// Whether the buffer holds its budget or more.
    pub(crate) fn is_full(&self) -> bool {
        self.pending.bytes.load(Ordering::Acquire) >= self.budget_bytes
    }

    /// The bytes queued now.
    pub(crate) fn bytes(&self) -> usize {
        self.pending.bytes.load(Ordering::Acquire)
    }

    /// How many responses the gRPC layer took so far.
    pub(crate) fn taken(&self) -> u64 {
        self.pending.taken.load(Ordering::Acquire)
    }

    /// Resolves once a response is taken (or was taken since the last call).
    pub(crate) async fn drained(&self) {
        self.pending.drained.notified().await;
    }

    /// Resolves once the client is gone (the response stream dropped).
    pub(crate) async fn closed(&self) {
        self.sender.closed().await;
    }
}

impl Pending {
    fn add(&self, bytes: usize) {
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
        self.service_bytes.fetch_add(bytes, Ordering::AcqRel);
    }

    fn remove(&self, bytes: usize) {
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
        self.service_bytes.fetch_sub(bytes, Ordering::AcqRel);
    }
}

impl Stream for ResponseStream {
    type Item = Result<pb::WatchResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.receiver.poll_recv(cx);
        if let Poll::Ready(Some((bytes, _))) = &polled {
            self.pending.remove(*bytes);
            self.pending.taken.fetch_add(1, Ordering::AcqRel);
            self.pending.drained.notify_one();
        }
        polled.map(|item| item.map(|(_, response)| response))
    }
}

impl Drop for ResponseStream {
    fn drop(&mut self) {
        // Uncount what will never be taken; later pushes fail and uncount
        // themselves.
        self.receiver.close();
        while let Ok((bytes, _)) = self.receiver.try_recv() {
            self.pending.remove(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::codegen::tokio_stream::StreamExt;

    fn response(watch_id: i64) -> pb::WatchResponse {
        pb::WatchResponse {
            watch_id,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn bytes_are_counted_until_taken_or_dropped() {
        let service = Arc::new(AtomicUsize::new(0));
        let (outbox, mut stream) = Outbox::new(4, Arc::clone(&service));
        outbox.push(response(7));
        assert_eq!(outbox.bytes(), 2);
        assert!(!outbox.is_full());
        outbox.push(response(8));
        assert!(outbox.is_full());
        assert_eq!(service.load(Ordering::Acquire), 4);
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!((first.watch_id, outbox.bytes(), outbox.taken()), (7, 2, 1));
        // Signalled once taken: a waiter does not hang.
        outbox.drained().await;
        drop(stream);
        assert_eq!((outbox.bytes(), service.load(Ordering::Acquire)), (0, 0));
        outbox.push(response(9));
        assert_eq!(service.load(Ordering::Acquire), 0);
        outbox.closed().await;
    }
}
