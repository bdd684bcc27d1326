//! End-to-end tests of `chorus log append` and `chorus log read` through the
//! real binary, on the embedded default and on the test services (three S3
//! servers and a PostgreSQL register).

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::Value;
use support::moto::PrivateMoto;
use tempfile::TempDir;

/// How long a test waits for one expected output line.
const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// A log for one test: a working directory and the store options every
/// command gets (none: the embedded default under the directory).
struct TestLog {
    dir: TempDir,
    store: Vec<String>,
}

impl TestLog {
    fn embedded() -> TestLog {
        TestLog {
            dir: TempDir::new().unwrap(),
            store: Vec::new(),
        }
    }

    /// Three S3 replicas and a PostgreSQL register, or `None` (skip).
    fn on_services(label: &str) -> Option<TestLog> {
        let replicas = support::s3_urls(label)?.join(",");
        let register = support::postgres_register_url(label)?;
        Some(TestLog {
            dir: TempDir::new().unwrap(),
            store: vec!["--replicas".into(), replicas, "--register".into(), register],
        })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = support::chorus_command(self.dir.path());
        command.args(args).args(&self.store);
        command
    }

    fn run(&self, args: &[&str], input: &[u8]) -> Output {
        run_with_input(self.command(args), input)
    }

    fn init(&self) {
        let output = self.run(&["log", "init"], b"");
        assert!(output.status.success(), "{}", stderr(&output));
    }

    /// Appends `input` from stdin; returns the printed indices.
    fn append(&self, input: &[u8]) -> Vec<u64> {
        let output = self.run(&["log", "append"], input);
        assert!(output.status.success(), "{}", stderr(&output));
        stdout_lines(&output).iter().map(|line| ack(line)).collect()
    }

    /// Runs `log read` with `args`; returns `(index, data)` per line.
    fn read(&self, args: &[&str]) -> Vec<(u64, Vec<u8>)> {
        let mut all = vec!["log", "read"];
        all.extend_from_slice(args);
        let output = self.run(&all, b"");
        assert!(output.status.success(), "{}", stderr(&output));
        stdout_lines(&output)
            .iter()
            .map(|line| record(line))
            .collect()
    }

    fn epoch(&self) -> u64 {
        let output = self.run(&["log", "inspect", "--json"], b"");
        assert!(output.status.success(), "{}", stderr(&output));
        let json: Value = serde_json::from_slice(&output.stdout).unwrap();
        json["epoch"].as_u64().unwrap()
    }
}

/// Runs `command` with `input` on its stdin (fed from a thread, so a large
/// input cannot deadlock against a full stdout pipe) and collects its output.
fn run_with_input(mut command: Command, input: &[u8]) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chorus runs");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let feeder = std::thread::spawn(move || stdin.write_all(&input));
    let output = child.wait_with_output().unwrap();
    let _ = feeder.join().unwrap();
    output
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout_lines(output: &Output) -> Vec<String> {
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The index of an ack line `{"index":N}` (and nothing else).
fn ack(line: &str) -> u64 {
    let json: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    assert_eq!(json.as_object().unwrap().len(), 1, "{line}");
    json["index"].as_u64().unwrap()
}

/// `(index, data)` of a read line, with `data` or `data_b64`.
fn record(line: &str) -> (u64, Vec<u8>) {
    let json: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    let index = json["index"].as_u64().unwrap();
    let data = match (json.get("data"), json.get("data_b64")) {
        (Some(Value::String(text)), None) => text.as_bytes().to_vec(),
        (None, Some(Value::String(encoded))) => BASE64.decode(encoded).unwrap(),
        _ => panic!("neither data nor data_b64 alone: {line}"),
    };
    (index, data)
}

/// Asserts a failure with exactly one line on stderr containing `expected`.
fn assert_fails_with(output: &Output, expected: &str) {
    assert!(!output.status.success(), "unexpected success");
    let stderr = stderr(output);
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    assert!(stderr.starts_with("chorus: "), "{stderr}");
    assert!(
        stderr.contains(expected),
        "expected {expected:?} in: {stderr}"
    );
}

/// The lines of a child's stdout, as they arrive.
fn lines_of(stdout: ChildStdout) -> mpsc::Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    receiver
}

