//! One ACL token: its role, its namespace, its lifetime, and its secret's digest.
//!
//! A token is shown to its maker once, as a secret; the agent keeps only the secret's SHA-256
//! (so a copy of the store or of etcd hands out no working token) and finds a token by that
//! digest. The accessor id names a token in lists, revocations and the audit trail, and grants
//! nothing.

use crate::model::jobspec::check_namespace;
use crate::util::text::cut;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The longest token name kept.
pub const MAX_NAME: usize = 128;
/// The longest secret read from a caller: a secret we made is 36 bytes; anything much longer
/// is refused before it is hashed.
pub const MAX_SECRET: usize = 256;

/// What a token may do. Each role has all the rights of those before it, but `node`, which
/// has its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Every read of the cluster's state, an alloc's logs and files.
    Read,
    /// Also registers, scales and stops jobs (in its namespace when it has one), and uploads
    /// runner builds.
    Submit,
    /// Also acts on allocs (stop, restart, signal, collect), drains nodes, runs the GC.
    Operator,
    /// Everything, ACL tokens included.
    Management,
    /// What a node needs of the servers: register, watch and report its allocs, fetch runner
    /// builds and checkpoints. Nothing else: a node's token read off its disk gives no more.
    Node,
}

impl Role {
    /// Every role, in the order of [`Role::name`]'s list.
    pub const ALL: [Role; 5] = [
        Role::Read,
        Role::Submit,
        Role::Operator,
        Role::Management,
        Role::Node,
    ];

    /// The role's name, as the CLI and the API spell it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Submit => "submit",
            Role::Operator => "operator",
            Role::Management => "management",
            Role::Node => "node",
        }
    }

    /// Whether this role may do what `needed` names.
    pub fn allows(self, needed: Permission) -> bool {
        use Permission as P;
        match needed {
            P::Public | P::Token => true,
            P::Read => self != Role::Node,
            P::Submit => matches!(self, Role::Submit | Role::Operator | Role::Management),
            P::Operator => matches!(self, Role::Operator | Role::Management),
            P::Management => self == Role::Management,
            P::Node => matches!(self, Role::Node | Role::Management),
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Role, String> {
        Role::ALL
            .into_iter()
            .find(|role| role.name() == text)
            .ok_or_else(|| {
                format!(
                    "unknown role {:?}: one of read, submit, operator, management, node",
                    cut(text, 32)
                )
            })
    }
}

/// What a route needs of its caller (see the agent's route table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Permission {
    /// Nothing: the UI's files, the agent's health, ACL bootstrap.
    Public,
    /// A valid token of any role (a token asking about itself).
    Token,
    /// A token of any role but `node`.
    Read,
    /// `submit` or above.
    Submit,
    /// `operator` or above.
    Operator,
    /// `management`.
    Management,
    /// A node: a `node` or `management` token, or (with TLS) an agent's certificate.
    Node,
}

impl Permission {
    /// The role to name in a refusal: the least one that has this permission.
    pub fn least_role(self) -> &'static str {
        match self {
            Permission::Public | Permission::Token | Permission::Read => "read",
            Permission::Submit => "submit",
            Permission::Operator => "operator",
            Permission::Management => "management",
            Permission::Node => "node",
        }
    }
}

/// A token as kept: never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclToken {
    /// Names the token in lists, revocations and the audit trail; grants nothing.
    pub accessor_id: String,
    /// What its maker called it.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// The one namespace whose jobs it may change; `None`: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The SHA-256 of its secret, in hex: what a caller's secret is looked up by.
    pub secret_sha256: String,
    /// When it was made, in milliseconds since the Unix epoch.
    pub create_unix_ms: u64,
    /// When it stops working; `None`: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_unix_ms: Option<u64>,
}

impl AclToken {
    /// Whether it still works at `now_unix_ms`.
    pub fn is_live(&self, now_unix_ms: u64) -> bool {
        self.expire_unix_ms.is_none_or(|end| now_unix_ms < end)
    }

    /// Whether it may change jobs of `namespace`.
    pub fn covers_namespace(&self, namespace: &str) -> bool {
        self.namespace.as_deref().is_none_or(|own| own == namespace)
    }
}

/// What a new token is asked to be, before it is made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// Its name: 1 to [`MAX_NAME`] printable characters.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// The namespace it is confined to, if any.
    #[serde(default)]
    pub namespace: Option<String>,
    /// How long it lives, as a duration (`"1h"`); none: until revoked.
    #[serde(default)]
    pub ttl: Option<String>,
}

