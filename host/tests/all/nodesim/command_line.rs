//! The `caravan nodesim` command itself: the flags it refuses, the examples it ships with,
//! and what it does when nobody reads its output.

use super::*;

/// Nodesim ignores SIGPIPE, as a server does: once the reader of its output leaves, its
/// lines are dropped, and it runs on until stopped, then stops its nodes and exits 0. Each
/// `println!` panicked there ("failed printing to stdout: Broken pipe").
#[test]
fn nodesim_runs_on_and_stops_cleanly_once_nobody_reads_its_output() {
    use std::io::BufRead;
    let agent = AgentProcess::start_configured(&["--dev"], "enabled = false\n");
    let mut child = crate::etcd::dies_with_its_parent(&mut crate::support::caravan_command())
        .args(["nodesim", "--server", &agent.addr, "--nodes", "2"])
        .args(["--summary-every", "100ms", "--max-live-allocs", "16"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("caravan nodesim starts");
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    if !first.contains("registering") {
        let output = child.wait_with_output().unwrap();
        panic!(
            "{first:?}; stderr: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    // The reader leaves; the summary lines, then the report printed on the interrupt, find
    // the pipe closed.
    drop(stdout);
    interrupt(&child);
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    agent.stop();
}

#[test]
fn nodesim_refuses_bad_flags_with_one_line() {
    for (args, named) in [
        (&["nodesim", "--nodes", "0"][..], "--nodes"),
        (
            &["nodesim", "--nodes", "5", "--server", "127.0.0.1:1"][..],
            "http://HOST:PORT",
        ),
        (
            &["nodesim", "--nodes", "5", "--summary-every", "1ms"][..],
            "--summary-every",
        ),
        (
            &["nodesim", "--nodes", "5", "--cluster", "zk"][..],
            "--cluster",
        ),
        (
            &["nodesim", "--nodes", "5", "--cluster", "etcd"][..],
            "--etcd-endpoints",
        ),
        (
            &["nodesim", "--nodes", "5", "--name-prefix", "a/b"][..],
            "--name-prefix",
        ),
        (
            &[
                "nodesim",
                "--nodes",
                "5",
                "--cluster",
                "etcd",
                "--etcd-endpoints",
                "https://127.0.0.1:1",
            ][..],
            "https:// endpoints need --etcd-ca-file",
        ),
    ] {
        let output = run_caravan(args, None);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(named), "{stderr}");
    }
}

#[test]
fn the_nodesim_examples_are_a_valid_job_and_agent_config() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let job = std::fs::read_to_string(examples.join("sim.toml")).unwrap();
    let job = caravan_host::model::jobspec::parse_toml(&job).unwrap();
    assert!(job.runner.ends_with("sim.wasm"), "{}", job.runner);
    let agent = std::fs::read_to_string(examples.join("scheduler-only.toml")).unwrap();
    let mut config = caravan_host::agent::config::AgentConfig::default();
    caravan_host::agent::config::apply_file(&mut config, "scheduler-only.toml", &agent).unwrap();
    assert!(!config.client_enabled);
}
