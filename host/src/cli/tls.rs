//! `caravan tls ...`: a certificate authority and certificates for a cluster, as `nomad tls`
//! makes them (issue 42, part 5).
//!
//! - `caravan tls ca create` writes `caravan-agent-ca.pem` and `caravan-agent-ca-key.pem`.
//! - `caravan tls cert create --server|--client|--cli` writes `REGION-ROLE-caravan.pem` and
//!   its key, signed by that CA. The role and region are in the certificate's name, as
//!   Nomad encodes them: `server.global.caravan` (an agent that schedules and serves),
//!   `client.global.caravan` (a node), `cli.global.caravan` (an operator's laptop), so a
//!   peer that requires an agent's role can refuse a CLI certificate from the same CA.
//!
//! Lifetimes are Nomad's: five years for the CA, one year for a certificate. Keys are ECDSA
//! P-256, written readable by their owner only. Nothing is overwritten: a file that exists
//! is an error naming it, and nothing is written then.
//!
//! It only writes files; loading them is the agent's.

use anyhow::{Context, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The CA's files, in the current directory unless named.
pub const CA_FILE: &str = "caravan-agent-ca.pem";
/// The CA's key.
pub const CA_KEY_FILE: &str = "caravan-agent-ca-key.pem";
/// A CA's lifetime, in days (Nomad's default).
const CA_DAYS: u32 = 1825;
/// A certificate's lifetime, in days (Nomad's default).
const CERT_DAYS: u32 = 365;
/// The longest lifetime either may be given: ten years.
const MAX_DAYS: u32 = 3650;

/// `caravan tls`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum TlsCommand {
    /// The cluster's certificate authority.
    Ca {
        /// What to do with it.
        #[command(subcommand)]
        command: CaCommand,
    },
    /// Certificates signed by the cluster's CA.
    Cert {
        /// What to do with them.
        #[command(subcommand)]
        command: CertCommand,
    },
}

/// `caravan tls ca ...`.
#[derive(Debug, clap::Subcommand)]
pub enum CaCommand {
    /// Write a new CA: caravan-agent-ca.pem and caravan-agent-ca-key.pem.
    Create {
        /// Its lifetime, in days.
        #[arg(long, default_value_t = CA_DAYS)]
        days: u32,
        /// Its name.
        #[arg(long, default_value = "Caravan Agent CA")]
        common_name: String,
        /// The directory to write into.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
}

/// `caravan tls cert ...`.
#[derive(Debug, clap::Subcommand)]
pub enum CertCommand {
    /// Write a certificate and its key for an agent (--server), a node (--client) or an
    /// operator (--cli), signed by the CA.
    Create {
        /// For an agent that schedules and serves the API: server.REGION.caravan.
        #[arg(long, group = "role")]
        server: bool,
        /// For a node: client.REGION.caravan.
        #[arg(long, group = "role")]
        client: bool,
        /// For an operator's CLI: cli.REGION.caravan (client authentication only).
        #[arg(long, group = "role")]
        cli: bool,
        /// The region the role is in.
        #[arg(long, default_value = "global")]
        region: String,
        /// The node's name, added as a DNS name (`NAME.REGION.caravan` too).
        #[arg(long)]
        node: Option<String>,
        /// More DNS names (repeat it).
        #[arg(long = "additional-dnsname", value_name = "NAME")]
        dns_names: Vec<String>,
        /// More IP addresses (repeat it).
        #[arg(long = "additional-ipaddress", value_name = "IP")]
        ip_addresses: Vec<IpAddr>,
        /// The CA's certificate.
        #[arg(long, default_value = CA_FILE)]
        ca: PathBuf,
        /// The CA's key.
        #[arg(long, default_value = CA_KEY_FILE)]
        key: PathBuf,
        /// Its lifetime, in days.
        #[arg(long, default_value_t = CERT_DAYS)]
        days: u32,
        /// The directory to write into.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
}

/// Which certificate: the role encoded in its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// An agent that schedules and serves: server and client authentication.
    Server,
    /// A node: server and client authentication (a node's agent serves its allocs).
    Client,
    /// An operator: client authentication only.
    Cli,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Client => "client",
            Role::Cli => "cli",
        }
    }
}

