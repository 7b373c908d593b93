//! The owner's behaviour through its API: queueing, drops, settling, following, deletion.
//! Single-threaded runtimes: the writer task runs only when a test awaits, so what is queued
//! between two awaits is exact.

use super::*;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// A line of exactly 1000 bytes in the file, carrying `n`.
fn thousand_byte_message(n: usize) -> String {
    let head = format!("{n:06} ");
    // 24 (time) + 1 + 5 (level) + 1 + "t: " (3) + message + newline = 1000.
    format!("{head}{}", "z".repeat(965 - head.len()))
}

/// Writes lines `range` in batches the queue always takes, settling after each.
async fn write_settled(logs: &AllocLogs, writer: &AllocLogWriter, range: std::ops::Range<usize>) {
    let numbers: Vec<usize> = range.collect();
    for batch in numbers.chunks(400) {
        for &n in batch {
            writer.write(tracing::Level::INFO, "t", &thousand_byte_message(n));
        }
        logs.settle("a").await;
    }
    assert_eq!(writer.lines_dropped(), 0);
}

/// The numbers the lines of `text` carry, in order.
fn numbers(text: &[u8]) -> Vec<usize> {
    let text = std::str::from_utf8(text).unwrap();
    text.lines()
        .map(|line| {
            assert_eq!(line.len() + 1, 1000, "{line}");
            let message = &line[line.find(" t: ").unwrap() + 4..];
            message[..6].parse().unwrap()
        })
        .collect()
}

fn rotations(logs: &AllocLogs, alloc_id: &str) -> i64 {
    let log = logs.log(alloc_id);
    let files = log.files.read().unwrap();
    files.rotations
}

#[tokio::test]
async fn a_read_sees_every_line_written_before_it_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let logs = AllocLogs::under_data_dir(dir.path());
    let writer = logs.writer("a");
    for n in 0..100 {
        writer.write(tracing::Level::WARN, "stderr", &format!("line {n}"));
    }
    // Nothing awaited yet: the writer task has not run, the read still sees every line.
    let text = String::from_utf8(logs.read("a").await.unwrap()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 100);
    for (n, line) in lines.iter().enumerate() {
        assert!(line.ends_with(&format!(" WARN stderr: line {n}")), "{line}");
    }
    assert!(dir.path().join("logs").join("a.log").exists(), "the layout");
    assert!(logs.read("never-logged").await.unwrap().is_empty());
}

#[tokio::test]
async fn a_follower_gets_every_line_once_and_in_order_across_rotations() {
    let dir = tempfile::tempdir().unwrap();
    let logs = AllocLogs::in_dir(dir.path());
    let writer = logs.writer("a");
    let stopped = Arc::new(AtomicBool::new(false));
    let mut follower = logs.follow("a", {
        let stopped = stopped.clone();
        move || stopped.load(Ordering::SeqCst)
    });
    let mut followed = follower.next_chunk().await.unwrap().unwrap();
    assert!(followed.is_empty(), "nothing kept yet");

    // Lines written between two reads, chosen so one gap rotates twice (1000 lines fit a
    // file, 1048 at most) and others once or not at all.
    let gaps = [1000, 1100, 300, 1500, 10, 700];
    let mut written = 0;
    let mut most_rotations_in_a_gap = 0;
    for gap in gaps {
        let before = rotations(&logs, "a");
        write_settled(&logs, &writer, written..written + gap).await;
        written += gap;
        most_rotations_in_a_gap = most_rotations_in_a_gap.max(rotations(&logs, "a") - before);
        followed.extend(follower.next_chunk().await.unwrap().unwrap());
    }
    stopped.store(true, Ordering::SeqCst);
    while let Some(chunk) = follower.next_chunk().await.unwrap() {
        followed.extend(chunk);
    }

    assert_eq!(
        most_rotations_in_a_gap, 2,
        "the test rotates twice between reads"
    );
    assert_eq!(rotations(&logs, "a"), 4);
    assert_eq!(numbers(&followed), (0..written).collect::<Vec<_>>());
    // A fresh read has what is kept: the last three files' worth, ending with the last line.
    let kept = numbers(&logs.read("a").await.unwrap());
    assert_eq!(kept.last(), Some(&(written - 1)));
    assert_eq!(kept, (written - kept.len()..written).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_follower_ends_with_the_last_lines_of_a_stopped_alloc() {
    let dir = tempfile::tempdir().unwrap();
    let logs = AllocLogs::in_dir(dir.path());
    let writer = logs.writer("a");
    writer.write(tracing::Level::INFO, "stdout", "first");
    let mut follower = logs.follow("a", || true);
    // Queued but not yet written: the first chunk is what the file has now.
    let first = follower.next_chunk().await.unwrap().unwrap();
    writer.write(tracing::Level::INFO, "stdout", "last");
    let mut text = first;
    while let Some(chunk) = follower.next_chunk().await.unwrap() {
        text.extend(chunk);
    }
    let text = String::from_utf8(text).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].ends_with("stdout: first") && lines[1].ends_with("stdout: last"));
}

