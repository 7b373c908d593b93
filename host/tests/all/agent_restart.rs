//! The real `caravan agent` killed with SIGKILL at several points, and stopped cleanly, then
//! started again on the same data dir: every non-terminal alloc runs again from its last
//! checkpoint, no finished alloc runs again, no collected alloc comes back, nothing is
//! duplicated. Also: a state file this build cannot use is refused and left untouched, and
//! finished allocs whose runner is gone are kept, in one INFO line.

use crate::support::{AgentProcess, http, message, run_caravan};
use caravan_test_artifacts::STATEFUL;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;

/// A service job of counters and a batch job that finishes in a few ticks.
fn jobs() -> [Value; 2] {
    let job = |id: &str, job_type: &str, count: u32, config: Value| {
        json!({"job": {"id": id, "type": job_type, "count": count, "runner": STATEFUL,
            "tasks": [{"name": "count", "config": config}]}})
    };
    [
        job("counter", "service", 3, json!({"tick_every": 50})),
        job(
            "quick",
            "batch",
            2,
            json!({"tick_every": 20, "stop_after": 3}),
        ),
    ]
}

/// Every alloc the agent's server holds: id -> (job, client status).
async fn allocs(agent: &AgentProcess) -> BTreeMap<String, (String, String)> {
    let (status, body) = http(agent.socket_addr(), "GET", "/v1/allocations", None, None).await;
    assert_eq!(status, 200, "{body}");
    body.as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let field = |name: &str| a[name].as_str().unwrap_or_default().to_string();
            (field("id"), (field("job_id"), field("client_status")))
        })
        .collect()
}

async fn wait_for_allocs(
    agent: &AgentProcess,
    what: &str,
    done: impl Fn(&BTreeMap<String, (String, String)>) -> bool,
) -> BTreeMap<String, (String, String)> {
    for _ in 0..600 {
        let now = allocs(agent).await;
        if done(&now) {
            return now;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!(
        "timed out waiting for {what}; allocs: {:?}",
        allocs(agent).await
    );
}

fn of_job<'a>(allocs: &'a BTreeMap<String, (String, String)>, job: &str) -> Vec<&'a String> {
    allocs
        .iter()
        .filter(|(_, (j, _))| j == job)
        .map(|(id, _)| id)
        .collect()
}

/// A guest line's alloc id and message.
fn guest_line(line: &Value) -> Option<(&str, &str)> {
    Some((line["span"]["alloc_id"].as_str()?, message(line)))
}

/// The highest `tick N` each alloc logged.
fn last_ticks<'a>(lines: impl Iterator<Item = &'a Value>) -> BTreeMap<String, u64> {
    let mut ticks = BTreeMap::new();
    for (alloc_id, text) in lines.filter_map(guest_line) {
        if let Some(n) = text
            .strip_prefix("tick ")
            .and_then(|n| n.parse::<u64>().ok())
        {
            let entry = ticks.entry(alloc_id.to_string()).or_insert(0);
            *entry = (*entry).max(n);
        }
    }
    ticks
}

