//! The audit trail, end to end: a real agent with a token and `[audit] path` records every
//! operator's write (accepted or refused, with the token it presented, the caller's address
//! and the job or node it names) as a `caravan::audit` log line and a JSON line in its file;
//! reads and node RPC leave nothing.

use crate::support::*;
use caravan_test_artifacts::SLEEPER;
use serde_json::Value;

#[tokio::test]
async fn every_operators_write_leaves_one_line_with_who_what_and_how_it_ended() {
    let logs = LogCapture::start();
    let dir = tempfile::tempdir().unwrap();
    let audit_file = dir.path().join("audit").join("audit.log");
    let file = audit_file.clone();
    let (agent, _data_dir) = agent(move |config| {
        config.acl_token = Some("s3cret".into());
        config.audit_path = Some(file);
    })
    .await;
    let job = serde_json::json!({ "job": {
        "id": "web", "type": "service", "count": 1, "runner": SLEEPER,
    }})
    .to_string();
    let writes = [
        ("POST", "/v1/jobs", Some(job.as_str()), Some("s3cret"), 200),
        (
            "POST",
            "/v1/job/web/scale",
            Some(r#"{"count":2}"#),
            Some("guess"),
            403,
        ),
        ("DELETE", "/v1/job/web", None, None, 401),
        (
            "POST",
            "/v1/node/node-9/eligibility",
            Some(r#"{"eligible":false}"#),
            Some("s3cret"),
            404,
        ),
    ];
    for (method, path, body, token, expected) in writes {
        let (status, answer) = http(agent.addr, method, path, body, token).await;
        assert_eq!(status, expected, "{method} {path}: {answer}");
    }
    // Neither reads nor a node's own calls are operators' writes.
    let _ = http(agent.addr, "GET", "/v1/jobs", None, None).await;
    let _ = http(
        agent.addr,
        "PUT",
        "/v1/node/sim-1/register",
        Some("{}"),
        Some("s3cret"),
    )
    .await;

    let expected = [
        (
            "POST",
            "/v1/jobs",
            "valid",
            "accepted",
            200,
            Some("web"),
            None,
        ),
        (
            "POST",
            "/v1/job/web/scale",
            "invalid",
            "refused",
            403,
            Some("web"),
            None,
        ),
        (
            "DELETE",
            "/v1/job/web",
            "none",
            "refused",
            401,
            Some("web"),
            None,
        ),
        (
            "POST",
            "/v1/node/node-9/eligibility",
            "valid",
            "refused",
            404,
            None,
            Some("node-9"),
        ),
    ];
    let read_file = || -> Vec<Value> {
        std::fs::read_to_string(&audit_file)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect()
    };
    eventually("every write in the audit file", || {
        read_file().len() >= expected.len()
    })
    .await;
    let recorded = read_file();
    assert_eq!(recorded.len(), expected.len(), "{recorded:#?}");
    for (record, (method, path, token, result, status, job, node)) in recorded.iter().zip(expected)
    {
        assert_eq!(
            (
                record["method"].as_str(),
                record["path"].as_str(),
                record["token"].as_str(),
                record["result"].as_str(),
                record["status"].as_u64(),
                record["job"].as_str(),
                record["node"].as_str(),
                record["peer"].as_str(),
            ),
            (
                Some(method),
                Some(path),
                Some(token),
                Some(result),
                Some(status),
                job,
                node,
                Some("anonymous")
            ),
            "{record}"
        );
        assert!(
            record["addr"]
                .as_str()
                .is_some_and(|a| a.starts_with("127.0.0.1:")),
            "{record}"
        );
    }
    // The same records, in the agent's own log, on their own target.
    let logged: Vec<Value> = logs
        .lines()
        .into_iter()
        .filter(|line| line["target"] == "caravan::audit")
        .collect();
    assert_eq!(logged.len(), expected.len(), "{logged:#?}");
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(dir.path().join("audit/audit.log"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the audit file is its owner's only");
    agent.stop().await;
}
