//! The register as a row in PostgreSQL: `UPDATE … WHERE name = $1 AND version = $2`.
//!
//! Connections are plain TCP (no TLS in this build); reach a remote server
//! through a TLS-terminating proxy or a private network.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Mutex;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, NoTls};

use super::OpenMode;
use super::sql::{decode_row, encode_fields, expected_counter, first_version, next_version};
use super::{
    DEFAULT_MAX_DIRECTORY_BYTES, Fields, ManifestStore, RegisterError, RegisterVersion,
    VersionedManifest,
};

/// The server ends a session left idle inside a transaction after this long.
const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on connecting and on each statement; past it the outcome is unknown.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A register stored as one row of table `chorus_register` in PostgreSQL.
#[derive(Debug)]
pub struct PostgresRegister {
    config: Config,
    client: Mutex<Option<Arc<Client>>>,
    register: String,
    name: String,
}

impl PostgresRegister {
    /// Connects with `config`, creates the table if `mode` allows and it is
    /// missing, and binds the register named `register`. `name` is for messages
    /// and must hold no secrets.
    pub async fn open(
        mut config: Config,
        register: &str,
        name: String,
        mode: OpenMode,
    ) -> Result<PostgresRegister, RegisterError> {
        config.connect_timeout(CALL_TIMEOUT);
        // Every call is one autocommit statement, so no transaction outlives
        // a round trip; still, bound what a stalled client could hold: a row
        // lock waits at most `lock_timeout`, and a session idle inside a
        // transaction is ended by the server.
        let bounded = format!(
            "{} -c lock_timeout={}ms -c idle_in_transaction_session_timeout={}ms",
            config.get_options().unwrap_or_default(),
            CALL_TIMEOUT.as_millis(),
            IDLE_IN_TRANSACTION_TIMEOUT.as_millis()
        );
        config.options(bounded.trim_start());
        let store = PostgresRegister {
            config,
            client: Mutex::new(None),
            register: register.to_owned(),
            name,
        };
        match mode {
            OpenMode::CreateIfMissing => store.ensure_table().await?,
            // Connect now so an unreachable server is reported at open.
            OpenMode::MustExist | OpenMode::ReadOnly => drop(store.client().await?),
        }
        Ok(store)
    }

    async fn ensure_table(&self) -> Result<(), RegisterError> {
        let create = "CREATE TABLE IF NOT EXISTS chorus_register (
                          name    TEXT PRIMARY KEY,
                          version BIGINT NOT NULL,
                          fields  TEXT NOT NULL
                      )";
        match self
            .call(|client| async move { client.batch_execute(create).await })
            .await
        {
            // Two processes creating the table at once: one loses on the catalog's
            // unique index, and the table exists either way.
            Err(RegisterError::AlreadyExists { .. }) | Ok(()) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Runs one statement on a (re)connected client, bounded by [`CALL_TIMEOUT`].
    async fn call<T, F, Fut>(&self, work: F) -> Result<T, RegisterError>
    where
        F: FnOnce(Arc<Client>) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let client = self.client().await?;
        match tokio::time::timeout(CALL_TIMEOUT, work(client)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(self.error(error).await),
            Err(_) => {
                *self.client.lock().await = None;
                Err(RegisterError::unavailable(
                    &self.name,
                    "statement timed out",
                ))
            }
        }
    }

    async fn client(&self) -> Result<Arc<Client>, RegisterError> {
        let mut slot = self.client.lock().await;
        if let Some(client) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(Arc::clone(client));
        }
        let connecting = self.config.connect(NoTls);
        let (client, connection) = match tokio::time::timeout(CALL_TIMEOUT, connecting).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(error)) => return Err(RegisterError::unavailable(&self.name, error)),
            Err(_) => return Err(RegisterError::unavailable(&self.name, "connect timed out")),
        };
        let name = self.name.clone();
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::warn!(register = %name, %error, "postgres connection ended");
            }
        });
        let client = Arc::new(client);
        *slot = Some(Arc::clone(&client));
        Ok(client)
    }

    async fn error(&self, error: tokio_postgres::Error) -> RegisterError {
        let Some(code) = error.code() else {
            // No SQL state: the connection failed; the statement may have applied.
            *self.client.lock().await = None;
            return RegisterError::unavailable(&self.name, error);
        };
        if *code == SqlState::UNIQUE_VIOLATION {
            return RegisterError::already_exists(&self.name);
        }
        let transient = [
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
        ];
        if transient.contains(code) {
            RegisterError::unavailable(&self.name, error)
        } else {
            RegisterError::backend(&self.name, error)
        }
    }
}

#[async_trait]
impl ManifestStore for PostgresRegister {
    fn name(&self) -> &str {
        &self.name
    }

    async fn read(&self) -> Result<Option<VersionedManifest>, RegisterError> {
        let register = self.register.clone();
        let row = self
            .call(|client| async move {
                client
                    .query_opt(
                        "SELECT version, fields FROM chorus_register WHERE name = $1",
                        &[&register],
                    )
                    .await
            })
            .await?;
        row.map(|row| decode_row(&self.name, row.get(0), row.get(1)))
            .transpose()
    }

    async fn create(&self, fields: &Fields) -> Result<RegisterVersion, RegisterError> {
        let register = self.register.clone();
        let fields = encode_fields(fields);
        self.call(|client| async move {
            client
                .execute(
                    "INSERT INTO chorus_register (name, version, fields) VALUES ($1, 1, $2)",
                    &[&register, &fields],
                )
                .await
        })
        .await?;
        Ok(first_version())
    }

    async fn update(
        &self,
        version: &RegisterVersion,
        fields: &Fields,
    ) -> Result<RegisterVersion, RegisterError> {
        let expected = expected_counter(&self.name, version)?;
        let register = self.register.clone();
        let fields = encode_fields(fields);
        let changed = self
            .call(|client| async move {
                client
                    .execute(
                        "UPDATE chorus_register SET version = version + 1, fields = $3
                         WHERE name = $1 AND version = $2",
                        &[&register, &expected, &fields],
                    )
                    .await
            })
            .await?;
        if changed == 0 {
            return Err(RegisterError::conflict(&self.name));
        }
        Ok(next_version(expected))
    }

    fn max_directory_bytes(&self) -> usize {
        DEFAULT_MAX_DIRECTORY_BYTES
    }
}
