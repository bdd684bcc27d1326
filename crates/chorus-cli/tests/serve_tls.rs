//! `chorus serve` over TLS, as the Kubernetes API server reaches etcd:
//! `--cert-file`/`--key-file` on both listeners, `--trusted-ca-file` with
//! `--client-cert-auth` requiring a client certificate the CA signed.
//! etcdctl (`--cacert --cert --key`) drives the etcd listener, curl the HTTP
//! one; clients without a certificate, with one from another CA, and
//! without TLS at all must be refused. Every certificate is made by the test
//! (rcgen), none is committed.

mod support;

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::etcd::{etcdctl_binary, free_port};
use support::server::{Launch, Server};
use tempfile::TempDir;

/// How long `chorus serve` may take to answer its first TLS client (a
/// loaded 2-core machine runs several tests at once).
const SERVE_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one refused client's attempt: etcdctl retries until it.
const REFUSED_TIMEOUT: &str = "5s";

/// A CA, a server certificate for 127.0.0.1 and localhost, a client
/// certificate the CA signed and one another CA signed, as PEM files.
struct Pki {
    dir: TempDir,
}

/// A certificate and its key, as files.
struct Pair {
    cert: PathBuf,
    key: PathBuf,
}

impl Pki {
    fn new() -> Pki {
        let pki = Pki {
            dir: TempDir::new().unwrap(),
        };
        let ca = certificate_authority("chorus test CA");
        let rogue = certificate_authority("another CA");
        pki.write("ca.pem", &ca.pem());
        // Client use too: a standby presents it when it forwards to the
        // primary (as kubeadm's etcd server certificates allow).
        let server = leaf(
            &ca,
            &["127.0.0.1", "localhost"],
            &[
                rcgen::ExtendedKeyUsagePurpose::ServerAuth,
                rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            ],
        );
        pki.write_pair("server", server);
        let client = leaf(&ca, &[], &[rcgen::ExtendedKeyUsagePurpose::ClientAuth]);
        pki.write_pair("client", client);
        let stranger = leaf(&rogue, &[], &[rcgen::ExtendedKeyUsagePurpose::ClientAuth]);
        pki.write_pair("stranger", stranger);
        pki
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    fn write_pair(&self, name: &str, (cert, key): (String, String)) {
        self.write(&format!("{name}.pem"), &cert);
        self.write(&format!("{name}-key.pem"), &key);
    }

    fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// The pair `name`: "server", "client" (signed by the CA) or
    /// "stranger" (signed by another CA).
    fn pair(&self, name: &str) -> Pair {
        Pair {
            cert: self.path(&format!("{name}.pem")),
            key: self.path(&format!("{name}-key.pem")),
        }
    }

    /// The flags of a server presenting the server pair; with
    /// `client_certificates`, requiring the CA's client certificates.
    fn server_flags(&self, client_certificates: bool) -> Vec<String> {
        let server = self.pair("server");
        let mut flags = vec![
            "--cert-file".to_owned(),
            display(&server.cert),
            "--key-file".to_owned(),
            display(&server.key),
        ];
        if client_certificates {
            flags.extend([
                "--trusted-ca-file".to_owned(),
                display(&self.ca()),
                "--client-cert-auth".to_owned(),
            ]);
        }
        flags
    }
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

fn certificate_authority(name: &str) -> rcgen::CertifiedIssuer<'static, rcgen::KeyPair> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap()
}

/// A certificate for `names` signed by `issuer`, and its key, as PEM.
fn leaf(
    issuer: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    names: &[&str],
    usages: &[rcgen::ExtendedKeyUsagePurpose],
) -> (String, String) {
    let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
    let mut params = rcgen::CertificateParams::new(names).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "chorus test");
    params.extended_key_usages = usages.to_vec();
    let key = rcgen::KeyPair::generate().unwrap();
    let certificate = params.signed_by(&key, &**issuer).unwrap();
    (certificate.pem(), key.serialize_pem())
}

