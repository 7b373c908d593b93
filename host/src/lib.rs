//! The Caravan host: runs WebAssembly alloc runners under a Nomad-style client core.
//!
//! # Layout
//! - [`structs`]: plain data shared by every layer (allocs, alloc state, limits).
//! - [`allocrunner`]: the seam: the [`allocrunner::AllocRunner`] trait, its config and factory,
//!   and the native [`allocrunner::EmptyAllocRunner`].
//! - [`runtime`]: everything wasmtime; [`runtime::WasmAllocRunner`] runs an alloc in its own
//!   sandbox.
//! - [`run`]: `caravan run`, one alloc to completion without an agent.
//! - [`telemetry`]: the process's tracing subscriber (text or JSON).
//! - [`units`]: sizes and durations as operators type them.
//!
//! Arrows of use point one way: `run` -> `runtime` -> `allocrunner` -> `structs`.

pub mod allocrunner;
pub mod run;
pub mod runtime;
pub mod structs;
pub mod telemetry;
pub mod units;
