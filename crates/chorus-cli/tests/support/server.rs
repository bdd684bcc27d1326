//! `chorus serve` as a child process, reached over HTTP on loopback.
//!
//! [`Launch`] holds what every start of one instance gets (working directory,
//! flags, bearer token); [`Launch::start`] spawns `chorus serve --listen
//! 127.0.0.1:0 …`, reads the bound address from its first stdout line and
//! returns a [`Server`]. Two threads per process keep reading its stdout and
//! stderr, so a chatty process never blocks on a full pipe, and keep what it
//! printed for the failure messages. A [`Server`] sends signals by pid and
//! kills its process on drop (printing its stderr when the test panicked).
//!
//! Every wait is a poll with a deadline: nothing here sleeps to synchronize.
//! An [`Endpoint`] is the HTTP side alone; it is cheap to clone and to move
//! into client threads, and outlives the process it points at.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use reqwest::Method;
use reqwest::blocking::{Client, RequestBuilder};
use reqwest::header::HeaderMap;
use serde_json::Value;

/// How long a process may take to print its address, and how long a role
/// change may take (a boot, a takeover after a lease expired). Generous: a
/// loaded 2-core machine runs several of these at once.
pub const ROLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one HTTP request to a running process.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on one status poll (a stopped process does not answer).
const POLL_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between two polls.
pub const POLL: Duration = Duration::from_millis(25);
/// Pause between two polls of `/v1/status`.
const STATUS_POLL: Duration = Duration::from_millis(100);
/// Stderr lines kept per process for failure messages.
const STDERR_LINES_KEPT: usize = 400;
/// Items per page of [`Endpoint::list_all`]: small, so lists span pages.
const LIST_PAGE: usize = 128;

/// How to start (and restart) one `chorus serve` instance.
#[derive(Debug, Clone)]
pub struct Launch {
    dir: PathBuf,
    args: Vec<String>,
    token: Option<String>,
    descriptor_limit: Option<libc::rlim_t>,
    /// Environment variables removed from the process's environment.
    unset: Vec<String>,
}

impl Launch {
    /// An instance run in `dir` with no flags beyond `--listen`.
    pub fn new(dir: &Path) -> Launch {
        Launch {
            dir: dir.to_owned(),
            args: Vec::new(),
            token: None,
            descriptor_limit: None,
            unset: Vec::new(),
        }
    }

    /// Runs the process without the environment variable `name` (one that
    /// [`super::chorus_command`] sets).
    pub fn unset_env(mut self, name: &str) -> Launch {
        self.unset.push(name.to_owned());
        self
    }

    /// Adds flags.
    pub fn args<S: AsRef<str>>(mut self, args: impl IntoIterator<Item = S>) -> Launch {
        self.args
            .extend(args.into_iter().map(|arg| arg.as_ref().to_owned()));
        self
    }

    /// Requires `token` (`--token`); the [`Endpoint`] presents it.
    pub fn token(mut self, token: &str) -> Launch {
        self.token = Some(token.to_owned());
        self.args(["--token", token])
    }

    /// Runs the process with at most `limit` open file descriptors
    /// (`ulimit -n`), as a host with a low limit would.
    pub fn descriptor_limit(mut self, limit: libc::rlim_t) -> Launch {
        self.descriptor_limit = Some(limit);
        self
    }

