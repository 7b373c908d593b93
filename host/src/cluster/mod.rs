//! Cluster mode's store: etcd, reached through [`EtcdStore`], under one versioned key prefix.
//!
//! This is the foundation issue 12 builds on, and so far all of it: a connection that always
//! names every member and requires a leader for watches, the schema check an agent is to
//! make before it touches anything, writes that are safe to retry (each guarded by a compare
//! or idempotent), and [`PrefixWatch`], a watch of one key prefix that survives a member's
//! death and a compaction without missing or repeating an event; and [`EtcdServerApi`], the
//! client-server seam on etcd, through which a client core learns its node's allocs and
//! reports their states. Node liveness, the elected scheduler and fencing come next, on top
//! of these; the key layout is in `docs/cluster.md`.
//!
//! This module knows etcd and plain bytes; it knows nothing of allocs, jobs, runners or the
//! embedded server.

pub mod keys;
mod lease;
mod member;
mod node_api;
mod scheduler;
mod scheduler_db;
mod store;
mod watch;

pub use keys::{alloc_key, node_key, status_key};
pub use lease::{Fence, FencedOp, LeaseState};
pub use member::{Member, MemberRecord, MemberView};
pub use node_api::EtcdServerApi;
pub use scheduler::{SchedulerConfig, ServerSlot, lead};
pub use scheduler_db::{EtcdSchedulerDb, Snapshot};
pub use store::{EtcdStore, GuardedPut, KeyValue, StoreError};
pub use watch::{Change, PrefixWatch};

/// Every key Caravan writes starts with this, the schema version in it: a layout change
/// moves to `/caravan/v2/` and leaves the old keys readable.
pub const KEY_PREFIX: &str = "/caravan/v1/";

/// The key naming the newest schema any agent of the cluster has written with.
pub const SCHEMA_KEY: &str = "/caravan/schema";

/// The schema this build reads and writes.
pub const SCHEMA_VERSION: u32 = 1;
