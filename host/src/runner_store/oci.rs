//! Runners from OCI registries: a job's `runner = "oci://HOST[:PORT]/REPO:TAG"` (or
//! `...@sha256:DIGEST`) is resolved to a digest when the job registers, and every node pulls
//! that exact build by digest; `caravan runner push` publishes a component.
//!
//! The layout is the CNCF wasm working group's Wasm OCI artifact: an OCI image manifest whose
//! config is `application/vnd.wasm.config.v0+json` and whose one layer is the component,
//! `application/wasm`, so `wkg`, Spin and wasmCloud read what Caravan pushes and Caravan runs
//! what they push. The layer's digest is the SHA-256 of the component's bytes: it is the
//! build's name in the runner store, and a pulled blob is kept only when its bytes hash to it.
//!
//! Registries are spoken to over HTTPS (rustls, the system's roots), and over plain HTTP only
//! when the operator lists them (`[client] insecure_registries`, `runner push --insecure`).
//! Credentials come from `CARAVAN_REGISTRY_USERNAME` and `CARAVAN_REGISTRY_PASSWORD` for the
//! registry `CARAVAN_REGISTRY_HOST` names, else a docker-style `config.json` (`$DOCKER_CONFIG`,
//! else `~/.docker/config.json`, by registry): they are sent only to the registry they are for
//! and never logged or shown.

use super::{RunnerStore, is_sha256_hex};
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{OciDescriptor, OciImageManifest, OciManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

/// How a job names a runner in a registry.
pub const OCI_SCHEME: &str = "oci://";

/// The wasm artifact's config media type.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";

/// The wasm artifact's layer media type: the component itself.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";

const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// Why a registry gave no build: the reference, and one line on what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reference}: {why}")]
pub struct RegistryError {
    /// The reference as given.
    pub reference: String,
    /// What is wrong, for people.
    pub why: String,
}

/// A reference resolved to the build it names now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The reference pinned to the manifest's digest (`oci://HOST/REPO:TAG@sha256:...`):
    /// what every node pulls, whatever the tag says later.
    pub pinned: String,
    /// The component's SHA-256 (hex): the layer's digest, the build's name.
    pub sha256: String,
    /// The component's size in bytes, as the manifest says.
    pub size: u64,
}

/// What a push published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    /// The manifest's digest (`sha256:...`).
    pub manifest_digest: String,
    /// The component's SHA-256 (hex).
    pub sha256: String,
}

/// The registries an agent (or the CLI) talks to, and which of them speak plain HTTP.
#[derive(Debug, Clone, Default)]
pub struct Registries {
    insecure: Vec<String>,
}

impl Registries {
    /// Registries, where those in `insecure` (`HOST:PORT`, as a reference names them) are
    /// spoken to over plain HTTP.
    pub fn new(insecure: Vec<String>) -> Registries {
        Registries { insecure }
    }

