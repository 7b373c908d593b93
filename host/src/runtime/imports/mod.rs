//! What the host implements for runners: one file per interface, its state beside it (the
//! `caravan:runner/host` import and its event queue, `wasi:logging` and guest output, the
//! WASI context), and the `bindgen!` output they share. It may use `sandbox` (rate limits,
//! the disk ledger); it never starts or ends a run.

pub(in crate::runtime) mod bindings;
pub(in crate::runtime) mod event_queue;
pub(in crate::runtime) mod host_api;
#[cfg(any(test, feature = "testing"))]
pub(crate) mod import_driver;
pub(in crate::runtime) mod last_words;
pub(in crate::runtime) mod logging;
pub(in crate::runtime) mod wasi_ctx;

use crate::runtime::StoreData;
use wasmtime::component::Linker;

/// Links every import the host implements for runners: WASI p2 (wasmtime-wasi's), the
/// `caravan:runner/host` import and `wasi:logging`, each projected to its own part of the
/// store. A new import is a file here, its field in the store, and a line in this function.
pub(in crate::runtime) fn add_to_linker(linker: &mut Linker<StoreData>) -> anyhow::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker).map_err(anyhow::Error::from)?;
    bindings::add_host_to_linker::<_, HostApiData>(linker, |data| &mut data.host_api)
        .map_err(anyhow::Error::from)?;
    bindings::add_logging_to_linker::<_, LoggingData>(linker, |data| &mut data.logging)
        .map_err(anyhow::Error::from)?;
    Ok(())
}

/// Projects the store to the `caravan:runner/host` import.
struct HostApiData;
impl wasmtime::component::HasData for HostApiData {
    type Data<'a> = &'a mut host_api::HostApi;
}

/// Projects the store to the `wasi:logging` import.
struct LoggingData;
impl wasmtime::component::HasData for LoggingData {
    type Data<'a> = &'a mut logging::GuestLogging;
}