#[tokio::test(start_paused = true)]
async fn a_follower_waits_for_new_lines_and_wakes_when_they_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let logs = AllocLogs::in_dir(dir.path());
    let writer = logs.writer("a");
    let stopped = Arc::new(AtomicBool::new(false));
    let mut follower = logs.follow("a", {
        let stopped = stopped.clone();
        move || stopped.load(Ordering::SeqCst)
    });
    assert!(follower.next_chunk().await.unwrap().unwrap().is_empty());
    let started = tokio::time::Instant::now();
    let next = tokio::spawn(async move { follower.next_chunk().await.unwrap().unwrap() });
    tokio::task::yield_now().await;
    writer.write(tracing::Level::INFO, "stdout", "news");
    let chunk = next.await.unwrap();
    assert!(
        String::from_utf8(chunk)
            .unwrap()
            .ends_with("stdout: news\n")
    );
    assert!(
        started.elapsed() < follow::FOLLOW_POLL,
        "woken by the write, not by the poll"
    );
}

#[tokio::test]
async fn a_full_queue_drops_lines_and_counts_them_per_alloc_and_per_agent() {
    let dir = tempfile::tempdir().unwrap();
    let logs = AllocLogs::in_dir(dir.path());
    let (a, b) = (logs.writer("a"), logs.writer("b"));
    for n in 0..QUEUE_MAX_LINES + 5 {
        a.write(tracing::Level::INFO, "stdout", &format!("a {n}"));
    }
    b.write(tracing::Level::INFO, "stdout", "b");
    assert_eq!((a.lines_dropped(), b.lines_dropped()), (5, 0));
    assert_eq!(logs.lines_dropped(), 5);
    let mut metrics = String::new();
    logs.write_prometheus(&mut metrics);
    assert!(
        metrics.contains("# TYPE caravan_alloc_log_lines_dropped_total counter\n")
            && metrics.contains("\ncaravan_alloc_log_lines_dropped_total 5\n"),
        "{metrics}"
    );

    // The oldest lines were kept, in order; the queue takes lines again once drained.
    let text = String::from_utf8(logs.read("a").await.unwrap()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), QUEUE_MAX_LINES);
    assert!(
        lines
            .last()
            .unwrap()
            .ends_with(&format!("stdout: a {}", QUEUE_MAX_LINES - 1))
    );
    a.write(tracing::Level::INFO, "stdout", "again");
    assert_eq!(a.lines_dropped(), 5);
}

#[tokio::test]
async fn long_lines_fill_the_queue_by_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let logs = AllocLogs::in_dir(dir.path());
    let writer = logs.writer("a");
    let long = "l".repeat(8 * 1024);
    for _ in 0..100 {
        writer.write(tracing::Level::INFO, "stdout", &long);
    }
    let kept = QUEUE_MAX_BYTES / (long.len() + 35);
    assert_eq!(writer.lines_dropped(), (100 - kept) as u64);
    let text = logs.read("a").await.unwrap();
    assert_eq!(text.split(|b| *b == b'\n').count() - 1, kept);
}

