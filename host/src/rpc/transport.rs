//! The one HTTP client Caravan has for agents' APIs: the CLI's commands, nodes in another
//! process (node RPC) and an agent forwarding to another all go through it, so that what a
//! call to an agent needs (its address checked, the token, a time limit, a cap on what is
//! read, the API's error shape, the root cause of a connection failure) is written once, and
//! so is TLS: a pool dials plain HTTP or TLS only, with the configuration [`crate::tls`]
//! builds.
//!
//! [`AgentPool`] is one pool of connections (cheap to clone, shared by every node of a
//! nodesim and every request an agent forwards); [`AgentApi`] is one agent's API on it, by
//! base URL. It knows HTTP and the API's error shape, and nothing of any endpoint.

use axum::body::Body;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::Duration;

/// Why a call got no usable answer: the agent could not be reached, did not answer in time,
/// or its answer could not be read (or was over the cap). The message names the agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{base}: {reason}")]
pub struct Unanswered {
    /// The agent's base URL.
    pub base: String,
    /// What went wrong, its root cause ("Connection refused").
    pub reason: String,
    /// Whether the agent was reached but did not answer in time.
    pub timed_out: bool,
}

/// One pool of connections to agents, plain or TLS: HTTP/1, a request per connection at a
/// time, or (see [`AgentPool::multiplexed`]) HTTP/2, every request a stream of one
/// connection per agent. Cheap to clone.
#[derive(Clone)]
pub struct AgentPool {
    http: HttpClient<HttpsConnector<HttpConnector>, Body>,
    /// Whether this pool dials `https://` (and only that) rather than `http://`.
    tls: bool,
    /// What it dials TLS with, kept for [`AgentPool::multiplexed`].
    config: Arc<rustls::ClientConfig>,
    /// Whether it speaks HTTP/2 rather than HTTP/1.1.
    http2: bool,
}

impl Default for AgentPool {
    fn default() -> Self {
        AgentPool::new()
    }
}

impl AgentPool {
    /// A pool that dials plain HTTP: no delay on small writes (node RPC and the CLI send
    /// small requests), idle connections kept 90 s.
    pub fn new() -> AgentPool {
        AgentPool::with(crate::tls::plain_only_dial_config(), false)
    }

    /// A pool that dials agents over TLS only, with `config` (from [`crate::tls::dial_config`]):
    /// a plain `http://` address is refused, so nothing meant for a TLS cluster goes out
    /// in the clear.
    pub fn with_tls(config: Arc<rustls::ClientConfig>) -> AgentPool {
        AgentPool::with(config, true)
    }

    /// A pool that dials as this one does, but speaks HTTP/2 (over TLS as agreed by ALPN,
    /// over plain HTTP from the first byte; agents answer both on one port): all its requests
    /// to one agent are streams of a single connection. For a process that speaks for many nodes (nodesim), whose
    /// waiting watches would otherwise hold a connection, and a descriptor on either side,
    /// each. An agent takes at most 256 requests at once on one connection (`agent::serve`);
    /// more wait for a stream to end.
    pub fn multiplexed(&self) -> AgentPool {
        AgentPool::build(self.config.clone(), self.tls, true)
    }

    fn with(config: Arc<rustls::ClientConfig>, tls: bool) -> AgentPool {
        AgentPool::build(config, tls, false)
    }

    fn build(config: Arc<rustls::ClientConfig>, tls: bool, http2: bool) -> AgentPool {
        let connector =
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config((*config).clone());
        let connector = if tls {
            connector.https_only()
        } else {
            connector.https_or_http()
        };
        // Over TLS, the protocol is agreed in the handshake (ALPN): `h2` alone for HTTP/2.
        let connector = if http2 {
            connector.enable_http2().wrap_connector(http_connector())
        } else {
            connector.enable_http1().wrap_connector(http_connector())
        };
        AgentPool {
            http: HttpClient::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(90))
                .http2_only(http2)
                .build(connector),
            tls,
            config,
            http2,
        }
    }

    /// The API of the agent at `addr` (`http://HOST:PORT`, or `https://` for a TLS pool),
    /// sending `token` (when given and not empty) with every call; refuses an address of any
    /// other form, naming it.
    pub fn agent(&self, addr: &str, token: Option<String>) -> anyhow::Result<AgentApi> {
        let base = addr.trim_end_matches('/').to_string();
        let uri: hyper::Uri = base
            .parse()
            .map_err(|e| anyhow::anyhow!("agent address {addr:?} is not a URL: {e}"))?;
        let bare = uri.path() == "/"
            && uri.query().is_none()
            && uri.authority().is_some_and(|a| !a.as_str().contains('@'));
        let scheme = if self.tls { "https" } else { "http" };
        if uri.host().is_none() || !bare {
            anyhow::bail!("agent address {addr:?} must look like {scheme}://HOST:PORT");
        }
        match uri.scheme_str() {
            Some(given) if given == scheme => {}
            Some("http") => anyhow::bail!(
                "agent address {addr:?} is plain HTTP, but TLS is configured: use https://HOST:PORT"
            ),
            Some("https") => anyhow::bail!(
                "agent address {addr:?} is HTTPS, but no CA certificate is configured to check it \
                 (--ca-cert or CARAVAN_CACERT; an agent's tls.ca_file)"
            ),
            _ => anyhow::bail!("agent address {addr:?} must look like {scheme}://HOST:PORT"),
        }
        Ok(AgentApi {
            base,
            token: token.filter(|t| !t.is_empty()),
            pool: self.clone(),
        })
    }
}

