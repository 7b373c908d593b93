//! Loading components: every bad input gets a message naming the file and what is wrong,
//! and a component is compiled once however many allocs use it.

use crate::support::*;
use caravan_test_artifacts::SLEEPER;
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
