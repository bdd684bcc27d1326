//! End-to-end tests of `chorus snapshot list/publish/restore` and `chorus lease
//! status/release` through the real binary, on the embedded default store and
//! (when the test services run) on S3.

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use chorus::blob::{StoreUrl, open_store};
use chorus::clock::SystemClock;
use chorus::lease::{Contender, DatabaseKey, HolderId, LeaseConfig, LeaseHolder, LeaseStore, Term};
use serde_json::Value;
use support::{current_version, local_key_dir, local_object_exists};
use tempfile::TempDir;

fn chorus(dir: &Path, args: &[&str]) -> Output {
    support::chorus_command(dir)
        .args(args)
        .output()
        .expect("chorus runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

fn assert_succeeds(output: &Output) -> String {
    assert!(output.status.success(), "failed: {}", stderr(output));
    stdout(output)
}

/// Asserts a failure with exactly one line on stderr containing every `expected`.
fn assert_fails_with(output: &Output, expected: &[&str]) {
    assert!(
        !output.status.success(),
        "unexpected success: {}",
        stdout(output)
    );
    let stderr = stderr(output);
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    assert!(stderr.starts_with("chorus: "), "{stderr}");
    for part in expected {
        assert!(stderr.contains(part), "expected {part:?} in: {stderr}");
    }
}

/// Payload bytes that survive no text-mode accident: every byte value.
fn binary_payload(seed: u8) -> Vec<u8> {
    (0..=255u8)
        .cycle()
        .skip(seed as usize)
        .take(4096 + seed as usize)
        .collect()
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// `command` followed by the `location` flags.
fn with<'a>(location: &[&'a str], command: &[&'a str]) -> Vec<&'a str> {
    [command, location].concat()
}

/// Publishes, lists and restores twice on the store the `location` flags name.
fn round_trip(dir: &Path, location: &[&str]) {
    let first = write_file(dir, "first.bin", &binary_payload(1));
    let second = write_file(dir, "second.bin", &binary_payload(2));
    let first = first.to_str().unwrap();
    let second = second.to_str().unwrap();
    let published = assert_succeeds(&chorus(
        dir,
        &with(
            location,
            &["snapshot", "publish", "--file", first, "--wal-index", "10"],
        ),
    ));
    assert!(published.starts_with("published snapshot "), "{published}");
    let restored = dir.join("restored.bin");
    let restore_args = with(
        location,
        &["snapshot", "restore", "--to", restored.to_str().unwrap()],
    );
    assert_succeeds(&chorus(dir, &restore_args));
    assert_eq!(std::fs::read(&restored).unwrap(), binary_payload(1));

    assert_succeeds(&chorus(
        dir,
        &with(
            location,
            &["snapshot", "publish", "--file", second, "--wal-index", "25"],
        ),
    ));
    let listed = assert_succeeds(&chorus(
        dir,
        &with(location, &["snapshot", "list", "--json"]),
    ));
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["head"]["wal_index"], 25);
    assert_eq!(listed["head"]["payload_size_bytes"], 4096 + 2);
    let payloads = listed["payloads"].as_array().unwrap();
    assert_eq!(payloads.len(), 2);
    assert_eq!(payloads[1]["head"], true);
    assert_eq!(payloads[0]["head"], false);
    let text = assert_succeeds(&chorus(dir, &with(location, &["snapshot", "list"])));
    assert!(text.contains("wal_index 25"), "{text}");
    assert!(text.contains("  HEAD"), "{text}");

    let restored_text = assert_succeeds(&chorus(dir, &restore_args));
    assert!(restored_text.contains("verified"), "{restored_text}");
    assert_eq!(std::fs::read(&restored).unwrap(), binary_payload(2));
}

#[test]
fn publish_list_restore_round_trip_on_the_embedded_default() {
    let dir = TempDir::new().unwrap();
    round_trip(dir.path(), &[]);
    assert!(local_object_exists(
        &dir.path().join("chorus-data/snapshots-store"),
        "default/HEAD.json"
    ));
    let status = assert_succeeds(&chorus(dir.path(), &["lease", "status", "--json"]));
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(
        status["lease"]["state"], "released",
        "publish releases its lease"
    );
    assert_eq!(status["lease"]["generation"], 2);
}

/// Defends issue 16's second finding: `publish --wal-index 3` after HEAD had
/// 5 used to succeed, so replay would resume below what the state reflects.
#[test]
fn publish_refuses_to_move_heads_wal_index_backwards() {
    let dir = TempDir::new().unwrap();
    let file = write_file(dir.path(), "payload", b"state");
    let file = file.to_str().unwrap();
    let publish = |wal_index: &str, extra: &[&str]| {
        let mut args = vec![
            "snapshot",
            "publish",
            "--file",
            file,
            "--wal-index",
            wal_index,
        ];
        args.extend_from_slice(extra);
        chorus(dir.path(), &args)
    };
    assert_succeeds(&publish("5", &[]));
    let head = || {
        let listed = assert_succeeds(&chorus(dir.path(), &["snapshot", "list", "--json"]));
        serde_json::from_str::<Value>(&listed).unwrap()["head"].clone()
    };
    let before = head();
    assert_fails_with(
        &publish("3", &[]),
        &[
            "refusing to move HEAD's wal_index back from 5 to 3",
            "--allow-rewind",
        ],
    );
    assert_eq!(head(), before, "a refused publish changes nothing");
    assert_succeeds(&publish("3", &["--allow-rewind"]));
    assert_eq!(head()["wal_index"], 3);
}

#[test]
fn publish_list_restore_round_trip_with_explicit_store_and_db() {
    let dir = TempDir::new().unwrap();
    let store = StoreUrl::local(&dir.path().join("elsewhere")).to_string();
    round_trip(dir.path(), &["--store", &store, "--db", "orders"]);
    assert!(local_object_exists(
        &dir.path().join("elsewhere"),
        "orders/HEAD.json"
    ));
    assert!(!dir.path().join("chorus-data").exists());
}

#[test]
fn the_store_and_db_come_from_chorus_toml_and_flags_win() {
    let dir = TempDir::new().unwrap();
    let store = StoreUrl::local(&dir.path().join("configured")).to_string();
    let config = format!("snapshot_store = \"{store}\"\ndb = \"ledger\"\n");
    write_file(dir.path(), "chorus.toml", config.as_bytes());
    round_trip(dir.path(), &[]);
    assert!(local_object_exists(
        &dir.path().join("configured"),
        "ledger/HEAD.json"
    ));
    assert!(!dir.path().join("chorus-data").exists());
    let status = assert_succeeds(&chorus(dir.path(), &["lease", "status", "--json"]));
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["database"], "ledger", "{status}");

    // A flag overrides the file; a bad key in the file is a one-line error.
    let listed = assert_succeeds(&chorus(
        dir.path(),
        &["snapshot", "list", "--json", "--db", "other"],
    ));
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert!(listed["head"].is_null(), "{listed}");
    write_file(dir.path(), "chorus.toml", b"snapshot_stor = \"x\"\n");
    assert_fails_with(
        &chorus(dir.path(), &["snapshot", "list"]),
        &["invalid config file", "chorus.toml line 1", "snapshot_stor"],
    );
}

/// A reader that goes away (`chorus snapshot list | head -0`) is not an
/// error, and never a panic.
#[test]
fn a_closed_stdout_ends_listing_commands_quietly() {
    let dir = TempDir::new().unwrap();
    round_trip(dir.path(), &[]);
    for args in [
        &["snapshot", "list"][..],
        &["snapshot", "list", "--json"],
        &["lease", "status"],
        &["lease", "status", "--json"],
    ] {
        let mut child = support::chorus_command_with_test_credentials(dir.path())
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        let stderr = stderr(&output);
        assert!(output.status.success(), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn publish_list_restore_round_trip_on_s3() {
    let Some(urls) = support::s3_urls("cli-snapshot") else {
        return;
    };
    let dir = TempDir::new().unwrap();
    round_trip(dir.path(), &["--store", &urls[0]]);
}

/// Publishes round `round`'s payload at wal_index `round * 10` on the
/// embedded default; returns what publish printed.
fn publish_round(dir: &Path, round: u8) -> String {
    let file = write_file(dir, "f.bin", &binary_payload(round));
    let wal_index = (u64::from(round) * 10).to_string();
    let args = [
        "snapshot",
        "publish",
        "--file",
        file.to_str().unwrap(),
        "--wal-index",
        &wal_index,
    ];
    assert_succeeds(&chorus(dir, &args))
}

/// The payload key in publish's "published snapshot <key>: …" line.
fn published_key(published: &str) -> String {
    published
        .strip_prefix("published snapshot ")
        .and_then(|rest| rest.split(':').next())
        .unwrap_or_else(|| panic!("no key in: {published}"))
        .to_owned()
}

/// The embedded default snapshot store of a `chorus` run in `dir` (its data
/// directory created, as a `chorus` writer would).
fn default_store(dir: &Path) -> StoreUrl {
    std::fs::create_dir_all(dir.join("chorus-data")).unwrap();
    StoreUrl::local(&dir.join("chorus-data/snapshots-store"))
}

/// Acquires the lease of database `default` in `store` as `holder` for a
/// minute, as another process would.
fn hold_lease(store: &StoreUrl, holder: &str) -> LeaseHolder {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = open_store(store).await.unwrap();
        let config = LeaseConfig {
            ttl: Duration::from_secs(60),
            ..LeaseConfig::default()
        };
        let database = DatabaseKey::new("default").unwrap();
        LeaseStore::new(store, database, config, SystemClock::shared())
            .unwrap()
            .acquire(&Contender::new(HolderId::new(holder).unwrap()), Term(1))
            .await
            .unwrap()
    })
}

/// While `other-node` holds the lease of the store the `location` flags name:
/// `snapshot publish` and `lease release` as `me` fail with one line naming
/// the holder; then `other-node` releases it and publishing works.
fn writers_are_refused_while_held(dir: &Path, location: &[&str]) {
    let file = write_file(dir, "f.bin", b"payload");
    let file = file.to_str().unwrap();
    let publish_as = |holder: &[&'static str]| -> Vec<String> {
        let command = [
            &["snapshot", "publish", "--file", file, "--wal-index", "1"],
            holder,
        ]
        .concat();
        with(location, &command)
            .into_iter()
            .map(str::to_owned)
            .collect()
    };
    let publish = publish_as(&["--holder", "me"]);
    let publish: Vec<&str> = publish.iter().map(String::as_str).collect();
    let held = [
        "lease held by another holder",
        "database=default holder=other-node",
        "expires_in_ms=",
    ];
    assert_fails_with(
        &chorus(dir, &publish),
        &[&["cannot publish snapshot"], &held[..]].concat(),
    );
    assert_fails_with(
        &chorus(
            dir,
            &with(location, &["lease", "release", "--holder", "me"]),
        ),
        &[&["cannot release lease"], &held[..]].concat(),
    );
    // Without a holder there is nobody to release for: refused, nothing changes.
    let nameless = chorus(dir, &with(location, &["lease", "release"]));
    assert!(!nameless.status.success());
    assert!(
        stderr(&nameless).contains("--holder"),
        "{}",
        stderr(&nameless)
    );

    // The same holder id is another process all the same: a command run
    // with the serving process's holder id (as `--holder` or through the
    // server's own CHORUS_HOLDER) cannot take its live lease.
    let as_holder = publish_as(&["--holder", "other-node"]);
    let as_holder: Vec<&str> = as_holder.iter().map(String::as_str).collect();
    assert_fails_with(
        &chorus(dir, &as_holder),
        &[&["cannot publish snapshot"], &held[..]].concat(),
    );
    let mut through_env = support::chorus_command(dir);
    through_env.args(publish_as(&[]));
    through_env.env("CHORUS_HOLDER", "other-node");
    assert_fails_with(
        &through_env.output().expect("chorus runs"),
        &[&["cannot publish snapshot"], &held[..]].concat(),
    );
    // A live lease is not released for its holder by name either...
    assert_fails_with(
        &chorus(
            dir,
            &with(location, &["lease", "release", "--holder", "other-node"]),
        ),
        &[
            "cannot release lease: it is live",
            "holder=other-node",
            "pass --force only if that process is known to be gone",
        ],
    );
    // ...unless the operator says its process is gone; then publishing works.
    let released = assert_succeeds(&chorus(
        dir,
        &with(
            location,
            &["lease", "release", "--holder", "other-node", "--force"],
        ),
    ));
    assert!(
        released.starts_with("released lease: database=default holder=other-node"),
        "{released}"
    );
    // Releasing again is a no-op for its holder, and refused for anyone else
    // (issue 16, finding 9: that used to answer "already released", exit 0).
    let again = assert_succeeds(&chorus(
        dir,
        &with(location, &["lease", "release", "--holder", "other-node"]),
    ));
    assert!(again.starts_with("lease already released"), "{again}");
    assert_fails_with(
        &chorus(
            dir,
            &with(location, &["lease", "release", "--holder", "me"]),
        ),
        &[
            "lease not held by me, nothing released",
            "holder=other-node",
            "state=released",
        ],
    );
    assert_succeeds(&chorus(dir, &publish));
}

/// Defends the one-line held-lease error of `snapshot publish` and `lease release` locally.
#[test]
fn a_held_lease_gives_a_clear_error() {
    let dir = TempDir::new().unwrap();
    let _other = hold_lease(&default_store(dir.path()), "other-node");
    let status = assert_succeeds(&chorus(dir.path(), &["lease", "status"]));
    assert!(status.contains("held, expires in"), "{status}");
    assert!(status.contains("other-node"), "{status}");
    let listed = assert_succeeds(&chorus(dir.path(), &["snapshot", "list", "--json"]));
    assert_eq!(
        serde_json::from_str::<Value>(&listed).unwrap()["head"],
        Value::Null
    );
    writers_are_refused_while_held(dir.path(), &[]);
}

/// Defends the same held-lease errors of `snapshot publish` and `lease release` on S3.
#[test]
fn a_held_lease_gives_a_clear_error_on_s3() {
    let Some(urls) = support::s3_urls("cli-held-lease") else {
        return;
    };
    let dir = TempDir::new().unwrap();
    let _other = hold_lease(&urls[0].parse().unwrap(), "other-node");
    writers_are_refused_while_held(dir.path(), &["--store", &urls[0]]);
}

/// Defends that `snapshot list` and `restore` only read: a foreign live lease does not block them.
#[test]
fn list_and_restore_work_while_another_holder_holds_the_lease() {
    let dir = TempDir::new().unwrap();
    let file = write_file(dir.path(), "f.bin", &binary_payload(4));
    let publish = [
        "snapshot",
        "publish",
        "--file",
        file.to_str().unwrap(),
        "--wal-index",
        "7",
    ];
    assert_succeeds(&chorus(dir.path(), &publish));
    let _other = hold_lease(&default_store(dir.path()), "other-node");

    let listed = assert_succeeds(&chorus(dir.path(), &["snapshot", "list", "--json"]));
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["head"]["wal_index"], 7, "{listed}");
    assert_eq!(listed["payloads"].as_array().unwrap().len(), 1, "{listed}");
    let target = dir.path().join("restored.bin");
    let restored = assert_succeeds(&chorus(
        dir.path(),
        &["snapshot", "restore", "--to", target.to_str().unwrap()],
    ));
    assert!(restored.contains("verified"), "{restored}");
    assert_eq!(std::fs::read(&target).unwrap(), binary_payload(4));

    let status = assert_succeeds(&chorus(dir.path(), &["lease", "status", "--json"]));
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["lease"]["state"], "held", "{status}");
    assert_eq!(status["lease"]["holder_id"], "other-node", "{status}");
}

