//! Accepting connections with the bounds a public listener needs and
//! `axum::serve` does not set: a cap on connections served at once, a
//! timeout on reading a request's header (which also ends idle keep-alive
//! connections), answers to clients that half-closed their side, and a
//! graceful shutdown whose drain is bounded; TLS, when configured, inside
//! those bounds.
//!
//! Without them, slow or silent clients hold descriptors without limit: the
//! process then fails its own store calls (the lease refresh among them)
//! with "too many open files", and one client that stopped reading an event
//! stream keeps a graceful shutdown (the final snapshot, the lease release)
//! from ever finishing.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::send_timeout::{DEFAULT_SEND_TIMEOUT, SendTimeout};

/// Connections served at once unless configured otherwise (further bounded
/// by [`connection_cap`]).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default bound on reading a request's header, and on a keep-alive
/// connection idle between requests.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default bound on the drain at shutdown: how long requests and streams in
/// flight may take to finish before their connections are closed.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Connections may take at most 1/this of the process's descriptor limit;
/// the rest stays for the stores (sockets to object stores and the
/// register, files of local stores), which the lease refresh needs.
pub const DESCRIPTOR_SHARE_DIVISOR: u64 = 2;
/// The cap never goes below this, however low the descriptor limit: a
/// service that accepts nothing is no safer.
pub const MIN_CONNECTIONS: usize = 8;
/// Pause after a failed accept (out of descriptors, for instance), so the
/// loop neither spins nor gives up.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// How the listener bounds its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections served at once; further clients wait in the
    /// kernel's listen backlog until one closes.
    pub max_connections: usize,
    /// Bound on receiving a request's whole header, from the moment the
    /// connection is ready for it (so also on an idle keep-alive
    /// connection); the connection is closed after it.
    pub header_read_timeout: Duration,
    /// Bound on an answer that makes no progress: once the client took no
    /// byte of it for this long, the connection is closed and everything
    /// the answer held (page permits, stream places, buffers) released.
    pub send_timeout: Duration,
    /// Bound on the drain at shutdown; connections still open after it are
    /// closed, so the runtime can publish its final snapshot and release
    /// the lease.
    pub shutdown_grace: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            max_connections: connection_cap(DEFAULT_MAX_CONNECTIONS, descriptor_limit()),
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            send_timeout: DEFAULT_SEND_TIMEOUT,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        }
    }
}

/// The connection cap for `requested` connections under a descriptor limit
/// of `descriptors` (`None`: unknown or unlimited): at most
/// 1/[`DESCRIPTOR_SHARE_DIVISOR`] of the descriptors, never below
/// [`MIN_CONNECTIONS`].
pub fn connection_cap(requested: usize, descriptors: Option<u64>) -> usize {
    let share = descriptors.map_or(usize::MAX, |limit| {
        usize::try_from(limit / DESCRIPTOR_SHARE_DIVISOR).unwrap_or(usize::MAX)
    });
    requested.min(share).max(MIN_CONNECTIONS)
}

/// The process's soft limit on open file descriptors (`RLIMIT_NOFILE`), or
/// `None` when it is unlimited or cannot be read.
pub fn descriptor_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only into the struct it is given.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    // `rlim_t` is `u64` on Linux, not on every platform.
    #[allow(clippy::unnecessary_cast)]
    let soft = limit.rlim_cur as u64;
    (read == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(soft)
}

/// Serves `router` on `listener` within `limits` until `shutdown`
/// resolves; then stops accepting, lets requests in flight finish for at
/// most [`ConnectionLimits::shutdown_grace`], and closes what is left.
///
/// With `tls`, each connection's handshake runs in its own task under the
/// connection's permit and within the header read timeout, so a client that
/// never finishes one holds a place in the cap for that long at most and
/// delays no other client.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // A client that sent its whole request and shut down its write side
        // still gets the answer; without this the request was dropped at
        // the end of file, possibly after its write was admitted.
        .half_close(true);
    // Not `pipeline_flush`: it answers a pipelining client's requests in one
    // write rather than one each (2 to 2.5 times the gets per second for
    // such a client in `bench kv --pipeline-gets`), but it holds back every
    // byte while the client's next request waits in the read buffer, so a
    // watch followed by a pipelined request would never deliver an event,
    // and the events would pile up in memory.
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        while connections.try_join_next().is_some() {}
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => {
                permit.expect("the semaphore is never closed")
            }
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "accepting a connection failed; pausing");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let stream = SendTimeout::new(stream, limits.send_timeout);
        let connection = Connection {
            builder: builder.clone(),
            service: TowerToHyperService::new(router.clone()),
            watcher: graceful.watcher(),
        };
        let tls = tls.clone();
        let handshake_timeout = limits.header_read_timeout;
        connections.spawn(async move {
            match tls {
                None => connection.serve(stream).await,
                Some(tls) => {
                    match tokio::time::timeout(handshake_timeout, tls.accept(stream)).await {
                        Ok(Ok(stream)) => connection.serve(stream).await,
                        Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
                        Err(_) => tracing::debug!("TLS handshake timed out"),
                    }
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    drain(graceful, connections, limits.shutdown_grace).await;
    Ok(())
}

/// What serving one accepted connection takes.
struct Connection {
    builder: http1::Builder,
    service: TowerToHyperService<Router>,
    watcher: Watcher,
}

impl Connection {
    /// Serves HTTP/1.1 on `stream` until the client or a shutdown ends it.
    async fn serve<S>(self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let connection = self
            .builder
            .serve_connection(TokioIo::new(stream), self.service);
        if let Err(error) = self.watcher.watch(connection).await {
            // Header timeouts, resets and parse errors end only this
            // connection.
            tracing::debug!(%error, "connection ended with an error");
        }
    }
}

/// Asks every connection to finish its request in flight and close, waits
/// at most `grace`, then closes the connections still open.
async fn drain(graceful: GracefulShutdown, mut connections: JoinSet<()>, grace: Duration) {
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            open = connections.len(),
            grace_ms = grace.as_millis() as u64,
            "connections still open after the shutdown grace; closing them"
        );
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_cap_leaves_descriptors_for_the_stores() {
        assert_eq!(connection_cap(4096, None), 4096);
        assert_eq!(connection_cap(4096, Some(20_000)), 4096);
        assert_eq!(connection_cap(4096, Some(256)), 128);
        assert_eq!(connection_cap(100, Some(256)), 100);
        assert_eq!(connection_cap(4096, Some(4)), MIN_CONNECTIONS);
        assert_eq!(connection_cap(0, None), MIN_CONNECTIONS);
    }

    #[test]
    fn the_descriptor_limit_is_read() {
        // Every test runner has some limit, and it is not zero.
        assert!(descriptor_limit().is_none_or(|limit| limit > 0));
    }
}
