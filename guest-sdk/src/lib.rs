//! Write Caravan alloc runners in Rust.
//!
//! A runner is a WebAssembly component that runs one alloc (an instance of a job) for the
//! Caravan host. This crate gives you the contract of `wit/runner.wit` as Rust: the types, the
//! host functions, logging macros over `wasi:logging`, a [`State`] that builds the state reports
//! for you, and a [`Runner`] trait whose default event loop means you write only what differs.
//!
//! # Layout
//! - [`bindings`]: the raw bindings generated from `wit/` (use them for full control).
//! - [`host`]: the host functions with Rust types (`Duration`, `&[u8]`).
//! - [`State`]: the alloc's state (client status, task states with events) and `report()`.
//! - [`Runner`] and [`export_runner!`]: the event loop.
//! - [`Guest`] and [`export!`]: the raw contract, for runners that want no loop of ours.
//! - [`trace!`] .. [`critical!`]: log through the host's logger.
//! - [`parse_duration`]: durations in task config (`500ms`, `5s`, `2m`).
//! - [`encode_checkpoint`], [`decode_checkpoint`]: versioned checkpoints, the same bytes in
//!   every Caravan SDK (Python `caravan_runner`, JavaScript `caravan-runner.js`, C
//!   `caravan_runner.h`, under `guest-sdk/`).
//!
//! # A complete runner
//!
//! Build with `cargo build --target wasm32-wasip2 --release` from a `cdylib` crate:
//!
//! ```no_run
//! use caravan_guest::{Alloc, Runner, RunnerError, State};
//!
//! struct Hello;
//!
//! impl Runner for Hello {
//!     fn start(alloc: &Alloc, _restored: Option<Vec<u8>>, state: &mut State)
//!         -> Result<Self, RunnerError>
//!     {
//!         caravan_guest::info!("hello from {}", alloc.id);
//!         for task in &alloc.tasks {
//!             state.task_started(&task.name);
//!         }
//!         Ok(Hello)
//!     }
//! }
//!
//! caravan_guest::export_runner!(Hello);
//! ```
//!
//! The default loop reports `running` once the tasks started, waits for events, answers `kill`
//! by marking every task killed and reporting `complete`, and answers `shutdown` by saving
//! [`Runner::checkpoint`] and returning.

// Lets the generated code and our macros name this crate the same way inside and outside it.
extern crate self as caravan_guest;

/// Raw bindings generated from `wit/` by wit-bindgen.
#[allow(missing_docs)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit",
        world: "alloc-runner",
        // The world imports `wasi:logging`, which lives in another package: generate it too.
        generate_all,
        // Runner crates depend on this crate only, so the export macro must be public and find
        // the bindings and the wit-bindgen runtime through us.
        pub_export_macro: true,
        default_bindings_module: "caravan_guest::bindings",
        runtime_path: "caravan_guest::__wit_bindgen::rt",
        // Lets `State` skip reports that change nothing.
        additional_derives: [PartialEq],
    });
}

#[doc(hidden)]
pub use wit_bindgen as __wit_bindgen;

pub use bindings::caravan::runner::types::{
    Alloc, AllocState, ClientStatus, DesiredStatus, Event, RunnerError, SignalRequest, Task,
    TaskEvent, TaskLifecycle, TaskState,
};
pub use bindings::exports::caravan::runner::runner::Guest;
pub use bindings::wasi::logging::logging::Level;

mod checkpoint;
pub use checkpoint::{decode_checkpoint, encode_checkpoint};

mod config;
pub use config::{TaskConfig, parse_duration, wakeup_for};

mod state;
pub use state::State;

mod runner;
pub use runner::{Runner, run};

/// The host functions, with Rust types. They call the host, so their examples only compile
/// here; they run inside a component.
///
/// A loop of your own, for a runner that wants no [`Runner`] (export it with [`export!`]):
///
/// ```no_run
/// use caravan_guest::{Event, State, host};
/// use std::time::Duration;
/// # fn run_alloc(alloc: caravan_guest::Alloc) -> Result<(), caravan_guest::RunnerError> {
/// let mut state = State::new(&alloc);
/// state.task_started("main");
/// state.report().map_err(caravan_guest::RunnerError::Failed)?;
/// loop {
///     match host::next_event(Some(Duration::from_secs(5))) {
///         None => caravan_guest::info!("five quiet seconds"),
///         Some(Event::Kill) => {
///             state.kill_all("alloc was stopped");
///             state.report().map_err(caravan_guest::RunnerError::Failed)?;
///             return Ok(());
///         }
///         Some(Event::Shutdown) => {
///             host::checkpoint(b"where I was").map_err(caravan_guest::RunnerError::Failed)?;
///             return Ok(());
///         }
///         Some(_) => {} // update, signal, restart-task: not ours to act on here
///     }
/// }
/// # }
/// ```
pub mod host {
    use crate::bindings::caravan::runner::host as raw;
    use crate::{AllocState, Event};
    use std::time::Duration;

    /// Waits for the host's next instruction, at most `timeout` rounded up to whole
    /// milliseconds (`None`: as long as it takes; zero: only looks at what is queued).
    ///
    /// Returns `None` when the timeout passed first. Once `kill` or `shutdown` was delivered,
    /// every later call returns it again at once.
    pub fn next_event(timeout: Option<Duration>) -> Option<Event> {
        raw::next_event(timeout_millis(timeout))
    }

