//! Every limit and meter of one alloc's sandbox: memory and instances, the CPU budget, the
//! host descriptors runners hold together,
//! disk quota and its account, the WASI calls that reserve in it, the directory's watcher,
//! rate limits, and the alloc's directory itself. It uses no other room of the runtime.

pub(in crate::runtime) mod alloc_dir;
pub(crate) mod cpu_meter;
pub(crate) mod descriptors;
pub(in crate::runtime) mod disk_ledger;
pub(in crate::runtime) mod disk_usage;
pub(in crate::runtime) mod disk_watch;
pub(crate) mod store_limits;
pub(in crate::runtime) mod token_bucket;
pub(in crate::runtime) mod wasi_quota;
