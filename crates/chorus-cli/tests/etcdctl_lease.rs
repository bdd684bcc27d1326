//! etcd's leases through the real binary with Debian's etcdctl (3.4):
//! `chorus serve` started as the README says, with `--etcd-listen` on a
//! free port, and etcdctl's lease commands, then the client-side recipes
//! built on leases (`etcdctl lock`, `etcdctl elect`) with two contenders,
//! one SIGKILLed so its lease is left to expire, and a watch seeing an
//! expiry. Without etcdctl the tests skip, except under CI, where they fail.
//!
//! Timing bounds are generous (the machine is loaded) but have both ends:
//! nothing expires while kept alive, and an abandoned lease expires within
//! its remaining TTL plus a margin, not before.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

use support::etcdctl::{Background, Etcdctl, launch_with_etcdctl, serve_with_etcdctl};
use support::server::Server;

/// How late past its deadline an abandoned lease may expire (the primary
/// looks twice a second, then appends the revoke; the client then sees it).
const EXPIRY_MARGIN: Duration = Duration::from_secs(2);
/// How long a waiting contender may take past its rival's expiry to
/// notice (a watch event, then its own read) on a loaded machine.
const TAKEOVER_MARGIN: Duration = Duration::from_secs(5);
/// How long a background etcdctl may take to print its first line.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The session TTL of `etcdctl elect` in 3.4, which has no `--ttl` flag
/// (the client library's default session TTL).
const ELECT_SESSION_TTL: Duration = Duration::from_secs(60);

/// The id in `lease <16 hex digits> granted with TTL(<ttl>s)`.
fn granted_id(stdout: &str, ttl: u64) -> String {
    let id = stdout
        .strip_prefix("lease ")
        .and_then(|rest| rest.strip_suffix(&format!(" granted with TTL({ttl}s)")))
        .unwrap_or_else(|| panic!("not a grant of TTL {ttl}: {stdout:?}"));
    assert!(
        id.len() == 16 && id.chars().all(|c| c.is_ascii_hexdigit()),
        "{stdout:?}"
    );
    id.to_owned()
}

/// Grants a lease of `ttl` seconds and returns its id as etcdctl prints it.
fn grant(etcdctl: &Etcdctl, ttl: u64) -> String {
    granted_id(&etcdctl.run_ok(&["lease", "grant", &ttl.to_string()]), ttl)
}

/// `lease timetolive <id> --keys`: the granted TTL, the remaining TTL and
/// the attached keys.
fn time_to_live(etcdctl: &Etcdctl, id: &str) -> (u64, u64, String) {
    let stdout = etcdctl.run_ok(&["lease", "timetolive", id, "--keys"]);
    let parse = || {
        let rest = stdout.strip_prefix(&format!("lease {id} granted with TTL("))?;
        let (granted, rest) = rest.split_once("s), remaining(")?;
        let (remaining, rest) = rest.split_once("s), attached keys(")?;
        let keys = rest.strip_suffix(')')?;
        Some((
            granted.parse().ok()?,
            remaining.parse().ok()?,
            keys.to_owned(),
        ))
    };
    parse().unwrap_or_else(|| panic!("not a live lease {id}: {stdout:?}"))
}

/// The id the server chooses after `id` when nothing else was written
/// in between (ids follow the log's records).
fn next_id(id: &str) -> String {
    let id = i64::from_str_radix(id, 16).expect("a hex id");
    format!("{:016x}", id + 1)
}

/// The value of `key`, if it exists.
fn get(etcdctl: &Etcdctl, key: &str) -> Option<String> {
    let stdout = etcdctl.run_ok(&["get", key, "--print-value-only"]);
    (!stdout.is_empty()).then_some(stdout)
}

