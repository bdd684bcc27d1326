//! Naming and opening stores by URL.
//!
//! | URL                           | backend                                        |
//! |-------------------------------|------------------------------------------------|
//! | `file:///abs/dir`             | [`LocalDirStore`]                              |
//! | `memory://name`               | [`MemoryStore`], in this process, shared by name |
//! | `s3://bucket/prefix`          | S3 or an S3-compatible server                  |
//! | `gs://bucket/prefix`          | Google Cloud Storage                           |
//! | `az://container/prefix`       | Azure Blob Storage                             |
//!
//! Credentials never come from the URL: they come from the usual environment
//! variables (`AWS_*`, `GOOGLE_*`, `AZURE_*`) or, for S3, from [`S3Settings`]
//! (`chorus.toml`'s `[s3]` table). Per-store options go in the query string:
//! `endpoint=<url>` (S3-compatible servers), `region=<name>`, `allow_http=true`;
//! what the URL leaves unset comes from [`S3Settings`], then the environment.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AwsCredential;
use object_store::{ClientConfigKey, ObjectStore, RetryConfig};
use url::Url;

use super::{
    BlobError, DynBlobStore, InstrumentedStore, LocalDirStore, MemoryStore, ObjectStoreBlobs, Op,
    probe,
};

/// The kinds of store a URL can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    File,
    Memory,
    S3,
    Gcs,
    Azure,
}

/// A parsed, validated store URL. Parsing does no I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreUrl {
    scheme: Scheme,
    /// Bucket, container or memory-store name; empty for `file`.
    bucket: String,
    /// Path inside the bucket (or the absolute directory for `file`), no trailing `/`.
    path: String,
    endpoint: Option<String>,
    region: Option<String>,
    /// `None` leaves the choice to the environment (`AWS_ALLOW_HTTP`, …).
    allow_http: Option<bool>,
    /// Static credentials (object_store's `Debug` hides the secrets).
    credentials: Option<Arc<AwsCredential>>,
}

/// Settings for every `s3://` store that does not set them in its own URL
/// (`chorus.toml`'s `[s3]` table). Whatever is still unset comes from the
/// `AWS_*` environment variables.
#[derive(Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3Settings {
    /// Endpoint of an S3-compatible server, e.g. `http://127.0.0.1:9000`.
    pub endpoint: Option<String>,
    /// Region name.
    pub region: Option<String>,
    /// Permit plain-HTTP endpoints.
    pub allow_http: Option<bool>,
    /// Access key id; needs `secret_access_key` too.
    pub access_key_id: Option<String>,
    /// Secret access key; needs `access_key_id` too.
    pub secret_access_key: Option<String>,
    /// Session token of temporary credentials.
    pub session_token: Option<String>,
}

impl fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("allow_http", &self.allow_http)
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// A store URL that could not be parsed; the message names the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid store URL {url:?}: {reason}")]
pub struct StoreUrlError {
    url: String,
    reason: String,
}

