//! `chorus serve`: the key-value service over the runtime, on the embedded
//! default (no configuration) or on the configured stores.
//!
//! Startup creates the log if the register has none yet, opens the snapshot
//! and lease store, starts the runtime (which boots as primary, or stands by
//! while another process holds the lease), and serves HTTP and etcd's v3
//! gRPC API (`--etcd-listen`, 127.0.0.1:2379 by default). SIGTERM, SIGINT
//! or SIGHUP shuts down gracefully: the listeners close and requests in
//! flight finish (for at most `--shutdown-grace-secs`, then their
//! connections are closed), then the runtime drains, publishes a final
//! snapshot and releases the lease. A second signal exits at once.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chorus::blob::LatencyStore;
use chorus::clock::SystemClock;
use chorus::kv::{KvState, Retention, idempotency};
use chorus::lease::{HolderId, LeaseConfig, LeaseStore};
use chorus::log::{HedgeAfter, LogConfig};
use chorus::runtime::{
    DEFAULT_HISTORY_BYTES, DEFAULT_HISTORY_RECORDS, Role, Runtime, RuntimeConfig, RuntimeStores,
};
use chorus::snapshot::{SnapshotConfig, SnapshotStore};
use chorus_etcd::watch::{self as etcd_watch, WatchConfig};
use chorus_etcd::{
    DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TXN_OPS, DEFAULT_QUOTA_BACKEND_BYTES, EtcdConfig,
    EtcdService, EtcdTls, PeerTls,
};
use chorus_server::limits::{self, MemoryLimits};
use chorus_server::listener::{self, ConnectionLimits};
use chorus_server::tls::{TlsFiles, TlsMaterial};
use chorus_server::{AppState, ServiceConfig};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::CommandError;
use crate::config::{DatabaseArgs, DatabaseLocation, Location, StoreArgs};
use crate::lease_cmd::{hostname, open_for_write};
use crate::log_cmd::create_log;
use crate::open::{Access, open_log};
use crate::output::outln;
use chorus::register::DEFAULT_WINDOW;

