//! The runner: [`wasm_runner::WasmAllocRunner`] and its run loop (restarts and upgrades in
//! place), where a runner is in its life, and how a run's end becomes the alloc's final
//! state. It may use every other room of the runtime.

pub(in crate::runtime) mod lifecycle;
pub(in crate::runtime) mod outcome;
pub(in crate::runtime) mod wasm_runner;
