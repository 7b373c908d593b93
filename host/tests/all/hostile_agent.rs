//! The hostile suite under a real agent: the `caravan` binary, with a healthy sleeper beside
//! the attackers. Each attack runs as a batch job of its own, one after the other, and must
//! end only its own alloc (failed with its cause named, or, for a probe or a flood, complete
//! with nothing reached; a runner the agent cannot load is refused at submit, named), while the agent keeps answering, the neighbour keeps ticking, and
//! the agent's memory, descriptors and disk stay within the bounds `docs/security.md` states.
//!
//! What each attack does to the host in detail is the business of the per-fixture tests
//! (`fixture_hostile.rs` and the others); this one asserts that none of them reaches past its
//! alloc on a node that runs them all.

use crate::support::*;
use caravan_test_artifacts::{
    FIXTURE_HOSTILE, FIXTURE_LOG_FLOOD, FIXTURE_MEMORY_HOG, FIXTURE_SPIN_LOOP, FIXTURE_TRAP,
    FIXTURE_UNKNOWN_IMPORT, SLEEPER,
};
use serde_json::{Value, json};
use std::path::Path;

/// How much the agent's resident memory may grow over the whole suite.
const RSS_GROWTH_BOUND_KIB: u64 = 256 * 1024;
/// How many more descriptors the agent may hold once an attack has ended.
const FD_GROWTH_BOUND: u64 = 64;
/// How much the data dir may grow over the whole suite (the disk-fill writes 4 MiB of it).
const DISK_GROWTH_BOUND_KIB: u64 = 64 * 1024;

/// The end of an attack whose runner cannot be loaded: its job is refused with 400.
const REFUSED_AT_SUBMIT: &str = "refused at submit";

struct Attack {
    name: &'static str,
    runner: String,
    config: Value,
    limits: Value,
    /// The status the attacker's alloc ends in: `failed` for an attack the host stops, or
    /// `complete` for a probe that reports what it reached and a flood that is throttled;
    /// [`REFUSED_AT_SUBMIT`] for a runner the agent cannot load, whose job never registers.
    ends: &'static str,
    /// Whether the attack is in answering `kill`: its job is stopped once the alloc runs.
    stop_when_running: bool,
    /// Whether the alloc's description names the cause (or, for a probe, shows it got nothing).
    named: fn(&str) -> bool,
}

impl Default for Attack {
    fn default() -> Self {
        Attack {
            name: "",
            runner: FIXTURE_HOSTILE.into(),
            config: json!({}),
            limits: json!({}),
            ends: "failed",
            stop_when_running: false,
            named: |_| false,
        }
    }
}

