//! The compile cache: `runner check`, `caravan run` and the agent share one, under the
//! user's home unless told otherwise.

use super::sleeper_job;
use crate::support::AgentProcess;
use caravan_test_artifacts::SLEEPER;
use std::path::{Path, PathBuf};

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
