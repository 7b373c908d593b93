//! `caravan runner new`: a folder with a working runner in one of the four languages, its
//! build script, a job file and a README with the three commands to build, check and run it.
//!
//! Each language's scaffold is the same small runner on that language's SDK (`guest-sdk/`:
//! `caravan-guest`, `caravan_runner`, `caravan-runner.js`, `caravan_runner.h`): a service
//! ("hello", then a line every `log_every`), or with `--files` a batch runner that writes
//! `/alloc/out/result.json` in the language's own way and ends. Each build script uses the
//! SDK and the toolchain of the Caravan checkout the `caravan` binary was built from
//! (`scripts/setup` installs it), and checks what the language's checker can (mypy,
//! TypeScript, the compiler's warnings); `CARAVAN_HOME` points a script at another checkout.
//!
//! A leaf: it writes files under the folder it makes, never over an existing one, and knows
//! nothing of runners beyond their text.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};

/// A language a runner can be scaffolded in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Language {
    /// Rust, with the `caravan-guest` SDK.
    Rust,
    /// Python, with componentize-py.
    Python,
    /// JavaScript, with componentize-js.
    Js,
    /// C, with wit-bindgen's C bindings and clang.
    C,
}

/// What the scaffold's runner does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Template {
    /// A service: says hello, logs a line every `log_every`, runs until it is killed.
    Service,
    /// A batch runner that writes `/alloc/out/result.json`, reads it back and ends.
    Files,
}

/// The Caravan checkout this binary was built from: its `wit/`, `guest-sdk/` and toolchains.
pub fn default_caravan_home() -> PathBuf {
    let host = Path::new(env!("CARGO_MANIFEST_DIR"));
    host.parent().unwrap_or(host).to_path_buf()
}

/// Checks a runner's name: it names a folder, a file, a job and (for Rust) a crate.
pub fn check_name(name: &str) -> anyhow::Result<()> {
    let first_ok = name.chars().next().is_some_and(|c| c.is_ascii_lowercase());
    let rest_ok = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !first_ok || !rest_ok || name.len() > 64 || name.ends_with('-') {
        bail!(
            "{name:?} cannot name a runner: use 1 to 64 lower-case letters, digits and '-', \
             starting with a letter (it names a folder, a job and a crate)"
        );
    }
    Ok(())
}

/// Writes the runner `name` in `language`, doing what `template` says, into a new folder
/// `parent/name`, with `caravan_home` baked into its build script; returns the folder.
/// Refuses an existing folder, and leaves nothing behind when a write fails.
pub fn create(
    parent: &Path,
    name: &str,
    language: Language,
    template: Template,
    caravan_home: &Path,
) -> anyhow::Result<PathBuf> {
    check_name(name)?;
    let folder = parent.join(name);
    if folder.exists() {
        bail!(
            "{} exists already; choose another name or --dir",
            folder.display()
        );
    }
    // Written beside the folder and renamed into place: a failure leaves no half runner.
    let staging = tempfile::Builder::new()
        .prefix(&format!(".{name}-"))
        .tempdir_in(parent)
        .with_context(|| format!("cannot write in {}", parent.display()))?;
    for (path, text) in files(name, language, template, caravan_home) {
        let target = staging.path().join(&path);
        if let Some(dir) = target.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&target, text).with_context(|| format!("cannot write {path}"))?;
    }
    set_executable(&staging.path().join("build"))?;
    let staged = staging.keep();
    if let Err(error) = std::fs::rename(&staged, &folder) {
        let _ = std::fs::remove_dir_all(&staged);
        return Err(error).with_context(|| format!("cannot create {}", folder.display()));
    }
    Ok(folder)
}

fn set_executable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}

