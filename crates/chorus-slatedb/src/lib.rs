//! SlateDB with its write-ahead log on a quorum-replicated Chorus log.
//!
//! SlateDB's own WAL writes one object per flush to one bucket: a durable
//! put waits for the flush interval plus one PUT, and the WAL lives in one
//! zone. [`ChorusWal`] puts the WAL on 1, 3 or 5 Chorus replicas, on any mix
//! of object stores, while SlateDB keeps its SSTs and manifest in its own
//! store as usual:
//!
//! - **One write batch is one Chorus record and one WAL file** (file `n` is
//!   record `n - 1`, see [`ids`]). A batch is appended when SlateDB hands it
//!   over and is durable once a quorum of replicas holds it, so a durable
//!   put takes about one quorum round trip, with no flush timer in the way.
//!   Batch atomicity is the record's: replay returns a batch whole or not at
//!   all.
//! - **Fencing**: opening a writer runs Chorus recovery, which claims a new
//!   epoch in the log's register; every later append of an older writer
//!   fails, and every record it had acknowledged is replayed.
//!
//! docs/slatedb.md argues why SlateDB's fencing conditions hold.

mod admin;
pub mod batch;
mod error;
mod gc;
pub mod ids;
mod init;
mod location;
mod options;
mod reader;
mod status;
mod writer;

pub use admin::ChorusWalAdmin;
pub use gc::ChorusWalGc;
pub use init::ChorusWal;
pub use location::{OpenError, WalLocation};
pub use options::ChorusWalOptions;
pub use reader::{ChorusWalReader, DEFAULT_POLL_INTERVAL};
