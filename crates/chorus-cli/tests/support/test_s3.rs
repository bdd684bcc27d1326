//! A small S3-compatible server on loopback whose faults a test chooses: it
//! may ignore `If-None-Match` / `If-Match` (like servers that accept
//! conditional headers without enforcing them, which Chorus must refuse at
//! open), and it may never answer PUTs of some keys (a stalled store).
//!
//! Just enough HTTP/1.1 for object_store's S3 client: PUT, GET, HEAD, DELETE
//! on `/<bucket>/<key>`, keep-alive, bodies framed by `Content-Length`. No
//! listing.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the server gets wrong on purpose.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Ignore `If-None-Match` and `If-Match`.
    pub careless: bool,
    /// Never answer a PUT whose path contains this (while `stall_switch`,
    /// if given, is armed).
    pub stall_puts_containing: Option<String>,
    /// Arms the stall at run time and counts the requests it held; without
    /// one the stall is always armed.
    pub stall_switch: Option<Arc<StallSwitch>>,
}

/// Turns [`Faults::stall_puts_containing`] on and off while the server runs
/// (a store that hangs only after a first boot uploaded its snapshot), and
/// counts the requests held.
#[derive(Debug, Default)]
pub struct StallSwitch {
    /// Whether matching PUTs are held now.
    pub armed: AtomicBool,
    /// How many requests were held so far.
    pub held: AtomicU64,
}

/// A running server; it lives until the test process exits.
pub struct TestS3 {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
}

type Objects = Arc<Mutex<HashMap<String, (Vec<u8>, u64)>>>;

struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl TestS3 {
    /// Starts a server with `faults` on a free loopback port.
    pub fn start(faults: Faults) -> TestS3 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let objects = Objects::default();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (objects, faults) = (objects.clone(), faults.clone());
                std::thread::spawn(move || {
                    // A broken connection only ends that connection.
                    let _ = serve(stream, &objects, &faults);
                });
            }
        });
        TestS3 { endpoint }
    }

    /// `s3://bucket/<path>` on this server.
    pub fn url(&self, path: &str) -> String {
        super::s3_url("bucket", path, &self.endpoint)
    }
}

fn serve(stream: TcpStream, objects: &Objects, faults: &Faults) -> std::io::Result<()> {
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    while let Some(request) = read_request(&mut reader)? {
        let armed = faults
            .stall_switch
            .as_ref()
            .is_none_or(|switch| switch.armed.load(Ordering::SeqCst));
        let stalled = armed
            && faults
                .stall_puts_containing
                .as_deref()
                .is_some_and(|part| request.method == "PUT" && request.path.contains(part));
        if stalled {
            if let Some(switch) = &faults.stall_switch {
                switch.held.fetch_add(1, Ordering::SeqCst);
            }
            // Hold the connection open and never answer.
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        writer.write_all(&respond(&request, objects, faults.careless))?;
        writer.flush()?;
    }
    Ok(())
}

fn read_request(reader: &mut impl BufRead) -> std::io::Result<Option<Request>> {
    let mut request_line = String::new();
    if reader.read_line(&mut request_line)? == 0 {
        return Ok(None);
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default().to_owned();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        match line.trim_end().split_once(':') {
            Some((name, value)) => headers.push((name.to_owned(), value.trim().to_owned())),
            None => break,
        }
    }
    let mut request = Request {
        method,
        path,
        headers,
        body: Vec::new(),
    };
    let length = request
        .header("content-length")
        .map_or(0, |v| v.parse().unwrap_or(0));
    request.body = vec![0; length];
    reader.read_exact(&mut request.body)?;
    Ok(Some(request))
}

fn respond(request: &Request, objects: &Objects, careless: bool) -> Vec<u8> {
    let mut objects = objects.lock().unwrap();
    let current = objects.get(&request.path).map(|(_, version)| *version);
    let etag = |version: u64| format!("\"v{version}\"");
    let (status, version, content) = match request.method.as_str() {
        "PUT" => {
            let refused = !careless
                && match (request.header("if-none-match"), request.header("if-match")) {
                    (Some("*"), _) => current.is_some(),
                    (_, Some(expected)) => current.map(etag).as_deref() != Some(expected),
                    _ => false,
                };
            if refused {
                ("412 Precondition Failed", None, Vec::new())
            } else {
                let version = current.map_or(1, |v| v + 1);
                objects.insert(request.path.clone(), (request.body.clone(), version));
                ("200 OK", Some(version), Vec::new())
            }
        }
        "GET" | "HEAD" => match objects.get(&request.path) {
            Some((bytes, version)) => ("200 OK", Some(*version), bytes.clone()),
            None => (
                "404 Not Found",
                None,
                b"<Error><Code>NoSuchKey</Code></Error>".to_vec(),
            ),
        },
        "DELETE" => {
            objects.remove(&request.path);
            ("204 No Content", None, Vec::new())
        }
        _ => ("501 Not Implemented", None, Vec::new()),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nLast-Modified: Mon, 30 Nov 2026 00:00:00 GMT\r\n",
        content.len()
    );
    if let Some(version) = version {
        response.push_str(&format!("ETag: {}\r\n", etag(version)));
    }
    response.push_str("\r\n");
    let mut response = response.into_bytes();
    if request.method != "HEAD" {
        response.extend_from_slice(&content);
    }
    response
}
