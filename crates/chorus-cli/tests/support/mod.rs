//! Where the test services are: the library's test helpers, shared so both
//! crates follow the same rules (skip outside CI, fail loudly under CI); and
//! how to run the `chorus` binary under test.
#![allow(dead_code)] // each test binary uses a different subset

#[path = "../../../chorus/tests/support/mod.rs"]
mod shared;

pub mod test_s3;

use std::path::Path;
use std::process::Command;

#[allow(unused_imports)] // not every test binary needs the services
pub use shared::*;

/// Every environment variable `chorus` reads its configuration from.
const CONFIG_VARIABLES: [&str; 7] = [
    "CHORUS_REPLICAS",
    "CHORUS_REGISTER",
    "CHORUS_DATA_DIR",
    "CHORUS_CONFIG",
    "CHORUS_SNAPSHOT_STORE",
    "CHORUS_DB",
    "CHORUS_HOLDER",
];

/// The `chorus` binary under test, run in `dir`, taking its configuration from
/// the arguments only: none of the caller's `CHORUS_*` settings leak in.
pub fn chorus_command(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_chorus"));
    command.current_dir(dir);
    for variable in CONFIG_VARIABLES {
        command.env_remove(variable);
    }
    command
}

/// [`chorus_command`] with static S3 test credentials, for servers that ignore
/// them (without any, the S3 client would look for an instance profile).
pub fn chorus_command_with_test_credentials(dir: &Path) -> Command {
    let mut command = chorus_command(dir);
    command
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test");
    command
}