#[tokio::test]
#[allow(clippy::await_holding_lock, reason = "the held lock is the stuck disk")]
async fn a_writer_never_waits_for_a_slow_disk() {
    let dir = tempfile::tempdir().unwrap();
    let logs = AllocLogs::in_dir(dir.path());
    let writer = logs.writer("a");
    let log = logs.log("a");
    // The disk is "stuck": a reader holds the file lock, so the writer task cannot write.
    let stuck = log.files.read().unwrap();
    for n in 0..3 * QUEUE_MAX_LINES {
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        writer.write(tracing::Level::INFO, "stdout", &format!("{n}"));
    }
    // Kept: the batch the writer took before it got stuck (at most a full queue), and a
    // full queue; every other line was dropped, none waited.
    let dropped = writer.lines_dropped() as usize;
    assert!(dropped >= QUEUE_MAX_LINES, "{dropped}");
    drop(stuck);
    let text = String::from_utf8(logs.read("a").await.unwrap()).unwrap();
    assert_eq!(text.lines().count(), 3 * QUEUE_MAX_LINES - dropped);
}

#[tokio::test]
async fn removing_deletes_every_file_discards_queued_lines_and_refuses_later_ones() {
    let dir = tempfile::tempdir().unwrap();
    let logs = AllocLogs::in_dir(dir.path());
    let writer = logs.writer("a");
    write_settled(&logs, &writer, 0..2500).await;
    for n in [".log", ".log.1", ".log.2"] {
        assert!(dir.path().join(format!("a{n}")).exists(), "{n}");
    }
    writer.write(tracing::Level::INFO, "stdout", "queued, never written");
    logs.remove("a").await;
    logs.settle("a").await;
    writer.write(tracing::Level::INFO, "stdout", "after removal");
    logs.settle("a").await;
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    assert_eq!(
        writer.lines_dropped(),
        0,
        "discarded on purpose, not dropped"
    );
    assert!(logs.read("a").await.unwrap().is_empty());

    // Removing what never existed is no error, through the owner or a writer.
    logs.remove("never-logged").await;
    logs.writer("b").remove().await;
}

/// Whether the owner would look for `alloc_id`'s files on a removal.
fn may_have_files(logs: &AllocLogs, alloc_id: &str) -> bool {
    logs.inner.on_disk.may_have_files(alloc_id)
}

#[tokio::test]
async fn files_an_earlier_run_left_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["old.log", "old.log.1", "old.log.2", "unrelated.txt"] {
        std::fs::write(dir.path().join(name), "left by an earlier run\n").unwrap();
    }
    let logs = AllocLogs::in_dir(dir.path());
    assert!(may_have_files(&logs, "old"));
    logs.remove("old").await;
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(left, ["unrelated.txt"]);
    assert!(!may_have_files(&logs, "old"), "forgotten once deleted");
}

#[tokio::test]
async fn a_log_made_again_after_its_writers_are_gone_still_removes_their_files() {
    let dir = tempfile::tempdir().unwrap();
    let logs = AllocLogs::in_dir(dir.path());
    assert!(
        !may_have_files(&logs, "a"),
        "nothing written, nothing to look for"
    );
    let writer = logs.writer("a");
    writer.write(tracing::Level::INFO, "stdout", "written");
    logs.settle("a").await;
    drop(writer);
    // Until the writer task has let go of it too, the same log would be handed out again.
    while logs.inner.allocs.lock_unpoisoned().logs["a"].strong_count() > 0 {
        tokio::task::yield_now().await;
    }
    assert!(may_have_files(&logs, "a"));
    logs.remove("a").await;
    assert!(!dir.path().join("a.log").exists());
    assert!(!may_have_files(&logs, "a"));
}

