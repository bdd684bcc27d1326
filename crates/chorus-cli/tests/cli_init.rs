//! End-to-end tests of `chorus log init` and `chorus log inspect` through the
//! real binary.

mod support;

use std::path::Path;
use std::process::Output;

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

/// Asserts a failure with exactly one line on stderr containing `expected`.
fn assert_fails_with(output: &Output, expected: &str) {
    assert!(
        !output.status.success(),
        "unexpected success: {}",
        stdout(output)
    );
    let stderr = stderr(output);
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    assert!(stderr.starts_with("chorus: "), "{stderr}");
    assert!(
        stderr.contains(expected),
        "expected {expected:?} in: {stderr}"
    );
}

#[test]
fn init_then_inspect_on_the_embedded_default() {
    let dir = tempfile::TempDir::new().unwrap();
    let init = chorus(dir.path(), &["log", "init"]);
    assert!(init.status.success(), "{}", stderr(&init));
    assert!(stdout(&init).starts_with("initialized log: 3 replicas (quorum 2), window 16"));
    for replica in 0..3 {
        assert!(
            dir.path()
                .join(format!("chorus-data/replica-{replica}"))
                .is_dir()
        );
    }
    // The object register in a local store: no stopped process can lock it.
    assert!(dir.path().join("chorus-data/register").is_dir());
    assert!(!dir.path().join("chorus-data/register.db").exists());

    let again = chorus(dir.path(), &["log", "init"]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(stdout(&again).starts_with("already initialized log"));

    let inspect = chorus(dir.path(), &["log", "inspect", "--json"]);
    assert!(inspect.status.success(), "{}", stderr(&inspect));
    let json: serde_json::Value = serde_json::from_str(&stdout(&inspect)).unwrap();
    assert_eq!(json["epoch"], 0);
    assert_eq!(json["format"], chorus::register::FORMAT);
    assert_eq!(json["window"], 16);
    assert_eq!(json["quorum"], 2);
    assert_eq!(json["floor"], 0);
    assert_eq!(json["tail"]["base"], 0);
    let replicas = json["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 3);
    assert!(
        replicas[1]
            .as_str()
            .unwrap()
            .ends_with("chorus-data/replica-1")
    );

    let text = chorus(dir.path(), &["log", "inspect"]);
    assert!(text.status.success());
    let text = stdout(&text);
    for shown in [
        "epoch      0",
        "replicas   3 (quorum 2)",
        "tail       ",
        "pending    ",
        "floor      0",
        "directory  0 entries",
    ] {
        assert!(text.contains(shown), "{shown:?} missing from: {text}");
    }
}

#[test]
fn init_with_explicit_urls_and_window() {
    let dir = tempfile::TempDir::new().unwrap();
    let replica = format!("file://{}/only", dir.path().display());
    let register = format!("sqlite://{}/r.db?name=orders", dir.path().display());
    let init = chorus(
        dir.path(),
        &[
            "log",
            "init",
            "--replicas",
            &replica,
            "--register",
            &register,
            "--window",
            "8",
        ],
    );
    assert!(init.status.success(), "{}", stderr(&init));
    assert!(stdout(&init).starts_with("initialized log: 1 replicas (quorum 1), window 8"));
    let inspect = chorus(
        dir.path(),
        &[
            "log",
            "inspect",
            "--json",
            "--register",
            &register,
            "--replicas",
            &replica,
        ],
    );
    let json: serde_json::Value = serde_json::from_str(&stdout(&inspect)).unwrap();
    assert_eq!(json["window"], 8);
}

#[test]
fn a_config_file_supplies_the_location() {
    let dir = tempfile::TempDir::new().unwrap();
    let config = format!(
        "replicas = [\"file://{0}/a\", \"file://{0}/b\", \"file://{0}/c\"]\nregister = \"sqlite://{0}/reg.db\"\n",
        dir.path().display()
    );
    std::fs::write(dir.path().join("chorus.toml"), config).unwrap();
    let init = chorus(dir.path(), &["log", "init"]);
    assert!(init.status.success(), "{}", stderr(&init));
    assert!(dir.path().join("a").is_dir() && dir.path().join("reg.db").is_file());
    assert!(!dir.path().join("chorus-data").exists());

    std::fs::write(dir.path().join("chorus.toml"), "replica = []\n").unwrap();
    assert_fails_with(
        &chorus(dir.path(), &["log", "inspect"]),
        "unknown field `replica`",
    );
}

/// `--data-dir` moves the embedded default, for `init` and every later command.
#[test]
fn data_dir_moves_the_embedded_default() {
    let dir = tempfile::TempDir::new().unwrap();
    let init = chorus(dir.path(), &["log", "init", "--data-dir", "elsewhere"]);
    assert!(init.status.success(), "{}", stderr(&init));
    for replica in 0..3 {
        assert!(
            dir.path()
                .join(format!("elsewhere/replica-{replica}"))
                .is_dir()
        );
    }
    assert!(dir.path().join("elsewhere/register").is_dir());
    assert!(!dir.path().join("chorus-data").exists());
    let inspect = chorus(dir.path(), &["log", "inspect", "--data-dir", "elsewhere"]);
    assert!(inspect.status.success(), "{}", stderr(&inspect));
    assert!(
        stdout(&inspect).contains("elsewhere/register"),
        "{}",
        stdout(&inspect)
    );
    assert_fails_with(
        &chorus(dir.path(), &["log", "inspect"]),
        "run `chorus log init` first",
    );
}

/// `chorus --help` works and lists every command group, and `log --help`
/// every log command, each on a line of its own.
#[test]
fn help_lists_the_commands() {
    let dir = tempfile::TempDir::new().unwrap();
    let listed = |args: &[&str], commands: &[&str]| {
        let help = chorus(dir.path(), args);
        assert!(help.status.success(), "{}", stderr(&help));
        let text = stdout(&help);
        for command in commands {
            assert!(
                text.lines()
                    .any(|line| line.trim_start().starts_with(&format!("{command} "))),
                "no line for {command} in: {text}"
            );
        }
    };
    listed(&["--help"], &["log", "snapshot", "lease", "bench"]);
    listed(
        &["log", "--help"],
        &[
            "init", "append", "read", "tail", "inspect", "truncate", "repair", "verify",
        ],
    );
}

#[test]
fn a_bad_url_fails_and_creates_nothing() {
    let dir = tempfile::TempDir::new().unwrap();
    assert_fails_with(
        &chorus(dir.path(), &["log", "init", "--replicas", "ftp://x/y"]),
        "unsupported scheme \"ftp\"",
    );
    assert_fails_with(
        &chorus(
            dir.path(),
            &["log", "init", "--register", "sqlite://relative/x.db"],
        ),
        "invalid register URL",
    );
    assert_fails_with(
        &chorus(
            dir.path(),
            &["log", "init", "--replicas", "memory://a,memory://b"],
        ),
        "2 given; Chorus runs on 1, 3 or 5 replicas",
    );
    assert_fails_with(
        &chorus(
            dir.path(),
            &[
                "log",
                "init",
                "--replicas",
                "memory://a,memory://a,memory://b",
            ],
        ),
        "listed twice",
    );
    assert_fails_with(
        &chorus(dir.path(), &["log", "init", "--window", "0"]),
        "--window 0",
    );
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "something was created"
    );
}

/// `chorus` with static test credentials, for the S3 servers here.
fn chorus_with_credentials(dir: &Path, args: &[&str]) -> Output {
    support::chorus_command_with_test_credentials(dir)
        .args(args)
        .output()
        .unwrap()
}

fn assert_empty(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir).unwrap().collect();
    assert!(left.is_empty(), "something was created: {left:?}");
}