fn attacks(runners_dir: &Path, agent_api: std::net::SocketAddr) -> Vec<Attack> {
    let hostile = |attack: &str, extra: Value| {
        let mut config = extra;
        config["attack"] = json!(attack);
        config
    };
    vec![
        Attack {
            name: "spin",
            runner: FIXTURE_SPIN_LOOP.into(),
            config: json!({}),
            limits: json!({ "cpu": "300ms" }),
            named: |d| d.starts_with("CPU budget exhausted"),
            ..Attack::default()
        },
        Attack {
            name: "memory-bomb",
            runner: FIXTURE_MEMORY_HOG.into(),
            config: json!({}),
            limits: json!({}),
            named: |d| d == "memory limit of 64 MiB exceeded",
            ..Attack::default()
        },
        Attack {
            name: "trap",
            runner: FIXTURE_TRAP.into(),
            config: json!({}),
            limits: json!({}),
            named: |d| d.starts_with("wasm trap: "),
            ..Attack::default()
        },
        Attack {
            name: "stack-overflow",
            runner: FIXTURE_HOSTILE.into(),
            config: hostile("stack-overflow", json!({})),
            limits: json!({}),
            named: |d| d.starts_with("wasm trap: ") && d.contains("recurse"),
            ..Attack::default()
        },
        Attack {
            name: "fd-bomb",
            runner: FIXTURE_HOSTILE.into(),
            config: hostile("fd-bomb", json!({})),
            limits: json!({ "open_files": 256 }),
            named: |d| d.starts_with("runner held more than 256 handles"),
            ..Attack::default()
        },
        Attack {
            name: "file-flood",
            runner: FIXTURE_HOSTILE.into(),
            config: hostile("file-flood", json!({})),
            limits: json!({}),
            named: |d| d.contains("more than 10000 entries") || d.contains("No space left"),
            ..Attack::default()
        },
        Attack {
            name: "dir-bomb",
            runner: FIXTURE_HOSTILE.into(),
            config: hostile("dir-bomb", json!({})),
            limits: json!({}),
            named: |d| d.starts_with("disk quota exceeded: "),
            ..Attack::default()
        },
        Attack {
            name: "disk-fill",
            runner: FIXTURE_HOSTILE.into(),
            config: hostile("disk-fill", json!({})),
            limits: json!({ "disk": "4MiB" }),
            named: |d| d == "disk quota of 4 MiB exceeded",
            ..Attack::default()
        },
        Attack {
            name: "huge-error",
            runner: FIXTURE_HOSTILE.into(),
            config: hostile("huge-error", json!({})),
            limits: json!({}),
            named: |d| d.contains("more than 4 MiB to the host in one call"),
            ..Attack::default()
        },
        Attack {
            name: "checkpoint-flood",
            runner: FIXTURE_HOSTILE.into(),
            config: hostile("checkpoint-flood", json!({})),
            limits: json!({}),
            named: |d| d.contains("of checkpoints per second (checkpoint_rate)"),
            ..Attack::default()
        },
        Attack {
            name: "report-flood",
            runner: FIXTURE_HOSTILE.into(),
            config: hostile("report-flood", json!({ "count": "20000" })),
            limits: json!({ "cpu": "300ms" }),
            named: |d| d.starts_with("CPU budget exhausted") && d.contains("host work"),
            ..Attack::default()
        },
        Attack {
            name: "unknown-import",
            runner: FIXTURE_UNKNOWN_IMPORT.into(),
            config: json!({}),
            limits: json!({}),
            ends: REFUSED_AT_SUBMIT,
            named: |d| d.contains("fixture:elsewhere/secrets"),
            ..Attack::default()
        },
        Attack {
            name: "many-memories",
            runner: many_memories_runner(runners_dir),
            ends: REFUSED_AT_SUBMIT,
            named: |d| d.contains("cannot be compiled for this host") && d.contains("memories"),
            ..Attack::default()
        },
        Attack {
            name: "log-flood-lines",
            runner: FIXTURE_LOG_FLOOD.into(),
            config: json!({ "lines": "20000" }),
            ends: "complete",
            named: |d| d == "flooded",
            ..Attack::default()
        },
        Attack {
            name: "log-flood-bytes",
            runner: FIXTURE_LOG_FLOOD.into(),
            config: json!({ "lines": "2000", "line_bytes": "8192" }),
            ends: "complete",
            named: |d| d == "flooded",
            ..Attack::default()
        },
        Attack {
            name: "forged-log",
            config: hostile("forged-log", json!({})),
            ends: "complete",
            named: |d| d.starts_with("FORGED-MSG\n"),
            ..Attack::default()
        },
        Attack {
            name: "escape",
            config: hostile("escape", json!({})),
            ends: "complete",
            named: |d| d.matches("refused").count() == 3 && !d.contains("read "),
            ..Attack::default()
        },
        Attack {
            name: "env-probe",
            config: hostile("env-probe", json!({})),
            ends: "complete",
            named: |d| d == "env: []",
            ..Attack::default()
        },
        Attack {
            name: "volume-write",
            config: hostile("volume-write", json!({ "path": "/data" })),
            ends: "complete",
            named: |d| d.contains("unreadable") && d.contains("write refused"),
            ..Attack::default()
        },
        Attack {
            name: "connect",
            // The agent's own API, the likeliest target on the node: no socket without a grant.
            config: hostile("connect", json!({ "address": agent_api.to_string() })),
            ends: "complete",
            named: |d| d.starts_with("cannot connect to "),
            ..Attack::default()
        },
        Attack {
            name: "block-after-kill",
            config: hostile("block-after-kill", json!({})),
            limits: json!({ "kill_timeout": "200ms" }),
            stop_when_running: true,
            named: |d| d == "runner did not stop within the kill timeout of 200ms",
            ..Attack::default()
        },
        Attack {
            name: "ignore-kill",
            runner: FIXTURE_SPIN_LOOP.into(),
            limits: json!({ "kill_timeout": "200ms" }),
            stop_when_running: true,
            named: |d| {
                d == "runner did not stop within the kill timeout of 200ms"
                    || d.starts_with("CPU budget exhausted")
            },
            ..Attack::default()
        },
    ]
}