/// Polls until `key` is gone; returns the instant the read that saw it
/// gone was sent. Panics after `timeout`.
fn wait_deleted(etcdctl: &Etcdctl, key: &str, timeout: Duration) -> Instant {
    let deadline = Instant::now() + timeout;
    loop {
        let sent = Instant::now();
        if get(etcdctl, key).is_none() {
            return sent;
        }
        assert!(
            Instant::now() < deadline,
            "{key} still there after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The lease id (16 hex digits, as `lease` commands take it) of a lock or
/// election key `<name>/<lease id in hex>` written by etcdctl's recipes.
fn lease_of_key(key: &str) -> String {
    let hex = key.rsplit_once('/').map(|(_, hex)| hex).unwrap_or_default();
    let id = i64::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("no lease in key {key:?}"));
    format!("{id:016x}")
}

/// After SIGKILLing the etcdctl holding lease `id`, how long the lease has
/// left at most and at least, from now: timetolive rounds down to whole
/// seconds. The process being dead, nothing renews it any more.
fn remaining_after_kill(etcdctl: &Etcdctl, id: &str) -> (Instant, Duration, Duration) {
    let asked = Instant::now();
    let (_, remaining, _) = time_to_live(etcdctl, id);
    assert!(remaining > 0, "lease {id} expired while its holder lived");
    let at_least = Duration::from_secs(remaining);
    (asked, at_least, at_least + Duration::from_secs(1))
}

/// Grant, put with the lease, timetolive with keys, list, keep-alive once,
/// revoke; etcd's wording for an unknown lease and a too long TTL.
#[test]
fn etcdctl_lease_commands() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_chorus, etcdctl)) = serve_with_etcdctl(dir.path()) else {
        return;
    };
    let granted_at = Instant::now();
    let id = grant(&etcdctl, 30);
    assert_eq!(
        etcdctl.run_ok(&["put", &format!("--lease={id}"), "k", "v"]),
        "OK"
    );
    let (granted, remaining, keys) = time_to_live(&etcdctl, &id);
    let elapsed = granted_at.elapsed().as_secs();
    assert_eq!((granted, keys.as_str()), (30, "[k]"));
    assert!(
        remaining <= 30 && remaining + elapsed >= 28,
        "remaining {remaining}s, {elapsed}s after the grant"
    );
    let listed = etcdctl.run_ok(&["lease", "list"]);
    assert!(
        listed.starts_with("found 1 leases\n") && listed.lines().any(|line| line == id),
        "{listed:?}"
    );
    assert_eq!(
        etcdctl.run_ok(&["lease", "keep-alive", "--once", &id]),
        format!("lease {id} keepalived with TTL(30)")
    );
    assert_eq!(
        etcdctl.run_ok(&["lease", "revoke", &id]),
        format!("lease {id} revoked")
    );
    assert_eq!(
        get(&etcdctl, "k"),
        None,
        "a revoke deletes the lease's keys"
    );
    for unknown in [id.as_str(), "1234"] {
        assert_eq!(
            etcdctl.run_ok(&["lease", "timetolive", unknown]),
            format!("lease {unknown:0>16} already expired")
        );
    }
    assert_eq!(etcdctl.run_ok(&["lease", "list"]), "found 0 leases");
    // Shorter than the minimum: raised to it, as etcd does.
    let short = grant(&etcdctl, 2);
    assert_eq!(
        etcdctl.run_ok(&["lease", "grant", "1"]),
        format!("lease {} granted with TTL(2s)", next_id(&short))
    );
    let too_long = etcdctl.run(&["lease", "grant", "9000000001"], "");
    assert_eq!(too_long.code, Some(1), "{too_long:?}");
    assert_eq!(
        too_long.messages,
        ["Error: failed to grant lease (etcdserver: too large lease TTL)"]
    );
}

/// `lease keep-alive` in the background keeps a 3 s lease alive well past
/// its TTL; once it is killed the lease expires and its key goes.
#[test]
fn etcdctl_keep_alive_holds_a_lease_until_killed() {
    const TTL: Duration = Duration::from_secs(3);
    let dir = tempfile::tempdir().unwrap();
    let Some((_chorus, etcdctl)) = serve_with_etcdctl(dir.path()) else {
        return;
    };
    let id = grant(&etcdctl, TTL.as_secs());
    etcdctl.run_ok(&["put", &format!("--lease={id}"), "short", "lived"]);
    let mut keeper = etcdctl.spawn("keep-alive", &["lease", "keep-alive", &id]);
    let renewed = format!("lease {id} keepalived with TTL(3)");
    keeper.wait_for_line(START_TIMEOUT, |line| line == renewed);
    std::thread::sleep(TTL * 8 / 3);
    assert_eq!(get(&etcdctl, "short").as_deref(), Some("lived"));
    let renewals = keeper.stdout();
    assert!(
        renewals.len() >= 4 && renewals.iter().all(|(_, line)| *line == renewed),
        "{}",
        keeper.printed()
    );
    keeper.kill();
    let (asked, _, at_most) = remaining_after_kill(&etcdctl, &id);
    let gone = wait_deleted(&etcdctl, "short", at_most + EXPIRY_MARGIN + TAKEOVER_MARGIN);
    assert!(
        gone <= asked + at_most + EXPIRY_MARGIN,
        "expired {:?} after the kill, TTL {TTL:?}",
        gone - asked
    );
    assert_eq!(
        etcdctl.run_ok(&["lease", "timetolive", &id]),
        format!("lease {id} already expired")
    );
}