impl FromStr for StoreUrl {
    type Err = StoreUrlError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let fail = |reason: &str| StoreUrlError {
            url: text.to_owned(),
            reason: reason.to_owned(),
        };
        let url = Url::parse(text).map_err(|e| fail(&e.to_string()))?;
        let scheme = match url.scheme() {
            "file" => Scheme::File,
            "memory" => Scheme::Memory,
            "s3" => Scheme::S3,
            "gs" => Scheme::Gcs,
            "az" => Scheme::Azure,
            other => {
                return Err(fail(&format!(
                    "unsupported scheme {other:?} (expected file, memory, s3, gs or az)"
                )));
            }
        };
        if !url.username().is_empty() || url.password().is_some() {
            return Err(fail(
                "credentials do not belong in a store URL; use the environment",
            ));
        }
        let bucket = url.host_str().unwrap_or("").to_owned();
        if scheme == Scheme::File && !bucket.is_empty() {
            return Err(fail("file URLs take no host: use file:///absolute/dir"));
        }
        let path = match scheme {
            // Local paths are stored decoded ("a%20b" is the directory "a b").
            Scheme::File => match url.to_file_path() {
                Ok(path) => path.to_string_lossy().trim_end_matches('/').to_owned(),
                Err(()) => return Err(fail("file URLs need an absolute path: file:///abs/dir")),
            },
            _ => url.path().trim_end_matches('/').to_owned(),
        };
        match scheme {
            Scheme::File if path.is_empty() => return Err(fail("file URL needs a directory")),
            Scheme::File => {}
            _ if bucket.is_empty() => return Err(fail("missing bucket, container or name")),
            _ => {}
        }
        let mut parsed = StoreUrl {
            scheme,
            bucket,
            path,
            endpoint: None,
            region: None,
            allow_http: None,
            credentials: None,
        };
        for (name, value) in url.query_pairs() {
            match (name.as_ref(), scheme) {
                ("endpoint", Scheme::S3 | Scheme::Gcs | Scheme::Azure) => {
                    check_endpoint(&value).map_err(|reason| fail(&reason))?;
                    parsed.endpoint = Some(value.into_owned());
                }
                ("region", Scheme::S3) => parsed.region = Some(value.into_owned()),
                ("allow_http", Scheme::S3 | Scheme::Gcs | Scheme::Azure) => {
                    parsed.allow_http = Some(
                        value
                            .parse()
                            .map_err(|_| fail("allow_http must be true or false"))?,
                    );
                }
                (other, _) => {
                    return Err(fail(&format!("unknown option {other:?} for this scheme")));
                }
            }
        }
        Ok(parsed)
    }
}

impl StoreUrl {
    /// The URL of a local directory store at the absolute path `dir`.
    pub fn local(dir: &std::path::Path) -> StoreUrl {
        assert!(dir.is_absolute(), "local store paths are absolute");
        StoreUrl {
            scheme: Scheme::File,
            bucket: String::new(),
            path: dir.to_string_lossy().trim_end_matches('/').to_owned(),
            endpoint: None,
            region: None,
            allow_http: None,
            credentials: None,
        }
    }

    /// Fills what an `s3://` URL leaves unset from `settings`; other schemes
    /// are returned unchanged. The URL's own options win.
    pub fn with_s3_settings(mut self, settings: &S3Settings) -> Result<StoreUrl, StoreUrlError> {
        if self.scheme != Scheme::S3 {
            return Ok(self);
        }
        let url = self.identity();
        let fail = |reason: String| StoreUrlError {
            url: url.clone(),
            reason,
        };
        if self.endpoint.is_none()
            && let Some(endpoint) = &settings.endpoint
        {
            check_endpoint(endpoint).map_err(|reason| fail(format!("s3.{reason}")))?;
            self.endpoint = Some(endpoint.clone());
        }
        self.region = self.region.or_else(|| settings.region.clone());
        self.allow_http = self.allow_http.or(settings.allow_http);
        self.credentials = match (&settings.access_key_id, &settings.secret_access_key) {
            (Some(id), Some(secret)) => Some(Arc::new(AwsCredential {
                key_id: id.clone(),
                secret_key: secret.clone(),
                token: settings.session_token.clone(),
            })),
            (None, None) if settings.session_token.is_none() => None,
            (None, None) => {
                return Err(fail(
                    "s3.session_token needs s3.access_key_id and s3.secret_access_key".into(),
                ));
            }
            (Some(_), None) => {
                return Err(fail("s3.access_key_id needs s3.secret_access_key".into()));
            }
            (None, Some(_)) => {
                return Err(fail("s3.secret_access_key needs s3.access_key_id".into()));
            }
        };
        Ok(self)
    }

