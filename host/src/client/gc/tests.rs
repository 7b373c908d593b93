use super::GcReason;

#[test]
fn gc_reasons_keep_their_metric_labels_and_nomads_sentences() {
    let cases = [
        (
            GcReason::DiskUsage {
                used_percent: 91.4,
                threshold: 80.0,
            },
            "disk_usage",
            "disk usage of 91 is over gc threshold of 80",
        ),
        (
            GcReason::InodeUsage {
                used_percent: 75.0,
                threshold: 70.0,
            },
            "inode_usage",
            "inode usage of 75 is over gc threshold of 70",
        ),
        (
            GcReason::AllocCount { live: 51, max: 50 },
            "alloc_count",
            "number of allocations (51) is over the limit (50)",
        ),
        (GcReason::Forced, "forced", "forced collection"),
        (
            GcReason::ServerRemoved,
            "server_removed",
            "forced collection",
        ),
        (
            GcReason::FullNode,
            "forced_full_node",
            "forced full node collection",
        ),
        (
            GcReason::DevAgentStopping,
            "forced_full_node",
            "agent stopping in dev mode",
        ),
    ];
    for (reason, kind, sentence) in cases {
        assert_eq!(reason.kind(), kind);
        assert_eq!(reason.to_string(), sentence);
    }
}
