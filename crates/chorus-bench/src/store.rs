//! The stores every system in a comparison writes to: in-memory stores whose
//! every request first waits a draw from a [`Latency`] model and is counted
//! by price class, through one [`Charger`] per store.
//!
//! Two faces on the same charging: [`InjectedStore`], an `object_store`
//! store over `object_store`'s in-memory store, for SlateDB (which speaks
//! `object_store`); and [`InjectedBlobs`], a Chorus [`BlobStore`] over a
//! [`MemoryStore`], for Chorus and the naive log. The second keeps the parts
//! of a multi-part create as they are, as a real store's upload does not
//! copy them either (`object_store`'s in-memory store joins them into a new
//! buffer on every put, so a sealed segment written from its fragments'
//! buffers would be copied once per replica, a cost no real store has).
//!
//! The delays end by [`Timer::Precise`] (within tens of microseconds of
//! their deadline, where tokio's millisecond timer adds up to a
//! millisecond), so a light-load figure measures the system, not the timer.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chorus::blob::{Blob, BlobError, BlobStore, DynBlobStore, Latency, MemoryStore, Version};
use chorus::timer::Timer;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::cost::RequestCounts;

/// How S3 prices a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// PUT, COPY, POST, LIST (and each multipart step).
    Put,
    /// GET, HEAD.
    Get,
    /// DELETE and multipart aborts: free.
    Delete,
}

/// Requests and uploaded bytes, shared by every store of one system so that
/// one snapshot gives the system's total.
#[derive(Debug, Default)]
pub struct Counters {
    put_class: AtomicU64,
    get_class: AtomicU64,
    deletes: AtomicU64,
    bytes_put: AtomicU64,
}

impl Counters {
    /// The counts so far.
    pub fn snapshot(&self) -> RequestCounts {
        RequestCounts {
            put_class: self.put_class.load(Ordering::Relaxed),
            get_class: self.get_class.load(Ordering::Relaxed),
            deletes: self.deletes.load(Ordering::Relaxed),
            bytes_put: self.bytes_put.load(Ordering::Relaxed),
        }
    }

