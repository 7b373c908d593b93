//! A cluster's certificates for the TLS tests, made in-process with the functions behind
//! `caravan tls` (tests of the command itself are in `tls_cli`), and the odd ones that
//! command will not make: an expired certificate, and a CA the cluster does not trust.

use caravan_host::cli::tls::{CertRequest, Role, create_ca, create_cert};
use caravan_host::rpc::transport::AgentPool;
use caravan_host::tls::{Expect, PemFile, TlsFiles, dial_config};
use std::path::{Path, PathBuf};

/// A CA and the certificates made from it, as files in a temporary directory.
pub struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
    ca_key_pem: String,
    /// The CA's certificate file.
    pub ca: PathBuf,
}

/// A certificate file and its key's.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The certificate.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

impl Pki {
    /// A new CA, named `name` in its file.
    pub fn new(name: &str) -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let (ca_pem, ca_key_pem) = create_ca(&format!("Caravan test CA {name}"), 30).unwrap();
        let ca = dir.path().join(format!("{name}-ca.pem"));
        std::fs::write(&ca, &ca_pem).unwrap();
        Pki {
            dir,
            ca_pem,
            ca_key_pem,
            ca,
        }
    }

    fn write(&self, name: &str, cert: &str, key: &str) -> Identity {
        let identity = Identity {
            cert: self.dir.path().join(format!("{name}.pem")),
            key: self.dir.path().join(format!("{name}-key.pem")),
        };
        std::fs::write(&identity.cert, cert).unwrap();
        std::fs::write(&identity.key, key).unwrap();
        identity
    }

    /// A certificate of `role` in region `global`, valid for 127.0.0.1, written as `name`.
    pub fn issue(&self, role: Role, name: &str) -> Identity {
        self.issue_in_region(role, "global", name)
    }

    /// A certificate of `role` in `region`, valid for 127.0.0.1, written as `name`.
    pub fn issue_in_region(&self, role: Role, region: &str, name: &str) -> Identity {
        self.issue_full(role, region, name, &[])
    }

    /// A certificate of `role` in region `global`, valid for 127.0.0.1 and `ips` (a host's
    /// addresses, which callers that check the address need), written as `name`.
    pub fn issue_for_ips(&self, role: Role, name: &str, ips: &[std::net::IpAddr]) -> Identity {
        self.issue_full(role, "global", name, ips)
    }

    fn issue_full(
        &self,
        role: Role,
        region: &str,
        name: &str,
        ips: &[std::net::IpAddr],
    ) -> Identity {
        let request = CertRequest {
            role,
            region: region.into(),
            node: None,
            dns_names: Vec::new(),
            ip_addresses: ips.to_vec(),
            days: 1,
        };
        let (cert, key) = create_cert(&self.ca_pem, &self.ca_key_pem, &request).unwrap();
        self.write(name, &cert, &key)
    }

    /// A CLI certificate whose lifetime ended yesterday.
    pub fn issue_expired(&self, name: &str) -> Identity {
        let ca_key = rcgen::KeyPair::from_pem(&self.ca_key_pem).unwrap();
        let issuer = rcgen::Issuer::from_ca_cert_pem(&self.ca_pem, ca_key).unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["cli.global.caravan".into()]).unwrap();
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let now = rcgen::date_time_ymd(1970, 1, 1) + since_epoch;
        params.not_before = now - std::time::Duration::from_secs(2 * 86_400);
        params.not_after = now - std::time::Duration::from_secs(86_400);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        self.write(name, &cert.pem(), &key.serialize_pem())
    }

    /// The `[tls]` block of an agent serving `server`'s certificate.
    pub fn agent_config(&self, server: &Identity, verify_https_client: bool) -> String {
        format!(
            "[tls]\nhttp = true\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\nverify_https_client = {verify_https_client}\n",
            self.ca, server.cert, server.key
        )
    }

    /// A pool that trusts this CA, checks the address's host, and presents `identity`.
    pub fn pool(&self, identity: Option<&Identity>) -> AgentPool {
        pool_trusting(&self.ca, identity)
    }

    /// The CLI's variables for this CA and `identity` (Nomad's names).
    pub fn cli_env(&self, identity: &Identity) -> Vec<(String, String)> {
        vec![
            ("CARAVAN_CACERT".into(), path_text(&self.ca)),
            ("CARAVAN_CLIENT_CERT".into(), path_text(&identity.cert)),
            ("CARAVAN_CLIENT_KEY".into(), path_text(&identity.key)),
        ]
    }

    /// The `[cluster]` keys of an agent reaching a secured etcd as `identity`, user
    /// `caravan` with the password in `password_file`.
    pub fn etcd_keys(&self, identity: &Identity, password_file: &Path) -> String {
        format!(
            "etcd_ca_file = {:?}\netcd_cert_file = {:?}\netcd_key_file = {:?}\n\
             etcd_username = \"caravan\"\netcd_password_file = {password_file:?}\n",
            self.ca, identity.cert, identity.key
        )
    }

    /// The CLI's flags for this CA and `identity`.
    pub fn cli_flags(&self, identity: Option<&Identity>) -> Vec<String> {
        let mut flags = vec!["--ca-cert".to_string(), path_text(&self.ca)];
        if let Some(identity) = identity {
            flags.extend([
                "--client-cert".into(),
                path_text(&identity.cert),
                "--client-key".into(),
                path_text(&identity.key),
            ]);
        }
        flags
    }
}

/// A pool that trusts `ca` (of any PKI), checks the address's host, and presents `identity`.
pub fn pool_trusting(ca: &Path, identity: Option<&Identity>) -> AgentPool {
    let files = TlsFiles {
        ca: PemFile::new("ca", ca),
        identity: identity.map(|i| (PemFile::new("cert", &i.cert), PemFile::new("key", &i.key))),
    };
    AgentPool::with_tls(dial_config(&files, &Expect::AddressHost).unwrap())
}

fn path_text(path: &Path) -> String {
    path.to_str().unwrap().to_string()
}
