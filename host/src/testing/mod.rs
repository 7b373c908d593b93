//! Test tools: implementations of the seams that fail or answer on demand, for tests of the
//! failure paths and for simulators that drive a client directly.
//!
//! Built only with the `testing` feature (the crate's own integration tests enable it) and in
//! unit tests; never in the production binary. Nothing in the library outside this module and
//! tests may use it.

mod in_memory_server;
pub mod simulated_etcd;
pub mod simulation;

pub use crate::runtime::imports::import_driver::{ImportDrive, drive_host_imports};
pub use crate::runtime::sandbox::cpu_meter::CpuMeter;
pub use crate::state::FaultyStateDb;
pub use in_memory_server::InMemoryServer;