fn parse(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Starts the agent on `data_dir` and waits until every counter ticks again. Returns the
/// agent, per counter the count it resumed from (`None`: started from zero), and the lines
/// read so far.
async fn restart(
    data_dir: &Path,
    counters: &[String],
) -> (AgentProcess, BTreeMap<String, Option<u64>>, Vec<Value>) {
    let agent = AgentProcess::start_on(data_dir);
    let mut seen: Vec<Value> = Vec::new();
    let ticked = |seen: &[Value], id: &str| {
        seen.iter()
            .any(|l| guest_line(l).is_some_and(|(a, m)| a == id && m.starts_with("tick ")))
    };
    while counters.iter().any(|id| !ticked(&seen, id)) {
        let (line, before) = agent.wait_for("a tick from every counter", |l| {
            guest_line(l).is_some_and(|(_, m)| m.starts_with("tick "))
        });
        seen.extend(before);
        seen.push(line);
    }
    let mut resumed = BTreeMap::new();
    for id in counters {
        let from: Vec<u64> = seen
            .iter()
            .filter_map(guest_line)
            .filter(|(a, _)| a == id)
            .filter_map(|(_, m)| m.strip_prefix("resuming from checkpoint at count "))
            .map(|n| n.parse().unwrap())
            .collect();
        assert!(from.len() <= 1, "alloc {id} resumed twice: {from:?}");
        resumed.insert(id.clone(), from.first().copied());
    }
    (agent, resumed, seen)
}

/// Reads the agent's log until `found`, adding every line read to `seen`.
fn read_until(
    agent: &AgentProcess,
    seen: &mut Vec<Value>,
    what: &str,
    found: impl Fn(&Value) -> bool,
) {
    let (line, before) = agent.wait_for(what, found);
    seen.extend(before);
    seen.push(line);
}

#[tokio::test]
async fn kill_9_at_any_point_loses_no_alloc_and_resurrects_none() {
    let data_dir = tempfile::tempdir().unwrap();

    // 1. Mid-start: killed right after the jobs are placed, while runners start.
    let agent = AgentProcess::start_on(data_dir.path());
    for job in jobs() {
        let body = job.to_string();
        let (status, answer) =
            http(agent.socket_addr(), "POST", "/v1/jobs", Some(&body), None).await;
        assert_eq!(status, 200, "{answer}");
    }
    let placed = allocs(&agent).await;
    agent.kill9();
    let counters: Vec<String> = of_job(&placed, "counter").into_iter().cloned().collect();
    let quick: Vec<String> = of_job(&placed, "quick").into_iter().cloned().collect();
    assert_eq!((counters.len(), quick.len()), (3, 2));

    // 2. Mid-checkpoint: the counters checkpoint every 50 ms; killed a few ticks in.
    let (agent, _, mut seen) = restart(data_dir.path(), &counters).await;
    let finished = wait_for_allocs(&agent, "the batch allocs to finish", |a| {
        quick.iter().all(|id| a[id].1 == "complete")
    })
    .await;
    assert_eq!(finished.len(), 5, "nothing duplicated: {finished:?}");
    read_until(&agent, &mut seen, "a few more ticks", |l| {
        guest_line(l).is_some_and(|(_, m)| m == "tick 4")
    });
    seen.extend(parse(&agent.kill9()));
    let ticks = last_ticks(seen.iter());

    let (agent, resumed, mut after_finish) = restart(data_dir.path(), &counters).await;
    for id in &counters {
        let last = ticks[id];
        let from = resumed[id].unwrap_or_else(|| {
            panic!("alloc {id}: no resume after ticking to {last}; lines: {after_finish:#?}")
        });
        // The tick line is logged just before its checkpoint is saved: the kill may fall
        // between the two (one behind). The agent log is written by its own thread, so the
        // kill may also take the last tick's line with it after its checkpoint was saved
        // (one ahead; docs/decisions.md, "The agent log has its own JSON line").
        assert!(
            from + 1 >= last && from <= last + 1,
            "alloc {id}: resumed from {from}, last tick logged {last}: a checkpoint was lost \
             (behind) or the log lost more than its last line (ahead)"
        );
    }

    // 3. Mid-collection: collect the finished batch allocs, killed as that returns.
    let (status, _) = http(agent.socket_addr(), "POST", "/v1/client/gc", None, None).await;
    assert_eq!(status, 200);
    after_finish.extend(parse(&agent.kill9()));
    let (agent, _, mut seen) = restart(data_dir.path(), &counters).await;
    let after = wait_for_allocs(&agent, "the counters running", |a| {
        counters.iter().all(|id| a[id].1 == "running")
    })
    .await;
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        placed.keys().collect::<Vec<_>>(),
        "the same allocs, no more, no fewer"
    );
    for id in &quick {
        assert_eq!(after[id].1, "complete", "finished stays finished");
        // The collection removed its log file; any run of it after the restart would have
        // written a new one.
        let log_file = data_dir.path().join("logs").join(format!("{id}.log"));
        assert!(!log_file.exists(), "collected alloc {id} came back");
    }

    // 4. A clean stop: checkpoints are taken at shutdown, so the count goes on exactly.
    read_until(&agent, &mut seen, "a tick after the restart", |l| {
        guest_line(l).is_some_and(|(_, m)| m.starts_with("tick "))
    });
    let (code, lines) = agent.stop();
    assert_eq!(code, Some(0));
    seen.extend(parse(&lines));
    let ticks = last_ticks(seen.iter());
    after_finish.extend(seen);
    let (agent, resumed, seen) = restart(data_dir.path(), &counters).await;
    after_finish.extend(seen);
    after_finish.extend(parse(&agent.kill9()));
    for id in &counters {
        assert_eq!(
            resumed[id],
            Some(ticks[id]),
            "alloc {id} resumes exactly where a clean stop left it"
        );
    }
    // No finished alloc ran in any start after it finished.
    for (alloc_id, text) in after_finish.iter().filter_map(guest_line) {
        assert!(
            !(quick.iter().any(|q| q == alloc_id) && text.starts_with("tick")),
            "finished alloc {alloc_id} ran again: {text}"
        );
    }
}