/// Every file of the scaffold: its path in the folder, and its text.
fn files(
    name: &str,
    language: Language,
    template: Template,
    caravan_home: &Path,
) -> Vec<(String, String)> {
    let home = caravan_home.display().to_string();
    let files = template == Template::Files;
    let pick = |service: &str, file_writer: &str| {
        if files { file_writer } else { service }.replace("{name}", name)
    };
    let (source_path, source, build_steps, setup) = match language {
        Language::Rust => (
            "src/lib.rs",
            pick(RUST_LIB, RUST_FILES_LIB),
            rust_build(name),
            "rust",
        ),
        Language::Python => (
            "app.py",
            pick(HELLO_PYTHON, FILES_PYTHON),
            PYTHON_BUILD.replace("{name}", name),
            "python",
        ),
        Language::Js => (
            "runner.js",
            pick(HELLO_JS, FILES_JS),
            // Only the files SDK imports wasi:filesystem, which the runner's world must name.
            JS_BUILD.replace("{name}", name).replace(
                "{world}",
                if files { "file-runner" } else { "alloc-runner" },
            ),
            "js",
        ),
        Language::C => ("runner.c", pick(HELLO_C, FILES_C), c_build(name), "c"),
    };
    let build = format!(
        "#!/usr/bin/env bash\n\
         # Builds out/{name}.wasm with the toolchain of the Caravan checkout at CARAVAN_HOME\n\
         # (default: the one this runner was made from; `scripts/setup {setup}` there installs it).\n\
         set -euo pipefail\n\
         cd \"$(dirname \"$0\")\"\n\
         caravan_home=\"${{CARAVAN_HOME:-{home}}}\"\n\
         mkdir -p out\n\
         {build_steps}\
         echo \"built out/{name}.wasm\"\n"
    );
    let job_type = if files { "batch" } else { "service" };
    let job = format!(
        "# caravan job run {name}.toml (with an agent running: caravan agent --dev)\n\
         [job]\nid = \"{name}\"\ntype = \"{job_type}\"\ncount = 1\nrunner = \"out/{name}.wasm\"\n\n\
         [[job.tasks]]\nname = \"main\"\nconfig = {{ }}\n"
    );
    let run = if files {
        "`caravan run out/{name}.wasm` runs one alloc of it without an agent, until it ends."
    } else {
        "`caravan run out/{name}.wasm` runs one alloc of it without an agent; Ctrl-C kills it. With\n\
         `--watch`, each `./build` (in another terminal) upgrades that alloc in place, from its\n\
         checkpoint; `caravan job run {name}.toml` again after a build does the same on an agent."
    };
    let readme = README
        .replace("{files}", if files { FILES_README } else { "" })
        .replace("{run}", run)
        .replace("{name}", name)
        .replace("{language}", language_name(language))
        .replace("{source}", source_path)
        .replace("{setup}", setup)
        .replace("{home}", &home);
    let mut files = vec![
        ("README.md".to_string(), readme),
        ("build".to_string(), build),
        (format!("{name}.toml"), job),
        (source_path.to_string(), source),
        (".gitignore".to_string(), "/out/\n/target/\n".to_string()),
    ];
    if language == Language::Rust {
        files.push((
            "Cargo.toml".to_string(),
            format!(
                "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
                 [lib]\ncrate-type = [\"cdylib\"]\n\n\
                 [dependencies]\ncaravan-guest = {{ path = \"{home}/guest-sdk\" }}\n\n\
                 # A workspace of its own, wherever the folder is.\n[workspace]\n\n\
                 [profile.release]\n# Small components load and instantiate faster.\n\
                 opt-level = \"s\"\nlto = true\ncodegen-units = 1\n"
            ),
        ));
    }
    files
}

fn language_name(language: Language) -> &'static str {
    match language {
        Language::Rust => "Rust",
        Language::Python => "Python",
        Language::Js => "JavaScript",
        Language::C => "C",
    }
}

fn rust_build(name: &str) -> String {
    let artifact = name.replace('-', "_");
    format!(
        "cargo build --quiet --target wasm32-wasip2 --release\n\
         cp \"${{CARGO_TARGET_DIR:-target}}/wasm32-wasip2/release/{artifact}.wasm\" out/{name}.wasm\n"
    )
}

fn c_build(name: &str) -> String {
    format!(
        "tool=\"$caravan_home/target/debug/componentize-c\"\n\
         # Built by the checkout's guests/c/build; built here only when missing.\n\
         [ -x \"$tool\" ] || (cd \"$caravan_home\" && cargo build --quiet -p caravan-guest-tools --bin componentize-c)\n\
         \"$tool\" bindings \"$caravan_home/wit\" alloc-runner out/bindings\n\
         sdk=\"$caravan_home/guest-sdk/c\"\n\
         clang-14 --target=wasm32-wasi --sysroot=/usr -mexec-model=reactor -O2 -Wall -Wextra -Werror \\\n  \
         -I out/bindings -I \"$sdk\" runner.c \"$sdk/caravan_runner.c\" out/bindings/alloc_runner.c \\\n  \
         out/bindings/alloc_runner_component_type.o -o out/{name}.core.wasm\n\
         \"$tool\" component out/{name}.core.wasm out/{name}.wasm\n"
    )
}

