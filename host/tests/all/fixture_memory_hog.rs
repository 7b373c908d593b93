//! A guest that allocates without end fails with the memory limit named.

use crate::support::*;
use caravan_host::structs::ClientStatus;
use caravan_test_artifacts::FIXTURE_MEMORY_HOG;

#[tokio::test]
async fn a_memory_hog_fails_with_the_memory_limit_named() {
    let _logs = LogCapture::start();
    let mut hog = alloc(FIXTURE_MEMORY_HOG, &["main"], &[]);
    hog.limits.memory_bytes = Some(16 << 20);
    let started = start(hog, None);
    let state = started.stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert_eq!(state.description, "memory limit of 16 MiB exceeded");
}

#[tokio::test]
async fn the_default_memory_limit_is_64_mib() {
    let _logs = LogCapture::start();
    let started = start(alloc(FIXTURE_MEMORY_HOG, &["main"], &[]), None);
    assert_eq!(
        started.stopped().await.description,
        "memory limit of 64 MiB exceeded"
    );
}
