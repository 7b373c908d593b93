//! The HTTP API against a real agent on 127.0.0.1:0, with real wasm runners.

use crate::support::*;
use caravan_host::agent::Agent;
use caravan_test_artifacts::{MINIMAL, SLEEPER};
use serde_json::Value;

fn job(id: &str, job_type: &str, count: i64, runner: &str) -> String {
    serde_json::json!({ "job": { "id": id, "type": job_type, "count": count, "runner": runner } })
        .to_string()
}

/// Waits until `count` allocs listed at `path` have client status `status`.
async fn wait_for_allocs(agent: &Agent, path: &str, status: &str, count: usize) {
    let what = format!("{count} {status} allocs at {path}");
    eventually_async(&what, || async {
        allocs_with(agent, path, status).await == count
    })
    .await;
}

/// Registers a service job `svc` of one `minimal` alloc, and returns that alloc's id once it
/// runs.
pub(super) async fn one_running_alloc(agent: &Agent) -> String {
    let (_, registered) = http(
        agent.addr,
        "POST",
        "/v1/jobs",
        Some(&job("svc", "service", 1, MINIMAL)),
        None,
    )
    .await;
    wait_for_allocs(agent, "/v1/allocations", "running", 1).await;
    registered["placed"][0].as_str().unwrap().to_string()
}

async fn allocs_with(agent: &Agent, path: &str, status: &str) -> usize {
    let (_, allocs) = http(agent.addr, "GET", path, None, None).await;
    allocs
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["client_status"] == status)
        .count()
}

#[tokio::test]
async fn the_job_lifecycle_run_scale_stop_purge_and_gc() {
    let _logs = LogCapture::start();
    let (agent, _dir) = agent(|_| {}).await;
    let addr = agent.addr;

    let (status, registered) = http(
        addr,
        "POST",
        "/v1/jobs",
        Some(&job("web", "service", 2, MINIMAL)),
        None,
    )
    .await;
    assert_eq!(status, 200, "{registered}");
    assert_eq!(registered["created"], true);
    wait_for_allocs(&agent, "/v1/job/web/allocations", "running", 2).await;

    let (_, scaled) = http(
        addr,
        "POST",
        "/v1/jobs",
        Some(&job("web", "service", 4, MINIMAL)),
        None,
    )
    .await;
    assert_eq!(
        (
            scaled["created"].clone(),
            scaled["placed"].as_array().unwrap().len()
        ),
        (Value::Bool(false), 2)
    );
    wait_for_allocs(&agent, "/v1/job/web/allocations", "running", 4).await;
    let (_, down) = http(
        addr,
        "POST",
        "/v1/jobs",
        Some(&job("web", "service", 1, MINIMAL)),
        None,
    )
    .await;
    assert_eq!(down["stopped"].as_array().unwrap().len(), 3);
    wait_for_allocs(&agent, "/v1/job/web/allocations", "complete", 3).await;

    let (status, view) = http(addr, "GET", "/v1/job/web", None, None).await;
    assert_eq!(
        (status, view["count"].clone(), view["status"].clone()),
        (200, Value::from(1), Value::from("running"))
    );

    let (status, _) = http(addr, "DELETE", "/v1/job/web?purge=true", None, None).await;
    assert_eq!(status, 200);
    wait_for_allocs(&agent, "/v1/allocations", "complete", 4).await;
    let (status, gc) = http(addr, "PUT", "/v1/system/gc", None, None).await;
    assert_eq!((status, gc["removed"].as_array().unwrap().len()), (200, 4));
    let (_, jobs) = http(addr, "GET", "/v1/jobs", None, None).await;
    assert_eq!(jobs, Value::Array(vec![]), "purged and collected");
    eventually("the client prunes what the server dropped", || {
        agent.client.alloc_ids().is_empty()
    })
    .await;
    agent.stop().await;
}

