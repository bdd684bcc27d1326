//! Chorus: a quorum-replicated write-ahead log over object storage, controlled by
//! one compare-and-swap manifest register, with writer leases and fenced snapshot
//! publication.
//!
//! The modules are layered; each depends only on those listed before it:
//!
//! 1. [`ids`] and [`codec`]: identifiers and the byte formats of stored objects;
//!    [`clock`]: injectable wall-clock and monotonic time; [`timer`]: sleeps
//!    that end on time, for injected latency.
//! 2. [`blob`]: object stores named by URL, with create-if-absent and CAS update.
//! 3. [`register`]: the manifest register, its record type and its backends.
//! 4. [`log`]: the replicated write-ahead log: write path, recovery, replay, readers.
//! 5. [`lease`]: the writer lease, whose `(term, generation)` is a fencing token.
//! 6. [`snapshot`]: snapshot payloads under immutable keys and the `HEAD.json`
//!    pointer, advanced only by CAS under a lease (fenced publication).
//! 7. [`members`]: which processes serve a database, as each announces
//!    itself in the snapshot store (a directory for tools; no protocol role).
//! 8. [`runtime`]: runs a state machine on the log as primary or warm
//!    standby: boot, apply, snapshots, lease refresh, failover.
//! 9. [`kv`]: the key-value state machine the service runs (pure).
#![warn(missing_docs)]

pub mod blob;
pub mod clock;
pub mod codec;
pub mod ids;
pub mod kv;
pub mod lease;
pub mod log;
pub mod members;
pub mod register;
pub mod runtime;
pub mod snapshot;
pub mod timer;
