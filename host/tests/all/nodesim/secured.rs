//! `caravan nodesim` where its agent or etcd lets no one in without credentials: nodes
//! with a node's certificate on an agent that serves HTTPS only, nodes with a node token on
//! an agent with ACLs on, and nodes joined to an etcd that requires a client certificate and
//! a user.

use super::*;

/// Simulated nodes reach an agent that serves HTTPS only and requires client certificates,
/// with a node's certificate (`caravan tls cert create --client`), as nodes in another process
/// do: they register, run a job's allocs and report them. With an operator's certificate
/// instead, the node routes refuse them (an operator's certificate cannot pose as a node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_nodes_join_a_tls_agent_with_a_nodes_certificate_only() {
    use caravan_host::cli::tls::Role;
    let pki = crate::support::pki::Pki::new("nodesim");
    let server = pki.issue(Role::Server, "server");
    let agent = AgentProcess::start_configured(
        &["--dev"],
        &format!("enabled = false\n{}", pki.agent_config(&server, true)),
    );
    let cli = pki.issue(Role::Cli, "cli");
    let pool = pki.pool(Some(&cli));
    let node = pki.issue(Role::Client, "node");
    let flags = |identity: &crate::support::pki::Identity| pki.cli_flags(Some(identity));
    let as_node = flags(&node);
    let mut args: Vec<&str> = vec!["--nodes", "3"];
    args.extend(as_node.iter().map(String::as_str));
    let mut sim = Nodesim::start(&agent, &args);
    sim.wait_for("every node registered", |l| {
        l.contains("nodes 3/3 registered")
    });
    let job = serde_json::json!({ "job": {
        "id": "web", "type": "service", "count": 3, "runner": SIM,
    }})
    .to_string();
    let (status, answer) =
        crate::support::http_via(&pool, &agent.addr, "POST", "/v1/jobs", Some(&job), None).await;
    assert_eq!(status, 200, "{answer}");
    sim.wait_for("3 allocs running", |l| l.contains("allocs 3 (running 3)"));
    drop(sim);

    let as_operator = flags(&cli);
    let mut args: Vec<&str> = vec!["--nodes", "1", "--name-prefix", "posing"];
    args.extend(as_operator.iter().map(String::as_str));
    let mut posing = Nodesim::start(&agent, &args);
    posing.wait_for("a refused registration counted", |l| {
        l.contains("nodes 0/1 registered") && !l.contains("| 0 server errors")
    });
}

/// nodesim given a TLS agent's address as plain HTTP stops at once, saying to use HTTPS: its
/// nodes speak HTTP/2, which cannot read the agent's plain-HTTP answer, so it first asks
/// once over HTTP/1.1. The same for an address where no agent listens.
#[test]
fn nodesim_stops_at_once_where_the_agent_cannot_be_used() {
    use caravan_host::cli::tls::Role;
    let pki = crate::support::pki::Pki::new("plain");
    let server = pki.issue(Role::Server, "server");
    let agent = AgentProcess::start_configured(
        &["--dev"],
        &format!("enabled = false\n{}", pki.agent_config(&server, false)),
    );
    let plain = agent.addr.replace("https://", "http://");
    let nobody = {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        format!("http://127.0.0.1:{port}")
    };
    for (server, said) in [(plain.as_str(), "serves HTTPS only"), (&nobody, "refused")] {
        let output =
            crate::support::run_caravan(&["nodesim", "--nodes", "1", "--server", server], None);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(said) && stderr.contains(server) && stderr.trim().lines().count() == 1,
            "{stderr}"
        );
    }
}

