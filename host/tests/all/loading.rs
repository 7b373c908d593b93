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

#[tokio::test]
async fn the_cache_keeps_to_its_budget_by_removing_the_least_recently_used_entries() {
    use std::time::{Duration, SystemTime};
    let logs = LogCapture::start();
    let entry_of = |dir: &Path, runner: &str| {
        let runtime = Runtime::new(&cached_in(dir)).unwrap();
        assert_eq!(
            runtime.load_file(Path::new(runner)).unwrap().origin,
            Origin::Compiled
        );
        let entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(entries.len(), 1, "{entries:?}");
        entries[0].clone()
    };
    let scratch = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let minimal_entry = entry_of(scratch[0].path(), MINIMAL);
    let sleeper_bytes = std::fs::metadata(entry_of(scratch[1].path(), SLEEPER))
        .unwrap()
        .len();

    // A cache that already holds the minimal runner, used an hour ago, and two entries of
    // 1,000 bytes (another wasmtime build's, say): one used two hours ago, one a minute ago.
    // Adding the sleeper takes it 500 bytes over budget: only the oldest has to go.
    let cache = tempfile::tempdir().unwrap();
    let aged = |path: &Path, bytes: usize, age_secs: u64| {
        if !path.exists() {
            std::fs::write(path, vec![0u8; bytes]).unwrap();
        }
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(SystemTime::now() - Duration::from_secs(age_secs))
            .unwrap();
    };
    let kept_minimal = cache.path().join(minimal_entry.file_name().unwrap());
    std::fs::copy(&minimal_entry, &kept_minimal).unwrap();
    aged(&kept_minimal, 0, 3_600);
    let oldest = cache.path().join("oldest-0000000000000000.cwasm");
    aged(&oldest, 1_000, 7_200);
    let recent = cache.path().join("recent-0000000000000000.cwasm");
    aged(&recent, 1_000, 60);
    // The temporary files of writes in progress, and of one whose process died.
    let abandoned = cache.path().join(".partial-abandoned");
    aged(&abandoned, 10, 2 * 3_600);
    let in_progress = cache.path().join(".partial-in-progress");
    aged(&in_progress, 10, 60);

    let minimal_bytes = std::fs::metadata(&kept_minimal).unwrap().len();
    let config = RuntimeConfig {
        cache_max_bytes: minimal_bytes + sleeper_bytes + 1_500,
        ..cached_in(cache.path())
    };
    let runtime = Runtime::new(&config).unwrap();
    assert_eq!(
        runtime.load_file(Path::new(MINIMAL)).unwrap().origin,
        Origin::DiskCache
    );
    let used_now = std::fs::metadata(&kept_minimal)
        .unwrap()
        .modified()
        .unwrap();
    assert!(
        used_now > SystemTime::now() - Duration::from_secs(600),
        "loading an entry marks it used"
    );
    assert_eq!(
        runtime.load_file(Path::new(SLEEPER)).unwrap().origin,
        Origin::Compiled
    );

    let left: Vec<_> = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left.len(), 4, "{left:?}");
    let holds = |name: &str| left.iter().any(|left| left == name);
    assert!(
        !holds("oldest-0000000000000000.cwasm"),
        "the oldest goes: {left:?}"
    );
    assert!(!holds(".partial-abandoned"), "{left:?}");
    assert!(holds("recent-0000000000000000.cwasm"), "{left:?}");
    assert!(holds(".partial-in-progress"), "{left:?}");
    assert!(
        holds(kept_minimal.file_name().unwrap().to_str().unwrap()),
        "{left:?}"
    );
    let sleeper_hash = &runtime.load_file(Path::new(SLEEPER)).unwrap().hash;
    assert!(
        left.iter()
            .any(|name| name.starts_with(sleeper_hash.as_str())),
        "the entry just written stays: {left:?}"
    );
    assert_eq!(
        logs.with_message("removed the least recently used compiled runners from the cache")
            .len(),
        1
    );
}
