//! `chorus serve`'s memory under large values and many streams, through the
//! real binary: with values of about 1 MiB, fifty watchers and 256 `follow`
//! readers that stop reading, and several clients paging through the whole
//! log and the whole key list at once, the process's resident set stays
//! within a bound derived from the documented budgets;
//! and the stream cap refuses one stream too many with 503 and
//! `Retry-After`, while other requests are still served.
//!
//! The resident set is sampled from `/proc/<pid>/status` (`VmRSS` while the
//! stress runs, `VmHWM` for the peak the samples could miss). A sampler that
//! sees the bound crossed kills the server at once, so a regression fails
//! the test quickly instead of exhausting the machine.

mod support;

use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::Value;
use support::server::{Endpoint, Launch, Server};
use tempfile::TempDir;

const MIB: u64 = 1 << 20;
/// Bytes of each value: under the log's default `max_record_bytes` (1 MiB)
/// with room for the command's framing and key.
const VALUE_BYTES: usize = (MIB - 4096) as usize;
/// Values written: over 64 MiB, so the first segment is sealed and the
/// pages read a sealed segment as well as the active one.
const VALUES: usize = 100;
/// Clients writing at once.
const WRITERS: usize = 4;
/// Watchers of every key from the oldest index the history holds, which
/// read one event and then stop reading.
const WATCHERS: usize = 50;
/// `follow` readers from index 0, which never read: each would hold a
/// sealed segment (64 MiB) if nothing bounded their readers by bytes.
const FOLLOWERS: usize = 256;
/// Clients walking the key list with `GET /v1/kv?limit=1000` at once; more
/// than the service's default list permits (4), so some wait for one.
const LIST_CLIENTS: usize = 8;
/// Streams the server is started to allow: every watcher and follower.
const MAX_STREAMS: usize = 512;
/// The send timeout the server runs with: shorter than the default, so
/// that followers that never read give their reader slots to others during
/// the test, yet long enough for the page clients on a loaded machine.
const SEND_TIMEOUT_SECS: u64 = 20;
/// Clients walking the log with `GET /v1/log?limit=10000` at once; more than
/// the service's default page permits (4), so some wait for one.
const PAGE_CLIENTS: usize = 5;
/// Walks of the whole log per page client.
const WALKS: usize = 1;
/// Interval between two samples of the resident set.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(5);

// The budgets this test holds the service to, from docs/operations.md
// ("Limits"); the bound below is built from them.
/// Concurrent `GET /v1/log` pages (`--max-log-pages`, default).
const LOG_PAGES: u64 = 4;
/// Rendered bytes of one page (`--log-page-bytes`, default), which may
/// exceed it by one record.
const LOG_PAGE_BYTES: u64 = 16 * MIB;
/// Concurrent `GET /v1/kv` pages (`--max-list-pages`, default).
const LIST_PAGES: u64 = 4;
/// Rendered bytes of one list page (`--list-page-bytes`, default), which
/// may exceed it by one item.
const LIST_PAGE_BYTES: u64 = 16 * MIB;
/// `follow` readers holding records at once: `--follow-buffer-bytes`
/// (default 512 MiB) over the segment size.
const FOLLOW_READERS: u64 = 8;
/// Record bytes of one watcher's batch, which may exceed it by one record.
const WATCH_BATCH_BYTES: u64 = MIB / 4;
/// Record bytes of the watch history (`--history-bytes`, default).
const HISTORY_BYTES: u64 = 64 * MIB;
/// Largest record (the log's `max_record_bytes`).
const RECORD_BYTES: u64 = MIB;
/// What one log reader holds: one sealed segment (`max_segment_bytes`).
const READER_BYTES: u64 = 64 * MIB;
/// Base64 in JSON: 4 bytes per 3, rounded up.
const RENDER_NUMERATOR: u64 = 4;
const RENDER_DENOMINATOR: u64 = 3;
/// Everything else: allocator slack, hyper's buffers, the clients' threads
/// on the server side. Generous, so a loaded machine does not flake.
const SLACK_BYTES: u64 = 192 * MIB;

