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

use support::etcd::EtcdServer;
use support::etcdctl::{Etcdctl, serve_with_etcdctl};

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
    let Some(etcd) = EtcdServer::start("etcdctl-oracle") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let Some((chorus, through_chorus)) = serve_with_etcdctl(dir.path()) else {
        return;
    };
    let through_etcd = Etcdctl {
        binary: through_chorus.binary.clone(),
        endpoint: etcd.endpoint().to_owned(),
    };
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
    check_status(&through_chorus, &through_etcd);
    check_member_list(&through_chorus);
}

/// `endpoint status` (and `--cluster`, and `endpoint hashkv`) on an
/// endpoint given as a URL: a version clients parse as 3.5.8 or later
/// (below, Kubernetes turns off watch progress requests), the store
/// revision the real etcd reached with the same commands, Chorus as its
/// own leader.
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
    // With --cluster, etcdctl 3.4 dials each member's client URL with the
    // whole URL as the HTTP/2 :authority (vendor/README.md).
    let cluster = through_chorus.run(&["endpoint", "status", "--cluster", "-w", "json"], "");
    assert_eq!(cluster.code, Some(0), "{cluster:?}");
    let members: serde_json::Value = serde_json::from_str(&cluster.stdout).expect("JSON");
    assert_eq!(members.as_array().map(Vec::len), Some(1), "{members}");
    assert_eq!(
        members[0]["Status"]["leader"], chorus["leader"],
        "{members}"
    );
    let hash = through_chorus.run(&["endpoint", "hashkv", "-w", "json"], "");
    assert_eq!(hash.code, Some(0), "{hash:?}");
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
