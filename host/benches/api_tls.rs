//! What TLS costs the API: requests per second of a read route (`GET /v1/jobs`) and of a
//! node's status report (`POST /v1/node/{node}/allocations/update`, an empty report: the
//! transport, the certificate check and the JSON, not the server's work), from one agent
//! over plain HTTP, one serving TLS, one requiring client certificates (mutual TLS), and one
//! with mutual TLS and ACL tokens on (each call sending a token, looked up on every request:
//! a `read` token for the read, a `node` token for the report), in the same run; and of a
//! read on a new connection per request, where the handshake is paid each time. Last, the
//! read with a token on an agent in cluster mode (one etcd member on loopback), where each
//! request's token is one etcd read, against the single agent's lookup in memory.
//!
//! Run: `cargo bench -p caravan-host --bench api_tls` (see `scripts/bench`). Options after
//! `--`: `--workers N` (concurrent callers, default 16), `--seconds S` (per measurement,
//! default 2), `--rounds R` (default 3; the median is reported).
//!
//! The three agents are real `caravan agent` processes on loopback with certificates made as
//! `caravan tls` makes them; the callers are the host's own client ([`AgentPool`]), kept-alive
//! connections shared by the workers, as the CLI, nodes and agents call. Rounds go through the
//! three agents in turn, so the machine's noise falls on all of them alike.

#[path = "../tests/all/etcd.rs"]
#[allow(dead_code)]
mod etcd;

mod common;

use caravan_host::cli::tls::{CertRequest, Role, create_ca, create_cert};
use caravan_host::rpc::transport::AgentPool;
use caravan_host::tls::{Expect, PemFile, TlsFiles, dial_config};
use common::{count_arg, scoreboard, spawn_agent};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The ways an agent is called.
#[derive(Clone, Copy, PartialEq)]
enum Transport {
    Plain,
    Tls,
    Mutual,
    /// Mutual TLS, and ACL tokens on.
    MutualAcl,
}

const TRANSPORTS: [(Transport, &str); 4] = [
    (Transport::Plain, "plain HTTP"),
    (Transport::Tls, "TLS"),
    (Transport::Mutual, "mutual TLS"),
    (Transport::MutualAcl, "mTLS + ACL"),
];

/// The tokens a caller sends: for the read, and for the report.
type Tokens = (Option<String>, Option<String>);

/// The routes measured: a read, and a node's report.
const READ: (&str, &str, &str) = ("GET", "/v1/jobs", "");
const REPORT: (&str, &str, &str) = (
    "POST",
    "/v1/node/bench-node/allocations/update",
    r#"{"updates":[]}"#,
);

fn write_pem(dir: &Path, name: &str, (cert, key): (String, String)) -> (PemFile, PemFile) {
    let (cert_path, key_path) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}-key.pem")),
    );
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    (
        PemFile::new("cert", cert_path),
        PemFile::new("key", key_path),
    )
}

/// How a caller dials one of the agents.
type MakePool = Arc<dyn Fn() -> AgentPool + Send + Sync>;

/// Requests per second that `workers` callers get from `base` in `seconds`: sharing one
/// pool of kept-alive connections, or (`new_connections`) with a pool of their own for each
/// request, so that each pays a connection and a handshake.
async fn rate(
    make_pool: &MakePool,
    new_connections: bool,
    base: &str,
    token: &Option<String>,
    (method, path, body): (&'static str, &'static str, &'static str),
    workers: usize,
    seconds: u64,
) -> f64 {
    let shared = make_pool();
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (shared, make_pool, base) = (shared.clone(), make_pool.clone(), base.to_string());
        let token = token.clone();
        tasks.spawn(async move {
            let mut done = 0u64;
            while Instant::now() < until {
                let pool = if new_connections {
                    make_pool()
                } else {
                    shared.clone()
                };
                let api = pool.agent(&base, token.clone()).unwrap();
                let method = hyper::Method::from_bytes(method.as_bytes()).unwrap();
                let (status, _) = api
                    .exchange(method, path, axum::body::Body::from(body), TIMEOUT, 1 << 20)
                    .await
                    .unwrap();
                assert!(status.is_success(), "{path}: {status}");
                done += 1;
            }
            done
        });
    }
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        total += done.unwrap();
    }
    total as f64 / seconds as f64
}

const TIMEOUT: Duration = Duration::from_secs(30);