    /// Spawns the process and waits until it printed its address; `name`
    /// labels it in failure messages.
    pub fn start(&self, name: &str) -> Server {
        let mut command = super::chorus_command(&self.dir);
        if let Some(limit) = self.descriptor_limit {
            set_descriptor_limit(&mut command, limit);
        }
        for name in &self.unset {
            command.env_remove(name);
        }
        let mut child = command
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("chorus serve runs");
        let output = Arc::new(Output::default());
        drain(
            child.stdout.take().unwrap(),
            Arc::clone(&output),
            Stream::Stdout,
        );
        drain(
            child.stderr.take().unwrap(),
            Arc::clone(&output),
            Stream::Stderr,
        );
        let mut server = Server {
            pid: child.id(),
            child,
            exit: None,
            output,
            // The URL is known once the process printed its address.
            endpoint: Endpoint::new(name, "", self.token.clone()),
        };
        let line = server.wait_for_line(ROLE_TIMEOUT, |line| line.contains(" listening on "));
        let address = line
            .split(" listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("{name}: no address in {line:?}"));
        server.endpoint.url = format!("http://{address}");
        server
    }
}

/// Lowers the child's `RLIMIT_NOFILE` (soft and hard) to `limit` before it
/// runs.
fn set_descriptor_limit(command: &mut std::process::Command, limit: libc::rlim_t) {
    use std::os::unix::process::CommandExt;
    let limit = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: between fork and exec the closure only calls setrlimit, which
    // is async-signal-safe, and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

/// Which pipe a line came from.
#[derive(Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
}

/// What a process printed, as the drain threads read it.
#[derive(Default)]
struct Output {
    lines: Mutex<Lines>,
    changed: Condvar,
}

#[derive(Default)]
struct Lines {
    stdout: Vec<String>,
    stderr: VecDeque<String>,
    stdout_closed: bool,
}

/// Reads `pipe` line by line into `output` until it closes.
fn drain(pipe: impl Read + Send + 'static, output: Arc<Output>, stream: Stream) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut buffer = Vec::new();
        loop {
            buffer.clear();
            match reader.read_until(b'\n', &mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let line = String::from_utf8_lossy(&buffer).trim_end().to_owned();
            let mut lines = output.lines.lock().unwrap();
            match stream {
                Stream::Stdout => lines.stdout.push(line),
                Stream::Stderr => {
                    if lines.stderr.len() == STDERR_LINES_KEPT {
                        lines.stderr.pop_front();
                    }
                    lines.stderr.push_back(line);
                }
            }
            output.changed.notify_all();
        }
        if let Stream::Stdout = stream {
            output.lines.lock().unwrap().stdout_closed = true;
            output.changed.notify_all();
        }
    });
}

/// A running (or exited) `chorus serve` process.
pub struct Server {
    child: Child,
    pid: u32,
    exit: Option<ExitStatus>,
    output: Arc<Output>,
    endpoint: Endpoint,
}

impl Deref for Server {
    type Target = Endpoint;

    fn deref(&self) -> &Endpoint {
        &self.endpoint
    }
}

