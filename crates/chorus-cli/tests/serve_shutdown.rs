//! A graceful stop of `chorus serve` behind a stalled snapshot store, through
//! the real binary: the snapshot store (which also holds the lease) is the
//! small test S3 server, told to hold every snapshot payload upload without
//! answering while lease and HEAD requests are still served.
//!
//! Regression: SIGTERM awaited the upload in flight (up to
//! `--snapshot-payload-timeout-secs`) before it released the lease, so the
//! standby waited behind a hung store for as long.

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use support::server::{Launch, ROLE_TIMEOUT};
use support::test_s3::{Faults, StallSwitch, TestS3};

/// The lease ttl (the smallest `serve` takes is 2).
const TTL_SECS: u64 = 3;
/// The HTTP drain bound at shutdown.
const GRACE_SECS: u64 = 1;
/// Far above the time the test allows: an upload that holds the stop up
/// shows as a standby that cannot write for this long.
const PAYLOAD_TIMEOUT_SECS: u64 = 600;
/// Slack for a loaded machine on top of grace + ttl: the standby's lease
/// check, its boot and one write.
const SLACK: Duration = Duration::from_secs(20);
/// Records per snapshot: the test's writes make one due.
const SNAPSHOT_EVERY_RECORDS: u64 = 5;

#[test]
fn sigterm_during_a_stalled_snapshot_upload_releases_the_lease_for_the_standby() {
    let switch = Arc::new(StallSwitch::default());
    let s3 = TestS3::start(Faults {
        stall_puts_containing: Some("/snapshots/".into()),
        stall_switch: Some(Arc::clone(&switch)),
        ..Faults::default()
    });
    let dir = TempDir::new().unwrap();
    // The test server ignores credentials, but the S3 client wants some.
    std::fs::write(
        dir.path().join("chorus.toml"),
        "[s3]\naccess_key_id = \"test\"\nsecret_access_key = \"test\"\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    let launch = Launch::new(dir.path()).args([
        "--data-dir".to_owned(),
        data.display().to_string(),
        "--snapshot-store".to_owned(),
        s3.url("stalled"),
        "--lease-ttl-secs".to_owned(),
        TTL_SECS.to_string(),
        "--shutdown-grace-secs".to_owned(),
        GRACE_SECS.to_string(),
        "--snapshot-every-records".to_owned(),
        SNAPSHOT_EVERY_RECORDS.to_string(),
        "--snapshot-min-log-percent".to_owned(),
        "0".to_owned(),
        "--snapshot-payload-timeout-secs".to_owned(),
        PAYLOAD_TIMEOUT_SECS.to_string(),
    ]);
    let mut primary = launch.start("primary");
    primary.wait_for_role("primary");
    let standby = launch.start("standby");
    standby.wait_for_role("standby");

    switch.armed.store(true, Ordering::SeqCst);
    for sequence in 0..SNAPSHOT_EVERY_RECORDS {
        primary.put_ok(&format!("key-{sequence}"), "v");
    }
    let deadline = Instant::now() + ROLE_TIMEOUT;
    while switch.held.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "no snapshot upload started\n{}",
            primary.stderr_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let stopping = Instant::now();
    primary.signal("TERM");
    let bound = Duration::from_secs(GRACE_SECS + TTL_SECS) + SLACK;
    loop {
        let reply = standby.try_send(standby.put_request("after", "takeover"));
        if reply.as_ref().is_ok_and(|reply| reply.status == 200) {
            break;
        }
        assert!(
            stopping.elapsed() < bound,
            "the standby could not write within {bound:?} of the SIGTERM\nprimary:\n{}\nstandby:\n{}",
            primary.stderr_tail(),
            standby.stderr_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "the standby wrote {:?} after the SIGTERM",
        stopping.elapsed()
    );
    let exit = primary.wait_exit(ROLE_TIMEOUT);
    assert!(exit.success(), "SIGTERM: {exit}\n{}", primary.stderr_tail());
    let said = primary.stderr_tail();
    assert!(
        said.contains("shutdown abandons the snapshot upload in flight"),
        "the log says why no final snapshot was published:\n{said}"
    );
    let value = standby.get("key-4");
    assert_eq!(value.status, 200, "{}", value.text());
}
