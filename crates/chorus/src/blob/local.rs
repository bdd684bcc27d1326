//! A durable local-directory store, atomic across processes and lock-free: no
//! process, however long it is stopped (SIGSTOP, a debugger, a frozen VM),
//! can keep another from creating, updating or deleting any key.
//!
//! Layout under the root directory (layout 2):
//!
//! ```text
//! <root>/.chorus-layout               "chorus-local-store 2": the layout marker
//! <root>/<dirs>/.k.<name>/<seq, 20 digits>
//!                                     the versions of key <dirs>/<name>; the
//!                                     highest is current; each file is a 20-byte
//!                                     header (magic `CHLB`, 128-bit nonce)
//!                                     then the object's bytes, never modified
//! <root>/.chorus-tmp/<random>         staging files and directories
//! <root>/.chorus-trash/<random>       deleted keys' version directories
//! ```
//!
//! Keys never have a segment starting with `.`, so `.k.<name>` cannot collide
//! with a key, and a key may be both an object and a prefix of others.
//!
//! - **create**: stage a directory holding version 1 (file and directory
//!   fsync'd), then `rename(2)` it to `.k.<name>`: a rename onto an existing,
//!   non-empty directory fails, so this is an atomic create-if-absent across
//!   processes. Then fsync the parent.
//! - **update** (CAS on the version token, the nonce): read the current
//!   version `n` and check its nonce, then `link(2)` a staged file as version
//!   `n + 1` into the key directory: link fails if that name exists, so the
//!   link *is* the compare-and-swap. The 8 versions below the current one
//!   are kept, so a stale updater finds its `n + 1` taken while it is among
//!   them; one whose `n + 1` was already superseded and removed finds a
//!   higher version after its link and withdraws it (readers only ever take
//!   the highest version, so they never see it). An updater that finds a
//!   higher version after its link, and the version after its own built on
//!   it (a version's nonce starts with the second half of its
//!   predecessor's), knows its update took effect, was superseded at once,
//!   and succeeds. Older versions are removed by whoever updates next.
//!   Links go through a descriptor of the key directory opened when the
//!   current version was read, so an update can never land in a newer
//!   incarnation of a deleted and re-created key.
//! - **delete**: `rename(2)` the key directory into `.chorus-trash`, fsync
//!   the parent, then remove it. An update racing the delete links into the
//!   directory now in the trash and is ordered before the delete.
//! - **read**: no lock; take the highest version, retrying if it is removed
//!   under the read. A name is visible before the creator's fsync makes it
//!   durable, so `get` and `head` fsync the key's directory and its parent,
//!   and `list` the directories it walks, before answering: whatever a
//!   reader saw survives an OS crash too (fsync of a clean directory is
//!   cheap). A listing may report an updated key's newest version before
//!   the updater's own fsync; a key's first version is durable before its
//!   directory is visible.
//!
//! Every create also fsyncs each directory on the key's path into its parent,
//! even one another process created (it may have crashed before its fsync),
//! and a create that finds the key taken fsyncs what is there before it
//! answers `AlreadyExists`: callers settle unknown outcomes by reading back.
//! Versions never recur: each nonce carries 64 fresh random bits after the
//! 64 its predecessor drew (a created key's first nonce is all random).
//!
//! `object_store`'s `LocalFileSystem` neither fsyncs nor offers CAS update, hence
//! this backend. Unix only (it uses `linkat(2)` and `openat(2)`).

use std::collections::HashSet;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;

use super::key::validate_prefix;
use super::{Blob, BlobError, BlobStore, ObjectMeta, Op, PutPayload, Version, validate_key};

const MAGIC: &[u8; 4] = b"CHLB";
const NONCE_BYTES: usize = 16;
const HEADER_BYTES: u64 = (MAGIC.len() + NONCE_BYTES) as u64;
const TMP_DIR: &str = ".chorus-tmp";
const TRASH_DIR: &str = ".chorus-trash";
const LAYOUT_FILE: &str = ".chorus-layout";
const LAYOUT: &str = "chorus-local-store 2\n";
/// Where the locking layout 1 kept its `flock` stripes: its mark.
const LAYOUT_1_LOCKS: &str = ".chorus-locks";
const KEY_DIR_PREFIX: &str = ".k.";
const SEQ_DIGITS: usize = 20;
/// Rounds a read retries when the version it picked is removed under it
/// (each one means a newer version exists).
const MAX_READ_ROUNDS: u32 = 64;
/// Superseded versions kept below the current one. An updater paused
/// between its read and its link finds its name taken while its version is
/// among them (a plain conflict), and one paused right after its link still
/// finds the version built on its own while that one is (see `update`).
const KEPT_SUPERSEDED: u64 = 8;
/// Staging entries older than this are a crashed process's leftovers.
const STALE_STAGING: Duration = Duration::from_secs(3600);
/// Directories remembered as durable at most; past it the set starts over.
const MAX_DURABLE_DIRS: usize = 4096;

/// A store in a local directory (`file:///abs/dir`); see the module docs.
#[derive(Debug, Clone)]
pub struct LocalDirStore {
    inner: Arc<Inner>,
}

/// Runs before every fsync, with its path; an error fails that fsync.
type FsyncHook = Box<dyn Fn(&Path) -> io::Result<()> + Send + Sync>;

/// Runs inside an update's compare-and-swap, with its key.
type CasHook = Box<dyn Fn(&str) + Send + Sync>;

