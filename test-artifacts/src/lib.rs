//! Paths of the runner components in `guests/`, built for `wasm32-wasip2` by this crate's
//! build script. Test-only: the host depends on it as a dev-dependency.

include!(concat!(env!("OUT_DIR"), "/guests.rs"));

/// Where the Python, JavaScript and C runners are built: by `guests/<language>/build`, which
/// `./run-tests` runs first (their toolchains are not cargo's, so this crate does not).
pub const OTHER_LANGUAGES_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/guests");

/// Languages with a `minimal`, a `sleeper` and a `batch` runner under `guests/<language>/`.
pub const OTHER_LANGUAGES: [&str; 3] = ["python", "js", "c"];

/// The path of `runner` (`minimal`, `sleeper` or `batch`) in `language`, and the command that
/// builds it.
pub fn other_language_runner(language: &str, runner: &str) -> (String, String) {
    (
        format!("{OTHER_LANGUAGES_DIR}/{language}/{runner}.wasm"),
        format!("guests/{language}/build"),
    )
}

/// A compiled-component cache for tests that run the `caravan` binary on large runners, so
/// each is compiled once per machine, not once per test run.
pub const TEST_CACHE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/test-cache");
