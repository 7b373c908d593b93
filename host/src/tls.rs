//! TLS for the agents' HTTP API, with rustls: the PEM files an operator names, the
//! configuration an agent serves with, the one every caller of an agent dials with, and the
//! role a peer's certificate gives it.
//!
//! Roles are in certificates' names, as Nomad encodes them and `caravan tls cert create`
//! writes them: `server.REGION.caravan` (an agent), `client.REGION.caravan` (a node in
//! another process, nodesim's), `cli.REGION.caravan` (an operator). A peer is an agent
//! ([`PeerRole::Agent`]) when its certificate, chained to the cluster's CA, is valid for the
//! first or second name of the agent's region; a CLI certificate from the same CA is not
//! (its name is another, and it may not serve), so it cannot pose as one.
//!
//! Agents dial each other by address but check the certificate against
//! `server.REGION.caravan`, not the address (Nomad's `verify_server_hostname`): an agent's
//! certificate need not list every address it is reached at, and a node's certificate
//! cannot answer for an agent. The CLI checks the address it was given, as a browser would.
//!
//! This module reads files and builds rustls configurations; it listens on and dials
//! nothing (the agent's `serve` and [`crate::rpc::transport`] do).

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use std::path::PathBuf;
use std::sync::Arc;

/// The region when none is configured (Nomad's).
pub const DEFAULT_REGION: &str = "global";

/// Why TLS cannot be set up: one line, naming the setting and the file at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting} {}: {problem}", path.display())]
pub struct TlsError {
    /// The setting or flag that names the file (`tls.key_file`, `--ca-cert`).
    pub setting: String,
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub problem: String,
}

/// A PEM file and the setting (or flag) that named it, for errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PemFile {
    /// `tls.cert_file`, `--client-key`, ...
    pub setting: String,
    /// The file.
    pub path: PathBuf,
}

impl PemFile {
    /// The file at `path`, named by `setting`.
    pub fn new(setting: &str, path: impl Into<PathBuf>) -> PemFile {
        PemFile {
            setting: setting.to_string(),
            path: path.into(),
        }
    }

    fn error(&self, problem: impl Into<String>) -> TlsError {
        TlsError {
            setting: self.setting.clone(),
            path: self.path.clone(),
            problem: problem.into(),
        }
    }

    /// The file's bytes, read once and checked to hold certificates (`certificates`) or a
    /// private key (not), for a library that parses PEM itself (etcd's client).
    pub fn checked_bytes(&self, certificates: bool) -> Result<Vec<u8>, TlsError> {
        let bytes = self.read()?;
        if certificates {
            self.parse_certificates(&bytes)?;
        } else {
            self.parse_private_key(&bytes)?;
        }
        Ok(bytes)
    }

    /// The file's bytes: a PEM file is small, so more than this is not one.
    fn read(&self) -> Result<Vec<u8>, TlsError> {
        const MAX_PEM_BYTES: u64 = 1 << 20;
        let file = std::fs::File::open(&self.path).map_err(|e| self.error(e.to_string()))?;
        let mut bytes = Vec::new();
        use std::io::Read;
        file.take(MAX_PEM_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| self.error(e.to_string()))?;
        if bytes.len() as u64 > MAX_PEM_BYTES {
            return Err(self.error("is over 1 MiB: not a PEM file"));
        }
        Ok(bytes)
    }

    /// Every certificate in the file, in order; none is an error.
    pub fn certificates(&self) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        self.parse_certificates(&self.read()?)
    }

    /// The private key in the file.
    pub fn private_key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        self.parse_private_key(&self.read()?)
    }

    fn parse_certificates(&self, bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let certs = CertificateDer::pem_slice_iter(bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.error(format!("not PEM certificates: {e}")))?;
        if certs.is_empty() {
            return Err(self.error("holds no PEM certificate"));
        }
        Ok(certs)
    }

    fn parse_private_key(&self, bytes: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_slice(bytes)
            .map_err(|e| self.error(format!("holds no PEM private key: {e}")))
    }
}

/// The files of one TLS identity: the CA that every peer's certificate chains to, and this
/// side's certificate and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cluster's CA (`tls.ca_file`, `--ca-cert`).
    pub ca: PemFile,
    /// This side's certificate and its key, when it has one.
    pub identity: Option<(PemFile, PemFile)>,
}

/// Installs ring as the process's rustls crypto provider, which reqwest's rustls (the
/// registry client's, the OTLP exporter's) needs before it builds a client. Once is enough;
/// an error means one is installed already, which is as good.
pub fn install_process_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The crypto every configuration here uses: ring, the provider already in the tree.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(ca: &PemFile) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in ca.certificates()? {
        roots
            .add(cert)
            .map_err(|e| ca.error(format!("not a usable CA certificate: {e}")))?;
    }
    Ok(Arc::new(roots))
}

/// A certificate and key, checked to belong together.
fn identity(
    cert: &PemFile,
    key: &PemFile,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let chain = cert.certificates()?;
    let private = key.private_key()?;
    // Checked here rather than left to the handshake: a key that does not match is the
    // operator's mistake, and the agent should not start with it.
    rustls::sign::CertifiedKey::from_der(chain.clone(), private.clone_key(), &provider()).map_err(
        |e| {
            key.error(format!(
                "is not the key of {} {}: {e}",
                cert.setting,
                cert.path.display()
            ))
        },
    )?;
    Ok((chain, private))
}