/// Arguments of `chorus serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    store: StoreArgs,

    /// Store URL holding <db>/HEAD.json, <db>/snapshots/ and <db>/lease.json
    /// [default: file://<data dir>/snapshots-store].
    #[arg(long, env = "CHORUS_SNAPSHOT_STORE")]
    snapshot_store: Option<String>,

    /// Database name inside the snapshot store [default: default].
    #[arg(long, env = "CHORUS_DB")]
    db: Option<String>,

    /// Address to listen on.
    #[arg(long, env = "CHORUS_LISTEN", default_value = "127.0.0.1:7070")]
    listen: SocketAddr,

    /// Address etcd v3 clients (etcdctl, etcd client libraries) reach this
    /// instance's gRPC API on, or `off`. When the default is taken (a real
    /// etcd on this host, say) that is logged and HTTP is served anyway; an
    /// address given here that cannot be bound is an error
    /// [default: 127.0.0.1:2379, etcdctl's default endpoint].
    #[arg(long, env = "CHORUS_ETCD_LISTEN", value_name = "ADDR|off", value_parser = parse_etcd_listen)]
    etcd_listen: Option<EtcdListen>,

    /// Largest etcd write request (Put, DeleteRange, Txn, Compact) in bytes,
    /// etcd's --max-request-bytes; a larger one is refused with "etcdserver:
    /// request is too large", as is one whose record exceeds the log's
    /// largest record (1 MiB).
    #[arg(long, default_value_t = DEFAULT_MAX_REQUEST_BYTES as u64, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    etcd_max_request_bytes: u64,

    /// Most operations in one etcd transaction branch, etcd's --max-txn-ops.
    #[arg(long, default_value_t = DEFAULT_MAX_TXN_OPS as u64, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    etcd_max_txn_ops: u64,

    /// Bytes of etcd watch responses one Watch stream may hold made but
    /// not yet sent: the stream makes no more while they wait (exceeding it
    /// by at most one revision's responses), so this bounds a slow client's
    /// memory; its watches fall behind instead.
    #[arg(long, default_value_t = etcd_watch::DEFAULT_SEND_BUFFER_BYTES as u64, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    etcd_watch_send_buffer_bytes: u64,

    /// A Watch stream whose send buffer stays full this long, its client
    /// taking nothing, is closed with ResourceExhausted.
    #[arg(long, default_value_t = etcd_watch::DEFAULT_STALL_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=86_400))]
    etcd_watch_stall_timeout_secs: u64,

    /// Between progress notifications to a watch that asked for them
    /// (plus up to a tenth at random per stream), etcd's
    /// --experimental-watch-progress-notify-interval; at least etcd's
    /// minimum, 100 ms.
    #[arg(
        long,
        default_value_t = etcd_watch::DEFAULT_PROGRESS_NOTIFY_INTERVAL.as_millis() as u64,
        value_parser = clap::value_parser!(u64)
            .range(etcd_watch::MIN_PROGRESS_NOTIFY_INTERVAL.as_millis() as u64..=MAX_PROGRESS_NOTIFY_INTERVAL_MS)
    )]
    etcd_watch_progress_notify_interval_ms: u64,
    /// The state's space quota in bytes, etcd's --quota-backend-bytes, for
    /// both APIs: a write that would take the state (keys, values and
    /// retained history) to this size is refused (etcd: "etcdserver: mvcc:
    /// database space exceeded", which also raises the NOSPACE alarm; HTTP:
    /// 507), and while the alarm is raised every write that adds data is
    /// refused, until `etcdctl alarm disarm`.
    #[arg(long, default_value_t = DEFAULT_QUOTA_BACKEND_BYTES as u64, value_parser = clap::value_parser!(u64).range(1..=1 << 40))]
    quota_backend_bytes: u64,

    /// This instance's URL as clients and other instances reach it
    /// [default: http://<listen address>, or http://<hostname>:<port> when
    /// listening on an unspecified address such as 0.0.0.0; https:// with
    /// --cert-file].
    #[arg(long, env = "CHORUS_ADVERTISE_URL")]
    advertise_url: Option<String>,

    /// Lease holder id: the name this instance's slot goes by in the lease,
    /// in status and in the `primary` a standby names to writers (so the
    /// default is the advertised URL). Two processes may share one safely:
    /// each writes a random incarnation into the lease, and only the process
    /// that acquired a live lease holds it [default: the advertised URL].
    #[arg(long, env = "CHORUS_HOLDER")]
    holder: Option<String>,

    /// For benchmarks: every request to a log replica first waits this
    /// long, as a remote object store would answer (the embedded default's
    /// replicas are local directories, answering in microseconds). The
    /// register and the snapshot store are not delayed. 0: no delay.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    replica_latency_ms: u64,

    /// Hedge log writes: a fragment write to a replica that has not
    /// answered after this percentile of that replica's recent write
    /// latencies (and at least 1.25 times their median) is sent again beside
    /// the first. Trims heavy-tailed store latency for at most about (100 − N) %
    /// more fragment writes under such tails; under steady latency, or to a
    /// replica slow all the time, none is sent twice. 50 to 99, or off
    /// [default: 70].
    #[arg(long, env = "CHORUS_HEDGE_AFTER_PERCENTILE", value_name = "N|off")]
    hedge_after_percentile: Option<HedgeAfter>,

    /// Lease time to live. Bounds the takeover time after a crash (about
    /// ttl + 1 s); shorter means more lease writes (one every ttl / 3).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..=3600))]
    lease_ttl_secs: u64,

    /// Publish a snapshot (and truncate the log below it) after this many records…
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_every_records: u64,

    /// …once the log since the last snapshot holds at least this percentage
    /// of that snapshot's bytes (so snapshots of a large state do not cost
    /// more than the log itself; a restart replays at most about that much
    /// log). 0: by record count alone.
    #[arg(long, default_value_t = chorus::runtime::DEFAULT_SNAPSHOT_MIN_LOG_PERCENT)]
    snapshot_min_log_percent: u32,

    /// …or at least this often while records arrive.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_interval_secs: u64,

    /// Take the lease over even while another process holds it (a higher
    /// term fences it), on this process's first acquisition only. Only when
    /// that process is known to be gone: until its own deadline it still
    /// believes it may serve.
    #[arg(long)]
    force: bool,

    /// Bearer token required on every route but /healthz.
    #[arg(
        long,
        env = "CHORUS_TOKEN",
        hide_env_values = true,
        conflicts_with = "token_file"
    )]
    token: Option<String>,

    /// File whose first line is the bearer token.
    #[arg(long, env = "CHORUS_TOKEN_FILE")]
    token_file: Option<PathBuf>,

    /// Report ready (/readyz 200) on a caught-up standby too.
    #[arg(long)]
    ready_as_standby: bool,

    /// Largest request body in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,

    /// Bound on a request until its answer starts.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    request_timeout_secs: u64,

    /// Most connections served at once on each listener; more wait in the
    /// listen backlog. Never more than half the open-file limit (`ulimit
    /// -n`) on the HTTP listener and a quarter on etcd's, so the stores
    /// keep descriptors [default: 4096, or that share of the limit].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: Option<u64>,

    /// Bound on receiving a request's header, and on a keep-alive
    /// connection idle between requests; the connection is closed after it.
    #[arg(long, default_value_t = listener::DEFAULT_HEADER_READ_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=3600))]
    header_read_timeout_secs: u64,

    /// Bound on an answer that makes no progress: a client that takes no
    /// byte of it (a page, a watch or follow stream) for this long is
    /// disconnected, and the permits and buffers the answer held are
    /// released. Every byte taken restarts it, so slow links are served.
    #[arg(long, default_value_t = chorus_server::send_timeout::DEFAULT_SEND_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=3600))]
    send_timeout_secs: u64,

    /// At shutdown, how long requests and streams in flight may take to
    /// finish before their connections are closed and the lease released.
    #[arg(long, default_value_t = listener::DEFAULT_SHUTDOWN_GRACE.as_secs(), value_parser = clap::value_parser!(u64).range(0..=3600))]
    shutdown_grace_secs: u64,

    /// Most event streams (`GET /v1/kv/watch`, `GET /v1/log?follow=true`)
    /// open at once; one more is answered 503 with Retry-After. Each holds
    /// a connection, a batch of events and, for `follow`, a log reader that
    /// polls the stores while caught up. Never more than half the
    /// connection cap, so other requests still find a connection.
    #[arg(long, default_value_t = limits::DEFAULT_MAX_STREAMS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    max_streams: u64,

    /// Bound on the JSON of one `GET /v1/log` page, in bytes: a page stops
    /// taking records once it reaches it (exceeding it by less than one
    /// record), and the client continues from its `next`.
    #[arg(long, default_value_t = limits::DEFAULT_LOG_PAGE_BYTES as u64, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    log_page_bytes: u64,

    /// Most `GET /v1/log` pages built and sent at once; more wait (until
    /// the request timeout). Each costs its page and its log reader's
    /// buffer, up to one sealed segment.
    #[arg(long, default_value_t = limits::DEFAULT_MAX_LOG_PAGES as u64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    max_log_pages: u64,

    /// Bound on the JSON of one `GET /v1/kv` page, in bytes: a page stops
    /// taking items once it reaches it (exceeding it by less than one item),
    /// and the client continues from its `next`.
    #[arg(long, default_value_t = limits::DEFAULT_LIST_PAGE_BYTES as u64, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    list_page_bytes: u64,

    /// Most `GET /v1/kv` pages built and sent at once; more wait (until
    /// the request timeout). Each costs its rendered page.
    #[arg(long, default_value_t = limits::DEFAULT_MAX_LIST_PAGES as u64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    max_list_pages: u64,

    /// Bound on what the log readers of `follow` streams hold at once, in
    /// bytes. A reader below the active segments holds a whole sealed
    /// segment (64 MiB), so this makes bytes / 64 MiB slots (at least 1): a
    /// follower takes one before its reader reads and gives it back once
    /// the reader holds nothing; followers beyond them wait, sending
    /// keep-alives.
    #[arg(long, default_value_t = limits::DEFAULT_FOLLOW_BUFFER_BYTES, value_parser = clap::value_parser!(u64).range(1..))]
    follow_buffer_bytes: u64,

    /// Applied records kept in memory for watches that resume from a
    /// revision (0: none); a watch from before them is 410 Gone.
    #[arg(long, default_value_t = DEFAULT_HISTORY_RECORDS as u64)]
    history_records: u64,

    /// Record bytes of that history: it drops its oldest records while it
    /// holds more than this or more than --history-records. At least the
    /// largest record (1 MiB).
    #[arg(long, default_value_t = DEFAULT_HISTORY_BYTES as u64, value_parser = clap::value_parser!(u64).range(1..))]
    history_bytes: u64,

    /// Bound on each snapshot payload upload, download, listing or delete.
    /// Set it above the state's size divided by the snapshot store's
    /// bandwidth; a publication that takes longer fails and is retried.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_payload_timeout_secs: u64,
    /// Idempotency keys remembered for exactly-once writes; beyond this many
    /// (or beyond --idempotency-max-bytes) the oldest are forgotten.
    #[arg(
        long,
        default_value_t = idempotency::DEFAULT_RETAINED_KEYS,
        value_parser = clap::value_parser!(u64).range(1..=idempotency::MAX_RETAINED_KEYS)
    )]
    idempotency_max_keys: u64,

    /// How long an idempotency key is remembered: a retry within it is
    /// answered the original outcome, a retry after it applies again.
    #[arg(
        long,
        default_value_t = idempotency::DEFAULT_RETENTION_AGE_MS / 1000,
        value_parser = clap::value_parser!(u64).range(1..=idempotency::MAX_RETENTION_AGE_MS / 1000)
    )]
    idempotency_max_age_secs: u64,

    /// Bytes of the idempotency table: beyond them the oldest keys are
    /// forgotten. Each key counts its length, the key of a remembered 412,
    /// and 320 bytes; this bounds the table's memory, the copy each
    /// checkpoint takes of it, and its share of every snapshot.
    #[arg(
        long,
        default_value_t = idempotency::DEFAULT_RETAINED_BYTES,
        value_parser = clap::value_parser!(u64).range(idempotency::MAX_ENTRY_BYTES..=idempotency::MAX_RETAINED_BYTES)
    )]
    idempotency_max_bytes: u64,

    /// PEM certificate (chain, this instance's first) presented to clients,
    /// etcd's --cert-file: with it both listeners, HTTP and etcd, speak TLS
    /// only. Needs --key-file.
    #[arg(long, env = "CHORUS_CERT_FILE", value_name = "PATH")]
    cert_file: Option<PathBuf>,

    /// PEM private key of --cert-file's certificate, etcd's --key-file.
    #[arg(long, env = "CHORUS_KEY_FILE", value_name = "PATH")]
    key_file: Option<PathBuf>,

    /// PEM certificate(s) of the CA that signs client certificates, etcd's
    /// --trusted-ca-file. As with etcd, once it is given every client of
    /// both listeners must present a certificate it signed. Needs
    /// --cert-file.
    #[arg(long, env = "CHORUS_TRUSTED_CA_FILE", value_name = "PATH")]
    trusted_ca_file: Option<PathBuf>,

    /// Require a client certificate signed by --trusted-ca-file (which it
    /// needs) on every connection, etcd's --client-cert-auth.
    #[arg(long)]
    client_cert_auth: bool,

    /// Print the merged configuration (secrets redacted) and exit.
    #[arg(long)]
    print_config: bool,
}

