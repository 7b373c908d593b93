//! Runners by content: the runner store's routes on a real agent (uploads checked, capped and
//! idempotent), a job that runs the build it was submitted with after its file is gone and
//! the agent restarted, unused builds collected, and a fetch from peers that passes over a
//! peer serving the wrong bytes (the one place a fake peer is needed: no real agent serves
//! wrong bytes).

use crate::support::*;
use caravan_host::rpc::transport::AgentPool;
use caravan_host::runner_store::{RunnerStore, fixed_peers, sha256_hex};
use caravan_test_artifacts::{MINIMAL, SLEEPER};
use hyper::{Method, StatusCode};
use serde_json::Value;
use std::sync::Arc;

/// One request with a binary body; returns the status and the body as JSON (or a string).
async fn send(
    addr: std::net::SocketAddr,
    method: Method,
    path: &str,
    body: Vec<u8>,
) -> (u16, Value) {
    let api = AgentPool::new()
        .agent(&format!("http://{addr}"), None)
        .unwrap();
    let exchange = api.exchange(
        method,
        path,
        axum::body::Body::from(body),
        DEADLINE,
        64 << 20,
    );
    let (status, bytes) = within(path, exchange).await.unwrap();
    let text = String::from_utf8_lossy(&bytes).to_string();
    (
        status.as_u16(),
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test]
async fn uploads_are_checked_capped_and_idempotent_and_builds_are_served_by_hash() {
    let _logs = LogCapture::start();
    let (agent, _dir) = agent(|_| {}).await;
    let bytes = std::fs::read(SLEEPER).unwrap();
    let sha256 = sha256_hex(&bytes);
    let at = format!("/v1/runner/{sha256}");

    let (status, missing) = send(agent.addr, Method::GET, &at, vec![]).await;
    assert_eq!(status, 404, "{missing}");
    assert_eq!(
        missing["error"],
        format!("this agent has no runner build sha256:{sha256}")
    );

    let (status, stored) = send(agent.addr, Method::PUT, &at, bytes.clone()).await;
    assert_eq!(
        (status, &stored["stored"]),
        (201, &Value::Bool(true)),
        "{stored}"
    );
    let (status, again) = send(agent.addr, Method::PUT, &at, bytes.clone()).await;
    assert_eq!(
        (status, &again["stored"]),
        (200, &Value::Bool(false)),
        "{again}"
    );
    let (status, _) = send(agent.addr, Method::HEAD, &at, vec![]).await;
    assert_eq!(status, 200);
    let pool = AgentPool::new()
        .agent(&format!("http://{}", agent.addr), None)
        .unwrap();
    let (status, served) = pool
        .exchange(Method::GET, &at, Default::default(), DEADLINE, 64 << 20)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(served == bytes, "the build is served byte for byte");
    let (_, listed) = http(agent.addr, "GET", "/v1/runners", None, None).await;
    assert_eq!(listed[0]["sha256"], sha256.as_str());
    assert_eq!(listed[0]["size"], bytes.len());

    // Bad input: each refused with one line, nothing stored.
    let other = std::fs::read(MINIMAL).unwrap();
    let wrong_name = format!("/v1/runner/{}", "0".repeat(64));
    let (status, refused) = send(agent.addr, Method::PUT, &wrong_name, other.clone()).await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(
        refused["error"],
        format!(
            "the bytes received have SHA-256 {}, not the {} they were sent as",
            sha256_hex(&other),
            "0".repeat(64)
        )
    );
    let text = b"echo not a runner".to_vec();
    let at_text = format!("/v1/runner/{}", sha256_hex(&text));
    let (status, refused) = send(agent.addr, Method::PUT, &at_text, text).await;
    assert_eq!(
        (status, refused["error"].as_str().unwrap()),
        (
            400,
            "the bytes are not a WebAssembly component (no component header)"
        )
    );
    let (status, refused) = send(agent.addr, Method::PUT, "/v1/runner/..%2Fetc", other).await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["field"], "sha256");

    // Over the cap, said by its length: refused before a byte of it is read.
    let over = caravan_host::runner_store::MAX_BUILD_BYTES + 1;
    let answer = raw_request(
        agent.addr,
        &format!(
            "PUT /v1/runner/{} HTTP/1.1\r\nHost: x\r\nContent-Length: {over}\r\n\r\n",
            "1".repeat(64)
        ),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.contains("over this agent's limit of 256 MiB"),
        "{answer}"
    );

    let (_, listed) = http(agent.addr, "GET", "/v1/runners", None, None).await;
    assert_eq!(
        listed.as_array().unwrap().len(),
        1,
        "only the good build: {listed}"
    );
    agent.stop().await;
}

/// Writes `request` on a new connection and returns what the agent answers before it closes.
async fn raw_request(addr: std::net::SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = within("the agent's answer", stream.read(&mut answer))
        .await
        .unwrap();
    String::from_utf8_lossy(&answer[..n]).to_string()
}

