//! `chorus serve` against clients that ask for a large answer and never read
//! it, through the real binary and raw sockets: an answer that makes no
//! progress for `--send-timeout-secs` is dropped with its connection, and
//! the permits and stream places it held go back to other clients.

mod support;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use reqwest::Method;
use support::raw::never_reading;
use support::server::{Endpoint, Launch, Server};
use tempfile::TempDir;

/// The send timeout the servers here run with.
const SEND_TIMEOUT_SECS: u64 = 3;
/// How much later than the send timeout a normal client may be answered on
/// a loaded machine (rendering pages, opening connections).
const MARGIN: Duration = Duration::from_secs(25);
/// Values written, each rendered as a JSON string of about this many bytes:
/// 24 MiB in all, far more than the socket buffers between a server and a
/// client that never reads.
const VALUES: usize = 32;
const VALUE_BYTES: usize = 768 << 10;

fn started(dir: &TempDir, args: &[&str]) -> Server {
    let server = Launch::new(dir.path())
        .args(["--data-dir", "data"])
        .args(["--send-timeout-secs", &SEND_TIMEOUT_SECS.to_string()])
        .args(args)
        .start("server");
    server.wait_for_role("primary");
    server
}

fn write_values(endpoint: &Endpoint) {
    let value = "v".repeat(VALUE_BYTES);
    for number in 0..VALUES {
        endpoint.put_ok(&format!("big/{number:02}"), &value);
    }
}

fn get_request(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n")
}

/// Four clients that never read hold every page permit (the default is 4)
/// until the send timeout, two more wait behind them; a normal client's
/// page is answered soon after the send timeout, not after the request
/// timeout (before, it waited for a permit until the request timeout and
/// was answered 503, however long that was).
#[test]
fn clients_that_never_read_do_not_keep_a_normal_client_from_its_log_page() {
    let dir = TempDir::new().unwrap();
    let server = started(&dir, &["--request-timeout-secs", "120"]);
    let endpoint = server.endpoint();
    write_values(&endpoint);
    let stalled: Vec<TcpStream> = (0..6)
        .map(|_| never_reading(&endpoint.url, &get_request("/v1/log?from=0&limit=10000")))
        .collect();
    // Let them take the permits and fill the buffers.
    std::thread::sleep(Duration::from_secs(1));
    let asked = Instant::now();
    let page = endpoint.send(endpoint.request(Method::GET, "/v1/log?from=0&limit=1"));
    let waited = asked.elapsed();
    assert_eq!(page.status, 200, "{}", page.text());
    assert_eq!(page.json()["next"], 1);
    assert!(
        waited < Duration::from_secs(SEND_TIMEOUT_SECS) + MARGIN,
        "the page waited {waited:?}"
    );
    eprintln!("a normal page waited {waited:?} behind clients that never read");
    drop(stalled);
}

/// A watch whose client never reads is closed after the send timeout and
/// frees its stream place: with every place taken by such watches, a new
/// watch is refused at first and opens soon after the send timeout (before,
/// the places stayed taken while the clients stayed connected).
#[test]
fn a_stalled_watch_stream_is_closed_and_frees_its_place() {
    let dir = TempDir::new().unwrap();
    let server = started(&dir, &["--max-streams", "2"]);
    let endpoint = server.endpoint();
    write_values(&endpoint);
    let stalled: Vec<TcpStream> = (0..2)
        .map(|_| never_reading(&endpoint.url, &get_request("/v1/kv/watch?from=0")))
        .collect();
    // Let them take their places (a probe that opens before would hold a
    // place itself until the server next writes to it).
    std::thread::sleep(Duration::from_secs(2));
    let began = Instant::now();
    let mut refused = false;
    let opened = loop {
        let response = endpoint
            .request(Method::GET, "/v1/kv/watch")
            .send()
            .expect("an answer");
        match response.status().as_u16() {
            503 => refused = true,
            200 if refused => break began.elapsed(),
            200 => panic!("the stalled watches took no place within 2 s"),
            other => panic!("a watch was answered {other}"),
        }
        assert!(
            began.elapsed() < Duration::from_secs(SEND_TIMEOUT_SECS) + MARGIN,
            "no place freed after {:?} (refused before: {refused})",
            began.elapsed()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("a watch opened {opened:?} after two stalled watches took every place");
    drop(stalled);
}