#[tokio::test]
async fn bad_job_specs_get_400_naming_the_field_and_change_nothing() {
    let _logs = LogCapture::start();
    let (agent, _dir) = agent(|_| {}).await;
    let cases = [
        (
            r#"{"job": {"id": "a", "type": "service", "count": 1}}"#.to_string(),
            "job.runner",
        ),
        (job("a", "service", -1, SLEEPER), "job.count"),
        (job("a", "cron", 1, SLEEPER), "job.type"),
        ("{\"job\": ".to_string(), "job"),
        (
            r#"{"job": {"id": "a", "type": "batch", "count": 1, "runner": "r", "colour": 1}}"#
                .to_string(),
            "job",
        ),
        // Over the agent's caps (1 GiB of memory, 30 s to stop by default).
        (
            format!(
                r#"{{"job": {{"id": "a", "type": "service", "count": 1, "runner": {SLEEPER:?}, "limits": {{"memory": "8GiB"}}}}}}"#
            ),
            "job.limits.memory",
        ),
        (
            format!(
                r#"{{"job": {{"id": "a", "type": "service", "count": 1, "runner": {SLEEPER:?}, "limits": {{"kill_timeout": "1h"}}}}}}"#
            ),
            "job.limits.kill_timeout",
        ),
        (
            format!(
                r#"{{"job": {{"id": "a", "type": "service", "count": 1, "runner": {SLEEPER:?}, "limits": {{"open_files": 100000}}}}}}"#
            ),
            "job.limits.open_files",
        ),
        (
            format!(
                r#"{{"job": {{"id": "a", "type": "service", "count": 1, "runner": {SLEEPER:?}, "limits": {{"cpu_share": 0}}}}}}"#
            ),
            "job.limits.cpu_share",
        ),
        // Each under its cap, but a checkpoint of 8 MiB cannot pass a host call of 4 MiB.
        (
            format!(
                r#"{{"job": {{"id": "a", "type": "service", "count": 1, "runner": {SLEEPER:?}, "limits": {{"checkpoint_size": "8MiB"}}}}}}"#
            ),
            "job.limits",
        ),
    ];
    for (body, field) in cases {
        let (status, error) = http(agent.addr, "POST", "/v1/jobs", Some(&body), None).await;
        assert_eq!(status, 400, "{body}: {error}");
        assert_eq!(error["field"], field, "{body}: {error}");
        assert!(
            error["error"].as_str().unwrap().starts_with(field),
            "{error}"
        );
    }
    let (_, jobs) = http(agent.addr, "GET", "/v1/jobs", None, None).await;
    assert_eq!(jobs, Value::Array(vec![]), "nothing was registered");
    agent.stop().await;
}

#[tokio::test]
async fn unknown_ids_get_404_and_a_running_alloc_cannot_be_collected() {
    let _logs = LogCapture::start();
    let (agent, _dir) = agent(|_| {}).await;
    for (method, path) in [
        ("GET", "/v1/job/nope"),
        ("DELETE", "/v1/job/nope"),
        ("GET", "/v1/job/nope/allocations"),
        ("GET", "/v1/allocation/nope"),
        ("POST", "/v1/client/allocation/nope/gc"),
    ] {
        let (status, error) = http(agent.addr, method, path, None, None).await;
        assert_eq!(status, 404, "{method} {path}: {error}");
        assert!(error["error"].as_str().unwrap().contains("nope"), "{error}");
    }
    let id = one_running_alloc(&agent).await;
    let (status, by_prefix) = http(
        agent.addr,
        "GET",
        &format!("/v1/allocation/{}", &id[..8]),
        None,
        None,
    )
    .await;
    assert_eq!(
        (status, by_prefix["id"].as_str()),
        (200, Some(id.as_str())),
        "a unique prefix finds the alloc"
    );
    let (status, error) = http(
        agent.addr,
        "POST",
        &format!("/v1/client/allocation/{id}/gc"),
        None,
        None,
    )
    .await;
    assert_eq!(status, 409, "{error}");
    agent.stop().await;
}

