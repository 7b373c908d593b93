//! ACL tokens on the real binary (`--acl-enabled`): every route of the router answered for
//! every role as its rule says, walked from the router's own table so that a new route is
//! covered the day it is added; and the CLI's `acl` commands, a namespace-confined submit
//! token, and a revoked token refused at once.

use crate::support::{AgentProcess, assert_succeeded, http};
use caravan_host::acl::{Permission, Role};
use caravan_host::agent::http::route_rules;
use serde_json::{Value, json};

/// The caller kinds the table is checked for: no token, then each role's token.
const CALLERS: [Option<Role>; 6] = [
    None,
    Some(Role::Read),
    Some(Role::Submit),
    Some(Role::Operator),
    Some(Role::Management),
    Some(Role::Node),
];

/// Bootstraps `agent`'s ACLs; returns the management token's secret.
async fn bootstrap(agent: &AgentProcess) -> String {
    crate::support::acl_bootstrap(agent.socket_addr()).await
}

/// Makes a token of `role` (confined to `namespace` if given) with `management`; returns
/// its secret and accessor id.
async fn token(
    agent: &AgentProcess,
    management: &str,
    role: Role,
    namespace: Option<&str>,
) -> (String, String) {
    let name = format!("{role}-token");
    let addr = agent.socket_addr();
    crate::support::acl_token(addr, management, &name, role.name(), namespace).await
}

