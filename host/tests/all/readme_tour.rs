//! The README's tour, run as written: every command of its first code block, in order, by
//! bash, in a scratch directory that sees the repository's `target/` and `examples/` as a
//! clone does, with the real `caravan` binary first on PATH.
//!
//! Only what a reader would do differently is done here: the agent listens on a free port
//! (`CARAVAN_BIND`, and `CARAVAN_ADDR` for the commands, so each line stays as written), the
//! build lines are skipped (the test command has built everything), `<id-prefix>` is one of
//! the sleeper's allocs, an optional `[ARG]` is left out, and a command that runs until
//! stopped (`&`, `--watch`, `-f`) is stopped once it has shown it works. A failing line
//! fails the test with what it printed and what the agent logged.

use crate::support::{test_cache_dir, wait_for_line};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::Receiver;

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// The tour's commands: the first `sh` block after "## A short tour", comments and blank
/// lines left out.
fn tour_lines() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(REPO).join("README.md")).unwrap();
    let tour = readme
        .split_once("## A short tour")
        .expect("the README has a tour")
        .1;
    let block = tour
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the tour has a sh block")
        .0;
    block
        .lines()
        .map(|line| line.split(" # ").next().unwrap_or("").trim().to_string())
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect()
}

/// Lines the test command has done already: building, and putting the binary on PATH.
fn already_done(line: &str) -> bool {
    ["./run-demo", "cargo build", "export PATH"]
        .iter()
        .any(|start| line.starts_with(start))
}

/// `line` with its placeholders filled: `<id-prefix>` by `alloc`, an optional `[ARG]` left
/// out.
fn filled(line: &str, alloc: Option<&str>) -> String {
    let mut line = line.to_string();
    while let (Some(open), Some(close)) = (line.find(" ["), line.find(']')) {
        if close < open {
            break;
        }
        line.replace_range(open..=close, "");
    }
    if line.contains("<id-prefix>") {
        let alloc = alloc.expect("a command naming an alloc comes after the job runs");
        line = line.replace("<id-prefix>", alloc);
    }
    line
}

/// One scratch directory and what every command runs with.
struct Tour {
    dir: tempfile::TempDir,
    addr: String,
    bind: String,
    agent: Option<(Child, Receiver<String>)>,
    transcript: Vec<String>,
}

impl Tour {
    fn new() -> Tour {
        let dir = tempfile::tempdir().unwrap();
        for shared in ["target", "examples"] {
            std::os::unix::fs::symlink(Path::new(REPO).join(shared), dir.path().join(shared))
                .unwrap();
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Tour {
            dir,
            addr: format!("http://127.0.0.1:{port}"),
            bind: format!("127.0.0.1:{port}"),
            agent: None,
            transcript: Vec::new(),
        }
    }

    fn bash(&self, line: &str) -> Command {
        let binaries = Path::new(env!("CARGO_BIN_EXE_caravan")).parent().unwrap();
        let path = format!(
            "{}:{}",
            binaries.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = Command::new("bash");
        crate::etcd::dies_with_its_parent(&mut command)
            .args(["-c", line])
            .current_dir(self.dir.path())
            .env("PATH", path)
            .env("CARAVAN_ADDR", &self.addr)
            .env("CARAVAN_BIND", &self.bind)
            .env("CARAVAN_CACHE_DIR", test_cache_dir())
            .env("TZ", "UTC0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }

    /// Runs `line` to its end; returns what it printed.
    fn run(&mut self, line: &str) -> Output {
        let output = self.bash(line).output().unwrap();
        self.transcript.push(format!(
            "$ {line}\n(exit {:?})\n{}{}",
            output.status.code(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
        output
    }

    /// Starts `line`, which runs until stopped, and waits until one of its lines (stdout or
    /// stderr) says `works`; then stops it with Ctrl-C unless it is to stay (the agent).
    fn run_until(&mut self, line: &str, works: &str, stays: bool) {
        let mut child = self.bash(line).spawn().unwrap();
        let lines = both_outputs(&mut child);
        let (_, before) = wait_for_line(&lines, works, |l| l.contains(works));
        self.transcript.push(format!(
            "$ {line}\n{}\n(showed {works:?})",
            before.join("\n")
        ));
        if stays {
            self.agent = Some((child, lines));
        } else {
            interrupt(&mut child);
        }
    }

    /// The first 8 characters of one of the sleeper job's allocs.
    fn sleeper_alloc(&mut self) -> String {
        let output = self.run("caravan job status sleeper --json");
        let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let id = status["allocations"][0]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("no alloc in {status}"))
            .to_string();
        id[..8].to_string()
    }
}

impl Drop for Tour {
    fn drop(&mut self) {
        let agent_log: Vec<String> = match self.agent.take() {
            Some((mut child, lines)) => {
                interrupt(&mut child);
                lines.try_iter().collect()
            }
            None => Vec::new(),
        };
        if std::thread::panicking() {
            eprintln!("--- the tour so far:\n{}", self.transcript.join("\n"));
            eprintln!("--- the agent logged:\n{}", agent_log.join("\n"));
        }
    }
}

/// Every line the child writes to stdout or stderr, read on threads of their own.
fn both_outputs(child: &mut Child) -> Receiver<String> {
    let (send, lines) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    for output in [
        Box::new(stdout) as Box<dyn std::io::Read + Send>,
        Box::new(stderr),
    ] {
        let send = send.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(output).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    return;
                }
            }
        });
    }
    lines
}

/// Ctrl-C for the child's whole process group (bash and what it started), then its end.
fn interrupt(child: &mut Child) {
    let _ = Command::new("pkill")
        .args(["-INT", "-P", &child.id().to_string()])
        .status();
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

#[test]
fn the_readme_tour_runs_as_written() {
    let mut tour = Tour::new();
    let mut alloc = None;
    let lines = tour_lines();
    assert!(lines.len() >= 10, "the tour has its commands: {lines:?}");
    for line in lines {
        if already_done(&line) {
            continue;
        }
        if line.contains("alloc status") || line.contains("alloc logs") {
            alloc.get_or_insert_with(|| tour.sleeper_alloc());
        }
        let line = filled(&line, alloc.as_deref());
        if let Some(agent) = line.strip_suffix('&') {
            tour.run_until(agent.trim(), "agent started", true);
        } else if line.contains("--watch") {
            tour.run_until(&line, "client_status=running", false);
        } else if line.contains("logs -f") {
            tour.run_until(&line, "started", false);
        } else {
            let output = tour.run(&line);
            let stderr = String::from_utf8_lossy(&output.stderr);
            // The tour says so: the sleeper reaches no files, and `alloc fs` says why.
            let said_why = line.contains("alloc fs") && stderr.contains("wasi:filesystem");
            assert!(
                output.status.success() || said_why,
                "`{line}` failed:\n{}{stderr}",
                String::from_utf8_lossy(&output.stdout)
            );
        }
    }
}

#[test]
fn placeholders_are_filled_and_optional_arguments_left_out() {
    assert_eq!(
        filled(
            "caravan alloc fs <id-prefix> [/alloc/out.txt]",
            Some("1a2b3c4d")
        ),
        "caravan alloc fs 1a2b3c4d"
    );
    assert_eq!(
        filled("caravan alloc logs -f <id-prefix>", Some("1a2b3c4d")),
        "caravan alloc logs -f 1a2b3c4d"
    );
    assert_eq!(
        filled("caravan job status sleeper", None),
        "caravan job status sleeper"
    );
}
