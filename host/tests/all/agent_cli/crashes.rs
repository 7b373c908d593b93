//! A crashing runner as the CLI shows it: `alloc status` explaining the crash, the job's
//! reschedules, and restarts in place, waiting and then given up.

use super::{sleeper_job, stdout};
use crate::support::AgentProcess;
use caravan_test_artifacts::SLEEPER;
use serde_json::Value;

#[test]
fn alloc_status_explains_a_crash_without_the_agent_log() {
    let agent = AgentProcess::start();
    let dir = tempfile::tempdir().unwrap();
    // The interval is said back as written, not as the agent would write it (`60m`).
    let reschedule = "[job.reschedule]\nattempts = 1\ndelay = \"1s\"\ninterval = \"3600s\"\n";
    let job_file = sleeper_job(
        dir.path(),
        "crashy",
        1,
        r#"crash_after = "50ms""#,
        reschedule,
    );
    // It may exit 1 here: the alloc can fail before `job run` sees it running.
    let run = agent.caravan(&["job", "run", job_file.to_str().unwrap()]);
    assert!(
        stdout(&run).contains("job crashy registered"),
        "{}",
        stdout(&run)
    );

    let failed_alloc = || {
        let allocs = agent.caravan(&["job", "status", "crashy", "--json"]);
        let allocs: Value = serde_json::from_slice(&allocs.stdout).unwrap();
        allocs["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["client_status"] == "failed")
            .map(|a| a["id"].as_str().unwrap().to_string())
    };
    let alloc_id = (0..300)
        .find_map(|_| {
            failed_alloc().or_else(|| {
                std::thread::sleep(std::time::Duration::from_millis(50));
                None
            })
        })
        .expect("the alloc crashes within 15 s");

    let status = stdout(&agent.caravan(&["alloc", "status", &alloc_id[..8]]));
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name)?.trim_start().strip_prefix("= "))
            .unwrap_or_else(|| panic!("no {name} in:\n{status}"))
            .to_string()
    };
    assert_eq!(field("ID"), alloc_id, "the full id");
    // The build: the first 12 hex digits of the component's SHA-256.
    let sha256 = {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(std::fs::read(SLEEPER).unwrap());
        digest
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    assert_eq!(
        field("Runner"),
        format!("{SLEEPER} (sha256 {})", &sha256[..12])
    );
    assert_eq!(field("Client Status"), "failed");
    let description = field("Client Description");
    assert!(
        description.starts_with("wasm trap: ")
            && description.contains("; its last words: panicked at sleeper/src/lib.rs:")
            && description.ends_with(": task web crashed on purpose (crash_after 50ms)"),
        "{status}"
    );
    // The sleeper reaches no files: it is given no alloc dir, and none is shown.
    assert!(!status.contains("Alloc Dir"), "{status}");
    assert!(field("Limits").contains("memory=64 MiB"), "{status}");
    assert!(field("CPU Used").ends_with('s'), "{status}");
    assert!(
        field("Memory Peak").ends_with(" MiB") || field("Memory Peak").ends_with(" KiB"),
        "a runner holds some memory: {status}"
    );
    let (_, recent_log) = status.split_once("Recent Log Lines:\n").expect(&status);
    assert!(
        recent_log.contains("WARN stderr: panicked at sleeper/src/lib.rs:"),
        "{status}"
    );
    assert!(
        status.contains("Task \"web\" is \"dead\" (failed, 0 restarts)"),
        "{status}"
    );
    assert!(status.contains("Terminated  wasm trap: "), "{status}");

    // Replaced once, a second after the crash; the replacement crashes too, and the job says
    // there will be no more.
    let restarts = (0..300)
        .find_map(|_| {
            let job = stdout(&agent.caravan(&["job", "status", "crashy"]));
            let line = job
                .lines()
                .find(|l| l.starts_with("Recovery: reschedule limit"));
            line.map(str::to_string).or_else(|| {
                std::thread::sleep(std::time::Duration::from_millis(50));
                None
            })
        })
        .expect("the restart limit is reached within 15 s");
    assert!(
        restarts.starts_with("Recovery: reschedule limit reached: 1 in 3600s (alloc ")
            && restarts.contains(" failed: wasm trap: "),
        "{restarts}"
    );
    // None runs and none will: the job reads dead (not running), its failures beside it.
    let table = stdout(&agent.caravan(&["job", "status", "crashy"]));
    let row = table
        .lines()
        .find(|l| l.starts_with("crashy"))
        .unwrap_or_default();
    assert!(
        row.contains(" dead ") && row.contains("failed=2"),
        "{table}"
    );
    let allocs = agent.caravan(&["job", "status", "crashy", "--json"]);
    let allocs: Value = serde_json::from_slice(&allocs.stdout).unwrap();
    let replacement = allocs["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] != alloc_id.as_str())
        .expect("one replacement");
    let replacement_id = replacement["id"].as_str().unwrap();
    let replacement_status = stdout(&agent.caravan(&["alloc", "status", replacement_id]));
    assert!(
        replacement_status.contains(&format!(
            "Replaces           = alloc {} (reschedule 1, not before ",
            &alloc_id[..8]
        )),
        "{replacement_status}"
    );
    agent.stop();
}

/// Runs `caravan args` until its output contains `wanted`, for up to a minute (what it shows
/// is the server's view, which a client's report reaches a moment after the agent logs it);
/// returns the last output either way. Only for text that stays once it is there: a test
/// must not race a window of wall-clock time.
fn stdout_once_it_says(agent: &AgentProcess, args: &[&str], wanted: &str) -> String {
    let deadline = std::time::Instant::now() + crate::support::DEADLINE;
    loop {
        let said = stdout(&agent.caravan(args));
        if said.contains(wanted) || std::time::Instant::now() >= deadline {
            return said;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn a_crashed_runner_waiting_to_restart_says_what_is_next_and_why() {
    let agent = AgentProcess::start();
    let dir = tempfile::tempdir().unwrap();
    // A wait far longer than the test: what `job status` says of it cannot pass meanwhile.
    let job_file = sleeper_job(
        dir.path(),
        "waiting",
        1,
        r#"crash_after = "50ms""#,
        "[job.restart]\nattempts = 1\ndelay = \"1h\"\ninterval = \"2h\"\n",
    );
    agent.caravan(&["job", "run", "--detach", job_file.to_str().unwrap()]);
    // The wait and the window as the job wrote them.
    let expected = " restarting in 1h (restart 1, at most 1 in 2h) after: wasm trap";
    let waiting = stdout_once_it_says(&agent, &["job", "status", "waiting"], expected);
    assert!(
        waiting.contains("Recovery: alloc ") && waiting.contains(expected),
        "{waiting}"
    );
}

#[test]
fn a_job_files_restart_block_restarts_a_crashed_runner_in_place_then_lets_it_fail() {
    let agent = AgentProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let job_file = sleeper_job(
        dir.path(),
        "restarty",
        1,
        r#"crash_after = "50ms""#,
        "[job.restart]\nattempts = 1\ndelay = \"5s\"\ninterval = \"1800s\"\n",
    );
    agent.caravan(&["job", "run", "--detach", job_file.to_str().unwrap()]);
    let (failed, _) = agent.wait_for("the restarted runner's final failure", |line| {
        line["fields"]["message"] == "runner stopped" && line["fields"]["client_status"] == "failed"
    });
    let description = failed["fields"]["description"].as_str().unwrap();
    assert!(
        description.ends_with("(restart limit reached: 1 in 1800s)"),
        "{description}"
    );
    let alloc_id = failed["span"]["alloc_id"].as_str().unwrap();
    let dead = "Task \"web\" is \"dead\" (failed, 1 restarts)";
    let status = stdout_once_it_says(&agent, &["alloc", "status", alloc_id], dead);
    assert!(status.contains(dead), "{status}");
    assert!(
        status.contains("  Restarting  Task restarting in 5s"),
        "{status}"
    );
}