/// Input record `i` of the long streams: distinct, of varying length.
fn stream_record(i: u64) -> String {
    format!("record-{i:08}-{}", "x".repeat((i % 61) as usize))
}

fn lines_input(records: &[&str]) -> Vec<u8> {
    records
        .iter()
        .flat_map(|record| format!("{record}\n").into_bytes())
        .collect()
}

#[test]
fn append_from_stdin_then_read_back_with_dense_indices() {
    let log = TestLog::embedded();
    log.init();
    let first = ["alpha", "", "gamma with spaces", "δέλτα"];
    assert_eq!(log.append(&lines_input(&first)), vec![0, 1, 2, 3]);
    let second: Vec<String> = (0..300).map(stream_record).collect();
    let second: Vec<&str> = second.iter().map(String::as_str).collect();
    let indices = log.append(&lines_input(&second));
    assert_eq!(indices, (4..304).collect::<Vec<_>>());

    let epoch = log.epoch();
    let read = log.read(&["--from", "0"]);
    let expected: Vec<(u64, Vec<u8>)> = first
        .iter()
        .chain(&second)
        .enumerate()
        .map(|(i, record)| (i as u64, record.as_bytes().to_vec()))
        .collect();
    assert_eq!(read, expected);
    assert_eq!(log.epoch(), epoch, "a reader claimed an epoch");
    // Without --from, reading starts at the floor (0 here).
    assert_eq!(log.read(&[]), expected);
}