#[tokio::test]
async fn settling_every_alloc_drains_every_queue() {
    let dir = tempfile::tempdir().unwrap();
    let logs = AllocLogs::in_dir(dir.path());
    let writers: Vec<_> = ["a", "b", "c"].map(|id| logs.writer(id)).into();
    for writer in &writers {
        writer.write(tracing::Level::INFO, "stdout", "line");
    }
    logs.settle_all().await;
    for id in ["a", "b", "c"] {
        let text = std::fs::read_to_string(dir.path().join(format!("{id}.log"))).unwrap();
        assert!(text.ends_with(" INFO stdout: line\n"), "{text}");
    }
}

/// Waits until `at_least` lines of `alloc_id`'s log are done with (written, failed or
/// discarded), without settling it.
async fn lines_done(logs: &AllocLogs, alloc_id: &str, at_least: usize) {
    let log = logs.log(alloc_id);
    let mut done = log.done.subscribe();
    let _ = done.wait_for(|done| *done >= at_least as u64).await;
}

#[tokio::test(start_paused = true)]
async fn a_line_reaches_its_file_after_the_write_behind_delay_or_at_once_when_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let logs = AllocLogs::in_dir(dir.path());
    let writer = logs.writer("a");
    let file = dir.path().join("a.log");
    let started = tokio::time::Instant::now();
    writer.write(tracing::Level::INFO, "stdout", "first");
    writer.write(tracing::Level::INFO, "stdout", "second");
    tokio::time::sleep(WRITE_BEHIND - Duration::from_millis(1)).await;
    assert!(!file.exists(), "not due yet");
    lines_done(&logs, "a", 2).await;
    assert!(started.elapsed() >= WRITE_BEHIND);
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.len() == 2
            && lines[0].ends_with("stdout: first")
            && lines[1].ends_with("stdout: second"),
        "{text}"
    );

    // Settling (as reads do, and the agent when it stops) does not wait for the delay.
    writer.write(tracing::Level::INFO, "stdout", "third");
    let asked = tokio::time::Instant::now();
    logs.settle("a").await;
    assert!(asked.elapsed() < WRITE_BEHIND);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.ends_with("stdout: third\n"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn a_follower_arriving_while_the_writer_waits_gets_the_lines_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let logs = AllocLogs::in_dir(dir.path());
    let writer = logs.writer("a");
    writer.write(tracing::Level::INFO, "stdout", "before anyone followed");
    tokio::task::yield_now().await;
    let started = tokio::time::Instant::now();
    let mut follower = logs.follow("a", || false);
    let mut text = Vec::new();
    while text.is_empty() {
        text = follower.next_chunk().await.unwrap().unwrap();
    }
    assert!(started.elapsed() < WRITE_BEHIND, "{:?}", started.elapsed());
    assert!(
        String::from_utf8(text)
            .unwrap()
            .ends_with("stdout: before anyone followed\n")
    );
}

