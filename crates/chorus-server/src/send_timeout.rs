//! The send timeout: a connection whose answer makes no progress (the
//! client stopped reading, the buffers between us are full) for the
//! configured interval fails, which drops its response, and with it every
//! permit and buffer the response held (a log page and its permit, a
//! stream's place and its batch, a follower's reader).
//!
//! Without it a client that asks for a large answer and never reads it
//! holds its connection, and whatever the answer holds, for as long as it
//! stays connected: four such clients held every `GET /v1/log` page permit.
//!
//! The bound is on progress, not on the whole answer: every byte the socket
//! takes restarts it, so a slow client on a slow link is served, and an idle
//! stream (nothing to send) is never timed out.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// Default bound on a response that makes no progress.
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection `S` whose writes fail with [`io::ErrorKind::TimedOut`] once
/// none of them could proceed for `timeout`.
#[derive(Debug)]
pub struct SendTimeout<S> {
    inner: S,
    timeout: Duration,
    /// Running while a write waits for room: since the first write that
    /// could not proceed.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> SendTimeout<S> {
    /// `inner`, its writes bounded by `timeout` without progress.
    pub fn new(inner: S, timeout: Duration) -> SendTimeout<S> {
        SendTimeout {
            inner,
            timeout,
            stalled: None,
        }
    }

    /// The connection inside.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Maps a write's poll: progress (or an error) stops the stall clock; a
    /// write that waits starts it, and fails once it ran out. The clock's
    /// waker is the writer's, so a stalled writer is woken to see it fail.
    fn progress<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if let Poll::Ready(result) = poll {
            self.stalled = None;
            return Poll::Ready(result);
        }
        let timeout = self.timeout;
        let clock = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        ready!(clock.as_mut().poll(cx));
        metrics::counter!("chorus_http_send_timeouts_total").increment(1);
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "send timeout: the client took nothing for send_timeout_ms={}",
                timeout.as_millis()
            ),
        )))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for SendTimeout<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SendTimeout<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.progress(cx, poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.progress(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_flush(cx);
        this.progress(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.progress(cx, poll)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const TIMEOUT: Duration = Duration::from_secs(1);

    /// A writer into a pipe of 16 bytes whose reader reads nothing.
    fn stalled_pipe() -> (
        SendTimeout<tokio::io::DuplexStream>,
        tokio::io::DuplexStream,
    ) {
        let (ours, theirs) = tokio::io::duplex(16);
        (SendTimeout::new(ours, TIMEOUT), theirs)
    }

    #[tokio::test]
    async fn a_write_that_makes_no_progress_fails_after_the_timeout() {
        let (mut writer, _reader) = stalled_pipe();
        let started = std::time::Instant::now();
        let error = writer.write_all(&[7; 64]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(
            error.to_string().contains("send_timeout_ms=1000"),
            "{error}"
        );
        assert!(started.elapsed() >= TIMEOUT);
    }

    #[tokio::test]
    async fn every_byte_taken_restarts_the_clock() {
        let (mut writer, mut reader) = stalled_pipe();
        // The reader takes 16 bytes every 100 ms: the whole write takes
        // over three times the timeout, but no wait for room comes near it.
        const BYTES: usize = 512;
        let slow_reader = tokio::spawn(async move {
            let mut taken = Vec::new();
            let mut piece = [0; 16];
            while taken.len() < BYTES {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let read = reader.read(&mut piece).await.unwrap();
                taken.extend_from_slice(&piece[..read]);
            }
            taken
        });
        let started = std::time::Instant::now();
        writer.write_all(&[7; BYTES]).await.unwrap();
        assert_eq!(slow_reader.await.unwrap(), vec![7; BYTES]);
        assert!(started.elapsed() > 3 * TIMEOUT);
    }
}