#[test]
fn append_from_a_file_keeps_carriage_returns_and_a_last_unterminated_line() {
    let log = TestLog::embedded();
    log.init();
    std::fs::write(log.dir.path().join("input.txt"), b"one\r\ntwo\n\nlast").unwrap();
    let output = log.run(&["log", "append", "--file", "input.txt"], b"ignored\n");
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        stdout_lines(&output),
        [
            r#"{"index":0}"#,
            r#"{"index":1}"#,
            r#"{"index":2}"#,
            r#"{"index":3}"#
        ]
    );
    let read = log.read(&["--from", "0"]);
    let expected: Vec<(u64, Vec<u8>)> = vec![
        (0, b"one\r".to_vec()),
        (1, b"two".to_vec()),
        (2, Vec::new()),
        (3, b"last".to_vec()),
    ];
    assert_eq!(read, expected);
    let raw = log.run(&["log", "read", "--from", "0", "--to", "1"], b"");
    assert_eq!(stdout_lines(&raw), [r#"{"index":0,"data":"one\r"}"#]);
}

#[test]
fn a_missing_input_file_fails_before_touching_the_log() {
    let log = TestLog::embedded();
    log.init();
    let epoch = log.epoch();
    assert_fails_with(
        &log.run(&["log", "append", "--file", "nope.txt"], b""),
        "cannot open input file nope.txt",
    );
    assert_eq!(log.epoch(), epoch);
}

#[test]
fn an_overlong_input_line_fails_after_the_earlier_acks() {
    let log = TestLog::embedded();
    log.init();
    let mut input = b"first\nsecond\n".to_vec();
    input.extend(std::iter::repeat_n(b'x', 1024 * 1024 + 1));
    input.extend_from_slice(b"\nnever\n");
    let output = log.run(&["log", "append"], &input);
    assert_fails_with(&output, "cannot read input line 3");
    assert!(stderr(&output).contains("max_record_bytes=1048576"));
    assert_eq!(stdout_lines(&output), [r#"{"index":0}"#, r#"{"index":1}"#]);
    let read = log.read(&["--from", "0"]);
    let expected: Vec<(u64, Vec<u8>)> = vec![(0, b"first".to_vec()), (1, b"second".to_vec())];
    assert_eq!(read, expected);
}

#[test]
fn base64_reads_records_that_are_not_utf8() {
    let log = TestLog::embedded();
    log.init();
    assert_eq!(log.append(b"text\n\xff\xfe\x00\n\n"), vec![0, 1, 2]);
    let output = log.run(&["log", "read", "--base64"], b"");
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        stdout_lines(&output),
        [
            r#"{"index":0,"data_b64":"dGV4dA=="}"#,
            r#"{"index":1,"data_b64":"//4A"}"#,
            r#"{"index":2,"data_b64":""}"#
        ]
    );
    let text = log.run(&["log", "read"], b"");
    assert_fails_with(&text, "record 1 is not valid UTF-8");
    assert!(stderr(&text).contains("--base64"));
    // Every record before the bad one was printed.
    assert_eq!(stdout_lines(&text), [r#"{"index":0,"data":"text"}"#]);
}

#[test]
fn to_is_exclusive_and_stops_even_with_follow() {
    let log = TestLog::embedded();
    log.init();
    let records: Vec<String> = (0..10).map(|i| format!("r{i}")).collect();
    let records: Vec<&str> = records.iter().map(String::as_str).collect();
    log.append(&lines_input(&records));
    let indices = |read: Vec<(u64, Vec<u8>)>| read.into_iter().map(|(i, _)| i).collect::<Vec<_>>();
    assert_eq!(indices(log.read(&["--from", "2", "--to", "5"])), [2, 3, 4]);
    assert_eq!(
        indices(log.read(&["--from", "3", "--to", "3"])),
        [] as [u64; 0]
    );
    assert_eq!(
        indices(log.read(&["--from", "7", "--to", "9", "--follow"])),
        [7, 8]
    );
    assert_eq!(indices(log.read(&["--from", "8"])), [8, 9]);
    assert!(log.read(&["--from", "10"]).is_empty());
    // Issue 16, finding 8: a usage error exits 2 (it exited 1), and a read
    // past the end says where the log ends (it said nothing).
    let reversed = log.run(&["log", "read", "--from", "5", "--to", "4"], b"");
    assert_fails_with(&reversed, "--to 4 is below --from 5");
    assert_eq!(reversed.status.code(), Some(2));
    let past = log.run(&["log", "read", "--from", "12"], b"");
    assert!(past.status.success());
    assert!(past.stdout.is_empty());
    assert_eq!(
        stderr(&past).trim(),
        "chorus: nothing to read: the log ends at index 10 (--from 12)"
    );
}

#[test]
fn follow_picks_up_records_appended_later() {
    let log = TestLog::embedded();
    log.init();
    log.append(b"before\n");
    let mut follower = log
        .command(&["log", "read", "--follow", "--poll-interval-ms", "20"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(follower.stdout.take().unwrap());
    let next = || record(&lines.recv_timeout(LINE_TIMEOUT).expect("a line in time"));
    assert_eq!(next(), (0, b"before".to_vec()));
    log.append(b"after-1\nafter-2\n");
    assert_eq!(next(), (1, b"after-1".to_vec()));
    assert_eq!(next(), (2, b"after-2".to_vec()));
    log.append(b"after-3\n");
    assert_eq!(next(), (3, b"after-3".to_vec()));
    assert!(follower.try_wait().unwrap().is_none(), "--follow exited");
    follower.kill().unwrap();
    follower.wait().unwrap();
}

#[test]
fn tail_starts_at_the_end_and_follows() {
    let log = TestLog::embedded();
    log.init();
    log.append(b"old-0\nold-1\n");
    let mut tail = log
        .command(&["log", "tail", "--poll-interval-ms", "20"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(tail.stdout.take().unwrap());
    // Append until tail prints something: however long tail takes to find
    // the end, what it prints first must be new, and then dense.
    let mut first = None;
    for k in 2..60u64 {
        log.append(format!("new-{k}\n").as_bytes());
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(500)) {
            first = Some(record(&line));
            break;
        }
    }
    let (index, data) = first.expect("tail printed nothing");
    assert_eq!(
        data,
        format!("new-{index}").into_bytes(),
        "tail printed an old record"
    );
    log.append(b"last\n");
    let next = record(&lines.recv_timeout(LINE_TIMEOUT).expect("a line in time"));
    assert_eq!(next.0, index + 1);
    assert!(tail.try_wait().unwrap().is_none(), "tail exited");
    tail.kill().unwrap();
    tail.wait().unwrap();
}

#[test]
fn a_read_below_the_floor_is_truncated() {
    let log = TestLog::embedded();
    // A SQLite register, so the test can raise the floor behind chorus's back.
    let db = log.dir.path().join("register.db");
    let config = format!("register = \"sqlite://{}\"\n", db.display());
    std::fs::write(log.dir.path().join("chorus.toml"), config).unwrap();
    log.init();
    log.append(b"r0\nr1\nr2\nr3\n");
    // The next recovery seals r0..r3 into the directory.
    log.append(b"r4\n");
    let connection = rusqlite::Connection::open(&db).unwrap();
    let fields: String = connection
        .query_row("SELECT fields FROM chorus_register", [], |row| row.get(0))
        .unwrap();
    let raised = fields.replace("\"chorus.trunc\":\"0\"", "\"chorus.trunc\":\"2\"");
    assert_ne!(raised, fields);
    connection
        .execute("UPDATE chorus_register SET fields = ?1", [&raised])
        .unwrap();

    assert_fails_with(
        &log.run(&["log", "read", "--from", "1"], b""),
        "cannot read index 1: truncated: requested=1 floor=2",
    );
    let from_floor: Vec<u64> = log.read(&[]).into_iter().map(|(i, _)| i).collect();
    assert_eq!(from_floor, [2, 3, 4]);
}

#[test]
fn bad_locations_fail_with_one_line_and_create_nothing() {
    let dir = TempDir::new().unwrap();
    let log = TestLog {
        dir,
        store: Vec::new(),
    };
    for command in ["append", "read"] {
        assert_fails_with(
            &log.run(&["log", command, "--replicas", "ftp://x/y"], b"a\n"),
            "unsupported scheme \"ftp\"",
        );
        assert_fails_with(
            &log.run(&["log", command], b"a\n"),
            "run `chorus log init` first",
        );
    }
    assert!(
        std::fs::read_dir(log.dir.path()).unwrap().next().is_none(),
        "something was created"
    );
    log.init();
    let data = log.dir.path().join("chorus-data");
    let reordered = format!(
        "file://{0}/replica-1,file://{0}/replica-0,file://{0}/replica-2",
        data.display()
    );
    for command in ["append", "read"] {
        assert_fails_with(
            &log.run(&["log", command, "--replicas", &reordered], b"a\n"),
            "replicas do not match register",
        );
    }
    assert_eq!(log.epoch(), 0);
}

#[test]
fn a_replica_that_cannot_be_opened_fails_with_one_line_naming_it() {
    let log = TestLog::embedded();
    log.init();
    let replica = log.dir.path().join("chorus-data/replica-1");
    std::fs::remove_dir_all(&replica).unwrap();
    std::fs::write(&replica, b"not a directory").unwrap();
    let name = format!("cannot open replica file://{}", replica.display());
    // Issue 16, finding 6: the message said `key=:` and nothing about why.
    let why = format!("{} is not a directory", replica.display());
    for args in [&["log", "append"][..], &["log", "read"]] {
        let output = log.run(args, b"a\n");
        assert_fails_with(&output, &name);
        assert_fails_with(&output, &why);
        assert!(!stderr(&output).contains("key=:"), "{}", stderr(&output));
    }
    assert_eq!(log.epoch(), 0);
    // A directory of the store's own replaced by a file is named too.
    std::fs::remove_file(&replica).unwrap();
    std::fs::create_dir(&replica).unwrap();
    let staging = replica.join(".chorus-tmp");
    std::fs::write(&staging, b"in the way").unwrap();
    let output = log.run(&["log", "append"], b"a\n");
    assert_fails_with(
        &output,
        &format!("cannot create directory {}", staging.display()),
    );
}

#[test]
fn closing_stdout_early_is_not_an_error() {
    let log = TestLog::embedded();
    log.init();
    let input: Vec<u8> = (0..20_000)
        .flat_map(|i| format!("{}\n", stream_record(i)).into_bytes())
        .collect();
    for args in [&["log", "append"][..], &["log", "read"][..]] {
        let mut child = log
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let input = input.clone();
        let feeder = std::thread::spawn(move || stdin.write_all(&input));
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        stdout.read_line(&mut first).unwrap();
        assert_eq!(record_or_ack_index(&first), 0);
        drop(stdout);
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        assert!(output.stderr.is_empty(), "{args:?}: {}", stderr(&output));
        let _ = feeder.join().unwrap();
    }
    // What append admitted before it stopped is a dense prefix of the input.
    let read = log.read(&["--from", "0"]);
    assert!(!read.is_empty());
    for (position, (index, data)) in read.iter().enumerate() {
        assert_eq!(*index, position as u64);
        assert_eq!(data, stream_record(*index).as_bytes());
    }
}

fn record_or_ack_index(line: &str) -> u64 {
    let json: Value = serde_json::from_str(line.trim_end()).unwrap();
    json["index"].as_u64().unwrap()
}

/// Writes `stream_record(0..)` into `child`'s stdin until the pipe breaks
/// (the child died) or `limit` records; returns how many it wrote.
fn feed_stream(child: &mut Child, limit: u64) -> JoinHandle<u64> {
    let stdin = child.stdin.take().unwrap();
    std::thread::spawn(move || {
        let mut stdin = std::io::BufWriter::new(stdin);
        for i in 0..limit {
            if writeln!(stdin, "{}", stream_record(i)).is_err() {
                return i;
            }
        }
        limit
    })
}

/// Appends an endless stream through `chorus log append`, SIGKILLs it after
/// at least `kill_after` acks, and checks that every printed index reads back
/// with its data, indices dense from 0, and that the next writer continues
/// after everything the reader saw.
fn sigkill_mid_stream_loses_no_ack(log: &TestLog, kill_after: usize) {
    let started = Instant::now();
    log.init();
    let mut append = log
        .command(&["log", "append", "--max-segment-bytes", "65536"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let feeder = feed_stream(&mut append, 50_000_000);
    let lines = lines_of(append.stdout.take().unwrap());
    let mut printed = Vec::new();
    while printed.len() < kill_after {
        let Ok(line) = lines.recv_timeout(LINE_TIMEOUT) else {
            let _ = append.kill();
            let output = append.wait_with_output().unwrap();
            panic!("acks stopped after {}: {}", printed.len(), stderr(&output))
        };
        printed.push(ack(&line));
    }
    assert!(append.try_wait().unwrap().is_none(), "append ended early");
    append.kill().unwrap(); // SIGKILL
    append.wait().unwrap();
    // Acks printed before the kill may still be in the pipe.
    while let Ok(line) = lines.recv_timeout(LINE_TIMEOUT) {
        printed.push(ack(&line));
    }
    let fed = feeder.join().unwrap();
    assert_eq!(printed, (0..printed.len() as u64).collect::<Vec<_>>());
    assert!((printed.len() as u64) < fed);

    let read = log.read(&["--from", "0"]);
    assert!(
        read.len() >= printed.len(),
        "{} < {}",
        read.len(),
        printed.len()
    );
    for (position, (index, data)) in read.iter().enumerate() {
        assert_eq!(*index, position as u64, "indices are not dense");
        assert_eq!(data, stream_record(*index).as_bytes(), "index {index}");
    }
    // The next writer recovers and continues after everything read so far.
    let next = log.append(b"after the kill\n");
    assert!(next[0] >= read.len() as u64, "{next:?}");
    let again = log.read(&["--from", "0"]);
    assert_eq!(again[..read.len()], read[..]);
    assert_eq!(again.len() as u64, next[0] + 1);
    assert_eq!(again.last().unwrap().1, b"after the kill");
    eprintln!(
        "sigkill: {} acks printed, {} records read back, {:?}",
        printed.len(),
        read.len(),
        started.elapsed()
    );
}

#[test]
fn a_second_append_fences_the_first_which_fails_after_its_acks() {
    let log = TestLog::embedded();
    log.init();
    let mut first = log
        .command(&["log", "append"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let feeder = feed_stream(&mut first, 50_000_000);
    let lines = lines_of(first.stdout.take().unwrap());
    let mut printed = vec![ack(&lines.recv_timeout(LINE_TIMEOUT).unwrap())];
    let second = log.append(b"from the second writer\n");
    // The first writer stops once it meets the second's fences.
    while let Ok(line) = lines.recv_timeout(LINE_TIMEOUT) {
        printed.push(ack(&line));
    }
    let output = first.wait_with_output().unwrap();
    assert_fails_with(&output, "fenced: epoch=1 superseded by epoch=2");
    feeder.join().unwrap();
    assert_eq!(printed, (0..printed.len() as u64).collect::<Vec<_>>());

    let read = log.read(&["--from", "0"]);
    assert!(second[0] >= printed.len() as u64);
    assert_eq!(read.len() as u64, second[0] + 1);
    for (index, data) in &read[..read.len() - 1] {
        assert_eq!(data, stream_record(*index).as_bytes(), "index {index}");
    }
    assert_eq!(read.last().unwrap().1, b"from the second writer");
}

#[test]
fn sigkill_mid_stream_loses_no_ack_on_the_embedded_default() {
    sigkill_mid_stream_loses_no_ack(&TestLog::embedded(), 5_000);
}

#[test]
fn sigkill_mid_stream_loses_no_ack_on_s3_and_postgres() {
    let Some(log) = TestLog::on_services("cli-sigkill") else {
        return;
    };
    sigkill_mid_stream_loses_no_ack(&log, 5_000);
}

#[test]
fn append_and_read_on_s3_and_postgres() {
    let Some(log) = TestLog::on_services("cli-roundtrip") else {
        return;
    };
    log.init();
    assert_eq!(log.append(b"one\ntwo\n"), [0, 1]);
    assert_eq!(log.append(b"three\n"), [2]);
    let read = log.read(&["--from", "0"]);
    let expected: Vec<(u64, Vec<u8>)> = vec![
        (0, b"one".to_vec()),
        (1, b"two".to_vec()),
        (2, b"three".to_vec()),
    ];
    assert_eq!(read, expected);
}

/// Three plain `s3://` replica URLs (no options) on the first test server,
/// its endpoint, and a PostgreSQL register; `None` skips outside CI.
fn plain_s3_location(label: &str) -> Option<(Vec<String>, String, String)> {
    let endpoint = support::service_var("CHORUS_TEST_S3_ENDPOINTS")?;
    let bucket = support::service_var("CHORUS_TEST_S3_BUCKETS")?;
    let endpoint = endpoint.split(',').next().unwrap().to_owned();
    let bucket = bucket.split(',').next().unwrap().to_owned();
    let prefix = support::unique(label);
    let replicas = (0..3)
        .map(|i| format!("s3://{bucket}/{prefix}/replica-{i}"))
        .collect();
    Some((replicas, endpoint, support::postgres_register_url(label)?))
}

/// `command` with every `AWS_*` variable of the test's environment removed.
fn without_aws_environment(mut command: Command) -> Command {
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("AWS_")) {
        command.env_remove(name);
    }
    command
}

/// Runs init, append and read with `configure` applied to every command and
/// checks the records come back.
fn round_trip_with(dir: &std::path::Path, configure: impl Fn(&mut Command)) {
    let run = |args: &[&str], input: &[u8]| {
        let mut command = without_aws_environment(support::chorus_command(dir));
        configure(&mut command);
        command.args(args);
        let output = run_with_input(command, input);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        stdout_lines(&output)
    };
    run(&["log", "init"], b"");
    let acks: Vec<u64> = run(&["log", "append"], b"one\ntwo\n")
        .iter()
        .map(|line| ack(line))
        .collect();
    assert_eq!(acks, [0, 1]);
    let read: Vec<_> = run(&["log", "read", "--from", "0"], b"")
        .iter()
        .map(|line| record(line))
        .collect();
    assert_eq!(read, [(0, b"one".to_vec()), (1, b"two".to_vec())]);
}

/// Endpoint, region, transport and credentials of plain `s3://` URLs come
/// from `chorus.toml`'s `[s3]` table (no `AWS_*` variable is set).
#[test]
fn s3_settings_and_credentials_come_from_chorus_toml() {
    let Some((replicas, endpoint, register)) = plain_s3_location("toml-s3") else {
        return;
    };
    let dir = TempDir::new().unwrap();
    let config = format!(
        "replicas = {replicas:?}\nregister = {register:?}\n\n[s3]\nendpoint = {endpoint:?}\n\
         region = \"us-east-1\"\nallow_http = true\naccess_key_id = \"testing\"\n\
         secret_access_key = \"testing\"\n"
    );
    std::fs::write(dir.path().join("chorus.toml"), config).unwrap();
    round_trip_with(dir.path(), |_| {});
}

/// With plain `s3://` URLs and no `[s3]` table, the usual `AWS_*`
/// environment variables name the endpoint, region, transport and credentials.
#[test]
fn s3_settings_come_from_the_aws_environment() {
    let Some((replicas, endpoint, register)) = plain_s3_location("env-s3") else {
        return;
    };
    let dir = TempDir::new().unwrap();
    round_trip_with(dir.path(), |command| {
        command
            .env("CHORUS_REPLICAS", replicas.join(","))
            .env("CHORUS_REGISTER", &register)
            .env("AWS_ENDPOINT", &endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing");
    });
}

/// The log works end to end on three `az://` replicas (Azurite, reached
/// through `AZURE_STORAGE_USE_EMULATOR` from the test services).
#[test]
fn append_and_read_on_azure() {
    let Some(base) = support::azure_url("cli-azure") else {
        return;
    };
    let replicas: Vec<String> = (0..3).map(|i| format!("{base}/replica-{i}")).collect();
    let dir = TempDir::new().unwrap();
    round_trip_with(dir.path(), |command| {
        command
            .env("CHORUS_REPLICAS", replicas.join(","))
            .env("AZURE_STORAGE_USE_EMULATOR", "true");
    });
}

/// Every log command takes its location from `CHORUS_*` variables, and from
/// a `chorus.toml`, not only `init`.
#[test]
fn log_commands_take_their_location_from_the_environment_or_chorus_toml() {
    let dir = TempDir::new().unwrap();
    let location = |name: &str| {
        let base = dir.path().join(name);
        // Chorus creates a replica's own directory, not its parents.
        std::fs::create_dir(&base).unwrap();
        let replicas: Vec<String> = (0..3)
            .map(|i| format!("file://{}/r{i}", base.display()))
            .collect();
        (replicas, format!("sqlite://{}/register.db", base.display()))
    };
    let (replicas, register) = location("from-env");
    round_trip_with(dir.path(), |command| {
        command
            .env("CHORUS_REPLICAS", replicas.join(","))
            .env("CHORUS_REGISTER", &register);
    });
    assert!(dir.path().join("from-env/register.db").is_file());

    let (replicas, register) = location("from-file");
    let config = format!("replicas = {replicas:?}\nregister = {register:?}\n");
    std::fs::write(dir.path().join("custom.toml"), config).unwrap();
    round_trip_with(dir.path(), |command| {
        command.env("CHORUS_CONFIG", "custom.toml");
    });
    assert!(dir.path().join("from-file/register.db").is_file());
    assert!(!dir.path().join("chorus-data").exists());
}

#[test]
fn append_continues_with_one_replica_unreachable() {
    let Some(shared) = support::s3_urls("one-down") else {
        return;
    };
    // A server of the test's own, so stopping it disturbs no other test.
    let Some(private) = PrivateMoto::start(1) else {
        return;
    };
    let third = &private.s3_urls("one-down")[0];
    let replicas = format!("{},{},{third}", shared[0], shared[1]);
    let log = TestLog {
        dir: TempDir::new().unwrap(),
        store: vec!["--replicas".into(), replicas],
    };
    log.init();
    log.append(b"all-up\n");
    drop(private);
    let output = log.run(&["log", "append"], b"one-down-1\none-down-2\n");
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(stdout_lines(&output).len(), 2);
    assert!(
        stderr(&output).contains("replica unreachable"),
        "{}",
        stderr(&output)
    );
    let records = log.read(&["--from", "0"]);
    assert_eq!(
        records,
        vec![
            (0, b"all-up".to_vec()),
            (1, b"one-down-1".to_vec()),
            (2, b"one-down-2".to_vec())
        ]
    );
}