fn name_for(role: &str, region: &str) -> ServerName<'static> {
    // A region is a DNS label (the config checks it), so the name is always valid.
    ServerName::try_from(format!("{role}.{region}.caravan"))
        .unwrap_or_else(|_| ServerName::try_from("invalid.caravan").expect("a valid name"))
}

/// What a peer's certificate makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRole {
    /// No certificate (TLS without `verify_https_client`), or plain HTTP.
    Anonymous,
    /// A certificate from the cluster's CA that names no agent role of this region: an
    /// operator's CLI certificate, or an agent's of another region.
    Operator,
    /// An agent (`server.REGION.caravan`) or a node (`client.REGION.caravan`).
    Agent,
}

/// How the agent serves TLS, and reads a peer's role off its certificate.
#[derive(Clone)]
pub struct ServeTls {
    /// The rustls configuration the listener accepts with.
    pub config: Arc<ServerConfig>,
    role_check: Arc<WebPkiServerVerifier>,
    agent_names: [ServerName<'static>; 2],
}

impl std::fmt::Debug for ServeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeTls").finish_non_exhaustive()
    }
}

impl ServeTls {
    /// The agent's TLS: its certificate and key (checked to match), peers' certificates
    /// checked against the CA, and required of every connection when `require_client_cert`
    /// (`verify_https_client`); else asked for, and a connection without one is anonymous.
    pub fn new(
        files: &TlsFiles,
        region: &str,
        require_client_cert: bool,
    ) -> Result<ServeTls, TlsError> {
        let roots = roots(&files.ca)?;
        let Some((cert, key)) = &files.identity else {
            return Err(files
                .ca
                .error("an agent serving TLS needs tls.cert_file and tls.key_file too"));
        };
        let (chain, private) = identity(cert, key)?;
        let clients = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider());
        let clients = if require_client_cert {
            clients
        } else {
            clients.allow_unauthenticated()
        };
        let clients = clients.build().map_err(|e| {
            files
                .ca
                .error(format!("cannot check client certificates with it: {e}"))
        })?;
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| cert.error(e.to_string()))?
            .with_client_cert_verifier(clients)
            .with_single_cert(chain, private)
            .map_err(|e| {
                key.error(format!(
                    "is not usable with {} {}: {e}",
                    cert.setting,
                    cert.path.display()
                ))
            })?;
        // HTTP/2 first for a caller that offers it (nodesim's nodes share connections so),
        // HTTP/1.1 for the rest: both are served on one port.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let role_check = WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| files.ca.error(e.to_string()))?;
        Ok(ServeTls {
            config: Arc::new(config),
            role_check,
            agent_names: [name_for("server", region), name_for("client", region)],
        })
    }

    /// The role of the peer that presented `chain` (leaf first), already verified against
    /// the CA by the handshake: an agent when its certificate is valid for an agent's name of
    /// this region, else an operator.
    pub fn role_of(&self, chain: Option<&[CertificateDer<'_>]>) -> PeerRole {
        let Some((leaf, intermediates)) = chain.and_then(|c| c.split_first()) else {
            return PeerRole::Anonymous;
        };
        let now = UnixTime::now();
        let agent = self.agent_names.iter().any(|name| {
            self.role_check
                .verify_server_cert(leaf, intermediates, name, &[], now)
                .is_ok()
        });
        if agent {
            PeerRole::Agent
        } else {
            PeerRole::Operator
        }
    }
}

/// Which name a dialled agent's certificate must be valid for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// The host of the address dialled (the CLI's).
    AddressHost,
    /// `server.REGION.caravan`, whatever the address (an agent's or a node's).
    AgentOf(String),
}

/// The rustls configuration callers of an agent dial with: the CA, the name expected, and
/// this side's certificate when it has one.
pub fn dial_config(files: &TlsFiles, expect: &Expect) -> Result<Arc<ClientConfig>, TlsError> {
    let roots = roots(&files.ca)?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| files.ca.error(e.to_string()))?;
    let builder = match expect {
        Expect::AddressHost => builder.with_root_certificates(roots),
        Expect::AgentOf(region) => {
            let inner = WebPkiServerVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| files.ca.error(e.to_string()))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AgentNameVerifier {
                    inner,
                    name: name_for("server", region),
                }))
        }
    };
    let config = match &files.identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let (chain, private) = identity(cert, key)?;
            builder
                .with_client_auth_cert(chain, private)
                .map_err(|e| key.error(e.to_string()))?
        }
    };
    // No ALPN here: the connector offers the protocols it speaks (HTTP/1.1).
    Ok(Arc::new(config))
}

/// Checks a dialled agent's certificate against the CA and an agent's name, not the address
/// dialled: the whole of rustls' WebPKI check, with another name.
#[derive(Debug)]
struct AgentNameVerifier {
    inner: Arc<WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for AgentNameVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, signature)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, signature)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A configuration that trusts no one: for a pool that dials plain HTTP only, whose
/// connector must still have one. Built once per process: every plain pool shares it.
pub fn plain_only_dial_config() -> Arc<ClientConfig> {
    static TRUSTS_NO_ONE: std::sync::OnceLock<Arc<ClientConfig>> = std::sync::OnceLock::new();
    TRUSTS_NO_ONE
        .get_or_init(|| {
            let config = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map(|b| {
                    b.with_root_certificates(RootCertStore::empty())
                        .with_no_client_auth()
                });
            // ring's defaults always include the safe versions.
            Arc::new(config.expect("ring supports TLS 1.2 and 1.3"))
        })
        .clone()
}
