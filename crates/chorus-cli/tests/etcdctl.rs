//! etcdctl, etcd's own command-line client, against `chorus serve` started
//! as the README says (in an empty directory, on the embedded default
//! stores, `--etcd-listen` on a free port), and against a fresh real etcd:
//! one script of etcdctl commands runs against both, and every output must
//! be what the real etcd printed, byte for byte, once what names a
//! deployment (endpoints, ids, raft terms, timings) is masked. Status and
//! member list, which describe the deployment itself, are checked on their
//! own.
//!
//! etcdctl comes from Debian's `etcd-client` (scripts/services.sh installs
//! it): version 3.4, which has no `get --count-only` (etcd 3.5 added it);
//! that flag is exercised when the installed etcdctl knows it, and through
//! the `etcd-client` crate in crates/chorus-etcd/tests/etcd_differential.rs
//! either way.

mod support;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::etcd::{EtcdServer, etcdctl_binary, free_port};
use support::server::Launch;

/// How long `chorus serve` may take to answer etcd clients.
const SERVE_TIMEOUT: Duration = Duration::from_secs(60);

/// What one etcdctl run printed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    /// The exit code.
    code: Option<i32>,
    /// Stdout, masked.
    stdout: String,
    /// What etcdctl itself wrote to stderr (`Error: …`, `… is healthy …`),
    /// masked; the Go client's JSON log lines (retries, with timestamps) are
    /// left out.
    messages: Vec<String>,
}

/// etcdctl aimed at one endpoint.
struct Etcdctl {
    binary: PathBuf,
    endpoint: String,
}

