//! `chorus log recover-register`: rebuilds a lost register from what the
//! replicas hold (docs/operations.md, "Lost or corrupt register").

use chorus::log::maintenance::{gather_evidence, plan_register};
use chorus::register::{Manifest, OpenMode, RegisterError, open_register};
use serde_json::json;

use super::open_register_for_init;
use crate::CommandError;
use crate::config::{Location, StoreArgs};
use crate::open::open_replicas_unprobed;
use crate::output::outln;
use chorus::register::DEFAULT_WINDOW;

/// Arguments of `log recover-register`.
#[derive(Debug, clap::Args)]
pub struct RecoverRegisterArgs {
    #[command(flatten)]
    store: StoreArgs,

    /// The log's fragment window, which cannot be read back from the
    /// replicas: give the value the log was created with, or a larger one
    /// (safe: recovery then fences more positions); never a smaller one.
    /// Logs created before the default became 8 used 4.
    #[arg(long, default_value_t = DEFAULT_WINDOW)]
    window: u32,

    /// Print the register it would write, and write nothing.
    #[arg(long)]
    dry_run: bool,
}

/// Rebuilds the register, or says why the replicas cannot settle it.
pub async fn recover_register(args: RecoverRegisterArgs) -> Result<(), CommandError> {
    let location = args.store.resolve()?;
    refuse_existing_log(&location).await?;
    let stores = open_replicas_unprobed(&location)?;
    let evidence = gather_evidence(&stores)
        .await
        .map_err(|e| format!("cannot read the replicas: {e}"))?;
    for key in &evidence.damaged {
        eprintln!("chorus: warning: ignoring an object that does not decode: {key}");
    }
    let manifest = plan_register(&evidence, location.replica_identities(), args.window)
        .map_err(|e| format!("cannot rebuild the register: {e}"))?;
    outln!("{}", plan_json(&manifest, &location, args.dry_run))?;
    if args.dry_run {
        return Ok(());
    }
    let register = open_register_for_init(&location.register).await?;
    let fields = manifest.to_fields()?;
    match register.create(&fields).await {
        Ok(_) => outln!(
            "rebuilt register {}: log ends at {}; the next writer's recovery fences and seals the tail",
            location.register,
            manifest.tail_base
        ),
        Err(RegisterError::AlreadyExists { .. }) => Err(format!(
            "register {} was created meanwhile; nothing written",
            location.register
        )
        .into()),
        Err(error) => Err(format!("cannot write register {}: {error}", location.register).into()),
    }
}

/// Refuses when the register still holds a log: there is nothing to recover,
/// and replacing it would lose what it knows.
async fn refuse_existing_log(location: &Location) -> Result<(), CommandError> {
    let register = match open_register(&location.register, OpenMode::ReadOnly).await {
        Ok(register) => register,
        // Nothing there to read: that is the case this command is for.
        Err(error) if !error.is_transient() => return Ok(()),
        Err(error) => {
            return Err(format!("cannot open register {}: {error}", location.register).into());
        }
    };
    match register.read().await {
        Ok(None) => Ok(()),
        Ok(Some(_)) => Err(format!(
            "register {} holds a log; nothing to recover (it is only rebuilt where it was lost)",
            location.register
        )
        .into()),
        Err(error) => Err(format!(
            "cannot read register {}: {error}; move the damaged register aside first, then recover",
            location.register
        )
        .into()),
    }
}

fn plan_json(manifest: &Manifest, location: &Location, dry_run: bool) -> serde_json::Value {
    json!({
        "dry_run": dry_run,
        "register": location.register.to_string(),
        "epoch": manifest.epoch.0,
        "tail": { "id": manifest.tail.to_string(), "base": manifest.tail_base.0 },
        "pending": manifest.pending.map(|id| id.to_string()),
        "floor": manifest.trunc.0,
        "sealed_segments": manifest.segments.iter().map(|entry| json!({
            "id": entry.id.to_string(),
            "base": entry.base.0,
            "crc32c": format!("{:08x}", entry.crc32c),
        })).collect::<Vec<_>>(),
        "window": manifest.window,
    })
}
