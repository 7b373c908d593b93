//! The alloc commands: status, logs and fs on a running alloc, and what an agent restarted on
//! its data dir still shows of a stopped job.

use super::stdout;
use crate::support::AgentProcess;
use caravan_test_artifacts::SLEEPER;
use serde_json::Value;

#[test]
fn an_operator_runs_the_sleeper_example_stops_it_restarts_the_agent_and_finds_everything() {
    let data_dir = tempfile::tempdir().unwrap();
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/sleeper.toml");
    let agent = AgentProcess::start_on(data_dir.path());
    let run = agent.caravan(&["job", "run", example]);
    assert_eq!(run.status.code(), Some(0), "{}", stdout(&run));

    let status = agent.caravan(&["job", "status", "sleeper", "--json"]);
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    let ids: Vec<String> = status["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 3);
    let alloc = agent.caravan(&["alloc", "status", &ids[0]]);
    assert!(
        stdout(&alloc).contains("Task \"web\" is \"running\""),
        "{}",
        stdout(&alloc)
    );
    let logs = agent.caravan(&["alloc", "logs", &ids[0]]);
    assert!(
        stdout(&logs).contains("INFO sleeper: task web started"),
        "a guest line: {}",
        stdout(&logs)
    );
    assert_eq!(
        agent.caravan(&["job", "stop", "sleeper"]).status.code(),
        Some(0)
    );
    let stopped = |agent: &AgentProcess| -> Vec<(String, String, String)> {
        let status = agent.caravan(&["job", "status", "sleeper", "--json"]);
        let status: Value = serde_json::from_slice(&status.stdout).unwrap();
        let mut allocs: Vec<_> = status["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let field = |name: &str| a[name].as_str().unwrap_or_default().to_string();
                (field("id"), field("desired_status"), field("client_status"))
            })
            .collect();
        allocs.sort();
        allocs
    };
    let mut before = stopped(&agent);
    for _ in 0..100 {
        if before.iter().all(|(_, _, client)| client == "complete") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        before = stopped(&agent);
    }
    assert!(
        before
            .iter()
            .all(|(_, desired, client)| desired == "stop" && client == "complete"),
        "{before:?}"
    );
    let (code, _) = agent.stop();
    assert_eq!(code, Some(0));

    let agent = AgentProcess::start_on(data_dir.path());
    assert_eq!(stopped(&agent), before, "statuses intact after the restart");
    let alloc = agent.caravan(&["alloc", "status", &ids[0][..8]]);
    assert!(stdout(&alloc).contains("complete"), "{}", stdout(&alloc));
    let logs = agent.caravan(&["alloc", "logs", &ids[0]]);
    assert!(
        stdout(&logs).contains("INFO sleeper: task web started"),
        "its logs kept until collected: {}",
        stdout(&logs)
    );
    let job = agent.caravan(&["job", "status"]);
    assert!(stdout(&job).contains("sleeper"), "{}", stdout(&job));
    agent.stop();
}

#[test]
fn alloc_fs_lists_and_prints_an_allocs_files_and_nothing_outside_its_dir() {
    let data_dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start_on(data_dir.path());
    let job_file = data_dir.path().join("files.toml");
    std::fs::write(
        &job_file,
        format!("[job]\nid = \"files\"\ntype = \"service\"\ncount = 1\nrunner = {SLEEPER:?}\n[[job.tasks]]\nname = \"main\"\n"),
    )
    .unwrap();
    let run = agent.caravan(&["job", "run", job_file.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(0), "{}", stdout(&run));
    let status = agent.caravan(&["job", "status", "files", "--json"]);
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    let alloc_id = status["allocations"][0]["id"].as_str().unwrap().to_string();
    // What a runner might leave, and links planted to lead out of the dir.
    let alloc_dir = data_dir.path().join("allocs").join(&alloc_id);
    std::fs::create_dir_all(alloc_dir.join("out")).unwrap();
    std::fs::write(alloc_dir.join("out/result.json"), "{\"answer\":42}\n").unwrap();
    std::fs::write(data_dir.path().join("secret.txt"), "not the runner's").unwrap();
    std::os::unix::fs::symlink("../../secret.txt", alloc_dir.join("link-out")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", alloc_dir.join("link-abs")).unwrap();
    let fs = |path: Option<&str>| {
        let mut args = vec!["alloc", "fs", &alloc_id[..8]];
        args.extend(path);
        agent.caravan(&args)
    };

    let listed = fs(None);
    assert_eq!(listed.status.code(), Some(0), "{listed:?}");
    let table = stdout(&listed);
    assert!(table.contains("Kind") && table.contains("out"), "{table}");
    assert!(
        table.contains("symlink"),
        "links are listed, not followed: {table}"
    );
    for path in ["out/result.json", "/alloc/out/result.json"] {
        let printed = fs(Some(path));
        assert_eq!(stdout(&printed), "{\"answer\":42}\n", "{path}: {printed:?}");
    }
    for path in ["../secret.txt", "/etc/passwd", "link-out", "link-abs"] {
        let refused = fs(Some(path));
        let error = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(1), "{path}: {error}");
        assert!(
            error.contains("is outside the alloc dir"),
            "{path}: {error}"
        );
        assert!(!stdout(&refused).contains("not the runner's"));
    }
    // Times read as local dates (UTC here: the tests' zone); --json gives the log line by
    // line as objects.
    let alloc = stdout(&agent.caravan(&["alloc", "status", &alloc_id[..8]]));
    assert!(alloc.contains(" +00:00  Received  "), "{alloc}");
    let two_hours_east = crate::support::caravan_command()
        .args(["alloc", "status", &alloc_id[..8]])
        .env("CARAVAN_ADDR", &agent.addr)
        .env("TZ", "XYZ-2")
        .output()
        .unwrap();
    assert!(
        stdout(&two_hours_east).contains(" +02:00  Received  "),
        "{}",
        stdout(&two_hours_east)
    );
    let logs_as_json = agent.caravan(&["alloc", "logs", &alloc_id[..8], "--json"]);
    assert_eq!(logs_as_json.status.code(), Some(0));
    let objects: Vec<Value> = stdout(&logs_as_json)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    assert!(!objects.is_empty());
    for object in &objects {
        assert!(
            ["INFO", "WARN"].contains(&object["level"].as_str().unwrap_or_default())
                && object["time"].as_str().is_some_and(|t| t.ends_with('Z'))
                && object["source"].is_string()
                && object["message"].is_string(),
            "{object}"
        );
    }

    let missing = fs(Some("out/nope.txt"));
    let error = String::from_utf8_lossy(&missing.stderr);
    assert!(error.contains("does not exist in the alloc dir"), "{error}");
    agent.stop();
}
