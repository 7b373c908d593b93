//! Fuzzing what an operator or a caller hands the agent as credentials, bounded as the other
//! targets in `fuzz` are (same mutator, same `CARAVAN_FUZZ_RUNS`/`CARAVAN_FUZZ_SEED`): the
//! PEM files of `[tls]` (a CA, a certificate, a key, their base64 and DER mutated) loaded as
//! the agent and the CLI load them, which must refuse or accept without a panic; and the
//! token a request carries, mutated, against an agent with a token and one with ACL tokens,
//! which must answer 401 or 403 (or the route's own answer for the token itself), never a
//! 5xx; and the body that asks for a new ACL token, which is made or refused with a 400.

use crate::fuzz::{Rng, guarded, mutate, runs};
use crate::support::pki::Pki;
use crate::support::*;
use caravan_host::cli::tls::Role;
use caravan_host::tls::{Expect, PemFile, ServeTls, TlsFiles, dial_config};

#[test]
fn fuzz_certificate_and_key_files() {
    let pki = Pki::new("fuzz");
    let server = pki.issue(Role::Server, "server");
    let seeds: Vec<Vec<u8>> = [&pki.ca, &server.cert, &server.key]
        .iter()
        .map(|path| std::fs::read(path).unwrap())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new("tls-files");
    let (total, mut loaded) = (runs(300), 0);
    for run in 0..total {
        // Which file is mutated; the other two stay valid, so the mutant is what is tested.
        let which = rng.below(3);
        let mutant = mutate(&mut rng, &seeds[which], &seeds);
        let paths: Vec<_> = (0..3)
            .map(|i| {
                let path = dir.path().join(format!("{run}-{i}.pem"));
                std::fs::write(&path, if i == which { &mutant } else { &seeds[i] }).unwrap();
                path
            })
            .collect();
        let files = TlsFiles {
            ca: PemFile::new("tls.ca_file", &paths[0]),
            identity: Some((
                PemFile::new("tls.cert_file", &paths[1]),
                PemFile::new("tls.key_file", &paths[2]),
            )),
        };
        guarded("tls-files", run, &mutant, || {
            let serve = ServeTls::new(&files, "global", true);
            let dial = dial_config(&files, &Expect::AgentOf("global".into()));
            if let Err(error) = &serve {
                let line = error.to_string();
                assert!(
                    !line.contains('\n') && line.starts_with("tls."),
                    "one line naming the setting: {line}"
                );
            }
            if serve.is_ok() && dial.is_ok() {
                loaded += 1;
            }
        });
    }
    println!("tls-files: {total} inputs, {loaded} loaded, no panic");
}

#[tokio::test]
async fn fuzz_tokens() {
    let _logs = LogCapture::start();
    let (agent, _data_dir) = agent(|config| config.acl_token = Some("s3cret-token".into())).await;
    let seeds: Vec<Vec<u8>> = [
        "Authorization: Bearer s3cret-token",
        "Authorization: Bearer ",
        "Authorization: bearer s3cret-token",
        "Authorization: Basic czNjcmV0",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let passing = ["Authorization: Bearer s3cret-token".to_string()];
    fuzz_header_lines(agent.addr, "tokens", &seeds, &passing).await;
    let (health, _) = http(agent.addr, "GET", "/v1/agent/health", None, None).await;
    assert_eq!(health, 200);
    agent.stop().await;
}

#[tokio::test]
async fn fuzz_acl_tokens_and_token_requests() {
    let _logs = LogCapture::start();
    let (agent, _data_dir) = agent(|config| config.acl_enabled = true).await;
    let (_, bootstrap) = http(agent.addr, "POST", "/v1/acl/bootstrap", None, None).await;
    let management = bootstrap["secret_id"].as_str().unwrap().to_string();
    let request = r#"{"name": "ci", "role": "read", "ttl": "1h"}"#;
    let (_, read) = http(
        agent.addr,
        "POST",
        "/v1/acl/token",
        Some(request),
        Some(&management),
    )
    .await;
    let read = read["secret_id"].as_str().unwrap().to_string();
    // The only header lines that may pass: the management token's (PUT /v1/system/gc needs
    // an operator), in either header.
    let passing = [
        format!("X-Caravan-Token: {management}"),
        format!("Authorization: Bearer {management}"),
    ];
    let seeds: Vec<Vec<u8>> = [
        passing[0].clone(),
        passing[1].clone(),
        format!("X-Caravan-Token: {read}"),
        format!("Authorization: Bearer {read}"),
        "X-Caravan-Token: ".to_string(),
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    fuzz_header_lines(agent.addr, "acl-tokens", &seeds, &passing).await;

    // What a management token's holder sends to make a token: refused or made, never more.
    let seeds: Vec<Vec<u8>> = [
        request,
        r#"{"name": "ns", "role": "submit", "namespace": "ci"}"#,
        r#"{"name": "n", "role": "node", "ttl": "90s"}"#,
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let (mut rng, total) = (Rng::new("acl-token-requests"), runs(300));
    let mut statuses = std::collections::BTreeMap::new();
    for run in 0..total {
        let seed = &seeds[rng.below(seeds.len())];
        let body = String::from_utf8_lossy(&mutate(&mut rng, seed, &seeds)).into_owned();
        let (status, answer) = http(
            agent.addr,
            "POST",
            "/v1/acl/token",
            Some(&body),
            Some(&management),
        )
        .await;
        *statuses.entry(status).or_insert(0) += 1;
        assert!(
            status == 200 || status == 400,
            "run {run}: {body:?} answered {status}: {answer}"
        );
    }
    let (health, _) = http(agent.addr, "GET", "/v1/agent/health", None, None).await;
    assert_eq!(health, 200);
    println!("token requests: {total} bodies, statuses {statuses:?}");
    agent.stop().await;
}

/// Sends `PUT /v1/system/gc` with one header line mutated from `seeds` at a time: every
/// answer is below 500, and one that lets the request in is for a line of `passing` only.
async fn fuzz_header_lines(
    addr: std::net::SocketAddr,
    name: &str,
    seeds: &[Vec<u8>],
    passing: &[String],
) {
    let mut rng = Rng::new(name);
    let mut statuses = std::collections::BTreeMap::new();
    let total = runs(300);
    for run in 0..total {
        let seed = &seeds[rng.below(seeds.len())];
        let mutant = mutate(&mut rng, seed, seeds);
        // What an HTTP client can put in a header line: no line breaks.
        let header: String = String::from_utf8_lossy(&mutant)
            .chars()
            .filter(|c| *c != '\r' && *c != '\n')
            .collect();
        let status = token_request(addr, &header).await;
        *statuses.entry(status).or_insert(0) += 1;
        assert!(
            status < 500,
            "{name} run {run}: {header:?} answered {status}"
        );
        if !passing.contains(&header) {
            assert!(
                status == 400 || status == 401 || status == 403,
                "{name} run {run}: {header:?} let in ({status})"
            );
        }
    }
    println!("{name}: {total} requests, statuses {statuses:?}, no 5xx");
}

/// `PUT /v1/system/gc` (a write: it needs the token) with `header` as one of its header
/// lines, written byte for byte: the status.
async fn token_request(addr: std::net::SocketAddr, header: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!(
        "PUT /v1/system/gc HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         {header}\r\nContent-Length: 0\r\n\r\n"
    );
    let answer = within("a request with a fuzzed token", async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        String::from_utf8_lossy(&answer).into_owned()
    })
    .await;
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"))
}