/// Everything `serve` runs with, resolved from flags, environment, file
/// and defaults; reads only the config file and the token file.
struct Resolved {
    location: Location,
    database: DatabaseLocation,
    /// `None`: the advertised URL, known once the listener is bound.
    holder: Option<HolderId>,
    schedule: Schedule,
    lease: LeaseConfig,
    snapshots: SnapshotConfig,
    service: ServiceConfig,
    listen: SocketAddr,
    etcd: EtcdSettings,
    data_dir: Option<PathBuf>,
    /// `None`: plain TCP.
    tls: Option<TlsMaterial>,
    /// Injected before every log replica request (`--replica-latency-ms`).
    replica_latency: Duration,
}

/// Where the etcd API is served, as `--etcd-listen` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EtcdListen {
    /// Not served.
    Off,
    /// On this address, exiting with an error when it cannot be bound.
    At(SocketAddr),
}

/// The longest `--etcd-watch-progress-notify-interval-ms`: a day.
const MAX_PROGRESS_NOTIFY_INTERVAL_MS: u64 = 86_400_000;

/// The default etcd address: etcdctl's default endpoint.
const DEFAULT_ETCD_LISTEN: &str = "127.0.0.1:2379";

/// `--etcd-listen`: an address or `off`.
fn parse_etcd_listen(text: &str) -> Result<EtcdListen, String> {
    if text == "off" {
        return Ok(EtcdListen::Off);
    }
    text.parse()
        .map(EtcdListen::At)
        .map_err(|e| format!("{e}: give an address such as 127.0.0.1:2379, or off"))
}