impl TlsCommand {
    /// Runs the subcommand: files written and named on stdout, or an error naming the file.
    pub fn execute(self) -> anyhow::Result<ExitCode> {
        match self {
            TlsCommand::Ca {
                command:
                    CaCommand::Create {
                        days,
                        common_name,
                        dir,
                    },
            } => {
                let (cert, key) = create_ca(&common_name, days)?;
                let written =
                    write_new(&dir, &[(CA_FILE, &cert, false), (CA_KEY_FILE, &key, true)])?;
                for path in written {
                    println!("==> wrote {}", path.display());
                }
            }
            TlsCommand::Cert {
                command:
                    CertCommand::Create {
                        server,
                        client,
                        cli,
                        region,
                        node,
                        dns_names,
                        ip_addresses,
                        ca,
                        key,
                        days,
                        dir,
                    },
            } => {
                let role = match (server, client, cli) {
                    (true, _, _) => Role::Server,
                    (_, true, _) => Role::Client,
                    (_, _, true) => Role::Cli,
                    _ => bail!("say which certificate: --server, --client or --cli"),
                };
                let read = |path: &Path| {
                    std::fs::read_to_string(path)
                        .with_context(|| format!("cannot read {}", path.display()))
                };
                let request = CertRequest {
                    role,
                    region,
                    node,
                    dns_names,
                    ip_addresses,
                    days,
                };
                let (cert, cert_key) = create_cert(&read(&ca)?, &read(&key)?, &request)?;
                let base = format!("{}-{}-caravan", request.region, role.name());
                let (cert_file, key_file) = (format!("{base}.pem"), format!("{base}-key.pem"));
                let written = write_new(
                    &dir,
                    &[(&cert_file, &cert, false), (&key_file, &cert_key, true)],
                )?;
                for path in written {
                    println!("==> wrote {}", path.display());
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// A new CA, as PEM: its certificate and its key.
pub fn create_ca(common_name: &str, days: u32) -> anyhow::Result<(String, String)> {
    check_days(days)?;
    let key = KeyPair::generate().context("cannot make a key")?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_lifetime(&mut params, days);
    let cert = params
        .self_signed(&key)
        .context("cannot sign the CA's certificate")?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// What a certificate is for.
#[derive(Debug, Clone)]
pub struct CertRequest {
    /// Its role.
    pub role: Role,
    /// Its region (`global`).
    pub region: String,
    /// The node it is for, if any.
    pub node: Option<String>,
    /// More DNS names.
    pub dns_names: Vec<String>,
    /// More IP addresses.
    pub ip_addresses: Vec<IpAddr>,
    /// Its lifetime, in days.
    pub days: u32,
}

/// A certificate for `request`, signed by the CA whose certificate and key are `ca_pem` and
/// `ca_key_pem`, as PEM: its certificate and its key.
pub fn create_cert(
    ca_pem: &str,
    ca_key_pem: &str,
    request: &CertRequest,
) -> anyhow::Result<(String, String)> {
    check_days(request.days)?;
    check_label("--region", &request.region)?;
    let ca_key = KeyPair::from_pem(ca_key_pem).context("the CA key is not a PEM private key")?;
    let issuer = Issuer::from_ca_cert_pem(ca_pem, ca_key)
        .context("the CA certificate is not a PEM certificate")?;
    let role_name = format!("{}.{}.caravan", request.role.name(), request.region);
    let mut names = vec![role_name.clone(), "localhost".to_string()];
    if let Some(node) = &request.node {
        check_label("--node", node)?;
        names.push(node.clone());
        names.push(format!("{node}.{}.caravan", request.region));
    }
    names.extend(request.dns_names.iter().cloned());
    let mut params = CertificateParams::new(names).context("a DNS name is not valid")?;
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::from([127, 0, 0, 1])));
    params.subject_alt_names.extend(
        request
            .ip_addresses
            .iter()
            .map(|ip| SanType::IpAddress(*ip)),
    );
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, role_name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = match request.role {
        Role::Server | Role::Client => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        Role::Cli => vec![ExtendedKeyUsagePurpose::ClientAuth],
    };
    set_lifetime(&mut params, request.days);
    let key = KeyPair::generate().context("cannot make a key")?;
    let cert = params
        .signed_by(&key, &issuer)
        .context("cannot sign the certificate")?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn check_days(days: u32) -> anyhow::Result<()> {
    if !(1..=MAX_DAYS).contains(&days) {
        bail!("--days: {days} is out of range; expected 1 to {MAX_DAYS}");
    }
    Ok(())
}

/// A region or node name, as it goes into a DNS name.
fn check_label(flag: &str, text: &str) -> anyhow::Result<()> {
    crate::agent::config::tls::check_dns_label(text)
        .map_err(|problem| anyhow::anyhow!("{flag}: {problem}"))
}

fn set_lifetime(params: &mut CertificateParams, days: u32) {
    let now = rcgen::date_time_ymd(1970, 1, 1)
        + std::time::Duration::from_secs(crate::util::timestamp::unix_ms_now() / 1000);
    // A minute back: a peer whose clock is a little behind still takes it.
    params.not_before = now - std::time::Duration::from_secs(60);
    params.not_after = now + std::time::Duration::from_secs(u64::from(days) * 86_400);
}

/// Writes each `(name, text, secret)` under `dir`, refusing (before writing any) when one
/// exists; secrets are readable by their owner only. Returns the paths written.
fn write_new(dir: &Path, files: &[(&str, &str, bool)]) -> anyhow::Result<Vec<PathBuf>> {
    let paths: Vec<PathBuf> = files.iter().map(|(name, _, _)| dir.join(name)).collect();
    if let Some(existing) = paths.iter().find(|path| path.exists()) {
        bail!(
            "{} exists; move it away or write elsewhere with --dir (nothing was written)",
            existing.display()
        );
    }
    for (path, (_, text, secret)) in paths.iter().zip(files) {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let mode = if *secret { 0o600 } else { 0o644 };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        file.write_all(text.as_bytes())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier as _;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

    fn request(role: Role) -> CertRequest {
        CertRequest {
            role,
            region: "global".into(),
            node: Some("node-1".into()),
            dns_names: vec!["agent.internal".into()],
            ip_addresses: vec!["10.0.0.11".parse().unwrap()],
            days: 30,
        }
    }

    /// Whether rustls, trusting only `ca`, takes `cert` as a server's for `name`.
    fn verified_as_server(ca: &str, cert: &str, name: &str) -> Result<(), rustls::Error> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
            .unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
                .build()
                .unwrap();
        let leaf = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
        verifier
            .verify_server_cert(
                &leaf,
                &[],
                &ServerName::try_from(name.to_string()).unwrap(),
                &[],
                UnixTime::now(),
            )
            .map(|_| ())
    }

    #[test]
    fn a_server_certificate_from_the_ca_is_trusted_for_its_role_and_names_only() {
        let (ca, ca_key) = create_ca("Caravan Agent CA", 30).unwrap();
        let (cert, key) = create_cert(&ca, &ca_key, &request(Role::Server)).unwrap();
        assert!(key.contains("PRIVATE KEY"));
        for name in [
            "server.global.caravan",
            "node-1",
            "node-1.global.caravan",
            "agent.internal",
            "localhost",
            "10.0.0.11",
            "127.0.0.1",
        ] {
            assert_eq!(verified_as_server(&ca, &cert, name), Ok(()), "{name}");
        }
        assert!(verified_as_server(&ca, &cert, "client.global.caravan").is_err());
        let (other_ca, _) = create_ca("Another CA", 30).unwrap();
        assert!(
            verified_as_server(&other_ca, &cert, "server.global.caravan").is_err(),
            "another CA's trust does not take it"
        );
        let (cli, _) = create_cert(&ca, &ca_key, &request(Role::Cli)).unwrap();
        assert!(
            verified_as_server(&ca, &cli, "cli.global.caravan").is_err(),
            "a CLI certificate cannot serve"
        );
    }

    #[test]
    fn bad_requests_and_existing_files_are_refused_in_one_line() {
        let (ca, ca_key) = create_ca("CA", 30).unwrap();
        let bad_region = CertRequest {
            region: "glo bal".into(),
            ..request(Role::Client)
        };
        let refused = create_cert(&ca, &ca_key, &bad_region)
            .unwrap_err()
            .to_string();
        assert!(refused.starts_with("--region: \"glo bal\""), "{refused}");
        assert!(create_ca("CA", 0).is_err());
        assert!(create_cert("not a cert", &ca_key, &request(Role::Client)).is_err());

        let dir = tempfile::tempdir().unwrap();
        let written = write_new(
            dir.path(),
            &[("a.pem", "A", false), ("a-key.pem", "K", true)],
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&written[1]).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "a key is its owner's only");
        let again = write_new(
            dir.path(),
            &[("b.pem", "B", false), ("a-key.pem", "K", true)],
        );
        assert!(again.unwrap_err().to_string().contains("a-key.pem exists"));
        assert!(
            !dir.path().join("b.pem").exists(),
            "nothing written on a refusal"
        );
    }
}