    /// The identity of the location this URL names, used to bind replicas in the
    /// register: scheme, bucket, path and endpoint; not region or transport options.
    pub fn identity(&self) -> String {
        let base = match self.scheme {
            Scheme::File => url::Url::from_file_path(&self.path)
                .map(String::from)
                .unwrap_or_else(|()| format!("file://{}", self.path)),
            Scheme::Memory => format!("memory://{}{}", self.bucket, self.path),
            Scheme::S3 => format!("s3://{}{}", self.bucket, self.path),
            Scheme::Gcs => format!("gs://{}{}", self.bucket, self.path),
            Scheme::Azure => format!("az://{}{}", self.bucket, self.path),
        };
        match &self.endpoint {
            Some(endpoint) => format!("{base}?endpoint={endpoint}"),
            None => base,
        }
    }

    /// A URL for the sub-location `child` (a `/`-separated relative path).
    pub fn join(&self, child: &str) -> StoreUrl {
        let mut joined = self.clone();
        joined.path = format!("{}/{}", self.path, child.trim_matches('/'));
        joined
    }

    /// The directory of a `file://` URL, if it is one.
    pub fn local_dir(&self) -> Option<&str> {
        (self.scheme == Scheme::File).then_some(self.path.as_str())
    }

    fn object_store(&self) -> Result<Arc<dyn ObjectStore>, object_store::Error> {
        // Bounded client retries: the protocol has its own retry and shedding
        // policy, and a request must not hang a lane for minutes.
        let retry = RetryConfig {
            max_retries: 3,
            retry_timeout: Duration::from_secs(15),
            ..RetryConfig::default()
        };
        // Set client options key by key: replacing the builder's whole
        // `ClientOptions` would drop what `from_env` read (`AWS_ALLOW_HTTP`, …).
        let client = [
            (ClientConfigKey::Timeout, "10s".to_owned()),
            (ClientConfigKey::ConnectTimeout, "5s".to_owned()),
        ]
        .into_iter()
        .chain(
            self.allow_http
                .map(|allow| (ClientConfigKey::AllowHttp, allow.to_string())),
        );
        Ok(match self.scheme {
            Scheme::S3 => {
                use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
                let mut builder = AmazonS3Builder::from_env()
                    .with_bucket_name(&self.bucket)
                    .with_retry(retry);
                for (key, value) in client {
                    builder = builder.with_config(AmazonS3ConfigKey::Client(key), value);
                }
                if let Some(endpoint) = &self.endpoint {
                    builder = builder.with_endpoint(endpoint);
                }
                if let Some(region) = &self.region {
                    builder = builder.with_region(region);
                }
                if let Some(credentials) = &self.credentials {
                    // A provider, not the key fields: those would be combined
                    // with an `AWS_SESSION_TOKEN` that `from_env` read.
                    let credential = AwsCredential {
                        key_id: credentials.key_id.clone(),
                        secret_key: credentials.secret_key.clone(),
                        token: credentials.token.clone(),
                    };
                    builder = builder.with_credentials(Arc::new(
                        object_store::StaticCredentialProvider::new(credential),
                    ));
                }
                Arc::new(builder.build()?)
            }
            Scheme::Gcs => {
                use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
                let mut builder = GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(&self.bucket)
                    .with_retry(retry);
                for (key, value) in client {
                    builder = builder.with_config(GoogleConfigKey::Client(key), value);
                }
                if let Some(endpoint) = &self.endpoint {
                    builder = builder.with_base_url(endpoint);
                }
                Arc::new(builder.build()?)
            }
            Scheme::Azure => {
                use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
                let mut builder = MicrosoftAzureBuilder::from_env()
                    .with_container_name(&self.bucket)
                    .with_retry(retry);
                for (key, value) in client {
                    builder = builder.with_config(AzureConfigKey::Client(key), value);
                }
                if let Some(endpoint) = &self.endpoint {
                    builder = builder.with_endpoint(endpoint.clone());
                }
                Arc::new(builder.build()?)
            }
            Scheme::File | Scheme::Memory => {
                unreachable!("file and memory stores are not object_store backed")
            }
        })
    }
}

/// An endpoint must be a URL without credentials: it is shown in messages
/// and bound into the register as part of the replica's identity.
fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let url = Url::parse(endpoint).map_err(|e| format!("endpoint: {e}"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err("endpoint: credentials do not belong in an endpoint URL".into());
    }
    Ok(())
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.identity())
    }
}