/// The etcd API's settings.
#[derive(Debug, Clone)]
struct EtcdSettings {
    /// `None`: the default address, served only if it is free.
    listen: Option<EtcdListen>,
    max_request_bytes: usize,
    max_txn_ops: usize,
    watch: WatchConfig,
    max_connections: usize,
}

/// The runtime settings `serve` takes from its flags.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    every_records: u64,
    min_log_percent: u32,
    interval: Duration,
    force: bool,
    lease_check_interval: Duration,
    history_records: usize,
    history_bytes: usize,
    /// The log writer's `hedge_after_percentile`.
    hedge_after_percentile: Option<u8>,
}

impl Resolved {
    /// The runtime configuration for `holder`.
    fn runtime(&self, holder: HolderId) -> RuntimeConfig {
        let mut runtime = RuntimeConfig::new(holder);
        runtime.snapshot_every_records = self.schedule.every_records;
        runtime.snapshot_min_log_percent = self.schedule.min_log_percent;
        runtime.snapshot_interval = self.schedule.interval;
        runtime.force = self.schedule.force;
        runtime.lease_check_interval = self.schedule.lease_check_interval;
        runtime.history_records = self.schedule.history_records;
        runtime.history_bytes = self.schedule.history_bytes;
        runtime.log.hedge_after_percentile = self.schedule.hedge_after_percentile;
        runtime
    }

    /// The etcd service's settings for an API bound at `bound`: the
    /// database's identity is its snapshot store and name.
    fn etcd_config(&self, bound: Option<SocketAddr>) -> EtcdConfig {
        let identity = format!(
            "{}/{}",
            self.database.store,
            self.database.database.as_str()
        );
        let mut config = EtcdConfig::new(identity);
        config.max_request_bytes = self.etcd.max_request_bytes;
        config.max_txn_ops = self.etcd.max_txn_ops;
        config.watch = self.etcd.watch.clone();
        // One quota for both APIs: the service's.
        config.quota_backend_bytes = self.service.quota_bytes;
        config.max_connections = self.etcd.max_connections;
        config.peer_tls = self.peer_tls();
        config.client_urls = bound
            .map(|bound| default_advertise_url(self.scheme(), bound, &hostname()))
            .into_iter()
            .collect();
        config
    }

    /// The advertised URL: the flag, or the scheme and the bound address,
    /// or for an unspecified address (0.0.0.0, ::), which names no host,
    /// this host's name and the bound port.
    fn advertise_url(&self, bound: SocketAddr) -> String {
        self.service
            .advertise_url
            .clone()
            .unwrap_or_else(|| default_advertise_url(self.scheme(), bound, &hostname()))
    }

    /// The scheme clients reach both listeners with.
    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// What this node trusts and presents when, as a standby, it forwards
    /// to the primary's etcd listener: the trusted CA (which must then have
    /// signed every node's certificate) and its own certificate. `None`
    /// without TLS or without a trusted CA.
    fn peer_tls(&self) -> Option<PeerTls> {
        let tls = self.tls.as_ref()?;
        Some(PeerTls {
            ca_pem: tls.trusted_ca_pem()?.to_vec(),
            certificate_pem: tls.certificate_pem().to_vec(),
            key_pem: tls.key_pem().to_vec(),
        })
    }

    /// The etcd listener's TLS, if any.
    fn etcd_tls(&self) -> Option<EtcdTls> {
        self.tls.as_ref().map(|tls| EtcdTls {
            certificate_pem: tls.certificate_pem().to_vec(),
            key_pem: tls.key_pem().to_vec(),
            trusted_ca_pem: tls.trusted_ca_pem().map(<[u8]>::to_vec),
            handshake_timeout: self.service.connections.header_read_timeout,
        })
    }
}