#[tokio::test]
async fn with_an_acl_token_writes_need_it_and_reads_do_not() {
    let _logs = LogCapture::start();
    let (agent, _dir) = agent(|config| config.acl_token = Some("s3cret".into())).await;
    let body = job("web", "batch", 1, MINIMAL);
    let (status, error) = http(agent.addr, "POST", "/v1/jobs", Some(&body), None).await;
    assert_eq!(status, 401, "{error}");
    let (status, _) = http(agent.addr, "POST", "/v1/jobs", Some(&body), Some("wrong")).await;
    assert_eq!(status, 403);
    let (_, jobs) = http(agent.addr, "GET", "/v1/jobs", None, None).await;
    assert_eq!(
        jobs,
        Value::Array(vec![]),
        "refused writes change nothing; reads need no token"
    );
    let (status, _) = http(agent.addr, "POST", "/v1/jobs", Some(&body), Some("s3cret")).await;
    assert_eq!(status, 200);
    let (status, _) = http(agent.addr, "PUT", "/v1/system/gc", None, None).await;
    assert_eq!(status, 401);
    agent.stop().await;
}

#[tokio::test]
async fn health_nodes_and_metrics_answer() {
    let _logs = LogCapture::start();
    let (agent, _dir) = agent(|_| {}).await;
    assert_eq!(
        http(agent.addr, "GET", "/v1/agent/health", None, None).await,
        (200, serde_json::json!({"ok": true, "acl": "off"}))
    );
    eventually_async("the node registered", || async {
        http(agent.addr, "GET", "/v1/nodes", None, None)
            .await
            .1
            .as_array()
            .is_some_and(|n| n.len() == 1)
    })
    .await;
    let (status, metrics) = http(agent.addr, "GET", "/v1/metrics", None, None).await;
    assert_eq!(status, 200);
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("# TYPE caravan_gc_collected_total counter"),
        "{metrics}"
    );
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("\ncaravan_alloc_log_lines_dropped_total 0\n"),
        "{metrics}"
    );
    http(
        agent.addr,
        "POST",
        "/v1/jobs",
        Some(&job("one", "service", 1, MINIMAL)),
        None,
    )
    .await;
    eventually_async("one instantiation counted", || async {
        let (_, metrics) = http(agent.addr, "GET", "/v1/metrics", None, None).await;
        metrics
            .as_str()
            .unwrap()
            .contains("caravan_runner_instantiation_seconds_count 1\n")
    })
    .await;
    // The server's side: one placement, the running report taken, the node's watch open
    // again after it answered with the new alloc.
    eventually_async("the server's counters", || async {
        let (_, metrics) = http(agent.addr, "GET", "/v1/metrics", None, None).await;
        let text = metrics.as_str().unwrap().to_string();
        let value = |name: &str| {
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")));
            line.and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        };
        // Reports may go in one batch or two: at least one of each.
        value("caravan_server_placements_total") == 1.0
            && value("caravan_server_alloc_updates_total") >= 1.0
            && value("caravan_server_watches_open") == 1.0
            && value("caravan_server_watch_lag_seconds_count") >= 1.0
    })
    .await;
    agent.stop().await;
}

