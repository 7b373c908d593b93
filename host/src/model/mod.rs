//! The job model: what operators write and what every layer passes around, as plain data
//! with its rules. It knows no wasmtime, no client, no server and no storage, so every layer
//! may use it; it uses only [`crate::util`].
//!
//! # Layout
//! - [`admission`]: the rules a job's allocs must meet on this agent (limits within its
//!   caps and free of contradictions, capabilities offered), applied at submit and at start.
//! - [`structs`]: allocs and their state, jobs' plain parts (an [`structs::Alloc`] is
//!   immutable once built and shared as `Arc<Alloc>`).
//! - [`jobspec`]: job files (TOML) and their JSON form, validated field by field.
//! - [`limits`]: every per-alloc limit, its key, default and cap, and their one parser.
//! - [`capabilities`]: what a job asks beyond its alloc dir and what the agent offers.
//! - [`node`]: what a client node says of itself at registration (capacity, class, meta).
//! - [`constraint`]: `[[job.constraint]]`, which nodes a job's allocs may go to.
//! - [`disconnect`]: `[job.disconnect]`, what allocs become when their node stops answering.
//! - [`restart`]: the restart policy: a crashed runner restarted in place.
//! - [`reschedule`]: the reschedule policy: a failed alloc replaced after a growing delay.

pub mod admission;
pub mod capabilities;
pub mod constraint;
pub mod disconnect;
pub mod jobspec;
pub mod limits;
pub mod node;
pub mod reschedule;
pub mod restart;
pub mod structs;
pub mod written;
