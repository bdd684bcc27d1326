//! `chorus bench kv`: puts and gets per second, with latency percentiles, of
//! the key-value service over real HTTP on loopback.
//!
//! Without `--url` it starts the service in this process, twice: on three
//! in-memory replicas behind the latency store (`--latency-ms` on every
//! request), and on the embedded default (local directories, fsync'd) in a
//! temporary directory. Each target gets three rows: light puts (one client,
//! one put at a time), peak puts (`--clients` concurrent clients) and gets
//! (`--clients` concurrent clients over `--keys` preloaded keys, each
//! `--pipeline-gets` requests at a time on its connection). The load
//! generator shares the machine with the service, but runs its clients on a
//! runtime of its own (`--threads`, one by default). Each peak row reports
//! this process's CPU per request, and with `--server-pid` (a service at
//! `--url` on this machine) the service's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use bytes::{Buf, BytesMut};
use chorus::clock::SystemClock;
use chorus::kv::KvState;
use chorus::lease::{DatabaseKey, HolderId, LeaseConfig, LeaseStore};
use chorus::runtime::{Runtime, RuntimeConfig, RuntimeStores};
use chorus::snapshot::{SnapshotConfig, SnapshotStore};
use chorus_server::limits::MemoryLimits;
use chorus_server::listener::ConnectionLimits;
use chorus_server::{AppState, ServiceConfig};
use reqwest::Url;
use reqwest::header::HeaderValue;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::cpu::{Cpu, Spent};
use super::{latency_replicas, memory_store, new_log, on_own_runtime, percentile_ms};
use crate::CommandError;
use crate::config::{DatabaseArgs, StoreArgs};
use crate::output::outln;
use chorus::register::DEFAULT_WINDOW;

/// Arguments of `bench kv`.
#[derive(Debug, Clone, clap::Args)]
pub struct KvBenchArgs {
    /// Drive the service at this URL instead of starting one here.
    #[arg(long)]
    url: Option<String>,
    /// Bearer token for `--url`.
    #[arg(long, env = "CHORUS_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// With `--url`: the service's process id on this machine, so that each
    /// peak row also reports the service's CPU per request (Linux only).
    #[arg(long, requires = "url")]
    server_pid: Option<u32>,
    /// Replicas of the in-memory target (1, 3 or 5).
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Latency injected into every replica request of the in-memory target.
    #[arg(long, default_value_t = 10)]
    latency_ms: u64,
    /// Size of each value in bytes.
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
    /// Concurrent clients of the peak rows.
    #[arg(long, default_value_t = 256)]
    clients: usize,
    /// Worker threads of the load generator's own runtime. One thread (no
    /// work stealing, no wakeups across threads) leaves the most of the
    /// machine to the service; more only if it cannot keep up.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    threads: u16,
    /// How long each peak row runs, in seconds.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Puts of the light row.
    #[arg(long, default_value_t = 300)]
    light_puts: usize,
    /// Gets each client of the get row writes at once before reading their
    /// answers (HTTP/1.1 pipelining, answered in order), so requests share
    /// system calls as the streams of a gRPC connection do; each get's
    /// latency counts from that write. 1 is one request at a time.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pipeline_gets: u16,
    /// Keys preloaded for the get row.
    #[arg(long, default_value_t = 10_000)]
    keys: usize,
    /// Which targets to start here (without `--url`).
    #[arg(long, value_enum, default_values_t = [Target::Memory, Target::Embedded])]
    target: Vec<Target>,
    /// Print one JSON object per row instead of a table.
    #[arg(long)]
    json: bool,
}

/// A service started for the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Target {
    /// In-memory replicas behind the latency store.
    Memory,
    /// The embedded default in a temporary directory.
    Embedded,
}

