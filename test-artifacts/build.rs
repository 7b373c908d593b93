//! Builds every runner in `guests/` for `wasm32-wasip2` in one cargo call, and writes their
//! paths as constants (plus a `foreach_guest!` macro) for the host's tests.
//!
//! The nested cargo gets its own target directory (`target/guests`) and none of the outer
//! build's flags, so it neither waits on the outer build's lock nor builds wasm with host
//! flags. It shares the outer build's jobserver, so two cores stay two cores.

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    let guests_dir = root.join("guests");
    let target_dir = root.join("target").join("guests");
    for watched in ["guests", "guest-sdk", "wit"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }

    check_target_installed();

    let guests = find_guests(&guests_dir);
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .arg("build")
        .arg("--manifest-path")
        .arg(guests_dir.join("Cargo.toml"))
        .arg("--target")
        .arg(TARGET)
        .arg("--release")
        .arg("--target-dir")
        .arg(&target_dir);
    for guest in &guests {
        command.arg("-p").arg(&guest.package);
    }
    for flag in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_PRIMARY_PACKAGE",
    ] {
        command.env_remove(flag);
    }
    let status = command
        .status()
        .expect("cannot run cargo to build the guests");
    if !status.success() {
        panic!(
            "building the guests in {} failed (see the errors above)",
            guests_dir.display()
        );
    }

    let release = target_dir.join(TARGET).join("release");
    let mut generated = String::new();
    let mut names = Vec::new();
    for guest in &guests {
        let path = release.join(&guest.file_name);
        assert!(
            path.exists(),
            "guest {} built, but {} is missing",
            guest.package,
            path.display()
        );
        let ident = guest.package.replace('-', "_");
        writeln!(generated, "/// `{}` built for {TARGET}.", guest.package).unwrap();
        writeln!(
            generated,
            "pub const {}: &str = {:?};",
            ident.to_uppercase(),
            path.display().to_string()
        )
        .unwrap();
        names.push(ident);
    }
    writeln!(
        generated,
        "/// Calls `$mac!(name)` once per guest, so tests can insist each one is used."
    )
    .unwrap();
    writeln!(
        generated,
        "#[macro_export]\nmacro_rules! foreach_guest {{ ($mac:ident) => {{"
    )
    .unwrap();
    for name in &names {
        writeln!(generated, "    $mac!({name});").unwrap();
    }
    writeln!(generated, "}} }}").unwrap();
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("guests.rs");
    std::fs::write(out, generated).unwrap();
}

struct Guest {
    package: String,
    file_name: String,
}

/// Every package under `guests/` and `guests/fixtures/`: a `cdylib` becomes
/// `<name_with_underscores>.wasm`, a `bin` `<name>.wasm`.
fn find_guests(guests_dir: &Path) -> Vec<Guest> {
    let mut manifests = Vec::new();
    for dir in [guests_dir.to_path_buf(), guests_dir.join("fixtures")] {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
            .map(|entry| entry.unwrap().path().join("Cargo.toml"))
            .filter(|manifest| manifest.exists())
            .collect();
        entries.sort();
        manifests.extend(entries);
    }
    manifests
        .into_iter()
        .map(|manifest| {
            let text = std::fs::read_to_string(&manifest).unwrap();
            let package = text
                .lines()
                .find_map(|line| line.trim().strip_prefix("name = \""))
                .and_then(|rest| rest.strip_suffix('"'))
                .unwrap_or_else(|| panic!("no package name in {}", manifest.display()))
                .to_string();
            let file_name = if text.contains("cdylib") {
                format!("{}.wasm", package.replace('-', "_"))
            } else {
                format!("{package}.wasm")
            };
            Guest { package, file_name }
        })
        .collect()
}

fn check_target_installed() {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let output = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", TARGET])
        .output();
    let installed = output
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).exists())
        .unwrap_or(false);
    if !installed {
        panic!(
            "the {TARGET} target is not installed: run `rustup target add {TARGET}` (or ./run-tests, which does)"
        );
    }
}