    fn client(&self) -> Client {
        crate::tls::install_process_crypto();
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(self.insecure.clone()),
            connect_timeout: Some(std::time::Duration::from_secs(10)),
            read_timeout: Some(std::time::Duration::from_secs(60)),
            ..ClientConfig::default()
        };
        // `try_from` fails only where reqwest cannot make a TLS client at all; the default
        // client would then fail the same way, and say why, at its first request.
        Client::try_from(config).unwrap_or_default()
    }

    /// Resolves `reference` (`oci://...`) to the build it names now: reads its manifest and
    /// checks it is a wasm component artifact.
    pub async fn resolve(&self, reference: &str) -> Result<Resolved, RegistryError> {
        let parsed = parse(reference)?;
        let refuse = |why: String| RegistryError {
            reference: reference.to_string(),
            why,
        };
        let auth = credentials(parsed.resolve_registry());
        let (manifest, digest) = self
            .client()
            .pull_manifest(&parsed, &auth)
            .await
            .map_err(|e| refuse(self.describe(&parsed, e)))?;
        let layer = wasm_layer(&manifest).map_err(refuse)?;
        let sha256 = layer
            .digest
            .strip_prefix("sha256:")
            .filter(|hex| is_sha256_hex(hex))
            .ok_or_else(|| {
                refuse(format!(
                    "its layer's digest {:?} is not a SHA-256",
                    layer.digest
                ))
            })?
            .to_string();
        let pinned = match parsed.tag() {
            Some(tag) => format!(
                "{OCI_SCHEME}{}/{}:{tag}@{digest}",
                parsed.registry(),
                parsed.repository()
            ),
            None => format!(
                "{OCI_SCHEME}{}/{}@{digest}",
                parsed.registry(),
                parsed.repository()
            ),
        };
        Ok(Resolved {
            pinned,
            sha256,
            size: u64::try_from(layer.size).unwrap_or(0),
        })
    }

    /// Pulls build `sha256` of `reference` (pinned or not) into `store`, checked against its
    /// hash as it is written.
    pub async fn pull_into(
        &self,
        store: &RunnerStore,
        reference: &str,
        sha256: &str,
    ) -> Result<(), RegistryError> {
        let parsed = parse(reference)?;
        let refuse = |why: String| RegistryError {
            reference: reference.to_string(),
            why,
        };
        let client = self.client();
        let auth = credentials(parsed.resolve_registry());
        // The manifest first: it authenticates the client for the blob, and says the blob
        // is the build asked for.
        let (manifest, _) = client
            .pull_manifest(&parsed, &auth)
            .await
            .map_err(|e| refuse(self.describe(&parsed, e)))?;
        let layer = wasm_layer(&manifest).map_err(refuse)?;
        if layer.digest != format!("sha256:{sha256}") {
            return Err(refuse(format!(
                "it is build {} now, not sha256:{sha256}",
                layer.digest
            )));
        }
        let blob = client
            .pull_blob_stream(&parsed, &layer)
            .await
            .map_err(|e| refuse(self.describe(&parsed, e)))?;
        store
            .write_build(sha256, blob.stream)
            .await
            .map_err(|e| refuse(e.to_string()))
    }

    /// Pushes `component` to `reference` (`oci://HOST/REPO:TAG`) as a wasm artifact.
    pub async fn push(&self, component: Vec<u8>, reference: &str) -> Result<Pushed, RegistryError> {
        let parsed = parse(reference)?;
        let refuse = |why: String| RegistryError {
            reference: reference.to_string(),
            why,
        };
        let sha256 = super::sha256_hex(&component);
        let config = artifact_config(&component, &sha256).map_err(refuse)?;
        let layers = [ImageLayer::new(
            component,
            WASM_LAYER_MEDIA_TYPE.to_string(),
            None,
        )];
        let config = Config::new(config, WASM_CONFIG_MEDIA_TYPE.to_string(), None);
        let mut manifest = OciImageManifest::build(&layers, &config, None);
        manifest.media_type = Some(OCI_MANIFEST_MEDIA_TYPE.to_string());
        let client = self.client();
        let auth = credentials(parsed.resolve_registry());
        client
            .push(&parsed, &layers, config, &auth, Some(manifest.clone()))
            .await
            .map_err(|e| refuse(self.describe(&parsed, e)))?;
        let manifest_digest = client
            .fetch_manifest_digest(&parsed, &auth)
            .await
            .map_err(|e| refuse(self.describe(&parsed, e)))?;
        Ok(Pushed {
            manifest_digest,
            sha256,
        })
    }

    /// One line for a registry's refusal or silence, naming what to do where there is
    /// something to do.
    fn describe(&self, reference: &Reference, error: OciDistributionError) -> String {
        let registry = reference.resolve_registry();
        let unauthorized = "the registry refused access (401): give credentials in \
                            CARAVAN_REGISTRY_HOST, CARAVAN_REGISTRY_USERNAME and \
                            CARAVAN_REGISTRY_PASSWORD, or a docker config.json"
            .to_string();
        let not_found = |what: &str| format!("the registry has no such {what} (404)");
        match error {
            OciDistributionError::UnauthorizedError { .. }
            | OciDistributionError::AuthenticationFailure(_) => unauthorized,
            OciDistributionError::ImageManifestNotFoundError(_) => not_found("manifest"),
            OciDistributionError::RegistryError { envelope, .. } => {
                let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
                if codes
                    .iter()
                    .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
                {
                    unauthorized
                } else if codes.iter().any(|c| {
                    matches!(
                        c,
                        OciErrorCode::ManifestUnknown
                            | OciErrorCode::NameUnknown
                            | OciErrorCode::NotFound
                            | OciErrorCode::BlobUnknown
                    )
                }) {
                    not_found("repository, tag or digest")
                } else {
                    let messages: Vec<String> =
                        envelope.errors.iter().map(|e| e.message.clone()).collect();
                    format!("the registry refused: {}", quoted(&messages.join("; ")))
                }
            }
            OciDistributionError::ServerError { code: 401, .. } => unauthorized,
            OciDistributionError::ServerError { code: 404, .. } => {
                not_found("repository, tag or digest")
            }
            OciDistributionError::ServerError { code, message, .. } => {
                format!("the registry answered {code}: {}", quoted(message.trim()))
            }
            OciDistributionError::RequestError(error) => {
                let cause = crate::rpc::transport::root_cause(&error);
                if self.insecure.iter().any(|r| *r == registry) {
                    format!("cannot reach the registry over plain HTTP: {cause}")
                } else {
                    format!(
                        "cannot reach the registry over HTTPS ({cause}); a registry that \
                         serves plain HTTP must be listed in [client] insecure_registries \
                         (`runner push --insecure`)"
                    )
                }
            }
            other => quoted(&other.to_string()),
        }
    }
}