/// One row of results.
#[derive(Debug, Serialize)]
struct Row {
    target: String,
    scenario: String,
    clients: usize,
    requests: u64,
    errors: u64,
    seconds: f64,
    per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// This process's CPU per request over a peak row: the load generator's,
    /// plus the service's when it runs here.
    cpu_us_per_request: Option<f64>,
    /// The `--server-pid` process's CPU per request over a peak row.
    server_cpu_us_per_request: Option<f64>,
}

/// Runs the benchmark.
pub async fn run(args: KvBenchArgs) -> Result<(), CommandError> {
    if !args.json {
        outln!(
            "{:<28} {:<12} {:>7} {:>9} {:>6} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "target",
            "scenario",
            "clients",
            "requests",
            "errors",
            "per s",
            "p50 ms",
            "p99 ms",
            "max ms",
            "cpu µs",
            "srv µs"
        )?;
    }
    if let Some(url) = &args.url {
        return measure(url, &format!("service {url}"), &args).await;
    }
    for target in &args.target {
        let (name, service) = match target {
            Target::Memory => (
                format!("memory x{} @{} ms", args.replicas, args.latency_ms),
                Service::start(memory_stores(args.replicas, args.latency_ms).await?).await?,
            ),
            Target::Embedded => {
                let dir = std::env::temp_dir().join(format!("chorus-bench-{}", std::process::id()));
                let stores = embedded_stores(&dir).await?;
                let service = Service::start(stores).await?;
                ("embedded default (local)".to_owned(), service.cleaning(dir))
            }
        };
        let outcome = measure(&service.url, &name, &args).await;
        service.stop().await?;
        outcome?;
    }
    Ok(())
}

/// The three rows against one service, measured on the load generator's
/// own runtime.
async fn measure(url: &str, target: &str, args: &KvBenchArgs) -> Result<(), CommandError> {
    let (url, target, args) = (url.to_owned(), target.to_owned(), args.clone());
    let threads = usize::from(args.threads);
    on_own_runtime(
        threads,
        async move { measure_here(&url, &target, &args).await },
    )
    .await
}

/// [`measure`]'s rows, on the runtime it runs on.
async fn measure_here(url: &str, target: &str, args: &KvBenchArgs) -> Result<(), CommandError> {
    let client = Client::new(url, args)?;
    client.wait_until_ready(target, READY_TIMEOUT).await?;
    eprintln!("{target}: light puts …");
    let light = client.light(args).await?;
    print(target, "put, light", light, args)?;
    eprintln!("{target}: peak puts …");
    let peak = client.peak(args, Operation::Put).await?;
    print(target, "put, peak", peak, args)?;
    eprintln!("{target}: preloading {} keys …", args.keys);
    client.preload(args).await?;
    eprintln!("{target}: gets …");
    let gets = client.peak(args, Operation::Get).await?;
    let scenario = match args.pipeline_gets {
        1 => "get, peak".to_owned(),
        depth => format!("get, piped {depth}"),
    };
    print(target, &scenario, gets, args)
}

fn print(
    target: &str,
    scenario: &str,
    row: Measured,
    args: &KvBenchArgs,
) -> Result<(), CommandError> {
    let mut latencies = row.latencies;
    latencies.sort_unstable();
    let requests = latencies.len() as u64;
    let per_request = |micros: f64| {
        if requests == 0 {
            0.0
        } else {
            micros / requests as f64
        }
    };
    let row = Row {
        target: target.to_owned(),
        scenario: scenario.to_owned(),
        clients: row.clients,
        requests,
        errors: row.errors,
        seconds: row.elapsed.as_secs_f64(),
        per_second: requests as f64 / row.elapsed.as_secs_f64(),
        p50_ms: percentile_ms(&latencies, 0.50),
        p99_ms: percentile_ms(&latencies, 0.99),
        max_ms: percentile_ms(&latencies, 1.0),
        cpu_us_per_request: row.cpu.map(|spent| per_request(spent.own_us())),
        server_cpu_us_per_request: row
            .cpu
            .filter(|_| args.server_pid.is_some())
            .map(|spent| per_request(spent.server_us())),
    };
    if args.json {
        return outln!("{}", serde_json::to_string(&row).expect("rows encode"));
    }
    let micros = |value: Option<f64>| value.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
    outln!(
        "{:<28} {:<12} {:>7} {:>9} {:>6} {:>9.0} {:>8.2} {:>8.2} {:>8.2} {:>8} {:>8}",
        row.target,
        row.scenario,
        row.clients,
        row.requests,
        row.errors,
        row.per_second,
        row.p50_ms,
        row.p99_ms,
        row.max_ms,
        micros(row.cpu_us_per_request),
        micros(row.server_cpu_us_per_request)
    )
}