/// A runner with two extra linear memories, one more than an instance may have, in `dir`.
fn many_memories_runner(dir: &Path) -> String {
    let path = dir.join("many-memories.wasm");
    std::fs::write(&path, crate::many_memories::minimal_with_memories(2, 1)).unwrap();
    path.display().to_string()
}

/// One resident-memory reading of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line")
}

fn open_fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count() as u64
}

/// What `dir` holds on disk, in KiB, as `du` counts it (however deep the tree).
fn disk_kib(dir: &Path) -> u64 {
    let output = std::process::Command::new("du")
        .args(["-sk", dir.to_str().unwrap()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .and_then(|kib| kib.parse().ok())
        .expect("du's total")
}

#[test]
fn each_attack_fails_only_itself_under_a_real_agent_beside_a_healthy_neighbour() {
    let data_dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start_on(data_dir.path());
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let api = |method: &str, path: &str, body: Option<&str>| {
        tokio.block_on(http(agent.socket_addr(), method, path, body, None))
    };
    let job_allocs = |job: &str| {
        let (_, allocs) = api("GET", &format!("/v1/job/{job}/allocations"), None);
        allocs.as_array().cloned().unwrap_or_default()
    };

    let neighbour = json!({ "job": {
        "id": "neighbour", "type": "service", "count": 1, "runner": SLEEPER,
        "tasks": [{ "name": "main", "config": { "log_every": "100ms" } }],
    }});
    let (status, body) = api("POST", "/v1/jobs", Some(&neighbour.to_string()));
    assert_eq!(status, 200, "{body}");
    // Every tick the neighbour logs, as seconds of the day: how late one came is printed, not
    // asserted (this machine is shared), but that one comes after each attack is. The log
    // is in time order: a tick read after the attacker's "runner stopped" line came after it.
    let ticks = std::cell::RefCell::new(Vec::<f64>::new());
    let tick_time = |line: &Value| {
        let tick = line["target"] == "caravan::guest" && line["span"]["job"] == "neighbour";
        tick.then(|| seconds_of_day(line["timestamp"].as_str()?))
            .flatten()
    };
    let read_until = |what: &str, found: &dyn Fn(&Value) -> bool| {
        let (line, before) = agent.wait_for(what, found);
        let seen = before.iter().chain([&line]).filter_map(tick_time);
        ticks.borrow_mut().extend(seen);
    };
    read_until("a tick of the neighbour", &|line| tick_time(line).is_some());
    let pid = agent.pid();
    let (rss_before, fds_before, disk_before) =
        (rss_kib(pid), open_fds(pid), disk_kib(data_dir.path()));

    let runners_dir = tempfile::tempdir().unwrap();
    for attack in attacks(runners_dir.path(), agent.socket_addr()) {
        let mut stop_sent = false;
        let job = json!({ "job": {
            "id": attack.name, "type": "batch", "count": 1, "runner": &attack.runner,
            "tasks": [{ "name": "main", "config": attack.config }],
            "limits": attack.limits,
        }});
        let (status, body) = api("POST", "/v1/jobs", Some(&job.to_string()));
        if attack.ends == REFUSED_AT_SUBMIT {
            // Its runner cannot be loaded: the job is refused before anything is registered.
            assert_eq!(status, 400, "{}: {body}", attack.name);
            let (unknown, _) = api("GET", &format!("/v1/job/{}", attack.name), None);
            assert_eq!(unknown, 404, "{}: registered anyway", attack.name);
            let error = body["error"].as_str().unwrap_or_default();
            assert!(
                (attack.named)(error),
                "{}: the cause is not named: {error}",
                attack.name
            );
            continue;
        }
        assert_eq!(status, 200, "{}: {body}", attack.name);
        let ended = (0..6000)
            .find_map(|_| {
                let alloc = job_allocs(attack.name).into_iter().next()?;
                let status = alloc["client_status"].as_str().unwrap_or_default();
                if attack.stop_when_running && status == "running" && !stop_sent {
                    let (stopped, body) = api("DELETE", &format!("/v1/job/{}", attack.name), None);
                    assert_eq!(stopped, 200, "{}: {body}", attack.name);
                    stop_sent = true;
                }
                if status == attack.ends {
                    return Some(alloc);
                }
                assert!(
                    !["failed", "complete"].contains(&status),
                    "{}: ended {status}, not {}: {alloc}",
                    attack.name,
                    attack.ends
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
                None
            })
            .unwrap_or_else(|| panic!("{} did not end within a minute", attack.name));
        let description = ended["description"].as_str().unwrap();
        assert!(
            (attack.named)(description),
            "{}: the cause is not named: {description}",
            attack.name
        );

        // Only the attacker: the agent answers, the neighbour runs and ticks on.
        let (health, body) = api("GET", "/v1/agent/health", None);
        assert_eq!(health, 200, "{}: {body}", attack.name);
        let neighbour_state = &job_allocs("neighbour")[0];
        assert_eq!(
            neighbour_state["client_status"], "running",
            "{}: {neighbour_state}",
            attack.name
        );
        read_until("the attacker's end", &|line| {
            message(line) == "runner stopped" && line["span"]["job"] == attack.name
        });
        read_until("a tick of the neighbour after the attack", &|line| {
            tick_time(line).is_some()
        });

        let (rss, fds, disk) = (rss_kib(pid), open_fds(pid), disk_kib(data_dir.path()));
        println!(
            "{}: {description:?}; agent RSS {rss} KiB (+{}), {fds} descriptors (+{}), data dir {disk} KiB (+{})",
            attack.name,
            rss.saturating_sub(rss_before),
            fds.saturating_sub(fds_before),
            disk.saturating_sub(disk_before)
        );
        assert!(
            rss <= rss_before + RSS_GROWTH_BOUND_KIB,
            "{}: agent RSS {rss} KiB, from {rss_before} KiB",
            attack.name
        );
        assert!(
            fds <= fds_before + FD_GROWTH_BOUND,
            "{}: the agent holds {fds} descriptors, from {fds_before}",
            attack.name
        );
        assert!(
            disk <= disk_before + DISK_GROWTH_BOUND_KIB,
            "{}: the data dir holds {disk} KiB, from {disk_before} KiB",
            attack.name
        );
    }
    let ticks = ticks.into_inner();
    // (A gap across midnight comes out negative, and does not count.)
    let longest_gap = ticks
        .windows(2)
        .map(|pair| pair[1] - pair[0])
        .fold(0.0, f64::max);
    println!(
        "the neighbour, ticking every 100 ms, ticked {} times; the longest gap was {:.0} ms",
        ticks.len(),
        longest_gap * 1000.0
    );
    let (code, _) = agent.stop();
    assert_eq!(code, Some(0), "the agent stops cleanly after the suite");
}

/// `2026-12-01T04:50:00.462193Z` as 17400.462193.
fn seconds_of_day(timestamp: &str) -> Option<f64> {
    let time = timestamp.split_once('T')?.1.trim_end_matches('Z');
    let mut parts = time.split(':');
    let hours: f64 = parts.next()?.parse().ok()?;
    let minutes: f64 = parts.next()?.parse().ok()?;
    let seconds: f64 = parts.next()?.parse().ok()?;
    Some(hours * 3600.0 + minutes * 60.0 + seconds)
}