/// A registry's own words, as one bounded line: a registry is as hostile as a runner.
fn quoted(text: &str) -> String {
    let cut = crate::util::text::cut(text, 200);
    crate::util::text::escape_controls(&cut).into_owned()
}

/// `oci://HOST[:PORT]/REPO[:TAG][@sha256:DIGEST]` as the client's reference, refused unless
/// it names its registry (a bare `REPO:TAG` would mean Docker Hub, which no job should
/// reach by accident).
pub fn parse(reference: &str) -> Result<Reference, RegistryError> {
    let refuse = |why: &str| RegistryError {
        reference: reference.to_string(),
        why: why.to_string(),
    };
    let rest = reference
        .strip_prefix(OCI_SCHEME)
        .ok_or_else(|| refuse("a registry reference starts with oci://"))?;
    let host = rest.split('/').next().unwrap_or_default();
    let names_host =
        rest.contains('/') && (host.contains('.') || host.contains(':') || host == "localhost");
    if !names_host {
        return Err(refuse(
            "name the registry: oci://HOST[:PORT]/REPOSITORY:TAG (or @sha256:DIGEST)",
        ));
    }
    let parsed = rest.parse::<Reference>().map_err(|e| {
        refuse(&format!(
            "not a valid reference: {}",
            quoted(&e.to_string())
        ))
    })?;
    if parsed.registry() != host {
        return Err(refuse("not a valid reference: its registry is unclear"));
    }
    Ok(parsed)
}

/// Whether a job's runner names a registry.
pub fn is_oci(runner: &str) -> bool {
    runner.starts_with(OCI_SCHEME)
}