/// What one row measured: the latency of every successful request, and
/// for a peak row the CPU spent.
struct Measured {
    clients: usize,
    latencies: Vec<Duration>,
    errors: u64,
    elapsed: Duration,
    cpu: Option<Spent>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation {
    Put,
    Get,
}

/// What every connection to the service under test shares.
#[derive(Clone)]
struct Client {
    /// `host:port`, for connecting and the `Host` header.
    authority: String,
    /// The URL's path, prefixed to every request path (without a trailing `/`).
    base_path: String,
    /// What follows the request target in every request: the version and
    /// the header lines every request carries (host, authorization), each
    /// ending in CRLF.
    common_head: Bytes,
    /// The end of a put: its content-length line, the blank line and the
    /// value.
    put_tail: Bytes,
}

/// One HTTP/1.1 connection, one request at a time, written and read by the
/// client's own task: the request is one `write` of bytes formatted here and
/// the answer is parsed in place with `httparse` (hyper's parser). Neither
/// a pooled client nor hyper's connection task (a channel and a wakeup each
/// way per request), so the load generator takes as little as it can of the
/// machine it shares with the service (with reqwest it took about as much
/// CPU per request as the service did).
struct Connection {
    stream: TcpStream,
    /// The request being written; its buffer is reused.
    request: Vec<u8>,
    /// What the service sent that is not yet consumed.
    received: BytesMut,
    client: Client,
}

/// The most header lines an answer may have.
const MAX_HEADERS: usize = 32;

/// How long a service may take to become ready before the benchmark gives
/// up on it: a takeover waits out the previous holder's lease (10 s by
/// default) and replays the log.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How often readiness is asked while waiting for it.
const READY_POLL: Duration = Duration::from_millis(100);

impl Client {
    fn new(url: &str, args: &KvBenchArgs) -> Result<Client, CommandError> {
        let parsed = Url::parse(url).map_err(|e| format!("invalid --url {url:?}: {e}"))?;
        if parsed.scheme() != "http" {
            return Err(format!("--url {url:?}: bench kv drives http:// services only").into());
        }
        let host = parsed
            .host_str()
            .ok_or_else(|| format!("--url {url:?} names no host"))?;
        let port = parsed.port_or_known_default().unwrap_or(80);
        let authority = format!("{host}:{port}");
        let mut common_head = format!(" HTTP/1.1\r\nhost: {authority}\r\n").into_bytes();
        if let Some(token) = &args.token {
            let authorization = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| "the token is not a valid header value")?;
            common_head.extend_from_slice(b"authorization: ");
            common_head.extend_from_slice(authorization.as_bytes());
            common_head.extend_from_slice(b"\r\n");
        }
        let mut put_tail = format!("content-length: {}\r\n\r\n", args.value_bytes).into_bytes();
        put_tail.resize(put_tail.len() + args.value_bytes, b'v');
        Ok(Client {
            authority,
            base_path: parsed.path().trim_end_matches('/').to_owned(),
            common_head: Bytes::from(common_head),
            put_tail: Bytes::from(put_tail),
        })
    }