/// Test seams: each runs at a fixed point of an operation.
#[derive(Default)]
struct Hooks {
    /// Before every fsync.
    before_fsync: Option<FsyncHook>,
    /// After the current version was read and checked, before the new one
    /// is linked.
    inside_cas: Option<CasHook>,
    /// After the new version was linked, before the update looks for newer
    /// ones.
    after_link: Option<CasHook>,
}

struct Inner {
    root: PathBuf,
    name: String,
    /// Directories this process has made durable (their entry fsync'd in
    /// their parent), so a create fsyncs its ancestors once, not every time.
    durable_dirs: Mutex<HashSet<PathBuf>>,
    hooks: Hooks,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("root", &self.root)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl LocalDirStore {
    /// Opens (creating if needed) a store rooted at the absolute directory
    /// `root`. A directory written by a build with the older locking layout
    /// is refused with an error that says how to upgrade it
    /// ([`LocalDirStore::upgrade`]).
    pub fn open(root: impl Into<PathBuf>) -> Result<LocalDirStore, BlobError> {
        Self::open_with(root.into(), Hooks::default())
    }

    fn open_with(root: PathBuf, hooks: Hooks) -> Result<LocalDirStore, BlobError> {
        let name = format!("file://{}", root.display());
        if !root.is_absolute() {
            return Err(BlobError::backend(
                &name,
                Op::Create,
                "",
                "local store path must be absolute",
            ));
        }
        if root.exists() && !root.is_dir() {
            let message = format!("{} is not a directory", root.display());
            return Err(BlobError::backend(&name, Op::Create, "", message));
        }
        // Only the store's own directory is created: a missing parent is
        // more likely an unmounted volume than a wish to write to the
        // mount point underneath it.
        if !root.exists()
            && let Some(parent) = root.parent()
            && !parent.is_dir()
        {
            let message = format!(
                "{} does not exist; a local store's directory is created only inside an \
                 existing one (is a volume not mounted?)",
                parent.display()
            );
            return Err(BlobError::backend(&name, Op::Create, "", message));
        }
        let inner = Inner {
            root,
            name,
            durable_dirs: Mutex::default(),
            hooks,
        };
        inner.check_layout()?;
        let setup = || -> io::Result<()> {
            inner.create_dirs_durably(&inner.root.join(TMP_DIR))?;
            inner.create_dirs_durably(&inner.root.join(TRASH_DIR))?;
            inner.clean_leftovers();
            Ok(())
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

    /// Converts a directory of the older locking layout (every object one
    /// file at its key, `flock` stripes under `.chorus-locks`) to this
    /// layout, in place, keeping every object's bytes and version. Run it
    /// with no other process using the directory. Returns how many objects
    /// it converted; an interrupted upgrade can be run again.
    pub fn upgrade(root: &Path) -> Result<usize, BlobError> {
        let name = format!("file://{}", root.display());
        let inner = Inner {
            root: root.to_owned(),
            name,
            durable_dirs: Mutex::default(),
            hooks: Hooks::default(),
        };
        inner
            .upgrade_layout_1()
            .map_err(|e| BlobError::backend(&inner.name, Op::Update, "", e))
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

/// The directory holding a key's versions.
fn key_dir(root: &Path, key: &str) -> PathBuf {
    let (dirs, name) = key.rsplit_once('/').unwrap_or(("", key));
    let parent = if dirs.is_empty() {
        root.to_owned()
    } else {
        root.join(dirs)
    };
    parent.join(format!("{KEY_DIR_PREFIX}{name}"))
}

fn version_name(seq: u64) -> String {
    format!("{seq:0SEQ_DIGITS$}")
}

fn parse_version_name(name: &[u8]) -> Option<u64> {
    if name.len() != SEQ_DIGITS || !name.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(name).ok()?.parse().ok()
}

/// An open key directory: version lookups and links go through its
/// descriptor, so they stay in this incarnation of the key even if the
/// directory is renamed into the trash meanwhile.
struct KeyDir {
    path: PathBuf,
    file: File,
}

impl KeyDir {
    /// Opens `path`; `Ok(None)` if the key has no directory (it does not exist).
    fn open(path: PathBuf) -> io::Result<Option<KeyDir>> {
        let opened = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(&path);
        match opened {
            Ok(file) => Ok(Some(KeyDir { path, file })),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The version numbers present, ascending.
    fn versions(&self) -> io::Result<Vec<u64>> {
        let mut versions = Vec::new();
        // fdopendir takes the descriptor it is given: hand it a duplicate.
        let fd = cvt(unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) })?;
        // SAFETY: `fd` is a fresh descriptor we own; on success the stream owns it.
        let stream = unsafe { libc::fdopendir(fd) };
        if stream.is_null() {
            let error = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so `fd` is still ours to close.
            unsafe { libc::close(fd) };
            return Err(error);
        }
        // The duplicate shares the directory offset with `self.file`: start over.
        // SAFETY: `stream` is a valid directory stream until closedir below.
        unsafe { libc::rewinddir(stream) };
        let mut failed = None;
        loop {
            // readdir returns NULL both at the end and on an error; only
            // errno tells them apart, so clear it first.
            set_errno(0);
            // SAFETY: as above; readdir's entry stays valid until the next call.
            let entry = unsafe { libc::readdir(stream) };
            if entry.is_null() {
                let error = io::Error::last_os_error();
                if error.raw_os_error() != Some(0) {
                    failed = Some(error);
                }
                break;
            }
            // SAFETY: d_name is a NUL-terminated name inside `entry`.
            let name = unsafe { std::ffi::CStr::from_ptr((*entry).d_name.as_ptr()) };
            if let Some(seq) = parse_version_name(name.to_bytes()) {
                versions.push(seq);
            }
        }
        // SAFETY: `stream` is valid and closed exactly once.
        unsafe { libc::closedir(stream) };
        if let Some(error) = failed {
            // A truncated listing could name an old version as current.
            return Err(error);
        }
        versions.sort_unstable();
        Ok(versions)
    }

    fn open_version(&self, seq: u64) -> io::Result<File> {
        let name = CString::new(version_name(seq)).expect("digits have no NUL");
        // SAFETY: both pointers are valid for the call; the result is checked.
        let fd = cvt(unsafe {
            libc::openat(
                self.file.as_raw_fd(),
                name.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: `fd` is a fresh descriptor we own.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Links `staged` in as version `seq`; fails with `AlreadyExists` if that
    /// version exists: the atomic step of an update.
    fn link_version(&self, staged: &Path, seq: u64) -> io::Result<()> {
        let from = CString::new(staged.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let name = CString::new(version_name(seq)).expect("digits have no NUL");
        // SAFETY: both pointers are valid for the call; the result is checked.
        cvt(unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                from.as_ptr(),
                self.file.as_raw_fd(),
                name.as_ptr(),
                0,
            )
        })
        .map(drop)
    }

    /// Whether version `seq` exists and was built on the version with
    /// nonce `predecessor`; `false` when that cannot be read.
    fn is_built_on(&self, seq: u64, predecessor: &[u8; NONCE_BYTES]) -> bool {
        self.open_version(seq)
            .ok()
            .and_then(|mut file| read_nonce(&mut file).ok())
            .is_some_and(|nonce| is_successor(&nonce, predecessor))
    }

    fn remove_version(&self, seq: u64) -> io::Result<()> {
        let name = CString::new(version_name(seq)).expect("digits have no NUL");
        // SAFETY: the pointer is valid for the call; the result is checked.
        cvt(unsafe { libc::unlinkat(self.file.as_raw_fd(), name.as_ptr(), 0) }).map(drop)
    }

    /// The current (highest) version and its open file; `None` if there is none.
    fn current(&self) -> io::Result<Option<(u64, File)>> {
        for _ in 0..MAX_READ_ROUNDS {
            let Some(&seq) = self.versions()?.last() else {
                return Ok(None);
            };
            match self.open_version(seq) {
                Ok(file) => return Ok(Some((seq, file))),
                // Superseded and removed under us: a newer one exists.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("versions kept changing during {MAX_READ_ROUNDS} reads"),
        ))
    }
}

/// Sets this thread's `errno`.
fn set_errno(value: libc::c_int) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    // SAFETY: the location is this thread's errno, valid for the thread's life.
    unsafe {
        *libc::__errno_location() = value;
    }
    #[cfg(any(target_os = "macos", target_os = "ios", target_os = "freebsd"))]
    // SAFETY: as above.
    unsafe {
        *libc::__error() = value;
    }
}

fn cvt(result: libc::c_int) -> io::Result<libc::c_int> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

fn is_absent(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

impl Inner {
    fn key_dir(&self, key: &str) -> PathBuf {
        key_dir(&self.root, key)
    }

    /// A new random name in the private directory `dir` (staging or trash).
    fn fresh_path(&self, dir: &str) -> PathBuf {
        self.root
            .join(dir)
            .join(hex::encode(rand::random::<[u8; 16]>()))
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

    /// Refuses a directory of another layout; marks a new one as layout 2.
    fn check_layout(&self) -> Result<(), BlobError> {
        let refuse = |reason: String| BlobError::backend(&self.name, Op::Create, "", reason);
        // Checked first: an older build may have written here again after
        // an upgrade (it re-creates its lock stripes).
        if self.root.join(LAYOUT_1_LOCKS).exists() {
            return Err(refuse(format!(
                "{} holds a local store of the older locking layout; stop every chorus \
                 process using it, then run `chorus store upgrade {}`",
                self.root.display(),
                self.name
            )));
        }
        let marker = self.root.join(LAYOUT_FILE);
        match fs::read_to_string(&marker) {
            Ok(found) if found == LAYOUT => return Ok(()),
            Ok(found) => {
                return Err(refuse(format!(
                    "unsupported local store layout {:?} in {} (this build reads {:?})",
                    found.trim_end(),
                    marker.display(),
                    LAYOUT.trim_end()
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(refuse(format!("cannot read {}: {e}", marker.display()))),
        }
        self.create_dirs_durably(&self.root)
            .and_then(|()| self.write_layout_marker())
            .map_err(|e| refuse(format!("cannot mark the layout: {e}")))
    }

    /// Writes the layout marker durably. Racing writers write the same
    /// bytes: whichever lands first wins.
    fn write_layout_marker(&self) -> io::Result<()> {
        let tmp = self.root.join(TMP_DIR);
        self.create_dirs_durably(&tmp)?;
        let staged = self.fresh_path(TMP_DIR);
        let marked = write_synced(self, &staged, &[LAYOUT.as_bytes()], None)
            .and_then(|()| fs::hard_link(&staged, self.root.join(LAYOUT_FILE)));
        let _ = fs::remove_file(&staged);
        match marked {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        self.sync_dir(&self.root)
    }

    fn create(&self, key: &str, parts: &PutPayload) -> Result<Version, BlobError> {
        let err = |e| self.io_error(Op::Create, key, e);
        let target = self.key_dir(key);
        let parent = target.parent().expect("a key directory has a parent");
        self.create_dirs_durably(parent).map_err(err)?;
        // Cheap answer for a taken key (a recovery fencing behind a fast
        // writer meets many), without staging anything. An empty key
        // directory (a crash's leftover) holds no object: the rename below
        // replaces it.
        if self.holds_version(&target).map_err(err)? {
            return self.already_exists(key, &target);
        }
        // Stage the key's directory with version 1 inside, durable.
        let staged = self.fresh_path(TMP_DIR);
        fs::create_dir(&staged).map_err(err)?;
        let nonce: [u8; NONCE_BYTES] = rand::random();
        let parts: Vec<&[u8]> = parts.iter().map(|part| part.as_ref()).collect();
        let prepared = write_synced(self, &staged.join(version_name(1)), &parts, Some(nonce))
            .and_then(|()| self.sync_dir(&staged));
        if let Err(e) = prepared {
            let _ = fs::remove_dir_all(&staged);
            return Err(err(e));
        }
        // rename(2) onto an existing non-empty directory fails: create-if-absent.
        match fs::rename(&staged, &target) {
            Ok(()) => {}
            Err(e) => {
                let _ = fs::remove_dir_all(&staged);
                let taken = matches!(
                    e.kind(),
                    io::ErrorKind::AlreadyExists | io::ErrorKind::DirectoryNotEmpty
                );
                if !taken {
                    if e.kind() == io::ErrorKind::NotFound {
                        // A directory on the path was removed, or our staged
                        // directory was claimed as stale by a cleaner: nothing
                        // was created, and trying again may work.
                        self.durable_dirs().remove(parent);
                        return Err(BlobError::unavailable(&self.name, Op::Create, key, e));
                    }
                    return Err(err(e));
                }
                return self.already_exists(key, &target);
            }
        }
        self.sync_dir(parent).map_err(err)?;
        Ok(nonce_version(&nonce))
    }

    /// Whether the key directory `target` exists and holds a version.
    fn holds_version(&self, target: &Path) -> io::Result<bool> {
        Ok(match KeyDir::open(target.to_owned())? {
            Some(dir) => !dir.versions()?.is_empty(),
            None => false,
        })
    }

    /// Answers a create whose key is taken, once what is there is durable:
    /// perhaps it is our own earlier attempt whose final fsync failed, and
    /// callers settle that by reading it back. A key directory is renamed
    /// into place only with its first version fsync'd (file and directory),
    /// so its entry in the parent is all that may still be volatile.
    fn already_exists(&self, key: &str, target: &Path) -> Result<Version, BlobError> {
        self.sync_parent(target)
            .map_err(|e| self.io_error(Op::Create, key, e))?;
        Err(BlobError::already_exists(&self.name, key))
    }

    fn update(&self, key: &str, expected: &Version, bytes: &[u8]) -> Result<Version, BlobError> {
        let err = |e| self.io_error(Op::Update, key, e);
        // Not at `expected` either: a missing object is a conflict, as on S3.
        let conflict = || BlobError::conflict(&self.name, key);
        let Some(dir) = KeyDir::open(self.key_dir(key)).map_err(err)? else {
            return Err(conflict());
        };
        let Some((seq, mut file)) = dir.current().map_err(err)? else {
            return Err(conflict());
        };
        let current = read_nonce(&mut file).map_err(|e| self.format_error(Op::Update, key, e))?;
        if &nonce_version(&current) != expected {
            return Err(conflict());
        }
        if let Some(pause) = &self.hooks.inside_cas {
            pause(key);
        }
        let nonce = successor_nonce(&current, rand::random());
        let staged = self.fresh_path(TMP_DIR);
        write_synced(self, &staged, &[bytes], Some(nonce)).map_err(|e| {
            let _ = fs::remove_file(&staged);
            err(e)
        })?;
        let next = seq + 1;
        let linked = dir.link_version(&staged, next);
        let _ = fs::remove_file(&staged);
        match linked {
            Ok(()) => {}
            // Someone else made `next` first; or the key was deleted and
            // its directory removed from the trash.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists || is_absent(&e) => {
                return Err(conflict());
            }
            Err(e) => return Err(err(e)),
        }
        if let Some(pause) = &self.hooks.after_link {
            pause(key);
        }
        // A higher version already: either another update built on ours
        // while we paused here (ours took effect), or our `next` was free
        // only because it had been superseded and removed (we were stale,
        // and readers never took it). The version after ours tells the first
        // case by its nonce while it is kept. Otherwise (it names another
        // predecessor, it is gone too, or it was written before nonces named
        // their predecessor) withdraw ours, a no-op if it did take effect,
        // and report the outcome as unknown: callers settle that by reading
        // back.
        let versions = dir.versions().map_err(err)?;
        if versions.last() != Some(&next) {
            if dir.is_built_on(next + 1, &nonce) {
                self.fsync(&dir.file, &dir.path).map_err(err)?;
                return Ok(nonce_version(&nonce));
            }
            let _ = dir.remove_version(next);
            return Err(BlobError::unavailable(
                &self.name,
                Op::Update,
                key,
                "outcome unknown: a newer version appeared right after ours",
            ));
        }
        self.fsync(&dir.file, &dir.path).map_err(err)?;
        // Versions older than the kept ones go; a stale updater racing this
        // finds `next`.
        let oldest_kept = next.saturating_sub(KEPT_SUPERSEDED);
        for old in versions.into_iter().filter(|old| *old < oldest_kept) {
            let _ = dir.remove_version(old);
        }
        Ok(nonce_version(&nonce))
    }

    /// Opens the current version of `key` once its directory is durable
    /// (see the module docs).
    fn open_current(&self, op: Op, key: &str) -> Result<File, BlobError> {
        let err = |e| self.io_error(op, key, e);
        let missing = || BlobError::not_found(&self.name, key);
        let dir = KeyDir::open(self.key_dir(key))
            .map_err(err)?
            .ok_or_else(missing)?;
        let (_, file) = dir.current().map_err(err)?.ok_or_else(missing)?;
        self.fsync(&dir.file, &dir.path).map_err(err)?;
        self.sync_parent(&dir.path).map_err(err)?;
        Ok(file)
    }

    fn get(&self, key: &str) -> Result<Blob, BlobError> {
        let err = |e| self.io_error(Op::Get, key, e);
        let mut file = self.open_current(Op::Get, key)?;
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
        let mut file = self.open_current(Op::Get, key)?;
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
        self.meta_of(key, self.open_current(Op::Head, key)?)
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

    /// A listing's entry for a key whose current version has no valid
    /// header: listed (so a listing never fails on one damaged object, and
    /// a delete can still remove it) under a version no update can match;
    /// reading it reports the damage.
    fn damaged_meta(key: &str, file: &File) -> io::Result<ObjectMeta> {
        Ok(ObjectMeta {
            key: key.to_owned(),
            size: file.metadata()?.len().saturating_sub(HEADER_BYTES),
            version: Version {
                e_tag: None,
                generation: Some(DAMAGED_VERSION.to_owned()),
            },
        })
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, BlobError> {
        let mut listed = Vec::new();
        let start = if prefix.is_empty() {
            self.root.clone()
        } else {
            self.root.join(prefix)
        };
        self.collect(prefix, &start, &mut listed)
            .map_err(|e| BlobError::backend(&self.name, Op::List, prefix, e))?;
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(listed)
    }

    /// Collects the current versions of the keys under `dir` (whose keys
    /// start with `prefix`), fsyncing each directory read.
    fn collect(&self, prefix: &str, dir: &Path, listed: &mut Vec<ObjectMeta>) -> io::Result<()> {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if is_absent(&e) => return Ok(()),
            Err(e) => return Err(e),
        };
        let child_key = |name: &str| {
            if prefix.is_empty() {
                name.to_owned()
            } else {
                format!("{prefix}/{name}")
            }
        };
        for entry in entries {
            let entry = entry?;
            let file_name = entry.file_name();
            let name = file_name.to_string_lossy();
            if !entry.file_type()?.is_dir() {
                continue;
            }
            if let Some(object) = name.strip_prefix(KEY_DIR_PREFIX) {
                let key = child_key(object);
                let Some(key_dir) = KeyDir::open(entry.path())? else {
                    continue; // deleted meanwhile
                };
                let Some((_, file)) = key_dir.current()? else {
                    continue;
                };
                // No fsync per key: a key directory appears (by rename) with
                // its first version already durable, and the walk fsyncs the
                // directory holding it. Only a later version, linked by an
                // update, can be listed before its updater's fsync.
                let mut file = file;
                match read_header(&mut file) {
                    Ok(version) => {
                        let size = file.metadata()?.len() - HEADER_BYTES;
                        listed.push(ObjectMeta { key, size, version });
                    }
                    Err(HeaderError::NotAnObject) => {
                        tracing::warn!(store = %self.name, %key, "listing an object with a damaged header");
                        listed.push(Self::damaged_meta(&key, &file)?);
                    }
                    Err(HeaderError::Io(error)) => return Err(error),
                }
            } else if !name.starts_with('.') {
                self.collect(&child_key(&name), &entry.path(), listed)?;
            }
        }
        self.sync_dir(dir)
    }

    fn delete(&self, key: &str) -> Result<(), BlobError> {
        let err = |e| self.io_error(Op::Delete, key, e);
        let target = self.key_dir(key);
        if KeyDir::open(target.clone()).map_err(err)?.is_none() {
            return Ok(());
        }
        // An empty key directory goes too (a crash's leftover).
        let trash = self.fresh_path(TRASH_DIR);
        match fs::rename(&target, &trash) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(err(e)),
        }
        self.sync_parent(&target).map_err(err)?;
        // A stale updater may still link into it; a later open sweeps what
        // this leaves.
        let _ = fs::remove_dir_all(&trash);
        Ok(())
    }

    /// Removes a crashed process's staging entries and deleted keys left in
    /// the trash. Best effort: another process may be using the store.
    fn clean_leftovers(&self) {
        let now = SystemTime::now();
        let stale = |path: &Path| {
            fs::symlink_metadata(path)
                .and_then(|meta| meta.modified())
                .is_ok_and(|modified| {
                    now.duration_since(modified).unwrap_or_default() > STALE_STAGING
                })
        };
        let trash = self.root.join(TRASH_DIR);
        // A stale staging entry is first claimed by a rename into the trash:
        // its creator, if it is only paused, then fails its own rename
        // (retryably) instead of publishing a directory being emptied.
        if let Ok(entries) = fs::read_dir(self.root.join(TMP_DIR)) {
            for entry in entries.flatten() {
                let path = entry.path();
                if stale(&path) {
                    let claimed = self.fresh_path(TRASH_DIR);
                    let _ = fs::rename(&path, claimed);
                }
            }
        }
        if let Ok(entries) = fs::read_dir(&trash) {
            for entry in entries.flatten() {
                let path = entry.path();
                let _ = fs::remove_dir_all(&path).or_else(|_| fs::remove_file(&path));
            }
        }
    }

    /// Moves every object file of layout 1 (a file at its key) into its key
    /// directory as version 1, then marks the layout and drops the lock stripes.
    fn upgrade_layout_1(&self) -> io::Result<usize> {
        let mut converted = 0;
        self.upgrade_dir(&self.root, &mut converted)?;
        let locks = self.root.join(LAYOUT_1_LOCKS);
        if locks.exists() {
            self.write_layout_marker()?;
            fs::remove_dir_all(&locks)?;
            self.sync_dir(&self.root)?;
        }
        Ok(converted)
    }

    fn upgrade_dir(&self, dir: &Path, converted: &mut usize) -> io::Result<()> {
        // Listed whole before anything moves: a directory changed while it
        // is read may skip entries.
        let entries = fs::read_dir(dir)?.collect::<io::Result<Vec<_>>>()?;
        for entry in entries {
            let name = entry.file_name();
            if name.as_bytes().starts_with(b".") {
                continue;
            }
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                self.upgrade_dir(&path, converted)?;
                continue;
            }
            if !is_layout_1_object(&path)? {
                continue; // not something chorus wrote: left where it is
            }
            let target = dir.join(format!("{KEY_DIR_PREFIX}{}", name.to_string_lossy()));
            match fs::create_dir(&target) {
                Ok(()) => {}
                // An interrupted upgrade made it; it must still be empty.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    if KeyDir::open(target.clone())?
                        .is_some_and(|d| d.versions().is_ok_and(|versions| !versions.is_empty()))
                    {
                        return Err(io::Error::other(format!(
                            "{} exists in both layouts",
                            path.display()
                        )));
                    }
                }
                Err(e) => return Err(e),
            }
            fs::rename(&path, target.join(version_name(1)))?;
            self.sync_dir(&target)?;
            self.sync_dir(dir)?;
            *converted += 1;
        }
        Ok(())
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
            Err(e) => {
                let message = format!("cannot create directory {}: {e}", dir.display());
                return Err(io::Error::new(e.kind(), message));
            }
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
        if let Some(hook) = &self.hooks.before_fsync {
            hook(path)?;
        }
        file.sync_all()
    }
}

/// Writes `bytes` (after an object header with `nonce`, if given) to the new
/// file `path` and fsyncs it.
fn write_synced(
    inner: &Inner,
    path: &Path,
    parts: &[&[u8]],
    nonce: Option<[u8; NONCE_BYTES]>,
) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).create_new(true).open(path)?;
    if let Some(nonce) = nonce {
        file.write_all(MAGIC)?;
        file.write_all(&nonce)?;
    }
    for part in parts {
        file.write_all(part)?;
    }
    inner.fsync(&file, path)
}

/// Whether the file at `path` starts like a chorus object.
fn is_layout_1_object(path: &Path) -> io::Result<bool> {
    let mut magic = [0u8; MAGIC.len()];
    match File::open(path)?.read_exact(&mut magic) {
        Ok(()) => Ok(&magic == MAGIC),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

enum HeaderError {
    Io(io::Error),
    NotAnObject,
}

fn read_header(file: &mut File) -> Result<Version, HeaderError> {
    read_nonce(file).map(|nonce| nonce_version(&nonce))
}

/// Reads an object's header and returns its nonce.
fn read_nonce(file: &mut File) -> Result<[u8; NONCE_BYTES], HeaderError> {
    let mut header = [0u8; HEADER_BYTES as usize];
    match file.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(HeaderError::NotAnObject),
        Err(e) => return Err(HeaderError::Io(e)),
    }
    if &header[..MAGIC.len()] != MAGIC {
        return Err(HeaderError::NotAnObject);
    }
    let mut nonce = [0; NONCE_BYTES];
    nonce.copy_from_slice(&header[MAGIC.len()..]);
    Ok(nonce)
}

/// Half a nonce: the part that links a version to the one it replaced.
const LINK_BYTES: usize = NONCE_BYTES / 2;

/// The nonce of the version that replaces one with nonce `predecessor`:
/// the predecessor's second half, then `fresh` random bytes. So a version
/// names the one it was built on, and an update can tell that another built
/// on its own (see `update`). Nonces stay unique: two are equal only if
/// two independent 64-bit draws both repeat.
fn successor_nonce(predecessor: &[u8; NONCE_BYTES], fresh: [u8; LINK_BYTES]) -> [u8; NONCE_BYTES] {
    let mut nonce = [0; NONCE_BYTES];
    nonce[..LINK_BYTES].copy_from_slice(&predecessor[LINK_BYTES..]);
    nonce[LINK_BYTES..].copy_from_slice(&fresh);
    nonce
}

/// Whether the version with nonce `successor` was built on the one with
/// nonce `predecessor` (a fully random nonce, as versions written before
/// nonces were linked carry, matches by chance with probability 2^-64).
fn is_successor(successor: &[u8; NONCE_BYTES], predecessor: &[u8; NONCE_BYTES]) -> bool {
    successor[..LINK_BYTES] == predecessor[LINK_BYTES..]
}

/// The version a listing gives an object whose header is damaged.
const DAMAGED_VERSION: &str = "damaged";

fn nonce_version(nonce: &[u8]) -> Version {
    Version {
        e_tag: Some(hex::encode(nonce)),
        generation: None,
    }
}

#[async_trait]
impl BlobStore for LocalDirStore {
    fn name(&self) -> &str {
        &self.inner.name
    }

    async fn create_parts(&self, key: &str, parts: PutPayload) -> Result<Version, BlobError> {
        validate_key(key)?;
        let key_owned = key.to_owned();
        self.blocking(Op::Create, key, move |inner| {
            inner.create(&key_owned, &parts)
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
        let hooks = Hooks {
            before_fsync: Some({
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
            }),
            ..Hooks::default()
        };
        let store = LocalDirStore::open_with(dir.path().join("store"), hooks).unwrap();
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

    /// Regression: when a create's last directory fsync failed, the retry
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

        // Once it works, AlreadyExists comes only after the fsync that failed.
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
        // The key's directory was renamed in with its version fsync'd; the
        // failed fsync was of the parent holding it, and that is now done.
        assert_eq!(store.take_synced(), vec![directory]);
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
        let key_dir = directory.join(".k.1");
        store.store.get("segments/a/1").await.unwrap();
        assert_eq!(
            store.take_synced(),
            vec![key_dir.clone(), directory.clone()]
        );
        store.store.head("segments/a/1").await.unwrap();
        assert_eq!(
            store.take_synced(),
            vec![key_dir.clone(), directory.clone()]
        );
        store.store.list("segments").await.unwrap();
        let synced = store.take_synced();
        assert!(
            synced.contains(&directory) && synced.contains(&root.join("segments")),
            "{synced:?}"
        );
    }

    /// An update whose compare-and-swap is paused between reading the current
    /// version and linking the new one, as a stopped process would be, and a
    /// second store on the same directory that updates and deletes meanwhile.
    struct PausedUpdate {
        resume: std::sync::mpsc::Sender<()>,
        outcome: tokio::task::JoinHandle<Result<Version, BlobError>>,
        other: LocalDirStore,
        _dir: tempfile::TempDir,
    }

    const KEY: &str = "db/lease.json";

    /// Where the paused update stops.
    #[derive(Clone, Copy)]
    enum PausedAt {
        /// Before its link: the version it read may be superseded meanwhile.
        InsideCas,
        /// After its link: its own version may be superseded meanwhile.
        AfterLink,
    }

    async fn paused_update(at: PausedAt) -> PausedUpdate {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let (paused_tx, paused) = std::sync::mpsc::channel();
        let (resume, resume_rx) = std::sync::mpsc::channel::<()>();
        let (paused_tx, resume_rx) = (Mutex::new(paused_tx), Mutex::new(resume_rx));
        let pause: CasHook = Box::new(move |_key: &str| {
            paused_tx.lock().unwrap().send(()).unwrap();
            resume_rx.lock().unwrap().recv().unwrap();
        });
        let hooks = match at {
            PausedAt::InsideCas => Hooks {
                inside_cas: Some(pause),
                ..Hooks::default()
            },
            PausedAt::AfterLink => Hooks {
                after_link: Some(pause),
                ..Hooks::default()
            },
        };
        let stopped = LocalDirStore::open_with(root.clone(), hooks).unwrap();
        let other = LocalDirStore::open(root).unwrap();
        let first = other.create(KEY, Bytes::from_static(b"v1")).await.unwrap();
        let outcome = tokio::spawn(async move {
            stopped
                .update(KEY, &first, Bytes::from_static(b"stale"))
                .await
        });
        tokio::task::spawn_blocking(move || paused.recv().unwrap())
            .await
            .unwrap();
        PausedUpdate {
            resume,
            outcome,
            other,
            _dir: dir,
        }
    }

    impl PausedUpdate {
        /// Lets the paused update go on and returns its outcome (the store
        /// directory lives as long as `self`).
        async fn resume(&mut self) -> Result<Version, BlobError> {
            self.resume.send(()).unwrap();
            (&mut self.outcome).await.unwrap()
        }
    }

    /// Bounds an operation of the unpaused store: no lock may make it wait.
    async fn promptly<T>(operation: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(5), operation)
            .await
            .expect("an operation waited on the paused update")
    }

    /// `updates` updates by `other`, each on the last; returns the last
    /// version and its bytes.
    async fn update_times(other: &LocalDirStore, updates: u64) -> (Version, Bytes) {
        let mut current = promptly(other.get(KEY)).await.unwrap().version;
        let mut bytes = Bytes::new();
        for n in 0..updates {
            bytes = Bytes::from(format!("v{}", n + 2));
            current = promptly(other.update(KEY, &current, bytes.clone()))
                .await
                .unwrap();
        }
        (current, bytes)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_update_paused_inside_its_cas_blocks_no_update_and_never_lands() {
        let mut paused = paused_update(PausedAt::InsideCas).await;
        let other = paused.other.clone();
        // The paused update's version 2 is taken, and still kept.
        let (last, bytes) = update_times(&other, 2).await;
        let outcome = paused.resume().await;
        assert!(
            matches!(outcome, Err(BlobError::Conflict { .. })),
            "{outcome:?}"
        );
        let read = other.get(KEY).await.unwrap();
        assert_eq!((read.bytes, read.version), (bytes, last));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_update_paused_until_its_version_was_removed_withdraws_its_link() {
        let mut paused = paused_update(PausedAt::InsideCas).await;
        let other = paused.other.clone();
        // Version 2 is superseded past the kept ones and removed; 3 is kept.
        let (last, bytes) = update_times(&other, KEPT_SUPERSEDED + 2).await;
        let outcome = paused.resume().await;
        // Its link found the name 2 free and then a version 3 built on
        // another's version 2: it withdraws and reports an unknown outcome
        // (the version after its own might have been written by a build
        // whose nonces name no predecessor), which callers settle by reading
        // back.
        assert!(
            matches!(&outcome, Err(error) if error.is_transient()),
            "{outcome:?}"
        );
        let read = other.get(KEY).await.unwrap();
        assert_eq!((read.bytes, read.version), (bytes, last));
    }

    /// Regression: an update that found, right after its link, a newer
    /// version built on its own reported an unknown outcome although it had
    /// taken effect; a caller settling that by reading back saw another
    /// writer's record and applied its change a second time (a register
    /// transform claimed two epochs under contention).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_update_superseded_right_after_its_link_reports_success() {
        let mut paused = paused_update(PausedAt::AfterLink).await;
        let other = paused.other.clone();
        let landed = promptly(other.get(KEY)).await.unwrap();
        assert_eq!(landed.bytes, Bytes::from_static(b"stale"));
        let third = promptly(other.update(KEY, &landed.version, Bytes::from_static(b"v3")))
            .await
            .unwrap();
        let outcome = paused.resume().await;
        assert_eq!(outcome.unwrap(), landed.version);
        let read = other.get(KEY).await.unwrap();
        assert_eq!(
            (read.bytes, read.version),
            (Bytes::from_static(b"v3"), third)
        );
    }

    /// Superseded as many times as versions are kept before it looks: the
    /// version built on its own is still there, so it still knows.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_update_superseded_several_times_right_after_its_link_reports_success() {
        let mut paused = paused_update(PausedAt::AfterLink).await;
        let other = paused.other.clone();
        let landed = promptly(other.get(KEY)).await.unwrap().version;
        let (last, bytes) = update_times(&other, KEPT_SUPERSEDED).await;
        assert_eq!(paused.resume().await.unwrap(), landed);
        let read = other.get(KEY).await.unwrap();
        assert_eq!((read.bytes, read.version), (bytes, last));
    }

    #[test]
    fn a_successor_nonce_names_its_predecessor_and_nothing_else() {
        let first: [u8; NONCE_BYTES] = rand::random();
        let second = successor_nonce(&first, rand::random());
        let third = successor_nonce(&second, rand::random());
        assert!(is_successor(&second, &first));
        assert!(is_successor(&third, &second));
        assert!(!is_successor(&third, &first));
        assert!(!is_successor(&first, &second));
        // Two updates built on one version differ by their fresh halves.
        let rival = successor_nonce(&first, rand::random());
        assert_ne!(rival, second);
        assert!(is_successor(&rival, &first));
        assert!(!is_successor(&third, &rival));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_update_paused_inside_its_cas_blocks_no_delete_and_never_lands_in_a_recreated_key() {
        let mut paused = paused_update(PausedAt::InsideCas).await;
        let other = paused.other.clone();
        promptly(other.delete(KEY)).await.unwrap();
        assert!(matches!(
            other.get(KEY).await,
            Err(BlobError::NotFound { .. })
        ));
        let recreated = promptly(other.create(KEY, Bytes::from_static(b"new")))
            .await
            .unwrap();
        let outcome = paused.resume().await;
        assert!(
            matches!(outcome, Err(BlobError::Conflict { .. })),
            "{outcome:?}"
        );
        let read = other.get(KEY).await.unwrap();
        assert_eq!(
            (read.bytes, read.version.clone()),
            (Bytes::from_static(b"new"), recreated.clone())
        );
        // The re-created key's versions carry on from there.
        other
            .update(KEY, &recreated, Bytes::from_static(b"newer"))
            .await
            .unwrap();
    }

    /// A directory written with the locking layout (one file per key and
    /// `.chorus-locks`) is refused by name, and `upgrade` converts it,
    /// keeping every object's bytes and version.
    #[tokio::test]
    async fn a_directory_of_the_locking_layout_is_refused_until_upgraded() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        fs::create_dir_all(root.join(".chorus-locks")).unwrap();
        fs::create_dir_all(root.join("db")).unwrap();
        let nonce = [7u8; NONCE_BYTES];
        let mut object = MAGIC.to_vec();
        object.extend_from_slice(&nonce);
        object.extend_from_slice(b"lease");
        fs::write(root.join("db/lease.json"), &object).unwrap();

        let refused = LocalDirStore::open(root.clone()).unwrap_err().to_string();
        assert!(refused.contains("older locking layout"), "{refused}");
        assert!(refused.contains("chorus store upgrade"), "{refused}");

        assert_eq!(LocalDirStore::upgrade(&root).unwrap(), 1);
        assert_eq!(LocalDirStore::upgrade(&root).unwrap(), 0, "upgrading twice");
        let store = LocalDirStore::open(root).unwrap();
        let read = store.get("db/lease.json").await.unwrap();
        assert_eq!(read.bytes, Bytes::from_static(b"lease"));
        assert_eq!(read.version, nonce_version(&nonce));
        assert_eq!(store.list("").await.unwrap().len(), 1);
    }

    /// An empty key directory (a crash's leftover, or an operator's) holds
    /// no object: create replaces it, delete removes it, and nothing wedges.
    #[tokio::test]
    async fn an_empty_key_directory_is_no_object() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let store = LocalDirStore::open(root.clone()).unwrap();
        fs::create_dir_all(root.join("db/.k.lease.json")).unwrap();
        assert!(matches!(
            store.get(KEY).await,
            Err(BlobError::NotFound { .. })
        ));
        let created = store.create(KEY, Bytes::from_static(b"v1")).await.unwrap();
        assert_eq!(store.get(KEY).await.unwrap().version, created);

        fs::create_dir_all(root.join("db/.k.other")).unwrap();
        store.delete("db/other").await.unwrap();
        assert!(!root.join("db/.k.other").exists());
    }

    /// An older build that writes into an upgraded directory re-creates its
    /// lock stripes; the directory is refused again rather than read with
    /// that build's objects ignored.
    #[tokio::test]
    async fn lock_stripes_reappearing_after_an_upgrade_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        LocalDirStore::open(root.clone()).unwrap();
        fs::create_dir_all(root.join(".chorus-locks")).unwrap();
        let refused = LocalDirStore::open(root).unwrap_err().to_string();
        assert!(refused.contains("chorus store upgrade"), "{refused}");
    }
}
