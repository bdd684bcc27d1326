//! A durable local-directory store, atomic across processes.
//!
//! Layout under the root directory:
//!
//! ```text
//! <root>/<key>                 object file: 20-byte header, then the object's bytes
//! <root>/.chorus-tmp/<random>  staging files (harmless leftovers after a crash)
//! <root>/.chorus-locks/<nn>    256 striped lock files for update and delete
//! ```
//!
//! Every object file starts with the magic `CHLB` and a random 128-bit version
//! nonce; a fresh nonce is drawn on every write, so versions never recur.
//!
//! - **create**: make sure the key's directories exist *and* are durable
//!   (each one's entry fsync'd in its parent, even when another process
//!   created it and may have crashed before its fsync), write a staging file,
//!   fsync it, then `link(2)` it to the key, which fails atomically if the key
//!   exists (in any process), then fsync the directory. No lock needed. A
//!   create that finds the key taken fsyncs the existing file and its
//!   directory before it answers `AlreadyExists`: callers settle unknown
//!   outcomes by reading the object back, and must not confirm one whose
//!   directory fsync failed.
//! - **update**: under the key's exclusive stripe lock (`flock`), check the
//!   current nonce, write a staging file, fsync, `rename(2)` over the key,
//!   fsync the directory.
//! - **delete**: under the same stripe lock, unlink and fsync the directory, so a
//!   delete can never interleave with an update's check-then-rename.
//! - Readers take no lock: `rename` replaces the file atomically, and an open
//!   descriptor keeps seeing the file it opened. A link is visible before the
//!   creator's directory fsync makes it durable, so `get`, `head` and `list`
//!   fsync the directory they read before answering: whatever a reader saw
//!   survives an OS crash too. (fsync of a clean directory is cheap.)
//!
//! `object_store`'s `LocalFileSystem` neither fsyncs nor offers CAS update, hence
//! this backend.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;

use super::key::validate_prefix;
use super::{Blob, BlobError, BlobStore, ObjectMeta, Op, Version, validate_key};

const MAGIC: &[u8; 4] = b"CHLB";
const NONCE_BYTES: usize = 16;
const HEADER_BYTES: u64 = (MAGIC.len() + NONCE_BYTES) as u64;
const TMP_DIR: &str = ".chorus-tmp";
const LOCK_DIR: &str = ".chorus-locks";
const LOCK_STRIPES: u32 = 256;

/// A store in a local directory (`file:///abs/dir`); see the module docs.
#[derive(Debug, Clone)]
pub struct LocalDirStore {
    inner: Arc<Inner>,
}

struct Inner {
    root: PathBuf,
    name: String,
    /// Directories this process has made durable (their entry fsync'd in
    /// their parent), so a create fsyncs its ancestors once, not every time.
    durable_dirs: Mutex<HashSet<PathBuf>>,
    /// Runs before every fsync; a test seam for injected fsync failures.
    before_fsync: Option<FsyncHook>,
}

/// Called with the path about to be fsync'd; an error fails that fsync.
type FsyncHook = Box<dyn Fn(&Path) -> io::Result<()> + Send + Sync>;

/// Directories remembered as durable at most; past it the set starts over.
const MAX_DURABLE_DIRS: usize = 4096;

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("root", &self.root)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl LocalDirStore {
    /// Opens (creating if needed) a store rooted at the absolute directory `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<LocalDirStore, BlobError> {
        Self::open_with(root.into(), None)
    }

    fn open_with(
        root: PathBuf,
        before_fsync: Option<FsyncHook>,
    ) -> Result<LocalDirStore, BlobError> {
        let name = format!("file://{}", root.display());
        if !root.is_absolute() {
            return Err(BlobError::backend(
                &name,
                Op::Create,
                "",
                "local store path must be absolute",
            ));
        }
        let inner = Inner {
            root,
            name,
            durable_dirs: Mutex::default(),
            before_fsync,
        };
        let setup = || -> io::Result<()> {
            inner.create_dirs_durably(&inner.root)?;
            inner.create_dirs_durably(&inner.root.join(TMP_DIR))?;
            inner.create_dirs_durably(&inner.root.join(LOCK_DIR))
        };
        setup().map_err(|e| BlobError::backend(&inner.name, Op::Create, "", e))?;
        Ok(LocalDirStore {
            inner: Arc::new(inner),
        })
    }

    /// The directory this store lives in.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// Runs blocking file-system work off the async runtime.
    async fn blocking<T: Send + 'static>(
        &self,
        op: Op,
        key: &str,
        work: impl FnOnce(&Inner) -> Result<T, BlobError> + Send + 'static,
    ) -> Result<T, BlobError> {
        let inner = Arc::clone(&self.inner);
        let name = self.inner.name.clone();
        let key_owned = key.to_owned();
        tokio::task::spawn_blocking(move || work(&inner))
            .await
            .map_err(|e| BlobError::backend(&name, op, &key_owned, e))?
    }
}