    /// `timeout` as `next-event` takes it: rounded up to whole milliseconds, so a wake-up
    /// never comes before it (a runner woken early would find nothing due and ask again at
    /// once), and `u64::MAX` for `None` or a timeout too long to count.
    pub(crate) fn timeout_millis(timeout: Option<Duration>) -> u64 {
        timeout.map_or(u64::MAX, |t| {
            u64::try_from(t.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
        })
    }

    /// Reports the alloc's state; see `update-state` in `wit/runner.wit` for what is refused.
    pub fn update_state(state: &AllocState) -> Result<(), String> {
        raw::update_state(state)
    }

    /// Saves `data` as the checkpoint that `run` receives as `restored` after a restart.
    pub fn checkpoint(data: &[u8]) -> Result<(), String> {
        raw::checkpoint(data)
    }

    /// Milliseconds since the Unix epoch, for task events.
    pub fn now_unix_ms() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// Sends one line to the host's logger. The macros below call this; call it yourself to pick
/// the level at run time.
///
/// ```no_run
/// let level = if 3 > 2 { caravan_guest::Level::Warn } else { caravan_guest::Level::Info };
/// caravan_guest::log(level, "disk", "90% full");
/// ```
pub fn log(level: Level, context: &str, message: &str) {
    bindings::wasi::logging::logging::log(level, context, message);
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log {
    ($level:expr, context: $context:expr, $($arg:tt)+) => {
        $crate::log($level, $context, &::std::format!($($arg)+))
    };
    ($level:expr, $($arg:tt)+) => {
        $crate::log($level, ::std::module_path!(), &::std::format!($($arg)+))
    };
}

/// Logs at TRACE level: `trace!("x = {x}")`, or `trace!(context: "db", "x = {x}")`.
/// The context defaults to the module path. Every level's macro takes the same forms:
///
/// ```no_run
/// let rows = 42;
/// caravan_guest::info!("loaded {rows} rows");
/// caravan_guest::warn!(context: "db", "slow query: {} ms", 1200);
/// ```
#[macro_export]
macro_rules! trace { ($($arg:tt)+) => { $crate::__log!($crate::Level::Trace, $($arg)+) }; }
/// Logs at DEBUG level; see [`trace!`] for the forms.
#[macro_export]
macro_rules! debug { ($($arg:tt)+) => { $crate::__log!($crate::Level::Debug, $($arg)+) }; }
/// Logs at INFO level; see [`trace!`] for the forms.
#[macro_export]
macro_rules! info { ($($arg:tt)+) => { $crate::__log!($crate::Level::Info, $($arg)+) }; }
/// Logs at WARN level; see [`trace!`] for the forms.
#[macro_export]
macro_rules! warn { ($($arg:tt)+) => { $crate::__log!($crate::Level::Warn, $($arg)+) }; }
/// Logs at ERROR level; see [`trace!`] for the forms.
#[macro_export]
macro_rules! error { ($($arg:tt)+) => { $crate::__log!($crate::Level::Error, $($arg)+) }; }
/// Logs at CRITICAL level (the host logs it as ERROR); see [`trace!`] for the forms.
#[macro_export]
macro_rules! critical { ($($arg:tt)+) => { $crate::__log!($crate::Level::Critical, $($arg)+) }; }

/// Exports a type implementing [`Guest`] (the raw `run` function) as this component's
/// `caravan:runner/runner`. Most runners want [`export_runner!`] instead.
///
/// ```no_run
/// use caravan_guest::{Alloc, Guest, RunnerError, State};
///
/// struct Raw;
///
/// impl Guest for Raw {
///     fn run(alloc: Alloc, _restored: Option<Vec<u8>>) -> Result<(), RunnerError> {
///         let mut state = State::new(&alloc);
///         for task in &alloc.tasks {
///             state.task_finished(&task.name, false, "nothing to do");
///         }
///         state.report().map_err(RunnerError::Failed)
///     }
/// }
///
/// caravan_guest::export!(Raw);
/// ```
#[macro_export]
macro_rules! export {
    ($guest:ident) => {
        $crate::bindings::export!($guest with_types_in $crate::bindings);
    };
}

/// Exports a type implementing [`Runner`] as this component's `caravan:runner/runner`.
///
/// Use it once, at the crate root of a `cdylib` built for `wasm32-wasip2`.
#[macro_export]
macro_rules! export_runner {
    ($runner:ty) => {
        #[doc(hidden)]
        struct __CaravanRunnerExport;

        impl $crate::bindings::exports::caravan::runner::runner::Guest for __CaravanRunnerExport {
            fn run(
                alloc: $crate::Alloc,
                restored: ::std::option::Option<::std::vec::Vec<u8>>,
            ) -> ::std::result::Result<(), $crate::RunnerError> {
                $crate::run::<$runner>(alloc, restored)
            }
        }

        $crate::bindings::export!(__CaravanRunnerExport with_types_in $crate::bindings);
    };
}

#[cfg(test)]
mod tests {
    use super::host::timeout_millis;
    use std::time::Duration;

    #[test]
    fn a_timeout_is_rounded_up_to_whole_milliseconds() {
        assert_eq!(timeout_millis(Some(Duration::ZERO)), 0);
        assert_eq!(timeout_millis(Some(Duration::from_micros(1))), 1);
        assert_eq!(timeout_millis(Some(Duration::from_micros(1500))), 2);
        assert_eq!(timeout_millis(Some(Duration::from_millis(250))), 250);
        assert_eq!(timeout_millis(Some(Duration::MAX)), u64::MAX);
        assert_eq!(timeout_millis(None), u64::MAX);
    }
}
