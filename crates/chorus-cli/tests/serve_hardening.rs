//! `chorus serve` against hostile and broken clients, through the real
//! binary and raw sockets: slow and silent connections, a stalled watch
//! reader at shutdown, half-closed and pipelined requests, invented
//! methods, requests without `Host`, oversized bodies announced with
//! `Expect: 100-continue`, timeouts, SIGHUP, and malformed keys, headers and
//! queries. Each test is named after what it regresses.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use support::raw::connect_with_small_receive_buffer;
use support::server::{Endpoint, Launch, Server};
use tempfile::TempDir;

/// How long a raw exchange may wait for the server's answer.
const REPLY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a graceful stop may take (drain bound, final snapshot, release)
/// on a loaded 2-core machine.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

fn launch(dir: &TempDir) -> Launch {
    Launch::new(dir.path()).args(["--data-dir", "data"])
}

fn started(launch: &Launch) -> Server {
    let server = launch.start("server");
    server.wait_for_role("primary");
    server
}

fn address(endpoint: &Endpoint) -> SocketAddr {
    endpoint
        .url
        .trim_start_matches("http://")
        .parse()
        .expect("a socket address")
}

fn connect(endpoint: &Endpoint) -> TcpStream {
    let stream = TcpStream::connect(address(endpoint)).expect("connect");
    stream.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
    stream
}

/// Everything the server sends until it closes the connection (or the read
/// times out).
fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut bytes = Vec::new();
    let _ = stream.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Sends `request` as is on a new connection and returns all the server
/// answered before it closed the connection.
fn exchange(endpoint: &Endpoint, request: &str) -> String {
    let mut stream = connect(endpoint);
    stream.write_all(request.as_bytes()).unwrap();
    read_until_closed(&mut stream)
}

