//! Every import a runner calls, with arbitrary arguments in any order, on one alloc's real
//! import state: no panic, and nothing kept, handed on or logged past the alloc's limits
//! (`caravan_host::testing::drive_host_imports` checks it after every call).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime")
    })
}

fuzz_target!(|input: &[u8]| {
    runtime().block_on(caravan_host::testing::drive_host_imports(input));
});
