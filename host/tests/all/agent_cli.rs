//! The real `caravan` binary as an operator uses it: an agent, and the client commands
//! talking to it over HTTP.

use crate::support::AgentProcess;
use caravan_test_artifacts::{FIXTURE_WRONG_WORLD, SLEEPER};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs `caravan args` until its output contains `wanted`, for up to a minute (what it shows
/// is the server's view, which a client's report reaches a moment after the agent logs it);
/// returns the last output either way. Only for text that stays once it is there: a test
/// must not race a window of wall-clock time.
fn stdout_once_it_says(agent: &AgentProcess, args: &[&str], wanted: &str) -> String {
    let mut said = String::new();
    for _ in 0..600 {
        said = stdout(&agent.caravan(args));
        if said.contains(wanted) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    said
}

/// Writes `<dir>/<id>.toml`, a service job of `count` sleeper allocs with one task `web` of
/// `config` (the inside of a TOML inline table), followed by `more` TOML; returns its path.
fn sleeper_job(dir: &Path, id: &str, count: u32, config: &str, more: &str) -> PathBuf {
    let path = dir.join(format!("{id}.toml"));
    let text = format!(
        "[job]\nid = {id:?}\ntype = \"service\"\ncount = {count}\nrunner = {SLEEPER:?}\n\
         [[job.tasks]]\nname = \"web\"\nconfig = {{ {config} }}\n{more}"
    );
    std::fs::write(&path, text).unwrap();
    path
}

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
fn alloc_status_explains_a_crash_without_the_agent_log() {
    let agent = AgentProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let reschedule = "[job.reschedule]\nattempts = 1\ndelay = \"1s\"\n";
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
                .find(|l| l.starts_with("Restarts: restart limit"));
            line.map(str::to_string).or_else(|| {
                std::thread::sleep(std::time::Duration::from_millis(50));
                None
            })
        })
        .expect("the restart limit is reached within 15 s");
    assert!(
        restarts.starts_with("Restarts: restart limit reached: 1 in 60m (alloc ")
            && restarts.contains(" failed: wasm trap: "),
        "{restarts}"
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
            "Replaces           = alloc {} (restart 1, not before ",
            &alloc_id[..8]
        )),
        "{replacement_status}"
    );
    agent.stop();
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

    let unknown = agent.caravan(&["job", "status", "nope"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&unknown.stderr).trim(),
        "error: job \"nope\" not found (404)"
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
            error.contains("is outside the alloc dir") && error.contains("(400)"),
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
    assert!(
        error.contains("does not exist in the alloc dir") && error.contains("(404)"),
        "{error}"
    );
    agent.stop();
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
                error.contains("job.runner: ") && error.contains(named) && error.contains("(400)"),
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
        error.contains("invalid TOML at line 6, column 1") && error.contains("`[[job.tasks]]`"),
        "{error}"
    );
    agent.stop();
}

/// Every compiled component a cache dir holds (one file each).
fn cache_entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| entries.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default()
}

#[test]
fn runner_check_run_and_the_agent_share_one_compile_cache() {
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = cache.path().to_str().unwrap();
    let check = crate::support::caravan_command()
        .args(["runner", "check", SLEEPER, "--kill-timeout", "300ms"])
        .env("CARAVAN_CACHE_DIR", cache_dir)
        .output()
        .unwrap();
    assert_eq!(cache_entries(cache.path()).len(), 1, "{check:?}");

    // The agent given that cache starts the runner without compiling it.
    let agent = AgentProcess::start_configured(&["--dev", "--cache-dir", cache_dir], "");
    let dir = tempfile::tempdir().unwrap();
    let job_file = sleeper_job(dir.path(), "cached", 1, "", "");
    let run = agent.caravan(&["job", "run", job_file.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(0));
    let (loaded, before) = agent.wait_for("the runner loaded from the cache", |line| {
        line["fields"]["message"] == "loaded compiled runner from the cache"
    });
    assert_eq!(loaded["fields"]["runner"], "sleeper.wasm", "{loaded}");
    assert!(
        !before.iter().any(|l| l["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("compiling"))),
        "{before:#?}"
    );
    assert_eq!(cache_entries(cache.path()).len(), 1);
    agent.stop();

    // Told nothing, `caravan run` uses the cache under the user's home, as the agent and
    // `runner check` do.
    let home = tempfile::tempdir().unwrap();
    let ran = crate::support::caravan_command()
        .args(["run", SLEEPER, "--config", "run_for=10ms"])
        .env_remove("CARAVAN_CACHE_DIR")
        .env_remove("XDG_CACHE_HOME")
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert_eq!(ran.status.code(), Some(0), "{ran:?}");
    let shared = home.path().join(".cache/caravan/components");
    assert_eq!(cache_entries(&shared).len(), 1, "{ran:?}");
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
    let expected = " restarting in 60m (restart 1, at most 1 in 120m) after: wasm trap";
    let waiting = stdout_once_it_says(&agent, &["job", "status", "waiting"], expected);
    assert!(
        waiting.contains("Restarts: alloc ") && waiting.contains(expected),
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
        "[job.restart]\nattempts = 1\ndelay = \"5s\"\n",
    );
    agent.caravan(&["job", "run", "--detach", job_file.to_str().unwrap()]);
    let (failed, _) = agent.wait_for("the restarted runner's final failure", |line| {
        line["fields"]["message"] == "runner stopped" && line["fields"]["client_status"] == "failed"
    });
    let description = failed["fields"]["description"].as_str().unwrap();
    assert!(
        description.ends_with("(restart limit reached: 1 in 30m)"),
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