/// Defends default retention (K=3): after five publishes only the newest three payloads remain.
#[test]
fn publish_keeps_the_newest_three_payloads_by_default() {
    let dir = TempDir::new().unwrap();
    let mut keys = Vec::new();
    for round in 1..=5u8 {
        let published = publish_round(dir.path(), round);
        keys.push(published_key(&published));
        let deleted_one = published.contains("retention deleted 1 old payload(s)");
        assert_eq!(deleted_one, round > 3, "round {round}: {published}");
    }

    let listed = assert_succeeds(&chorus(dir.path(), &["snapshot", "list", "--json"]));
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let payloads = listed["payloads"].as_array().unwrap();
    let listed_keys: Vec<&str> = payloads
        .iter()
        .map(|p| p["key"].as_str().unwrap())
        .collect();
    assert_eq!(listed_keys, keys[2..], "{listed}");
    let at_head: Vec<bool> = payloads
        .iter()
        .map(|p| p["head"].as_bool().unwrap())
        .collect();
    assert_eq!(at_head, [false, false, true], "{listed}");
    assert_eq!(listed["head"]["snapshot_key"], keys[4].as_str(), "{listed}");
    assert_eq!(listed["head"]["wal_index"], 50, "{listed}");

    let root = dir.path().join("chorus-data/snapshots-store");
    let mut on_disk: Vec<PathBuf> = std::fs::read_dir(root.join("default/snapshots"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    on_disk.sort();
    let expected: Vec<PathBuf> = keys[2..]
        .iter()
        .map(|key| local_key_dir(&root, key))
        .collect();
    assert_eq!(on_disk, expected);
    for gone in &keys[..2] {
        assert!(
            !local_object_exists(&root, gone),
            "{gone} survived retention"
        );
    }
    let target = dir.path().join("restored.bin");
    assert_succeeds(&chorus(
        dir.path(),
        &["snapshot", "restore", "--to", target.to_str().unwrap()],
    ));
    assert_eq!(std::fs::read(&target).unwrap(), binary_payload(5));
}

#[test]
fn restore_refuses_a_corrupted_payload_and_writes_nothing() {
    let dir = TempDir::new().unwrap();
    let file = write_file(dir.path(), "f.bin", &binary_payload(3));
    let file = file.to_str().unwrap();
    assert_succeeds(&chorus(
        dir.path(),
        &["snapshot", "publish", "--file", file, "--wal-index", "3"],
    ));
    let listed = assert_succeeds(&chorus(dir.path(), &["snapshot", "list", "--json"]));
    let key = serde_json::from_str::<Value>(&listed).unwrap()["head"]["snapshot_key"]
        .as_str()
        .unwrap()
        .to_owned();
    // Flip one bit of the payload's last byte on disk (the local store keeps
    // the object's bytes at the end of the file, after its header).
    let object = current_version(&local_key_dir(
        &dir.path().join("chorus-data/snapshots-store"),
        &key,
    ));
    let mut stored = std::fs::read(&object).unwrap();
    *stored.last_mut().unwrap() ^= 0x01;
    std::fs::write(&object, stored).unwrap();
    let target = dir.path().join("restored.bin");
    assert_fails_with(
        &chorus(
            dir.path(),
            &["snapshot", "restore", "--to", target.to_str().unwrap()],
        ),
        &[
            "cannot restore snapshot",
            "checksum mismatch",
            &format!("key={key}"),
        ],
    );
    assert!(!target.exists());
}

#[test]
fn restore_and_status_with_nothing_published() {
    let dir = TempDir::new().unwrap();
    assert_fails_with(
        &chorus(dir.path(), &["snapshot", "restore", "--to", "x.bin"]),
        &["no snapshot published: database=default"],
    );
    let status = assert_succeeds(&chorus(dir.path(), &["lease", "status"]));
    assert!(status.contains("none (never acquired)"), "{status}");
    assert!(
        !dir.path().join("chorus-data").exists(),
        "reading created nothing"
    );
    assert_fails_with(
        &chorus(dir.path(), &["snapshot", "list", "--db", "a/b"]),
        &["db: invalid database key"],
    );
}

/// A store that never answers the payload upload: `snapshot publish` gives up
/// once its lease can no longer vouch for it, saying so, instead of waiting
/// out the store's own timeouts and retries (minutes); it leaves the lease to
/// expire, since a cancelled call may still land.
#[test]
fn publish_gives_up_when_its_lease_runs_out_on_a_stalled_store() {
    use support::test_s3::{Faults, TestS3};
    let server = TestS3::start(Faults {
        stall_puts_containing: Some("/snapshots/".into()),
        ..Faults::default()
    });
    let dir = TempDir::new().unwrap();
    write_file(dir.path(), "payload", b"state");
    let store = server.url("stalled");
    let mut child = support::chorus_command_with_test_credentials(dir.path())
        .args([
            "snapshot",
            "publish",
            "--file",
            "payload",
            "--wal-index",
            "1",
        ])
        .args(["--lease-ttl-secs", "2", "--store", &store])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Without the bound the command runs for minutes: fail instead of hanging.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("snapshot publish did not give up when its lease ran out");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    assert_fails_with(
        &output,
        &[
            "cannot publish snapshot",
            "the lease (--lease-ttl-secs 2) ran out",
        ],
    );
    let status = support::chorus_command_with_test_credentials(dir.path())
        .args(["lease", "status", "--store", &store])
        .output()
        .unwrap();
    // A cancelled upload may still land: the lease is left to expire.
    let status = assert_succeeds(&status);
    assert!(!status.contains("released"), "{status}");
}

/// Defends issue 16's seventh finding: one stale payload with a damaged
/// header (local store) made `snapshot list` fail, and every later publish
/// exit 1 ("published, but retention failed") although it had published.
/// Now the listing marks it damaged and goes on, and retention deletes it
/// like any stale payload.
#[test]
fn a_damaged_stale_payload_neither_breaks_list_nor_fails_publish() {
    let dir = TempDir::new().unwrap();
    let store = dir.path().join("chorus-data/snapshots-store");
    let publish = |round: u8| publish_round(dir.path(), round);
    let key = published_key(&publish(1));
    publish(2);
    let version = support::current_version(&support::local_key_dir(&store, &key));
    let mut bytes = std::fs::read(&version).unwrap();
    bytes[..4].copy_from_slice(b"JUNK");
    std::fs::write(&version, bytes).unwrap();

    let listed = assert_succeeds(&chorus(dir.path(), &["snapshot", "list", "--json"]));
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let keys: Vec<&str> = listed["payloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|payload| payload["key"].as_str().unwrap())
        .collect();
    assert!(keys.contains(&key.as_str()), "{listed}");
    let damaged: Vec<&Value> = listed["payloads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|payload| !payload["damaged"].is_null())
        .collect();
    assert_eq!(damaged.len(), 1, "{listed}");
    assert_eq!(damaged[0]["key"], key.as_str(), "{listed}");
    for round in 3..=4 {
        publish(round);
    }
    assert!(
        !support::local_object_exists(&store, &key),
        "retention deleted the damaged stale payload"
    );
}
