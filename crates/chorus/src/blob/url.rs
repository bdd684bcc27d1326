//! Naming and opening stores by URL.
//!
//! | URL                           | backend                                        |
//! |-------------------------------|------------------------------------------------|
//! | `file:///abs/dir`             | [`LocalDirStore`]                              |
//! | `memory://name`               | in-process `object_store::memory::InMemory`, shared by name |
//! | `s3://bucket/prefix`          | S3 or an S3-compatible server                  |
//! | `gs://bucket/prefix`          | Google Cloud Storage                           |
//! | `az://container/prefix`       | Azure Blob Storage                             |
//!
//! Credentials come from the usual environment variables (`AWS_*`, `GOOGLE_*`,
//! `AZURE_*`), never from the URL. Per-store options go in the query string:
//! `endpoint=<url>` (S3-compatible servers), `region=<name>`, `allow_http=true`.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::{ClientOptions, ObjectStore, RetryConfig};
use url::Url;

use super::{
    BlobError, DynBlobStore, InstrumentedStore, LocalDirStore, ObjectStoreBlobs, Op, probe,
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
    allow_http: bool,
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
            allow_http: false,
        };
        for (name, value) in url.query_pairs() {
            match (name.as_ref(), scheme) {
                ("endpoint", Scheme::S3 | Scheme::Gcs | Scheme::Azure) => {
                    Url::parse(&value).map_err(|e| fail(&format!("endpoint: {e}")))?;
                    parsed.endpoint = Some(value.into_owned());
                }
                ("region", Scheme::S3) => parsed.region = Some(value.into_owned()),
                ("allow_http", Scheme::S3 | Scheme::Gcs | Scheme::Azure) => {
                    parsed.allow_http = value
                        .parse()
                        .map_err(|_| fail("allow_http must be true or false"))?;
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
            allow_http: false,
        }
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
        let client = ClientOptions::new()
            .with_timeout(Duration::from_secs(10))
            .with_connect_timeout(Duration::from_secs(5))
            .with_allow_http(self.allow_http);
        Ok(match self.scheme {
            Scheme::Memory => shared_memory_store(&self.bucket),
            Scheme::S3 => {
                let mut builder = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(&self.bucket)
                    .with_retry(retry)
                    .with_client_options(client);
                if let Some(endpoint) = &self.endpoint {
                    builder = builder.with_endpoint(endpoint);
                }
                if let Some(region) = &self.region {
                    builder = builder.with_region(region);
                }
                Arc::new(builder.build()?)
            }
            Scheme::Gcs => {
                let mut builder = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(&self.bucket)
                    .with_retry(retry)
                    .with_client_options(client);
                if let Some(endpoint) = &self.endpoint {
                    builder = builder.with_url(endpoint);
                }
                Arc::new(builder.build()?)
            }
            Scheme::Azure => {
                let mut builder = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_container_name(&self.bucket)
                    .with_retry(retry)
                    .with_client_options(client);
                if let Some(endpoint) = &self.endpoint {
                    builder = builder.with_endpoint(endpoint.clone());
                }
                Arc::new(builder.build()?)
            }
            Scheme::File => unreachable!("file stores are not object_store backed"),
        })
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.identity())
    }
}

/// One in-memory store per name per process, so that opening `memory://x` twice
/// reaches the same objects (as two handles on one bucket would).
fn shared_memory_store(name: &str) -> Arc<dyn ObjectStore> {
    static STORES: LazyLock<Mutex<HashMap<String, Arc<InMemory>>>> =
        LazyLock::new(Default::default);
    let mut stores = STORES.lock().expect("memory store registry poisoned");
    stores.entry(name.to_owned()).or_default().clone()
}

/// Opens the store `url` names without probing it (for tests and wrappers that
/// probe the outermost layer themselves).
/// Every store is traced and measured ([`InstrumentedStore`]).
pub fn open_store_unprobed(url: &StoreUrl) -> Result<DynBlobStore, BlobError> {
    let store: DynBlobStore = match url.local_dir() {
        Some(dir) => Arc::new(LocalDirStore::open(dir)?),
        None => {
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
            ("memory://m?region=x", "unknown option"),
        ];
        for (text, expected) in cases {
            let error = parse(text).unwrap_err().to_string();
            assert!(error.contains(expected), "{text}: {error}");
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
