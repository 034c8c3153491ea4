//! The webhook's serving certificate: read from PEM files (a mounted Secret), and read again
//! when they change, so a rotation (cert-manager, a re-install) needs no restart. A change
//! that does not load (a half-written pair, a key that does not match) keeps the previous
//! certificate and says why.
//!
//! Secrets are mounted through a `..data` symlink that the kubelet swaps atomically, which
//! inotify on the file names does not see: the files are polled instead (a stat of two files
//! every few seconds).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

/// A certificate chain and key file is never this large; bounds what is read.
const MAX_PEM_BYTES: u64 = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: larger than {MAX_PEM_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path}: no PEM certificate in it")]
    NoCertificate { path: PathBuf },
    #[error("{path}: {reason}")]
    BadPem { path: PathBuf, reason: String },
    #[error("{path}: the key cannot be used: {reason}")]
    BadKey { path: PathBuf, reason: String },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Where the pair is, and how often to look for a change.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    let meta = std::fs::metadata(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })?;
    if meta.len() > MAX_PEM_BYTES {
        return Err(TlsError::TooLarge {
            path: path.to_owned(),
        });
    }
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl CertFiles {
    /// Reads and checks the pair: the chain, the key, and that they belong together.
    pub fn load(&self) -> Result<CertifiedKey, TlsError> {
        let pem = read(&self.cert)?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::BadPem {
                path: self.cert.clone(),
                reason: e.to_string(),
            })?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificate {
                path: self.cert.clone(),
            });
        }
        let key =
            PrivateKeyDer::from_pem_slice(&read(&self.key)?).map_err(|e| TlsError::BadPem {
                path: self.key.clone(),
                reason: e.to_string(),
            })?;
        CertifiedKey::from_der(certs, key, &provider()).map_err(|e| TlsError::BadKey {
            path: self.key.clone(),
            reason: e.to_string(),
        })
    }

    /// What identifies the files' current content without reading it: a Secret update
    /// replaces the files (a new inode), a rewrite in place changes the time or the size.
    fn fingerprint(&self) -> Option<[(SystemTime, u64, u64); 2]> {
        use std::os::unix::fs::MetadataExt;
        let one = |p: &Path| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len(), m.ino())))
        };
        Some([one(&self.cert)?, one(&self.key)?])
    }
}

/// Hands every handshake the current certificate.
#[derive(Debug)]
pub struct Reloading {
    files: CertFiles,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files as they were just before the first load: a change after it is seen.
    first_seen: Option<[(SystemTime, u64, u64); 2]>,
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| Arc::clone(&c))
    }
}

/// Counts of reloads, for the metrics.
#[derive(Debug, Default)]
pub struct ReloadCounts {
    pub ok: std::sync::atomic::AtomicU64,
    pub failed: std::sync::atomic::AtomicU64,
}

impl Reloading {
    /// Loads the pair once; an error here stops the webhook from starting.
    pub fn new(files: CertFiles) -> Result<Arc<Self>, TlsError> {
        let first_seen = files.fingerprint();
        let first = files.load()?;
        Ok(Arc::new(Reloading {
            files,
            current: RwLock::new(Arc::new(first)),
            first_seen,
        }))
    }

    /// The rustls server configuration over this resolver: TLS 1.2 and 1.3, HTTP/1.1.
    pub fn server_config(self: &Arc<Self>) -> Result<rustls::ServerConfig, TlsError> {
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>);
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(cfg)
    }

    /// Polls the files every `every` until the task is dropped, swapping in a pair that
    /// loads.
    pub async fn watch(self: Arc<Self>, every: Duration, counts: Arc<ReloadCounts>) {
        use std::sync::atomic::Ordering;
        let mut seen = self.first_seen;
        // A pair caught mid-update (the certificate new, the key not yet) fails to load: it
        // is tried again on every tick until it loads, and reported once per change.
        let mut failed = None;
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = self.files.fingerprint();
            if now == seen || now.is_none() {
                continue;
            }
            match self.files.load() {
                Ok(key) => {
                    seen = now;
                    failed = None;
                    if let Ok(mut c) = self.current.write() {
                        *c = Arc::new(key);
                    }
                    counts.ok.fetch_add(1, Ordering::Relaxed);
                    info!(event = "certificate_reloaded", cert = %self.files.cert.display(), "serving the new certificate");
                }
                Err(e) if failed != now => {
                    failed = now;
                    counts.failed.fetch_add(1, Ordering::Relaxed);
                    warn!(event = "certificate_reload_failed", error = %e, "keeping the previous certificate");
                }
                Err(_) => {}
            }
        }
    }
}
