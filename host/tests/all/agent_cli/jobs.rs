//! The job commands: run, status, scale and stop, validate and plan, and the one clear line
//! for a bad job file, an unknown job or no agent at all.

use super::{sleeper_job, stdout};
use crate::support::AgentProcess;
use caravan_test_artifacts::{FIXTURE_WRONG_WORLD, SLEEPER};
use serde_json::Value;

#[test]
fn an_operator_runs_inspects_scales_and_stops_a_job_through_the_cli() {
    let agent = AgentProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let job_file = sleeper_job(dir.path(), "sleepy", 2, r#"log_every = "1s""#, "");

    let run = agent.caravan(&["job", "run", job_file.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(0));
    assert!(
        stdout(&run).contains("allocs: 0 pending, 2 running, 0 complete, 0 failed"),
        "{}",
        stdout(&run)
    );

    let status = agent.caravan(&["job", "status", "sleepy", "--json"]);
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    let alloc_id = status["allocations"][0]["id"].as_str().unwrap().to_string();
    let alloc = agent.caravan(&["alloc", "status", &alloc_id[..8]]);
    assert!(
        stdout(&alloc).contains("Task \"web\" is \"running\""),
        "found by unique prefix"
    );

    let logs = agent.caravan(&["alloc", "logs", &alloc_id[..8]]);
    assert!(
        stdout(&logs).contains("INFO sleeper: task web started; runs until killed"),
        "a guest line"
    );

    let scaled = agent.caravan(&["job", "scale", "sleepy", "1"]);
    let scaled_line = stdout(&scaled);
    assert!(
        scaled_line.contains("job sleepy scaled to 1: 0 placed, 1 stopped"),
        "{scaled_line}"
    );
    let stopped = agent.caravan(&["job", "stop", "--purge", "sleepy"]);
    assert_eq!(stopped.status.code(), Some(0));
    assert!(
        stdout(&stopped).contains(
            "job sleepy stopped: 1 allocs asked to stop; purged: the job is removed once its \
             allocs are collected"
        ),
        "the purge is confirmed: {}",
        stdout(&stopped)
    );

    let (code, lines) = agent.stop();
    assert_eq!(code, Some(0), "the agent stops cleanly on Ctrl-C");
    assert!(lines.iter().any(|l| l.contains("agent stopped")));
}

#[test]
fn a_bad_job_file_and_an_unknown_job_each_get_one_clear_line() {
    let agent = AgentProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let job_file = dir.path().join("bad.toml");
    std::fs::write(
        &job_file,
        "[job]\nid = \"bad\"\ntype = \"service\"\ncount = -1\nrunner = \"r.wasm\"\n",
    )
    .unwrap();
    let bad = agent.caravan(&["job", "run", job_file.to_str().unwrap()]);
    assert_eq!(bad.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("job.count: -1 is out of range"), "{stderr}");

    // The message alone; the HTTP status with --verbose.
    let unknown = agent.caravan(&["job", "status", "nope"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&unknown.stderr).trim(),
        "error: job \"nope\" not found"
    );
    let verbose = agent.caravan(&["job", "status", "nope", "--verbose"]);
    assert_eq!(
        String::from_utf8_lossy(&verbose.stderr).trim(),
        "error: job \"nope\" not found (HTTP 404)"
    );
    agent.stop();
}

#[test]
fn without_an_agent_the_cli_says_where_it_looked_and_how_to_start_one() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let output = crate::support::caravan_command()
        .args(["job", "status"])
        .env("CARAVAN_ADDR", &addr)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("cannot reach the Caravan agent at {addr}")),
        "{stderr}"
    );
    assert!(stderr.contains("caravan agent --dev"), "{stderr}");
}

