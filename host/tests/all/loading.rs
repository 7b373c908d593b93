//! Loading components: every bad input gets a message naming the file and what is wrong,
//! and a component is compiled once however many allocs use it.

use crate::support::*;
use caravan_host::model::structs::ClientStatus;
use caravan_host::runtime::{Origin, Pooling, Runtime, RuntimeConfig};
use caravan_test_artifacts::{MINIMAL, SLEEPER};
use std::path::Path;
use std::sync::Arc;

fn load_error(path: &Path) -> String {
    runtime()
        .load_file(path)
        .err()
        .expect("refused")
        .to_string()
}

#[test]
fn a_missing_file_is_named() {
    assert_eq!(
        load_error(Path::new("/no/such/runner.wasm")),
        "runner component /no/such/runner.wasm does not exist"
    );
}

#[test]
fn bytes_that_are_not_wasm_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.wasm");
    std::fs::write(&path, "hello").unwrap();
    let error = load_error(&path);
    assert!(
        error.starts_with(&format!(
            "{} is not a WebAssembly component",
            path.display()
        )),
        "{error}"
    );
    assert!(error.contains("magic bytes"), "{error}");
}

#[test]
fn a_core_module_is_refused_with_how_to_make_a_component() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("core.wasm");
    std::fs::write(&path, b"\0asm\x01\0\0\0").unwrap();
    let error = load_error(&path);
    assert!(
        error.contains("core WebAssembly module") && error.contains("wasm32-wasip2"),
        "{error}"
    );
}

#[test]
fn the_same_bytes_under_another_path_are_not_compiled_again() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy-of-sleeper.wasm");
    std::fs::copy(SLEEPER, &copy).unwrap();
    let original = runtime().load_file(Path::new(SLEEPER)).unwrap();
    let copied = runtime().load_file(&copy).unwrap();
    assert!(
        Arc::ptr_eq(&original, &copied),
        "cached by content hash, not by path"
    );
}

#[test]
fn a_component_is_compiled_once_and_shared() {
    let first = runtime().load_file(Path::new(SLEEPER)).unwrap();
    let second = runtime().load_file(Path::new(SLEEPER)).unwrap();
    assert!(Arc::ptr_eq(&first, &second));
    assert_eq!(first.hash.len(), 64);
}

/// A runtime config that keeps compiled components in `dir` (and pools nothing, so that each
/// runtime a test makes is cheap).
fn cached_in(dir: &Path) -> RuntimeConfig {
    RuntimeConfig {
        pooling: Pooling::Off,
        cache_dir: Some(dir.to_path_buf()),
        ..RuntimeConfig::default()
    }
}

#[tokio::test(start_paused = true)]
async fn compiled_components_are_cached_on_disk_and_a_corrupted_entry_is_recompiled() {
    let logs = LogCapture::start();
    let cache = tempfile::tempdir().unwrap();
    let config = cached_in(cache.path());
    let load = || {
        let runtime = Runtime::new(&config).unwrap();
        let loaded = runtime.load_file(Path::new(MINIMAL)).unwrap();
        (runtime, loaded)
    };
    let (_, first) = load();
    assert_eq!(first.origin, Origin::Compiled);
    let (_, second) = load();
    assert_eq!(
        second.origin,
        Origin::DiskCache,
        "a restart does not compile again"
    );

    // Flip bytes in the middle of the one entry, as a bad disk or a torn write would.
    let entries: Vec<_> = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let mut bytes = std::fs::read(&entries[0]).unwrap();
    let middle = bytes.len() / 2;
    for byte in &mut bytes[middle..middle + 16] {
        *byte ^= 0xff;
    }
    std::fs::write(&entries[0], bytes).unwrap();

    let (runtime, third) = load();
    assert_eq!(
        third.origin,
        Origin::Compiled,
        "never trusted: compiled again"
    );
    assert_eq!(
        logs.with_message("ignoring damaged compiled-component cache entry")
            .len(),
        1
    );
    let started = start_on(runtime, alloc(MINIMAL, &["main"], &[]), None);
    started
        .recorder
        .wait_for_status(ClientStatus::Running)
        .await;
    started.runner.kill();
    assert_eq!(
        started.stopped().await.client_status,
        ClientStatus::Complete
    );
    let (_, fourth) = load();
    assert_eq!(fourth.origin, Origin::DiskCache, "the entry was rewritten");
}

#[tokio::test]
async fn a_cache_entry_others_may_write_is_never_loaded() {
    use std::os::unix::fs::PermissionsExt;
    let logs = LogCapture::start();
    let cache = tempfile::tempdir().unwrap();
    let config = cached_in(cache.path());
    let load = || {
        Runtime::new(&config)
            .unwrap()
            .load_file(Path::new(MINIMAL))
            .unwrap()
    };
    assert_eq!(load().origin, Origin::Compiled);
    let entry = std::fs::read_dir(cache.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    // Writable by the group: anyone in it could have put their own machine code there.
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o664)).unwrap();
    assert_eq!(
        load().origin,
        Origin::Compiled,
        "not trusted: compiled again"
    );
    let warned = logs
        .with_message("ignoring a compiled-component cache entry someone else could have written");
    assert!(
        warned[0]["fields"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("others may write it")),
        "{warned:?}"
    );
    // The same holds for the directory the entries are in.
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(load().origin, Origin::DiskCache);
    std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_eq!(load().origin, Origin::Compiled);
    // Writing the entry again closed the directory to others: the next start trusts it.
    assert_eq!(load().origin, Origin::DiskCache);
}
