//! Where the test services are: the library's test helpers, shared so both
//! crates follow the same rules (skip outside CI, fail loudly under CI); and
//! how to run the `chorus` binary under test.
#![allow(dead_code)] // each test binary uses a different subset

#[path = "../../../chorus/tests/support/mod.rs"]
mod shared;

#[path = "../../../chorus/tests/support/moto.rs"]
pub mod moto;

#[path = "../../../chorus/tests/support/etcd.rs"]
pub mod etcd;

pub mod etcdctl;
pub mod raw;
pub mod schedule;
pub mod server;
pub mod test_s3;

use std::path::Path;
use std::process::Command;

#[allow(unused_imports)] // not every test binary needs the services
pub use shared::*;

/// Every environment variable `chorus` reads its configuration from.
const CONFIG_VARIABLES: [&str; 11] = [
    "CHORUS_REPLICAS",
    "CHORUS_REGISTER",
    "CHORUS_DATA_DIR",
    "CHORUS_CONFIG",
    "CHORUS_SNAPSHOT_STORE",
    "CHORUS_DB",
    "CHORUS_HOLDER",
    "CHORUS_CLI_HOLDER",
    "CHORUS_CERT_FILE",
    "CHORUS_KEY_FILE",
    "CHORUS_TRUSTED_CA_FILE",
];

/// The `chorus` binary under test, run in `dir`, taking its configuration from
/// the arguments only: none of the caller's `CHORUS_*` settings leak in. The
/// etcd API is off (`CHORUS_ETCD_LISTEN=off`) so that concurrent servers do
/// not contend for its default port; a test serving it passes
/// `--etcd-listen`, which overrides the variable.
pub fn chorus_command(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_chorus"));
    command.current_dir(dir);
    for variable in CONFIG_VARIABLES {
        command.env_remove(variable);
    }
    command.env(ETCD_LISTEN_VARIABLE, "off");
    command
}

/// The variable `chorus serve --etcd-listen` reads.
pub const ETCD_LISTEN_VARIABLE: &str = "CHORUS_ETCD_LISTEN";

/// [`chorus_command`] with static S3 test credentials, for servers that ignore
/// them (without any, the S3 client would look for an instance profile).
pub fn chorus_command_with_test_credentials(dir: &Path) -> Command {
    let mut command = chorus_command(dir);
    command
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test");
    command
}

/// The local store keeps key `<dirs>/<name>` in the directory
/// `<dirs>/.k.<name>`, one file per version, the highest current.
pub const LOCAL_KEY_DIR_PREFIX: &str = ".k.";

/// The directory of `key` in the local store at `root`.
pub fn local_key_dir(root: &Path, key: &str) -> std::path::PathBuf {
    let (dirs, name) = key.rsplit_once('/').unwrap_or(("", key));
    root.join(dirs)
        .join(format!("{LOCAL_KEY_DIR_PREFIX}{name}"))
}

/// The file of the current (highest) version in a local store key directory.
pub fn current_version(key_dir: &Path) -> std::path::PathBuf {
    let mut versions: Vec<_> = std::fs::read_dir(key_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", key_dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    versions.sort();
    versions.pop().expect("a key directory holds a version")
}

/// Whether `key` exists in the local store at `root`.
pub fn local_object_exists(root: &Path, key: &str) -> bool {
    local_key_dir(root, key).is_dir()
}