/// The one wasm layer of a wasm artifact's manifest, or why the manifest is not one.
fn wasm_layer(manifest: &OciManifest) -> Result<OciDescriptor, String> {
    let OciManifest::Image(image) = manifest else {
        return Err("it is an image index, not a wasm component artifact".into());
    };
    let expected =
        format!("expected config {WASM_CONFIG_MEDIA_TYPE} and one {WASM_LAYER_MEDIA_TYPE} layer");
    if image.config.media_type != WASM_CONFIG_MEDIA_TYPE {
        return Err(format!(
            "it is not a wasm component artifact: its config is {} ({expected})",
            image.config.media_type
        ));
    }
    match image.layers.as_slice() {
        [layer] if layer.media_type == WASM_LAYER_MEDIA_TYPE => Ok(layer.clone()),
        layers => Err(format!(
            "it is not a wasm component artifact: it has {} layers of types {:?} ({expected})",
            layers.len(),
            layers
                .iter()
                .map(|l| l.media_type.as_str())
                .collect::<Vec<_>>()
        )),
    }
}

/// The wasm artifact's config: what it is (a wasip2 component), its layer's digest, and the
/// interfaces the component imports and exports, as the CNCF layout asks.
fn artifact_config(component: &[u8], sha256: &str) -> Result<Vec<u8>, String> {
    let (imports, exports) = interfaces(component)?;
    let config = serde_json::json!({
        "created": crate::util::timestamp::rfc3339_from_unix_ms(
            crate::util::timestamp::unix_ms_now()
        ),
        "architecture": "wasm",
        "os": "wasip2",
        "layerDigests": [format!("sha256:{sha256}")],
        "component": { "imports": imports, "exports": exports },
    });
    Ok(config.to_string().into_bytes())
}

/// The names a component imports and exports at its top level.
fn interfaces(component: &[u8]) -> Result<(Vec<String>, Vec<String>), String> {
    use wasmparser::{Parser, Payload};
    let not_a_component = |why: String| format!("not a WebAssembly component: {why}");
    let (mut imports, mut exports) = (Vec::new(), Vec::new());
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(component) {
        let payload = payload.map_err(|e| not_a_component(e.to_string()))?;
        match payload {
            Payload::Version { encoding, .. }
                if depth == 0 && encoding != wasmparser::Encoding::Component =>
            {
                return Err(not_a_component("it is a core module".into()));
            }
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(section) if depth == 0 => {
                for import in section {
                    let import = import.map_err(|e| not_a_component(e.to_string()))?;
                    imports.push(import.name.name.to_string());
                }
            }
            Payload::ComponentExportSection(section) if depth == 0 => {
                for export in section {
                    let export = export.map_err(|e| not_a_component(e.to_string()))?;
                    exports.push(export.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok((imports, exports))
}

/// The credentials for `registry`: the environment's when they are for it
/// (`CARAVAN_REGISTRY_HOST`), else a docker `config.json`'s entry for it, else none. Never
/// another registry's: a job may name any registry, and must not collect them.
fn credentials(registry: &str) -> RegistryAuth {
    if let (Ok(host), Ok(user), Ok(password)) = (
        std::env::var("CARAVAN_REGISTRY_HOST"),
        std::env::var("CARAVAN_REGISTRY_USERNAME"),
        std::env::var("CARAVAN_REGISTRY_PASSWORD"),
    ) && host == registry
    {
        return RegistryAuth::Basic(user, password);
    }
    let config = std::env::var_os("DOCKER_CONFIG")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| std::path::Path::new(&home).join(".docker"))
        })
        .map(|dir| dir.join("config.json"));
    let Some(text) = config.and_then(|path| std::fs::read_to_string(path).ok()) else {
        return RegistryAuth::Anonymous;
    };
    let Ok(config) = serde_json::from_str::<serde_json::Value>(&text) else {
        return RegistryAuth::Anonymous;
    };
    let encoded = config["auths"][registry]["auth"]
        .as_str()
        .unwrap_or_default();
    use base64::Engine as _;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok());
    match decoded.as_deref().and_then(|pair| pair.split_once(':')) {
        Some((user, password)) => RegistryAuth::Basic(user.to_string(), password.to_string()),
        None => RegistryAuth::Anonymous,
    }
}
