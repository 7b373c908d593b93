//! What the host implements for runners: one file per interface, its state beside it (the
//! `caravan:runner/host` import and its event queue, `wasi:logging` and guest output, the
//! WASI context), and the `bindgen!` output they share. It may use `sandbox` (rate limits,
//! the disk ledger); it never starts or ends a run.

pub(in crate::runtime) mod bindings;
pub(in crate::runtime) mod event_queue;
pub(in crate::runtime) mod host_api;
pub(in crate::runtime) mod last_words;
pub(in crate::runtime) mod logging;
pub(in crate::runtime) mod wasi_ctx;