/// The TCP side of every pool's connector: no delay on small writes, and `https://` let
/// through to the TLS layer above it.
fn http_connector() -> HttpConnector {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.enforce_http(false);
    connector
}

/// One agent's API. Cheap to clone.
#[derive(Clone)]
pub struct AgentApi {
    base: String,
    token: Option<String>,
    pool: AgentPool,
}

impl AgentApi {
    /// The agent's base URL, `http://HOST:PORT`.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn unanswered(&self, reason: String) -> Unanswered {
        Unanswered {
            base: self.base.clone(),
            reason,
            timed_out: false,
        }
    }

    fn timed_out(&self, timeout: Duration) -> Unanswered {
        Unanswered {
            timed_out: true,
            ..self.unanswered(format!("no answer within {}s", timeout.as_secs()))
        }
    }

    /// Sends `method path` (path and query) with a JSON `body` and the token, and returns
    /// the response once its head arrived, within `timeout`; its body is the caller's to
    /// read (or stream).
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Body,
        timeout: Duration,
    ) -> Result<Response<Incoming>, Unanswered> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(token) = &self.token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(body)
            .map_err(|e| self.unanswered(format!("cannot build a request for {path}: {e}")))?;
        self.send_request(request, timeout).await
    }

    /// Sends `request`, whose URI is a path and query, to this agent as it is (its headers,
    /// a token among them, untouched): for forwarding a request received.
    pub async fn relay(
        &self,
        mut request: Request<Body>,
        timeout: Duration,
    ) -> Result<Response<Incoming>, Unanswered> {
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        *request.uri_mut() = format!("{}{path}", self.base)
            .parse()
            .map_err(|e| self.unanswered(format!("cannot address {path}: {e}")))?;
        request.headers_mut().remove(header::HOST);
        // Sent in this pool's protocol, whichever the request came in: hyper sends no
        // HTTP/2 request over an HTTP/1.1 connection.
        *request.version_mut() = if self.pool.http2 {
            hyper::Version::HTTP_2
        } else {
            hyper::Version::HTTP_11
        };
        self.send_request(request, timeout).await
    }

    async fn send_request(
        &self,
        request: Request<Body>,
        timeout: Duration,
    ) -> Result<Response<Incoming>, Unanswered> {
        match tokio::time::timeout(timeout, self.pool.http.request(request)).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(error)) => Err(self.unanswered(root_cause(&error))),
            Err(_) => Err(self.timed_out(timeout)),
        }
    }

    /// [`AgentApi::send`], then the whole body, at most `limit` bytes, all within `timeout`.
    pub async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Body,
        timeout: Duration,
        limit: usize,
    ) -> Result<(StatusCode, Bytes), Unanswered> {
        let exchange = async {
            let response = self.send(method, path, body, timeout).await?;
            let status = response.status();
            let bytes = read_body(response.into_body(), limit)
                .await
                .map_err(|reason| self.unanswered(reason))?;
            Ok((status, bytes))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| self.timed_out(timeout))?
    }
}

/// A whole body, at most `limit` bytes.
pub async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, String> {
    Limited::new(body, limit)
        .collect()
        .await
        .map(|collected| collected.to_bytes())
        .map_err(|e| format!("reading the answer: {e}"))
}

/// The message of an answer that is not a success: the API's `{"error": ...}`, or the start
/// of whatever else the body holds.
pub fn error_message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|value| value["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| {
            let text: String = String::from_utf8_lossy(body).chars().take(200).collect();
            if text.trim().is_empty() {
                "request failed".to_string()
            } else {
                text
            }
        })
}

/// The innermost cause of an HTTP client's error ("Connection refused", not "client error
/// (Connect)"): what every message about an unreachable agent shows.
pub fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_address_must_be_an_http_url_naming_a_host() {
        let pool = AgentPool::new();
        assert!(pool.agent("http://127.0.0.1:4646", None).is_ok());
        assert!(pool.agent("http://127.0.0.1:4646/", None).is_ok());
        for bad in [
            "127.0.0.1:4646",
            "https://example.com",
            "http://",
            "not a url",
            "http://127.0.0.1:4646/v1",
            "http://127.0.0.1:4646?x=1",
            "http://user@127.0.0.1:4646",
        ] {
            let error = pool.agent(bad, None).err().expect(bad).to_string();
            assert!(error.contains(bad), "{error}");
        }
    }

    #[test]
    fn an_error_answer_says_the_apis_message_or_what_the_body_holds() {
        assert_eq!(error_message(br#"{"error": "no such job"}"#), "no such job");
        assert_eq!(error_message(b"Bad Gateway"), "Bad Gateway");
        assert_eq!(error_message(b""), "request failed");
    }

    #[tokio::test]
    async fn an_agent_that_does_not_listen_is_named_with_the_root_cause() {
        // A port nothing listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let api = AgentPool::new()
            .agent(&format!("http://127.0.0.1:{port}"), None)
            .unwrap();
        let error = api
            .exchange(
                Method::GET,
                "/v1/agent/health",
                Body::empty(),
                Duration::from_secs(5),
                1024,
            )
            .await
            .unwrap_err();
        assert_eq!(error.base, format!("http://127.0.0.1:{port}"));
        assert!(error.reason.contains("refused"), "{error}");
    }
}