impl Server {
    /// The HTTP side, for client threads.
    pub fn endpoint(&self) -> Endpoint {
        self.endpoint.clone()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Every stdout line so far.
    pub fn stdout(&self) -> Vec<String> {
        self.output.lines.lock().unwrap().stdout.clone()
    }

    /// The last stderr lines, for failure messages.
    pub fn stderr_tail(&self) -> String {
        let lines = self.output.lines.lock().unwrap();
        let skip = lines.stderr.len().saturating_sub(40);
        lines
            .stderr
            .iter()
            .skip(skip)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits for a stdout line `matches` accepts (one printed earlier
    /// counts); panics at `timeout` or if stdout closes first.
    pub fn wait_for_line(&self, timeout: Duration, matches: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        let mut lines = self.output.lines.lock().unwrap();
        loop {
            if let Some(line) = lines.stdout.iter().find(|line| matches(line)) {
                return line.clone();
            }
            let now = Instant::now();
            if lines.stdout_closed || now >= deadline {
                let stdout = lines.stdout.join("\n");
                drop(lines);
                panic!(
                    "{}: expected stdout line not printed (stdout {}):\n{stdout}\nstderr:\n{}",
                    self.name,
                    if now >= deadline { "open" } else { "closed" },
                    self.stderr_tail()
                );
            }
            lines = self
                .output
                .changed
                .wait_timeout(lines, deadline - now)
                .unwrap()
                .0;
        }
    }

    /// Sends signal `name` (`STOP`, `CONT`, `TERM`, …) to the process.
    pub fn signal(&self, name: &str) {
        let status = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.pid.to_string()])
            .stderr(Stdio::null())
            .status()
            .expect("kill runs");
        assert!(
            status.success() || self.exit.is_some(),
            "{}: kill -{name} {} failed",
            self.name,
            self.pid
        );
    }

    /// SIGSTOP: the process freezes mid-whatever.
    pub fn freeze(&self) {
        self.signal("STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// SIGKILL, then reaps the process.
    pub fn kill(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            self.exit = Some(self.child.wait().expect("reap chorus serve"));
        }
    }

    /// SIGTERM, then waits for the process to exit on its own.
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        self.signal("TERM");
        self.wait_exit(timeout)
    }

    /// Waits for the process to exit; panics (after killing it) at `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exit {
                return status;
            }
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                self.exit = Some(status);
                return status;
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!(
                    "{}: did not exit within {timeout:?}\nstderr:\n{}",
                    self.name,
                    self.stderr_tail()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Polls `GET path` every `interval` until `accept` takes its JSON
    /// answer (any status) and returns that answer; panics at `timeout` with
    /// the last answer and the process's stderr. Requests that fail or time
    /// out (a stopped process) count as not yet.
    fn poll(
        &self,
        what: &str,
        timeout: Duration,
        interval: Duration,
        path: &str,
        accept: impl Fn(u16, &Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        let mut last = Value::Null;
        loop {
            let request = self
                .request(Method::GET, path)
                .timeout(POLL_REQUEST_TIMEOUT);
            if let Ok(reply) = self.try_send(request)
                && let Ok(body) = reply.json_value()
            {
                if accept(reply.status, &body) {
                    return body;
                }
                last = body;
            }
            if Instant::now() >= deadline {
                panic!(
                    "{}: not {what} within {timeout:?}; last {path}: {last}\nstderr:\n{}",
                    self.name,
                    self.stderr_tail()
                );
            }
            std::thread::sleep(interval);
        }
    }

    /// Polls `/v1/status` until `accept` holds, and returns that status.
    /// Slower than the other waits: a status reads the register and lists
    /// every replica, load on the very stores under test.
    pub fn wait_for_status(
        &self,
        what: &str,
        timeout: Duration,
        accept: impl Fn(&Value) -> bool,
    ) -> Value {
        self.poll(what, timeout, STATUS_POLL, "/v1/status", |code, status| {
            code == 200 && accept(status)
        })
    }

    /// Waits until `/readyz` reports `role` (and, for a primary, ready: sure
    /// of its lease), then returns `/v1/status`.
    pub fn wait_for_role(&self, role: &str) -> Value {
        self.poll(
            &format!("role {role}"),
            ROLE_TIMEOUT,
            POLL,
            "/readyz",
            |_, ready| ready["role"] == role && (role != "primary" || ready["ready"] == true),
        );
        self.status()
    }

    /// Waits until this process applied every record below `target` (the
    /// index of a stale list, which costs no store request), then returns
    /// `/v1/status`.
    pub fn wait_for_applied(&self, target: u64, timeout: Duration) -> Value {
        self.poll(
            &format!("applied up to {target}"),
            timeout,
            POLL,
            "/v1/kv?limit=1&consistency=stale",
            |code, page| code == 200 && page["index"].as_u64().is_some_and(|index| index >= target),
        );
        self.status()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.exit.is_none() {
            // SIGKILL ends a stopped process too.
            self.kill();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- {} (pid {}) stdout:\n{}\n---- {} stderr (tail):\n{}",
                self.name,
                self.pid,
                self.stdout().join("\n"),
                self.name,
                self.stderr_tail()
            );
        }
    }
}

/// The HTTP side of one instance: base URL, client and token.
#[derive(Clone)]
pub struct Endpoint {
    /// Labels this instance in failure messages.
    pub name: String,
    /// `http://127.0.0.1:<port>`: also its default holder id.
    pub url: String,
    client: Client,
    token: Option<String>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at {}", self.name, self.url)
    }
}

impl Endpoint {
    fn new(name: &str, url: &str, token: Option<String>) -> Endpoint {
        let client = Client::builder()
            .no_proxy()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .expect("an HTTP client");
        Endpoint {
            name: name.to_owned(),
            url: url.to_owned(),
            client,
            token,
        }
    }

    /// The same instance, presenting `token` instead (`None`: no token).
    pub fn with_token(&self, token: Option<&str>) -> Endpoint {
        Endpoint {
            token: token.map(str::to_owned),
            ..self.clone()
        }
    }