/// Polls `attempt` until it succeeds, for at most [`SERVE_TIMEOUT`].
fn wait_until(what: &str, server: &Server, mut attempt: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + SERVE_TIMEOUT;
    loop {
        let Err(error) = attempt() else {
            return;
        };
        assert!(
            Instant::now() < deadline,
            "{what} not within {SERVE_TIMEOUT:?}: {error}\nstderr:\n{}",
            server.stderr_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One etcdctl run's exit code and output.
fn etcdctl(binary: &Path, endpoint: &str, tls: &[String], args: &[&str]) -> Output {
    Command::new(binary)
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint])
        .args(["--dial-timeout", REFUSED_TIMEOUT])
        .args(["--command-timeout", REFUSED_TIMEOUT])
        .args(tls)
        .args(args)
        .output()
        .expect("etcdctl runs")
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}; stdout {:?}; stderr {:?}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// etcdctl's TLS flags: the CA, and the client pair `pair` if any.
fn etcdctl_tls(pki: &Pki, pair: Option<&str>) -> Vec<String> {
    let mut flags = vec![format!("--cacert={}", display(&pki.ca()))];
    if let Some(pair) = pair {
        let pair = pki.pair(pair);
        flags.push(format!("--cert={}", display(&pair.cert)));
        flags.push(format!("--key={}", display(&pair.key)));
    }
    flags
}

/// A server of `pki` (requiring client certificates or not) with its etcd
/// API on a free port; the port.
fn start(dir: &Path, pki: &Pki, client_certificates: bool) -> (Server, u16) {
    let port = free_port();
    let server = Launch::new(dir)
        .args(["--etcd-listen", &format!("127.0.0.1:{port}")])
        .args(pki.server_flags(client_certificates))
        .start("tls");
    (server, port)
}

/// etcdctl with the CA's client certificate writes and reads, with the
/// endpoint given as `https://` or without a scheme; without a client
/// certificate, with another CA's, or without TLS, it is refused and
/// writes nothing. MemberList names the `https://` client URL.
#[test]
fn etcdctl_needs_a_client_certificate_the_trusted_ca_signed() {
    let Some(binary) = etcdctl_binary() else {
        return;
    };
    let dir = TempDir::new().unwrap();
    let pki = Pki::new();
    let (server, port) = start(dir.path(), &pki, true);
    let https = format!("https://127.0.0.1:{port}");
    let bare = format!("127.0.0.1:{port}");
    let trusted = etcdctl_tls(&pki, Some("client"));
    wait_until("etcdctl over TLS", &server, || {
        let output = etcdctl(&binary, &https, &trusted, &["put", "k", "v"]);
        output
            .status
            .success()
            .then_some(())
            .ok_or_else(|| text(&output))
    });
    for endpoint in [&https, &bare] {
        let output = etcdctl(&binary, endpoint, &trusted, &["get", "k"]);
        assert!(output.status.success(), "{endpoint}: {}", text(&output));
        assert_eq!(String::from_utf8_lossy(&output.stdout), "k\nv\n");
    }
    let refused: [(&str, &str, Vec<String>); 3] = [
        ("no client certificate", &https, etcdctl_tls(&pki, None)),
        (
            "another CA's certificate",
            &https,
            etcdctl_tls(&pki, Some("stranger")),
        ),
        ("no TLS", &bare, Vec::new()),
    ];
    for (what, endpoint, flags) in &refused {
        let output = etcdctl(&binary, endpoint, flags, &["put", "refused", what]);
        assert!(!output.status.success(), "{what}: {}", text(&output));
    }
    let output = etcdctl(&binary, &https, &trusted, &["get", "refused"]);
    assert!(output.status.success(), "{}", text(&output));
    assert!(
        output.stdout.is_empty(),
        "a refused client wrote: {}",
        text(&output)
    );

    let output = etcdctl(&binary, &bare, &trusted, &["endpoint", "status"]);
    assert!(output.status.success(), "{}", text(&output));
    let output = etcdctl(&binary, &bare, &trusted, &["member", "list", "-w", "json"]);
    assert!(output.status.success(), "{}", text(&output));
    let list: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        list["members"][0]["clientURLs"],
        serde_json::json!([https]),
        "{list}"
    );
}

