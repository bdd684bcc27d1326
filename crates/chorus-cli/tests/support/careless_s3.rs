//! A deliberately careless S3-compatible server on loopback: it stores objects
//! but ignores `If-None-Match` and `If-Match`, like servers that accept
//! conditional headers without enforcing them. Chorus must refuse it when it
//! opens the store (the capability probe).
//!
//! Just enough HTTP/1.1 for object_store's S3 client: PUT, GET, HEAD, DELETE
//! on `/<bucket>/<key>`, keep-alive, bodies framed by `Content-Length`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

type Objects = Arc<Mutex<HashMap<String, (Vec<u8>, u64)>>>;

/// A running careless server; it lives until the test process exits.
pub struct CarelessS3 {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
}

impl CarelessS3 {
    /// Starts a server on a free loopback port.
    pub fn start() -> CarelessS3 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let objects = Objects::default();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let objects = objects.clone();
                std::thread::spawn(move || {
                    // A broken connection only ends that connection.
                    let _ = serve(stream, &objects);
                });
            }
        });
        CarelessS3 { endpoint }
    }
}

fn serve(stream: TcpStream, objects: &Objects) -> std::io::Result<()> {
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut parts = request_line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_owned();
        let target = parts.next().unwrap_or_default();
        let path = target.split('?').next().unwrap_or_default().to_owned();
        let mut length = 0;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header)?;
            if header.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        let response = respond(&method, &path, body, objects);
        writer.write_all(&response)?;
        writer.flush()?;
    }
}

fn respond(method: &str, path: &str, body: Vec<u8>, objects: &Objects) -> Vec<u8> {
    let mut objects = objects.lock().unwrap();
    let (status, etag, content) = match method {
        "PUT" => {
            // The carelessness: no look at If-None-Match or If-Match.
            let version = objects.get(path).map_or(1, |(_, v)| v + 1);
            objects.insert(path.to_owned(), (body, version));
            ("200 OK", Some(version), Vec::new())
        }
        "GET" | "HEAD" => match objects.get(path) {
            Some((bytes, version)) => ("200 OK", Some(*version), bytes.clone()),
            None => (
                "404 Not Found",
                None,
                b"<Error><Code>NoSuchKey</Code></Error>".to_vec(),
            ),
        },
        "DELETE" => {
            objects.remove(path);
            ("204 No Content", None, Vec::new())
        }
        _ => ("501 Not Implemented", None, Vec::new()),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nLast-Modified: Mon, 30 Nov 2026 00:00:00 GMT\r\n",
        content.len()
    );
    if let Some(version) = etag {
        response.push_str(&format!("ETag: \"v{version}\"\r\n"));
    }
    response.push_str("\r\n");
    let mut response = response.into_bytes();
    if method != "HEAD" {
        response.extend_from_slice(&content);
    }
    response
}