impl ServeArgs {
    fn resolve(&self) -> Result<Resolved, CommandError> {
        let location = self.store.resolve()?;
        let database = DatabaseArgs {
            store: self.snapshot_store.clone(),
            db: self.db.clone(),
            data_dir: self.store.data_dir.clone(),
            config: self.store.config.clone(),
        }
        .resolve()?;
        let holder = self
            .holder
            .as_deref()
            .map(HolderId::new)
            .transpose()
            .map_err(|e| format!("--holder: {e}"))?;
        let ttl = Duration::from_secs(self.lease_ttl_secs);
        let lease = LeaseConfig {
            ttl,
            safety_margin: ttl / 5,
            store_call_timeout: ttl / 4,
        };
        let schedule = Schedule {
            every_records: self.snapshot_every_records,
            min_log_percent: self.snapshot_min_log_percent,
            interval: Duration::from_secs(self.snapshot_interval_secs),
            force: self.force,
            lease_check_interval: (ttl / 20)
                .clamp(Duration::from_millis(100), Duration::from_secs(1)),
            history_records: to_usize(self.history_records),
            history_bytes: to_usize(self.history_bytes),
            hedge_after_percentile: self.hedge_after_percentile.map_or(
                LogConfig::default().hedge_after_percentile,
                |HedgeAfter(percentile)| percentile,
            ),
        };
        let token = match (&self.token, &self.token_file) {
            (Some(token), _) => Some(token.clone()),
            (None, Some(path)) => Some(read_token(path)?),
            (None, None) => None,
        };
        let requested = self
            .max_connections
            .map_or(listener::DEFAULT_MAX_CONNECTIONS, to_usize);
        let descriptors = listener::descriptor_limit();
        let quota_bytes = to_usize(self.quota_backend_bytes);
        let connections = ConnectionLimits {
            max_connections: listener::connection_cap(requested, descriptors),
            header_read_timeout: Duration::from_secs(self.header_read_timeout_secs),
            send_timeout: Duration::from_secs(self.send_timeout_secs),
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
        };
        let memory = MemoryLimits {
            max_streams: limits::stream_cap(
                to_usize(self.max_streams),
                connections.max_connections,
            ),
            log_page_bytes: to_usize(self.log_page_bytes),
            max_log_pages: to_usize(self.max_log_pages),
            list_page_bytes: to_usize(self.list_page_bytes),
            max_list_pages: to_usize(self.max_list_pages),
            follow_buffer_bytes: self.follow_buffer_bytes,
        };
        let service = ServiceConfig {
            token,
            max_body_bytes: self.max_body_bytes,
            request_timeout: Duration::from_secs(self.request_timeout_secs),
            advertise_url: self.advertise_url.clone(),
            ready_as_standby: self.ready_as_standby,
            connections,
            idempotency: Retention {
                max_keys: self.idempotency_max_keys,
                max_age_ms: self.idempotency_max_age_secs * 1000,
                max_bytes: self.idempotency_max_bytes,
            },
            memory,
            quota_bytes,
        };
        let snapshots = SnapshotConfig {
            payload_call_timeout: Duration::from_secs(self.snapshot_payload_timeout_secs),
            ..SnapshotConfig::default()
        };
        let resolved = Resolved {
            location,
            database,
            holder,
            schedule,
            lease,
            snapshots,
            service,
            listen: self.listen,
            etcd: EtcdSettings {
                listen: self.etcd_listen,
                max_request_bytes: to_usize(self.etcd_max_request_bytes),
                max_txn_ops: to_usize(self.etcd_max_txn_ops),
                watch: WatchConfig {
                    progress_notify_interval: Duration::from_millis(
                        self.etcd_watch_progress_notify_interval_ms,
                    ),
                    send_buffer_bytes: to_usize(self.etcd_watch_send_buffer_bytes),
                    stall_timeout: Duration::from_secs(self.etcd_watch_stall_timeout_secs),
                },
                // Half of what is left after the HTTP listener's share.
                max_connections: listener::connection_cap(
                    requested,
                    descriptors.map(|limit| limit / 2),
                ),
            },
            data_dir: self.store.data_dir.clone(),
            tls: self.tls()?,
            replica_latency: Duration::from_millis(self.replica_latency_ms),
        };
        // Relations between flags (--history-bytes against the largest
        // record) are refused here, before anything is opened.
        let check = HolderId::new("http://configuration-check").expect("a valid holder id");
        resolved
            .runtime(check)
            .validate()
            .map_err(|e| format!("invalid configuration: {e}"))?;
        Ok(resolved)
    }

    /// The TLS files, read and checked, when --cert-file is given; the
    /// flags' relations are checked first.
    fn tls(&self) -> Result<Option<TlsMaterial>, CommandError> {
        let files = tls_files(
            self.cert_file.as_deref(),
            self.key_file.as_deref(),
            self.trusted_ca_file.as_deref(),
            self.client_cert_auth,
        )?;
        let Some(files) = files else {
            return Ok(None);
        };
        Ok(Some(TlsMaterial::load(&files)?))
    }

    /// Runs the service until a signal.
    pub async fn run(self) -> Result<(), CommandError> {
        let resolved = self.resolve()?;
        if self.print_config {
            return print_config(&resolved);
        }
        serve(resolved).await
    }
}

/// The TLS files the flags name, once their relations hold: a
/// certificate and its key or neither, a trusted CA only with them,
/// `--client-cert-auth` only with a trusted CA. `None`: no TLS.
fn tls_files(
    cert_file: Option<&Path>,
    key_file: Option<&Path>,
    trusted_ca_file: Option<&Path>,
    client_cert_auth: bool,
) -> Result<Option<TlsFiles>, String> {
    if client_cert_auth && trusted_ca_file.is_none() {
        return Err(
            "--client-cert-auth needs --trusted-ca-file (the CA that signs client certificates)"
                .to_owned(),
        );
    }
    match (cert_file, key_file) {
        (Some(cert_file), Some(key_file)) => Ok(Some(TlsFiles {
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            trusted_ca_file: trusted_ca_file.map(Path::to_owned),
        })),
        (Some(cert), None) => Err(format!(
            "--cert-file {} needs --key-file (its private key)",
            cert.display()
        )),
        (None, Some(key)) => Err(format!(
            "--key-file {} needs --cert-file (its certificate)",
            key.display()
        )),
        (None, None) => match trusted_ca_file {
            Some(ca) => Err(format!(
                "--trusted-ca-file {} needs --cert-file and --key-file: client certificates are checked only over TLS",
                ca.display()
            )),
            None => Ok(None),
        },
    }
}

/// `<scheme>://<bound>`, or `<scheme>://<host>:<port>` when `bound` is
/// unspecified: every process listening on 0.0.0.0:7070 would otherwise
/// advertise (and, by default, hold the lease as) the same
/// `http://0.0.0.0:7070`.
fn default_advertise_url(scheme: &str, bound: SocketAddr, host: &str) -> String {
    if bound.ip().is_unspecified() {
        format!("{scheme}://{host}:{}", bound.port())
    } else {
        format!("{scheme}://{bound}")
    }
}

/// A count or size from a flag; beyond the address space means "no bound".
fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

fn read_token(path: &std::path::Path) -> Result<String, CommandError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read token file {}: {e}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim().to_owned();
    if token.is_empty() {
        return Err(format!("token file {} is empty", path.display()).into());
    }
    Ok(token)
}