/// curl's result: the HTTP status and body, or its exit code on a failed
/// connection.
fn curl(args: &[String], url: &str) -> Result<(u16, String), String> {
    let output = Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "10"])
        .args(["--write-out", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .expect("curl runs");
    if !output.status.success() {
        return Err(text(&output));
    }
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, status) = stdout.rsplit_once('\n').expect("curl wrote the status");
    Ok((status.parse().expect("a status"), body.to_owned()))
}

/// curl's TLS flags: the CA, and the client pair `pair` if any.
fn curl_tls(pki: &Pki, pair: Option<&str>) -> Vec<String> {
    let mut flags = vec!["--cacert".to_owned(), display(&pki.ca())];
    if let Some(pair) = pair {
        let pair = pki.pair(pair);
        flags.extend([
            "--cert".to_owned(),
            display(&pair.cert),
            "--key".to_owned(),
            display(&pair.key),
        ]);
    }
    flags
}

/// The HTTP API on the same certificates: served over https to a client
/// with the CA's certificate (and advertised as https), refused to one
/// without, to one with another CA's, and to plain HTTP.
#[test]
fn the_http_api_needs_a_client_certificate_the_trusted_ca_signed() {
    let dir = TempDir::new().unwrap();
    let pki = Pki::new();
    let (server, _) = start(dir.path(), &pki, true);
    let plain = server.endpoint().url;
    let https = plain.replace("http://", "https://");
    let trusted = curl_tls(&pki, Some("client"));
    let put = |flags: &[String], value: &str| {
        let mut args = flags.to_vec();
        args.extend(["-X".to_owned(), "PUT".to_owned(), "--data".to_owned()]);
        args.push(value.to_owned());
        curl(&args, &format!("{https}/v1/kv/k"))
    };
    wait_until("a write over https", &server, || match put(&trusted, "v") {
        Ok((200, _)) => Ok(()),
        other => Err(format!("{other:?}")),
    });
    assert_eq!(
        curl(&trusted, &format!("{https}/v1/kv/k")),
        Ok((200, "v".to_owned()))
    );
    let (status, body) = curl(&trusted, &format!("{https}/v1/status")).unwrap();
    assert_eq!(status, 200, "{body}");
    let advertised: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(advertised["advertise_url"], https.as_str(), "{body}");

    for (what, flags) in [
        ("no client certificate", curl_tls(&pki, None)),
        ("another CA's certificate", curl_tls(&pki, Some("stranger"))),
    ] {
        let refused = put(&flags, what);
        assert!(refused.is_err(), "{what}: {refused:?}");
    }
    let plaintext = curl(&[], &format!("{plain}/v1/kv/k"));
    assert!(
        !matches!(plaintext, Ok((200, _))),
        "plain HTTP answered: {plaintext:?}"
    );
    assert_eq!(
        curl(&trusted, &format!("{https}/v1/kv/k")),
        Ok((200, "v".to_owned())),
        "a refused client wrote"
    );
}

