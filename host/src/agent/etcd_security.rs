//! `[cluster]`'s keys for reaching a secured etcd: TLS (`etcd_ca_file`, and
//! `etcd_cert_file`/`etcd_key_file` for members run with `--client-cert-auth`) and an etcd
//! user (`etcd_username`, its password from `etcd_password_file` or `CARAVAN_ETCD_PASSWORD`,
//! never logged). Checked with the rest of `[cluster]`; the files are read when the agent
//! joins ([`EtcdSecurity::access`]), each error one line naming the key and the file.

use crate::cluster::{EtcdAccess, EtcdTls};
use crate::tls::PemFile;
use std::path::PathBuf;

/// The environment variable an etcd password may come from, as an alternative to a file.
pub const PASSWORD_ENV: &str = "CARAVAN_ETCD_PASSWORD";

/// The settings as given, each file named by its key (`agent.toml: cluster.etcd_ca_file`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdSecurity {
    pub(super) ca: Option<PemFile>,
    pub(super) cert: Option<PemFile>,
    pub(super) key: Option<PemFile>,
    pub(super) username: Option<(String, String)>,
    pub(super) password_file: Option<(PathBuf, String)>,
    /// Given as `caravan nodesim`'s flags rather than `[cluster]` keys: messages name those.
    pub(super) as_flags: bool,
}

impl EtcdSecurity {
    /// The settings as `caravan nodesim`'s flags give them (`--etcd-ca-file`, ...).
    pub fn from_flags(
        (ca, cert, key): (Option<PathBuf>, Option<PathBuf>, Option<PathBuf>),
        username: Option<String>,
        password_file: Option<PathBuf>,
    ) -> EtcdSecurity {
        let file = |flag: &str, path: Option<PathBuf>| path.map(|p| PemFile::new(flag, p));
        EtcdSecurity {
            ca: file("--etcd-ca-file", ca),
            cert: file("--etcd-cert-file", cert),
            key: file("--etcd-key-file", key),
            username: username.map(|name| (name, "--etcd-username".into())),
            password_file: password_file.map(|path| (path, "--etcd-password-file".into())),
            as_flags: true,
        }
    }

    /// How a setting is named where it was given: `cluster.etcd_ca_file` or `--etcd-ca-file`.
    fn name(&self, key: &str) -> String {
        if self.as_flags {
            format!("--etcd-{}", key.replace('_', "-"))
        } else {
            format!("cluster.etcd_{key}")
        }
    }

    /// Whether the settings agree with each other and with `endpoints` (named by `at`): TLS
    /// for `https://` endpoints only, a certificate with its key, a password with a user.
    pub fn check(&self, endpoints: &[String], at: &str) -> Result<(), String> {
        match (&self.cert, &self.key) {
            (Some(cert), None) => {
                return Err(format!(
                    "{}: needs {} too",
                    cert.setting,
                    self.name("key_file")
                ));
            }
            (None, Some(key)) => {
                return Err(format!(
                    "{}: needs {} too",
                    key.setting,
                    self.name("cert_file")
                ));
            }
            _ => {}
        }
        if let (Some(cert), None) = (&self.cert, &self.ca) {
            return Err(format!(
                "{}: needs {}, to check etcd's certificate with",
                cert.setting,
                self.name("ca_file")
            ));
        }
        let https = endpoints
            .iter()
            .filter(|e| e.starts_with("https://"))
            .count();
        match &self.ca {
            None if https > 0 => {
                return Err(format!(
                    "{at}: https:// endpoints need {} (the CA etcd's certificates chain to)",
                    self.name("ca_file")
                ));
            }
            Some(ca) if https < endpoints.len() => {
                return Err(format!(
                    "{}: given, but not every endpoint of {at} is https://",
                    ca.setting
                ));
            }
            _ => {}
        }
        if let (Some((_, at)), None) = (&self.password_file, &self.username) {
            return Err(format!("{at}: needs {}", self.name("username")));
        }
        Ok(())
    }

    /// What the agent connects to etcd with: the files read (each checked to hold PEM), the
    /// password read from its file (its last line break dropped) or [`PASSWORD_ENV`].
    pub fn access(&self) -> anyhow::Result<EtcdAccess> {
        let tls = match &self.ca {
            None => None,
            Some(ca) => {
                let ca_pem = ca.checked_bytes(true)?;
                let identity = match (&self.cert, &self.key) {
                    (Some(cert), Some(key)) => {
                        Some((cert.checked_bytes(true)?, key.checked_bytes(false)?))
                    }
                    _ => None,
                };
                Some(EtcdTls { ca_pem, identity })
            }
        };
        let user = match &self.username {
            None => None,
            Some((name, at)) => Some((name.clone(), self.password(at)?)),
        };
        Ok(EtcdAccess { tls, user })
    }

    fn password(&self, username_at: &str) -> anyhow::Result<String> {
        if let Some((file, at)) = &self.password_file {
            let text = std::fs::read_to_string(file)
                .map_err(|e| anyhow::anyhow!("{at} {}: {e}", file.display()))?;
            let password = text.strip_suffix('\n').unwrap_or(&text);
            let password = password.strip_suffix('\r').unwrap_or(password);
            return Ok(password.to_string());
        }
        match std::env::var(PASSWORD_ENV) {
            Ok(password) => Ok(password),
            Err(_) => anyhow::bail!(
                "{username_at}: needs a password: {}, or {PASSWORD_ENV}",
                self.name("password_file")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_comes_from_its_file_without_its_line_break_and_is_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "s3cret\r\n").unwrap();
        let security = EtcdSecurity {
            username: Some(("caravan".into(), "cluster.etcd_username".into())),
            password_file: Some((file, "cluster.etcd_password_file".into())),
            ..EtcdSecurity::default()
        };
        let access = security.access().unwrap();
        assert_eq!(
            access.user.as_ref().map(|(n, p)| (n.as_str(), p.as_str())),
            Some(("caravan", "s3cret"))
        );
        assert!(!format!("{access:?}").contains("s3cret"), "{access:?}");

        let missing = EtcdSecurity {
            password_file: Some((dir.path().join("gone"), "cluster.etcd_password_file".into())),
            ..security
        };
        let error = missing.access().unwrap_err().to_string();
        assert!(
            error.starts_with("cluster.etcd_password_file ") && error.contains("gone"),
            "{error}"
        );
    }
}