#[tokio::test]
async fn finished_allocs_whose_runner_is_gone_are_kept_and_counted_in_one_line() {
    let data_dir = tempfile::tempdir().unwrap();
    let runners = tempfile::tempdir().unwrap();
    let runner = runners.path().join("stateful.wasm");
    std::fs::copy(STATEFUL, &runner).unwrap();
    let agent = AgentProcess::start_on(data_dir.path());
    let job = json!({"job": {"id": "quick", "type": "batch", "count": 3,
        "runner": runner.to_str().unwrap(),
        "tasks": [{"name": "count", "config": {"tick_every": 10, "stop_after": 2}}]}});
    let (status, answer) = http(
        agent.socket_addr(),
        "POST",
        "/v1/jobs",
        Some(&job.to_string()),
        None,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    wait_for_allocs(&agent, "the batch allocs to finish", |a| {
        a.len() == 3 && a.values().all(|(_, status)| status == "complete")
    })
    .await;
    let (code, _) = agent.stop();
    assert_eq!(code, Some(0));
    // The job is done; its runner's file goes, as a finished job's file may, and so does the
    // agent's copy of the build (as if collected, or lost with a disk): nothing is left to
    // load it from.
    std::fs::remove_file(&runner).unwrap();
    std::fs::remove_dir_all(data_dir.path().join("runners/sha256")).unwrap();

    let agent = AgentProcess::start_on(data_dir.path());
    let (restored, before) =
        agent.wait_for("the restore", |l| message(l) == "restored allocations");
    let lines: Vec<&Value> = before.iter().chain([&restored]).collect();
    let kept: Vec<&&Value> = lines
        .iter()
        .filter(|l| message(l).contains("without their runner"))
        .collect();
    assert_eq!(kept.len(), 1, "one line for the three: {lines:#?}");
    assert_eq!(kept[0]["level"], "INFO", "{}", kept[0]);
    assert_eq!(kept[0]["fields"]["count"], 3, "{}", kept[0]);
    assert!(
        kept[0]["fields"]["first_reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("is not on this agent")),
        "{}",
        kept[0]
    );
    let alloc_warnings: Vec<&&Value> = lines
        .iter()
        .filter(|l| l["level"] == "WARN" && l["span"]["alloc_id"].is_string())
        .collect();
    assert!(
        alloc_warnings.is_empty(),
        "no WARN per alloc: {alloc_warnings:#?}"
    );
    let after = allocs(&agent).await;
    assert!(
        after.values().all(|(_, status)| status == "complete"),
        "finished stays finished: {after:?}"
    );
    agent.stop();
}

#[test]
fn a_state_file_this_build_cannot_use_is_refused_and_left_untouched() {
    type Damage = Box<dyn Fn(&Path)>;
    let cases: [(&str, Damage, &str); 3] = [
        (
            "garbage",
            Box::new(|path| {
                std::fs::write(path, b"these are not the bytes you are looking for").unwrap()
            }),
            "not a Caravan state store",
        ),
        (
            "truncated",
            Box::new(|path| {
                let len = std::fs::metadata(path).unwrap().len();
                let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
                file.set_len(len / 2).unwrap();
            }),
            "truncated",
        ),
        (
            "newer schema",
            Box::new(|path| {
                // Written by a later build: schema version 99.
                let db = redb::Database::create(path).unwrap();
                let write = db.begin_write().unwrap();
                {
                    let mut meta = write
                        .open_table(redb::TableDefinition::<&str, u32>::new("caravan_meta"))
                        .unwrap();
                    meta.insert("schema_version", 99).unwrap();
                }
                write.commit().unwrap();
            }),
            "schema version 99 is newer than this build supports (1)",
        ),
    ];
    for (name, damage, expected) in cases {
        let data_dir = tempfile::tempdir().unwrap();
        // A real store first, so truncation cuts a real file.
        let agent = AgentProcess::start_on(data_dir.path());
        agent.stop();
        let state_file = data_dir.path().join("state.db");
        damage(&state_file);
        let before = std::fs::read(&state_file).unwrap();

        let output = run_caravan(
            &[
                "agent",
                "--data-dir",
                data_dir.path().to_str().unwrap(),
                "--bind",
                "127.0.0.1:0",
            ],
            None,
        );
        assert_eq!(output.status.code(), Some(2), "{name}: refused");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let error_lines: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
        assert_eq!(error_lines.len(), 1, "{name}: one line: {stderr}");
        assert!(
            error_lines[0].contains(&state_file.display().to_string())
                && error_lines[0].contains(expected),
            "{name}: names the file and what is wrong: {stderr}"
        );
        assert_eq!(
            std::fs::read(&state_file).unwrap(),
            before,
            "{name}: the file is untouched"
        );
    }
}