fn print_config(resolved: &Resolved) -> Result<(), CommandError> {
    let service = &resolved.service;
    let schedule = &resolved.schedule;
    let advertise_url = resolved.advertise_url(resolved.listen);
    let holder = resolved
        .holder
        .as_ref()
        .map_or(advertise_url.as_str(), HolderId::as_str);
    let mut config = json!({
        "listen": resolved.listen.to_string(),
        "etcd_listen": match resolved.etcd.listen {
            None => DEFAULT_ETCD_LISTEN.to_owned(),
            Some(EtcdListen::Off) => "off".to_owned(),
            Some(EtcdListen::At(address)) => address.to_string(),
        },
        "etcd_max_request_bytes": resolved.etcd.max_request_bytes,
        "etcd_max_txn_ops": resolved.etcd.max_txn_ops,
        "quota_backend_bytes": service.quota_bytes,
        "advertise_url": advertise_url,
        "tls": resolved.tls.is_some(),
        "cert_file": resolved.tls.as_ref().map(|tls| tls.files().cert_file.display().to_string()),
        "key_file": resolved.tls.as_ref().map(|tls| tls.files().key_file.display().to_string()),
        "trusted_ca_file": resolved.tls.as_ref().and_then(|tls| tls.files().trusted_ca_file.as_ref()).map(|path| path.display().to_string()),
        "client_cert_auth": resolved.tls.as_ref().is_some_and(TlsMaterial::requires_client_certificates),
        "holder": holder,
        "replicas": resolved.location.replicas.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "register": resolved.location.register.to_string(),
        "snapshot_store": resolved.database.store.to_string(),
        "db": resolved.database.database.as_str(),
        "lease_ttl_secs": resolved.lease.ttl.as_secs(),
        "replica_latency_ms": resolved.replica_latency.as_millis(),
        "snapshot_payload_timeout_secs": resolved.snapshots.payload_call_timeout.as_secs(),
        "snapshot_every_records": schedule.every_records,
        "snapshot_interval_secs": schedule.interval.as_secs(),
        "force": schedule.force,
        "token": service.token.as_ref().map(|_| "<redacted>"),
        "ready_as_standby": service.ready_as_standby,
        "max_body_bytes": service.max_body_bytes,
        "request_timeout_secs": service.request_timeout.as_secs(),
        "max_connections": service.connections.max_connections,
        "header_read_timeout_secs": service.connections.header_read_timeout.as_secs(),
        "send_timeout_secs": service.connections.send_timeout.as_secs(),
        "shutdown_grace_secs": service.connections.shutdown_grace.as_secs(),
        "idempotency_max_keys": service.idempotency.max_keys,
        "idempotency_max_age_secs": service.idempotency.max_age_ms / 1000,
        "idempotency_max_bytes": service.idempotency.max_bytes,
        "max_streams": service.memory.max_streams,
        "log_page_bytes": service.memory.log_page_bytes,
        "max_log_pages": service.memory.max_log_pages,
        "list_page_bytes": service.memory.list_page_bytes,
        "max_list_pages": service.memory.max_list_pages,
        "follow_buffer_bytes": service.memory.follow_buffer_bytes,
        "history_records": schedule.history_records,
        "history_bytes": schedule.history_bytes,
    });
    // Beside the rest: one json! of every field exceeds its macro's
    // recursion limit.
    let watch = &resolved.etcd.watch;
    config["hedge_after_percentile"] = json!(schedule.hedge_after_percentile);
    config["snapshot_min_log_percent"] = json!(schedule.min_log_percent);
    config["etcd_max_connections"] = json!(resolved.etcd.max_connections);
    config["etcd_watch_send_buffer_bytes"] = json!(watch.send_buffer_bytes);
    config["etcd_watch_stall_timeout_secs"] = json!(watch.stall_timeout.as_secs());
    config["etcd_watch_progress_notify_interval_ms"] =
        json!(watch.progress_notify_interval.as_millis());
    outln!("{}", serde_json::to_string_pretty(&config)?)?;
    Ok(())
}

