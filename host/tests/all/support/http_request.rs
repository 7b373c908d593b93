//! One HTTP request, for tests that talk to an agent's API (or anything else on loopback,
//! chromedriver among them), through the host's own HTTP client ([`AgentPool`]): the tests
//! read answers the way the CLI and nodes do, not with a parser of their own.

use super::{DEADLINE, within};
use caravan_host::rpc::transport::AgentPool;
use serde_json::Value;

/// The most a test reads of one answer.
const MAX_ANSWER_BYTES: usize = 256 << 20;

/// One request; returns the status and the body (parsed as JSON when it is JSON, else as a
/// JSON string). Fails the test after [`DEADLINE`], or when nothing answers.
pub async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> (u16, Value) {
    http_via(
        &AgentPool::new(),
        &format!("http://{addr}"),
        method,
        path,
        body,
        token,
    )
    .await
}

/// [`http`] to the agent at `base` (`https://...` on a TLS pool) through `pool`.
pub async fn http_via(
    pool: &AgentPool,
    base: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> (u16, Value) {
    let api = pool
        .agent(base, token.map(str::to_string))
        .expect("an agent's address");
    let verb = hyper::Method::from_bytes(method.as_bytes()).expect("an HTTP method");
    let body = axum::body::Body::from(body.unwrap_or("").to_string());
    let exchange = api.exchange(verb, path, body, DEADLINE, MAX_ANSWER_BYTES);
    let (status, bytes) = within(&format!("{method} {path}"), exchange)
        .await
        .unwrap_or_else(|error| panic!("{method} {path}: {error}"));
    let body = String::from_utf8_lossy(&bytes).to_string();
    let value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    (status.as_u16(), value)
}

/// A request already written into an agent's socket: a stopped agent (SIGSTOP) finds it there
/// when it wakes, before anything else it does. Written byte for byte, as HTTP/1.0, so that
/// the answer is the rest of the connection (no chunks to take apart).
pub struct WrittenRequest {
    stream: tokio::net::TcpStream,
    what: String,
}

impl WrittenRequest {
    /// `GET path` written to the agent at `addr`; returns once the bytes are in its socket.
    pub async fn get(addr: std::net::SocketAddr, path: &str) -> WrittenRequest {
        use tokio::io::AsyncWriteExt;
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("the agent's socket accepts connections, even while it is stopped");
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        WrittenRequest {
            stream,
            what: format!("the answer to GET {path}"),
        }
    }

    /// The status and the body (JSON, or `Null` when it is not) of the answer.
    pub async fn answer(mut self) -> (u16, Value) {
        use tokio::io::AsyncReadExt;
        let mut raw = Vec::new();
        within(&self.what, self.stream.read_to_end(&mut raw))
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {head:?}"));
        (status, serde_json::from_str(body).unwrap_or(Value::Null))
    }
}
