//! TLS for the service's listeners, as etcd configures its client
//! listener: the certificate and key the server presents (`--cert-file`,
//! `--key-file`), and the CA that must have signed the certificate every
//! client presents (`--trusted-ca-file`).
//!
//! The files are read and checked once, at start-up ([`TlsMaterial::load`]):
//! each error names the flag and the file. The same material serves the
//! HTTP listener ([`TlsMaterial::server_config`]) and the etcd listener
//! (whose gRPC server takes the PEM text).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls::crypto::{CryptoProvider, aws_lc_rs};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};

/// The ALPN protocol of the HTTP listener, which speaks HTTP/1.1 only.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Where the TLS files are, as the flags name them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain the server presents, its own certificate first.
    pub cert_file: PathBuf,
    /// PEM private key of that certificate (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM certificates of the CA(s) that sign client certificates; when
    /// set, every client must present a certificate signed by one of them.
    pub trusted_ca_file: Option<PathBuf>,
}

/// A TLS file that cannot be used; each names its flag and its file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file cannot be read (missing, a directory, no permission).
    #[error("{flag} {}: cannot read: {source}", path.display())]
    Unreadable {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it cannot be read.
        source: io::Error,
    },
    /// The file holds no PEM block of the kind the flag wants.
    #[error("{flag} {}: no PEM {what} in the file", path.display())]
    NotPem {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What the file should hold ("certificate", "private key").
        what: &'static str,
    },
    /// A certificate or key that rustls refuses.
    #[error("{flag} {}: {problem}", path.display())]
    Invalid {
        /// The flag naming the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The key is not the key of the certificate.
    #[error(
        "--key-file {} does not match the certificate of --cert-file {}",
        key.display(),
        cert.display()
    )]
    KeyMismatch {
        /// The key file.
        key: PathBuf,
        /// The certificate file.
        cert: PathBuf,
    },
}

/// The checked contents of the TLS files (its `Debug` shows the files,
/// never the key).
pub struct TlsMaterial {
    files: TlsFiles,
    certificate_pem: Vec<u8>,
    key_pem: Vec<u8>,
    trusted_ca_pem: Option<Vec<u8>>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_roots: Option<Arc<RootCertStore>>,
}

impl TlsMaterial {
    /// Reads and checks the files: each holds PEM of its kind, the key is
    /// the certificate's, the CA file holds usable CA certificates.
    pub fn load(files: &TlsFiles) -> Result<TlsMaterial, TlsError> {
        install_crypto_provider();
        let certificate_pem = read("--cert-file", &files.cert_file)?;
        let chain = certificates("--cert-file", &files.cert_file, &certificate_pem)?;
        let key_pem = read("--key-file", &files.key_file)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| TlsError::NotPem {
            flag: "--key-file",
            path: files.key_file.clone(),
            what: "private key",
        })?;
        let (trusted_ca_pem, client_roots) = match &files.trusted_ca_file {
            None => (None, None),
            Some(path) => {
                let pem = read("--trusted-ca-file", path)?;
                let roots = client_roots(path, &pem)?;
                (Some(pem), Some(roots))
            }
        };
        let material = TlsMaterial {
            files: files.clone(),
            certificate_pem,
            key_pem,
            trusted_ca_pem,
            chain,
            key,
            client_roots,
        };
        // Building a configuration checks the key against the certificate.
        material.server_config(&[])?;
        Ok(material)
    }

    /// A server configuration on this material offering `alpn` (most
    /// preferred first); clients must present a certificate signed by the
    /// trusted CA when there is one.
    pub fn server_config(&self, alpn: &[&[u8]]) -> Result<Arc<ServerConfig>, TlsError> {
        let provider = Arc::new(aws_lc_rs::default_provider());
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| self.invalid_certificate(e))?;
        let builder = match &self.client_roots {
            None => builder.with_no_client_auth(),
            Some(roots) => {
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::clone(roots), provider)
                        .build()
                        .map_err(|e| TlsError::Invalid {
                            flag: "--trusted-ca-file",
                            path: self.files.trusted_ca_file.clone().unwrap_or_default(),
                            problem: e.to_string(),
                        })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| match e {
                rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch {
                    key: self.files.key_file.clone(),
                    cert: self.files.cert_file.clone(),
                },
                other => TlsError::Invalid {
                    flag: "--key-file",
                    path: self.files.key_file.clone(),
                    problem: other.to_string(),
                },
            })?;
        config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
        Ok(Arc::new(config))
    }

    /// The files this material was read from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The certificate file's PEM text.
    pub fn certificate_pem(&self) -> &[u8] {
        &self.certificate_pem
    }

    /// The key file's PEM text.
    pub fn key_pem(&self) -> &[u8] {
        &self.key_pem
    }

    /// The trusted CA file's PEM text, if client certificates are required.
    pub fn trusted_ca_pem(&self) -> Option<&[u8]> {
        self.trusted_ca_pem.as_deref()
    }

    /// Whether every client must present a certificate.
    pub fn requires_client_certificates(&self) -> bool {
        self.client_roots.is_some()
    }

    fn invalid_certificate(&self, error: rustls::Error) -> TlsError {
        TlsError::Invalid {
            flag: "--cert-file",
            path: self.files.cert_file.clone(),
            problem: error.to_string(),
        }
    }
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("files", &self.files)
            .field("certificates", &self.chain.len())
            .field(
                "requires_client_certificates",
                &self.requires_client_certificates(),
            )
            .finish_non_exhaustive()
    }
}