    /// Opens a connection of its own.
    async fn connect(&self) -> Result<Connection, CommandError> {
        let stream = TcpStream::connect(&self.authority).await?;
        stream.set_nodelay(true)?;
        Ok(Connection {
            stream,
            request: Vec::with_capacity(256 + self.put_tail.len()),
            received: BytesMut::with_capacity(8192),
            client: self.clone(),
        })
    }

    /// Waits until the service answers `GET /readyz` with success, so that
    /// no row measures a service still booting (it refuses writes until it
    /// holds the lease and has replayed the log). Connection failures count
    /// as not ready: the service may not listen yet. A refused token fails
    /// at once.
    async fn wait_until_ready(&self, target: &str, timeout: Duration) -> Result<(), CommandError> {
        let deadline = Instant::now() + timeout;
        let mut announced = false;
        loop {
            let answer = match self.connect().await {
                Ok(mut connection) => connection.exchange("GET", &["/readyz"], false).await,
                Err(error) => Err(error),
            };
            let last = match answer {
                Ok(status) if (200..300).contains(&status) => return Ok(()),
                // Waiting would not change the token.
                Ok(status @ (401 | 403)) => {
                    return Err(format!(
                        "{target} refused the benchmark's token (GET /readyz answered {status}); \
                         pass the service's --token"
                    )
                    .into());
                }
                Ok(status) => format!("GET /readyz answered {status}"),
                Err(error) => format!("asking GET /readyz failed: {error}"),
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "{target} was not ready within {timeout:?} ({last}); a service that is \
                     booting or a standby refuses writes"
                )
                .into());
            }
            if !announced {
                eprintln!("{target}: waiting until it is ready (GET /readyz) …");
                announced = true;
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// One client, one put at a time.
    async fn light(&self, args: &KvBenchArgs) -> Result<Measured, CommandError> {
        let mut connection = self.connect().await?;
        let started = Instant::now();
        let mut latencies = Vec::with_capacity(args.light_puts);
        let mut errors = 0;
        for n in 0..args.light_puts {
            let sent = Instant::now();
            if connection
                .send(Operation::Put, &format!("bench/light/{}", n % 100))
                .await?
            {
                latencies.push(sent.elapsed());
            } else {
                errors += 1;
            }
        }
        Ok(Measured {
            clients: 1,
            latencies,
            errors,
            elapsed: started.elapsed(),
            cpu: None,
        })
    }

    /// `clients` concurrent clients, each on its own connection one request
    /// at a time, for `seconds`.
    async fn peak(
        &self,
        args: &KvBenchArgs,
        operation: Operation,
    ) -> Result<Measured, CommandError> {
        let mut connections = Vec::with_capacity(args.clients);
        for _ in 0..args.clients {
            connections.push(self.connect().await?);
        }
        let depth = match operation {
            Operation::Put => 1,
            Operation::Get => usize::from(args.pipeline_gets),
        };
        let cpu_before = Cpu::now(args.server_pid);
        let started = Instant::now();
        let deadline = started + Duration::from_secs(args.seconds);
        let tasks: Vec<_> = connections
            .into_iter()
            .enumerate()
            .map(|(client, mut connection)| {
                let keys_loaded = args.keys.max(1);
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    let mut errors = 0u64;
                    let mut n = client;
                    let mut keys = Vec::with_capacity(depth);
                    while Instant::now() < deadline {
                        keys.clear();
                        for _ in 0..depth {
                            keys.push(match operation {
                                Operation::Put => format!("bench/peak/{client}/{}", n % 100),
                                Operation::Get => format!("bench/load/{}", n % keys_loaded),
                            });
                            n += 7919;
                        }
                        let sent = Instant::now();
                        let answered = |ok| match ok {
                            true => latencies.push(sent.elapsed()),
                            false => errors += 1,
                        };
                        if connection
                            .send_all(operation, &keys, answered)
                            .await
                            .is_err()
                        {
                            // The connection is gone: a new one, counted as
                            // an error.
                            errors += 1;
                            match connection.client.connect().await {
                                Ok(fresh) => connection = fresh,
                                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                            }
                        }
                    }
                    (latencies, errors)
                })
            })
            .collect();
        let mut latencies = Vec::new();
        let mut errors = 0;
        for task in tasks {
            let (mine, failed) = task.await?;
            latencies.extend(mine);
            errors += failed;
        }
        Ok(Measured {
            clients: args.clients,
            latencies,
            errors,
            elapsed: started.elapsed(),
            cpu: Some(Cpu::now(args.server_pid).since(&cpu_before, &cpu_before)),
        })
    }

    /// Writes the keys the get row reads, with `clients` concurrent clients.
    async fn preload(&self, args: &KvBenchArgs) -> Result<(), CommandError> {
        let clients = args.clients.clamp(1, args.keys.max(1));
        let tasks: Vec<_> = (0..clients)
            .map(|client| {
                let this = self.clone();
                let keys = args.keys;
                tokio::spawn(async move {
                    let mut connection = this.connect().await?;
                    for n in (client..keys).step_by(clients) {
                        let key = format!("bench/load/{n}");
                        if !connection.send(Operation::Put, &key).await? {
                            return Err(format!("preloading key {key} failed").into());
                        }
                    }
                    Ok::<_, CommandError>(())
                })
            })
            .collect();
        for task in tasks {
            task.await??;
        }
        Ok(())
    }
}

