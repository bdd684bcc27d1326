//! Helpers shared by the integration tests: where the test services are.
//!
//! `scripts/services.sh start` runs three S3-compatible servers, Azurite and PostgreSQL
//! and writes their addresses to `.ci/state/env`; `scripts/test.sh` exports them.
//! Without them a test skips with a message, except under CI (`CI` set), where
//! a missing service fails the test loudly.

#![allow(dead_code)] // each test binary uses a different subset

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The value of the service variable `name`, or `None` (after printing why)
/// when it is unset outside CI. Panics under CI.
pub fn service_var(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => Some(value),
        _ if std::env::var_os("CI").is_some() => {
            panic!(
                "{name} is not set under CI: the test services did not start (scripts/services.sh)"
            )
        }
        _ => {
            eprintln!(
                "skipping: {name} is not set; run `bash scripts/services.sh start` and source .ci/state/env"
            );
            None
        }
    }
}

/// A name no other test run uses, for prefixes and register names.
pub fn unique(label: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{label}-{nanos:x}-{:x}-{count}", std::process::id())
}

/// The URL of an S3 store: `prefix` in `bucket` of the server at
/// `endpoint` (`http://host:port`), as the test servers take it.
pub fn s3_url(bucket: &str, prefix: &str, endpoint: &str) -> String {
    format!("s3://{bucket}/{prefix}?endpoint={endpoint}&allow_http=true&region=us-east-1")
}

/// URLs of S3 stores under a fresh prefix, one per zone (three zones).
pub fn s3_urls(label: &str) -> Option<Vec<String>> {
    let endpoints = service_var("CHORUS_TEST_S3_ENDPOINTS")?;
    let buckets = service_var("CHORUS_TEST_S3_BUCKETS")?;
    let prefix = unique(label);
    let urls = endpoints
        .split(',')
        .zip(buckets.split(','))
        .map(|(endpoint, bucket)| s3_url(bucket, &prefix, endpoint))
        .collect();
    Some(urls)
}

/// An `az://` URL under a fresh prefix in the Azurite test container.
pub fn azure_url(label: &str) -> Option<String> {
    let container = service_var("CHORUS_TEST_AZURE_CONTAINER")?;
    service_var("AZURE_STORAGE_USE_EMULATOR")?;
    Some(format!("az://{container}/{}", unique(label)))
}

/// A PostgreSQL register URL naming a fresh register.
pub fn postgres_register_url(label: &str) -> Option<String> {
    let base = service_var("CHORUS_TEST_POSTGRES_URL")?;
    let separator = if base.contains('?') { '&' } else { '?' };
    Some(format!("{base}{separator}register={}", unique(label)))
}