    fn add(&self, class: Class, bytes: u64) {
        let counter = match class {
            Class::Put => &self.put_class,
            Class::Get => &self.get_class,
            Class::Delete => &self.deletes,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.bytes_put.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// Counts a request and draws its delay; shared by a store and its uploads.
#[derive(Debug, Clone)]
pub struct Charger {
    latency: Latency,
    rng: Arc<Mutex<StdRng>>,
    counters: Arc<Counters>,
    timer: Timer,
}

impl Charger {
    /// Delays drawn from `latency` (following `seed`), ended by `timer`,
    /// requests counted into `counters`.
    pub fn new(latency: Latency, seed: u64, counters: Arc<Counters>, timer: Timer) -> Charger {
        Charger {
            latency,
            rng: Arc::new(Mutex::new(StdRng::seed_from_u64(seed))),
            counters,
            timer,
        }
    }

    /// Counts one request of `class` carrying `bytes` and returns its delay.
    fn charge(&self, class: Class, bytes: u64) -> Duration {
        self.counters.add(class, bytes);
        let mut rng = self.rng.lock().expect("latency rng poisoned");
        self.latency.sample(&mut *rng)
    }

    async fn wait(&self, class: Class, bytes: u64) {
        self.timer.sleep(self.charge(class, bytes)).await;
    }
}

/// An in-memory object store whose every request waits a drawn delay first
/// and is counted in shared [`Counters`].
#[derive(Debug)]
pub struct InjectedStore {
    inner: Arc<dyn ObjectStore>,
    charger: Charger,
}

impl InjectedStore {
    /// A fresh, empty in-memory store whose requests `charger` delays and
    /// counts.
    pub fn memory(charger: Charger) -> Arc<InjectedStore> {
        Arc::new(InjectedStore {
            inner: Arc::new(InMemory::new()),
            charger,
        })
    }
}

/// A fresh in-memory Chorus store whose every request waits a drawn delay
/// first and is counted, as [`InjectedStore`]'s are.
#[derive(Debug)]
pub struct InjectedBlobs {
    inner: MemoryStore,
    charger: Charger,
}

impl InjectedBlobs {
    /// A fresh, empty store named `name` whose requests `charger` delays
    /// and counts.
    pub fn memory(name: impl Into<String>, charger: Charger) -> DynBlobStore {
        Arc::new(InjectedBlobs {
            inner: MemoryStore::new(name),
            charger,
        })
    }
}

#[async_trait]
impl BlobStore for InjectedBlobs {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn create_parts(&self, key: &str, parts: PutPayload) -> Result<Version, BlobError> {
        let bytes = parts.content_length() as u64;
        self.charger.wait(Class::Put, bytes).await;
        self.inner.create_parts(key, parts).await
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        bytes: Bytes,
    ) -> Result<Version, BlobError> {
        self.charger.wait(Class::Put, bytes.len() as u64).await;
        self.inner.update(key, expected, bytes).await
    }

    async fn get(&self, key: &str) -> Result<Blob, BlobError> {
        self.charger.wait(Class::Get, 0).await;
        self.inner.get(key).await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BlobError> {
        self.charger.wait(Class::Get, 0).await;
        self.inner.get_range(key, range).await
    }

    async fn head(&self, key: &str) -> Result<chorus::blob::ObjectMeta, BlobError> {
        self.charger.wait(Class::Get, 0).await;
        self.inner.head(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<chorus::blob::ObjectMeta>, BlobError> {
        self.charger.wait(Class::Put, 0).await;
        self.inner.list(prefix).await
    }

    async fn delete(&self, key: &str) -> Result<(), BlobError> {
        self.charger.wait(Class::Delete, 0).await;
        self.inner.delete(key).await
    }
}

impl fmt::Display for InjectedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "injected({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for InjectedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let bytes = payload.content_length() as u64;
        self.charger.wait(Class::Put, bytes).await;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.charger.wait(Class::Put, 0).await;
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(InjectedUpload {
            inner,
            charger: self.charger.clone(),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.charger.wait(Class::Get, 0).await;
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let charger = self.charger.clone();
        let delayed = locations.then(move |location| {
            let delay = charger.charge(Class::Delete, 0);
            let timer = charger.timer;
            async move {
                timer.sleep(delay).await;
                location
            }
        });
        self.inner.delete_stream(delayed.boxed())
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let delay = self.charger.charge(Class::Put, 0);
        let inner = Arc::clone(&self.inner);
        let prefix = prefix.cloned();
        futures::stream::once(self.charger.timer.sleep(delay))
            .flat_map(move |()| inner.list(prefix.as_ref()))
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.charger.wait(Class::Put, 0).await;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.charger.wait(Class::Put, 0).await;
        self.inner.copy_opts(from, to, options).await
    }
}

/// A multipart upload through an [`InjectedStore`]: each part and the
/// completion are requests of their own.
#[derive(Debug)]
struct InjectedUpload {
    inner: Box<dyn MultipartUpload>,
    charger: Charger,
}

#[async_trait]
impl MultipartUpload for InjectedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let delay = self
            .charger
            .charge(Class::Put, data.content_length() as u64);
        let part = self.inner.put_part(data);
        let timer = self.charger.timer;
        Box::pin(async move {
            timer.sleep(delay).await;
            part.await
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.charger.wait(Class::Put, 0).await;
        self.inner.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.charger.wait(Class::Delete, 0).await;
        self.inner.abort().await
    }
}

#[cfg(test)]
mod tests {
    use object_store::ObjectStoreExt;
    use tokio::time::Instant;

    use super::*;

    const DELAY: Duration = Duration::from_millis(7);

    /// Fixed delays on the paused test clock, counted into `counters`.
    fn charger(counters: &Arc<Counters>) -> Charger {
        Charger::new(Latency::Fixed(DELAY), 1, Arc::clone(counters), Timer::Tokio)
    }

    fn store() -> (Arc<InjectedStore>, Arc<Counters>) {
        let counters = Arc::new(Counters::default());
        (InjectedStore::memory(charger(&counters)), counters)
    }

    /// Every kind of request waits the injected delay and lands in its price class.
    #[tokio::test(start_paused = true)]
    async fn requests_wait_and_are_counted_by_price_class() {
        let (store, counters) = store();
        let path = Path::from("a/b");
        let timed = Instant::now();
        store
            .put(&path, PutPayload::from_static(b"12345"))
            .await
            .unwrap();
        assert_eq!(timed.elapsed(), DELAY);
        store.get(&path).await.unwrap().bytes().await.unwrap();
        store.head(&path).await.unwrap();
        // Nearby ranges coalesce into one request (object_store's default).
        store.get_ranges(&path, &[0..1, 2..3, 3..4]).await.unwrap();
        let timed = Instant::now();
        let listed: Vec<_> = store.list(None).collect().await;
        assert_eq!(timed.elapsed(), DELAY, "a listing waits once");
        assert_eq!(listed.len(), 1);
        store.list_with_delimiter(None).await.unwrap();
        store.copy(&path, &Path::from("a/c")).await.unwrap();
        let timed = Instant::now();
        store.delete(&path).await.unwrap();
        assert_eq!(timed.elapsed(), DELAY);
        assert_eq!(
            counters.snapshot(),
            RequestCounts {
                put_class: 4,
                get_class: 3,
                deletes: 1,
                bytes_put: 5,
            }
        );
    }

    /// A multipart upload costs its start, each part and its completion.
    #[tokio::test(start_paused = true)]
    async fn multipart_uploads_count_every_step() {
        let (store, counters) = store();
        let path = Path::from("big");
        let mut upload = store.put_multipart(&path).await.unwrap();
        let timed = Instant::now();
        let first = upload.put_part(PutPayload::from(vec![1u8; 10]));
        let second = upload.put_part(PutPayload::from(vec![2u8; 20]));
        futures::future::try_join(first, second).await.unwrap();
        assert_eq!(timed.elapsed(), DELAY, "parts go out together");
        upload.complete().await.unwrap();
        let mut aborted = store.put_multipart(&Path::from("other")).await.unwrap();
        aborted.abort().await.unwrap();
        let counts = counters.snapshot();
        assert_eq!((counts.put_class, counts.deletes), (5, 1));
        assert_eq!(counts.bytes_put, 30);
        assert_eq!(store.head(&path).await.unwrap().size, 30);
    }

    /// The Chorus face charges the same: every request waits and lands in
    /// its price class, a create's bytes counted whatever its parts.
    #[tokio::test(start_paused = true)]
    async fn blob_requests_wait_and_are_counted_by_price_class() {
        let counters = Arc::new(Counters::default());
        let store = InjectedBlobs::memory("memory://charged", charger(&counters));
        let timed = Instant::now();
        let parts: PutPayload = [&b"123"[..], b"45"]
            .into_iter()
            .map(Bytes::from_static)
            .collect();
        let version = store.create_parts("a/b", parts).await.unwrap();
        assert_eq!(timed.elapsed(), DELAY);
        store
            .update("a/b", &version, Bytes::from_static(b"6789"))
            .await
            .unwrap();
        assert_eq!(
            store.get("a/b").await.unwrap().bytes,
            Bytes::from_static(b"6789")
        );
        store.get_range("a/b", 1..3).await.unwrap();
        store.head("a/b").await.unwrap();
        assert_eq!(store.list("a").await.unwrap().len(), 1);
        let timed = Instant::now();
        store.delete("a/b").await.unwrap();
        assert_eq!(timed.elapsed(), DELAY);
        assert_eq!(
            counters.snapshot(),
            RequestCounts {
                put_class: 3,
                get_class: 3,
                deletes: 1,
                bytes_put: 9,
            }
        );
    }
}