/// Without a trusted CA the server presents its certificate and asks for
/// none: clients that trust the CA are served on both listeners, plaintext
/// clients are not.
#[test]
fn server_tls_alone_serves_clients_without_certificates() {
    let dir = TempDir::new().unwrap();
    let pki = Pki::new();
    let (server, port) = start(dir.path(), &pki, false);
    let https = server.endpoint().url.replace("http://", "https://");
    let ca_only = curl_tls(&pki, None);
    // Ready: the node is the primary, so etcdctl below meets no boot.
    wait_until("ready over https", &server, || {
        match curl(&ca_only, &format!("{https}/readyz")) {
            Ok((200, body)) if body.contains("\"primary\"") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let plaintext = curl(&[], &format!("{}/v1/status", server.endpoint().url));
    assert!(!matches!(plaintext, Ok((200, _))), "{plaintext:?}");
    // Without the CA, curl does not trust the server.
    let untrusted = curl(&[], &format!("{https}/v1/status"));
    assert!(untrusted.is_err(), "{untrusted:?}");

    let Some(binary) = etcdctl_binary() else {
        return;
    };
    let endpoint = format!("https://127.0.0.1:{port}");
    let output = etcdctl(
        &binary,
        &endpoint,
        &etcdctl_tls(&pki, None),
        &["put", "k", "v"],
    );
    assert!(output.status.success(), "{}", text(&output));
    let output = etcdctl(&binary, &format!("127.0.0.1:{port}"), &[], &["get", "k"]);
    assert!(!output.status.success(), "plaintext: {}", text(&output));
}

/// Waits until `server`'s `/readyz`, read over TLS with the CA's client
/// certificate, reports `role`.
fn wait_for_role(server: &Server, pki: &Pki, role: &str) {
    let https = server.endpoint().url.replace("http://", "https://");
    let trusted = curl_tls(pki, Some("client"));
    wait_until(&format!("role {role}"), server, || {
        let (_, body) = curl(&trusted, &format!("{https}/readyz"))?;
        let ready: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        (ready["role"] == role).then_some(()).ok_or(body)
    });
}

/// Two nodes on shared stores, both requiring client certificates: etcdctl
/// writes through the standby, which forwards to the primary over TLS
/// (presenting its own certificate), and the write reads back through the
/// primary.
#[test]
fn a_standby_forwards_writes_to_the_primary_over_tls() {
    let Some(binary) = etcdctl_binary() else {
        return;
    };
    let dir = TempDir::new().unwrap();
    let pki = Pki::new();
    let (primary, primary_port) = start(dir.path(), &pki, true);
    wait_for_role(&primary, &pki, "primary");
    let (standby, standby_port) = start(dir.path(), &pki, true);
    wait_for_role(&standby, &pki, "standby");
    let trusted = etcdctl_tls(&pki, Some("client"));
    let through_standby = format!("https://127.0.0.1:{standby_port}");
    // Until the primary announced its endpoint, the standby has none to
    // forward to.
    wait_until("a write through the standby", &standby, || {
        let output = etcdctl(
            &binary,
            &through_standby,
            &trusted,
            &["put", "k", "forwarded"],
        );
        output
            .status
            .success()
            .then_some(())
            .ok_or_else(|| text(&output))
    });
    let through_primary = format!("https://127.0.0.1:{primary_port}");
    let output = etcdctl(&binary, &through_primary, &trusted, &["get", "k"]);
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "k\nforwarded\n");
}

/// With server TLS alone a standby has no CA to verify the primary with:
/// a write through it is refused saying so, and nothing is written.
#[test]
fn without_a_trusted_ca_a_standby_says_it_cannot_verify_the_primary() {
    let Some(binary) = etcdctl_binary() else {
        return;
    };
    let dir = TempDir::new().unwrap();
    let pki = Pki::new();
    let (primary, primary_port) = start(dir.path(), &pki, false);
    wait_for_role(&primary, &pki, "primary");
    let (standby, standby_port) = start(dir.path(), &pki, false);
    wait_for_role(&standby, &pki, "standby");
    let ca_only = etcdctl_tls(&pki, None);
    let through_standby = format!("https://127.0.0.1:{standby_port}");
    wait_until("the standby's refusal", &standby, || {
        let output = etcdctl(&binary, &through_standby, &ca_only, &["put", "k", "v"]);
        let refused = !output.status.success()
            && String::from_utf8_lossy(&output.stderr).contains("no CA to verify it");
        refused.then_some(()).ok_or_else(|| text(&output))
    });
    let through_primary = format!("https://127.0.0.1:{primary_port}");
    let output = etcdctl(&binary, &through_primary, &ca_only, &["get", "k"]);
    assert!(output.status.success(), "{}", text(&output));
    assert!(output.stdout.is_empty(), "{}", text(&output));
}

/// A client that connects and never starts its handshake is closed after
/// the header read timeout, on both listeners, as a silent plaintext
/// client is: TLS opens no way around the connection bounds.
#[test]
fn a_client_that_never_starts_its_handshake_is_closed_after_the_header_read_timeout() {
    let dir = TempDir::new().unwrap();
    let pki = Pki::new();
    let port = free_port();
    let server = Launch::new(dir.path())
        .args(["--etcd-listen", &format!("127.0.0.1:{port}")])
        .args(["--header-read-timeout-secs", "1"])
        .args(pki.server_flags(true))
        .start("tls");
    let https = server.endpoint().url.replace("http://", "https://");
    let trusted = curl_tls(&pki, Some("client"));
    wait_until("a read over https", &server, || {
        match curl(&trusted, &format!("{https}/v1/status")) {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let http = https.trim_start_matches("https://").to_owned();
    for address in [http, format!("127.0.0.1:{port}")] {
        let mut silent = TcpStream::connect(&address).unwrap();
        // Far beyond the 1 s timeout: a loaded machine is slow, not this slow.
        silent
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut byte = [0u8; 1];
        let read = silent.read(&mut byte);
        let closed = match &read {
            Ok(0) => true,
            Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        };
        assert!(
            closed,
            "{address}: a silent client still connected: {read:?}"
        );
    }
}

/// `chorus serve --print-config` with TLS flags: each unusable file or
/// missing companion flag is one line naming the flag (and the file), and
/// good files show as TLS on.
#[test]
fn bad_tls_flags_are_refused_naming_the_flag_and_the_file() {
    let dir = TempDir::new().unwrap();
    let pki = Pki::new();
    let server = pki.pair("server");
    let client = pki.pair("client");
    let garbage = pki.write("garbage.pem", "no PEM here\n");
    let missing = pki.path("missing.pem");
    let (cert, key, ca) = (
        display(&server.cert),
        display(&server.key),
        display(&pki.ca()),
    );
    let other_key = display(&client.key);
    let (garbage, missing) = (display(&garbage), display(&missing));
    let directory = display(dir.path());
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            vec!["--cert-file", &missing, "--key-file", &key],
            format!("--cert-file {missing}: cannot read"),
        ),
        (
            vec!["--cert-file", &cert, "--key-file", &missing],
            format!("--key-file {missing}: cannot read"),
        ),
        // Unreadable (even as root): a directory.
        (
            vec![
                "--cert-file",
                &cert,
                "--key-file",
                &key,
                "--trusted-ca-file",
                &directory,
            ],
            format!("--trusted-ca-file {directory}: cannot read"),
        ),
        (
            vec!["--cert-file", &garbage, "--key-file", &key],
            format!("--cert-file {garbage}: no PEM certificate in the file"),
        ),
        (
            vec!["--cert-file", &cert, "--key-file", &garbage],
            format!("--key-file {garbage}: no PEM private key in the file"),
        ),
        (
            vec![
                "--cert-file",
                &cert,
                "--key-file",
                &key,
                "--trusted-ca-file",
                &garbage,
            ],
            format!("--trusted-ca-file {garbage}: no PEM certificate in the file"),
        ),
        (
            vec!["--cert-file", &cert, "--key-file", &other_key],
            format!("--key-file {other_key} does not match the certificate of --cert-file {cert}"),
        ),
        (
            vec!["--cert-file", &cert],
            format!("--cert-file {cert} needs --key-file"),
        ),
        (
            vec!["--key-file", &key],
            format!("--key-file {key} needs --cert-file"),
        ),
        (
            vec![
                "--cert-file",
                &cert,
                "--key-file",
                &key,
                "--client-cert-auth",
            ],
            "--client-cert-auth needs --trusted-ca-file".to_owned(),
        ),
        (
            vec!["--trusted-ca-file", &ca],
            format!("--trusted-ca-file {ca} needs --cert-file and --key-file"),
        ),
    ];
    for (flags, expected) in cases {
        let output = support::chorus_command(dir.path())
            .args(["serve", "--print-config"])
            .args(&flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{flags:?}: {stderr}");
        assert!(stderr.contains(&expected), "{flags:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{flags:?}: {stderr}");
    }

    let output = support::chorus_command(dir.path())
        .args(["serve", "--print-config", "--listen", "127.0.0.1:7171"])
        .args(pki.server_flags(true))
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let config: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(config["tls"], true, "{config}");
    assert_eq!(config["client_cert_auth"], true, "{config}");
    assert_eq!(config["cert_file"], cert.as_str(), "{config}");
    assert_eq!(config["trusted_ca_file"], ca.as_str(), "{config}");
    assert_eq!(
        config["advertise_url"], "https://127.0.0.1:7171",
        "{config}"
    );
    let output = support::chorus_command(dir.path())
        .args(["serve", "--print-config"])
        .output()
        .unwrap();
    let config: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(config["tls"], false, "{config}");
}
