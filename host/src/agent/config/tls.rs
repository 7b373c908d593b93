//! The agent's `[tls]` block and top-level `region` (Nomad's names): whether the API serves
//! HTTPS, with which files, and whether every caller must present a certificate. Read from
//! the file into [`AgentTls`]; the files themselves are read when the agent starts
//! ([`crate::tls`]).
//!
//! ```toml
//! region = "global"                # names this cluster's certificates: server.global.caravan
//!
//! [tls]
//! http = true                      # serve HTTPS only, and dial other agents over TLS
//! ca_file = "caravan-agent-ca.pem"
//! cert_file = "global-server-caravan.pem"
//! key_file = "global-server-caravan-key.pem"
//! verify_https_client = true       # every caller presents a certificate from the CA
//! ```

use super::{AgentConfig, ConfigError};
use crate::tls::{PemFile, TlsFiles};
use serde::Deserialize;
use std::path::PathBuf;

/// `[tls]`, as the file has it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TlsSection {
    http: Option<bool>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    verify_https_client: Option<bool>,
}

/// TLS on the agent's API and on its calls to other agents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentTls {
    /// The CA, and the agent's certificate and key (always given).
    pub files: TlsFiles,
    /// Whether every caller must present a certificate from the CA (`verify_https_client`);
    /// without it, routes only agents may call still need an agent's certificate.
    pub verify_https_client: bool,
}

/// Whether `text` can be a DNS label, which a region and a node name become in
/// certificates' names: 1 to 63 letters, digits or '-'.
pub fn check_dns_label(text: &str) -> Result<(), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '-';
    if text.is_empty() || text.len() > 63 || !text.chars().all(ok) {
        return Err(format!(
            "{:?} must be 1 to 63 letters, digits or '-' (it goes into a DNS name)",
            crate::util::text::cut(text, 64)
        ));
    }
    Ok(())
}

/// Reads `region` and `[tls]` into `config`. `path` names the file in errors.
pub(super) fn read(
    config: &mut AgentConfig,
    path: &str,
    region: Option<String>,
    section: Option<TlsSection>,
) -> Result<(), ConfigError> {
    let bad = |problem: String| ConfigError::Tls {
        path: path.into(),
        problem,
    };
    if let Some(region) = region {
        check_dns_label(&region).map_err(|problem| bad(format!("region: {problem}")))?;
        config.region = region.to_ascii_lowercase();
    }
    let Some(section) = section else {
        return Ok(());
    };
    if !section.http.unwrap_or(false) {
        config.tls = None;
        return Ok(());
    }
    let required = |key: &str, value: Option<PathBuf>| {
        value
            .map(|file| PemFile::new(&format!("tls.{key}"), file))
            .ok_or_else(|| {
                bad(format!(
                    "tls.{key} is required with tls.http = true (caravan tls ... writes one)"
                ))
            })
    };
    let ca = required("ca_file", section.ca_file)?;
    let cert = required("cert_file", section.cert_file)?;
    let key = required("key_file", section.key_file)?;
    config.tls = Some(AgentTls {
        files: TlsFiles {
            ca,
            identity: Some((cert, key)),
        },
        verify_https_client: section.verify_https_client.unwrap_or(false),
    });
    Ok(())
}
