//! End-to-end tests of `chorus log verify`, `log repair` and `log truncate`
//! through the real binary, on the embedded default (three local replica
//! directories and a SQLite register under `./chorus-data`): damage made
//! directly in the replica directories is found by verify and healed by
//! repair; truncation raises the floor and reads below it fail.

mod support;

use support::{LOCAL_KEY_DIR_PREFIX, current_version};

use std::path::PathBuf;
use std::process::{Output, Stdio};

use serde_json::Value;
use tempfile::TempDir;

/// Records appended per `log append` run; every run's recovery seals the
/// previous run's records, so each run leaves one sealed segment behind.
const RECORDS_PER_RUN: u64 = 500;
/// Appending runs: five sealed segments and an active tail.
const RUNS: u64 = 6;
/// All records appended.
const RECORDS: u64 = RECORDS_PER_RUN * RUNS;

/// The byte the local store's 20-byte header (magic and version nonce) ends at.
const LOCAL_HEADER_BYTES: usize = 20;

/// A log in a fresh working directory, on the embedded default.
struct TestLog {
    dir: TempDir,
}

impl TestLog {
    /// Initializes a log and appends `RECORDS` records `record-NNNNN` (index N).
    fn with_sealed_segments() -> TestLog {
        let log = TestLog {
            dir: TempDir::new().unwrap(),
        };
        succeeds(&log.run(&["log", "init"], b""));
        for run in 0..RUNS {
            let first = run * RECORDS_PER_RUN;
            let input: String = (first..first + RECORDS_PER_RUN)
                .map(|index| format!("{}\n", record(index)))
                .collect();
            let output = log.run(
                &["log", "append", "--max-segment-bytes", "2000"],
                input.as_bytes(),
            );
            succeeds(&output);
            let last = stdout(&output).lines().last().unwrap().to_owned();
            assert_eq!(
                last,
                format!("{{\"index\":{}}}", first + RECORDS_PER_RUN - 1)
            );
        }
        assert!(log.sealed_files(0).len() >= (RUNS - 1) as usize);
        log
    }

    fn run(&self, args: &[&str], input: &[u8]) -> Output {
        let mut child = support::chorus_command(self.dir.path())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("chorus runs");
        let mut stdin = child.stdin.take().unwrap();
        let input = input.to_vec();
        let feeder = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &input));
        let output = child.wait_with_output().unwrap();
        let _ = feeder.join().unwrap();
        output
    }

    fn replica_dir(&self, replica: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("chorus-data/replica-{replica}"))
    }

    /// The sealed objects on `replica`, sorted by name (segment order): in
    /// the local store each key `sealed/<name>` is a directory
    /// `sealed/.k.<name>` of version files, the highest one current.
    fn sealed_files(&self, replica: usize) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.replica_dir(replica).join("sealed"))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| file_name(path).starts_with(LOCAL_KEY_DIR_PREFIX))
            .collect();
        files.sort();
        files
    }

    /// The directory of entry `entry`'s sealed object on `replica`.
    fn sealed_file(&self, replica: usize, entry: usize) -> PathBuf {
        let (name, _) = &self.directory()[entry];
        let file = self
            .replica_dir(replica)
            .join("sealed")
            .join(format!("{LOCAL_KEY_DIR_PREFIX}{name}"));
        assert!(file.exists(), "{}", file.display());
        file
    }

    /// `sealed/<name>`: the key of a sealed object's directory.
    fn key_of(file: &std::path::Path) -> String {
        format!("sealed/{}", object_name(file))
    }

    fn verify(&self) -> Output {
        self.run(&["log", "verify"], b"")
    }

    fn verify_json(&self) -> Value {
        let output = self.run(&["log", "verify", "--json"], b"");
        let json: Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("verify --json is not JSON ({e}): {}", stdout(&output)));
        assert_eq!(
            output.status.success(),
            json["below_quorum"].as_array().unwrap().is_empty()
                && json["replicas"].as_array().unwrap().iter().all(|replica| [
                    "missing",
                    "corrupt",
                    "errors",
                    "missing_fragments"
                ]
                .iter()
                .all(|field| replica[field].as_array().unwrap().is_empty())),
            "the exit code disagrees with the report: {json}"
        );
        json
    }

    fn repair(&self) -> String {
        let output = self.run(&["log", "repair"], b"");
        succeeds(&output);
        stdout(&output)
    }

    /// `(index, data)` of every line `log read` prints with `args`.
    fn read(&self, args: &[&str]) -> Vec<(u64, String)> {
        let mut all = vec!["log", "read"];
        all.extend_from_slice(args);
        let output = self.run(&all, b"");
        succeeds(&output);
        stdout(&output)
            .lines()
            .map(|line| {
                let json: Value = serde_json::from_str(line).unwrap();
                let index = json["index"].as_u64().unwrap();
                (index, json["data"].as_str().unwrap().to_owned())
            })
            .collect()
    }

    fn inspect(&self) -> Value {
        let output = self.run(&["log", "inspect", "--json"], b"");
        succeeds(&output);
        serde_json::from_slice(&output.stdout).unwrap()
    }

    fn floor(&self) -> u64 {
        self.inspect()["floor"].as_u64().unwrap()
    }

    /// The sealed directory: each entry's object file name and the index
    /// after its last record.
    fn directory(&self) -> Vec<(String, u64)> {
        let json = self.inspect();
        let entries = json["segments"].as_array().unwrap();
        let tail_base = json["tail"]["base"].as_u64().unwrap();
        entries
            .iter()
            .enumerate()
            .map(|(position, entry)| {
                let name = format!(
                    "{}-{}",
                    entry["id"].as_str().unwrap(),
                    entry["crc32c"].as_str().unwrap()
                );
                let end = entries
                    .get(position + 1)
                    .map_or(tail_base, |next| next["base"].as_u64().unwrap());
                (name, end)
            })
            .collect()
    }
}

