//! TLS on the API, end to end: a real `caravan agent` serving HTTPS with certificates from a
//! test CA, called by the real CLI and by the host's own HTTP client (HTTP/1.1, and HTTP/2
//! agreed by ALPN). It answers plain HTTP
//! with a 400 and nothing else, refuses certificates from another CA, expired ones and (with `verify_https_client`) callers with
//! none; the routes only agents call need an agent's certificate whatever else the caller
//! has; and an agent with a key that is not its certificate's does not start.

use crate::support::pki::{Identity, Pki, pool_trusting};
use crate::support::{AgentProcess, DEADLINE, agent_refusing_to_start, run_caravan};
use caravan_host::cli::tls::Role;
use caravan_host::rpc::transport::{AgentPool, Unanswered};

/// `method path` on the agent at `addr` through `pool`: the status, or why there was none.
async fn call(pool: &AgentPool, addr: &str, method: &str, path: &str) -> Result<u16, Unanswered> {
    let api = pool.agent(addr, None).unwrap();
    let method = hyper::Method::from_bytes(method.as_bytes()).unwrap();
    let body = axum::body::Body::from(if method == hyper::Method::GET {
        ""
    } else {
        "{}"
    });
    api.exchange(method, path, body, DEADLINE, 1 << 20)
        .await
        .map(|(status, _)| status.as_u16())
}

/// A build no agent has: a well-formed hash, so the route answers 404 to whoever may ask.
const NO_SUCH_BUILD: &str =
    "/v1/runner/0000000000000000000000000000000000000000000000000000000000000000";

#[tokio::test]
async fn an_agent_that_verifies_clients_lets_in_only_current_certificates_from_its_ca() {
    let pki = Pki::new("cluster");
    let foreign = Pki::new("foreign");
    let server = pki.issue(Role::Server, "server");
    let cli = pki.issue(Role::Cli, "cli");
    let expired = pki.issue_expired("expired");
    let foreign_cli = foreign.issue(Role::Cli, "foreign-cli");
    let agent = AgentProcess::start_configured(&["--dev"], &pki.agent_config(&server, true));
    assert!(agent.addr.starts_with("https://"), "{}", agent.addr);
    let plain_addr = agent.addr.replace("https://", "http://");

    // The operator's CLI, with the CA and a CLI certificate, as Nomad's flags name them.
    let mut args = vec!["job".to_string(), "status".to_string()];
    args.extend(pki.cli_flags(Some(&cli)));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let status = run_caravan(&args, Some(&agent.addr));
    assert_eq!(status.status.code(), Some(0), "the CLI over mTLS");
    assert_eq!(
        call(&pki.pool(Some(&cli)), &agent.addr, "GET", "/v1/jobs").await,
        Ok(200)
    );

    // A multiplexed pool (offering `h2` by ALPN) is answered in HTTP/2, and a pool offering
    // HTTP/1.1 only in that, on the same port.
    for (pool, expected) in [
        (pki.pool(Some(&cli)).multiplexed(), hyper::Version::HTTP_2),
        (pki.pool(Some(&cli)), hyper::Version::HTTP_11),
    ] {
        let request = hyper::Request::builder()
            .uri("/v1/jobs")
            .body(axum::body::Body::empty())
            .unwrap();
        let answer = pool
            .agent(&agent.addr, None)
            .unwrap()
            .relay(request, DEADLINE)
            .await
            .unwrap();
        assert_eq!(
            (answer.status().as_u16(), answer.version()),
            (200, expected)
        );
    }

    // Plain HTTP is told what to do instead, and nothing else.
    assert_eq!(
        call(&AgentPool::new(), &plain_addr, "GET", "/v1/jobs").await,
        Ok(400)
    );
    let refused: [(&str, AgentPool, &str); 4] = [
        ("no certificate", pki.pool(None), agent.addr.as_str()),
        (
            "a certificate from another CA",
            pool_trusting(&pki.ca, Some(&foreign_cli)),
            agent.addr.as_str(),
        ),
        (
            "an expired certificate",
            pki.pool(Some(&expired)),
            agent.addr.as_str(),
        ),
        (
            "an agent certificate the caller's CA did not sign",
            pool_trusting(&foreign.ca, Some(&cli)),
            agent.addr.as_str(),
        ),
    ];
    for (what, pool, addr) in refused {
        let answer = call(&pool, addr, "GET", "/v1/jobs").await;
        assert!(answer.is_err(), "{what}: answered {answer:?}");
        println!("{what}: {}", answer.unwrap_err());
    }

    // The CLI says what is missing rather than trying, or what the agent answered.
    for (addr, expected) in [
        (&agent.addr, "no CA certificate is configured"),
        (&plain_addr, "this agent serves HTTPS only"),
    ] {
        let plain = run_caravan(&["job", "status"], Some(addr));
        assert_ne!(plain.status.code(), Some(0));
        let stderr = String::from_utf8_lossy(&plain.stderr);
        assert!(stderr.contains(expected), "{stderr}");
    }
}

