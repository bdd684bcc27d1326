//! Where the log (and a database's snapshots and lease) live: flags, `CHORUS_*`
//! environment variables, a `chorus.toml` file, or the embedded default, in
//! that order of precedence.
//!
//! Resolution is in two stages: [`StoreArgs`] (parsed input, no I/O) becomes a
//! [`Location`] (validated URLs) in [`StoreArgs::resolve`]; opening the stores
//! happens later, in the command.

use std::path::{Path, PathBuf};

use chorus::blob::{S3Settings, StoreUrl};
use chorus::register::RegisterUrl;
use serde::Deserialize;

/// Replicas of the embedded default.
pub const DEFAULT_REPLICA_COUNT: usize = 3;
/// The embedded default's register directory (an object register), under the data dir.
const DEFAULT_REGISTER_DIR: &str = "register";
/// The SQLite register file of data directories made before the object register
/// became the default; still used where present.
const LEGACY_REGISTER_FILE: &str = "register.db";

/// The store options every log command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreArgs {
    /// Replica store URLs in order, comma-separated (1, 3 or 5).
    #[arg(long, env = "CHORUS_REPLICAS", value_delimiter = ',')]
    pub replicas: Vec<String>,

    /// Register URL: sqlite:///abs/file.db, postgres://…, or a store URL.
    #[arg(long, env = "CHORUS_REGISTER")]
    pub register: Option<String>,

    /// Directory of the embedded default (three local replicas and an object
    /// register in a local store), used for whatever --replicas / --register
    /// leave unset.
    #[arg(long, env = "CHORUS_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Configuration file; `chorus.toml` in the current directory is read if present.
    #[arg(long, env = "CHORUS_CONFIG")]
    pub config: Option<PathBuf>,
}

/// The contents of a `chorus.toml`; one file serves every command.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    replicas: Option<Vec<String>>,
    register: Option<String>,
    data_dir: Option<PathBuf>,
    /// Store of snapshots and the writer lease (`snapshot`, `lease`).
    snapshot_store: Option<String>,
    /// Database name inside it.
    db: Option<String>,
    /// Endpoint, region, transport and credentials for every `s3://` store
    /// whose URL does not set them.
    #[serde(default)]
    s3: S3Settings,
}

impl FileConfig {
    /// Reads `path` (which must exist), or `chorus.toml` in the current
    /// directory if present.
    fn load(path: Option<&Path>) -> Result<FileConfig, ConfigError> {
        let (path, required) = match path {
            Some(path) => (path.to_owned(), true),
            None => (PathBuf::from("chorus.toml"), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(FileConfig::default());
            }
            Err(e) => {
                return Err(ConfigError(format!(
                    "cannot read config file {}: {e}",
                    path.display()
                )));
            }
        };
        toml::from_str(&text).map_err(|e| {
            // toml's own message spans several lines; errors here are one line.
            let line = e
                .span()
                .map_or(1, |span| text[..span.start].matches('\n').count() + 1);
            ConfigError(format!(
                "invalid config file {} line {line}: {}",
                path.display(),
                e.message()
            ))
        })
    }
}

/// The embedded default's directory, unless a flag, the environment or the
/// file names another.
fn data_dir(flag: Option<&Path>, file: Option<&Path>) -> Result<PathBuf, ConfigError> {
    absolute(flag.or(file).unwrap_or(Path::new("chorus-data")))
}

/// A validated log location.
#[derive(Debug, Clone)]
pub struct Location {
    /// Replica stores, in order.
    pub replicas: Vec<StoreUrl>,
    /// The register.
    pub register: RegisterUrl,
    /// The embedded default's directory, when a replica or the register
    /// lives in it: writers create it (only it, inside an existing parent).
    pub data_dir: Option<PathBuf>,
}

impl Location {
    /// The replica identities the register binds, in order.
    pub fn replica_identities(&self) -> Vec<String> {
        self.replicas.iter().map(StoreUrl::identity).collect()
    }
}

/// A configuration problem, with a message naming it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl StoreArgs {
    /// Merges flags and environment (already in `self`) with the config file and
    /// the embedded default, and validates every URL. Reads only the config file.
    pub fn resolve(&self) -> Result<Location, ConfigError> {
        let file = FileConfig::load(self.config.as_deref())?;
        let data_dir = data_dir(self.data_dir.as_deref(), file.data_dir.as_deref())?;
        let mut uses_data_dir = false;
        let replicas = match (self.replicas.is_empty(), file.replicas) {
            (false, _) => parse_replicas(&self.replicas, &file.s3)?,
            (true, Some(replicas)) => parse_replicas(&replicas, &file.s3)?,
            (true, None) => {
                uses_data_dir = true;
                (0..DEFAULT_REPLICA_COUNT)
                    .map(|i| StoreUrl::local(&data_dir.join(format!("replica-{i}"))))
                    .collect()
            }
        };
        check_replica_list(&replicas)?;
        let register = match self.register.clone().or(file.register) {
            Some(url) => url
                .parse::<RegisterUrl>()
                .map_err(|e| e.to_string())
                .and_then(|url| url.with_s3_settings(&file.s3).map_err(|e| e.to_string()))
                .map_err(|e| ConfigError(format!("register: {e}")))?,
            None => {
                uses_data_dir = true;
                default_register(&data_dir)
            }
        };
        Ok(Location {
            replicas,
            register,
            data_dir: uses_data_dir.then_some(data_dir),
        })
    }
}

