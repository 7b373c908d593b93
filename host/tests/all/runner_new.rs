//! `caravan runner new`: the scaffold of each language builds with its own script, passes
//! `runner check`, and carries the three commands its README promises; through the real
//! binary, with the toolchains `scripts/setup` installed.

use crate::support::{AgentProcess, run_caravan};
use std::path::{Path, PathBuf};

/// Makes the runner `name` in `language` with `runner new` (and `extra` flags), checks its
/// README carries the three commands, builds it with its own script and returns the folder
/// and the component.
fn scaffold_and_build(
    language: &str,
    name: &str,
    extra: &[&str],
    parent: &Path,
) -> (PathBuf, PathBuf) {
    let dir = parent.to_str().unwrap();
    let mut args = vec!["runner", "new", "--lang", language, name, "--dir", dir];
    args.extend(extra);
    let made = run_caravan(&args, None);
    assert_eq!(made.status.code(), Some(0), "{made:?}");
    let folder = parent.join(name);
    let readme = std::fs::read_to_string(folder.join("README.md")).unwrap();
    for command in [
        "./build".to_string(),
        format!("caravan runner check out/{name}.wasm"),
        format!("caravan job run {name}.toml"),
    ] {
        assert!(readme.contains(&command), "{command} not in:\n{readme}");
    }

    // A Rust scaffold shares the guests' target dir: their dependencies are built already.
    let guests_target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/guests");
    let build = std::process::Command::new(folder.join("build"))
        .env("CARGO_TARGET_DIR", &guests_target)
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "{language} build:\n{}{}",
        String::from_utf8_lossy(&build.stdout),
        String::from_utf8_lossy(&build.stderr)
    );
    assert!(
        !folder.join("__pycache__").exists(),
        "the build leaves the author's folder clean"
    );
    let wasm = folder.join("out").join(format!("{name}.wasm"));
    (folder, wasm)
}

/// `runner check` on `wasm` passes; `judged` is what its output must say besides.
fn passes_the_check(wasm: &Path, judged: &str) {
    let check = run_caravan(
        &[
            "runner",
            "check",
            wasm.to_str().unwrap(),
            "--duration",
            "1s",
        ],
        None,
    );
    let out = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(0), "{out}");
    assert!(out.contains("every required check passed"), "{out}");
    assert!(out.contains(judged), "{out}");
}

fn a_scaffold_builds_and_passes_the_check(language: &str) {
    let parent = tempfile::tempdir().unwrap();
    let (_, wasm) = scaffold_and_build(language, &format!("hello-{language}"), &[], parent.path());
    passes_the_check(&wasm, "stays up under events");
}

/// `runner new --files` (issue 44, part 1): the batch runner writes /alloc/out/result.json,
/// and the guide's way to read it back works: `job run` on an agent, then `caravan alloc fs`.
fn a_files_scaffold_writes_its_result_that_alloc_fs_reads_back(language: &str) {
    let parent = tempfile::tempdir().unwrap();
    let name = format!("files-{language}");
    let (folder, wasm) = scaffold_and_build(language, &name, &["--files"], parent.path());
    passes_the_check(&wasm, "judged as a batch runner");

    let agent = AgentProcess::start();
    let job_file = folder.join(format!("{name}.toml"));
    let run = agent.caravan(&["job", "run", job_file.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(0), "{run:?}");
    let status = agent.caravan(&["job", "status", &name, "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let alloc_id = status["allocations"][0]["id"].as_str().unwrap().to_string();
    let read = agent.caravan(&["alloc", "fs", &alloc_id[..8], "out/result.json"]);
    assert_eq!(read.status.code(), Some(0), "{read:?}");
    assert_eq!(
        String::from_utf8_lossy(&read.stdout),
        format!("{{\"alloc\":\"{alloc_id}\",\"tasks\":1}}\n"),
        "{language}"
    );
}

#[test]
fn a_rust_scaffold_builds_and_passes_the_check() {
    a_scaffold_builds_and_passes_the_check("rust");
}

#[test]
fn a_python_scaffold_builds_and_passes_the_check() {
    a_scaffold_builds_and_passes_the_check("python");
}

#[test]
fn a_javascript_scaffold_builds_and_passes_the_check() {
    a_scaffold_builds_and_passes_the_check("js");
}

#[test]
fn a_c_scaffold_builds_and_passes_the_check() {
    a_scaffold_builds_and_passes_the_check("c");
}

#[test]
fn a_rust_files_scaffold_writes_its_result_that_alloc_fs_reads_back() {
    a_files_scaffold_writes_its_result_that_alloc_fs_reads_back("rust");
}

#[test]
fn a_python_files_scaffold_writes_its_result_that_alloc_fs_reads_back() {
    a_files_scaffold_writes_its_result_that_alloc_fs_reads_back("python");
}

#[test]
fn a_javascript_files_scaffold_writes_its_result_that_alloc_fs_reads_back() {
    a_files_scaffold_writes_its_result_that_alloc_fs_reads_back("js");
}

#[test]
fn a_c_files_scaffold_writes_its_result_that_alloc_fs_reads_back() {
    a_files_scaffold_writes_its_result_that_alloc_fs_reads_back("c");
}

#[test]
fn a_bad_name_or_an_existing_folder_gets_one_line_and_changes_nothing() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().to_str().unwrap();
    let bad = run_caravan(
        &["runner", "new", "--lang", "c", "Bad_Name", "--dir", dir],
        None,
    );
    assert_eq!(bad.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("\"Bad_Name\" cannot name a runner"),
        "{stderr}"
    );

    std::fs::create_dir(parent.path().join("taken")).unwrap();
    let taken = run_caravan(
        &["runner", "new", "--lang", "c", "taken", "--dir", dir],
        None,
    );
    assert_eq!(taken.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&taken.stderr).contains("exists already"));
    assert_eq!(
        std::fs::read_dir(parent.path().join("taken"))
            .unwrap()
            .count(),
        0,
        "the existing folder is untouched"
    );
}