/// Bootstraps the ACLs of the agent at `base` and makes a `read` and a `node` token: the
/// secrets the read and the report send.
async fn acl_tokens(pool: &AgentPool, base: &str) -> Tokens {
    let call = |path: &'static str, body: String, token: Option<String>| {
        let api = pool.agent(base, token).unwrap();
        async move {
            let (status, answer) = api
                .exchange(
                    hyper::Method::POST,
                    path,
                    axum::body::Body::from(body),
                    TIMEOUT,
                    1 << 20,
                )
                .await
                .unwrap();
            let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
            assert!(status.is_success(), "{path}: {status} {answer}");
            answer["secret_id"].as_str().unwrap().to_string()
        }
    };
    let management = call("/v1/acl/bootstrap", String::new(), None).await;
    let token = |role: &str| {
        let body = serde_json::json!({ "name": format!("bench-{role}"), "role": role });
        call("/v1/acl/token", body.to_string(), Some(management.clone()))
    };
    (Some(token("read").await), Some(token("node").await))
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn main() {
    let workers = count_arg("--workers", 16);
    let seconds = count_arg("--seconds", 2) as u64;
    let rounds = count_arg("--rounds", 3);
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();

    let (ca_pem, ca_key) = create_ca("Caravan bench CA", 1).unwrap();
    let ca_path = dir.join("ca.pem");
    std::fs::write(&ca_path, &ca_pem).unwrap();
    let issue = |role: Role, name: &str| {
        let request = CertRequest {
            role,
            region: "global".into(),
            node: None,
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
            days: 1,
        };
        write_pem(dir, name, create_cert(&ca_pem, &ca_key, &request).unwrap())
    };
    let server = issue(Role::Server, "server");
    // The callers present a node's certificate: the report is an agent route.
    let node = issue(Role::Client, "node");

    let mut agents = Vec::new();
    let mut pools: Vec<MakePool> = Vec::new();
    for (transport, name) in TRANSPORTS {
        let config = dir.join(format!("{}.toml", name.replace(' ', "-")));
        let tls = match transport {
            Transport::Plain => String::new(),
            Transport::Tls | Transport::Mutual | Transport::MutualAcl => format!(
                "[tls]\nhttp = true\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\nverify_https_client = {}\n{}",
                ca_path,
                server.0.path,
                server.1.path,
                transport != Transport::Tls,
                if transport == Transport::MutualAcl {
                    "[acl]\nenabled = true\n"
                } else {
                    ""
                }
            ),
        };
        std::fs::write(&config, tls).unwrap();
        let agent = spawn_agent(&dir.join(name.replace(' ', "-")), &config, &[]);
        let scheme = if transport == Transport::Plain {
            "http"
        } else {
            "https"
        };
        agents.push((format!("{scheme}://{}", agent.addr), agent));
        let make_pool: MakePool = match transport {
            Transport::Plain => Arc::new(AgentPool::new),
            Transport::Tls | Transport::Mutual | Transport::MutualAcl => {
                let files = TlsFiles {
                    ca: PemFile::new("ca", &ca_path),
                    identity: Some(node.clone()),
                };
                let config = dial_config(&files, &Expect::AddressHost).unwrap();
                Arc::new(move || AgentPool::with_tls(config.clone()))
            }
        };
        pools.push(make_pool);
    }

    let runtime = tokio::runtime::Runtime::new().unwrap();
    // An agent in cluster mode, with mutual TLS and ACLs, on one etcd member: its tokens
    // are in etcd, read on every request.
    let etcd = runtime.block_on(etcd::EtcdCluster::start_with(1, &[]));
    let cluster_config = dir.join("cluster.toml");
    std::fs::write(
        &cluster_config,
        format!(
            "[tls]\nhttp = true\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\nverify_https_client = true\n[acl]\nenabled = true\n[cluster]\nmode = \"etcd\"\n",
            ca_path, server.0.path, server.1.path
        ),
    )
    .unwrap();
    let endpoints = etcd.endpoints().join(",");
    let cluster_agent = spawn_agent(
        &dir.join("cluster"),
        &cluster_config,
        &["--etcd-endpoints", &endpoints, "--node-name", "bench"],
    );
    let cluster_base = format!("https://{}", cluster_agent.addr);
    let mut cluster_reads = Vec::new();
    // [transport][measure] -> samples; measures: read, report, read on new connections.
    let mut samples = vec![vec![Vec::new(); 3]; TRANSPORTS.len()];
    runtime.block_on(async {
        let mut tokens: Vec<Tokens> = Vec::new();
        for ((transport, _), ((base, _), make_pool)) in
            TRANSPORTS.iter().zip(agents.iter().zip(&pools))
        {
            tokens.push(match transport {
                Transport::MutualAcl => acl_tokens(&make_pool(), base).await,
                _ => (None, None),
            });
        }
        let cluster_pool = pools[3].clone();
        let (cluster_read, _) = acl_tokens(&cluster_pool(), &cluster_base).await;
        // The read is the leader's to answer: once this agent leads.
        let api = cluster_pool()
            .agent(&cluster_base, cluster_read.clone())
            .unwrap();
        loop {
            let answer = api
                .exchange(
                    hyper::Method::GET,
                    "/v1/jobs",
                    axum::body::Body::empty(),
                    TIMEOUT,
                    1 << 20,
                )
                .await;
            if answer.is_ok_and(|(status, _)| status.is_success()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for _ in 0..rounds {
            cluster_reads.push(
                rate(
                    &cluster_pool,
                    false,
                    &cluster_base,
                    &cluster_read,
                    READ,
                    workers,
                    seconds,
                )
                .await,
            );
            for (i, ((base, _), make_pool)) in agents.iter().zip(&pools).enumerate() {
                let (read, report) = &tokens[i];
                samples[i][0]
                    .push(rate(make_pool, false, base, read, READ, workers, seconds).await);
                samples[i][1]
                    .push(rate(make_pool, false, base, report, REPORT, workers, seconds).await);
                samples[i][2].push(rate(make_pool, true, base, read, READ, workers, seconds).await);
            }
        }
    });
    for (_, agent) in agents {
        agent.stop();
    }
    cluster_agent.stop();
    drop(etcd);
    let cluster_read = median(cluster_reads);

    let medians: Vec<[f64; 3]> = samples
        .into_iter()
        .map(|m| {
            [
                median(m[0].clone()),
                median(m[1].clone()),
                median(m[2].clone()),
            ]
        })
        .collect();
    println!(
        "API over TLS: requests/s, {workers} callers, median of {rounds} rounds of {seconds} s"
    );
    println!(
        "  {:<12} {:>14} {:>16} {:>22}",
        "", "GET /v1/jobs", "status report", "GET, new connection"
    );
    for ((_, name), [read, report, fresh]) in TRANSPORTS.iter().zip(&medians) {
        println!("  {name:<12} {read:>14.0} {report:>16.0} {fresh:>22.0}");
    }
    let [plain, _, mutual, acl] = [&medians[0], &medians[1], &medians[2], &medians[3]];
    println!(
        "  ratio mutual TLS / plain: read {:.2}, report {:.2}, read on new connections {:.2}",
        mutual[0] / plain[0],
        mutual[1] / plain[1],
        mutual[2] / plain[2]
    );
    println!(
        "  ratio mTLS + ACL / mutual TLS (the token check): read {:.2}, report {:.2}",
        acl[0] / mutual[0],
        acl[1] / mutual[1]
    );
    println!(
        "  cluster mode (tokens in etcd), mTLS + ACL: GET /v1/jobs {cluster_read:.0}/s, {:.2}x the single agent's",
        cluster_read / acl[0]
    );
    scoreboard(
        "api_acl",
        &format!(
            "{:.0} reads/s, {:.0} reports/s (mTLS + ACL tokens); {cluster_read:.0} reads/s in cluster mode (tokens in etcd)",
            acl[0], acl[1]
        ),
        &format!(
            "{:.0} reads/s, {:.0} reports/s (mutual TLS)",
            mutual[0], mutual[1]
        ),
        &format!("{:.2}x, {:.2}x", acl[0] / mutual[0], acl[1] / mutual[1]),
    );
    scoreboard(
        "api_tls",
        &format!(
            "{:.0} reads/s, {:.0} reports/s (mutual TLS)",
            mutual[0], mutual[1]
        ),
        &format!("{:.0} reads/s, {:.0} reports/s (plain)", plain[0], plain[1]),
        &format!("{:.2}x, {:.2}x", mutual[0] / plain[0], mutual[1] / plain[1]),
    );
}