/// Simulated nodes join an agent with ACLs on with a `node` token (made as an operator
/// would, `caravan acl token create --role node`): they register, run a job's allocs and
/// report them. With an operator's token instead, the node routes refuse them: a node needs
/// a node's token, and an operator's gives it nothing there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_nodes_join_an_agent_with_acls_on_with_a_node_token_only() {
    let agent = AgentProcess::start_configured(&["--dev", "--acl-enabled"], "enabled = false\n");
    let management = acl_bootstrap(agent.socket_addr()).await;
    let token = |role: &'static str| {
        let (addr, management) = (agent.socket_addr(), management.clone());
        async move {
            let name = format!("sim-{role}");
            acl_token(addr, &management, &name, role, None).await.0
        }
    };
    let node_token = token("node").await;
    let mut sim = Nodesim::start(&agent, &["--nodes", "3", "--token", &node_token]);
    sim.wait_for("every node registered", |l| {
        l.contains("nodes 3/3 registered")
    });
    let job = serde_json::json!({ "job": {
        "id": "web", "type": "service", "count": 3, "runner": SIM,
    }})
    .to_string();
    let (status, answer) = http(
        agent.socket_addr(),
        "POST",
        "/v1/jobs",
        Some(&job),
        Some(&management),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    sim.wait_for("3 allocs running", |l| l.contains("allocs 3 (running 3)"));
    drop(sim);

    let operator_token = token("operator").await;
    let args = [
        "--nodes",
        "1",
        "--name-prefix",
        "posing",
        "--token",
        &operator_token,
    ];
    let mut posing = Nodesim::start(&agent, &args);
    posing.wait_for("a refused registration counted", |l| {
        l.contains("nodes 0/1 registered") && !l.contains("| 0 server errors")
    });
}

/// Simulated nodes join a cluster whose etcd serves TLS only, requires a client certificate
/// and has authentication on, with the flags an operator gives them (the same settings an
/// agent's `[cluster]` has); without a certificate, nodesim stops in one line saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_nodes_join_an_etcd_that_requires_certificates_and_a_user() {
    use caravan_host::cli::tls::Role;
    let pki = crate::support::pki::Pki::new("etcd");
    let member = pki.issue(Role::Server, "etcd-member");
    let nodes = pki.issue(Role::Client, "nodes");
    let mut etcd = crate::etcd::EtcdCluster::start_secured(
        &pki.ca,
        (&member.cert, &member.key),
        (&member.cert, &member.key),
    )
    .await;
    etcd.enable_auth("caravan", "s3cret").await;
    let endpoints = etcd.endpoints().join(",");
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("etcd-password");
    std::fs::write(&password, "s3cret\n").unwrap();
    let agent = agent_on_etcd(
        &endpoints,
        &dir.path().join("agent"),
        &pki.etcd_keys(&member, &password),
    );
    let text = |path: &std::path::Path| path.to_str().unwrap().to_string();
    let flags = |with_certificate: bool| {
        let mut flags = vec![
            "--cluster".to_string(),
            "etcd".into(),
            "--etcd-endpoints".into(),
            endpoints.clone(),
            "--node-ttl".into(),
            "4s".into(),
            "--etcd-ca-file".into(),
            text(&pki.ca),
            "--etcd-username".into(),
            "caravan".into(),
            "--etcd-password-file".into(),
            text(&password),
        ];
        if with_certificate {
            flags.extend([
                "--etcd-cert-file".into(),
                text(&nodes.cert),
                "--etcd-key-file".into(),
                text(&nodes.key),
            ]);
        }
        flags
    };
    let joined = flags(true);
    let mut args: Vec<&str> = vec!["--nodes", "2"];
    args.extend(joined.iter().map(String::as_str));
    let mut sim = Nodesim::start(&agent, &args);
    sim.wait_for("the nodes registered", |l| {
        l.contains("nodes 2/2 registered")
    });
    eventually_async("the simulated nodes live in the cluster", || async {
        let (_, nodes) = http(agent.socket_addr(), "GET", "/v1/nodes", None, None).await;
        let nodes = nodes.as_array().cloned().unwrap_or_default();
        nodes.iter().filter(|n| n["status"] == "ready").count() == 3
    })
    .await;
    drop(sim);

    let refused = flags(false);
    let output = crate::support::caravan_command()
        .args(["nodesim", "--nodes", "1"])
        .args(&refused)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_ne!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("presented no certificate"), "{stderr}");
    assert!(!stderr.contains("s3cret"), "{stderr}");
}