#[tokio::test]
async fn routes_only_agents_call_need_an_agents_certificate_of_the_region() {
    let pki = Pki::new("cluster");
    let server = pki.issue(Role::Server, "server");
    // Without verify_https_client: a browser or a CLI without a certificate may read.
    let agent = AgentProcess::start_configured(&["--dev"], &pki.agent_config(&server, false));
    let identities: [(&str, Option<Identity>); 5] = [
        ("none", None),
        ("cli", Some(pki.issue(Role::Cli, "cli"))),
        (
            "other region",
            Some(pki.issue_in_region(Role::Server, "elsewhere", "other")),
        ),
        ("node", Some(pki.issue(Role::Client, "node"))),
        ("agent", Some(server.clone())),
    ];
    for (who, identity) in &identities {
        let pool = pki.pool(identity.as_ref());
        let on = |method, path| call(&pool, &agent.addr, method, path);
        // What anyone with a connection may read.
        assert_eq!(on("GET", "/v1/jobs").await, Ok(200), "{who}: GET /v1/jobs");
        let (build, register, checkpoint) = (
            on("GET", NO_SUCH_BUILD).await,
            on("PUT", "/v1/node/n1/register").await,
            on("GET", "/v1/client/allocation/abc/checkpoint").await,
        );
        let expected = match *who {
            "none" => [401, 401, 401],
            "cli" | "other region" => [403, 403, 403],
            // Past the certificate: the route's own answers (no such build, a node that
            // says nothing of itself registered, no such alloc).
            _ => [404, 200, 404],
        };
        assert_eq!(
            [build, register, checkpoint],
            expected.map(Ok),
            "{who}: build by hash, node registration, checkpoint"
        );
    }
}

#[test]
fn an_agent_does_not_start_with_a_key_that_is_not_its_certificates_or_a_missing_file() {
    let pki = Pki::new("cluster");
    let server = pki.issue(Role::Server, "server");
    let other = pki.issue(Role::Server, "other");
    let cases = [
        (
            Identity {
                cert: server.cert.clone(),
                key: other.key.clone(),
            },
            "is not the key of tls.cert_file",
        ),
        (
            Identity {
                cert: server.cert.with_extension("missing"),
                key: server.key.clone(),
            },
            "tls.cert_file",
        ),
    ];
    for (identity, expected) in cases {
        let (code, stderr) =
            agent_refusing_to_start(&["--dev"], &pki.agent_config(&identity, true));
        assert_eq!(code, Some(2), "{stderr}");
        let last = stderr.lines().last().unwrap_or_default();
        assert!(last.contains(expected), "{stderr}");
        assert!(!stderr.contains("agent started"), "{stderr}");
    }
}

/// An upload the agent refuses (here: the token is missing) is said in one line. It was
/// answered before its body was read, closing the connection under the CLI's feet; over TLS
/// the CLI's writes go through `writev`, which raised SIGPIPE and killed it without a word.
/// The CLI now stops at its HEAD's refusal, and keeps SIGPIPE off the threads that write to
/// agents for the uploads still answered early (a build another upload just stored).
#[test]
fn the_cli_reports_an_upload_refused_before_it_was_read_rather_than_dying_of_sigpipe() {
    let pki = Pki::new("cluster");
    let server = pki.issue(Role::Server, "server");
    let cli = pki.issue(Role::Cli, "cli");
    let agent = AgentProcess::start_configured(
        &["--dev", "--acl-token", "s3cret"],
        &pki.agent_config(&server, true),
    );
    let laptop = tempfile::tempdir().unwrap();
    // Large enough that the CLI is still sending when the agent answers.
    let bytes: Vec<u8> = (0..8u32 << 20)
        .map(|i| i.wrapping_mul(7919) as u8)
        .collect();
    std::fs::write(laptop.path().join("big.wasm"), bytes).unwrap();
    let job = crate::support::service_job_file(laptop.path(), "big", 1, "big.wasm");
    let mut args = vec![
        "job".to_string(),
        "run".into(),
        job.to_str().unwrap().into(),
    ];
    args.extend(pki.cli_flags(Some(&cli)));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = run_caravan(&args, Some(&agent.addr));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the agent needs a token: --token or CARAVAN_TOKEN"),
        "{stderr}"
    );
}