/// The object names of the local store's key directories `files`.
fn names(files: &[PathBuf]) -> Vec<String> {
    files.iter().map(|file| object_name(file)).collect()
}

fn file_name(path: &std::path::Path) -> &str {
    path.file_name().unwrap().to_str().unwrap()
}

/// The object name of a local store key directory (`.k.<name>`).
fn object_name(key_dir: &std::path::Path) -> String {
    file_name(key_dir)
        .strip_prefix(LOCAL_KEY_DIR_PREFIX)
        .expect("a key directory")
        .to_owned()
}

fn record(index: u64) -> String {
    format!("record-{index:05}")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[track_caller]
fn succeeds(output: &Output) {
    assert!(
        output.status.success(),
        "failed: {}{}",
        stdout(output),
        stderr(output)
    );
}

/// Asserts a failure whose last stderr line is the `chorus: ` error naming `expected`.
#[track_caller]
fn fails_naming(output: &Output, expected: &str) {
    assert!(
        !output.status.success(),
        "unexpected success: {}",
        stdout(output)
    );
    let stderr = stderr(output);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("chorus: "), "{stderr}");
    assert!(
        last.contains(expected),
        "expected {expected:?} in: {stderr}"
    );
}

/// Asserts a failure with exactly one line on stderr containing `expected`.
#[track_caller]
fn fails_with_one_line(output: &Output, expected: &str) {
    fails_naming(output, expected);
    assert_eq!(stderr(output).lines().count(), 1, "{}", stderr(output));
}

/// Asserts `verify` passed and called every replica healthy.
#[track_caller]
fn healthy(output: &Output) {
    succeeds(output);
    let text = stdout(output);
    let replicas: Vec<&str> = text.lines().filter(|l| l.starts_with("replica ")).collect();
    assert_eq!(replicas.len(), 3, "{text}");
    for line in replicas {
        assert!(line.contains(": healthy: "), "{text}");
        assert!(line.contains("missing=0 corrupt=0"), "{text}");
    }
    assert!(!text.contains("PROBLEMS"), "{text}");
}