#[test]
fn job_validate_and_plan_change_nothing_and_a_broken_job_never_registers() {
    let agent = AgentProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let job_file = dir.path().join("sleepy.toml");
    // The runner's path as an operator might write it, with `.` and `..` in it.
    let sleeper = std::path::Path::new(SLEEPER);
    let (runner_dir, runner_name) = (sleeper.parent().unwrap(), sleeper.file_name().unwrap());
    let winding = format!(
        "{}/./../{}/{}",
        runner_dir.display(),
        runner_dir.file_name().unwrap().to_string_lossy(),
        runner_name.to_string_lossy()
    );
    let write_job = |count: u32, runner: &str, log_every: &str| {
        std::fs::write(
            &job_file,
            format!("[job]\nid = \"sleepy\"\ntype = \"service\"\ncount = {count}\nrunner = {runner:?}\n[[job.tasks]]\nname = \"web\"\nconfig = {{ log_every = {log_every:?} }}\n"),
        )
        .unwrap();
    };
    let job_file_arg = job_file.to_str().unwrap();
    let jobs = || stdout(&agent.caravan(&["job", "status", "--json"]));

    write_job(2, &winding, "1s");
    let valid = agent.caravan(&["job", "validate", job_file_arg]);
    assert_eq!(valid.status.code(), Some(0), "{}", stdout(&valid));
    assert!(
        stdout(&valid).starts_with(&format!("job sleepy is valid: runner {SLEEPER} (sha256 ")),
        "the path normalised: {}",
        stdout(&valid)
    );
    let plan = stdout(&agent.caravan(&["job", "plan", job_file_arg]));
    assert!(
        plan.contains("+ job sleepy: new, version 1")
            && plan.contains("place 2 allocs (2 on local)")
            && plan.contains("nothing was changed"),
        "{plan}"
    );
    assert_eq!(jobs().trim(), "[]", "validate and plan registered nothing");

    let run = agent.caravan(&["job", "run", job_file_arg]);
    assert_eq!(run.status.code(), Some(0), "{}", stdout(&run));
    let before = stdout(&agent.caravan(&["job", "status", "sleepy", "--json"]));
    let plan_again = stdout(&agent.caravan(&["job", "plan", job_file_arg]));
    assert!(
        plan_again.contains("job sleepy: no change (version 1)"),
        "{plan_again}"
    );
    write_job(3, &winding, "1s");
    let scale = stdout(&agent.caravan(&["job", "plan", job_file_arg]));
    assert!(
        scale.contains("count changed, version 1 stays") && scale.contains("place 1 allocs"),
        "{scale}"
    );
    write_job(2, &winding, "2s");
    let replace = stdout(&agent.caravan(&["job", "plan", job_file_arg]));
    assert!(
        replace.contains("version 1 -> 2")
            && replace.contains("place 2 allocs")
            && replace.contains("stop 2 allocs: "),
        "{replace}"
    );
    let after = stdout(&agent.caravan(&["job", "status", "sleepy", "--json"]));
    let versions_and_ids = |status: &str| {
        let status: Value = serde_json::from_str(status).unwrap();
        let ids: Vec<String> = status["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["id"].as_str().unwrap().to_string())
            .collect();
        (status["job"]["version"].clone(), ids)
    };
    assert_eq!(
        versions_and_ids(&after),
        versions_and_ids(&before),
        "plans changed nothing"
    );

    // A job whose runner is missing or is no runner is refused before it registers, by
    // validate and by run alike, naming the runner.
    for (runner, named) in [
        (
            "/no/such/runner.wasm".to_string(),
            "runner component /no/such/runner.wasm does not exist",
        ),
        (
            FIXTURE_WRONG_WORLD.to_string(),
            "does not export `caravan:runner/runner@0.1.0`",
        ),
    ] {
        std::fs::write(
            &job_file,
            format!("[job]\nid = \"broken\"\ntype = \"batch\"\ncount = 1\nrunner = {runner:?}\n"),
        )
        .unwrap();
        for command in ["validate", "run"] {
            let refused = agent.caravan(&["job", command, job_file_arg]);
            let error = String::from_utf8_lossy(&refused.stderr);
            assert_eq!(
                refused.status.code(),
                Some(1),
                "{command} {runner}: {error}"
            );
            assert!(
                error.contains("job.runner: ") && error.contains(named) && !error.contains("(400)"),
                "{command} {runner}: {error}"
            );
        }
    }
    let missing = agent.caravan(&["job", "status", "broken"]);
    assert_eq!(missing.status.code(), Some(1), "never registered");

    // A TOML mistake is placed, with a hint.
    std::fs::write(
        &job_file,
        "[job]\nid = \"sleepy\"\ntype = \"service\"\ncount = 1\nrunner = \"r.wasm\"\n[job.tasks]\nname = \"web\"\n",
    )
    .unwrap();
    let single_brackets = agent.caravan(&["job", "validate", job_file_arg]);
    let error = String::from_utf8_lossy(&single_brackets.stderr);
    assert!(
        error.contains(":6:6: job.tasks: ") && error.contains("`[[job.tasks]]`"),
        "{error}"
    );

    // Every mistake at once, in file order, each where it is, with a near miss named.
    std::fs::write(
        &job_file,
        "[job]\nid = \"sleepy\"\ntype = \"servce\"\ncount = 1\nrunner = \"r.wasm\"\n\
         [job.limits]\nmemroy = \"64MiB\"\nkill_timeout = \"soon\"\n[[job.task]]\nname = \"web\"\n",
    )
    .unwrap();
    let many = agent.caravan(&["job", "validate", job_file_arg]);
    let error = String::from_utf8_lossy(&many.stderr);
    let lines: Vec<&str> = error.lines().collect();
    assert_eq!(lines.len(), 4, "{error}");
    for (line, expected) in lines.iter().zip([
        ":3:1: job.type: unknown job type \"servce\"; did you mean `service`?",
        ":7:1: job.limits.memroy: unknown key `memroy`; did you mean `memory`?",
        ":8:1: job.limits.kill_timeout: ",
        ":9:7: job.task: unknown key `task`; did you mean `tasks`?",
    ]) {
        assert!(line.contains(expected), "{expected} in {error}");
    }
    agent.stop();
}

#[test]
fn job_run_of_a_batch_job_waits_until_its_allocs_finish_unless_detached() {
    let agent = AgentProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let job_file = dir.path().join("count.toml");
    std::fs::write(
        &job_file,
        format!(
            "[job]\nid = \"count\"\ntype = \"batch\"\ncount = 2\nrunner = {:?}\n\
             [[job.tasks]]\nname = \"count\"\nconfig = {{ tick_every = 50, stop_after = 6 }}\n",
            caravan_test_artifacts::STATEFUL
        ),
    )
    .unwrap();
    let run = agent.caravan(&["job", "run", job_file.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(0));
    let last = stdout(&run).lines().last().unwrap_or_default().to_string();
    assert_eq!(
        last,
        "allocs: 0 pending, 0 running, 2 complete, 0 failed",
        "waited until both finished: {}",
        stdout(&run)
    );
    // A batch job that runs for minutes: detached, `job run` returns while it runs.
    let long = job_file.with_file_name("long.toml");
    let text = std::fs::read_to_string(&job_file).unwrap();
    let text = text
        .replace("id = \"count\"", "id = \"long\"")
        .replace("stop_after = 6", "stop_after = 100000");
    std::fs::write(&long, text).unwrap();
    let detached = agent.caravan(&["job", "run", "--detach", long.to_str().unwrap()]);
    assert_eq!(detached.status.code(), Some(0));
    assert!(
        stdout(&detached).contains("job long registered: 2 allocs placed")
            && !stdout(&detached).contains("allocs:"),
        "registered, no wait: {}",
        stdout(&detached)
    );
    let status = agent.caravan(&["job", "status", "long", "--json"]);
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(
        status["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["client_status"] != "complete"),
        "still running: {status}"
    );
    agent.stop();
}
