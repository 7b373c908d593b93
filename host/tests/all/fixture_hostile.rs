//! Hostile runners (the `hostile` fixture, one attack per test): each is contained to its own
//! alloc, and what it hands the host is bounded and neutralised before it is stored or shown.

use crate::support::*;
use caravan_host::allocrunner::AllocRunner;
use caravan_host::model::structs::{Alloc, ClientStatus, LimitOverrides};
use caravan_test_artifacts::FIXTURE_HOSTILE;
use std::time::{Duration, Instant};

/// What a forged line starts with: a timestamp like the host's own.
const FORGED_START: &str = "2026-01-01T00:00:00.000000Z";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_bomb_fails_at_a_disk_limit_and_is_removed_without_harm() {
    let _logs = LogCapture::start();
    let started = start(hostile_attack("dir-bomb", &[]), None);
    // Whichever comes first fails the alloc: the host's look at the alloc dir finding it
    // deeper than the depth limit, or the 10,001st directory refused at the entry limit.
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert!(
        [
            "disk quota exceeded: directories nest deeper than 64 levels",
            "disk quota exceeded: the alloc directory holds more than 10000 entries",
        ]
        .contains(&state.description.as_str()),
        "{}",
        state.description
    );
    assert!(started.alloc_dir().join("d/d/d").is_dir());
    // However deep the runner got before the quota check stopped it (the removal of a tree
    // 20,000 deep, on a 64 KiB stack, is `fs_tree`'s own test), it is removed without
    // recursion: the removal this replaced overflowed its thread's stack, which aborts the
    // whole process and every alloc on the node with it.
    started.runner.destroy();
    within("the destroy", started.runner.destroyed().wait()).await;
    assert!(
        !started.alloc_dir().exists(),
        "the alloc dir must be gone after destroy"
    );
}

#[tokio::test]
async fn shutdown_leaves_the_alloc_dir_and_what_its_runner_wrote_for_the_restore() {
    let _logs = LogCapture::start();
    // Three directories deep, then running: a runner that reaches files, with files.
    let started = start(hostile_attack("dir-bomb", &[("depth", "3")]), None);
    started
        .recorder
        .wait_for_status(ClientStatus::Running)
        .await;
    started.shut_down().await;
    assert!(
        started.alloc_dir().join("d/d/d").is_dir(),
        "shutdown keeps the alloc dir for the restore"
    );
}

#[tokio::test]
async fn a_descriptor_bomb_fails_its_alloc_at_the_handle_limit() {
    let _logs = LogCapture::start();
    let started = start(hostile_attack("fd-bomb", &[]), None);
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert_eq!(
        state.description,
        "runner held more than 1024 handles at once \
         (open files, streams and the like: the handle limit, open_files)"
    );
    // A job may hold its runner to fewer.
    let few = Alloc {
        limits: LimitOverrides {
            open_files: Some(64),
            ..LimitOverrides::default()
        },
        ..hostile_attack("fd-bomb", &[])
    };
    let state = start(few, None).stopped().await;
    assert!(
        state
            .description
            .starts_with("runner held more than 64 handles"),
        "{}",
        state.description
    );
}

#[tokio::test]
async fn runners_together_hold_no_more_descriptors_than_the_agents_budget_and_give_them_back() {
    let _logs = LogCapture::start();
    // A budget of 100 for every runner: the first bomb gets 100 files, not its 1,024.
    let runtime = caravan_host::runtime::Runtime::new(&caravan_host::runtime::RuntimeConfig {
        max_live_allocs: 8,
        guest_descriptors: Some(100),
        ..caravan_host::runtime::RuntimeConfig::default()
    })
    .expect("runtime");
    let greedy = start_on(
        runtime.clone(),
        hostile_attack("fd-bomb", &[("count", "500")]),
        None,
    );
    let state = greedy.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert!(
        state.description.starts_with("opened 100 files, then: "),
        "{}",
        state.description
    );
    // Its store is gone, and with it what it held: a neighbour gets its files.
    within("the greedy runner's destroy", async {
        greedy.runner.destroy();
        greedy.runner.destroyed().wait().await
    })
    .await;
    assert_eq!(runtime.descriptors_held(), 0);
    // A file closed goes back at once: 300 made and closed one by one within a budget of 100.
    let closing = start_on(
        runtime.clone(),
        hostile_attack("file-flood", &[("count", "300")]),
        None,
    );
    let state = closing
        .recorder
        .wait_for_status(ClientStatus::Running)
        .await;
    assert_eq!(state.description, "created 300 files");
    assert_eq!(runtime.descriptors_held(), 0);
    closing.runner.kill();
    closing.stopped().await;
    let modest = start_on(
        runtime.clone(),
        hostile_attack("fd-bomb", &[("count", "60")]),
        None,
    );
    let state = modest.recorder.wait_for_status(ClientStatus::Running).await;
    assert_eq!(state.description, "holding 60 files");
    assert_eq!(runtime.descriptors_held(), 60);
    // Beside it, a neighbour gets what is left of the budget, and no more.
    let neighbour = start_on(
        runtime.clone(),
        hostile_attack("fd-bomb", &[("count", "60")]),
        None,
    );
    let state = neighbour.stopped().await;
    assert!(
        state.description.starts_with("opened 40 files, then: "),
        "{}",
        state.description
    );
    modest.runner.kill();
    modest.stopped().await;
    within("the runners' stores gone", async {
        modest.runner.destroy();
        neighbour.runner.destroy();
        modest.runner.destroyed().wait().await;
        neighbour.runner.destroyed().wait().await;
    })
    .await;
    assert_eq!(runtime.descriptors_held(), 0);
}

