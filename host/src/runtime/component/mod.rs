//! Loading runners: the engine's configuration and its epoch ticker, one compile per build
//! however many ask at once, what a file must be to be loaded as a runner, and compiled
//! components kept on disk. It may use `imports` (the runner export's name) and `sandbox`
//! (the epoch tick); it runs no guest.

pub(in crate::runtime) mod compile_once;
pub(in crate::runtime) mod component_checks;
pub mod disk_cache;
pub(in crate::runtime) mod engine;
pub(in crate::runtime) mod load;