/// The status code of a raw answer (0 when there was none).
fn status_of(answer: &str) -> u16 {
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

/// The JSON body of a raw answer.
fn json_of(answer: &str) -> Value {
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {answer:?}"))
}

/// A header of a raw answer (the first of that name).
fn header_of<'a>(answer: &'a str, name: &str) -> Option<&'a str> {
    let head = answer
        .split_once("\r\n\r\n")
        .map_or(answer, |(head, _)| head);
    head.lines().skip(1).find_map(|line| {
        let (found, value) = line.split_once(':')?;
        found.eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// `chorus lease status --json` on the embedded default under `dir/data`.
fn lease_status(dir: &TempDir) -> Value {
    let output = support::chorus_command(dir.path())
        .args(["lease", "status", "--json", "--data-dir", "data"])
        .output()
        .expect("chorus lease status runs");
    assert!(
        output.status.success(),
        "lease status: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("lease status prints JSON")
}

fn assert_stopped_and_released(server: &mut Server, dir: &TempDir, what: &str) {
    let exit = server.wait_exit(EXIT_TIMEOUT);
    assert!(exit.success(), "{what}: {exit}\n{}", server.stderr_tail());
    assert!(
        server
            .stdout()
            .iter()
            .any(|line| line == "chorus serve: stopped"),
        "{what}: {:?}",
        server.stdout()
    );
    let lease = lease_status(dir);
    assert_eq!(lease["lease"]["released"], true, "{what}: {lease}");
}

/// Polls until `done` holds; panics with `what` at `timeout`.
fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "not {what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether the server closed `stream` (a read sees end of file or a reset).
fn closed_by_server(stream: &mut TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let closed = match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(_) => true,
    };
    stream.set_nonblocking(false).unwrap();
    closed
}

// ------------------------------------------------------- connections ----

/// Slowloris: a silent connection, one that stopped mid-header and one that
/// dribbles a header byte every 200 ms are all closed by the server once
/// the header read timeout passes; meanwhile, and after, a normal client is
/// served.
#[test]
fn slow_and_silent_connections_are_closed_after_the_header_read_timeout() {
    let dir = TempDir::new().unwrap();
    let server = started(&launch(&dir).args(["--header-read-timeout-secs", "2"]));
    let endpoint = server.endpoint();
    let mut silent = connect(&endpoint);
    let mut partial = connect(&endpoint);
    partial
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut dribbling = connect(&endpoint);
    let dribble = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let started = Instant::now();
    let mut sent = 0;
    let mut dribbling_closed = false;
    while started.elapsed() < Duration::from_secs(30) && !dribbling_closed {
        if sent < dribble.len() {
            dribbling_closed = dribbling.write_all(&dribble[sent..sent + 1]).is_err();
            sent += 1;
        }
        dribbling_closed = dribbling_closed || closed_by_server(&mut dribbling);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(dribbling_closed, "a dribbling connection stayed open 30 s");
    wait_until(
        "silent and partial connections closed",
        REPLY_TIMEOUT,
        || closed_by_server(&mut silent) && closed_by_server(&mut partial),
    );
    endpoint.put_ok("after", "slowloris");
}

/// 1,000 connections trickling header bytes do not keep a normal client
/// from being served, and the server sheds every one of them within the
/// header read timeout.
#[test]
fn a_normal_client_is_served_while_1000_connections_trickle_headers() {
    let dir = TempDir::new().unwrap();
    let server = started(&launch(&dir).args(["--header-read-timeout-secs", "5"]));
    let endpoint = server.endpoint();
    let mut slow: Vec<TcpStream> = (0..1000).map(|_| connect(&endpoint)).collect();
    for stream in &mut slow {
        stream.write_all(b"PUT /v1/kv/slow HTTP/1.1\r\n").unwrap();
    }
    let trickling = Instant::now();
    let mut open = vec![true; slow.len()];
    let mut served = 0;
    while open.iter().any(|open| *open) {
        assert!(
            trickling.elapsed() < Duration::from_secs(60),
            "{} of 1000 slow connections still open after 60 s",
            open.iter().filter(|open| **open).count()
        );
        for (stream, open) in slow.iter_mut().zip(&mut open) {
            if *open && (stream.write_all(b"X").is_err() || closed_by_server(stream)) {
                *open = false;
            }
        }
        let round = Instant::now();
        endpoint.put_ok(&format!("normal/{served}"), "served");
        assert_eq!(endpoint.get(&format!("normal/{served}")).status, 200);
        assert!(
            round.elapsed() < Duration::from_secs(10),
            "a normal request took {:?} among slow connections",
            round.elapsed()
        );
        served += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(served > 0);
}

/// Under `ulimit -n 256`, 300 idle connections neither starve `/healthz`
/// and writes nor break the lease refresh: the connection cap keeps
/// descriptors for the stores, and idle connections are shed.
#[test]
fn idle_connections_beyond_the_descriptor_limit_do_not_starve_the_stores() {
    let dir = TempDir::new().unwrap();
    let server = started(&launch(&dir).descriptor_limit(256).args([
        "--lease-ttl-secs",
        "3",
        "--header-read-timeout-secs",
        "2",
    ]));
    let endpoint = server.endpoint();
    let idle: Vec<TcpStream> = (0..300).map(|_| connect(&endpoint)).collect();
    // Two lease ttls: refreshes happen while the connections are open.
    let until = Instant::now() + Duration::from_secs(6);
    let mut round = 0;
    while Instant::now() < until {
        let health = endpoint.send(endpoint.request(Method::GET, "/healthz"));
        assert_eq!(health.status, 200, "{}", health.text());
        endpoint.put_ok(&format!("key/{round}"), "value");
        round += 1;
    }
    let status = server.status();
    assert_eq!(status["role"], "primary", "{status}");
    let stderr = server.stderr_tail();
    assert!(!stderr.contains("Too many open files"), "{stderr}");
    assert!(!stderr.contains("taken over"), "{stderr}");
    drop(idle);
}

/// A complete PUT whose client then shuts down its write side is answered
/// (and applied exactly when answered): before, hyper dropped the request on
/// the end of file, and some of those PUTs were applied unseen.
#[test]
fn a_put_followed_by_a_half_close_is_answered() {
    let dir = TempDir::new().unwrap();
    let server = started(&launch(&dir));
    let endpoint = server.endpoint();
    for round in 0..10 {
        let close = if round % 2 == 0 {
            "Connection: close\r\n"
        } else {
            ""
        };
        let body = format!("value {round}");
        let request = format!(
            "PUT /v1/kv/half/{round} HTTP/1.1\r\nHost: x\r\n{close}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut stream = connect(&endpoint);
        stream.write_all(request.as_bytes()).unwrap();
        stream.shutdown(Shutdown::Write).unwrap();
        let answer = read_until_closed(&mut stream);
        assert_eq!(status_of(&answer), 200, "round {round}: {answer:?}");
        let version = json_of(&answer)["revision"].as_u64().expect("a revision");
        let reply = endpoint.get(&format!("half/{round}"));
        assert_eq!(reply.text(), body);
        assert_eq!(reply.etag(), version);
    }
    let batch =
        json!({"operations": [{"op": "put", "key": "half/batch", "value": "b"}]}).to_string();
    let request = format!(
        "POST /v1/kv:batch HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{batch}",
        batch.len()
    );
    let mut stream = connect(&endpoint);
    stream.write_all(request.as_bytes()).unwrap();
    stream.shutdown(Shutdown::Write).unwrap();
    let answer = read_until_closed(&mut stream);
    assert_eq!(status_of(&answer), 200, "batch: {answer:?}");
}

/// Requests pipelined on one connection (all written before any answer is
/// read) are answered in the order sent, each seeing the writes before it.
#[test]
fn pipelined_requests_are_answered_in_order() {
    let dir = TempDir::new().unwrap();
    let server = started(&launch(&dir));
    let endpoint = server.endpoint();
    let put = |value: &str| {
        format!(
            "PUT /v1/kv/piped HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{value}",
            value.len()
        )
    };
    let get = |key: &str| format!("GET /v1/kv/{key} HTTP/1.1\r\nHost: x\r\n\r\n");
    let requests = [
        put("first"),
        get("piped"),
        put("second"),
        get("piped"),
        get("never-written"),
        "GET /v1/kv/piped HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_owned(),
    ]
    .concat();
    let answers = exchange(&endpoint, &requests);
    let statuses: Vec<u16> = answers
        .split("HTTP/1.1 ")
        .skip(1)
        .map(|answer| answer[..3].parse().unwrap())
        .collect();
    assert_eq!(statuses, [200, 200, 200, 200, 404, 200], "{answers}");
    let bodies: Vec<&str> = answers
        .split("HTTP/1.1 ")
        .skip(1)
        .map(|answer| answer.split_once("\r\n\r\n").unwrap().1)
        .collect();
    assert_eq!(
        [bodies[1], bodies[3], bodies[5]],
        ["first", "second", "second"],
        "{answers}"
    );
}

/// A watch followed on its connection by a pipelined request still streams
/// its events: nothing is held back for the request waiting behind the
/// stream (hyper's `pipeline_flush` would hold back every byte for as long
/// as the stream lasts).
#[test]
fn a_watch_followed_by_a_pipelined_request_streams_its_events() {
    let dir = TempDir::new().unwrap();
    let server = started(&launch(&dir));
    let endpoint = server.endpoint();
    endpoint.put_ok("w/before", "1");
    let mut stream = connect(&endpoint);
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
        .write_all(
            b"GET /v1/kv/watch?prefix=w/&from=0 HTTP/1.1\r\nHost: x\r\n\r\n\
              GET /v1/kv/w/before HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .unwrap();
    let mut received = String::new();
    let mut read_until = |needle: &str| {
        let mut buffer = [0u8; 4096];
        while !received.contains(needle) {
            match stream.read(&mut buffer) {
                Ok(read) if read > 0 => {
                    received.push_str(&String::from_utf8_lossy(&buffer[..read]));
                }
                outcome => panic!("no {needle:?} in the stream ({outcome:?}): {received:?}"),
            }
        }
    };
    read_until("\"key\":\"w/before\"");
    endpoint.put_ok("w/after", "2");
    read_until("\"key\":\"w/after\"");
    assert!(received.starts_with("HTTP/1.1 200"), "{received}");
}

// --------------------------------------------------------- shutdown ----

/// A watch client that never reads (its receive window shrinks to zero)
/// does not hold SIGTERM up: the drain is bounded, then the final snapshot
/// is published and the lease released.
#[test]
fn a_stalled_watch_client_does_not_block_sigterm_or_the_lease_release() {
    let dir = TempDir::new().unwrap();
    let mut server = started(&launch(&dir).args(["--shutdown-grace-secs", "2"]));
    let endpoint = server.endpoint();
    let mut watch = connect_with_small_receive_buffer(address(&endpoint));
    watch
        .write_all(b"GET /v1/kv/watch?from=0 HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    // About 24 MB of events: more than the socket buffers hold.
    let value = "v".repeat(768 << 10);
    for index in 0..32 {
        endpoint.put_ok(&format!("big/{index}"), &value);
    }
    let stopping = Instant::now();
    server.signal("TERM");
    assert_stopped_and_released(&mut server, &dir, "SIGTERM with a stalled watcher");
    eprintln!("stopped {:?} after SIGTERM", stopping.elapsed());
    drop(watch);
}

/// SIGHUP (a closed terminal, a supervisor's reload) stops gracefully like
/// SIGTERM: before, it killed the process with the lease held.
#[test]
fn sighup_stops_gracefully_and_releases_the_lease() {
    let dir = TempDir::new().unwrap();
    let mut server = started(&launch(&dir));
    server.put_ok("a", "1");
    server.signal("HUP");
    assert_stopped_and_released(&mut server, &dir, "SIGHUP");
}

// ------------------------------------------------------------ answers ----

/// A request timeout is the documented JSON 503 with `Retry-After`, says
/// whether the write may have committed (here not: its body never
/// arrived), and is counted in `chorus_http_*`.
#[test]
fn a_request_timeout_is_a_json_503_with_retry_after_counted_in_metrics() {
    let dir = TempDir::new().unwrap();
    let server = started(&launch(&dir).args(["--request-timeout-secs", "1"]));
    let endpoint = server.endpoint();
    let mut stream = connect(&endpoint);
    stream
        .write_all(b"PUT /v1/kv/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n1")
        .unwrap();
    let answer = read_until_closed(&mut stream);
    assert_eq!(status_of(&answer), 503, "{answer:?}");
    assert!(header_of(&answer, "retry-after").is_some(), "{answer:?}");
    let body = json_of(&answer);
    assert_eq!(body["may_have_committed"], false, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("timeout"),
        "{body}"
    );
    assert_eq!(
        endpoint.get("slow").status,
        404,
        "the write was not applied"
    );
    let metrics = endpoint
        .send(endpoint.request(Method::GET, "/metrics"))
        .text();
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("chorus_http_requests_total")
                && line.contains("status=\"503\"")
                && line.contains("method=\"PUT\"")),
        "{metrics}"
    );
}

/// Invented methods, sent before any auth, share the label `other`: they
/// no longer create a series each.
#[test]
fn invented_methods_share_one_metric_label() {
    let dir = TempDir::new().unwrap();
    let server = started(&launch(&dir).token("s3cret"));
    let endpoint = server.endpoint();
    for index in 0..20 {
        let answer = exchange(
            &endpoint,
            &format!("INVENTED{index} /v1/kv/a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        );
        assert_ne!(status_of(&answer), 0, "{answer:?}");
    }
    let metrics = endpoint
        .send(endpoint.request(Method::GET, "/metrics"))
        .text();
    assert!(!metrics.contains("INVENTED"), "{metrics}");
    assert!(metrics.contains("method=\"other\""), "{metrics}");
}

/// An HTTP/1.1 request without `Host` is refused (RFC 9112 §3.2), with the
/// documented JSON error.
#[test]
fn a_request_without_host_is_400() {
    let dir = TempDir::new().unwrap();
    let server = started(&launch(&dir));
    let answer = exchange(
        &server.endpoint(),
        "GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status_of(&answer), 400, "{answer:?}");
    assert!(
        json_of(&answer)["error"].as_str().unwrap().contains("host"),
        "{answer}"
    );
}

/// A body announced over the limit with `Expect: 100-continue` is refused at
/// once with 413: the client is not invited to send it.
#[test]
fn an_announced_body_over_the_limit_is_413_without_100_continue() {
    let dir = TempDir::new().unwrap();
    let server = started(&launch(&dir).args(["--max-body-bytes", "1024"]));
    let mut stream = connect(&server.endpoint());
    stream
        .write_all(
            b"PUT /v1/kv/big HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\nExpect: 100-continue\r\n\r\n",
        )
        .unwrap();
    let mut first = [0u8; 12];
    stream.read_exact(&mut first).unwrap();
    assert_eq!(
        &first,
        b"HTTP/1.1 413",
        "{:?}",
        String::from_utf8_lossy(&first)
    );
}

/// Keys, headers and queries the service used to misread: a second
/// `If-Match`, an empty key, the reserved key `watch` spelled with a
/// percent escape, a non-UTF-8 `prefix`, and the bearer scheme in another
/// case.
#[test]
fn malformed_keys_headers_and_queries_are_400() {
    let dir = TempDir::new().unwrap();
    let server = started(&launch(&dir).token("s3cret"));
    let endpoint = server.endpoint();
    let version = endpoint.put_ok("a", "1");
    let planted =
        json!({"operations": [{"op": "put", "key": "\u{FFFD}\u{FFFD}planted", "value": "x"}]});
    endpoint
        .send(
            endpoint
                .request(Method::POST, "/v1/kv:batch")
                .body(planted.to_string()),
        )
        .expect_index("plant");
    let before = endpoint.status()["applied_index"].clone();

    let twice = endpoint.send(
        endpoint
            .put_request("a", "2")
            .header("if-match", format!("\"{version}\""))
            .header("if-match", "\"999\""),
    );
    assert_eq!(twice.status, 400, "two If-Match headers: {}", twice.text());
    twice.json();
    let empty = endpoint.send(endpoint.put_request("", "x"));
    assert_eq!(empty.status, 400, "empty key: {}", empty.text());
    empty.json();
    for method in [Method::PUT, Method::GET, Method::DELETE] {
        let reply = endpoint.send(endpoint.request(method.clone(), "/v1/kv/wat%63h"));
        assert_eq!(reply.status, 400, "{method} wat%63h: {}", reply.text());
        assert!(reply.text().contains("watch"), "{}", reply.text());
    }
    for path in ["/v1/kv?prefix=%FF%FE", "/v1/kv/watch?prefix=%FF%FE"] {
        let reply = endpoint.send(endpoint.request(Method::GET, path));
        assert_eq!(reply.status, 400, "{path}: {}", reply.text());
        assert!(reply.text().contains("prefix"), "{}", reply.text());
    }
    assert_eq!(
        endpoint.status()["applied_index"],
        before,
        "a refusal appended"
    );

    // The scheme is case-insensitive (RFC 7235), the token is not.
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let reply = endpoint.with_token(None).send(
            endpoint
                .with_token(None)
                .request(Method::GET, "/v1/kv/a")
                .header("authorization", format!("{scheme} s3cret")),
        );
        assert_eq!(reply.status, 200, "scheme {scheme}: {}", reply.text());
    }
    let wrong = endpoint.with_token(None).send(
        endpoint
            .with_token(None)
            .request(Method::GET, "/v1/kv/a")
            .header("authorization", "bearer S3CRET"),
    );
    assert_eq!(wrong.status, 401, "{}", wrong.text());
}

/// `--data-dir` naming a regular file says so.
#[test]
fn a_data_dir_that_is_a_file_is_not_a_directory() {
    let dir = TempDir::new().unwrap();
    std::fs::write(dir.path().join("file"), b"not a directory").unwrap();
    let output = support::chorus_command(dir.path())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir", "file"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("not a directory"), "{stderr}");
}
