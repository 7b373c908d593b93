//! The real `caravan` binary as an operator uses it: an agent, and the client commands
//! talking to it over HTTP. This module holds the shared helpers; the tests are in its
//! submodules.

mod allocs;
mod compile_cache;
mod crashes;
mod jobs;
mod placement;

use caravan_test_artifacts::SLEEPER;
use std::path::{Path, PathBuf};
use std::process::Output;

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
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
