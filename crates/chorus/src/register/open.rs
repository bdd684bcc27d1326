//! Naming and opening registers by URL.
//!
//! | URL                                          | backend              |
//! |----------------------------------------------|----------------------|
//! | `sqlite:///abs/file.db[?name=N]`             | [`SqliteRegister`]   |
//! | `postgres://user@host:port/db[?register=N]`  | [`PostgresRegister`] |
//! | any store URL (`file://`, `s3://`, …)        | [`ObjectRegister`] in that store |
//!
//! `N` names the register inside the database (default `chorus`), so one
//! database can hold the registers of several logs.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use url::Url;

use super::{ManifestStore, ObjectRegister, PostgresRegister, RegisterError, SqliteRegister};
use crate::blob::{S3Settings, StoreUrl, StoreUrlError, open_store, open_store_unprobed};

/// The register name used when the URL names none.
pub const DEFAULT_REGISTER_NAME: &str = "chorus";

/// A parsed, validated register URL. Parsing does no I/O.
#[derive(Clone, PartialEq, Eq)]
pub enum RegisterUrl {
    /// A SQLite database file.
    Sqlite {
        /// Absolute path of the database file.
        path: PathBuf,
        /// Register name inside the database.
        register: String,
    },
    /// A PostgreSQL database.
    Postgres {
        /// The connection URL without our `register` option.
        connection: String,
        /// Register name inside the database.
        register: String,
    },
    /// A JSON object in a blob store.
    Object(StoreUrl),
}

/// A register URL that could not be parsed; the message names the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid register URL {url:?}: {reason}")]
pub struct RegisterUrlError {
    url: String,
    reason: String,
}

impl FromStr for RegisterUrl {
    type Err = RegisterUrlError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let fail = |reason: String| RegisterUrlError {
            url: redact(text),
            reason,
        };
        let url = Url::parse(text).map_err(|e| fail(e.to_string()))?;
        match url.scheme() {
            "sqlite" => parse_sqlite(&url).map_err(fail),
            "postgres" | "postgresql" => parse_postgres(url).map_err(fail),
            _ => text
                .parse::<StoreUrl>()
                .map(RegisterUrl::Object)
                .map_err(|e| fail(e.to_string())),
        }
    }
}

fn parse_sqlite(url: &Url) -> Result<RegisterUrl, String> {
    if url.host_str().is_some_and(|h| !h.is_empty()) {
        return Err("sqlite URLs take an absolute path: sqlite:///abs/file.db".into());
    }
    if url.path().is_empty() || url.path().ends_with('/') {
        return Err("missing database file path".into());
    }
    let mut register = DEFAULT_REGISTER_NAME.to_owned();
    for (name, value) in url.query_pairs() {
        match name.as_ref() {
            "name" => register = value.into_owned(),
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok(RegisterUrl::Sqlite {
        path: PathBuf::from(url.path()),
        register: checked_name(register)?,
    })
}

fn parse_postgres(mut url: Url) -> Result<RegisterUrl, String> {
    let mut register = DEFAULT_REGISTER_NAME.to_owned();
    let mut kept = Vec::new();
    for (name, value) in url.query_pairs() {
        match name.as_ref() {
            "register" => register = value.into_owned(),
            _ => kept.push((name.into_owned(), value.into_owned())),
        }
    }
    url.set_query(None);
    if !kept.is_empty() {
        url.query_pairs_mut().extend_pairs(kept);
    }
    let connection = url.to_string();
    tokio_postgres::Config::from_str(&connection).map_err(|e| e.to_string())?;
    Ok(RegisterUrl::Postgres {
        connection,
        register: checked_name(register)?,
    })
}

fn checked_name(register: String) -> Result<String, String> {
    let valid = !register.is_empty()
        && register.len() <= 128
        && register
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if valid {
        Ok(register)
    } else {
        Err(format!(
            "register name {register:?} must be 1-128 of [A-Za-z0-9._-]"
        ))
    }
}

/// The URL with any password replaced, for messages.
fn redact(text: &str) -> String {
    match Url::parse(text) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("***"));
            url.to_string()
        }
        _ => text.to_owned(),
    }
}

impl RegisterUrl {
    /// The URL of the register `chorus` in the SQLite file at `path`.
    pub fn sqlite(path: PathBuf) -> RegisterUrl {
        RegisterUrl::Sqlite {
            path,
            register: DEFAULT_REGISTER_NAME.to_owned(),
        }
    }

