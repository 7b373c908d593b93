//! How a real agent serves its connections: HTTP/1.1 and HTTP/2 on one port, a request's
//! version when it is forwarded, and open streams ended when the agent stops.

use crate::agent_api::one_running_alloc;
use crate::support::*;

#[tokio::test]
async fn stopping_the_agent_ends_an_open_log_follow() {
    let _logs = LogCapture::start();
    let (agent, _dir) = agent(|_| {}).await;
    let id = one_running_alloc(&agent).await;
    // Open the follow and read its headers, so it is surely streaming when the agent stops.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(agent.addr).await.unwrap();
    let request =
        format!("GET /v1/client/allocation/{id}/logs?follow=true HTTP/1.1\r\nHost: x\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = vec![0u8; 12];
    within("the follow's status line", stream.read_exact(&mut head))
        .await
        .unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");

    within("the agent to stop with a follower attached", agent.stop()).await;
    let mut rest = Vec::new();
    within("the follow to end", stream.read_to_end(&mut rest))
        .await
        .unwrap();
}

/// A request that came in over HTTP/2 (as nodesim's do) is relayed to another agent over the
/// forwarding pool's HTTP/1.1: hyper sends no HTTP/2 request over an HTTP/1.1 connection,
/// and a follower answered such a request 502.
#[tokio::test]
async fn a_request_received_over_http2_is_relayed_over_http1() {
    use caravan_host::rpc::transport::AgentPool;
    let agent = AgentProcess::start();
    let health = |version| {
        hyper::Request::builder()
            .version(version)
            .uri("/v1/agent/health")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    // A request that came in over HTTP/2, relayed by an HTTP/1.1 pool; then the agent's own
    // HTTP/2, on the same port, through a multiplexed pool.
    for (pool, came_in, answered) in [
        (
            AgentPool::new(),
            hyper::Version::HTTP_2,
            hyper::Version::HTTP_11,
        ),
        (
            AgentPool::new().multiplexed(),
            hyper::Version::HTTP_11,
            hyper::Version::HTTP_2,
        ),
    ] {
        let answer = pool
            .agent(&agent.addr, None)
            .unwrap()
            .relay(health(came_in), std::time::Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(
            (answer.status().as_u16(), answer.version()),
            (200, answered)
        );
    }
}