const HELLO_PYTHON: &str = include_str!("scaffold/hello.py");
const HELLO_JS: &str = include_str!("scaffold/hello.js");
const HELLO_C: &str = include_str!("scaffold/hello.c");
const FILES_PYTHON: &str = include_str!("scaffold/files.py");
const FILES_JS: &str = include_str!("scaffold/files.js");
const FILES_C: &str = include_str!("scaffold/files.c");

/// The Python build: the SDK copied in (componentize-py leaves bytecode beside what it
/// imports, which must not land in the checkout), the runner checked against the SDK's types
/// (mypy, with the bindings componentize-py makes for the contract), then componentized with
/// the SDK on its path.
const PYTHON_BUILD: &str = r#"python="$caravan_home/target/toolchains/python/bin"
sdk=out/sdk
rm -rf out/bindings "$sdk" && mkdir -p "$sdk"
cp -r "$caravan_home/guest-sdk/python/caravan_runner" "$sdk/"
"$python/componentize-py" --wit-path "$caravan_home/wit" --world alloc-runner bindings out/bindings >/dev/null
MYPYPATH="out/bindings:$sdk" "$python/mypy" --cache-dir out/mypy-cache --no-error-summary --check-untyped-defs app.py
# componentize-py imports app.py to find its exports, and leaves a __pycache__.
had_cache=$([ -e __pycache__ ] && echo yes || true)
PYTHONDONTWRITEBYTECODE=1 "$python/componentize-py" --wit-path "$caravan_home/wit" --world alloc-runner   componentize app -p . -p "$sdk" --output out/{name}.wasm >/dev/null
[ -n "$had_cache" ] || rm -rf __pycache__
"#;

/// The JavaScript build: the SDK copied in (runner.js imports it from out/), the runner
/// checked against its types by TypeScript, then componentized (componentize-js bundles
/// what it imports) against `{world}`: `file-runner` when the runner uses the files module.
const JS_BUILD: &str = r#"bin="$caravan_home/target/toolchains/js/node_modules/.bin"
cp "$caravan_home"/guest-sdk/js/caravan-*.js "$caravan_home"/guest-sdk/js/caravan-*.d.ts out/
"$bin/tsc" --noEmit --allowJs --checkJs --strict --target es2022 --module es2022 --moduleResolution bundler runner.js
"$bin/componentize-js" --wit "$caravan_home/wit" --world-name {world} --disable http fetch-event   --out out/{name}.wasm runner.js >/dev/null
"#;

const RUST_LIB: &str = r#"//! {name}: a Caravan runner, made by `caravan runner new`. It starts its tasks, says hello,
//! logs a line every `log_every` (task config, default 10s) and runs until it is killed.
//! The SDK's docs (`cargo doc --open`) give the event loop's rules and every hook.

use caravan_guest::{Alloc, Runner, RunnerError, State, TaskConfig};
use std::time::{Duration, Instant};

struct Hello {
    every: Duration,
    next: Instant,
}

impl Runner for Hello {
    fn start(
        alloc: &Alloc,
        _restored: Option<Vec<u8>>,
        state: &mut State,
    ) -> Result<Self, RunnerError> {
        let mut every = Duration::from_secs(10);
        for task in &alloc.tasks {
            if let Some(configured) = TaskConfig::of(task).duration("log_every")? {
                every = configured;
            }
            state.task_started(&task.name);
        }
        caravan_guest::info!("hello from alloc {}", alloc.id);
        Ok(Hello {
            every,
            next: Instant::now() + every,
        })
    }

    fn next_wakeup(&self) -> Option<Duration> {
        caravan_guest::wakeup_for([self.next])
    }

    fn on_wakeup(&mut self, _state: &mut State) -> Result<(), RunnerError> {
        caravan_guest::info!("still running");
        self.next = Instant::now() + self.every;
        Ok(())
    }
}

caravan_guest::export_runner!(Hello);
"#;

