//! `chorus store`: maintenance of the stores themselves, below the log.

use std::path::Path;

use chorus::blob::{LocalDirStore, StoreUrl};
use clap::Subcommand;

use crate::CommandError;
use crate::output::outln;

/// Store maintenance commands.
#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Convert local-directory stores written by an older chorus (the
    /// locking layout) to the current, lock-free layout, in place. Stop
    /// every chorus process using them first. Safe to run again.
    Upgrade {
        /// The stores: `file:///abs/dir` URLs (as the error that asked for
        /// the upgrade names them).
        #[arg(required = true, value_name = "URL")]
        stores: Vec<StoreUrl>,
    },
}

impl StoreCommand {
    /// Runs the command.
    pub async fn run(self) -> Result<(), CommandError> {
        match self {
            StoreCommand::Upgrade { stores } => {
                for store in stores {
                    let Some(dir) = store.local_dir() else {
                        return Err(format!("cannot upgrade {store}: not a file:// store").into());
                    };
                    let converted = LocalDirStore::upgrade(Path::new(dir))
                        .map_err(|e| format!("cannot upgrade {store}: {e}"))?;
                    outln!("upgraded {store}: {converted} objects converted")?;
                }
                Ok(())
            }
        }
    }
}