impl Inner {
    fn path_of(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    fn io_error(&self, op: Op, key: &str, error: io::Error) -> BlobError {
        match error.kind() {
            io::ErrorKind::NotFound => BlobError::not_found(&self.name, key),
            io::ErrorKind::AlreadyExists => BlobError::already_exists(&self.name, key),
            // Disk full or interrupted I/O may clear up; the rest is terminal.
            io::ErrorKind::StorageFull
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::TimedOut => BlobError::unavailable(&self.name, op, key, error),
            _ => BlobError::backend(&self.name, op, key, error),
        }
    }

    /// Writes a complete, fsync'd staging file holding `bytes` under a new version.
    fn stage(&self, bytes: &[u8]) -> io::Result<(PathBuf, Version)> {
        let nonce: [u8; NONCE_BYTES] = rand::random();
        let path = self
            .root
            .join(TMP_DIR)
            .join(hex::encode(rand::random::<[u8; 16]>()));
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        let written = (|| {
            file.write_all(MAGIC)?;
            file.write_all(&nonce)?;
            file.write_all(bytes)?;
            self.fsync(&file, &path)
        })();
        if let Err(error) = written {
            let _ = fs::remove_file(&path);
            return Err(error);
        }
        Ok((path, nonce_version(&nonce)))
    }

    fn create(&self, key: &str, bytes: &[u8]) -> Result<Version, BlobError> {
        let target = self.path_of(key);
        let err = |e| self.io_error(Op::Create, key, e);
        let directory = target.parent().expect("key has a parent");
        self.create_dirs_durably(directory).map_err(err)?;
        let (staged, version) = self.stage(bytes).map_err(err)?;
        // link(2) fails with EEXIST if the key exists: atomic create-if-absent.
        let linked = fs::hard_link(&staged, &target);
        let _ = fs::remove_file(&staged);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // Perhaps our own earlier attempt, whose directory fsync
                // failed: make what is there durable before anyone takes it
                // as a success.
                let existing = File::open(&target).map_err(err)?;
                self.fsync(&existing, &target).map_err(err)?;
                self.sync_dir(directory).map_err(err)?;
                return Err(err(e));
            }
            Err(e) => {
                // Someone removed the directory: forget it was durable.
                self.durable_dirs().remove(directory);
                return Err(err(e));
            }
        }
        self.sync_dir(directory).map_err(err)?;
        Ok(version)
    }

    fn update(&self, key: &str, expected: &Version, bytes: &[u8]) -> Result<Version, BlobError> {
        let target = self.path_of(key);
        let err = |e| self.io_error(Op::Update, key, e);
        let _lock = self.lock(key).map_err(err)?;
        let mut file = match File::open(&target) {
            Ok(file) => file,
            // Not at `expected` either: a missing object is a conflict, as on S3.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(BlobError::conflict(&self.name, key));
            }
            Err(e) => return Err(err(e)),
        };
        let current = read_header(&mut file).map_err(|e| self.format_error(Op::Update, key, e))?;
        if &current != expected {
            return Err(BlobError::conflict(&self.name, key));
        }
        let (staged, version) = self.stage(bytes).map_err(err)?;
        if let Err(error) = fs::rename(&staged, &target) {
            let _ = fs::remove_file(&staged);
            return Err(err(error));
        }
        self.sync_parent(&target).map_err(err)?;
        Ok(version)
    }

    /// Opens the object at `key` for reading, once its directory entry is
    /// durable (see the module docs).
    fn open_durable(&self, op: Op, key: &str) -> Result<File, BlobError> {
        let err = |e| self.io_error(op, key, e);
        let path = self.path_of(key);
        let file = File::open(&path).map_err(err)?;
        self.sync_parent(&path).map_err(err)?;
        Ok(file)
    }

    fn get(&self, key: &str) -> Result<Blob, BlobError> {
        let err = |e| self.io_error(Op::Get, key, e);
        let mut file = self.open_durable(Op::Get, key)?;
        let version = read_header(&mut file).map_err(|e| self.format_error(Op::Get, key, e))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(err)?;
        Ok(Blob {
            bytes: Bytes::from(bytes),
            version,
        })
    }

    fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BlobError> {
        let err = |e| self.io_error(Op::Get, key, e);
        let mut file = self.open_durable(Op::Get, key)?;
        let size = file
            .metadata()
            .map_err(err)?
            .len()
            .saturating_sub(HEADER_BYTES);
        if range.start > range.end || range.end > size {
            return Err(BlobError::backend(
                &self.name,
                Op::Get,
                key,
                format!("range {range:?} outside object of {size} bytes"),
            ));
        }
        file.seek(SeekFrom::Start(HEADER_BYTES + range.start))
            .map_err(err)?;
        let mut bytes = vec![0; (range.end - range.start) as usize];
        file.read_exact(&mut bytes).map_err(err)?;
        Ok(Bytes::from(bytes))
    }

    fn head(&self, key: &str) -> Result<ObjectMeta, BlobError> {
        self.meta_of(key, self.open_durable(Op::Head, key)?)
    }

    fn meta_of(&self, key: &str, mut file: File) -> Result<ObjectMeta, BlobError> {
        let err = |e| self.io_error(Op::Head, key, e);
        let version = read_header(&mut file).map_err(|e| self.format_error(Op::Head, key, e))?;
        let size = file.metadata().map_err(err)?.len() - HEADER_BYTES;
        Ok(ObjectMeta {
            key: key.to_owned(),
            size,
            version,
        })
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, BlobError> {
        let mut keys = Vec::new();
        let start = if prefix.is_empty() {
            self.root.clone()
        } else {
            self.path_of(prefix)
        };
        self.collect_keys(&start, &mut keys)
            .map_err(|e| BlobError::backend(&self.name, Op::List, prefix, e))?;
        keys.sort();
        let mut listed = Vec::with_capacity(keys.len());
        for key in keys {
            // The walk fsync'd every directory it read.
            let opened =
                File::open(self.path_of(&key)).map_err(|e| self.io_error(Op::Head, &key, e));
            match opened.and_then(|file| self.meta_of(&key, file)) {
                Ok(meta) => listed.push(meta),
                // Deleted between the directory walk and the head: not listed.
                Err(BlobError::NotFound { .. }) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(listed)
    }

    fn delete(&self, key: &str) -> Result<(), BlobError> {
        let target = self.path_of(key);
        let err = |e| self.io_error(Op::Delete, key, e);
        let _lock = self.lock(key).map_err(err)?;
        match fs::remove_file(&target) {
            Ok(()) => self.sync_parent(&target).map_err(err),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(err(e)),
        }
    }

    /// Takes the exclusive lock of the key's stripe; released when dropped.
    fn lock(&self, key: &str) -> io::Result<File> {
        let stripe = crc32c::crc32c(key.as_bytes()) % LOCK_STRIPES;
        let path = self.root.join(LOCK_DIR).join(format!("{stripe:02x}"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        file.lock()?;
        Ok(file)
    }

    fn format_error(&self, op: Op, key: &str, error: HeaderError) -> BlobError {
        match error {
            HeaderError::Io(e) => self.io_error(op, key, e),
            HeaderError::NotAnObject => BlobError::backend(
                &self.name,
                op,
                key,
                "file is not a chorus local object (bad header)",
            ),
        }
    }
}

enum HeaderError {
    Io(io::Error),
    NotAnObject,
}

fn read_header(file: &mut File) -> Result<Version, HeaderError> {
    let mut header = [0u8; HEADER_BYTES as usize];
    match file.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(HeaderError::NotAnObject),
        Err(e) => return Err(HeaderError::Io(e)),
    }
    if &header[..MAGIC.len()] != MAGIC {
        return Err(HeaderError::NotAnObject);
    }
    Ok(nonce_version(&header[MAGIC.len()..]))
}

fn nonce_version(nonce: &[u8]) -> Version {
    Version {
        e_tag: Some(hex::encode(nonce)),
        generation: None,
    }
}

impl Inner {
    /// Creates `dir` and any missing ancestors and makes each one's entry
    /// durable in its parent. An existing directory is fsync'd into its
    /// parent too: another process may have created it and crashed before
    /// its own fsync, or may not have reached it yet.
    fn create_dirs_durably(&self, dir: &Path) -> io::Result<()> {
        if self.durable_dirs().contains(dir) {
            return Ok(());
        }
        let Some(parent) = dir.parent() else {
            return Ok(()); // the file-system root
        };
        self.create_dirs_durably(parent)?;
        match fs::create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(e) => return Err(e),
        }
        self.sync_dir(parent)?;
        let mut durable = self.durable_dirs();
        if durable.len() >= MAX_DURABLE_DIRS {
            durable.clear();
        }
        durable.insert(dir.to_owned());
        Ok(())
    }

    fn durable_dirs(&self) -> std::sync::MutexGuard<'_, HashSet<PathBuf>> {
        self.durable_dirs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn sync_parent(&self, path: &Path) -> io::Result<()> {
        self.sync_dir(path.parent().expect("path has a parent"))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.fsync(&File::open(dir)?, dir)
    }

    fn fsync(&self, file: &File, path: &Path) -> io::Result<()> {
        if let Some(hook) = &self.before_fsync {
            hook(path)?;
        }
        file.sync_all()
    }
}

impl Inner {
    /// Collects the keys of all object files under `dir`, skipping private
    /// entries, and fsyncs each directory read (see the module docs).
    fn collect_keys(&self, dir: &Path, keys: &mut Vec<String>) -> io::Result<()> {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                self.collect_keys(&path, keys)?;
            } else {
                let relative = path
                    .strip_prefix(&self.root)
                    .expect("walk stays under root");
                keys.push(relative.to_string_lossy().replace('\\', "/"));
            }
        }
        self.sync_dir(dir)
    }
}

