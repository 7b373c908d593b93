//! A guest that floods the log: the excess is dropped and counted, long lines are cut.

use crate::support::*;
use caravan_host::model::structs::{ClientStatus, Limits};
use caravan_test_artifacts::FIXTURE_LOG_FLOOD;

#[tokio::test(start_paused = true)]
async fn lines_over_the_rate_are_dropped_and_reported_not_queued() {
    let logs = LogCapture::start();
    let mut flood = alloc(
        FIXTURE_LOG_FLOOD,
        &["main"],
        &[("lines", "3000"), ("long_line", "10")],
    );
    flood.limits.log_lines_per_second = Some(1000);
    let started = start(flood, None);
    assert_eq!(
        started.stopped().await.client_status,
        ClientStatus::Complete
    );

    // Time is paused, so the bucket never refills: exactly its 1,000 lines get through.
    assert_eq!(logs.with_message("flood line").len(), 1000);
    let reports = logs.with_message("log lines");
    let dropped: u64 = reports
        .iter()
        .map(|line| line["fields"]["dropped"].as_u64().unwrap())
        .sum();
    assert_eq!(
        dropped, 2001,
        "3,000 flood lines and the long line, less the 1,000 admitted"
    );
    assert!(
        reports.len() <= 2,
        "one report per interval plus one at the end, not one per line"
    );
    assert!(reports.iter().all(|line| line["level"] == "WARN"));
}

#[tokio::test]
async fn a_line_over_the_cap_is_cut_with_a_marker() {
    let logs = LogCapture::start();
    let started = start(
        alloc(
            FIXTURE_LOG_FLOOD,
            &["main"],
            &[("lines", "0"), ("long_line", "100000")],
        ),
        None,
    );
    assert_eq!(
        started.stopped().await.client_status,
        ClientStatus::Complete
    );
    let longest = Limits::default().log_line_bytes as usize;
    let cut = logs.with_message(&format!("[truncated {} bytes]", 100_000 - longest));
    assert_eq!(cut.len(), 1);
    assert_eq!(
        message(&cut[0]).len(),
        longest + " [truncated 91808 bytes]".len()
    );
}
