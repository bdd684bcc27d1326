//! The embedded default register: a row in a SQLite database file.
//!
//! `synchronous=FULL` makes every committed update durable before it returns;
//! SQLite's file locking makes create and update atomic across processes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, ErrorCode, OptionalExtension, params};

use super::OpenMode;
use super::sql::{decode_row, encode_fields, expected_counter, first_version, next_version};
use super::{
    DEFAULT_MAX_DIRECTORY_BYTES, Fields, ManifestStore, RegisterError, RegisterVersion,
    VersionedManifest,
};

/// How long a call waits for another process's lock before reporting `Unavailable`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// A register stored as one row of table `chorus_register` in a SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteRegister {
    connection: Arc<Mutex<Connection>>,
    register: String,
    name: String,
}

impl SqliteRegister {
    /// Opens the database at `path` and the register named `register` inside
    /// it; with [`OpenMode::CreateIfMissing`] the file and table are created if
    /// needed, otherwise nothing is created.
    pub fn open(
        path: &Path,
        register: &str,
        mode: OpenMode,
    ) -> Result<SqliteRegister, RegisterError> {
        let name = format!("sqlite://{}?name={register}", path.display());
        if mode != OpenMode::CreateIfMissing && !path.exists() {
            return Err(RegisterError::backend(
                &name,
                format!("no register database at {}", path.display()),
            ));
        }
        if mode == OpenMode::CreateIfMissing
            && let Some(parent) = path.parent()
        {
            std::fs::create_dir_all(parent).map_err(|e| {
                RegisterError::backend(&name, format!("cannot create {}: {e}", parent.display()))
            })?;
        }
        let open = || -> rusqlite::Result<Connection> {
            if mode == OpenMode::ReadOnly {
                // No journal-mode change, no table: a reader writes nothing.
                let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
                    | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
                let connection = Connection::open_with_flags(path, flags)?;
                connection.busy_timeout(BUSY_TIMEOUT)?;
                return Ok(connection);
            }
            let connection = Connection::open(path)?;
            connection.busy_timeout(BUSY_TIMEOUT)?;
            connection.pragma_update(None, "journal_mode", "WAL")?;
            connection.pragma_update(None, "synchronous", "FULL")?;
            if mode == OpenMode::MustExist {
                return Ok(connection);
            }
            connection.execute(
                "CREATE TABLE IF NOT EXISTS chorus_register (
                     name    TEXT PRIMARY KEY,
                     version INTEGER NOT NULL,
                     fields  TEXT NOT NULL
                 )",
                [],
            )?;
            Ok(connection)
        };
        let connection = open().map_err(|e| sql_error(&name, e))?;
        Ok(SqliteRegister {
            connection: Arc::new(Mutex::new(connection)),
            register: register.to_owned(),
            name,
        })
    }

    /// The database file's path, from the register's name.
    pub fn path(&self) -> PathBuf {
        let connection = self.connection.lock().expect("sqlite connection poisoned");
        PathBuf::from(connection.path().unwrap_or_default())
    }

    /// Runs `work` on the connection off the async runtime.
    async fn with_connection<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection, &str, &str) -> Result<T, RegisterError> + Send + 'static,
    ) -> Result<T, RegisterError> {
        let connection = Arc::clone(&self.connection);
        let register = self.register.clone();
        let name = self.name.clone();
        tokio::task::spawn_blocking(move || {
            let connection = connection.lock().expect("sqlite connection poisoned");
            work(&connection, &register, &name)
        })
        .await
        .map_err(|e| RegisterError::backend(&self.name, e))?
    }
}

fn sql_error(name: &str, error: rusqlite::Error) -> RegisterError {
    match error.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => RegisterError::unavailable(
            name,
            format!(
                "register busy: another process holds its lock \
                 (it may be stopped inside a transaction): {error}"
            ),
        ),
        Some(ErrorCode::ConstraintViolation) => RegisterError::already_exists(name),
        _ => RegisterError::backend(name, error),
    }
}

#[async_trait]
impl ManifestStore for SqliteRegister {
    fn name(&self) -> &str {
        &self.name
    }

    async fn read(&self) -> Result<Option<VersionedManifest>, RegisterError> {
        self.with_connection(|connection, register, name| {
            let row: Option<(i64, String)> = connection
                .query_row(
                    "SELECT version, fields FROM chorus_register WHERE name = ?1",
                    params![register],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()
                .map_err(|e| sql_error(name, e))?;
            row.map(|(version, fields)| decode_row(name, version, &fields))
                .transpose()
        })
        .await
    }

    async fn create(&self, fields: &Fields) -> Result<RegisterVersion, RegisterError> {
        let fields = encode_fields(fields);
        self.with_connection(move |connection, register, name| {
            connection
                .execute(
                    "INSERT INTO chorus_register (name, version, fields) VALUES (?1, 1, ?2)",
                    params![register, fields],
                )
                .map_err(|e| sql_error(name, e))?;
            Ok(first_version())
        })
        .await
    }

    async fn update(
        &self,
        version: &RegisterVersion,
        fields: &Fields,
    ) -> Result<RegisterVersion, RegisterError> {
        let expected = expected_counter(&self.name, version)?;
        let fields = encode_fields(fields);
        self.with_connection(move |connection, register, name| {
            let changed = connection
                .execute(
                    "UPDATE chorus_register SET version = version + 1, fields = ?3
                     WHERE name = ?1 AND version = ?2",
                    params![register, expected, fields],
                )
                .map_err(|e| sql_error(name, e))?;
            if changed == 0 {
                return Err(RegisterError::conflict(name));
            }
            Ok(next_version(expected))
        })
        .await
    }

    fn max_directory_bytes(&self) -> usize {
        DEFAULT_MAX_DIRECTORY_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a register locked by another connection (a process
    /// stopped inside its write transaction keeps the lock) failed with a
    /// bare `database is locked`, which the CLI answered with "run `chorus
    /// log init` first". It is a transient, named condition.
    #[tokio::test]
    async fn a_locked_register_is_reported_busy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("register.db");
        let register = SqliteRegister::open(&path, "chorus", OpenMode::CreateIfMissing).unwrap();
        let fields: Fields = [("chorus.format".to_owned(), "1".to_owned())].into();
        let version = register.create(&fields).await.unwrap();
        let holder = rusqlite::Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();

        let error = register.update(&version, &fields).await.unwrap_err();
        assert!(error.is_transient(), "{error}");
        assert!(
            error
                .to_string()
                .contains("register busy: another process holds its lock"),
            "{error}"
        );
        holder.execute_batch("ROLLBACK").unwrap();
        register.update(&version, &fields).await.unwrap();
    }
}