#[test]
fn verify_reports_every_replica_healthy_as_text_and_as_json() {
    let log = TestLog::with_sealed_segments();
    let directory: Vec<String> = log.directory().into_iter().map(|(name, _)| name).collect();
    let sealed = directory.len();
    // Every replica holds every entry's object (and maybe the seal of the
    // last run's tail, which its shutdown cut short before the fold).
    for replica in 0..3 {
        let files = names(&log.sealed_files(replica));
        assert!(
            directory.iter().all(|name| files.contains(name)),
            "{files:?}"
        );
    }
    let output = log.verify();
    healthy(&output);
    assert!(stdout(&output).starts_with(&format!("sealed segments: {sealed}\n")));

    let json = log.verify_json();
    assert_eq!(json["sealed_segments"].as_u64(), Some(sealed as u64));
    let replicas = json["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 3);
    for (position, replica) in replicas.iter().enumerate() {
        assert_eq!(replica["position"].as_u64(), Some(position as u64));
        let store = replica["store"].as_str().unwrap();
        assert!(
            store.ends_with(&format!("chorus-data/replica-{position}")),
            "{store}"
        );
        assert!(replica["healthy"].as_u64().unwrap() >= sealed as u64);
        for list in ["missing", "corrupt", "orphans", "errors"] {
            assert!(replica[list].is_array(), "{list}: {replica}");
        }
        for count in ["fences", "tombstones"] {
            assert!(replica[count].is_u64(), "{count}: {replica}");
        }
    }
}

#[test]
fn a_deleted_sealed_copy_fails_verify_naming_it_and_repair_restores_it() {
    let log = TestLog::with_sealed_segments();
    let victim = log.sealed_file(1, 1);
    let original = std::fs::read(current_version(&victim)).unwrap();
    let key = TestLog::key_of(&victim);
    std::fs::remove_dir_all(&victim).unwrap();

    let output = log.verify();
    fails_naming(&output, "run `chorus log repair`");
    let text = stdout(&output);
    assert!(text.contains(&format!("  missing: {key}\n")), "{text}");
    let damaged = text.lines().find(|l| l.starts_with("replica 1 ")).unwrap();
    assert!(
        damaged.contains(": PROBLEMS: ") && damaged.contains("missing=1"),
        "{text}"
    );
    let json = log.verify_json();
    assert_eq!(json["replicas"][1]["missing"], serde_json::json!([key]));
    // Readers do not notice: another replica serves the segment.
    assert_eq!(log.read(&["--from", "0"]).len() as u64, RECORDS);

    let repaired = log.repair();
    assert!(repaired.contains(" restored=1 "), "{repaired}");
    assert!(repaired.contains(" replaced=0 "), "{repaired}");
    let restored = std::fs::read(current_version(&victim)).unwrap();
    assert_eq!(
        restored[LOCAL_HEADER_BYTES..],
        original[LOCAL_HEADER_BYTES..]
    );
    healthy(&log.verify());
}

#[test]
fn a_corrupt_sealed_copy_fails_verify_and_repair_replaces_it() {
    let log = TestLog::with_sealed_segments();
    let victim = log.sealed_file(1, 2);
    let key = TestLog::key_of(&victim);
    let original = std::fs::read(current_version(&victim)).unwrap();
    let mut rotten = original.clone();
    let last = rotten.len() - 1;
    assert!(last > LOCAL_HEADER_BYTES);
    rotten[last] ^= 0x01;
    std::fs::write(current_version(&victim), &rotten).unwrap();

    let output = log.verify();
    fails_naming(
        &output,
        "verify found missing, corrupt or unreadable objects",
    );
    let text = stdout(&output);
    assert!(text.contains(&format!("  corrupt: {key}: ")), "{text}");
    let json = log.verify_json();
    let corrupt = json["replicas"][1]["corrupt"].as_array().unwrap();
    assert_eq!(corrupt.len(), 1, "{json}");
    assert!(corrupt[0].as_str().unwrap().starts_with(&key));
    assert!(
        json["replicas"][0]["corrupt"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(log.read(&["--from", "0"]).len() as u64, RECORDS);

    let repaired = log.repair();
    assert!(repaired.contains(" replaced=1 "), "{repaired}");
    assert!(repaired.contains(" restored=0 "), "{repaired}");
    let healed = std::fs::read(current_version(&victim)).unwrap();
    assert_eq!(healed[LOCAL_HEADER_BYTES..], original[LOCAL_HEADER_BYTES..]);
    healthy(&log.verify());
}

#[test]
fn truncate_raises_the_floor_and_reads_below_it_fail() {
    let log = TestLog::with_sealed_segments();
    let floor = 2 * RECORDS_PER_RUN;
    let (below, kept): (Vec<_>, Vec<_>) = log
        .directory()
        .into_iter()
        .partition(|(_, end)| *end <= floor);
    assert!(below.len() >= 2 && !kept.is_empty(), "{below:?} {kept:?}");
    let kept: Vec<String> = kept.into_iter().map(|(name, _)| name).collect();

    let output = log.run(&["log", "truncate", "--before", &floor.to_string()], b"");
    succeeds(&output);
    let summary = stdout(&output);
    assert!(
        summary.starts_with(&format!(
            "truncated: floor={floor} removed_segments={} ",
            below.len()
        )),
        "{summary}"
    );
    assert!(summary.contains(" tombstones_left=0"), "{summary}");
    assert_eq!(log.floor(), floor);
    // The segments wholly below the floor are gone from every replica.
    for replica in 0..3 {
        let files = names(&log.sealed_files(replica));
        assert!(
            below.iter().all(|(name, _)| !files.contains(name)),
            "{files:?}"
        );
        assert!(kept.iter().all(|name| files.contains(name)), "{files:?}");
    }

    let below = (floor - 1).to_string();
    fails_with_one_line(
        &log.run(&["log", "read", "--from", &below], b""),
        &format!("truncated: requested={below} floor={floor}"),
    );
    let read = log.read(&["--from", &floor.to_string()]);
    assert_eq!(read.len() as u64, RECORDS - floor);
    assert_eq!(read[0], (floor, record(floor)));
    assert_eq!(read.last().unwrap().0, RECORDS - 1);
    // Without --from, reading starts at the floor.
    assert_eq!(log.read(&[]), read);
    healthy(&log.verify());

    // A lower floor, or one beyond the end, is refused with one line and
    // changes nothing; the same floor again is fine.
    fails_with_one_line(
        &log.run(&["log", "truncate", "--before", "1"], b""),
        &format!(
            "cannot truncate: invalid truncation floor: requested=1: below the committed floor {floor}"
        ),
    );
    let beyond = (RECORDS + 1).to_string();
    fails_with_one_line(
        &log.run(&["log", "truncate", "--before", &beyond], b""),
        &format!("beyond the durable end {RECORDS}"),
    );
    assert_eq!(log.floor(), floor);
    let again = log.run(&["log", "truncate", "--before", &floor.to_string()], b"");
    succeeds(&again);
    assert!(
        stdout(&again).contains("removed_segments=0"),
        "{}",
        stdout(&again)
    );

    // Appends continue above the floor.
    let output = log.run(&["log", "append"], b"after\n");
    succeeds(&output);
    assert_eq!(stdout(&output), format!("{{\"index\":{RECORDS}}}\n"));
    let read = log.read(&[]);
    assert_eq!(read.len() as u64, RECORDS - floor + 1);
    assert_eq!(read.last().unwrap(), &(RECORDS, "after".to_owned()));
}

/// The directories of the active tail's fragments on `replica`, in order.
fn tail_fragments(log: &TestLog, replica: usize) -> Vec<PathBuf> {
    let inspect = log.run(&["log", "inspect", "--json"], b"");
    succeeds(&inspect);
    let manifest: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let tail = manifest["tail"]["id"].as_str().unwrap();
    let dir = log.replica_dir(replica).join("segments").join(tail);
    let mut fragments: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| file_name(path).starts_with(LOCAL_KEY_DIR_PREFIX))
        .collect();
    fragments.sort();
    fragments
}

/// Defends issue 16's third finding: with a tail fragment deleted on one
/// replica, verify said `healthy … missing=0` and exited 0; with it deleted
/// on two of three (beyond the failure budget), every replica was reported
/// healthy while the next recovery was bound to drop those records. Now the
/// first is reported as missing on that replica (with its record range and
/// copy count), the second as records below quorum, and both exit non-zero.
#[test]
fn verify_reports_missing_tail_fragments_and_records_below_quorum() {
    let log = TestLog::with_sealed_segments();
    // The last run may have ended with a rotation, leaving an empty tail (a
    // clean shutdown finishes the seal): a small append puts fragments in it.
    succeeds(&log.run(&["log", "append"], b"tail-1\ntail-2\n"));
    // A fragment every replica holds.
    let last = tail_fragments(&log, 0)
        .into_iter()
        .find(|fragment| {
            let relative = fragment.strip_prefix(log.replica_dir(0)).unwrap();
            (1..3).all(|replica| log.replica_dir(replica).join(relative).exists())
        })
        .expect("the tail holds a fragment on every replica");
    let name = object_name(&last);
    std::fs::remove_dir_all(&last).unwrap();
    let json = log.verify_json();
    let missing = json["replicas"][0]["missing_fragments"].as_array().unwrap();
    assert_eq!(missing.len(), 1, "{json}");
    let missing = missing[0].as_str().unwrap();
    assert!(
        missing.contains(&name) && missing.contains("on 2 of 3 replicas"),
        "{missing}"
    );
    assert!(
        json["below_quorum"].as_array().unwrap().is_empty(),
        "{json}"
    );

    let on_one = log
        .replica_dir(1)
        .join(last.strip_prefix(log.replica_dir(0)).unwrap());
    std::fs::remove_dir_all(&on_one).unwrap();
    let output = log.verify();
    assert!(!output.status.success());
    let text = stdout(&output);
    let run = text
        .lines()
        .find(|line| line.starts_with("below quorum: records "))
        .unwrap_or_else(|| panic!("no below-quorum line in:\n{text}"));
    assert!(
        run.ends_with(
            "on 1 of 3 replicas: fewer than a quorum, the next recovery will not keep them"
        ),
        "{run}"
    );
    assert!(
        stderr(&output).contains("repair cannot restore them"),
        "{}",
        stderr(&output)
    );
}
