//! The connections the etcd listener serves: at most
//! [`EtcdConfig::max_connections`](crate::EtcdConfig::max_connections) at
//! once, each with Nagle's algorithm off.
//!
//! A connection holds a permit until it closes; while none is free the
//! listener accepts nothing, so further clients wait in the kernel's listen
//! backlog instead of each costing a descriptor (the stores need theirs:
//! the lease refresh reaches them through sockets and files). Nagle's
//! algorithm is off as on etcd's (Go's) connections: otherwise a small
//! answer (a put's, a watch event) written while an earlier one is
//! unacknowledged waits for the client's delayed ACK, up to 40 ms on Linux.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Pause after a failed accept (out of descriptors, say), so the loop
/// neither spins nor ends the server.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// An accepted connection, holding its place under the cap until dropped.
#[derive(Debug)]
pub(crate) struct Admitted {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
}

/// The connections accepted on `listener`, at most `max` open at once.
pub(crate) fn admitted(
    listener: TcpListener,
    max: usize,
) -> impl Stream<Item = io::Result<Admitted>> {
    let permits = Arc::new(Semaphore::new(max.max(1)));
    futures::stream::unfold((listener, permits), |(listener, permits)| async move {
        let permit = Arc::clone(&permits)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        loop {
            match listener.accept().await {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    let admitted = Admitted {
                        stream,
                        _permit: permit,
                    };
                    return Some((Ok(admitted), (listener, permits)));
                }
                Err(error) => {
                    tracing::warn!(%error, "accepting an etcd connection failed; pausing");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            }
        }
    })
}

impl Connected for Admitted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Admitted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    /// A listener on a free loopback port, its address and its admitted
    /// connections (at most `max`).
    async fn capped(
        max: usize,
    ) -> (
        std::net::SocketAddr,
        Pin<Box<impl Stream<Item = io::Result<Admitted>>>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        (address, Box::pin(admitted(listener, max)))
    }

    #[tokio::test]
    async fn accepted_connections_have_nagles_algorithm_off() {
        let (address, mut accepted) = capped(4).await;
        let _client = TcpStream::connect(address).await.unwrap();
        let connection = accepted.next().await.unwrap().unwrap();
        assert!(connection.stream.nodelay().unwrap());
    }

    #[tokio::test]
    async fn past_the_cap_a_connection_waits_until_one_closes() {
        let (address, mut accepted) = capped(1).await;
        let _first_client = TcpStream::connect(address).await.unwrap();
        let first = accepted.next().await.unwrap().unwrap();
        // The second client's connect completes in the kernel's backlog,
        // but the listener takes nothing while the one permit is held.
        let _second_client = TcpStream::connect(address).await.unwrap();
        let waiting = tokio::time::timeout(Duration::from_millis(200), accepted.next()).await;
        assert!(waiting.is_err(), "a second connection was admitted");
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(20), accepted.next())
            .await
            .expect("admitted once the first closed");
        assert!(second.unwrap().is_ok());
    }
}
