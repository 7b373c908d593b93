//! Cluster mode: many agents, one cluster whose state lives in etcd (`docs/cluster.md` has the
//! design and the key layout).
//!
//! Layout, from the bottom up:
//! - [`backend::EtcdBackend`] (`backend`): the etcd calls cluster mode makes, as a trait;
//!   `grpc` is etcd itself, the simulation has its own in memory.
//! - [`EtcdStore`] (`store`): the connection, with every member named and watches requiring
//!   a leader; reads and compare-guarded writes retried; the schema check an agent makes
//!   before it touches anything. `listing`: a prefix in pages, and a cluster's ranges at
//!   once, at one revision. `lease`: leases, and writes fenced by a held key.
//! - [`PrefixWatch`] (`watch`): a watch of one prefix that survives a member's death and a
//!   compaction without missing or repeating a change.
//! - [`keys`]: every key, in one place.
//! - [`EtcdTokens`] (`acl_tokens`): the cluster's ACL tokens, read and written by any agent.
//! - `history`: the leader's compaction of etcd's history ([`Compactor`]), and what etcd
//!   says of its space and alarms ([`EtcdSpace`]).
//! - [`Member`] (`member`): an agent's lease, its node's live key, and its campaign for the
//!   leader key.
//! - [`EtcdServerApi`] (`node_api`): the client-server seam on etcd, for a node's client.
//! - [`lead`] (`scheduler`) and [`EtcdSchedulerDb`] (`scheduler_db`): what the leader runs,
//!   the embedded server opened on a fenced etcd store, fed node liveness and client states.
//!
//! It knows the embedded server's records and the seam; it must not know the client core,
//! runners or HTTP (the agent wires those to it).

mod access;
mod acl_tokens;
pub mod backend;
mod grpc;
mod history;
pub mod keys;
mod lease;
mod listing;
mod member;
mod node_api;
mod scheduler;
mod scheduler_db;
mod store;
mod watch;

pub use access::{EtcdAccess, EtcdTls};
pub use acl_tokens::EtcdTokens;
pub use history::{
    Compactor, DEFAULT_COMPACT_INTERVAL, EtcdAlarm, EtcdHealth, EtcdSpace, HistoryStats,
    SPACE_PROBE_INTERVAL, SpaceProbe, compact_every, watch_space,
};
pub use keys::{alloc_key, node_key, status_key};
pub use lease::{Fence, FencedOp, FencedWriter, LeaseRenewer, LeaseState};
pub use member::{LiveMember, Member, MemberRecord, MemberView, live_members, live_records};
pub use node_api::EtcdServerApi;
pub use scheduler::{SchedulerConfig, ServerSlot, lead, schedule_while_leading};
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
