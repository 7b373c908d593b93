//! A guest that allocates without end fails with the memory limit named.

use crate::support::*;
use caravan_host::model::structs::ClientStatus;
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

#[tokio::test]
async fn on_a_node_sized_for_very_many_allocs_memories_grow_past_their_smaller_reservation() {
    let logs = LogCapture::start();
    // Instances on demand, for so many live allocs that each linear memory reserves 8 MiB
    // of address space instead of 4 GiB: the hog's memory is moved to grow past it.
    let crowded = caravan_host::runtime::Runtime::new(&caravan_host::runtime::RuntimeConfig {
        max_live_allocs: 690_000,
        pooling: caravan_host::runtime::Pooling::Off,
        ..caravan_host::runtime::RuntimeConfig::default()
    })
    .expect("runtime");
    let said = logs.lines();
    assert!(
        said.iter()
            .any(|line| line["fields"]["reservation"] == "8 MiB"),
        "the runtime says what each memory reserves"
    );
    let mut hog = alloc(FIXTURE_MEMORY_HOG, &["main"], &[]);
    hog.limits.memory_bytes = Some(24 << 20);
    let state = start_on(crowded, hog, None).stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert_eq!(state.description, "memory limit of 24 MiB exceeded");
}
