//! Serving the API on the agent's listener: HTTP/1.1, or HTTP/2 (agreed by ALPN over TLS,
//! spoken from the first byte over plain HTTP: nodesim's nodes share connections so), over
//! TLS when `[tls]` is on, with each
//! request told what its connection's certificate makes the caller ([`PeerRole`], a request
//! extension that `http`'s authorisation reads).
//!
//! With TLS, a connection that does not complete the handshake (a certificate from another
//! CA, an expired one, none where `verify_https_client` needs one) is closed before any
//! request is read; one that speaks plain HTTP is answered 400, saying to use HTTPS.
//! Stopping stops accepting, lets each connection finish the requests it is answering (one
//! for HTTP/1.1; on HTTP/2, those of its streams open, once the caller has acknowledged the
//! GOAWAY), and returns once every connection has closed: the agent waits for that at most
//! `HTTP_DRAIN`.
//!
//! Owns only connections: what is answered is the router's.

use super::http::CallerAddr;
use crate::tls::{PeerRole, ServeTls};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};

/// How long a caller has to complete the TLS handshake once connected.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The most requests one HTTP/2 connection may have in flight at once (hyper's default is
/// 200): a nodesim's connection carries up to 64 nodes' waiting watches, their reports and
/// fetches. An HTTP/1 connection has one at a time.
const MAX_STREAMS_PER_CONNECTION: u32 = 256;

/// How long accepting pauses after an error that is not one connection's (out of file
/// descriptors): accepting again at once would spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// Serves `router` on `listener` until `stop` fires (or its sender is dropped), then waits
/// for open connections to finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Option<ServeTls>,
    stop: oneshot::Receiver<()>,
) {
    let (closing, closing_seen) = watch::channel(false);
    // Every connection holds a sender; `recv` answers `None` once the last is dropped.
    let (open, mut all_closed) = mpsc::channel::<()>(1);
    tokio::pin!(stop);
    loop {
        let (stream, caller) = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) if is_one_connections(&error) => continue,
                Err(error) => {
                    tracing::error!(error = %error, "cannot accept connections; retrying");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (router, tls) = (router.clone(), tls.clone());
        let (closing, open) = (closing_seen.clone(), open.clone());
        tokio::spawn(async move {
            match tls {
                None => connection(stream, router, (PeerRole::Anonymous, caller), closing).await,
                Some(tls) => tls_connection(stream, caller, router, &tls, closing).await,
            }
            drop(open);
        });
    }
    drop(listener);
    let _ = closing.send(true);
    drop(open);
    let _ = all_closed.recv().await;
}

/// Returns once the agent is stopping (or the loop that would say so is gone).
async fn stopping(closing: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not `Send`: dropped here, before any other await.
    let _ = closing.wait_for(|closing| *closing).await.map(drop);
}

/// Errors of one connection, which leave the listener fine.
fn is_one_connections(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        error.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

async fn tls_connection(
    stream: tokio::net::TcpStream,
    caller: SocketAddr,
    router: Router,
    tls: &ServeTls,
    mut closing: watch::Receiver<bool>,
) {
    if speaks_plain_http(&stream).await {
        answer_plain_http(stream).await;
        return;
    }
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.clone());
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream));
    let stream = tokio::select! {
        done = handshake => match done {
            Ok(Ok(stream)) => stream,
            // The caller's problem (plain HTTP, an unknown CA, an expired certificate):
            // theirs to read in their error, not an operator's to act on.
            Ok(Err(error)) => {
                tracing::debug!(error = %error, "TLS handshake refused");
                return;
            }
            Err(_) => return,
        },
        () = stopping(&mut closing) => return,
    };
    let role = tls.role_of(stream.get_ref().1.peer_certificates());
    connection(stream, router, (role, caller), closing).await
}

/// Whether the caller's first byte is not a TLS handshake record's (22): a plain HTTP
/// request, most likely, from a caller given `http://` for this agent.
async fn speaks_plain_http(stream: &tokio::net::TcpStream) -> bool {
    const TLS_HANDSHAKE_RECORD: u8 = 0x16;
    let mut first = [0u8; 1];
    let peeked = tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await;
    matches!(peeked, Ok(Ok(1))) && first[0] != TLS_HANDSHAKE_RECORD
}

/// Tells a plain HTTP caller, in the API's error shape, to use HTTPS (as Go's servers do),
/// rather than leaving it to make sense of a broken handshake; then closes.
async fn answer_plain_http(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let body = r#"{"error":"this agent serves HTTPS only: call it at https://"}"#;
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, write).await;
}

/// Serves one connection's requests, each carrying the caller's role and address, until the
/// caller closes it or the agent stops (then the request being answered is finished first).
async fn connection<S>(
    stream: S,
    router: Router,
    (role, caller): (PeerRole, SocketAddr),
    mut closing: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(role);
        request.extensions_mut().insert(CallerAddr(caller));
        let mut router = router.clone();
        async move { tower_service::Service::call(&mut router, request).await }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http2()
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        served = connection.as_mut() => {
            if let Err(error) = served {
                tracing::debug!(error = %error, "an API connection ended with an error");
            }
        }
        () = stopping(&mut closing) => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}