impl Connection {
    /// One key-value request; `Ok(true)` on a 2xx answer.
    async fn send(&mut self, operation: Operation, key: &str) -> Result<bool, CommandError> {
        let mut succeeded = false;
        self.send_all(operation, &[key], |ok| succeeded = ok)
            .await?;
        Ok(succeeded)
    }

    /// One key-value request per key, all written at once before any answer
    /// is read (HTTP/1.1 pipelining; the service answers in order), then
    /// `answered(true)` for each 2xx answer as it is read, `answered(false)`
    /// for any other.
    async fn send_all(
        &mut self,
        operation: Operation,
        keys: &[impl AsRef<str>],
        mut answered: impl FnMut(bool),
    ) -> Result<(), CommandError> {
        let (method, with_value) = match operation {
            Operation::Put => ("PUT", true),
            Operation::Get => ("GET", false),
        };
        self.request.clear();
        for key in keys {
            self.append_request(method, &["/v1/kv/", key.as_ref()], with_value);
        }
        self.stream.write_all(&self.request).await?;
        for _ in keys {
            let status = self.read_answer().await?;
            answered((200..300).contains(&status));
        }
        Ok(())
    }

    /// One request for the path made of `path`'s pieces (below the URL's
    /// path; pieces, so that no request allocates one) and its answer's
    /// status; `with_value` sends the put's value as its body.
    async fn exchange(
        &mut self,
        method: &str,
        path: &[&str],
        with_value: bool,
    ) -> Result<u16, CommandError> {
        self.request.clear();
        self.append_request(method, path, with_value);
        self.stream.write_all(&self.request).await?;
        self.read_answer().await
    }

    /// Appends a request to the buffer of those to write.
    fn append_request(&mut self, method: &str, path: &[&str], with_value: bool) {
        let client = &self.client;
        let request = &mut self.request;
        for part in [method, " ", &client.base_path]
            .into_iter()
            .chain(path.iter().copied())
        {
            request.extend_from_slice(part.as_bytes());
        }
        request.extend_from_slice(&client.common_head);
        if with_value {
            request.extend_from_slice(&client.put_tail);
        } else {
            request.extend_from_slice(b"\r\n");
        }
    }

    /// Reads and consumes the next answer; its status.
    async fn read_answer(&mut self) -> Result<u16, CommandError> {
        let (status, length) = self.read_head().await?;
        while self.received.len() < length {
            self.read_more().await?;
        }
        self.received.advance(length);
        Ok(status)
    }