/// The most the stress may add to the resident set after the writes.
fn stress_bound_bytes() -> u64 {
    let rendered = |bytes: u64| bytes * RENDER_NUMERATOR / RENDER_DENOMINATOR;
    // A page is rendered once into its body (which may double while it
    // grows), beside its reader's buffer.
    let page = READER_BYTES + 2 * rendered(LOG_PAGE_BYTES + RECORD_BYTES);
    let list_page = 2 * rendered(LIST_PAGE_BYTES + RECORD_BYTES);
    let watcher = rendered(WATCH_BATCH_BYTES + RECORD_BYTES);
    // Any follower may hold an event being rendered and one being sent;
    // only those with a reader slot hold their reader's buffer.
    let followers = FOLLOW_READERS * READER_BYTES + FOLLOWERS as u64 * 2 * rendered(RECORD_BYTES);
    LOG_PAGES * page + LIST_PAGES * list_page + WATCHERS as u64 * watcher + followers + SLACK_BYTES
}

/// `VmRSS` and `VmHWM` of process `pid` in bytes, or `None` once it exited.
fn memory(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|line| line.starts_with(name))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// A value of `VALUE_BYTES` that is not UTF-8, so it renders as base64.
fn value(seed: usize) -> Vec<u8> {
    let mut value = vec![0xffu8; VALUE_BYTES];
    for (offset, byte) in value.iter_mut().enumerate().step_by(4096) {
        *byte = (seed + offset / 4096) as u8;
    }
    value
}

fn write_values(endpoint: &Endpoint) {
    std::thread::scope(|scope| {
        for writer in 0..WRITERS {
            scope.spawn(move || {
                for number in (writer..VALUES).step_by(WRITERS) {
                    let request = endpoint
                        .request(Method::PUT, &format!("/v1/kv/big/{number:03}"))
                        .body(value(number));
                    endpoint.send(request).expect_index("put a large value");
                }
            });
        }
    });
}

/// An open event stream after its first event, kept open and unread.
struct Stream {
    _reader: BufReader<reqwest::blocking::Response>,
}

/// Opens `path` as an event stream and reads one event; `Err` with the
/// answer's status, `Retry-After` and body when it is refused (status 0: no
/// answer, the server was killed).
fn open_stream(endpoint: &Endpoint, path: &str) -> Result<Stream, (u16, Option<String>, String)> {
    let response = match endpoint.request(Method::GET, path).send() {
        Ok(response) => response,
        Err(error) => return Err((0, None, error.to_string())),
    };
    let status = response.status().as_u16();
    if status != 200 {
        let retry = response
            .headers()
            .get("retry-after")
            .map(|value| value.to_str().unwrap().to_owned());
        return Err((status, retry, response.text().unwrap_or_default()));
    }
    let mut reader = BufReader::new(response);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => return Err((0, None, "the stream ended before its first event".into())),
            Ok(_) => {}
            Err(error) => return Err((0, None, error.to_string())),
        }
        if line.starts_with("data:") {
            return Ok(Stream { _reader: reader });
        }
    }
}

/// Opens a `follow` stream from index 0 and keeps it without reading a
/// byte of its body; `Err` as for [`open_stream`].
fn open_follower(endpoint: &Endpoint) -> Result<Stream, (u16, Option<String>, String)> {
    let path = "/v1/log?from=0&follow=true";
    let response = match endpoint.request(Method::GET, path).send() {
        Ok(response) => response,
        Err(error) => return Err((0, None, error.to_string())),
    };
    match response.status().as_u16() {
        200 => Ok(Stream {
            _reader: BufReader::new(response),
        }),
        status => Err((status, None, response.text().unwrap_or_default())),
    }
}

/// A `GET /v1/kv` page, its items skipped.
#[derive(serde::Deserialize)]
struct ListPage {
    items: Vec<serde::de::IgnoredAny>,
    next: Option<String>,
}

/// Walks every key under `big/` with the largest pages; returns the items
/// seen, or `None` once the server was stopped.
fn walk_list(endpoint: &Endpoint, stopped: &AtomicBool) -> Option<u64> {
    let mut seen = 0;
    let mut after = String::new();
    loop {
        let path = format!("/v1/kv?prefix=big/&limit=1000{after}");
        let reply = match endpoint.try_send(endpoint.request(Method::GET, &path)) {
            Ok(reply) => reply,
            Err(_) if stopped.load(Ordering::SeqCst) => return None,
            Err(error) => panic!("a list page failed: {error:?}"),
        };
        if reply.status == 503 {
            // Waited for a list permit past the request timeout.
            continue;
        }
        assert_eq!(reply.status, 200, "list page: {}", reply.text());
        let page: ListPage = serde_json::from_slice(&reply.body).expect("a list page");
        seen += page.items.len() as u64;
        match page.next {
            Some(next) => after = format!("&after={next}"),
            None => return Some(seen),
        }
    }
}