/// The first line of `etcdctl lock` (the lock's key) or `etcdctl elect`
/// (the leader's key).
fn key_line(name: &str) -> impl Fn(&str) -> bool + '_ {
    move |line: &str| line.starts_with(&format!("{name}/"))
}

/// Asserts `waiter` printed nothing yet: it is blocked behind the holder.
fn assert_waiting(waiter: &Background) {
    assert!(waiter.stdout().is_empty(), "{}", waiter.printed());
}

/// Kills `holder` (SIGKILL: its lease is left to expire), then checks
/// `waiter` takes over once the lease expired: not before, and within the
/// margins after. Returns the waiter's key.
fn kill_and_take_over(
    etcdctl: &Etcdctl,
    holder: &mut Background,
    held: &str,
    waiter: &Background,
    name: &str,
) -> String {
    let lease = lease_of_key(held);
    let killed = holder.kill();
    let (asked, at_least, at_most) = remaining_after_kill(etcdctl, &lease);
    let deadline = at_most + EXPIRY_MARGIN + TAKEOVER_MARGIN;
    let (took_over, key) = waiter.wait_for_line(deadline, key_line(name));
    assert!(took_over > killed, "took over before the holder was killed");
    assert!(
        took_over + Duration::from_millis(500) >= asked + at_least,
        "took over {:?} after the kill, the holder's lease had {at_least:?} left",
        took_over - killed
    );
    assert!(
        took_over <= asked + deadline,
        "took over {:?} after the kill",
        took_over - killed
    );
    assert_ne!(key, held);
    key
}

/// `etcdctl lock` with two contenders: the second blocks until the first,
/// SIGKILLed, has its lease expire.
#[test]
fn etcdctl_lock_passes_when_the_holder_dies() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_chorus, etcdctl)) = serve_with_etcdctl(dir.path()) else {
        return;
    };
    lock_passes_when_the_holder_dies(&etcdctl, &etcdctl);
}

/// The same with the contenders on two nodes: the holder through the
/// standby (which forwards its lease and txn RPCs to the primary and
/// serves its watch), the waiter through the primary.
#[test]
fn etcdctl_lock_passes_between_nodes_when_the_holder_dies() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_a, _b, to_primary, to_standby)) = primary_and_standby(dir.path()) else {
        return;
    };
    lock_passes_when_the_holder_dies(&to_standby, &to_primary);
}

/// `etcdctl lock` through `to_holder`, then through `to_waiter`: the
/// waiter blocks until the holder, SIGKILLed, has its lease expire.
fn lock_passes_when_the_holder_dies(to_holder: &Etcdctl, to_waiter: &Etcdctl) {
    let lock = ["lock", "--ttl=3", "mylock"];
    let mut holder = to_holder.spawn("lock holder", &lock);
    let (_, held) = holder.wait_for_line(START_TIMEOUT, key_line("mylock"));
    let waiter = to_waiter.spawn("lock waiter", &lock);
    // Its key written (a second lease), it waits on the holder's.
    let waiting = Instant::now() + START_TIMEOUT;
    while to_waiter
        .run_ok(&["get", "--prefix", "mylock/", "--keys-only"])
        .lines()
        .filter(|line| !line.is_empty())
        .count()
        < 2
    {
        assert!(Instant::now() < waiting, "{}", waiter.printed());
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    assert_waiting(&waiter);
    kill_and_take_over(to_waiter, &mut holder, &held, &waiter, "mylock");
}

/// `etcdctl elect` with two candidates and an observer (`--listen`): the
/// second becomes leader once the first, SIGKILLed, has its lease expire
/// (the session TTL of etcdctl 3.4's elect, 60 s).
#[test]
fn etcdctl_elect_passes_when_the_leader_dies() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_chorus, etcdctl)) = serve_with_etcdctl(dir.path()) else {
        return;
    };
    let observer = etcdctl.spawn("observer", &["elect", "--listen", "myelection"]);
    let mut leader = etcdctl.spawn("candidate A", &["elect", "myelection", "pA"]);
    let (_, leader_key) = leader.wait_for_line(START_TIMEOUT, key_line("myelection"));
    leader.wait_for_line(START_TIMEOUT, |line| line == "pA");
    observer.wait_for_line(START_TIMEOUT, |line| line == "pA");
    let candidate = etcdctl.spawn("candidate B", &["elect", "myelection", "pB"]);
    std::thread::sleep(Duration::from_secs(3));
    assert_waiting(&candidate);
    let (leader_ttl, _, _) = time_to_live(&etcdctl, &lease_of_key(&leader_key));
    assert_eq!(leader_ttl, ELECT_SESSION_TTL.as_secs());
    kill_and_take_over(&etcdctl, &mut leader, &leader_key, &candidate, "myelection");
    candidate.wait_for_line(START_TIMEOUT, |line| line == "pB");
    observer.wait_for_line(START_TIMEOUT, |line| line == "pB");
    let observed: Vec<String> = observer
        .stdout()
        .into_iter()
        .map(|(_, line)| line)
        .collect();
    assert_eq!(observed[1], "pA", "{observed:?}");
    assert_eq!(observed[3], "pB", "{observed:?}");
}