/// An unreachable replica fails `init` before anything exists on disk.
#[test]
fn an_unreachable_store_fails_and_creates_nothing() {
    let dir = tempfile::TempDir::new().unwrap();
    // Nothing listens on port 9: connections are refused at once.
    let unreachable =
        "s3://bucket/log?endpoint=http://127.0.0.1:9&allow_http=true&region=us-east-1";
    let output = chorus_with_credentials(dir.path(), &["log", "init", "--replicas", unreachable]);
    assert_fails_with(&output, "cannot open replica s3://bucket/log");
    // Remote locations are reached before the local ones are created.
    let data = dir.path().join("chorus-data");
    let local = format!("file://{0}/a,{unreachable},file://{0}/b", data.display());
    let output = chorus_with_credentials(dir.path(), &["log", "init", "--replicas", &local]);
    assert_fails_with(&output, "cannot open replica s3://bucket/log");
    assert_empty(dir.path());
}

/// An unreachable register database fails `init` and leaves the embedded
/// default's directory uncreated.
#[test]
fn an_unreachable_register_fails_and_creates_nothing() {
    let dir = tempfile::TempDir::new().unwrap();
    assert_fails_with(
        &chorus(
            dir.path(),
            &[
                "log",
                "init",
                "--register",
                "postgres://chorus@127.0.0.1:9/x",
            ],
        ),
        "cannot open register postgres://chorus@127.0.0.1:9/x",
    );
    assert_empty(dir.path());
}

