//! Placement through the real binary: a job that fits on no node waits, `job run`, `job
//! plan` and `job status` say why in Nomad's words, and it is placed once room appears.

use super::{sleeper_job, stdout};
use crate::support::{AgentProcess, eventually_async, http};
use serde_json::Value;

const MEMORY_128: &str = "[job.limits]\nmemory = \"128MiB\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_fits_nowhere_waits_says_why_and_is_placed_when_room_appears() {
    let agent = AgentProcess::start_configured(
        &["--dev"],
        "memory_total = \"256MiB\"\nnode_class = \"core\"\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let config = r#"log_every = "1s""#;
    let fill = sleeper_job(dir.path(), "fill", 2, config, MEMORY_128);
    let run = agent.caravan(&["job", "run", fill.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(0), "{}", stdout(&run));

    // The node's 256 MiB are reserved: a third alloc of 128 MiB fits nowhere. `job run`
    // says why and exits 2, as Nomad's does on placement failures; the job stays.
    let more = sleeper_job(dir.path(), "more", 1, config, MEMORY_128);
    let run = agent.caravan(&["job", "run", more.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{said}");
    let why = "1 alloc not placed: no node has 128 MiB free: 1 node exhausted memory";
    assert!(said.contains(why), "{said}");
    let status = agent.caravan(&["job", "status", "more"]);
    assert!(
        stdout(&status).contains(&format!("Placement: {why}")),
        "{}",
        stdout(&status)
    );

    // A job pinned to a class no node has: the plan says so before anything changes.
    let pinned = "[[job.constraint]]\nattribute = \"${node.class}\"\nvalue = \"edge\"\n";
    let edge = sleeper_job(dir.path(), "edge", 1, config, pinned);
    let plan = agent.caravan(&["job", "plan", edge.to_str().unwrap()]);
    assert!(
        stdout(&plan).contains(
            "1 alloc would not be placed: no node meets the job's constraints: 1 node \
             filtered by constraint ${node.class} = edge"
        ),
        "{}",
        stdout(&plan)
    );
    let bad = sleeper_job(
        dir.path(),
        "bad",
        1,
        config,
        "[[job.constraint]]\nattribute = \"${node.class}\"\noperator = \"regexp\"\nvalue = \"(\"\n",
    );
    let refused = agent.caravan(&["job", "run", bad.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("job.constraint[0].value: not a regexp"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    // Stopping `fill` frees the node: `more` is placed as soon as its allocs end.
    let stop = agent.caravan(&["job", "stop", "fill"]);
    assert_eq!(stop.status.code(), Some(0));
    let api = agent.socket_addr();
    eventually_async("the waiting alloc placed and running", || async move {
        let (_, allocs) = http(api, "GET", "/v1/job/more/allocations", None, None).await;
        allocs
            .as_array()
            .is_some_and(|a| a.len() == 1 && a[0]["client_status"] == "running")
    })
    .await;
    let (_, job) = http(api, "GET", "/v1/job/more", None, None).await;
    assert_eq!(job["blocked"], Value::Null, "nothing waits any more");
    let (_, nodes) = http(api, "GET", "/v1/nodes", None, None).await;
    assert_eq!(nodes[0]["class"], "core");
    assert_eq!(nodes[0]["memory_bytes"], 256 << 20);
}

#[test]
fn an_ineligible_node_gets_nothing_new_and_a_bad_drain_is_refused_in_one_line() {
    let agent = AgentProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let refused = |args: &[&str], code: i32, said: &str| {
        let out = agent.caravan(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(said), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    };
    refused(
        &["node", "drain", "nope", "--enable"],
        1,
        "node \"nope\" not found",
    );
    refused(
        &["node", "drain", "local", "--enable", "--deadline", "soon"],
        1,
        "deadline: ",
    );
    let out = agent.caravan(&["node", "drain", "local"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "--enable or --disable is required"
    );

    let off = agent.caravan(&["node", "eligibility", "local", "--disable"]);
    assert!(
        stdout(&off).contains("node local: ineligible"),
        "{}",
        stdout(&off)
    );
    let job = sleeper_job(dir.path(), "web", 1, r#"log_every = "1s""#, "");
    let run = agent.caravan(&["job", "run", job.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{said}");
    assert!(
        said.contains("1 alloc not placed: no node is eligible: 1 node ineligible or draining"),
        "{said}"
    );
    let on = agent.caravan(&["node", "eligibility", "local", "--enable"]);
    assert!(stdout(&on).contains("node local: eligible"));
    let status = agent.caravan(&["node", "status"]);
    assert!(stdout(&status).contains("eligible"), "{}", stdout(&status));
}