#[tokio::test]
async fn a_report_flood_spends_its_own_cpu_budget_on_the_host_work_it_causes() {
    let logs = LogCapture::start();
    // Each report of 20,000 task states is refused; lifting and checking it is the host's
    // work, done for this alloc and charged to it. Before it was, the guest's own share
    // (building each call's arguments) was all its budget saw: the agent used 25.8 s of CPU
    // in 30 s for a runner whose 2 s budget was never spent.
    let flood = Alloc {
        limits: LimitOverrides {
            cpu: Some(Duration::from_millis(300)),
            ..LimitOverrides::default()
        },
        ..hostile_attack("report-flood", &[("count", "20000")])
    };
    let started_at = Instant::now();
    let state = start(flood, None).stopped().await;
    let ran_for = started_at.elapsed();
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert!(
        state
            .description
            .starts_with("CPU budget exhausted: used 300ms of computing time (")
            && state
                .description
                .ends_with(" of it host work on the runner's behalf)"),
        "{}",
        state.description
    );
    // Every report was refused, but the log heard of it at most once a second.
    let refusals = logs.with_message("runner's state report was refused");
    assert!(!refusals.is_empty());
    assert!(
        refusals.len() as u64 <= ran_for.as_secs() + 1,
        "{} refusals logged in {ran_for:?}",
        refusals.len()
    );
}

#[tokio::test]
async fn a_disk_fill_is_refused_at_its_quota_and_fails_naming_it() {
    let _logs = LogCapture::start();
    let fill = Alloc {
        limits: LimitOverrides {
            disk_bytes: Some(4 << 20),
            ..LimitOverrides::default()
        },
        ..hostile_attack("disk-fill", &[])
    };
    let started = start(fill, None);
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert_eq!(state.description, "disk quota of 4 MiB exceeded");
    // The write that would have passed the quota was refused in the guest: nothing past it
    // reached the disk. (A look once a second alone let a runner write 2 GiB before it.)
    let filled = std::fs::metadata(started.alloc_dir().join("fill"))
        .unwrap()
        .len();
    assert!(filled <= 4 << 20, "{filled} bytes written");
}

#[tokio::test]
async fn a_runner_that_blocks_in_a_wasi_sleep_after_kill_is_torn_down_at_the_kill_timeout() {
    let _logs = LogCapture::start();
    let blocking = Alloc {
        limits: LimitOverrides {
            kill_timeout: Some(Duration::from_millis(200)),
            ..LimitOverrides::default()
        },
        ..hostile_attack("block-after-kill", &[])
    };
    let started = start(blocking, None);
    started
        .recorder
        .wait_for_status(ClientStatus::Running)
        .await;
    started.runner.kill();
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert_eq!(
        state.description,
        "runner did not stop within the kill timeout of 200ms"
    );
}

#[tokio::test]
async fn no_path_leads_out_of_the_alloc_directory() {
    let _logs = LogCapture::start();
    let started = start(hostile_attack("escape", &[]), None);
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Complete);
    // Each way out is refused; a symbolic link may be made, but never followed out.
    let parts: Vec<&str> = state.description.split("; ").collect();
    assert_eq!(parts.len(), 3, "{}", state.description);
    for part in parts {
        assert!(
            part.contains("refused") && !part.contains("read "),
            "a way out: {}",
            state.description
        );
    }
}