/// A store that accepts conditional writes without enforcing them fails the
/// probe, as a replica or as an object register, and nothing is created.
#[test]
fn a_store_that_ignores_conditional_writes_is_refused_and_nothing_is_created() {
    let dir = tempfile::TempDir::new().unwrap();
    let server = support::test_s3::TestS3::start(support::test_s3::Faults {
        careless: true,
        ..Default::default()
    });
    let careless = |path: &str| server.url(path);
    assert_fails_with(
        &chorus_with_credentials(dir.path(), &["log", "init", "--replicas", &careless("log")]),
        "ignores create-if-absent (a second create succeeded)",
    );
    assert_fails_with(
        &chorus_with_credentials(dir.path(), &["log", "init", "--register", &careless("reg")]),
        "ignores create-if-absent (a second create succeeded)",
    );
    assert_empty(dir.path());
}

#[test]
fn inspect_without_a_log_says_to_init() {
    let dir = tempfile::TempDir::new().unwrap();
    assert_fails_with(
        &chorus(dir.path(), &["log", "inspect"]),
        "run `chorus log init` first",
    );
    assert!(!dir.path().join("chorus-data").exists());
}

#[test]
fn a_changed_replica_list_is_refused() {
    let dir = tempfile::TempDir::new().unwrap();
    assert!(chorus(dir.path(), &["log", "init"]).status.success());
    let data = dir.path().join("chorus-data");
    let reordered = format!(
        "file://{0}/replica-1,file://{0}/replica-0,file://{0}/replica-2",
        data.display()
    );
    assert_fails_with(
        &chorus(dir.path(), &["log", "init", "--replicas", &reordered]),
        "field=chorus.replicas: replica 0 is bound to",
    );
}

#[test]
fn a_malformed_register_is_reported_and_left_alone() {
    let dir = tempfile::TempDir::new().unwrap();
    let db = dir.path().join("register.db");
    let config = format!("register = \"sqlite://{}\"\n", db.display());
    std::fs::write(dir.path().join("chorus.toml"), config).unwrap();
    assert!(chorus(dir.path(), &["log", "init"]).status.success());
    let connection = rusqlite::Connection::open(&db).unwrap();
    let fields: String = connection
        .query_row("SELECT fields FROM chorus_register", [], |row| row.get(0))
        .unwrap();
    let broken = fields.replace("\"chorus.window\":\"16\"", "\"chorus.window\":\"0\"");
    assert_ne!(broken, fields);
    connection
        .execute("UPDATE chorus_register SET fields = ?1", [&broken])
        .unwrap();

    assert_fails_with(
        &chorus(dir.path(), &["log", "inspect"]),
        "field=chorus.window",
    );
    assert_fails_with(&chorus(dir.path(), &["log", "init"]), "field=chorus.window");
    let after: String = connection
        .query_row("SELECT fields FROM chorus_register", [], |row| row.get(0))
        .unwrap();
    assert_eq!(after, broken, "a malformed register was modified");

    connection
        .execute(
            "UPDATE chorus_register SET fields = '{\"chorus.format\":\"9\"}'",
            [],
        )
        .unwrap();
    assert_fails_with(
        &chorus(dir.path(), &["log", "inspect"]),
        "register written by a newer Chorus: format 9; this build reads up to 3",
    );
}