async fn serve(resolved: Resolved) -> Result<(), CommandError> {
    let metrics = chorus_server::install_metrics_recorder()?;
    let stores = open_stores(
        &resolved.location,
        &resolved.database,
        resolved.lease,
        resolved.snapshots,
        resolved.replica_latency,
    )
    .await?;
    let listener = TcpListener::bind(resolved.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", resolved.listen))?;
    let bound = listener.local_addr()?;
    let etcd_listener = bind_etcd(resolved.etcd.listen).await?;
    let advertise = resolved.advertise_url(bound);
    let holder = match &resolved.holder {
        Some(holder) => holder.clone(),
        None => {
            HolderId::new(&advertise).map_err(|e| format!("--advertise-url as holder id: {e}"))?
        }
    };
    let runtime = Arc::new(Runtime::<KvState>::start(stores, resolved.runtime(holder))?);
    outln!(
        "chorus serve: listening on {bound} (advertised as {advertise}); log: {} replicas, register {}; snapshots: {}",
        resolved.location.replicas.len(),
        resolved.location.register,
        resolved.database.store,
    )?;
    let etcd_bound = etcd_listener
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()?;
    if let Some(etcd_bound) = etcd_bound {
        outln!("chorus serve: etcd API on {etcd_bound}")?;
    }
    if let Some(tls) = &resolved.tls {
        let clients = if tls.requires_client_certificates() {
            "client certificates required"
        } else {
            "no client certificates"
        };
        outln!("chorus serve: TLS on every listener ({clients})")?;
        if !tls.requires_client_certificates() {
            tracing::warn!(
                "without --trusted-ca-file this node cannot verify a primary's certificate: \
                 as a standby it answers etcd writes Unavailable instead of forwarding them"
            );
        }
    }
    let etcd_tls = resolved.etcd_tls();
    let http_tls = resolved
        .tls
        .as_ref()
        .map(|tls| tls.server_config(&[chorus_server::tls::ALPN_HTTP1]))
        .transpose()?;
    let etcd = EtcdService::new(Arc::clone(&runtime), resolved.etcd_config(etcd_bound));
    if let Some(dir) = &resolved.data_dir {
        tracing::debug!(data_dir = %dir.display(), "data directory");
    }
    let connections = resolved.service.connections;
    tracing::info!(
        max_connections = connections.max_connections,
        descriptor_limit = listener::descriptor_limit(),
        header_read_timeout_secs = connections.header_read_timeout.as_secs(),
        send_timeout_secs = connections.send_timeout.as_secs(),
        shutdown_grace_secs = connections.shutdown_grace.as_secs(),
        "connection limits"
    );
    let memory = resolved.service.memory;
    tracing::info!(
        max_streams = memory.max_streams,
        log_page_bytes = memory.log_page_bytes,
        max_log_pages = memory.max_log_pages,
        list_page_bytes = memory.list_page_bytes,
        max_list_pages = memory.max_list_pages,
        follow_buffer_bytes = memory.follow_buffer_bytes,
        history_records = resolved.schedule.history_records,
        history_bytes = resolved.schedule.history_bytes,
        "memory limits"
    );
    tokio::spawn(report_roles(Arc::clone(&runtime)));
    let (stop_streams, shutdown) = watch::channel(false);
    let mut stopped = stop_streams.subscribe();
    let etcd = match etcd_listener {
        Some(etcd_listener) => Some(tokio::spawn(serve_etcd(
            etcd_listener,
            etcd,
            etcd_tls,
            stopped,
        ))),
        // Leases granted through another node still expire while this one leads.
        None => {
            tokio::spawn(etcd.expire_leases(async move {
                let _ = stopped.wait_for(|stopped| *stopped).await;
            }));
            None
        }
    };
    let grace = resolved.service.connections.shutdown_grace;
    let mut service = resolved.service;
    service.advertise_url = Some(advertise);
    let app = Arc::new(AppState::new(
        Arc::clone(&runtime),
        service,
        Some(metrics),
        shutdown,
    ));
    let (signalled, on_signal) = tokio::sync::oneshot::channel();
    tokio::spawn(wait_for_signals(signalled));
    let stopped = Arc::clone(&runtime);
    let until = async move {
        tokio::select! {
            _ = on_signal => {}
            _ = stopped.finished() => {}
        }
        let _ = stop_streams.send(true);
    };
    let served = match http_tls {
        Some(tls) => chorus_server::serve_tls(listener, app, tls, until).await,
        None => chorus_server::serve(listener, app, until).await,
    };
    served.map_err(|e| format!("http server failed: {e}"))?;
    if let Some(etcd) = etcd {
        drain_etcd(etcd, grace).await?;
    }
    runtime.shutdown().await?;
    outln!("chorus serve: stopped")?;
    Ok(())
}

/// Binds the etcd API's listener: `None` when it is off, or when the
/// default address cannot be bound (logged once: HTTP is served anyway); an
/// address given with `--etcd-listen` that cannot be bound is an error.
async fn bind_etcd(listen: Option<EtcdListen>) -> Result<Option<TcpListener>, CommandError> {
    match listen {
        Some(EtcdListen::Off) => Ok(None),
        Some(EtcdListen::At(address)) => match TcpListener::bind(address).await {
            Ok(listener) => Ok(Some(listener)),
            Err(error) => Err(format!(
                "cannot listen for etcd clients on {address} (--etcd-listen): {error}"
            )
            .into()),
        },
        None => match TcpListener::bind(DEFAULT_ETCD_LISTEN).await {
            Ok(listener) => Ok(Some(listener)),
            Err(error) => {
                tracing::warn!(
                    "not serving the etcd API: cannot listen on {DEFAULT_ETCD_LISTEN} ({error}); \
                     serving HTTP only (--etcd-listen ADDR serves it elsewhere, --etcd-listen off turns it off)"
                );
                Ok(None)
            }
        },
    }
}

/// Serves the etcd API (over `tls`, if any) until `stopped` turns true
/// (with the HTTP server).
async fn serve_etcd(
    listener: TcpListener,
    service: EtcdService,
    tls: Option<EtcdTls>,
    mut stopped: watch::Receiver<bool>,
) -> Result<(), String> {
    let shutdown = async move {
        let _ = stopped.wait_for(|stopped| *stopped).await;
    };
    let served = match &tls {
        Some(tls) => chorus_etcd::serve_tls(listener, service, tls, shutdown).await,
        None => chorus_etcd::serve(listener, service, shutdown).await,
    };
    served.map_err(|e| format!("etcd server failed: {e}"))
}

/// Waits for the etcd server to finish the RPCs in flight, for at most
/// `grace`; then its connections are closed.
async fn drain_etcd(
    etcd: tokio::task::JoinHandle<Result<(), String>>,
    grace: Duration,
) -> Result<(), CommandError> {
    let abort = etcd.abort_handle();
    match tokio::time::timeout(grace, etcd).await {
        Ok(Ok(result)) => result.map_err(Into::into),
        Ok(Err(join)) => Err(format!("etcd server task failed: {join}").into()),
        Err(_) => {
            tracing::warn!(
                grace_secs = grace.as_secs(),
                "etcd RPCs still in flight after the shutdown grace; closing their connections"
            );
            abort.abort();
            Ok(())
        }
    }
}

/// Creates the log if needed and opens a database's stores: the log (every
/// replica probed, then delayed by `replica_latency` per request), and the
/// snapshot store holding its snapshots and lease.
pub async fn open_stores(
    location: &Location,
    database: &DatabaseLocation,
    lease: LeaseConfig,
    snapshots: SnapshotConfig,
    replica_latency: Duration,
) -> Result<RuntimeStores, CommandError> {
    create_log(location, DEFAULT_WINDOW).await?;
    let mut log = open_log(location, Access::Write).await?.stores;
    if !replica_latency.is_zero() {
        for (_, replica) in &mut log.replicas {
            *replica = Arc::new(LatencyStore::fixed(Arc::clone(replica), replica_latency));
        }
    }
    let store = open_for_write(database).await?;
    let key = database.database.clone();
    let clock = SystemClock::shared();
    let leases = LeaseStore::new(store.clone(), key.clone(), lease, clock.clone())?;
    let snapshots = SnapshotStore::new(store, key, snapshots, clock);
    Ok(RuntimeStores {
        log,
        snapshots,
        leases,
    })
}

/// Prints each role the runtime takes, so an operator sees it become primary
/// or standby.
async fn report_roles(runtime: Arc<Runtime<KvState>>) {
    let mut last = None;
    loop {
        let status = runtime.status();
        if last != Some(status.role) {
            last = Some(status.role);
            let detail = match status.role {
                Role::Standby => status
                    .lease
                    .as_ref()
                    .map(|lease| format!(" (primary: {})", lease.holder_id))
                    .unwrap_or_default(),
                Role::Primary => format!(" (applied index {})", status.applied_index),
                Role::Booting | Role::Stopped => String::new(),
            };
            let _ = outln!("chorus serve: role {}{detail}", status.role);
            if status.role == Role::Stopped {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Resolves at the first SIGTERM, SIGINT or SIGHUP; a second one exits at
/// once. SIGHUP (a closed terminal, a supervisor's reload) would otherwise
/// end the process on the spot, with the lease held until it expires.
async fn wait_for_signals(first: tokio::sync::oneshot::Sender<()>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut terminate), Ok(mut interrupt), Ok(mut hangup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        tracing::warn!("cannot install signal handlers; stop with SIGKILL");
        return;
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
        _ = hangup.recv() => {}
    }
    tracing::info!("shutting down (a second signal exits at once)");
    let _ = first.send(());
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
        _ = hangup.recv() => {}
    }
    std::process::exit(130);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--hedge-after-percentile` reaches the log writer's settings; without
    /// it the log's default applies, `off` never hedges, and a value outside
    /// 50..=99 is refused naming the flag.
    #[test]
    fn hedge_after_percentile_reaches_the_log_settings() {
        let holder = HolderId::new("http://127.0.0.1:7070").unwrap();
        #[derive(clap::Parser)]
        struct Command {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let parse = |args: &[&str]| {
            let mut argv = vec!["serve"];
            argv.extend_from_slice(args);
            <Command as clap::Parser>::try_parse_from(argv).map(|command| command.serve)
        };
        let runtime = |args: &[&str]| {
            let resolved = parse(args).unwrap().resolve().unwrap();
            resolved.runtime(holder.clone()).log.hedge_after_percentile
        };
        assert_eq!(runtime(&["--hedge-after-percentile", "90"]), Some(90));
        assert_eq!(runtime(&["--hedge-after-percentile", "off"]), None);
        assert_eq!(runtime(&[]), LogConfig::default().hedge_after_percentile);
        for bad in ["49", "100", "never"] {
            let error = parse(&["--hedge-after-percentile", bad]).unwrap_err();
            assert!(
                error.to_string().contains("--hedge-after-percentile"),
                "{error}"
            );
        }
    }

    #[test]
    fn etcd_listen_is_an_address_or_off() {
        assert_eq!(parse_etcd_listen("off"), Ok(EtcdListen::Off));
        assert_eq!(
            parse_etcd_listen("127.0.0.1:2380"),
            Ok(EtcdListen::At("127.0.0.1:2380".parse().unwrap()))
        );
        for bad in ["", "2379", "localhost:2379", "OFF"] {
            let error = parse_etcd_listen(bad).unwrap_err();
            assert!(error.contains("or off"), "{bad}: {error}");
        }
    }

    #[test]
    fn the_default_advertised_url_never_names_an_unspecified_address() {
        let url = |addr: &str| default_advertise_url("http", addr.parse().unwrap(), "node-7");
        assert_eq!(url("127.0.0.1:7070"), "http://127.0.0.1:7070");
        assert_eq!(url("[::1]:7071"), "http://[::1]:7071");
        assert_eq!(url("10.0.0.5:80"), "http://10.0.0.5:80");
        assert_eq!(url("0.0.0.0:7070"), "http://node-7:7070");
        assert_eq!(url("[::]:7072"), "http://node-7:7072");
        let tls = |addr: &str| default_advertise_url("https", addr.parse().unwrap(), "node-7");
        assert_eq!(tls("127.0.0.1:7070"), "https://127.0.0.1:7070");
        assert_eq!(tls("0.0.0.0:7070"), "https://node-7:7070");
    }

    #[test]
    fn tls_flags_come_in_the_pairs_etcd_takes_them() {
        fn path(text: &str) -> Option<&Path> {
            Some(Path::new(text))
        }
        let files = tls_files(path("c.pem"), path("k.pem"), path("ca.pem"), true)
            .unwrap()
            .unwrap();
        assert_eq!(files.trusted_ca_file.as_deref(), Path::new("ca.pem").into());
        assert_eq!(tls_files(None, None, None, false), Ok(None));
        let error = |result: Result<Option<TlsFiles>, String>| result.unwrap_err();
        assert_eq!(
            error(tls_files(path("c.pem"), None, None, false)),
            "--cert-file c.pem needs --key-file (its private key)"
        );
        assert_eq!(
            error(tls_files(None, path("k.pem"), None, false)),
            "--key-file k.pem needs --cert-file (its certificate)"
        );
        assert!(
            error(tls_files(None, None, path("ca.pem"), false))
                .starts_with("--trusted-ca-file ca.pem needs --cert-file and --key-file")
        );
        for cert in [None, path("c.pem")] {
            assert_eq!(
                error(tls_files(cert, path("k.pem"), None, true)),
                "--client-cert-auth needs --trusted-ca-file (the CA that signs client certificates)"
            );
        }
    }
}