#[tokio::test]
async fn a_file_flood_fails_its_alloc_at_the_entry_limit() {
    let _logs = LogCapture::start();
    let started = start(hostile_attack("file-flood", &[]), None);
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    // The file past the limit is refused in the guest with "no space". The fixture fails its
    // run on that error at once, and a guest's own terminal report stands; should the host
    // end the run first, the description is the host's.
    assert!(
        state.description
            == "disk quota exceeded: the alloc directory holds more than 10000 entries"
            || (state.description.starts_with("created ")
                && state
                    .description
                    .ends_with("then: No space left on device (os error 51)")),
        "{}",
        state.description
    );
    let made = std::fs::read_dir(started.alloc_dir()).unwrap().count();
    assert!(made <= 10_000, "{made} files made");
}

#[tokio::test]
async fn a_long_error_from_run_is_cut_before_it_is_stored() {
    let _logs = LogCapture::start();
    let started = start(hostile_attack("huge-error", &[("bytes", "2097152")]), None);
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert!(
        state.description.len() < 1100,
        "description of {} bytes",
        state.description.len()
    );
    assert!(
        state.description.contains(" [truncated ") && state.description.ends_with(" bytes]"),
        "{}",
        &state.description[state.description.len().saturating_sub(80)..]
    );
}

#[tokio::test]
async fn an_error_over_the_host_call_limit_fails_the_alloc_naming_that_limit() {
    let _logs = LogCapture::start();
    let started = start(hostile_attack("huge-error", &[]), None);
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert_eq!(
        state.description,
        "runner passed more than 4 MiB to the host in one call (the host-call limit, hostcall_size)"
    );
}

#[tokio::test]
async fn forged_log_lines_stay_one_escaped_line_in_the_alloc_log() {
    let _logs = LogCapture::start();
    let started = start(hostile_attack("forged-log", &[]), None);
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Complete);
    let log = started.log_file_text().await;
    assert_eq!(log.lines().count(), 1, "one guest call, one line:\n{log}");
    assert!(!log.contains('\u{1b}') && !log.contains('\r') && !log.contains('\u{7}'));
    assert!(log.contains("FORGED-MSG\\n2026-01-01"), "{log}");
}

#[test]
fn the_text_log_and_caravan_run_show_a_forging_guest_as_inert_text() {
    let output = run_caravan(
        &["run", FIXTURE_HOSTILE, "--config", "attack=forged-log"],
        None,
    );
    assert_eq!(output.status.code(), Some(0));
    for (stream, bytes) in [("stdout", &output.stdout), ("stderr", &output.stderr)] {
        let text = String::from_utf8_lossy(bytes);
        assert!(
            text.lines().all(|line| !line.starts_with(FORGED_START)),
            "a forged line reached {stream}:\n{text}"
        );
        assert!(
            !text.contains(RAW_CONTROLS),
            "a raw control character reached {stream}"
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("FORGED-MSG\\n2026-01-01"), "{stdout}");
}

/// What a terminal acts on: ESC, BEL, CR, CSI in C1, DEL, and right-to-left override.
const RAW_CONTROLS: &[char] = &['\u{1b}', '\u{7}', '\r', '\u{9b}', '\u{7f}', '\u{202e}'];

#[test]
fn the_json_log_keeps_a_forging_guest_lossless_and_inert() {
    let output = run_caravan(
        &[
            "run",
            FIXTURE_HOSTILE,
            "--log-json",
            "--config",
            "attack=forged-log",
        ],
        None,
    );
    assert_eq!(output.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains(RAW_CONTROLS),
        "a raw control character reached the JSON log"
    );
    // Every line is one JSON object, and the guest's message comes back as it was sent.
    let guest_messages: Vec<String> = stderr
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).expect(line))
        .filter(|line| line["target"] == "caravan::guest")
        .map(|line| line["fields"]["message"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(guest_messages.len(), 1, "{stderr}");
    assert!(guest_messages[0].starts_with("FORGED-MSG\n2026-01-01"));
    assert!(
        guest_messages[0].ends_with("\u{1b}[2J\u{1b}]0;pwned\u{7}\r\u{9b}2J\u{7f}\u{202e}gnp.exe")
    );
}

#[test]
fn caravan_run_leaves_no_temporary_tree_behind_however_deep() {
    let tmp = caravan_host::util::fs_tree::TempTree::new("caravan-test-").unwrap();
    let output = crate::support::caravan_command()
        .args([
            "run",
            FIXTURE_HOSTILE,
            "--config",
            "attack=dir-bomb",
            "--config",
            "finish=yes",
        ])
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    // It ends however it ends (all 20,000 made, or one of the disk limits first): either
    // way the tree must be gone.
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("nested ") || stdout.contains("disk quota exceeded"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind in TMPDIR: {left:?}");
}