/// A Rust batch runner writing `/alloc/out/result.json` with `std::fs`, which imports
/// `wasi:filesystem` itself: the SDK's `alloc-runner` world is enough.
const RUST_FILES_LIB: &str = r#"//! {name}: a Caravan batch runner, made by `caravan runner new --files`. It writes
//! /alloc/out/result.json (the alloc's id and its number of tasks), reads it back, logs it
//! and ends each task with it; `caravan alloc fs ALLOC out/result.json` shows the file.
//! `std::fs` reaches the alloc dir: the runner is built against the `alloc-runner` world.
//! The SDK's docs (`cargo doc --open`) give the event loop's rules and every hook.

use caravan_guest::{Alloc, ClientStatus, Runner, RunnerError, State};

const RESULT: &str = "/alloc/out/result.json";

struct Files;

impl Runner for Files {
    fn start(
        alloc: &Alloc,
        _restored: Option<Vec<u8>>,
        state: &mut State,
    ) -> Result<Self, RunnerError> {
        // The alloc id is a UUID: nothing in it needs escaping in JSON.
        let result = format!("{{\"alloc\":\"{}\",\"tasks\":{}}}\n", alloc.id, alloc.tasks.len());
        let written = write_and_read_back(&result)
            .map_err(|error| RunnerError::Failed(format!("cannot write {RESULT}: {error}")))?;
        caravan_guest::info!("wrote {RESULT}: {}", written.trim_end());
        for task in &alloc.tasks {
            state.task_started(&task.name);
            state.task_finished(&task.name, false, &format!("Wrote {RESULT}"));
        }
        if alloc.tasks.is_empty() {
            state.set_status(ClientStatus::Complete, "All tasks have completed");
        }
        Ok(Files)
    }
}

fn write_and_read_back(text: &str) -> std::io::Result<String> {
    std::fs::create_dir_all("/alloc/out")?;
    std::fs::write(RESULT, text)?;
    std::fs::read_to_string(RESULT)
}

caravan_guest::export_runner!(Files);
"#;

/// The README's part on the result file, for `--files`.
const FILES_README: &str = r#"
The runner writes `/alloc/out/result.json` and ends: the job is a batch job. Read the file
back from the agent with

```sh
caravan job status {name}   # its allocs, with their ids
caravan alloc fs ALLOC_ID out/result.json   # ALLOC_ID, or a unique prefix of it
```

or run one alloc without an agent and keep its dir: `caravan run out/{name}.wasm --keep`
prints where the dir was kept. Only a runner that reaches files is given an alloc dir.
"#;

const README: &str = r#"# {name}: a Caravan runner in {language}

Made by `caravan runner new`. Three commands, from this folder:

```sh
./build                                  # compiles {source} to out/{name}.wasm
caravan runner check out/{name}.wasm     # drives it through the contract, one line per check
caravan job run {name}.toml              # runs it on an agent (`caravan agent --dev` first)
```
{files}
{run}

Change `{source}` to do your work: the contract is `wit/runner.wit` in the Caravan checkout,
and its runner guide (`docs/writing-a-runner.md`) walks through every rule and every
mistake `runner check` catches. A runner that does its work and ends is a batch runner:
give the job `type = "batch"` and check it with `caravan runner check --batch`.

`./build` uses the toolchain of the Caravan checkout at `{home}` (`CARAVAN_HOME` names
another); `scripts/setup {setup}` there installs it.
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_must_fit_a_folder_a_job_and_a_crate() {
        for good in ["hello", "my-runner-2", "a"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "Hello",
            "2fast",
            "../x",
            "a b",
            "x-",
            &"a".repeat(65),
            "a_b",
        ] {
            let error = check_name(bad).unwrap_err().to_string();
            assert!(error.contains("cannot name a runner"), "{bad}: {error}");
        }
    }

    #[test]
    fn an_existing_folder_is_never_written_over() {
        let parent = tempfile::tempdir().unwrap();
        let home = default_caravan_home();
        let made = create(
            parent.path(),
            "hello",
            Language::Python,
            Template::Service,
            &home,
        )
        .unwrap();
        assert!(made.join("app.py").is_file() && made.join("build").is_file());
        std::fs::write(made.join("app.py"), "mine").unwrap();
        let again =
            create(parent.path(), "hello", Language::C, Template::Files, &home).unwrap_err();
        assert!(again.to_string().contains("exists already"), "{again}");
        assert_eq!(
            std::fs::read_to_string(made.join("app.py")).unwrap(),
            "mine"
        );
        let entries = std::fs::read_dir(parent.path()).unwrap().count();
        assert_eq!(entries, 1, "no staging folder left behind");
    }
}