#[async_trait]
impl BlobStore for LocalDirStore {
    fn name(&self) -> &str {
        &self.inner.name
    }

    async fn create(&self, key: &str, bytes: Bytes) -> Result<Version, BlobError> {
        validate_key(key)?;
        let key_owned = key.to_owned();
        self.blocking(Op::Create, key, move |inner| {
            inner.create(&key_owned, &bytes)
        })
        .await
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        bytes: Bytes,
    ) -> Result<Version, BlobError> {
        validate_key(key)?;
        let key_owned = key.to_owned();
        let expected = expected.clone();
        self.blocking(Op::Update, key, move |inner| {
            inner.update(&key_owned, &expected, &bytes)
        })
        .await
    }

    async fn get(&self, key: &str) -> Result<Blob, BlobError> {
        validate_key(key)?;
        let key_owned = key.to_owned();
        self.blocking(Op::Get, key, move |inner| inner.get(&key_owned))
            .await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BlobError> {
        validate_key(key)?;
        let key_owned = key.to_owned();
        self.blocking(Op::Get, key, move |inner| {
            inner.get_range(&key_owned, range)
        })
        .await
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, BlobError> {
        validate_key(key)?;
        let key_owned = key.to_owned();
        self.blocking(Op::Head, key, move |inner| inner.head(&key_owned))
            .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, BlobError> {
        validate_prefix(prefix)?;
        let prefix_owned = prefix.to_owned();
        self.blocking(Op::List, prefix, move |inner| inner.list(&prefix_owned))
            .await
    }

    async fn delete(&self, key: &str) -> Result<(), BlobError> {
        validate_key(key)?;
        let key_owned = key.to_owned();
        self.blocking(Op::Delete, key, move |inner| inner.delete(&key_owned))
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A store whose fsyncs are recorded, and fail while `failing` names
    /// their path.
    struct Recorded {
        store: LocalDirStore,
        synced: Arc<Mutex<Vec<PathBuf>>>,
        failing: Arc<Mutex<Option<PathBuf>>>,
        _dir: tempfile::TempDir,
    }

    fn recorded() -> Recorded {
        let dir = tempfile::tempdir().unwrap();
        let synced = Arc::new(Mutex::new(Vec::new()));
        let failing = Arc::new(Mutex::new(None::<PathBuf>));
        let hook: FsyncHook = {
            let (synced, failing) = (Arc::clone(&synced), Arc::clone(&failing));
            Box::new(move |path: &Path| {
                if failing.lock().unwrap().as_deref() == Some(path) {
                    return Err(io::Error::new(
                        io::ErrorKind::Interrupted,
                        "injected fsync failure",
                    ));
                }
                synced.lock().unwrap().push(path.to_owned());
                Ok(())
            })
        };
        let store = LocalDirStore::open_with(dir.path().join("store"), Some(hook)).unwrap();
        Recorded {
            store,
            synced,
            failing,
            _dir: dir,
        }
    }

    impl Recorded {
        fn take_synced(&self) -> Vec<PathBuf> {
            std::mem::take(&mut self.synced.lock().unwrap())
        }
    }

    /// Regression: a create into a directory that already existed returned
    /// without fsyncing that directory into its parent, so a crash could
    /// lose the directory (and the object) although the create had
    /// succeeded; another process may have created it and died before its
    /// own fsync.
    #[tokio::test]
    async fn a_create_into_an_existing_directory_makes_that_directory_durable() {
        let store = recorded();
        let root = store.store.root().to_owned();
        // Another process created the directory and crashed before its fsync.
        fs::create_dir_all(root.join("segments/a")).unwrap();
        store.take_synced();
        store
            .store
            .create("segments/a/1", Bytes::from_static(b"x"))
            .await
            .unwrap();
        let synced = store.take_synced();
        for durable in [root.clone(), root.join("segments"), root.join("segments/a")] {
            assert!(
                synced.contains(&durable),
                "{durable:?} not fsync'd: {synced:?}"
            );
        }
    }

    /// Regression: when the directory fsync after `link` failed, the retry
    /// found `AlreadyExists`, the caller read back identical bytes and took
    /// it as success with no directory fsync ever having succeeded.
    #[tokio::test]
    async fn a_create_retried_after_a_failed_directory_fsync_is_not_confirmed_unsynced() {
        let store = recorded();
        let root = store.store.root().to_owned();
        store
            .store
            .create("segments/a/0", Bytes::from_static(b"warm"))
            .await
            .unwrap();
        let directory = root.join("segments/a");
        *store.failing.lock().unwrap() = Some(directory.clone());
        let failed = store
            .store
            .create("segments/a/1", Bytes::from_static(b"x"))
            .await
            .unwrap_err();
        assert!(failed.is_transient(), "{failed}");

        // While the fsync keeps failing, the retry is not an AlreadyExists.
        let retried = store
            .store
            .create("segments/a/1", Bytes::from_static(b"x"))
            .await
            .unwrap_err();
        assert!(retried.is_transient(), "{retried}");

        // Once it works, AlreadyExists comes only after file and directory fsyncs.
        *store.failing.lock().unwrap() = None;
        store.take_synced();
        let retried = store
            .store
            .create("segments/a/1", Bytes::from_static(b"x"))
            .await
            .unwrap_err();
        assert!(
            matches!(retried, BlobError::AlreadyExists { .. }),
            "{retried}"
        );
        let synced = store.take_synced();
        assert!(synced.contains(&directory.join("1")), "{synced:?}");
        assert!(synced.contains(&directory), "{synced:?}");
    }

    /// An object is visible before its creator's directory fsync: a reader
    /// that saw it makes its entry durable before answering.
    #[tokio::test]
    async fn reads_make_what_they_saw_durable() {
        let store = recorded();
        let root = store.store.root().to_owned();
        store
            .store
            .create("segments/a/1", Bytes::from_static(b"x"))
            .await
            .unwrap();
        let directory = root.join("segments/a");
        store.take_synced();
        store.store.get("segments/a/1").await.unwrap();
        assert_eq!(store.take_synced(), vec![directory.clone()]);
        store.store.head("segments/a/1").await.unwrap();
        assert_eq!(store.take_synced(), vec![directory.clone()]);
        store.store.list("segments").await.unwrap();
        let synced = store.take_synced();
        assert!(
            synced.contains(&directory) && synced.contains(&root.join("segments")),
            "{synced:?}"
        );
    }
}
