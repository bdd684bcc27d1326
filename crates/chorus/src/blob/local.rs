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
//! - **create**: write a staging file, fsync it, then `link(2)` it to the key,
//!   which fails atomically if the key exists (in any process), then fsync the
//!   directory. No lock needed.
//! - **update**: under the key's exclusive stripe lock (`flock`), check the
//!   current nonce, write a staging file, fsync, `rename(2)` over the key,
//!   fsync the directory.
//! - **delete**: under the same stripe lock, unlink and fsync the directory, so a
//!   delete can never interleave with an update's check-then-rename.
//! - Readers take no lock: `rename` replaces the file atomically, and an open
//!   descriptor keeps seeing the file it opened.
//!
//! `object_store`'s `LocalFileSystem` neither fsyncs nor offers CAS update, hence
//! this backend.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

#[derive(Debug)]
struct Inner {
    root: PathBuf,
    name: String,
}

impl LocalDirStore {
    /// Opens (creating if needed) a store rooted at the absolute directory `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<LocalDirStore, BlobError> {
        let root = root.into();
        let name = format!("file://{}", root.display());
        if !root.is_absolute() {
            return Err(BlobError::backend(
                &name,
                Op::Create,
                "",
                "local store path must be absolute",
            ));
        }
        let setup = || -> io::Result<()> {
            create_dirs_durably(&root)?;
            create_dirs_durably(&root.join(TMP_DIR))?;
            create_dirs_durably(&root.join(LOCK_DIR))
        };
        setup().map_err(|e| BlobError::backend(&name, Op::Create, "", e))?;
        Ok(LocalDirStore {
            inner: Arc::new(Inner { root, name }),
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
            file.sync_all()
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
        create_dirs_durably(target.parent().expect("key has a parent")).map_err(err)?;
        let (staged, version) = self.stage(bytes).map_err(err)?;
        // link(2) fails with EEXIST if the key exists: atomic create-if-absent.
        let linked = fs::hard_link(&staged, &target);
        let _ = fs::remove_file(&staged);
        linked.map_err(err)?;
        sync_parent(&target).map_err(err)?;
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
        sync_parent(&target).map_err(err)?;
        Ok(version)
    }

    fn get(&self, key: &str) -> Result<Blob, BlobError> {
        let err = |e| self.io_error(Op::Get, key, e);
        let mut file = File::open(self.path_of(key)).map_err(err)?;
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
        let mut file = File::open(self.path_of(key)).map_err(err)?;
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
        let err = |e| self.io_error(Op::Head, key, e);
        let mut file = File::open(self.path_of(key)).map_err(err)?;
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
        collect_keys(&self.root, &start, &mut keys)
            .map_err(|e| BlobError::backend(&self.name, Op::List, prefix, e))?;
        keys.sort();
        let mut listed = Vec::with_capacity(keys.len());
        for key in keys {
            match self.head(&key) {
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
            Ok(()) => sync_parent(&target).map_err(err),
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

/// Creates `dir` and any missing ancestors, fsyncing each new directory's parent
/// so the new entries survive a crash.
fn create_dirs_durably(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dirs_durably(parent)?;
    }
    match fs::create_dir(dir) {
        Ok(()) => sync_parent(dir),
        // Another process created it concurrently; its creator syncs it.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

fn sync_parent(path: &Path) -> io::Result<()> {
    let parent = path.parent().expect("path has a parent");
    File::open(parent)?.sync_all()
}

/// Collects the keys of all object files under `dir`, skipping private entries.
fn collect_keys(root: &Path, dir: &Path, keys: &mut Vec<String>) -> io::Result<()> {
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
            collect_keys(root, &path, keys)?;
        } else {
            let relative = path.strip_prefix(root).expect("walk stays under root");
            keys.push(relative.to_string_lossy().replace('\\', "/"));
        }
    }
    Ok(())
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