    /// Reads and consumes an answer's head: its status and body length.
    async fn read_head(&mut self) -> Result<(u16, usize), CommandError> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut response = httparse::Response::new(&mut headers);
            let parsed = response
                .parse(&self.received)
                .map_err(|e| format!("the service sent a malformed HTTP answer: {e}"))?;
            if let httparse::Status::Complete(head) = parsed {
                let status = response.code.unwrap_or_default();
                let length = body_length(response.headers)?;
                self.received.advance(head);
                return Ok((status, length));
            }
            self.read_more().await?;
        }
    }

    /// Reads what the service sent next; the end of the stream is an error.
    async fn read_more(&mut self) -> Result<(), CommandError> {
        self.received.reserve(8192);
        if self.stream.read_buf(&mut self.received).await? == 0 {
            return Err("the service closed the connection".into());
        }
        Ok(())
    }
}

/// An answer's body length from its `Content-Length` header (every answer
/// of the key routes has one; a chunked or unbounded body is refused by
/// name rather than misread).
fn body_length(headers: &[httparse::Header<'_>]) -> Result<usize, CommandError> {
    let header = |name: &str| headers.iter().find(|h| h.name.eq_ignore_ascii_case(name));
    if let Some(encoding) = header("transfer-encoding") {
        let encoding = String::from_utf8_lossy(encoding.value);
        return Err(format!("the service answered with transfer-encoding {encoding}: bench kv reads content-length bodies only").into());
    }
    let length = header("content-length").ok_or("the service answered without a content-length")?;
    std::str::from_utf8(length.value)
        .ok()
        .and_then(|value| value.trim().parse().ok())
        .ok_or_else(|| {
            format!(
                "the service answered with content-length {:?}",
                String::from_utf8_lossy(length.value)
            )
            .into()
        })
}

/// A service started in this process.
struct Service {
    url: String,
    runtime: Arc<Runtime<KvState>>,
    stop: watch::Sender<bool>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    /// A directory to remove after the stop.
    scratch: Option<std::path::PathBuf>,
}

impl Service {
    /// Starts the runtime and the HTTP service on a free loopback port and
    /// waits until it is the primary.
    async fn start(stores: RuntimeStores) -> Result<Service, CommandError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let holder = HolderId::new(&url)?;
        let runtime = Arc::new(Runtime::<KvState>::start(
            stores,
            RuntimeConfig::new(holder),
        )?);
        let (stop, shutdown) = watch::channel(false);
        let app = Arc::new(AppState::new(
            Arc::clone(&runtime),
            ServiceConfig {
                token: None,
                max_body_bytes: 4 << 20,
                request_timeout: Duration::from_secs(30),
                advertise_url: Some(url.clone()),
                ready_as_standby: false,
                connections: ConnectionLimits::default(),
                idempotency: chorus::kv::Retention::default(),
                memory: MemoryLimits::default(),
                quota_bytes: chorus::kv::quota::DEFAULT_QUOTA_BYTES,
            },
            None,
            shutdown.clone(),
        ));
        let mut until = shutdown;
        let server = tokio::spawn(chorus_server::serve(listener, app, async move {
            let _ = until.wait_for(|stop| *stop).await;
        }));
        let deadline = Instant::now() + Duration::from_secs(60);
        while !runtime.is_primary_and_sure() {
            if Instant::now() > deadline {
                return Err("the benchmark's service did not become primary within 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Service {
            url,
            runtime,
            stop,
            server,
            scratch: None,
        })
    }

    fn cleaning(mut self, dir: std::path::PathBuf) -> Service {
        self.scratch = Some(dir);
        self
    }

    async fn stop(self) -> Result<(), CommandError> {
        let _ = self.stop.send(true);
        self.server.await??;
        self.runtime.shutdown().await?;
        if let Some(dir) = self.scratch {
            let _ = std::fs::remove_dir_all(dir);
        }
        Ok(())
    }
}

/// The in-memory target: `replicas` behind the latency store, a memory
/// register, and a memory store (no injected latency) for snapshots and the
/// lease, which are off the write path.
pub(super) async fn memory_stores(
    replicas: usize,
    latency_ms: u64,
) -> Result<RuntimeStores, CommandError> {
    if ![1, 3, 5].contains(&replicas) {
        return Err("--replicas must be 1, 3 or 5".into());
    }
    let log = new_log(latency_replicas(replicas, latency_ms, None), DEFAULT_WINDOW).await?;
    let store = memory_store("memory://bench-snapshots");
    let database = DatabaseKey::new("bench")?;
    let clock = SystemClock::shared();
    Ok(RuntimeStores {
        log,
        leases: LeaseStore::new(
            store.clone(),
            database.clone(),
            LeaseConfig::default(),
            clock.clone(),
        )?,
        snapshots: SnapshotStore::new(store, database, SnapshotConfig::default(), clock),
    })
}

/// The embedded default under `dir`, as `chorus serve --data-dir dir` opens it.
pub(super) async fn embedded_stores(dir: &std::path::Path) -> Result<RuntimeStores, CommandError> {
    let store = StoreArgs {
        replicas: Vec::new(),
        register: None,
        data_dir: Some(dir.to_owned()),
        config: None,
    };
    let database = DatabaseArgs {
        store: None,
        db: None,
        data_dir: Some(dir.to_owned()),
        config: None,
    };
    let location = store.resolve()?;
    let database = database.resolve()?;
    let snapshots = chorus::snapshot::SnapshotConfig::default();
    crate::serve_cmd::open_stores(
        &location,
        &database,
        LeaseConfig::default(),
        snapshots,
        Duration::ZERO,
    )
    .await
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    fn header<'a>(name: &'a str, value: &'a [u8]) -> httparse::Header<'a> {
        httparse::Header { name, value }
    }

    #[test]
    fn a_body_length_comes_from_content_length_only() {
        assert_eq!(body_length(&[header("Content-Length", b"17")]).unwrap(), 17);
        let errors = [
            (vec![], "without a content-length"),
            (vec![header("content-length", b"x")], "content-length \"x\""),
            (
                vec![header("transfer-encoding", b"chunked")],
                "transfer-encoding chunked",
            ),
        ];
        for (headers, expected) in errors {
            let error = body_length(&headers).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        }
    }

    /// Arguments for a client of a test service: a bearer token, 3-byte values.
    fn test_args() -> KvBenchArgs {
        KvBenchArgs {
            url: None,
            token: Some("t0ken".into()),
            server_pid: None,
            replicas: 3,
            latency_ms: 10,
            value_bytes: 3,
            clients: 1,
            threads: 1,
            seconds: 1,
            light_puts: 1,
            keys: 1,
            pipeline_gets: 1,
            target: Vec::new(),
            json: false,
        }
    }

    /// Answers arrive in pieces and in the order asked; a 404 is `Ok(false)`;
    /// the service's close is an error.
    #[tokio::test]
    async fn a_connection_reads_answers_split_anywhere() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/prefix/", listener.local_addr().unwrap());
        let service = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut requests = Vec::new();
            let mut buffer = [0u8; 4096];
            let answers: [&[&[u8]]; 2] = [
                &[
                    b"HTTP/1.1 200 OK\r\ncon",
                    b"tent-length: 5\r\n\r\nhel",
                    b"lo",
                ],
                &[b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}"],
            ];
            for pieces in answers {
                let read = stream.read(&mut buffer).await.unwrap();
                requests.push(String::from_utf8_lossy(&buffer[..read]).into_owned());
                for piece in pieces {
                    stream.write_all(piece).await.unwrap();
                    stream.flush().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            // The third request is read, then the connection closed.
            let _ = stream.read(&mut buffer).await.unwrap();
            requests
        });
        let client = Client::new(&url, &test_args()).unwrap();
        let mut connection = client.connect().await.unwrap();
        assert!(connection.send(Operation::Put, "a/b").await.unwrap());
        assert!(!connection.send(Operation::Get, "c").await.unwrap());
        let error = connection.send(Operation::Get, "c").await.unwrap_err();
        assert!(
            error.to_string().contains("closed the connection"),
            "{error}"
        );
        let requests = service.await.unwrap();
        let authority = client.authority;
        assert_eq!(
            requests,
            [
                format!(
                    "PUT /prefix/v1/kv/a/b HTTP/1.1\r\nhost: {authority}\r\nauthorization: Bearer t0ken\r\ncontent-length: 3\r\n\r\nvvv"
                ),
                format!(
                    "GET /prefix/v1/kv/c HTTP/1.1\r\nhost: {authority}\r\nauthorization: Bearer t0ken\r\n\r\n"
                ),
            ]
        );
    }

    /// Pipelined gets go out in one write, before any answer; the answers,
    /// arriving together and split anywhere, are reported in order.
    #[tokio::test]
    async fn pipelined_gets_are_written_at_once_and_answered_in_order() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let service = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut received = Vec::new();
            let mut buffer = [0u8; 4096];
            while received.windows(4).filter(|w| w == b"\r\n\r\n").count() < 3 {
                let read = stream.read(&mut buffer).await.unwrap();
                received.extend_from_slice(&buffer[..read]);
            }
            let answers = b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\naHTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nc";
            for piece in answers.chunks(7) {
                stream.write_all(piece).await.unwrap();
            }
            String::from_utf8(received).unwrap()
        });
        let client = Client::new(&url, &test_args()).unwrap();
        let mut connection = client.connect().await.unwrap();
        let mut answers = Vec::new();
        let sent = connection.send_all(Operation::Get, &["a", "b", "c"], |ok| answers.push(ok));
        // The service answers only once it has all three requests.
        tokio::time::timeout(Duration::from_secs(10), sent)
            .await
            .expect("all three gets written before any answer was awaited")
            .unwrap();
        assert_eq!(answers, [true, false, true]);
        let authority = client.authority;
        let head = format!(" HTTP/1.1\r\nhost: {authority}\r\nauthorization: Bearer t0ken\r\n\r\n");
        assert_eq!(
            service.await.unwrap(),
            format!("GET /v1/kv/a{head}GET /v1/kv/b{head}GET /v1/kv/c{head}")
        );
    }

    /// A service that is not ready yet (503) is asked again, on a new
    /// connection, until it is; one that never is fails the benchmark with
    /// what it last answered.
    #[tokio::test]
    async fn the_benchmark_waits_until_the_service_is_ready() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/prefix", listener.local_addr().unwrap());
        let service = tokio::spawn(async move {
            let mut requests = Vec::new();
            let mut buffer = [0u8; 4096];
            for answer in [
                &b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"[..],
                &b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"[..],
            ] {
                let (mut stream, _) = listener.accept().await.unwrap();
                let read = stream.read(&mut buffer).await.unwrap();
                requests.push(String::from_utf8_lossy(&buffer[..read]).into_owned());
                stream.write_all(answer).await.unwrap();
            }
            requests
        });
        let client = Client::new(&url, &test_args()).unwrap();
        client
            .wait_until_ready("test", Duration::from_secs(10))
            .await
            .unwrap();
        let requests = service.await.unwrap();
        assert_eq!(requests.len(), 2);
        assert!(
            requests
                .iter()
                .all(|r| r.starts_with("GET /prefix/readyz HTTP/1.1\r\n")),
            "{requests:?}"
        );

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let mut buffer = [0u8; 4096];
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                let _ = stream.read(&mut buffer).await.unwrap();
                let answer = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n";
                stream.write_all(answer).await.unwrap();
            }
        });
        let client = Client::new(&url, &test_args()).unwrap();
        let error = client
            .wait_until_ready("the service", Duration::from_millis(300))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("not ready within 300ms (GET /readyz answered 503)"),
            "{error}"
        );
    }
}