#[tokio::test]
async fn a_job_runs_the_build_it_was_submitted_with_after_its_file_is_gone_and_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let runner = dir.path().join("web.wasm");
    std::fs::copy(SLEEPER, &runner).unwrap();
    let job = service_job_file(dir.path(), "web", 2, "web.wasm");
    let agent = AgentProcess::start_on(data.path());
    let run = agent.caravan(&["job", "run", job.to_str().unwrap()]);
    crate::support::assert_succeeded(&run);
    std::fs::remove_file(&runner).unwrap();

    let sha256 = sha256_hex(&std::fs::read(SLEEPER).unwrap());
    let (_, view) = http(agent.socket_addr(), "GET", "/v1/job/web", None, None).await;
    assert_eq!(view["runner_sha256"], sha256.as_str(), "{view}");
    assert!(
        view["runner"].as_str().unwrap().ends_with("/web.wasm"),
        "the path it was submitted from names it: {view}"
    );
    assert!(
        data.path().join("runners/sha256").join(&sha256).is_file(),
        "the build is in the agent's store"
    );

    // A restart, and a third alloc placed after the file is gone, run the kept build.
    agent.stop();
    let agent = AgentProcess::start_on(data.path());
    let scaled = agent.caravan(&["job", "scale", "web", "3"]);
    assert_eq!(
        scaled.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&scaled.stderr)
    );
    let addr = agent.socket_addr();
    eventually_async("three allocs running", || async move {
        let (_, allocs) = http(addr, "GET", "/v1/job/web/allocations", None, None).await;
        allocs
            .as_array()
            .is_some_and(|a| a.iter().filter(|a| a["client_status"] == "running").count() == 3)
    })
    .await;
    agent.stop();
}

#[tokio::test]
async fn builds_no_job_uses_are_collected_after_their_grace_and_used_ones_kept() {
    let _logs = LogCapture::start();
    let (agent, _dir) = agent(|config| {
        config.runner_gc_grace = std::time::Duration::from_secs(1);
    })
    .await;
    let unused = std::fs::read(MINIMAL).unwrap();
    let unused_at = format!("/v1/runner/{}", sha256_hex(&unused));
    let (status, _) = send(agent.addr, Method::PUT, &unused_at, unused).await;
    assert_eq!(status, 201);
    let body = serde_json::json!({ "job": {
        "id": "web", "type": "service", "count": 1, "runner": SLEEPER,
    }})
    .to_string();
    let (status, registered) = http(agent.addr, "POST", "/v1/jobs", Some(&body), None).await;
    assert_eq!(status, 200, "{registered}");
    let used = sha256_hex(&std::fs::read(SLEEPER).unwrap());

    // The collector runs every half grace (at least a second): real seconds, since what it
    // reads is the files' modification times.
    eventually_async("the unused build collected", || async {
        let (_, builds) = http(agent.addr, "GET", "/v1/runners", None, None).await;
        let held: Vec<&str> = builds
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|b| b["sha256"].as_str())
            .collect();
        held == [used.as_str()]
    })
    .await;
    agent.stop().await;
}

/// A peer on loopback that answers every build request with `bytes` (or 404 when `None`).
async fn fake_peer(bytes: Option<Vec<u8>>) -> String {
    let bytes = Arc::new(bytes);
    let app = axum::Router::new().route(
        "/v1/runner/{sha256}",
        axum::routing::get(move || {
            let bytes = bytes.clone();
            async move {
                match bytes.as_ref() {
                    Some(bytes) => (StatusCode::OK, bytes.clone()),
                    None => (StatusCode::NOT_FOUND, b"{\"error\":\"no\"}".to_vec()),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test]
async fn a_fetch_passes_over_peers_that_lack_the_build_or_serve_wrong_bytes_and_names_them() {
    let wanted = std::fs::read(SLEEPER).unwrap();
    let sha256 = sha256_hex(&wanted);
    let liar = fake_peer(Some(std::fs::read(MINIMAL).unwrap())).await;
    let without = fake_peer(None).await;
    let honest = fake_peer(Some(wanted.clone())).await;
    let gone = "http://127.0.0.1:9".to_string();

    let dir = tempfile::tempdir().unwrap();
    let store = RunnerStore::open(dir.path()).unwrap();
    store.fetch_from(
        fixed_peers(vec![liar.clone(), without.clone(), gone.clone()]),
        None,
        AgentPool::new(),
    );
    let error = store.get_or_fetch(&sha256, None).await.unwrap_err();
    let minimal = sha256_hex(&std::fs::read(MINIMAL).unwrap());
    assert_eq!(
        error.to_string(),
        format!(
            "runner build sha256:{sha256} is not on this agent, and no agent gave it (tried \
             {liar}: served other bytes (sha256 {minimal}); not used; {without}: does not have \
             it; {gone}: Connection refused (os error 111))"
        )
    );
    assert!(
        !store.has(&sha256) && store.list().unwrap().is_empty(),
        "nothing kept"
    );

    store.fetch_from(
        fixed_peers(vec![liar, without, honest]),
        None,
        AgentPool::new(),
    );
    let path = store.get_or_fetch(&sha256, None).await.unwrap();
    assert!(
        std::fs::read(path).unwrap() == wanted,
        "the honest peer's bytes, checked"
    );
}