#[tokio::test]
async fn the_seed_gc_scenario_through_the_agent_logs_info_at_19_and_warn_at_21() {
    let logs = LogCapture::start();
    let (agent, _dir) = agent(|config| config.gc.max_allocs = 10).await;
    http(
        agent.addr,
        "POST",
        "/v1/jobs",
        Some(&job("seed", "service", 19, MINIMAL)),
        None,
    )
    .await;
    wait_for_allocs(&agent, "/v1/allocations", "running", 19).await;
    eventually("an INFO skip line", || {
        logs.with_message("garbage collection skipped because no terminal allocations")
            .iter()
            .any(|l| {
                l["level"] == "INFO"
                    && l["fields"]["reason"] == "number of allocations (19) is over the limit (10)"
            })
    })
    .await;
    http(
        agent.addr,
        "POST",
        "/v1/jobs",
        Some(&job("seed", "service", 21, MINIMAL)),
        None,
    )
    .await;
    wait_for_allocs(&agent, "/v1/allocations", "running", 21).await;
    agent.client.gc().trigger();
    eventually("a WARN skip line", || {
        logs.with_message("garbage collection skipped because no terminal allocations")
            .iter()
            .any(|l| {
                l["level"] == "WARN"
                    && l["fields"]["reason"] == "number of allocations (21) is over the limit (10)"
            })
    })
    .await;
    // What the web UI shows of the GC: the same skip, its level, and the limits.
    let (status, gc) = http(agent.addr, "GET", "/v1/client/gc", None, None).await;
    assert_eq!(status, 200, "{gc}");
    assert_eq!(gc["marked"], 0, "{gc}");
    assert_eq!(gc["destroying"], serde_json::json!([]), "{gc}");
    assert_eq!(gc["parallel_destroys"], 2, "{gc}");
    assert_eq!(gc["max_allocs"], 10, "{gc}");
    assert_eq!(
        gc["last_skip"]["reason"], "number of allocations (21) is over the limit (10)",
        "{gc}"
    );
    assert_eq!(gc["last_skip"]["level"], "warn", "{gc}");
    assert!(
        gc["last_skip"]["at"]
            .as_str()
            .is_some_and(|at| at.ends_with('Z')),
        "{gc}"
    );
    agent.stop().await;
}

#[tokio::test]
async fn the_logs_endpoint_serves_the_alloc_log_file_and_follows_it_until_the_alloc_stops() {
    let _logs = LogCapture::start();
    let (agent, dir) = agent(|_| {}).await;
    let body = serde_json::json!({ "job": {
        "id": "talky", "type": "batch", "count": 1, "runner": SLEEPER,
        "tasks": [{ "name": "main", "config": { "run_for": "300ms", "log_every": "100ms" } }],
    }})
    .to_string();
    let (_, registered) = http(agent.addr, "POST", "/v1/jobs", Some(&body), None).await;
    let id = registered["placed"][0].as_str().unwrap().to_string();

    // Following returns once the alloc has stopped, with every line it logged.
    let (status, followed) = http(
        agent.addr,
        "GET",
        &format!("/v1/client/allocation/{id}/logs?follow=true"),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200);
    let followed = followed.as_str().unwrap().to_string();
    assert!(
        followed.contains("INFO sleeper: task main started; runs for 300ms"),
        "{followed}"
    );
    assert!(
        followed.contains("task main finished: Exit Code: 0"),
        "{followed}"
    );
    let (_, plain) = http(
        agent.addr,
        "GET",
        &format!("/v1/client/allocation/{}/logs", &id[..8]),
        None,
        None,
    )
    .await;
    assert_eq!(
        plain.as_str().unwrap(),
        followed,
        "the same file, by unique prefix"
    );

    let log_file = dir.path().join("logs").join(format!("{id}.log"));
    assert!(
        log_file.exists(),
        "kept outside the alloc dir, under the data dir"
    );
    wait_for_allocs(&agent, "/v1/allocations", "complete", 1).await;
    // A batch job whose allocs all completed reads as complete, not as dead or stopped.
    let (_, job) = http(agent.addr, "GET", "/v1/job/talky", None, None).await;
    assert_eq!(job["status"], "complete", "{job}");
    http(agent.addr, "PUT", "/v1/system/gc", None, None).await;
    eventually("the log file goes with the collected alloc", || {
        !log_file.exists()
    })
    .await;
    agent.stop().await;
}

