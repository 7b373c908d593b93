//! `componentize-c`: what a C runner needs besides clang, from library crates.
//!
//! ```text
//! componentize-c bindings WIT_DIR WORLD OUT_DIR      C header, source and type object for WORLD
//! componentize-c component CORE.wasm OUT.wasm        a clang-built core module as a component
//! ```
//!
//! `bindings` does what `wit-bindgen c` does; `component` what `wasm-tools component new
//! --adapt` does with the WASI preview1 reactor adapter. Installing those two CLIs takes about
//! 13 minutes of compiling on two cores; these crates are a fraction of that, and their
//! versions are pinned by the workspace's lock file.
//!
//! What this may touch: the files it is given and `OUT_DIR`.

use anyhow::{Context, bail};
use std::path::Path;

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let outcome = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["bindings", wit, world, out] => bindings(Path::new(wit), world, Path::new(out)),
        ["component", module, out] => component(Path::new(module), Path::new(out)),
        _ => Err(anyhow::anyhow!(
            "usage: componentize-c bindings WIT_DIR WORLD OUT_DIR | component CORE.wasm OUT.wasm"
        )),
    };
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("componentize-c: {error:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// Writes the C bindings of `world` (from the WIT package in `wit`) into `out`.
fn bindings(wit: &Path, world: &str, out: &Path) -> anyhow::Result<()> {
    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve
        .push_dir(wit)
        .with_context(|| format!("cannot read the WIT package in {}", wit.display()))?;
    let world = resolve.select_world(&[package], Some(world))?;
    let mut files = wit_bindgen_core::Files::default();
    wit_bindgen_c::Opts::default()
        .build()
        .generate(&mut resolve, world, &mut files)?;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    for (name, bytes) in files.iter() {
        let path = out.join(name);
        std::fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Turns a core module (with the component type section the bindings' object file put in
/// it) into a component, adapting its WASI preview1 imports to preview2.
fn component(module: &Path, out: &Path) -> anyhow::Result<()> {
    let bytes =
        std::fs::read(module).with_context(|| format!("cannot read {}", module.display()))?;
    if !bytes.starts_with(b"\0asm\x01\0\0\0") {
        bail!("{} is not a core WebAssembly module", module.display());
    }
    let component = wit_component::ComponentEncoder::default()
        .module(&bytes)?
        .adapter(
            wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME,
            wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
        )?
        .validate(true)
        .encode()
        .with_context(|| format!("cannot make a component of {}", module.display()))?;
    std::fs::write(out, component).with_context(|| format!("cannot write {}", out.display()))?;
    Ok(())
}
