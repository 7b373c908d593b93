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

use crate::model::structs::Limits;
use crate::runtime::StoreData;
use wasmtime::Store;
use wasmtime::component::Linker;

/// Shadows the WASI calls a sandbox meters (the disk quota and the descriptor budget, at
/// the write and the open: `wasi_quota`); call after `imports::add_to_linker`.
pub(in crate::runtime) fn add_to_linker(linker: &mut Linker<StoreData>) -> anyhow::Result<()> {
    wasi_quota::add_to_linker(linker).map_err(anyhow::Error::from)
}

/// Installs every limit and meter of a new store, in one place: the bytes one host call may
/// carry, the handles the guest may hold, the memory limiter, the epoch callback and the
/// call hook of the CPU meter, and the first epoch deadline. A new store-level concern is
/// its file here, its part of the store, and a line in this function.
pub(in crate::runtime) fn install(store: &mut Store<StoreData>, limits: &Limits) {
    store.set_hostcall_fuel(crate::model::limits::as_len(limits.hostcall_bytes));
    store.set_max_component_handles(limits.open_files as usize);
    store.limiter(|data| &mut data.memory);
    store.epoch_deadline_callback(|mut context| context.data_mut().cpu.on_epoch_deadline());
    // Calls to the host's imports are timed for the CPU budget (see `cpu_meter`).
    store.call_hook(|mut context, hook| context.data_mut().cpu.on_call_hook(hook));
    store.set_epoch_deadline(1);
}