/// A path of `pattern` with each `{name}` filled in with something of the right form.
fn concrete(pattern: &str) -> String {
    pattern
        .split('/')
        .map(|segment| match segment {
            "{sha256}" => "0".repeat(64),
            "{node}" => "no-such-node".to_string(),
            s if s.starts_with('{') => "no-such-id".to_string(),
            s => s.to_string(),
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_each_role_as_its_rule_says() {
    let agent = AgentProcess::start_configured(&["--dev", "--acl-enabled"], "");
    let management = bootstrap(&agent).await;
    let mut secrets = Vec::new();
    for caller in CALLERS {
        secrets.push(match caller {
            None => None,
            Some(Role::Management) => Some(management.clone()),
            Some(role) => Some(token(&agent, &management, role, None).await.0),
        });
    }
    let rules = route_rules();
    assert!(rules.rules().len() > 40, "the router's rules: {rules:?}");
    let mut wrong = Vec::new();
    for rule in rules.rules() {
        // A bootstrap done twice is a 400 for everyone, and a watch would wait: both are
        // covered by their rule all the same.
        let path = match rule.path {
            "/v1/node/{node}/allocations" => format!("{}?wait=1ms", concrete(rule.path)),
            other => concrete(other),
        };
        for (caller, secret) in CALLERS.iter().zip(&secrets) {
            let may = match caller {
                None => rule.needs == Permission::Public,
                Some(role) => role.allows(rule.needs),
            };
            let (status, answer) = http(
                agent.socket_addr(),
                rule.method.as_str(),
                &path,
                Some("{}"),
                secret.as_deref(),
            )
            .await;
            let expected_refusal = if caller.is_none() { 401 } else { 403 };
            let right = if may {
                status != 401 && status != 403
            } else {
                status == expected_refusal
            };
            if !right {
                let who = caller.map_or("no token".to_string(), |r| r.to_string());
                wrong.push(format!(
                    "{} {path} ({:?}) as {who}: {status} {answer}",
                    rule.method, rule.needs
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "answered against the rule:\n{}",
        wrong.join("\n")
    );
    // What no rule covers is refused before the router sees it, whatever the router's own
    // matching would make of it (an empty segment fills a `{id}` there).
    for (method, path, expected) in [
        ("GET", "/v1/no-such-route", 404),
        ("POST", "/v1/job//plan", 404),
        ("POST", "/v1/job//scale", 404),
        ("POST", "/v1/client/allocation//signal", 404),
        ("PUT", "/v1/node//register", 404),
        ("PATCH", "/v1/jobs", 405),
    ] {
        let (status, answer) = http(agent.socket_addr(), method, path, Some("{}"), None).await;
        assert_eq!(status, expected, "{method} {path}: {answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_makes_lists_and_revokes_tokens_and_a_submit_token_keeps_to_its_namespace() {
    let agent = AgentProcess::start_configured(&["--dev", "--acl-enabled"], "");
    let bootstrapped = agent.caravan(&["acl", "bootstrap", "--json"]);
    assert_succeeded(&bootstrapped);
    let management: Value = serde_json::from_slice(&bootstrapped.stdout).unwrap();
    let management = management["secret_id"].as_str().unwrap().to_string();
    let again = agent.caravan(&["acl", "bootstrap"]);
    assert!(!again.status.success());
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(said.contains("already done"), "{said}");

    let as_manager = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--token", &management]);
        agent.caravan(&all)
    };
    let made = as_manager(&[
        "acl",
        "token",
        "create",
        "--name",
        "ci",
        "--role",
        "submit",
        "--namespace",
        "ci",
        "--ttl",
        "720h",
        "--json",
    ]);
    assert_succeeded(&made);
    let ci: Value = serde_json::from_slice(&made.stdout).unwrap();
    let ci_secret = ci["secret_id"].as_str().unwrap().to_string();
    let listed = as_manager(&["acl", "token", "list"]);
    assert_succeeded(&listed);
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(table.contains("ci") && table.contains("submit"), "{table}");
    assert!(
        !table.contains(&ci_secret),
        "a list shows a secret:\n{table}"
    );
    let own = agent.caravan(&["acl", "token", "self", "--token", &ci_secret]);
    assert_succeeded(&own);
    assert!(String::from_utf8_lossy(&own.stdout).contains("submit"));

    // The submit token registers in its namespace only.
    let dir = tempfile::tempdir().unwrap();
    let job = |id: &str, namespace: &str| {
        let path = dir.path().join(format!("{id}.toml"));
        std::fs::write(
            &path,
            format!(
                "[job]\nid = {id:?}\nnamespace = {namespace:?}\ntype = \"service\"\ncount = 1\n\
                 runner = {:?}\n",
                caravan_test_artifacts::SLEEPER
            ),
        )
        .unwrap();
        path
    };
    let ours = job("ours", "ci");
    let run = ["job", "run", "--detach", "--token", &ci_secret];
    let mut args = run.to_vec();
    args.push(ours.to_str().unwrap());
    assert_succeeded(&agent.caravan(&args));
    let theirs = job("theirs", "default");
    let mut args = run.to_vec();
    args.push(theirs.to_str().unwrap());
    let refused = agent.caravan(&args);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("namespace"), "{said}");
    let listed = as_manager(&["job", "status", "--namespace", "ci"]);
    assert_succeeded(&listed);
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(
        table.contains("ours") && !table.contains("theirs"),
        "{table}"
    );

    // Revoked: refused at once.
    let accessor = ci["accessor_id"].as_str().unwrap();
    assert_succeeded(&as_manager(&["acl", "token", "revoke", accessor]));
    let (status, answer) = http(
        agent.socket_addr(),
        "GET",
        "/v1/jobs",
        None,
        Some(&ci_secret),
    )
    .await;
    assert_eq!(status, 403, "{answer}");
}

/// A token made with a TTL works until its end, then is refused as expired (the agent's
/// clock, read on every request: the test waits for it, and nothing is swept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_with_a_ttl_stops_at_its_end() {
    let agent = AgentProcess::start_configured(&["--dev", "--acl-enabled"], "");
    let management = bootstrap(&agent).await;
    let body = json!({ "name": "brief", "role": "read", "ttl": "3s" }).to_string();
    let (status, made) = http(
        agent.socket_addr(),
        "POST",
        "/v1/acl/token",
        Some(&body),
        Some(&management),
    )
    .await;
    assert_eq!(status, 200, "{made}");
    let secret = made["secret_id"].as_str().unwrap().to_string();
    let (status, answer) = http(agent.socket_addr(), "GET", "/v1/jobs", None, Some(&secret)).await;
    assert_eq!(status, 200, "{answer}");
    crate::support::eventually_async("the token expired", || async {
        let (status, answer) =
            http(agent.socket_addr(), "GET", "/v1/jobs", None, Some(&secret)).await;
        status == 403
            && answer["error"]
                .as_str()
                .is_some_and(|e| e.contains("expired"))
    })
    .await;
}