/// A `GET /v1/log` page, its records skipped (parsing them would cost the
/// client more time than the server takes to render them).
#[derive(serde::Deserialize)]
struct Page {
    records: Vec<serde::de::IgnoredAny>,
    next: u64,
}

/// Walks the log from index 0 with the largest pages, `WALKS` times;
/// returns the records seen, or `None` once the server was stopped.
fn walk_log(endpoint: &Endpoint, stopped: &AtomicBool) -> Option<u64> {
    let mut seen = 0;
    for _ in 0..WALKS {
        let mut from = 0;
        loop {
            let request =
                endpoint.request(Method::GET, &format!("/v1/log?from={from}&limit=10000"));
            let reply = match endpoint.try_send(request) {
                Ok(reply) => reply,
                Err(_) if stopped.load(Ordering::SeqCst) => return None,
                Err(error) => panic!("a log page failed: {error:?}"),
            };
            if reply.status == 503 {
                // Waited for a page permit past the request timeout.
                continue;
            }
            assert_eq!(reply.status, 200, "log page: {}", reply.text());
            let page: Page = serde_json::from_slice(&reply.body).expect("a log page");
            if page.records.is_empty() {
                break;
            }
            seen += page.records.len() as u64;
            from = page.next;
        }
    }
    Some(seen)
}

/// Sets its flag when dropped.
struct Finish<'a>(&'a AtomicBool);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The oldest index the watch history holds, from the `410 Gone` of a
/// watch from index 0.
fn history_start(endpoint: &Endpoint) -> u64 {
    let reply = endpoint.send(endpoint.request(Method::GET, "/v1/kv/watch?from=0"));
    assert_eq!(reply.status, 410, "{}", reply.text());
    reply.json()["oldest"].as_u64().expect("oldest")
}

/// Samples the server's resident set until `done`; kills the server (by
/// pid) once it crosses `limit`.
fn sample(pid: u32, limit: u64, done: &AtomicBool, stopped: &AtomicBool, peak: &AtomicU64) {
    while !done.load(Ordering::SeqCst) {
        let Some((rss, _)) = memory(pid) else { return };
        peak.fetch_max(rss, Ordering::SeqCst);
        if rss > limit {
            stopped.store(true, Ordering::SeqCst);
            // SAFETY: kill(2) on the pid of the child this test started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            return;
        }
        std::thread::sleep(SAMPLE_INTERVAL);
    }
}

fn started(dir: &TempDir, args: &[&str]) -> Server {
    let server = Launch::new(dir.path())
        .args(["--data-dir", "data"])
        .args(args)
        .start("server");
    server.wait_for_role("primary");
    server
}