/// Opens the store `url` names without probing it (for tests and wrappers that
/// probe the outermost layer themselves).
/// Every store is traced and measured ([`InstrumentedStore`]).
pub fn open_store_unprobed(url: &StoreUrl) -> Result<DynBlobStore, BlobError> {
    let store: DynBlobStore = match url.scheme {
        Scheme::File => Arc::new(LocalDirStore::open(&url.path)?),
        Scheme::Memory => Arc::new(MemoryStore::shared(
            &url.bucket,
            url.path.trim_start_matches('/'),
            url.identity(),
        )),
        Scheme::S3 | Scheme::Gcs | Scheme::Azure => {
            let name = url.identity();
            let store = url
                .object_store()
                .map_err(|e| BlobError::backend(&name, Op::Create, "", e))?;
            let prefix = url.path.trim_start_matches('/');
            Arc::new(ObjectStoreBlobs::new(store, prefix, name))
        }
    };
    Ok(Arc::new(InstrumentedStore::new(store)))
}

/// Opens the store `url` names and runs the capability [`probe`] on it, refusing
/// stores that do not enforce conditional writes.
pub async fn open_store(url: &StoreUrl) -> Result<DynBlobStore, BlobError> {
    let store = open_store_unprobed(url)?;
    probe(store.as_ref()).await?;
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<StoreUrl, StoreUrlError> {
        text.parse()
    }

    #[test]
    fn identities_ignore_transport_options() {
        let url = parse(
            "s3://bucket/log/?region=eu-west-1&endpoint=http://127.0.0.1:5101&allow_http=true",
        )
        .unwrap();
        assert_eq!(
            url.identity(),
            "s3://bucket/log?endpoint=http://127.0.0.1:5101"
        );
        assert_eq!(parse("file:///tmp/x/").unwrap().identity(), "file:///tmp/x");
        assert_eq!(
            parse("memory://zone-a").unwrap().identity(),
            "memory://zone-a"
        );
    }

    #[test]
    fn bad_urls_name_the_problem() {
        let cases = [
            ("not a url", "relative URL"),
            ("ftp://x/y", "unsupported scheme"),
            ("file://host/dir", "take no host"),
            ("s3:///prefix", "missing bucket"),
            ("s3://b/p?colour=red", "unknown option"),
            ("s3://b/p?allow_http=maybe", "allow_http"),
            ("s3://key:secret@b/p", "credentials"),
            (
                "s3://b/p?endpoint=http://key:secret@h:1",
                "credentials do not belong",
            ),
            ("memory://m?region=x", "unknown option"),
        ];
        for (text, expected) in cases {
            let error = parse(text).unwrap_err().to_string();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn gcs_and_azure_urls_parse_with_their_options() {
        let gs = parse("gs://bucket/log/?endpoint=http://127.0.0.1:4443&allow_http=true").unwrap();
        assert_eq!(
            gs.identity(),
            "gs://bucket/log?endpoint=http://127.0.0.1:4443"
        );
        let az = parse("az://container/a/b").unwrap();
        assert_eq!(az.identity(), "az://container/a/b");
        let error = parse("az://container/log?region=x")
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown option \"region\""), "{error}");
        let error = parse("gs:///log").unwrap_err().to_string();
        assert!(error.contains("missing bucket"), "{error}");
    }

    fn settings() -> S3Settings {
        S3Settings {
            endpoint: Some("http://127.0.0.1:9000".into()),
            region: Some("eu-west-1".into()),
            allow_http: Some(true),
            access_key_id: Some("AKID".into()),
            secret_access_key: Some("very-secret".into()),
            session_token: None,
        }
    }

    #[test]
    fn s3_settings_fill_what_the_url_leaves_unset() {
        let url = parse("s3://bucket/log")
            .unwrap()
            .with_s3_settings(&settings())
            .unwrap();
        assert_eq!(url.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(url.region.as_deref(), Some("eu-west-1"));
        assert_eq!(url.allow_http, Some(true));
        assert_eq!(url.credentials.as_ref().unwrap().key_id, "AKID");
        // The endpoint is part of the identity the register binds.
        assert_eq!(
            url.identity(),
            "s3://bucket/log?endpoint=http://127.0.0.1:9000"
        );
    }

    #[test]
    fn the_urls_own_options_win_over_s3_settings() {
        let url = parse("s3://bucket/log?endpoint=http://h:1&region=us-east-1&allow_http=false")
            .unwrap()
            .with_s3_settings(&settings())
            .unwrap();
        assert_eq!(url.endpoint.as_deref(), Some("http://h:1"));
        assert_eq!(url.region.as_deref(), Some("us-east-1"));
        assert_eq!(url.allow_http, Some(false));
    }

    #[test]
    fn s3_settings_leave_other_schemes_alone() {
        let url = parse("file:///tmp/x").unwrap();
        assert_eq!(url.clone().with_s3_settings(&settings()).unwrap(), url);
    }

    #[test]
    fn incomplete_s3_credentials_are_named() {
        let cases = [
            (
                Some("id"),
                None,
                None,
                "s3.access_key_id needs s3.secret_access_key",
            ),
            (
                None,
                Some("secret"),
                None,
                "s3.secret_access_key needs s3.access_key_id",
            ),
            (None, None, Some("token"), "s3.session_token needs"),
        ];
        for (id, secret, token, expected) in cases {
            let settings = S3Settings {
                access_key_id: id.map(Into::into),
                secret_access_key: secret.map(Into::into),
                session_token: token.map(Into::into),
                ..S3Settings::default()
            };
            let error = parse("s3://b/p")
                .unwrap()
                .with_s3_settings(&settings)
                .unwrap_err();
            assert!(error.to_string().contains(expected), "{error}");
        }
        let bad_endpoint = S3Settings {
            endpoint: Some("not a url".into()),
            ..S3Settings::default()
        };
        let error = parse("s3://b/p")
            .unwrap()
            .with_s3_settings(&bad_endpoint)
            .unwrap_err();
        assert!(error.to_string().contains("s3.endpoint"), "{error}");
        let secret_endpoint = S3Settings {
            endpoint: Some("http://key:secret@h:1".into()),
            ..S3Settings::default()
        };
        let error = parse("s3://b/p")
            .unwrap()
            .with_s3_settings(&secret_endpoint)
            .unwrap_err();
        assert!(
            error.to_string().contains("s3.endpoint: credentials"),
            "{error}"
        );
    }

    #[test]
    fn debug_output_never_shows_secrets() {
        let url = parse("s3://bucket/log")
            .unwrap()
            .with_s3_settings(&settings())
            .unwrap();
        let shown = format!("{url:?} {:?}", settings());
        assert!(shown.contains("AKID"), "{shown}");
        assert!(!shown.contains("very-secret"), "{shown}");
    }

    /// Building a client does no I/O; the endpoint option must reach the
    /// builder as an endpoint (a GCS endpoint once went to the builder's
    /// `gs://` URL parser and was refused). Azure also needs an account from
    /// the environment; the Azurite tests build it.
    #[test]
    fn s3_and_gcs_build_a_client_with_an_endpoint() {
        for text in [
            "s3://b/p?endpoint=http://127.0.0.1:1&allow_http=true&region=us-east-1",
            "gs://b/p?endpoint=http://127.0.0.1:1&allow_http=true",
        ] {
            let url = parse(text).unwrap();
            if let Err(error) = url.object_store() {
                panic!("{text}: {error}");
            }
        }
    }

    #[test]
    fn join_appends_a_child_path() {
        let url = parse("s3://bucket/base?endpoint=http://h:1").unwrap();
        assert_eq!(
            url.join("replica-0").identity(),
            "s3://bucket/base/replica-0?endpoint=http://h:1"
        );
    }
}