    /// Whether the register lives on this machine (a SQLite file, or an object
    /// register in a local directory).
    pub fn is_local(&self) -> bool {
        match self {
            RegisterUrl::Sqlite { .. } => true,
            RegisterUrl::Postgres { .. } => false,
            RegisterUrl::Object(store) => store.local_dir().is_some(),
        }
    }

    /// Applies `settings` to an object register on S3 (see
    /// [`StoreUrl::with_s3_settings`]); other registers are returned unchanged.
    pub fn with_s3_settings(self, settings: &S3Settings) -> Result<RegisterUrl, StoreUrlError> {
        match self {
            RegisterUrl::Object(store) => {
                Ok(RegisterUrl::Object(store.with_s3_settings(settings)?))
            }
            other => Ok(other),
        }
    }
}

impl fmt::Display for RegisterUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegisterUrl::Sqlite { path, register } => {
                write!(f, "sqlite://{}?name={register}", path.display())
            }
            RegisterUrl::Postgres {
                connection,
                register,
            } => {
                let separator = if connection.contains('?') { '&' } else { '?' };
                write!(f, "{}{separator}register={register}", redact(connection))
            }
            RegisterUrl::Object(store) => write!(f, "{store}"),
        }
    }
}

impl fmt::Debug for RegisterUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Display already redacts secrets; Debug must not leak them either.
        write!(f, "RegisterUrl({self})")
    }
}

/// Whether opening a register may create its database file or table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Create the database file or table if missing (for `log init`).
    CreateIfMissing,
    /// Create nothing; a missing database is an error (for writers).
    MustExist,
    /// Create nothing and write nothing, not even to probe or to set up the
    /// database (for commands that only read).
    ReadOnly,
}

/// Opens the register `url` names. Object registers are probed like any store.
pub async fn open_register(
    url: &RegisterUrl,
    mode: OpenMode,
) -> Result<Arc<dyn ManifestStore>, RegisterError> {
    match url {
        RegisterUrl::Sqlite { path, register } => {
            let path = path.clone();
            let register = register.clone();
            let opened =
                tokio::task::spawn_blocking(move || SqliteRegister::open(&path, &register, mode))
                    .await
                    .map_err(|e| RegisterError::backend(&url.to_string(), e))??;
            Ok(Arc::new(opened))
        }
        RegisterUrl::Postgres {
            connection,
            register,
        } => {
            let config = tokio_postgres::Config::from_str(connection)
                .map_err(|e| RegisterError::backend(&url.to_string(), e))?;
            let opened = PostgresRegister::open(config, register, url.to_string(), mode).await?;
            Ok(Arc::new(opened))
        }
        RegisterUrl::Object(store_url) => {
            // Opening a local store creates its directory: a register that
            // must exist is not conjured up by looking for it.
            if mode != OpenMode::CreateIfMissing
                && let Some(dir) = store_url.local_dir()
                && !Path::new(dir).exists()
            {
                return Err(RegisterError::backend(
                    &url.to_string(),
                    format!("no register directory at {dir}"),
                ));
            }
            // The probe writes; a reader relies on the writers' probes.
            let store = match mode {
                OpenMode::ReadOnly => open_store_unprobed(store_url),
                OpenMode::CreateIfMissing | OpenMode::MustExist => open_store(store_url).await,
            }
            .map_err(|e| RegisterError::backend(&url.to_string(), e))?;
            Ok(Arc::new(ObjectRegister::new(store)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_backend() {
        let sqlite: RegisterUrl = "sqlite:///tmp/r.db?name=orders".parse().unwrap();
        assert_eq!(sqlite.to_string(), "sqlite:///tmp/r.db?name=orders");
        let pg: RegisterUrl = "postgresql://u:secret@127.0.0.1:5499/db?register=x&sslmode=disable"
            .parse()
            .unwrap();
        let shown = pg.to_string();
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("register=x"), "{shown}");
        assert!(matches!(
            "s3://bucket/log".parse::<RegisterUrl>().unwrap(),
            RegisterUrl::Object(_)
        ));
    }

    #[test]
    fn bad_urls_name_the_problem() {
        let cases = [
            ("sqlite://host/x.db", "absolute path"),
            ("sqlite:///tmp/x.db?colour=red", "unknown option"),
            ("sqlite:///tmp/x.db?name=a%20b", "register name"),
            ("ftp://x/y", "unsupported scheme"),
        ];
        for (text, expected) in cases {
            let error = text.parse::<RegisterUrl>().unwrap_err().to_string();
            assert!(error.contains(expected), "{text}: {error}");
        }
        let error = "postgres://u:pw@h/db?bogus=1"
            .parse::<RegisterUrl>()
            .unwrap_err()
            .to_string();
        assert!(!error.contains("pw@"), "{error}");
    }
}