impl TokenRequest {
    /// Makes the token, with a new secret, or says which field is wrong. Returns the token as
    /// kept and its secret, which is shown once and never again.
    pub fn make(&self, now_unix_ms: u64) -> Result<(AclToken, String), (&'static str, String)> {
        check_name(&self.name).map_err(|e| ("name", e))?;
        if let Some(namespace) = &self.namespace {
            check_namespace(namespace).map_err(|e| ("namespace", e))?;
        }
        let ttl = match &self.ttl {
            None => None,
            Some(text) => {
                let ttl = crate::util::units::parse_duration(text)
                    .map_err(|e| ("ttl", format!("{e}")))?;
                if ttl.is_zero() {
                    return Err(("ttl", "must be longer than 0".into()));
                }
                Some(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
            }
        };
        let secret = uuid::Uuid::new_v4().to_string();
        let token = AclToken {
            accessor_id: uuid::Uuid::new_v4().to_string(),
            name: self.name.clone(),
            role: self.role,
            namespace: self.namespace.clone(),
            secret_sha256: secret_digest(&secret),
            create_unix_ms: now_unix_ms,
            expire_unix_ms: ttl.map(|ttl| now_unix_ms.saturating_add(ttl)),
        };
        Ok((token, secret))
    }
}

/// The hex SHA-256 of a secret: what tokens are kept and found by.
pub fn secret_digest(secret: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(secret.as_bytes());
    let mut hex = String::with_capacity(2 * digest.len());
    for byte in digest {
        hex.push(char::from(HEX[usize::from(byte >> 4)]));
        hex.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    hex
}

/// Whether two digests are equal, in time that depends on neither (both are compared to the
/// end, byte by byte), so that a found token's digest is confirmed without a timing signal.
pub fn digests_match(a: &str, b: &str) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let difference = a
        .bytes()
        .zip(b.bytes())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

/// Whether `name` may name a token.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("a token needs a name".into());
    }
    if name.len() > MAX_NAME {
        return Err(format!("at most {MAX_NAME} bytes"));
    }
    if name.chars().any(char::is_control) {
        return Err("no control characters".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(role: Role, ttl: Option<&str>) -> TokenRequest {
        TokenRequest {
            name: "ci".into(),
            role,
            namespace: None,
            ttl: ttl.map(str::to_string),
        }
    }

    #[test]
    fn each_role_has_the_rights_of_those_before_it_but_node() {
        use Permission as P;
        let table = [
            (Role::Read, [true, true, false, false, false, false]),
            (Role::Submit, [true, true, true, false, false, false]),
            (Role::Operator, [true, true, true, true, false, false]),
            (Role::Management, [true, true, true, true, true, true]),
            (Role::Node, [true, false, false, false, false, true]),
        ];
        let needs = [
            P::Public,
            P::Read,
            P::Submit,
            P::Operator,
            P::Management,
            P::Node,
        ];
        for (role, allowed) in table {
            for (need, expected) in needs.iter().zip(allowed) {
                assert_eq!(role.allows(*need), expected, "{role} on {need:?}");
            }
        }
    }

    #[test]
    fn a_token_keeps_only_its_secrets_digest() {
        let (token, secret) = request(Role::Read, None).make(1_000).unwrap();
        assert_eq!(token.secret_sha256, secret_digest(&secret));
        let kept = serde_json::to_string(&token).unwrap();
        assert!(!kept.contains(&secret), "{kept}");
        assert_ne!(token.accessor_id, secret);
    }

    #[test]
    fn a_token_with_a_ttl_stops_at_its_end() {
        let (token, _) = request(Role::Read, Some("90s")).make(1_000).unwrap();
        assert_eq!(token.expire_unix_ms, Some(91_000));
        assert!(token.is_live(90_999));
        assert!(!token.is_live(91_000));
        let (forever, _) = request(Role::Read, None).make(1_000).unwrap();
        assert!(forever.is_live(u64::MAX));
    }

    #[test]
    fn a_bad_request_names_its_field() {
        let mut bad = request(Role::Read, Some("soon"));
        assert_eq!(bad.make(0).unwrap_err().0, "ttl");
        bad.ttl = Some("0s".into());
        assert_eq!(bad.make(0).unwrap_err().0, "ttl");
        bad.ttl = None;
        bad.name = " ".into();
        assert_eq!(bad.make(0).unwrap_err().0, "name");
        bad.name = "ok".into();
        bad.namespace = Some("Not/One".into());
        assert_eq!(bad.make(0).unwrap_err().0, "namespace");
        assert!("admin".parse::<Role>().unwrap_err().contains("management"));
    }

    #[test]
    fn a_digest_is_the_hex_sha256() {
        assert_eq!(
            secret_digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn digests_match_only_when_equal() {
        let a = secret_digest("a");
        assert!(digests_match(&a, &secret_digest("a")));
        assert!(!digests_match(&a, &secret_digest("b")));
        assert!(!digests_match(&a, "short"));
    }

    #[test]
    fn a_namespace_confines_a_token() {
        let mut request = request(Role::Submit, None);
        request.namespace = Some("ci".into());
        let (token, _) = request.make(0).unwrap();
        assert!(token.covers_namespace("ci"));
        assert!(!token.covers_namespace("default"));
    }
}
