//! What a file must be before it is a runner: a WebAssembly component (not a core module,
//! not other bytes), checked before compiling, and one exporting `caravan:runner/runner`,
//! checked once compiled. Each refusal says what the file is instead. Also whether a
//! compiled runner can reach a directory at all, so that its sandbox opens none when it
//! cannot. Reads only the bytes and the compiled component it is given.

use crate::runtime::LoadError;
use crate::runtime::imports::bindings::RUNNER_EXPORT;
use std::path::Path;
use wasmtime::Engine;
use wasmtime::component::{Component, types::ComponentItem};

pub(in crate::runtime) fn check_component_header(
    path: &Path,
    bytes: &[u8],
) -> Result<(), LoadError> {
    let not_a_component = |reason: &str| LoadError::NotAComponent {
        path: path.to_path_buf(),
        reason: reason.into(),
    };
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(not_a_component(
            "the file does not start with the WebAssembly magic bytes `\\0asm`",
        ));
    }
    // Bytes 6..8 are the layer: 0 for a core module, 1 for a component.
    if bytes[6..8] == [0, 0] {
        return Err(not_a_component(
            "it is a core WebAssembly module; build the runner for `wasm32-wasip2`, or wrap it with `wasm-tools component new`",
        ));
    }
    Ok(())
}

/// Whether `component` imports any `wasi:filesystem` interface. One that does not can name
/// no directory, so none is made for it nor opened in its sandbox: each preopened directory
/// holds a host descriptor for the alloc's whole life (descriptors, not memory, would cap how
/// many such allocs a node keeps live), and making and removing one was most of what a short
/// alloc cost.
pub(in crate::runtime) fn imports_filesystem(engine: &Engine, component: &Component) -> bool {
    component
        .component_type()
        .imports(engine)
        .any(|(name, _)| name.starts_with("wasi:filesystem/"))
}

pub(in crate::runtime) fn check_runner_export(
    path: &Path,
    engine: &Engine,
    component: &Component,
) -> Result<(), LoadError> {
    let component_type = component.component_type();
    let exports: Vec<String> = component_type
        .exports(engine)
        .map(|(name, item)| match item.ty {
            ComponentItem::ComponentInstance(_) => name.to_string(),
            _ => format!("{name} (not an interface)"),
        })
        .collect();
    if exports.iter().any(|name| name == RUNNER_EXPORT) {
        return Ok(());
    }
    Err(LoadError::MissingExport {
        path: path.to_path_buf(),
        exports: if exports.is_empty() {
            "nothing".into()
        } else {
            exports.join(", ")
        },
    })
}