#[test]
fn the_default_register_gets_its_directory_even_with_remote_replicas() {
    let dir = tempfile::TempDir::new().unwrap();
    let init = chorus(
        dir.path(),
        &[
            "log",
            "init",
            "--replicas",
            "memory://a,memory://b,memory://c",
        ],
    );
    assert!(init.status.success(), "{}", stderr(&init));
    assert!(dir.path().join("chorus-data/register").is_dir());
}

/// A replica directory in the older locking layout (objects as plain files,
/// `flock` stripes in `.chorus-locks`) is refused with the command that
/// upgrades it, and `chorus store upgrade` converts it in place.
#[test]
fn a_replica_of_the_locking_layout_is_refused_until_chorus_store_upgrade() {
    let dir = tempfile::TempDir::new().unwrap();
    let data = dir.path().join("chorus-data");
    let old = data.join("replica-0");
    std::fs::create_dir_all(old.join(".chorus-locks")).unwrap();
    std::fs::create_dir_all(old.join("notes")).unwrap();
    let mut object = b"CHLB".to_vec();
    object.extend_from_slice(&[9u8; 16]);
    object.extend_from_slice(b"kept");
    std::fs::write(old.join("notes/readme"), &object).unwrap();
    let url = format!("file://{}", old.display());

    let refused = chorus(dir.path(), &["log", "init"]);
    assert_fails_with(&refused, &format!("run `chorus store upgrade {url}`"));
    assert!(!data.join("register").exists(), "init went ahead");

    let upgraded = chorus(dir.path(), &["store", "upgrade", &url]);
    assert!(upgraded.status.success(), "{}", stderr(&upgraded));
    assert_eq!(
        stdout(&upgraded),
        format!("upgraded {url}: 1 objects converted\n")
    );
    let init = chorus(dir.path(), &["log", "init"]);
    assert!(init.status.success(), "{}", stderr(&init));
    assert_eq!(
        std::fs::read(old.join("notes/.k.readme/00000000000000000001")).unwrap(),
        object
    );
}