/// Makes aws-lc-rs the process's rustls provider, so that rustls
/// configurations built without naming one (the gRPC server's) use the
/// backend the process already links; a provider installed earlier stays.
pub fn install_crypto_provider() {
    let _ = CryptoProvider::install_default(aws_lc_rs::default_provider());
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Unreadable {
        flag,
        path: path.to_owned(),
        source,
    })
}

/// Every PEM certificate in `pem`, at least one.
fn certificates(
    flag: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let not_pem = || TlsError::NotPem {
        flag,
        path: path.to_owned(),
        what: "certificate",
    };
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| not_pem())?;
    if chain.is_empty() {
        return Err(not_pem());
    }
    Ok(chain)
}

/// The trust anchors of the CA file: every certificate in it must be one.
fn client_roots(path: &Path, pem: &[u8]) -> Result<Arc<RootCertStore>, TlsError> {
    let flag = "--trusted-ca-file";
    let mut roots = RootCertStore::empty();
    for certificate in certificates(flag, path, pem)? {
        roots.add(certificate).map_err(|e| TlsError::Invalid {
            flag,
            path: path.to_owned(),
            problem: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(Arc::new(roots))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Pki {
        dir: PathBuf,
        ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    }

    impl Pki {
        fn new(name: &str) -> Pki {
            let dir =
                std::env::temp_dir().join(format!("chorus-tls-unit-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            let ca =
                rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
                    .unwrap();
            Pki { dir, ca }
        }

        fn write(&self, name: &str, contents: &[u8]) -> PathBuf {
            let path = self.dir.join(name);
            std::fs::write(&path, contents).unwrap();
            path
        }

        /// A server certificate and its key, written; their paths.
        fn server(&self, name: &str) -> (PathBuf, PathBuf) {
            let key = rcgen::KeyPair::generate().unwrap();
            let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
            let certificate = params.signed_by(&key, &*self.ca).unwrap();
            (
                self.write(&format!("{name}.pem"), certificate.pem().as_bytes()),
                self.write(&format!("{name}.key"), key.serialize_pem().as_bytes()),
            )
        }

        fn ca_file(&self) -> PathBuf {
            self.write("ca.pem", self.ca.pem().as_bytes())
        }
    }

    impl Drop for Pki {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn files(cert: &Path, key: &Path, ca: Option<&Path>) -> TlsFiles {
        TlsFiles {
            cert_file: cert.to_owned(),
            key_file: key.to_owned(),
            trusted_ca_file: ca.map(Path::to_owned),
        }
    }

    #[test]
    fn matching_files_load_with_and_without_a_client_ca() {
        let pki = Pki::new("good");
        let (cert, key) = pki.server("server");
        let plain = TlsMaterial::load(&files(&cert, &key, None)).unwrap();
        let shown = format!("{plain:?}");
        assert!(
            !shown.contains("PRIVATE KEY") && shown.contains("server.key"),
            "{shown}"
        );
        assert!(!plain.requires_client_certificates());
        assert!(plain.trusted_ca_pem().is_none());
        let ca = pki.ca_file();
        let mutual = TlsMaterial::load(&files(&cert, &key, Some(&ca))).unwrap();
        assert!(mutual.requires_client_certificates());
        let config = mutual.server_config(&[ALPN_HTTP1]).unwrap();
        assert_eq!(config.alpn_protocols, vec![ALPN_HTTP1.to_vec()]);
    }

    #[test]
    fn each_unusable_file_is_named_with_its_flag() {
        let pki = Pki::new("bad");
        let (cert, key) = pki.server("server");
        let (_, other_key) = pki.server("other");
        let garbage = pki.write("garbage.pem", b"not pem at all\n");
        let missing = pki.dir.join("missing.pem");
        let message = |files: TlsFiles| TlsMaterial::load(&files).unwrap_err().to_string();

        let error = message(files(&missing, &key, None));
        assert!(error.starts_with("--cert-file "), "{error}");
        assert!(error.contains("missing.pem: cannot read"), "{error}");
        let error = message(files(&cert, &missing, None));
        assert!(error.starts_with("--key-file "), "{error}");
        let error = message(files(&cert, &key, Some(&missing)));
        assert!(error.starts_with("--trusted-ca-file "), "{error}");
        assert!(error.contains("cannot read"), "{error}");

        let error = message(files(&garbage, &key, None));
        assert!(
            error.ends_with("garbage.pem: no PEM certificate in the file"),
            "{error}"
        );
        assert!(error.starts_with("--cert-file "), "{error}");
        let error = message(files(&cert, &garbage, None));
        assert!(
            error.ends_with("garbage.pem: no PEM private key in the file"),
            "{error}"
        );
        assert!(error.starts_with("--key-file "), "{error}");
        // A certificate where the key belongs is no key either.
        let error = message(files(&cert, &cert, None));
        assert!(error.contains("no PEM private key"), "{error}");
        let error = message(files(&cert, &key, Some(&garbage)));
        assert!(error.starts_with("--trusted-ca-file "), "{error}");
        assert!(error.contains("no PEM certificate"), "{error}");

        let error = message(files(&cert, &other_key, None));
        assert!(error.starts_with("--key-file "), "{error}");
        assert!(
            error.contains("other.key does not match the certificate of --cert-file"),
            "{error}"
        );
        assert!(error.ends_with("server.pem"), "{error}");
    }
}