    /// A request to `path` (with the query, if any), with the bearer token.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let builder = self.client.request(method, format!("{}{path}", self.url));
        match &self.token {
            Some(token) => builder.bearer_auth(token),
            None => builder,
        }
    }

    /// Sends `request`; panics on a transport error (the process is expected
    /// to answer).
    pub fn send(&self, request: RequestBuilder) -> Reply {
        self.try_send(request)
            .unwrap_or_else(|e| panic!("{}: request failed: {e:?}", self.name))
    }

    /// Sends `request`; a transport error is the caller's to judge.
    pub fn try_send(&self, request: RequestBuilder) -> Result<Reply, reqwest::Error> {
        let response = request.send()?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.bytes()?.to_vec();
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    /// `PUT /v1/kv/{key}` with `value`.
    pub fn put(&self, key: &str, value: &str) -> Reply {
        self.send(self.put_request(key, value))
    }

    /// The request of [`put`](Endpoint::put), to add conditions to.
    pub fn put_request(&self, key: &str, value: &str) -> RequestBuilder {
        self.request(Method::PUT, &format!("/v1/kv/{key}"))
            .body(value.to_owned())
    }

    /// Puts and expects `200 {"index": N, "revision": R}`; returns R, the
    /// key's new version.
    pub fn put_ok(&self, key: &str, value: &str) -> u64 {
        self.put(key, value).expect_revision(&format!("put {key}"))
    }

    /// `GET /v1/kv/{key}` (strong).
    pub fn get(&self, key: &str) -> Reply {
        self.send(self.request(Method::GET, &format!("/v1/kv/{key}")))
    }

    /// `GET /v1/kv/{key}?consistency=stale`.
    pub fn get_stale(&self, key: &str) -> Reply {
        self.send(self.request(Method::GET, &format!("/v1/kv/{key}?consistency=stale")))
    }

    /// `GET /v1/status`, expecting 200.
    pub fn status(&self) -> Value {
        let reply = self.send(self.request(Method::GET, "/v1/status"));
        assert_eq!(reply.status, 200, "{}: status: {}", self.name, reply.text());
        reply.json()
    }

    /// Every key under `prefix` as `(key, value, version)`, page by page;
    /// `stale` reads whatever this process applied. Also returns the index
    /// the first page reflects.
    pub fn list_all(&self, prefix: &str, stale: bool) -> (Vec<(String, String, u64)>, u64) {
        let mut items = Vec::new();
        let mut after: Option<String> = None;
        let mut first_index = None;
        loop {
            let mut path = format!("/v1/kv?prefix={prefix}&limit={LIST_PAGE}");
            if stale {
                path.push_str("&consistency=stale");
            }
            if let Some(cursor) = &after {
                path.push_str(&format!("&after={cursor}"));
            }
            let reply = self.send(self.request(Method::GET, &path));
            assert_eq!(reply.status, 200, "{}: list: {}", self.name, reply.text());
            let page = reply.json();
            first_index.get_or_insert(page["index"].as_u64().expect("list index"));
            for item in page["items"].as_array().expect("list items") {
                items.push((
                    item["key"].as_str().expect("a text key").to_owned(),
                    item["value"].as_str().expect("a text value").to_owned(),
                    item["version"].as_u64().expect("a version"),
                ));
            }
            match page["next"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => return (items, first_index.unwrap()),
            }
        }
    }
}

/// One HTTP answer, read in full.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON, if it is.
    pub fn json_value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }

    /// The body as JSON; panics if it is not.
    pub fn json(&self) -> Value {
        self.json_value()
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.text()))
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    /// The version in the `ETag` header (`"N"`).
    pub fn etag(&self) -> u64 {
        let etag = self.header("etag").expect("an ETag");
        etag.trim_matches('"')
            .parse()
            .unwrap_or_else(|_| panic!("ETag {etag:?} is not \"N\""))
    }

    /// Expects `200 {"index": N}` and returns N; `what` labels a failure.
    pub fn expect_index(&self, what: &str) -> u64 {
        assert_eq!(self.status, 200, "{what}: {}", self.text());
        self.json()["index"]
            .as_u64()
            .unwrap_or_else(|| panic!("{what}: no index in {}", self.text()))
    }

    /// Expects `200 {"index": N, "revision": R}` of a key-value write, with R
    /// in the `ETag` and `X-Chorus-Revision` too, and returns R.
    pub fn expect_revision(&self, what: &str) -> u64 {
        assert_eq!(self.status, 200, "{what}: {}", self.text());
        let revision = self.json()["revision"]
            .as_u64()
            .unwrap_or_else(|| panic!("{what}: no revision in {}", self.text()));
        assert_eq!(self.etag(), revision, "{what}: ETag");
        assert_eq!(
            self.header("x-chorus-revision"),
            Some(revision.to_string().as_str()),
            "{what}: X-Chorus-Revision"
        );
        revision
    }

    /// Whether this is a 503 whose body says the write may have committed.
    pub fn may_have_committed(&self) -> bool {
        self.status == 503
            && self
                .json_value()
                .is_ok_and(|body| body["may_have_committed"] == true)
    }
}