/// A watch over a prefix sees an expired lease's keys deleted at one
/// revision, one DELETE event each, in one response; the key without the
/// lease stays.
#[test]
fn etcdctl_watch_sees_an_expiry_as_deletes_at_one_revision() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_chorus, etcdctl)) = serve_with_etcdctl(dir.path()) else {
        return;
    };
    let id = grant(&etcdctl, 3);
    for key in ["w/a", "w/b", "w/c"] {
        etcdctl.run_ok(&["put", &format!("--lease={id}"), key, "v"]);
    }
    let put = etcdctl.run_ok(&["put", "w/other", "stays", "-w", "json"]);
    let put: serde_json::Value = serde_json::from_str(&put).expect("JSON");
    let after_puts = put["header"]["revision"].as_u64().expect("a revision") + 1;
    // From the revision after the puts: the expiry cannot be missed.
    let watcher = etcdctl.spawn(
        "watcher",
        &[
            "watch",
            "--prefix",
            "w/",
            "--rev",
            &after_puts.to_string(),
            "-w",
            "json",
        ],
    );
    let (_, response) = watcher.wait_for_line(START_TIMEOUT, |line| line.contains("\"Events\""));
    let response: serde_json::Value = serde_json::from_str(&response).expect("JSON");
    let revision = response["Header"]["revision"].as_u64().expect("a revision");
    let events = response["Events"].as_array().expect("events");
    let deleted: Vec<(String, u64)> = events
        .iter()
        .map(|event| {
            // etcd's `mvccpb.Event_DELETE` is 1; PUT (0) is left out of JSON.
            assert_eq!(event["type"], 1, "{response}");
            let key = event["kv"]["key"].as_str().expect("a key");
            let key = String::from_utf8(BASE64.decode(key).expect("base64")).expect("UTF-8");
            (
                key,
                event["kv"]["mod_revision"].as_u64().expect("a revision"),
            )
        })
        .collect();
    let expected: Vec<(String, u64)> = ["w/a", "w/b", "w/c"]
        .iter()
        .map(|key| (key.to_string(), revision))
        .collect();
    assert_eq!(deleted, expected, "{response}");
    assert!(revision >= after_puts, "{response}");
    assert_eq!(get(&etcdctl, "w/other").as_deref(), Some("stays"));
    assert_eq!(
        etcdctl.run_ok(&["lease", "timetolive", &id]),
        format!("lease {id} already expired")
    );
}

