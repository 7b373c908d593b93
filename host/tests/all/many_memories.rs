//! A runner with many linear memories: the memory limit counts all of them together, and one
//! instance may have only two (its share of the pool), so no runner takes the node's memory
//! or another alloc's pool slots.
//!
//! The runners are the `minimal` component with extra core instances appended, each of a
//! module that only declares a memory: component sections may come in any order, and each
//! core instance is created (its memory allocated) when the component is instantiated.

use crate::support::*;
use caravan_host::allocrunner::AllocRunner;
use caravan_host::model::structs::ClientStatus;
use caravan_test_artifacts::MINIMAL;

/// `minimal` plus `extra` core instances, each with one memory of `pages` 64 KiB pages.
pub(crate) fn minimal_with_memories(extra: u32, pages: u32) -> Vec<u8> {
    let mut component = std::fs::read(MINIMAL).unwrap();
    let modules_before = count_core_module_sections(&component);
    let mut memory_section = vec![0x01, 0x00];
    leb128(&mut memory_section, pages);
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    module.push(0x05);
    leb128(&mut module, memory_section.len() as u32);
    module.extend(memory_section);
    for i in 0..extra {
        push_section(&mut component, 0x01, &module);
        let mut instance = vec![0x01, 0x00];
        leb128(&mut instance, modules_before + i);
        instance.push(0x00);
        push_section(&mut component, 0x02, &instance);
    }
    component
}

fn push_section(out: &mut Vec<u8>, id: u8, contents: &[u8]) {
    out.push(id);
    leb128(out, contents.len() as u32);
    out.extend_from_slice(contents);
}

fn read_leb128(bytes: &[u8], at: &mut usize) -> u32 {
    let (mut value, mut shift) = (0u32, 0);
    loop {
        let byte = bytes[*at];
        *at += 1;
        value |= u32::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return value;
        }
        shift += 7;
    }
}

/// Core modules defined at the component's top level (one per section of id 1).
fn count_core_module_sections(component: &[u8]) -> u32 {
    let (mut at, mut count) = (8, 0);
    while at < component.len() {
        let id = component[at];
        at += 1;
        let len = read_leb128(component, &mut at) as usize;
        count += u32::from(id == 0x01);
        at += len;
    }
    count
}

/// `minimal` with `extra` memories of `pages` pages each, written into `dir`.
fn runner_with(dir: &tempfile::TempDir, extra: u32, pages: u32) -> String {
    write_runner(dir, &minimal_with_memories(extra, pages))
}

fn write_runner(dir: &tempfile::TempDir, bytes: &[u8]) -> String {
    let path = dir.path().join("many-memories.wasm");
    std::fs::write(&path, bytes).unwrap();
    path.display().to_string()
}

#[tokio::test]
async fn the_memory_limit_counts_every_memory_of_the_instance() {
    let _logs = LogCapture::start();
    let dir = tempfile::tempdir().unwrap();
    // An extra memory of 7.5 MiB is under an 8 MiB limit, and so is the runner's own (about
    // 1 MiB); together they are not.
    let mut over = alloc(&runner_with(&dir, 1, 120), &["main"], &[]);
    over.limits.memory_bytes = Some(8 << 20);
    let state = start(over, None).stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert_eq!(state.description, "memory limit of 8 MiB exceeded");
}

#[tokio::test]
async fn an_instance_may_not_have_more_than_two_memories() {
    let _logs = LogCapture::start();
    let dir = tempfile::tempdir().unwrap();
    let runner = runner_with(&dir, 2, 1);
    // The pooling allocator refuses such a component when it is loaded; allocating on demand,
    // the store's limiter refuses it when it is instantiated.
    let description = match runtime().load_file(std::path::Path::new(&runner)) {
        Err(refused) => refused.to_string(),
        Ok(_) => {
            let started = start(alloc(&runner, &["main"], &[]), None);
            let state = started.stopped().await;
            assert_eq!(state.client_status, ClientStatus::Failed);
            state.description
        }
    };
    // Pooling names the per-component limit on memories; on demand, wasmtime says "memory
    // count too high".
    assert!(description.contains("memor"), "{description}");
}

#[tokio::test]
async fn a_second_small_memory_is_fine() {
    let _logs = LogCapture::start();
    let dir = tempfile::tempdir().unwrap();
    let runner = runner_with(&dir, 1, 1);
    let started = start(alloc(&runner, &["main"], &[]), None);
    eventually_async("the runner to report running", || async {
        started.runner.alloc_state().client_status == ClientStatus::Running
    })
    .await;
}
