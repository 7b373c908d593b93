//! ACL tokens in a cluster: three agents with TLS and ACLs on, on a real etcd. The tokens are
//! in etcd, read by every agent on every request, so a token made through one agent works on
//! all, and a token revoked through one stops on all of them from the moment the revocation
//! is answered. A request with a token, forwarded to the leader, is answered by its role.

use crate::etcd::EtcdCluster;
use crate::support::http_via;
use crate::support::pki::Pki;
use caravan_host::cli::tls::Role;
use serde_json::json;

#[tokio::test]
async fn a_token_made_through_one_agent_works_on_all_and_a_revoked_one_stops_at_once_on_all() {
    let pki = Pki::new("acl");
    let etcd = EtcdCluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = "max_live_allocs = 8\n[acl]\nenabled = true\n";
    let agents = super::secured_agents(&pki, &etcd, dir.path(), config);
    let cli = pki.issue(Role::Cli, "cli");
    let pool = pki.pool(Some(&cli));
    let call = |i: usize,
                method: &'static str,
                path: String,
                body: Option<String>,
                token: Option<String>| {
        let (pool, base) = (pool.clone(), agents[i].addr.clone());
        async move {
            http_via(
                &pool,
                &base,
                method,
                &path,
                body.as_deref(),
                token.as_deref(),
            )
            .await
        }
    };

    let (status, bootstrap) = call(0, "POST", "/v1/acl/bootstrap".into(), None, None).await;
    assert_eq!(status, 200, "{bootstrap}");
    let management = bootstrap["secret_id"].as_str().unwrap().to_string();
    for i in 0..3 {
        let (status, again) = call(i, "POST", "/v1/acl/bootstrap".into(), None, None).await;
        assert_eq!(status, 400, "a second bootstrap on agent {i}: {again}");
    }
    let body = json!({ "name": "dashboard", "role": "read" }).to_string();
    let (status, made) = call(
        1,
        "POST",
        "/v1/acl/token".into(),
        Some(body),
        Some(management.clone()),
    )
    .await;
    assert_eq!(status, 200, "{made}");
    let read = made["secret_id"].as_str().unwrap().to_string();
    crate::support::eventually_async("a leader", || async {
        let (_, leader) = call(
            0,
            "GET",
            "/v1/status/leader".into(),
            None,
            Some(read.clone()),
        )
        .await;
        leader["leader"]["node"].is_string()
    })
    .await;
    let accessor = made["accessor_id"].as_str().unwrap().to_string();
    for i in 0..3 {
        let (status, answer) = call(
            i,
            "GET",
            "/v1/acl/token/self".into(),
            None,
            Some(read.clone()),
        )
        .await;
        assert_eq!(
            (status, answer["name"].as_str()),
            (200, Some("dashboard")),
            "agent {i}"
        );
        let (status, answer) = call(i, "GET", "/v1/jobs".into(), None, None).await;
        assert_eq!(status, 401, "no token on agent {i}: {answer}");
        // Two of the three forward it to the leader, which checks the token again.
        let (status, answer) = call(i, "GET", "/v1/jobs".into(), None, Some(read.clone())).await;
        assert_eq!(status, 200, "the read token on agent {i}: {answer}");
        let (status, answer) =
            call(i, "DELETE", "/v1/job/web".into(), None, Some(read.clone())).await;
        assert_eq!(
            status, 403,
            "a stop with the read token on agent {i}: {answer}"
        );
    }

    // An alloc's own routes, asked of an agent whose node does not run it and which does not
    // lead: it asks the leader where the alloc is with the caller's token, then forwards.
    let job = json!({ "job": {
        "id": "web", "type": "service", "count": 1, "runner": caravan_test_artifacts::SLEEPER,
    }})
    .to_string();
    let (status, answer) = call(
        0,
        "POST",
        "/v1/jobs".into(),
        Some(job),
        Some(management.clone()),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let mut placed = (String::new(), String::new());
    crate::support::eventually_async("the alloc running", || async {
        let (_, allocs) = call(
            0,
            "GET",
            "/v1/job/web/allocations".into(),
            None,
            Some(read.clone()),
        )
        .await;
        let running = allocs
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["client_status"] == "running");
        running.is_some()
    })
    .await;
    let (_, allocs) = call(
        0,
        "GET",
        "/v1/job/web/allocations".into(),
        None,
        Some(read.clone()),
    )
    .await;
    if let Some(alloc) = allocs.as_array().and_then(|a| a.first()) {
        placed = (
            alloc["id"].as_str().unwrap().to_string(),
            alloc["node_id"].as_str().unwrap().to_string(),
        );
    }
    let (_, leader) = call(
        0,
        "GET",
        "/v1/status/leader".into(),
        None,
        Some(read.clone()),
    )
    .await;
    let leader = leader["leader"]["node"].as_str().unwrap().to_string();
    let node_of = |i: usize| format!("node-{}", i + 1);
    let asked = (0..3)
        .find(|i| node_of(*i) != placed.1 && node_of(*i) != leader)
        .or_else(|| (0..3).find(|i| node_of(*i) != placed.1))
        .unwrap();
    let (status, answer) = call(
        asked,
        "GET",
        format!("/v1/client/allocation/{}", placed.0),
        None,
        Some(read.clone()),
    )
    .await;
    assert_eq!(
        status,
        200,
        "the alloc through {}: {answer}",
        node_of(asked)
    );

    let path = format!("/v1/acl/token/{accessor}");
    let (status, answer) = call(2, "DELETE", path, None, Some(management.clone())).await;
    assert_eq!(status, 200, "{answer}");
    for i in 0..3 {
        let (status, answer) = call(
            i,
            "GET",
            "/v1/acl/token/self".into(),
            None,
            Some(read.clone()),
        )
        .await;
        assert_eq!(status, 403, "the revoked token on agent {i}: {answer}");
    }
    drop(etcd);
}