#[tokio::test]
async fn errors_are_json_with_the_right_status_and_a_stopped_job_is_not_scaled() {
    let _logs = LogCapture::start();
    let (agent, _dir) = agent(|_| {}).await;
    let (status, error) = http(agent.addr, "GET", "/v1/nowhere", None, None).await;
    assert_eq!(
        (status, error["error"].as_str()),
        (404, Some("no such endpoint: /v1/nowhere"))
    );
    let (status, error) = http(agent.addr, "PUT", "/v1/jobs", None, None).await;
    assert_eq!(status, 405, "{error}");
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("PUT is not allowed"),
        "{error}"
    );

    http(
        agent.addr,
        "POST",
        "/v1/jobs",
        Some(&job("web", "service", 1, MINIMAL)),
        None,
    )
    .await;
    let (status, error) = http(agent.addr, "DELETE", "/v1/job/web?purge=maybe", None, None).await;
    assert_eq!(
        (status, error["field"].as_str()),
        (400, Some("purge")),
        "{error}"
    );
    let (status, error) = http(
        agent.addr,
        "POST",
        "/v1/job/web/scale",
        Some(r#"{"count": -2}"#),
        None,
    )
    .await;
    assert_eq!(
        (status, error["field"].as_str()),
        (400, Some("count")),
        "{error}"
    );
    let (status, _) = http(agent.addr, "DELETE", "/v1/job/web", None, None).await;
    assert_eq!(status, 200);
    let (status, error) = http(
        agent.addr,
        "POST",
        "/v1/job/web/scale",
        Some(r#"{"count": 3}"#),
        None,
    )
    .await;
    assert_eq!(status, 409, "{error}");
    let (_, view) = http(agent.addr, "GET", "/v1/job/web", None, None).await;
    assert_eq!(
        (view["status"].as_str(), view["count"].as_u64()),
        (Some("stopped"), Some(1)),
        "refused: unchanged"
    );
    agent.stop().await;
}

#[tokio::test]
async fn every_write_route_needs_the_token() {
    let _logs = LogCapture::start();
    let (agent, _dir) = agent(|config| config.acl_token = Some("s3cret".into())).await;
    for (method, path) in [
        ("POST", "/v1/jobs"),
        ("DELETE", "/v1/job/web"),
        ("POST", "/v1/job/web/scale"),
        ("POST", "/v1/allocation/abc/stop"),
        ("POST", "/v1/client/allocation/abc/gc"),
        ("POST", "/v1/client/allocation/abc/signal"),
        ("POST", "/v1/client/allocation/abc/restart"),
        ("POST", "/v1/client/gc"),
        ("PUT", "/v1/system/gc"),
        ("PUT", &*format!("/v1/runner/{}", "0".repeat(64))),
        ("GET", &*format!("/v1/runner/{}", "0".repeat(64))),
    ] {
        let (status, _) = http(agent.addr, method, path, Some("{}"), None).await;
        assert_eq!(status, 401, "{method} {path} without a token");
        let (status, _) = http(agent.addr, method, path, Some("{}"), Some("wrong")).await;
        assert_eq!(status, 403, "{method} {path} with a wrong token");
    }
    agent.stop().await;
}

#[tokio::test]
async fn an_allocs_view_puts_the_limits_its_job_changed_first() {
    let _logs = LogCapture::start();
    let (agent, _dir) = agent(|_| {}).await;
    let job = serde_json::json!({ "job": {
        "id": "small", "type": "service", "count": 1, "runner": MINIMAL,
        "limits": { "memory": "32MiB", "kill_timeout": "2000ms" },
    }})
    .to_string();
    let (status, answer) = http(agent.addr, "POST", "/v1/jobs", Some(&job), None).await;
    assert_eq!(status, 200, "{answer}");
    wait_for_allocs(&agent, "/v1/job/small/allocations", "running", 1).await;
    let (_, allocs) = http(agent.addr, "GET", "/v1/job/small/allocations", None, None).await;
    let id = allocs[0]["id"].as_str().unwrap();
    let path = format!("/v1/client/allocation/{id}");
    let (status, local) = http(agent.addr, "GET", &path, None, None).await;
    assert_eq!(status, 200, "{local}");
    assert_eq!(
        local["limits_changed"],
        serde_json::json!(["memory", "kill_timeout"]),
        "{local}"
    );
    // As the job wrote them, not as the agent would print them (`32 MiB`, `2s`).
    assert_eq!(
        local["limits"][0],
        serde_json::json!(["memory", "32MiB"]),
        "{local}"
    );
    assert_eq!(
        local["limits"][1],
        serde_json::json!(["kill_timeout", "2000ms"]),
        "{local}"
    );
    agent.stop().await;
}
