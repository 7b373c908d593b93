//! One HTTP/1.1 request at a time over a fresh connection, for tests that talk to an agent's
//! API (or anything else on loopback) without a client library.

use super::within;
use serde_json::Value;

/// One HTTP/1.1 request over a fresh connection; returns the status and the body (parsed as
/// JSON when it is JSON, else as a JSON string). Fails the test after a minute.
pub async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.unwrap_or("");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let response = within(&format!("{method} {path}"), async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("the agent accepts connections");
        stream.write_all(request.as_bytes()).await.unwrap();
        // To the end of the body: the connection's end, or Content-Length bytes after the
        // head (chromedriver keeps the connection open a while after it answered).
        let mut response = Vec::new();
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let read = stream.read(&mut buffer).await.unwrap();
            if read == 0 {
                break;
            }
            response.extend_from_slice(&buffer[..read]);
            if response_complete(&response) {
                break;
            }
        }
        response
    })
    .await;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header end");
    let head = String::from_utf8_lossy(&response[..split]).to_string();
    let raw_body = &response[split + 4..];
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let body_bytes = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(raw_body)
    } else {
        raw_body.to_vec()
    };
    let body = String::from_utf8_lossy(&body_bytes).to_string();
    let value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    (status, value)
}

/// Whether `response` holds a head with a Content-Length and that many body bytes.
fn response_complete(response: &[u8]) -> bool {
    let Some(split) = response.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&response[..split]).to_ascii_lowercase();
    let length = head.lines().find_map(|line| {
        let value = line.strip_prefix("content-length:")?;
        value.trim().parse::<usize>().ok()
    });
    length.is_some_and(|length| response.len() - (split + 4) >= length)
}

/// The body of a `Transfer-Encoding: chunked` response, without its framing.
fn dechunk(mut framed: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(line_end) = framed.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&framed[..line_end]).trim(), 16)
            .expect("a chunk size");
        if size == 0 {
            break;
        }
        let data = &framed[line_end + 2..];
        body.extend_from_slice(&data[..size]);
        framed = &data[size + 2..];
    }
    body
}