#[test]
fn resident_memory_stays_within_the_budgets_under_large_values_streams_pages_and_lists() {
    let dir = TempDir::new().unwrap();
    let max_streams = MAX_STREAMS.to_string();
    let send_timeout = SEND_TIMEOUT_SECS.to_string();
    let mut server = started(
        &dir,
        &[
            "--max-streams",
            &max_streams,
            "--send-timeout-secs",
            &send_timeout,
        ],
    );
    let endpoint = server.endpoint();
    let began = Instant::now();
    write_values(&endpoint);
    let oldest = history_start(&endpoint);
    // The history kept the newest values within its byte budget only.
    assert!(oldest > 0, "the history holds every value");
    assert!((VALUES as u64 - oldest) * VALUE_BYTES as u64 <= HISTORY_BYTES);
    let watch = format!("/v1/kv/watch?from={oldest}");
    let (base, hwm_after_writes) = memory(server.pid()).expect("the server runs");
    let bound = base + stress_bound_bytes();
    let done = AtomicBool::new(false);
    let stopped = AtomicBool::new(false);
    let peak = AtomicU64::new(0);
    let walked = std::thread::scope(|scope| {
        let pid = server.pid();
        let (done, stopped, peak) = (&done, &stopped, &peak);
        scope.spawn(move || sample(pid, bound, done, stopped, peak));
        // Ends the sampler however this thread ends, a panic included.
        let _sampling = Finish(done);
        let mut streams = Vec::new();
        for _ in 0..WATCHERS {
            match open_stream(&endpoint, &watch) {
                Ok(stream) => streams.push(stream),
                Err(_) if stopped.load(Ordering::SeqCst) => break,
                Err(refused) => panic!("a watch was refused: {refused:?}"),
            }
        }
        for _ in 0..FOLLOWERS {
            match open_follower(&endpoint) {
                Ok(stream) => streams.push(stream),
                Err(_) if stopped.load(Ordering::SeqCst) => break,
                Err(refused) => panic!("a follower was refused: {refused:?}"),
            }
        }
        let opened = streams.len();
        let walkers: Vec<_> = (0..PAGE_CLIENTS)
            .map(|_| {
                let endpoint = endpoint.clone();
                scope.spawn(move || walk_log(&endpoint, stopped))
            })
            .collect();
        let listers: Vec<_> = (0..LIST_CLIENTS)
            .map(|_| {
                let endpoint = endpoint.clone();
                scope.spawn(move || walk_list(&endpoint, stopped))
            })
            .collect();
        let walked: Vec<Option<u64>> = walkers.into_iter().map(|w| w.join().unwrap()).collect();
        let listed: Vec<Option<u64>> = listers.into_iter().map(|l| l.join().unwrap()).collect();
        drop(streams);
        (walked, listed, opened)
    });
    let (walked, listed, opened) = walked;
    let peak = peak.load(Ordering::SeqCst);
    let mib = |bytes: u64| bytes / MIB;
    let summary = format!(
        "resident set: {} MiB after the writes (peak {} MiB), peak sampled {} MiB during the \
         stress, bound {} MiB; {opened} streams opened; elapsed {:?}",
        mib(base),
        mib(hwm_after_writes),
        mib(peak),
        mib(bound),
        began.elapsed()
    );
    eprintln!("{summary}");
    assert!(
        !stopped.load(Ordering::SeqCst),
        "the server crossed the bound and was killed: {summary}"
    );
    let (_, hwm) = memory(server.pid()).expect("the server runs");
    eprintln!("VmHWM at the end: {} MiB", mib(hwm));
    assert!(
        hwm <= bound.max(hwm_after_writes),
        "VmHWM {} MiB over the bound: {summary}",
        mib(hwm)
    );
    for records in walked {
        assert_eq!(
            records,
            Some((VALUES * WALKS) as u64),
            "every walk saw every record"
        );
    }
    for items in listed {
        assert_eq!(items, Some(VALUES as u64), "every list saw every key");
    }
    server.terminate(Duration::from_secs(30));
}

#[test]
fn the_stream_cap_refuses_one_stream_too_many_with_503_and_retry_after() {
    const MAX_STREAMS: usize = 3;
    let dir = TempDir::new().unwrap();
    let server = started(&dir, &["--max-streams", &MAX_STREAMS.to_string()]);
    let endpoint = server.endpoint();
    endpoint.put_ok("k", "v");
    let mut streams = Vec::new();
    for path in ["/v1/kv/watch?from=0", "/v1/log?from=0&follow=true"]
        .iter()
        .cycle()
        .take(MAX_STREAMS)
    {
        streams.push(open_stream(&endpoint, path).expect("a stream under the cap opens"));
    }
    for path in ["/v1/kv/watch?from=0", "/v1/log?from=0&follow=true"] {
        let (status, retry, body) = open_stream(&endpoint, path)
            .err()
            .unwrap_or_else(|| panic!("{path}: a stream over the cap was served"));
        assert_eq!(status, 503, "{path}: {body}");
        assert_eq!(retry.as_deref(), Some("1"), "{path}: Retry-After");
        let body: Value = serde_json::from_str(&body).expect("a JSON error");
        assert_eq!(
            body["error"],
            format!("too many streams: max_streams={MAX_STREAMS}"),
            "{path}"
        );
        assert_eq!(body["max_streams"], MAX_STREAMS, "{path}");
    }
    // Requests that are not streams are still served, pages of the log too.
    assert_eq!(endpoint.get("k").status, 200);
    let page = endpoint.send(endpoint.request(Method::GET, "/v1/log?from=0&limit=10"));
    assert_eq!(page.status, 200, "{}", page.text());
    // A closed stream frees its place (the server notices at its next write,
    // so a fresh record is written for the stream to carry).
    drop(streams.pop());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        endpoint.put_ok("k", "again");
        match open_stream(&endpoint, "/v1/kv/watch?from=0") {
            Ok(stream) => {
                streams.push(stream);
                break;
            }
            Err((503, _, _)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(refused) => panic!("the freed place was not reused: {refused:?}"),
        }
    }
}