#[tokio::test(start_paused = true)]
async fn a_half_full_queue_is_written_without_waiting_for_the_delay() {
    let dir = tempfile::tempdir().unwrap();
    let logs = AllocLogs::in_dir(dir.path());
    let writer = logs.writer("a");
    let started = tokio::time::Instant::now();
    for n in 0..QUEUE_MAX_LINES / 2 {
        writer.write(tracing::Level::INFO, "stdout", &format!("{n}"));
    }
    lines_done(&logs, "a", QUEUE_MAX_LINES / 2).await;
    assert!(started.elapsed() < WRITE_BEHIND, "{:?}", started.elapsed());
    assert_eq!(writer.lines_dropped(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_alloc_removed_before_its_lines_are_due_never_makes_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let logs = AllocLogs::in_dir(dir.path().join("logs"));
    let writer = logs.writer("a");
    writer.write(tracing::Level::INFO, "stdout", "the task ended");
    tokio::time::sleep(WRITE_BEHIND / 2).await;
    logs.remove("a").await;
    tokio::time::sleep(2 * WRITE_BEHIND).await;
    assert!(
        !dir.path().join("logs").exists(),
        "not even the logs directory was made"
    );
}

#[tokio::test(start_paused = true)]
async fn a_log_with_no_file_is_removed_without_the_disk_and_one_with_a_file_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let logs = AllocLogs::in_dir(dir.path().join("logs"));

    let quiet = logs.writer("quiet");
    quiet.write(tracing::Level::INFO, "stdout", "queued, not yet due");
    assert!(quiet.remove_if_nothing_on_disk());
    quiet.write(tracing::Level::INFO, "stdout", "after removal");
    // Past the write-behind delay: a line not discarded would be in a file by now.
    tokio::time::sleep(2 * WRITE_BEHIND).await;
    assert!(!dir.path().join("logs").exists(), "no line reached a file");
    assert_eq!(
        quiet.lines_dropped(),
        0,
        "discarded on purpose, not dropped"
    );

    let written = logs.writer("written");
    written.write(tracing::Level::INFO, "stdout", "in the file");
    logs.settle("written").await;
    assert!(!written.remove_if_nothing_on_disk(), "a file to delete");
    written.write(tracing::Level::INFO, "stdout", "still taken");
    logs.settle("written").await;
    let text = String::from_utf8(logs.read("written").await.unwrap()).unwrap();
    assert_eq!(text.lines().count(), 2, "left as it was: {text}");
    written.remove().await;
    assert!(!dir.path().join("logs/written.log").exists());
}

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A runtime that shuts down (a test's, a restarted node's) drops the writer task it ran;
/// the log must not stay "draining" with no writer, its lines unwritten and a settle
/// waiting forever.
#[test]
fn a_writer_task_dropped_with_its_runtime_finishes_its_lines_and_the_log_writes_on() {
    let dir = tempfile::tempdir().unwrap();
    let logs = AllocLogs::in_dir(dir.path());
    let writer = logs.writer("a");
    let file = dir.path().join("a.log");

    // Dropped while it waits out the write-behind delay.
    let waited = current_thread_runtime();
    waited.block_on(async {
        writer.write(tracing::Level::INFO, "stdout", "one");
        tokio::task::yield_now().await;
    });
    assert!(!file.exists(), "the writer task was waiting");
    drop(waited);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.ends_with("stdout: one\n"), "{text}");

    // Dropped before it ever ran.
    let never_ran = current_thread_runtime();
    never_ran.block_on(async { writer.write(tracing::Level::INFO, "stdout", "two") });
    drop(never_ran);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.ends_with("stdout: two\n"), "{text}");

    // And the log writes on, through a new runtime's writer.
    let next = current_thread_runtime();
    next.block_on(async {
        writer.write(tracing::Level::INFO, "stdout", "three");
        tokio::time::timeout(Duration::from_secs(30), logs.settle("a"))
            .await
            .expect("settling ends: a writer took the line");
    });
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(text.ends_with("stdout: three\n"), "{text}");
}

#[test]
fn without_a_runtime_the_writing_thread_writes() {
    let dir = tempfile::tempdir().unwrap();
    let logs = AllocLogs::in_dir(dir.path());
    logs.writer("a")
        .write(tracing::Level::ERROR, "app", "no runtime here");
    let text = std::fs::read_to_string(dir.path().join("a.log")).unwrap();
    assert!(text.ends_with("ERROR app: no runtime here\n"), "{text}");
}

#[test]
fn a_line_as_written_is_taken_apart_into_its_parts() {
    let line = file::format_line(tracing::Level::WARN, "stderr", "it said: \"no\"\nthen left");
    let parsed = parse_line(&line).expect("a line of the format");
    assert_eq!(
        (parsed.level, parsed.source, parsed.message),
        ("WARN", "stderr", "it said: \"no\"\\nthen left")
    );
    assert!(
        parsed.time.ends_with('Z') && parsed.time.len() == 24,
        "{}",
        parsed.time
    );
    let info = file::format_line(tracing::Level::INFO, "sleeper", "tick");
    assert_eq!(parse_line(&info).unwrap().level, "INFO");
    assert_eq!(parse_line("not a log line"), None);
}
