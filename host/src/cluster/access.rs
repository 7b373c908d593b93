//! How an agent proves itself to etcd: TLS (the CA that etcd's certificates chain to, and
//! this agent's certificate for etcd's `--client-cert-auth`) and an etcd user with its
//! password. Given to [`super::EtcdStore::connect`] as PEM bytes and strings: reading the
//! files is the agent's config's.
//!
//! The password is never shown: not by `Debug`, not in an error.

/// TLS to etcd.
#[derive(Clone)]
pub struct EtcdTls {
    /// The CA etcd members' certificates chain to, PEM.
    pub ca_pem: Vec<u8>,
    /// This agent's certificate and key, PEM, for members that require one.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// What an agent connects to etcd with, beyond the endpoints. The default is nothing:
/// plain `http://` and no user, as on a private network.
#[derive(Clone, Default)]
pub struct EtcdAccess {
    /// TLS, for `https://` endpoints.
    pub tls: Option<EtcdTls>,
    /// An etcd user and its password.
    pub user: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAccess")
            .field("tls", &self.tls.as_ref().map(|t| t.identity.is_some()))
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .finish()
    }
}

impl EtcdAccess {
    /// `reason` (why a connection failed) with a hint at the likely cause when it is TLS's:
    /// a member run with `--client-cert-auth` ends the handshake of a client without a
    /// certificate, or with one its CA did not sign, and the client may read only that the
    /// connection closed, or that a write found it broken.
    pub(super) fn explain(&self, reason: String) -> String {
        let Some(tls) = &self.tls else {
            return reason;
        };
        // How the peer's refusal reaches the client depends on timing: its alert, or only the
        // stream closing under a write.
        let lower = reason.to_ascii_lowercase();
        let refused_by_peer = [
            "alert",
            "connection closed",
            "broken pipe",
            "connection reset",
        ]
        .iter()
        .any(|sign| lower.contains(sign));
        if !refused_by_peer {
            return reason;
        }
        let hint = if tls.identity.is_none() {
            "this agent presented no certificate: a member run with --client-cert-auth needs \
             cluster.etcd_cert_file and cluster.etcd_key_file"
        } else {
            "a member run with --client-cert-auth takes only certificates signed by its \
             --trusted-ca-file: check cluster.etcd_cert_file"
        };
        format!("{reason} ({hint})")
    }

    /// The connect options these add to `options`.
    pub(super) fn apply(
        &self,
        mut options: etcd_client::ConnectOptions,
    ) -> etcd_client::ConnectOptions {
        if let Some(tls) = &self.tls {
            let mut config = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(&tls.ca_pem));
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(etcd_client::Identity::from_pem(cert, key));
            }
            options = options.with_tls(config);
        }
        if let Some((name, password)) = &self.user {
            // etcd's simple tokens expire after five minutes without use; an agent that was
            // quiet that long gets a new one rather than an error.
            options = options
                .with_user(name.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        options
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_tls_connection_says_what_this_agent_presented_however_it_surfaced() {
        let without_certificate = EtcdAccess {
            tls: Some(EtcdTls {
                ca_pem: Vec::new(),
                identity: None,
            }),
            user: None,
        };
        for reason in [
            "cannot connect: received fatal alert: BadCertificate",
            "cannot connect: connection closed",
            "cannot connect: stream closed because of a broken pipe",
        ] {
            let explained = without_certificate.explain(reason.into());
            assert!(
                explained.starts_with(reason) && explained.contains("presented no certificate"),
                "{explained}"
            );
        }
        let refused = "cannot connect: Connection refused (os error 111)";
        assert_eq!(without_certificate.explain(refused.into()), refused);
        let plain = EtcdAccess::default();
        let closed = "cannot connect: connection closed";
        assert_eq!(plain.explain(closed.into()), closed);
    }
}
