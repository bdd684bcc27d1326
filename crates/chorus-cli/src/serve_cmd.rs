//! `chorus serve`: the key-value service over the runtime, on the embedded
//! default (no configuration) or on the configured stores.
//!
//! Startup creates the log if the register has none yet, opens the snapshot
//! and lease store, starts the runtime (which boots as primary, or stands by
//! while another process holds the lease), and serves HTTP. SIGTERM or
//! SIGINT shuts down gracefully: the listener closes and requests in flight
//! finish, then the runtime drains, publishes a final snapshot and releases
//! the lease. A second signal exits at once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chorus::clock::SystemClock;
use chorus::kv::{KvState, Retention, idempotency};
use chorus::lease::{HolderId, LeaseConfig, LeaseStore};
use chorus::runtime::{Role, Runtime, RuntimeConfig, RuntimeStores};
use chorus::snapshot::{SnapshotConfig, SnapshotStore};
use chorus_server::{AppState, ServiceConfig};
use serde_json::json;
use tokio::sync::watch;

use crate::CommandError;
use crate::config::{DatabaseArgs, DatabaseLocation, Location, StoreArgs};
use crate::lease_cmd::open_for_write;
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

    /// This instance's URL as clients and other instances reach it
    /// [default: http://<listen address>].
    #[arg(long, env = "CHORUS_ADVERTISE_URL")]
    advertise_url: Option<String>,

    /// Lease holder id; must name one live process at a time. A standby
    /// redirects writers to the holder id, so the default is the advertised
    /// URL [default: the advertised URL].
    #[arg(long, env = "CHORUS_HOLDER")]
    holder: Option<String>,

    /// Lease time to live. Bounds the takeover time after a crash (about
    /// ttl + 1 s); shorter means more lease writes (one every ttl / 3).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..=3600))]
    lease_ttl_secs: u64,

    /// Publish a snapshot (and truncate the log below it) after this many records.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_every_records: u64,

    /// …or at least this often while records arrive.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_interval_secs: u64,

    /// Take the lease over even while another holder's is live (a higher
    /// term fences it). Only when that holder is known to be gone.
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

    /// Idempotency keys remembered for exactly-once writes; beyond this many
    /// the oldest are forgotten. Each costs about 100 bytes of memory and of
    /// every snapshot (plus the key of a remembered 412).
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
    service: ServiceConfig,
    listen: SocketAddr,
    data_dir: Option<PathBuf>,
}

/// The runtime settings `serve` takes from its flags.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    every_records: u64,
    interval: Duration,
    force: bool,
    lease_check_interval: Duration,
}

impl Resolved {
    /// The runtime configuration for `holder`.
    fn runtime(&self, holder: HolderId) -> RuntimeConfig {
        let mut runtime = RuntimeConfig::new(holder);
        runtime.snapshot_every_records = self.schedule.every_records;
        runtime.snapshot_interval = self.schedule.interval;
        runtime.force = self.schedule.force;
        runtime.lease_check_interval = self.schedule.lease_check_interval;
        runtime
    }

    /// The advertised URL: the flag, or `http://` and the bound address.
    fn advertise_url(&self, bound: SocketAddr) -> String {
        self.service
            .advertise_url
            .clone()
            .unwrap_or_else(|| format!("http://{bound}"))
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
            interval: Duration::from_secs(self.snapshot_interval_secs),
            force: self.force,
            lease_check_interval: (ttl / 20)
                .clamp(Duration::from_millis(100), Duration::from_secs(1)),
        };
        let token = match (&self.token, &self.token_file) {
            (Some(token), _) => Some(token.clone()),
            (None, Some(path)) => Some(read_token(path)?),
            (None, None) => None,
        };
        let service = ServiceConfig {
            token,
            max_body_bytes: self.max_body_bytes,
            request_timeout: Duration::from_secs(self.request_timeout_secs),
            advertise_url: self.advertise_url.clone(),
            ready_as_standby: self.ready_as_standby,
            idempotency: Retention {
                max_keys: self.idempotency_max_keys,
                max_age_ms: self.idempotency_max_age_secs * 1000,
            },
        };
        Ok(Resolved {
            location,
            database,
            holder,
            schedule,
            lease,
            service,
            listen: self.listen,
            data_dir: self.store.data_dir.clone(),
        })
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
    let config = json!({
        "listen": resolved.listen.to_string(),
        "advertise_url": advertise_url,
        "holder": holder,
        "replicas": resolved.location.replicas.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "register": resolved.location.register.to_string(),
        "snapshot_store": resolved.database.store.to_string(),
        "db": resolved.database.database.as_str(),
        "lease_ttl_secs": resolved.lease.ttl.as_secs(),
        "snapshot_every_records": schedule.every_records,
        "snapshot_interval_secs": schedule.interval.as_secs(),
        "force": schedule.force,
        "token": service.token.as_ref().map(|_| "<redacted>"),
        "ready_as_standby": service.ready_as_standby,
        "max_body_bytes": service.max_body_bytes,
        "request_timeout_secs": service.request_timeout.as_secs(),
        "idempotency_max_keys": service.idempotency.max_keys,
        "idempotency_max_age_secs": service.idempotency.max_age_ms / 1000,
    });
    outln!("{}", serde_json::to_string_pretty(&config)?)?;
    Ok(())
}

async fn serve(resolved: Resolved) -> Result<(), CommandError> {
    let metrics = chorus_server::install_metrics_recorder()?;
    let stores = open_stores(&resolved.location, &resolved.database, resolved.lease).await?;
    let listener = tokio::net::TcpListener::bind(resolved.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", resolved.listen))?;
    let bound = listener.local_addr()?;
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
    if let Some(dir) = &resolved.data_dir {
        tracing::debug!(data_dir = %dir.display(), "data directory");
    }
    tokio::spawn(report_roles(Arc::clone(&runtime)));
    let (stop_streams, shutdown) = watch::channel(false);
    let mut service = resolved.service;
    service.advertise_url = Some(advertise);
    let app = Arc::new(AppState {
        runtime: Arc::clone(&runtime),
        config: service,
        metrics: Some(metrics),
        shutdown,
    });
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
    chorus_server::serve(listener, app, until)
        .await
        .map_err(|e| format!("http server failed: {e}"))?;
    runtime.shutdown().await?;
    outln!("chorus serve: stopped")?;
    Ok(())
}

/// Creates the log if needed and opens a database's stores: the log (every
/// replica probed), and the snapshot store holding its snapshots and lease.
pub async fn open_stores(
    location: &Location,
    database: &DatabaseLocation,
    lease: LeaseConfig,
) -> Result<RuntimeStores, CommandError> {
    create_log(location, DEFAULT_WINDOW).await?;
    let log = open_log(location, Access::Write).await?.stores;
    let store = open_for_write(database).await?;
    let key = database.database.clone();
    let clock = SystemClock::shared();
    let leases = LeaseStore::new(store.clone(), key.clone(), lease, clock.clone())?;
    let snapshots = SnapshotStore::new(store, key, SnapshotConfig::default(), clock);
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

/// Resolves at the first SIGTERM or SIGINT; a second one exits at once.
async fn wait_for_signals(first: tokio::sync::oneshot::Sender<()>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot install signal handlers; stop with SIGKILL");
        return;
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    tracing::info!("shutting down (a second signal exits at once)");
    let _ = first.send(());
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    std::process::exit(130);
}