/// Runs `chorus ARGS` in `dir` with `input` on stdin.
fn chorus_with_input(dir: &Path, args: &[&str], input: &str) -> Output {
    use std::io::Write;
    let mut child = support::chorus_command(dir)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("chorus runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn read_count(dir: &Path) -> usize {
    let read = chorus(dir, &["log", "read", "--from", "0"]);
    assert!(read.status.success(), "{}", stderr(&read));
    stdout(&read).lines().count()
}

/// The issue's setup: a log on the embedded default with four appends of
/// 1,000 records (`r<round>-<i>`), each run's recovery sealing the last.
fn append_4000_records(dir: &Path) {
    assert!(chorus(dir, &["log", "init"]).status.success());
    for round in 0..4 {
        let input: String = (0..1000).map(|i| format!("r{round}-{i}\n")).collect();
        let append = chorus_with_input(dir, &["log", "append"], &input);
        assert!(append.status.success(), "{}", stderr(&append));
    }
}

/// Copies a directory tree (the register's local store) for a backup.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Defends issue 16's first finding: with the register lost, the hint said
/// "run `chorus log init` first", and following it started the log over on
/// top of 4,000 records (every later open failed `corrupt data`). Now the
/// hint says to restore the register, init (and serve, which creates a log
/// on first start) refuse the replicas and create nothing, and the restored
/// register finds every record.
#[test]
fn init_over_replicas_whose_register_was_lost_refuses_and_loses_nothing() {
    let dir = tempfile::TempDir::new().unwrap();
    let dir = dir.path();
    append_4000_records(dir);
    assert_eq!(read_count(dir), 4000);
    let register = dir.join("chorus-data/register");
    let backup = dir.join("register-backup");
    copy_tree(&register, &backup);
    std::fs::remove_dir_all(&register).unwrap();

    let read = chorus(dir, &["log", "read", "--from", "0"]);
    assert_fails_with(&read, "restore it from a backup");
    assert!(!stderr(&read).contains("run `chorus log init`"));
    assert_fails_with(&chorus(dir, &["log", "init"]), "already holds log data");
    let serve = chorus(dir, &["serve", "--listen", "127.0.0.1:0"]);
    assert!(!serve.status.success());
    assert!(
        stderr(&serve).contains("already holds log data"),
        "{}",
        stderr(&serve)
    );
    assert!(
        !register.join(".k.manifest.json").exists() && !register.join("manifest.json").exists(),
        "no register was created"
    );

    std::fs::remove_dir_all(&register).ok();
    copy_tree(&backup, &register);
    assert_eq!(read_count(dir), 4000);
}

/// Issue 16's recovery: with the register lost and no backup, `chorus log
/// recover-register` rebuilds it from the replicas (a dry run first, which
/// writes nothing), and every record reads back and appends go on.
#[test]
fn recover_register_rebuilds_a_lost_register_from_the_replicas() {
    let dir = tempfile::TempDir::new().unwrap();
    let dir = dir.path();
    append_4000_records(dir);
    let register = dir.join("chorus-data/register");
    let refused = chorus(dir, &["log", "recover-register"]);
    assert_fails_with(&refused, "holds a log; nothing to recover");
    let newest_seal = || {
        let inspect = chorus(dir, &["log", "inspect", "--json"]);
        assert!(inspect.status.success(), "{}", stderr(&inspect));
        let json: serde_json::Value = serde_json::from_str(&stdout(&inspect)).unwrap();
        json["seal"].clone()
    };
    let sealed = newest_seal();
    assert!(
        sealed["digest"].as_str().unwrap().starts_with("xxh3-128:"),
        "{sealed}"
    );
    std::fs::remove_dir_all(&register).unwrap();

    let dry = chorus(dir, &["log", "recover-register", "--dry-run"]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    let plan: serde_json::Value = serde_json::from_str(stdout(&dry).trim()).unwrap();
    assert_eq!(plan["dry_run"], true);
    assert_eq!(plan["floor"], 0);
    assert_eq!(
        plan["sealed_segments"].as_array().unwrap().len(),
        3,
        "{plan}"
    );
    assert_eq!(plan["tail"]["base"], 3000, "{plan}");
    assert!(!register.exists(), "a dry run writes nothing");

    let recovered = chorus(dir, &["log", "recover-register"]);
    assert!(recovered.status.success(), "{}", stderr(&recovered));
    assert!(stdout(&recovered).contains("rebuilt register"));
    // The digest recomputed from the sealed object is the one its writer
    // hashed fragment by fragment.
    assert_eq!(newest_seal(), sealed);
    let read = chorus(dir, &["log", "read", "--from", "0"]);
    assert!(read.status.success(), "{}", stderr(&read));
    let lines: Vec<String> = stdout(&read).lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 4000);
    assert_eq!(lines[3999], r#"{"index":3999,"data":"r3-999"}"#);
    let append = chorus_with_input(dir, &["log", "append"], "after\n");
    assert!(append.status.success(), "{}", stderr(&append));
    assert_eq!(stdout(&append).trim(), r#"{"index":4000}"#);
    assert_eq!(read_count(dir), 4001);
}

/// The same for a damaged SQLite register (`register.db` emptied): the hint
/// points to restoring it, and init creates nothing over the replicas.
#[test]
fn a_damaged_sqlite_register_points_to_restoring_it() {
    let dir = tempfile::TempDir::new().unwrap();
    let dir = dir.path();
    let database = dir.join("chorus-data/register.db");
    let register = format!("sqlite://{}", database.display());
    let location = ["--register", register.as_str()];
    let init = chorus(dir, &[&["log", "init"][..], &location].concat());
    assert!(init.status.success(), "{}", stderr(&init));
    let append = chorus_with_input(dir, &[&["log", "append"][..], &location].concat(), "a\nb\n");
    assert!(append.status.success(), "{}", stderr(&append));
    std::fs::write(&database, b"").unwrap();
    let read = chorus(
        dir,
        &[&["log", "read", "--from", "0"][..], &location].concat(),
    );
    assert_fails_with(&read, "restore it from a backup");
    let init = chorus(dir, &[&["log", "init"][..], &location].concat());
    assert_fails_with(&init, "already holds log data");
}

/// Without any log data, the hint still says to create the log.
#[test]
fn a_missing_log_with_empty_replicas_says_to_run_init() {
    let dir = tempfile::TempDir::new().unwrap();
    let read = chorus(dir.path(), &["log", "read", "--from", "0"]);
    assert_fails_with(&read, "run `chorus log init` first");
}

/// Defends issue 16's fourth finding: `log inspect` and `log read` on an
/// emptied `register.db` turned it into a 4,096-byte database (journal mode
/// set on open). Readers open the register read-only and write nothing.
#[test]
fn readers_never_write_the_register() {
    let dir = tempfile::TempDir::new().unwrap();
    let data = dir.path().join("chorus-data");
    std::fs::create_dir_all(&data).unwrap();
    let database = data.join("register.db");
    std::fs::write(&database, b"").unwrap();
    for command in [&["log", "inspect"][..], &["log", "read", "--from", "0"]] {
        let output = chorus(dir.path(), command);
        assert!(!output.status.success(), "{command:?}");
        assert_eq!(
            std::fs::metadata(&database).unwrap().len(),
            0,
            "{command:?} wrote the register: {}",
            stderr(&output)
        );
    }
    let names: Vec<_> = std::fs::read_dir(&data)
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(names, ["register.db"], "nothing else was created");
}

/// Defends issue 16's fifth finding: a register whose floor (`chorus.trunc`)
/// is beyond the log's committed end made `inspect` and `read` exit 0 with
/// nothing; only `append` noticed. Every open now checks it.
#[test]
fn a_floor_beyond_the_committed_end_is_refused_by_readers_too() {
    let dir = tempfile::TempDir::new().unwrap();
    let db = dir.path().join("register.db");
    let config = format!("register = \"sqlite://{}\"\n", db.display());
    std::fs::write(dir.path().join("chorus.toml"), config).unwrap();
    assert!(chorus(dir.path(), &["log", "init"]).status.success());
    let append = chorus_with_input(dir.path(), &["log", "append"], "a\nb\nc\n");
    assert!(append.status.success(), "{}", stderr(&append));
    let connection = rusqlite::Connection::open(&db).unwrap();
    let fields: String = connection
        .query_row("SELECT fields FROM chorus_register", [], |row| row.get(0))
        .unwrap();
    let broken = fields.replace("\"chorus.trunc\":\"0\"", "\"chorus.trunc\":\"7\"");
    assert_ne!(broken, fields);
    connection
        .execute("UPDATE chorus_register SET fields = ?1", [&broken])
        .unwrap();
    for command in [
        &["log", "inspect"][..],
        &["log", "read"],
        &["log", "verify"],
    ] {
        assert_fails_with(
            &chorus(dir.path(), command),
            "field=chorus.trunc: the floor 7 is beyond the log's committed end 3",
        );
    }
}

/// Defends issue 16's tenth finding: replica directories whose parents did
/// not exist were created with their parents, so a replica on an unmounted
/// disk was written to the mount point. Now only the last component (and
/// the embedded default's data directory) is created; otherwise the missing
/// parent is named and nothing is created.
#[test]
fn directories_are_created_only_inside_existing_parents() {
    let dir = tempfile::TempDir::new().unwrap();
    let mount = dir.path().join("mnt/disk");
    let replicas = format!(
        "file://{0}/a,file://{0}/b,file://{1}/c",
        dir.path().display(),
        mount.display()
    );
    let init = chorus(dir.path(), &["log", "init", "--replicas", &replicas]);
    assert_fails_with(&init, &format!("{} does not exist", mount.display()));
    assert!(
        !dir.path().join("mnt").exists(),
        "nothing under the missing parent"
    );

    let data = dir.path().join("unmounted/chorus-data");
    let data = data.to_str().unwrap();
    for command in [
        &["log", "init", "--data-dir", data][..],
        &[
            "snapshot",
            "publish",
            "--data-dir",
            data,
            "--file",
            "x",
            "--wal-index",
            "0",
        ],
    ] {
        std::fs::write(dir.path().join("x"), b"payload").unwrap();
        assert_fails_with(&chorus(dir.path(), command), "its parent does not exist");
    }
    assert!(!dir.path().join("unmounted").exists());

    // One level is fine: the data directory, and each replica in it.
    let fresh = dir.path().join("fresh");
    let init = chorus(
        dir.path(),
        &["log", "init", "--data-dir", fresh.to_str().unwrap()],
    );
    assert!(init.status.success(), "{}", stderr(&init));
    assert!(fresh.join("replica-0").is_dir());
}