/// The embedded default's register: the object register in the local store
/// `<data dir>/register`, which no stopped process can lock; or the SQLite
/// `register.db` that a data directory made by an older chorus holds.
fn default_register(data_dir: &Path) -> RegisterUrl {
    let legacy = data_dir.join(LEGACY_REGISTER_FILE);
    if legacy.exists() {
        RegisterUrl::sqlite(legacy)
    } else {
        RegisterUrl::Object(StoreUrl::local(&data_dir.join(DEFAULT_REGISTER_DIR)))
    }
}

fn check_replica_list(replicas: &[StoreUrl]) -> Result<(), ConfigError> {
    if ![1, 3, 5].contains(&replicas.len()) {
        return Err(ConfigError(format!(
            "replicas: {} given; Chorus runs on 1, 3 or 5 replicas",
            replicas.len()
        )));
    }
    for (position, replica) in replicas.iter().enumerate() {
        if replicas[..position]
            .iter()
            .any(|r| r.identity() == replica.identity())
        {
            return Err(ConfigError(format!(
                "replicas: {replica} is listed twice; each replica must be a distinct location"
            )));
        }
    }
    Ok(())
}

fn absolute(path: &Path) -> Result<PathBuf, ConfigError> {
    std::path::absolute(path).map_err(|e| ConfigError(format!("data dir {}: {e}", path.display())))
}

fn parse_replicas(urls: &[String], s3: &S3Settings) -> Result<Vec<StoreUrl>, ConfigError> {
    urls.iter()
        .map(|url| parse_store(url, s3))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ConfigError(format!("replicas: {e}")))
}

/// Parses a store URL and fills what it leaves unset from the `[s3]` settings.
fn parse_store(url: &str, s3: &S3Settings) -> Result<StoreUrl, chorus::blob::StoreUrlError> {
    url.trim().parse::<StoreUrl>()?.with_s3_settings(s3)
}

/// Where one database's snapshots and writer lease live, for the `snapshot`
/// and `lease` commands: `--store` (or `CHORUS_SNAPSHOT_STORE`), defaulting to
/// the embedded `file://<data dir>/snapshots-store`, and `--db` naming the
/// database inside it; each also from `chorus.toml` (`snapshot_store`, `db`,
/// `data_dir`).
#[derive(Debug, Clone, clap::Args)]
pub struct DatabaseArgs {
    /// Store URL holding <db>/HEAD.json, <db>/snapshots/ and <db>/lease.json
    /// [default: file://<data dir>/snapshots-store].
    #[arg(long, env = "CHORUS_SNAPSHOT_STORE")]
    pub store: Option<String>,

    /// Database name: one key segment of letters, digits, '-', '_', '.', '='
    /// [default: default].
    #[arg(long, env = "CHORUS_DB")]
    pub db: Option<String>,

    /// Directory of the embedded default store, used when --store is unset.
    #[arg(long, env = "CHORUS_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Configuration file; `chorus.toml` in the current directory is read if present.
    #[arg(long, env = "CHORUS_CONFIG")]
    pub config: Option<PathBuf>,
}

/// A validated database location.
#[derive(Debug, Clone)]
pub struct DatabaseLocation {
    /// The store.
    pub store: StoreUrl,
    /// The database inside it.
    pub database: chorus::lease::DatabaseKey,
    /// The embedded default's directory, when the store lives in it.
    pub data_dir: Option<PathBuf>,
}

impl DatabaseArgs {
    /// Merges flags and environment with the config file, validates the
    /// database name and the store URL (or builds the default). Reads only
    /// the config file.
    pub fn resolve(&self) -> Result<DatabaseLocation, ConfigError> {
        let file = FileConfig::load(self.config.as_deref())?;
        let db = self
            .db
            .as_deref()
            .or(file.db.as_deref())
            .unwrap_or("default");
        let database =
            chorus::lease::DatabaseKey::new(db).map_err(|e| ConfigError(format!("db: {e}")))?;
        let (store, data_dir) = match self.store.as_ref().or(file.snapshot_store.as_ref()) {
            Some(url) => (
                parse_store(url, &file.s3).map_err(|e| ConfigError(format!("store: {e}")))?,
                None,
            ),
            None => {
                let data_dir = data_dir(self.data_dir.as_deref(), file.data_dir.as_deref())?;
                (
                    StoreUrl::local(&data_dir.join("snapshots-store")),
                    Some(data_dir),
                )
            }
        };
        Ok(DatabaseLocation {
            store,
            database,
            data_dir,
        })
    }
}

/// Creates the embedded default's directory if it is missing: only that
/// directory, inside an existing parent, so a data directory on an unmounted
/// volume is refused rather than created on the mount point.
pub fn ensure_data_dir(dir: &Path) -> Result<(), ConfigError> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(ConfigError(format!(
            "data dir {}: not a directory",
            dir.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(ConfigError(format!(
            "data dir {}: its parent does not exist; chorus creates only the data directory \
             itself (is a volume not mounted?)",
            dir.display()
        ))),
        Err(e) => Err(ConfigError(format!("data dir {}: {e}", dir.display()))),
    }
}