/// `lease timetolive` once it answers: a restarted node serves leases only
/// once it is primary again.
fn time_to_live_when_served(etcdctl: &Etcdctl, id: &str) -> (u64, u64, String) {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let outcome = etcdctl.run(&["lease", "timetolive", id, "--keys"], "");
        if outcome.code == Some(0) {
            return time_to_live(etcdctl, id);
        }
        assert!(Instant::now() < deadline, "{outcome:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A lease outlives a SIGKILLed `chorus serve`: restarted on the same
/// stores, the new primary starts its deadline afresh (a takeover extends
/// leases by their TTL, as etcd's leader change does), keeps its key past
/// the deadline it had before, and then expires it on its own.
#[test]
fn etcdctl_leases_survive_a_restart_extended_by_their_ttl() {
    const TTL: u64 = 12;
    let dir = tempfile::tempdir().unwrap();
    let Some((launch, etcdctl)) = launch_with_etcdctl(dir.path()) else {
        return;
    };
    let mut chorus = launch.start("chorus");
    etcdctl.wait_healthy();
    let granted_at = Instant::now();
    let id = grant(&etcdctl, TTL);
    etcdctl.run_ok(&["put", &format!("--lease={id}"), "survivor", "v"]);
    std::thread::sleep(Duration::from_secs(4));
    chorus.kill();
    let restarted_at = Instant::now();
    let _chorus = launch.start("chorus restarted");
    let (granted, remaining, keys) = time_to_live_when_served(&etcdctl, &id);
    assert_eq!((granted, keys.as_str()), (TTL, "[survivor]"));
    let since_restart = restarted_at.elapsed().as_secs();
    assert!(
        remaining + since_restart + 1 >= TTL,
        "remaining {remaining}s, {since_restart}s after the restart: not extended by its TTL"
    );
    // Past the deadline the first primary had set, the key is still there.
    let first_deadline = granted_at + Duration::from_secs(TTL) + EXPIRY_MARGIN;
    std::thread::sleep(first_deadline.saturating_duration_since(Instant::now()));
    assert_eq!(get(&etcdctl, "survivor").as_deref(), Some("v"));
    let (_, _, at_most) = remaining_after_kill(&etcdctl, &id);
    wait_deleted(
        &etcdctl,
        "survivor",
        at_most + EXPIRY_MARGIN + TAKEOVER_MARGIN,
    );
    assert_eq!(
        etcdctl.run_ok(&["lease", "timetolive", &id]),
        format!("lease {id} already expired")
    );
}

/// The writer lease of the failover test's instances, in seconds (a
/// takeover after a SIGKILL takes about this plus a second).
const FAILOVER_WRITER_TTL_SECS: &str = "3";

/// Two `chorus serve` on the same stores in `dir` (each with its own etcd
/// address, a short writer lease): `a` primary, then `b` its standby, and
/// etcdctl aimed at each; `None` when there is no etcdctl outside CI.
fn primary_and_standby(dir: &Path) -> Option<(Server, Server, Etcdctl, Etcdctl)> {
    let (launch_a, to_a) = launch_with_etcdctl(dir)?;
    let (launch_b, to_b) = launch_with_etcdctl(dir)?;
    let writer_ttl = ["--lease-ttl-secs", FAILOVER_WRITER_TTL_SECS];
    let a = launch_a.args(writer_ttl).start("a");
    a.wait_for_role("primary");
    let b = launch_b.args(writer_ttl).start("b");
    b.wait_for_role("standby");
    to_a.wait_healthy();
    to_b.wait_healthy();
    Some((a, b, to_a, to_b))
}

/// A `lease keep-alive` given both nodes' endpoints keeps its lease alive
/// across a failover: the primary SIGKILLed, the standby takes over (until
/// then it has no primary to forward keep-alives to and answers
/// `Unavailable`, which the client retries), the client's keep-alives reach
/// it, and the key is still there a whole TTL later; once the keeper is
/// killed, the new primary expires the lease.
#[test]
fn etcdctl_keep_alive_holds_a_lease_across_a_failover() {
    const TTL: Duration = Duration::from_secs(10);
    let dir = tempfile::tempdir().unwrap();
    let Some((mut a, b, to_a, to_b)) = primary_and_standby(dir.path()) else {
        return;
    };
    let to_both = Etcdctl {
        binary: to_a.binary.clone(),
        endpoint: format!("{},{}", to_a.endpoint, to_b.endpoint),
    };
    let id = grant(&to_a, TTL.as_secs());
    to_a.run_ok(&["put", &format!("--lease={id}"), "held", "v"]);
    let mut keeper = to_both.spawn("keep-alive", &["lease", "keep-alive", &id]);
    let renewed = format!("lease {id} keepalived with TTL({})", TTL.as_secs());
    keeper.wait_for_line(START_TIMEOUT, |line| line == renewed);
    a.kill();
    b.wait_for_role("primary");
    let took_over = Instant::now();
    // Renewed by the new primary: a keep-alive answered after the takeover.
    let renewals = keeper.stdout().len();
    let deadline = took_over + START_TIMEOUT;
    while keeper.stdout().len() <= renewals + 1 {
        assert!(Instant::now() < deadline, "{}", keeper.printed());
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep((took_over + TTL + EXPIRY_MARGIN).saturating_duration_since(Instant::now()));
    assert_eq!(
        get(&to_b, "held").as_deref(),
        Some("v"),
        "{}",
        keeper.printed()
    );
    assert!(
        keeper.stdout().iter().all(|(_, line)| *line == renewed),
        "{}",
        keeper.printed()
    );
    keeper.kill();
    let (asked, _, at_most) = remaining_after_kill(&to_b, &id);
    let gone = wait_deleted(&to_b, "held", at_most + EXPIRY_MARGIN + TAKEOVER_MARGIN);
    assert!(
        gone <= asked + at_most + EXPIRY_MARGIN,
        "expired {:?} after the kill",
        gone - asked
    );
}