impl Etcdctl {
    /// Runs `etcdctl --endpoints <endpoint> <args>` with `stdin` as input.
    fn run(&self, args: &[&str], stdin: &str) -> Outcome {
        let mut child = Command::new(&self.binary)
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoint, "--command-timeout", "20s"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("etcdctl runs");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .expect("etcdctl reads its input");
        let output = child.wait_with_output().expect("etcdctl finishes");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr);
        Outcome {
            code: output.status.code(),
            stdout: self.masked(&stdout),
            messages: stderr
                .lines()
                .filter(|line| !line.starts_with('{'))
                .map(|line| self.masked(line))
                .collect(),
        }
    }

    /// `stdout` with what names the deployment replaced: the endpoint, the
    /// `fields` output's cluster id, member id and raft term, and the time
    /// a health check took.
    fn masked(&self, stdout: &str) -> String {
        stdout
            .replace(&self.endpoint, "<endpoint>")
            .lines()
            .map(|line| {
                for field in ["\"ClusterID\" : ", "\"MemberID\" : ", "\"RaftTerm\" : "] {
                    if line.starts_with(field) {
                        return format!("{field}<masked>");
                    }
                }
                match line.split_once("took = ") {
                    Some((before, _)) => format!("{before}took = <masked>"),
                    None => line.to_owned(),
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until the endpoint answers `endpoint health`.
    fn wait_healthy(&self) {
        let deadline = Instant::now() + SERVE_TIMEOUT;
        loop {
            let outcome = self.run(&["endpoint", "health"], "");
            if outcome.code == Some(0) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} not healthy within {SERVE_TIMEOUT:?}: {outcome:?}",
                self.endpoint
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The same etcdctl aimed at the endpoint without its scheme
    /// (`127.0.0.1:2379`, etcdctl's own default form). etcdctl 3.4 dials
    /// `endpoint status` on a connection of its own whose HTTP/2 `:authority`
    /// is the endpoint as given; `http://…` is no authority, and the HTTP/2
    /// server under `chorus serve` (the h2 crate) resets such a stream where
    /// etcd's Go server lets it through (docs/etcd.md, known differences).
    fn without_scheme(&self) -> Etcdctl {
        Etcdctl {
            binary: self.binary.clone(),
            endpoint: self.endpoint.trim_start_matches("http://").to_owned(),
        }
    }

    /// Whether this etcdctl has `get --count-only` (etcd 3.5 and later).
    fn knows_count_only(&self) -> bool {
        let help = Command::new(&self.binary)
            .env("ETCDCTL_API", "3")
            .args(["get", "--help"])
            .output()
            .expect("etcdctl runs");
        String::from_utf8_lossy(&help.stdout).contains("--count-only")
    }
}

/// One step of the script: etcdctl's arguments and its input.
struct Step {
    args: Vec<&'static str>,
    stdin: &'static str,
    /// Whether etcd refuses it (etcdctl exits 1 with `Error: …`).
    refused: bool,
}

fn step(args: &[&'static str]) -> Step {
    Step {
        args: args.to_vec(),
        stdin: "",
        refused: false,
    }
}

/// A step etcd refuses.
fn refused(args: &[&'static str]) -> Step {
    Step {
        refused: true,
        ..step(args)
    }
}

/// A txn read from stdin in etcdctl's interactive format: compares, a blank
/// line, the success requests, a blank line, the failure requests, a blank
/// line.
fn txn(stdin: &'static str) -> Step {
    Step {
        args: vec!["txn", "--interactive"],
        stdin,
        refused: false,
    }
}

/// The script: writes, every read option, deletes, txns down both
/// branches, compaction and the refusals etcd gives.
fn script(count_only: bool) -> Vec<Step> {
    let mut steps = vec![
        step(&["put", "foo", "bar"]),
        step(&["put", "foo1", "bar1"]),
        step(&["put", "foo2", "bar2"]),
        step(&["put", "zoo", "z"]),
        step(&["put", "foo", "bar-again", "--prev-kv"]),
        step(&["get", "foo"]),
        step(&["get", "foo", "-w", "fields"]),
        step(&["get", "foo", "--prefix"]),
        step(&["get", "foo", "--from-key"]),
        step(&["get", "foo1", "zoo"]),
        step(&["get", "foo", "--rev=2"]),
        step(&["get", "foo", "--rev=2", "-w", "fields"]),
        step(&["get", "foo", "--prefix", "--limit=2", "-w", "fields"]),
        step(&[
            "get",
            "foo",
            "--prefix",
            "--sort-by=MODIFY",
            "--order=DESCEND",
        ]),
        step(&[
            "get",
            "foo",
            "--prefix",
            "--sort-by=CREATE",
            "--order=ASCEND",
        ]),
        step(&[
            "get",
            "foo",
            "--prefix",
            "--sort-by=VALUE",
            "--order=DESCEND",
        ]),
        step(&[
            "get",
            "foo",
            "--prefix",
            "--sort-by=VERSION",
            "--order=DESCEND",
        ]),
        step(&[
            "get",
            "foo",
            "--prefix",
            "--sort-by=KEY",
            "--order=DESCEND",
            "--limit=1",
        ]),
        step(&["get", "foo", "--prefix", "--keys-only"]),
        step(&["get", "foo", "--prefix", "--print-value-only"]),
        step(&["get", "", "--from-key", "--consistency=s"]),
        step(&["get", "absent"]),
        txn("value(\"foo1\") = \"bar1\"\n\nput foo1 changed\nget foo1\n\nget zoo\n\n"),
        txn("value(\"foo1\") = \"bar1\"\n\nput foo1 again\n\nget zoo\nput zoo z2\n\n"),
        txn("mod(\"foo2\") > \"0\"\nversion(\"foo\") = \"2\"\n\ndel foo2\nget foo --prefix\n\n\n"),
        txn("create(\"nothing\") = \"0\"\n\nput nothing something\n\n\n"),
        step(&["get", "", "--from-key", "-w", "fields"]),
        step(&["del", "foo", "--prev-kv"]),
        step(&["del", "foo", "--prefix", "--prev-kv"]),
        step(&["del", "absent"]),
        step(&["get", "", "--from-key"]),
        step(&["compaction", "3"]),
        refused(&["get", "foo", "--rev=2"]),
        step(&["get", "foo", "--rev=3"]),
        refused(&["get", "foo", "--rev=999"]),
        refused(&["compaction", "2"]),
        refused(&["compaction", "999"]),
        refused(&["put", "", "empty"]),
        step(&["put", "zoo", "--ignore-value"]),
        refused(&["put", "absent", "--ignore-value"]),
        step(&["endpoint", "health"]),
    ];
    if count_only {
        steps.push(step(&[
            "get",
            "",
            "--from-key",
            "--count-only",
            "-w",
            "fields",
        ]));
    }
    steps
}

/// Every command of the script prints through `chorus serve` what it prints
/// through a real etcd.
#[test]
fn etcdctl_prints_what_it_prints_against_etcd() {
    let (Some(binary), Some(etcd)) = (etcdctl_binary(), EtcdServer::start("etcdctl-oracle")) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let chorus = Launch::new(dir.path())
        .args(["--etcd-listen", &listen])
        .start("chorus");
    let through_chorus = Etcdctl {
        binary: binary.clone(),
        endpoint: format!("http://{listen}"),
    };
    let through_etcd = Etcdctl {
        binary,
        endpoint: etcd.endpoint().to_owned(),
    };
    through_chorus.wait_healthy();
    for (number, step) in script(through_etcd.knows_count_only()).iter().enumerate() {
        let expected = through_etcd.run(&step.args, step.stdin);
        let actual = through_chorus.run(&step.args, step.stdin);
        // The oracle did what the step is for (not two equal failures).
        let code = if step.refused { 1 } else { 0 };
        assert_eq!(expected.code, Some(code), "step {number}: {expected:?}");
        assert_eq!(
            actual,
            expected,
            "step {number}: etcdctl {:?} (input {:?}) through chorus differs from etcd;\nchorus stderr:\n{}",
            step.args,
            step.stdin,
            chorus.stderr_tail()
        );
        if step.args == ["get", "foo"] {
            assert_eq!(expected.stdout, "foo\nbar-again", "{expected:?}");
        }
    }
    check_status(
        &through_chorus.without_scheme(),
        &through_etcd.without_scheme(),
    );
    check_member_list(&through_chorus);
}

/// `endpoint status`: a version clients parse as 3.5.8 or later (below,
/// Kubernetes turns off watch progress requests), the store revision the
/// real etcd reached with the same commands, Chorus as its own leader.
fn check_status(through_chorus: &Etcdctl, through_etcd: &Etcdctl) {
    let status = |etcdctl: &Etcdctl| {
        let outcome = etcdctl.run(&["endpoint", "status", "-w", "json"], "");
        assert_eq!(outcome.code, Some(0), "{outcome:?}");
        let all: serde_json::Value = serde_json::from_str(&outcome.stdout).expect("JSON");
        all[0]["Status"].clone()
    };
    let (chorus, etcd) = (status(through_chorus), status(through_etcd));
    assert_eq!(
        chorus["header"]["revision"], etcd["header"]["revision"],
        "chorus {chorus} vs etcd {etcd}"
    );
    let version = chorus["version"].as_str().expect("a version");
    let parts: Vec<u64> = version
        .split('.')
        .map(|part| {
            part.parse()
                .unwrap_or_else(|_| panic!("{version} is not x.y.z"))
        })
        .collect();
    assert!(
        parts.len() == 3 && parts >= vec![3, 5, 8],
        "version {version}"
    );
    assert_eq!(chorus["leader"], chorus["header"]["member_id"], "{chorus}");
    assert!(chorus["raftIndex"].as_u64() > Some(0), "{chorus}");
    assert!(chorus["dbSize"].as_u64() > Some(0), "{chorus}");
    let table = through_chorus.run(&["endpoint", "status"], "");
    assert_eq!(table.code, Some(0), "{table:?}");
    assert!(table.stdout.starts_with("<endpoint>, "), "{table:?}");
    assert!(
        table.stdout.contains(&format!(", {version}, ")),
        "{table:?}"
    );
}

/// `member list`: one member, started, whose client URL is the endpoint.
fn check_member_list(through_chorus: &Etcdctl) {
    let outcome = through_chorus.run(&["member", "list", "-w", "json"], "");
    assert_eq!(outcome.code, Some(0), "{outcome:?}");
    let list: serde_json::Value = serde_json::from_str(&outcome.stdout).expect("JSON");
    let members = list["members"].as_array().expect("members");
    assert_eq!(members.len(), 1, "{list}");
    assert_eq!(
        members[0]["clientURLs"],
        serde_json::json!(["<endpoint>"]),
        "{list}"
    );
    let simple = through_chorus.run(&["member", "list"], "");
    assert_eq!(simple.code, Some(0), "{simple:?}");
    let line = simple.stdout.trim_end();
    assert!(
        line.contains(", started, ") && line.contains(", <endpoint>, "),
        "{line:?}"
    );
}
