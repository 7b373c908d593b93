//! What charging host work to a runner's CPU budget costs each call from wasm to the host.
//!
//! A guest calls an empty host function in a loop, on a store without a call hook (the
//! baseline) and on one whose call hook drives the runtime's own `CpuMeter`, as every alloc's
//! store does. Both in the same run, in alternating rounds; the medians and their ratio are
//! printed. `cargo bench -p caravan-host --bench host_calls` (or `scripts/bench`).

use caravan_host::testing::CpuMeter;
use std::time::{Duration, Instant};
use wasmtime::{Engine, Linker, Module, Store};

mod common;

/// `(module (import "host" "f" (func)) (func (export "run") (param i32) (loop call 0 ...
/// local.get 0 i32.const 1 i32.sub local.tee 0 br_if 0)))`, assembled by hand because this
/// build of wasmtime reads no text format.
const CALL_LOOP: &[u8] = &[
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
    0x01, 0x08, 0x02, 0x60, 0x00, 0x00, 0x60, 0x01, 0x7f, 0x00, // types: () and (i32)
    0x02, 0x0a, 0x01, 0x04, b'h', b'o', b's', b't', 0x01, b'f', 0x00, 0x00, // import host.f
    0x03, 0x02, 0x01, 0x01, // one function of type 1
    0x07, 0x07, 0x01, 0x03, b'r', b'u', b'n', 0x00, 0x01, // export "run"
    0x0a, 0x12, 0x01, 0x10, 0x00, // code: one body of 16 bytes, no locals
    0x03, 0x40, // loop
    0x10, 0x00, // call host.f
    0x20, 0x00, 0x41, 0x01, 0x6b, 0x22, 0x00, // n = n - 1
    0x0d, 0x00, // br_if loop
    0x0b, 0x0b, // end loop, end function
];

const CALLS_PER_ROUND: i32 = 2_000_000;
const ROUNDS: usize = 7;

fn round(engine: &Engine, module: &Module, hooked: bool) -> Duration {
    let meter = CpuMeter::new(Duration::from_secs(3600), 100);
    let mut store = Store::new(engine, meter);
    if hooked {
        store.call_hook(|mut context, hook| context.data_mut().on_call_hook(hook));
    }
    let mut linker = Linker::new(engine);
    linker.func_wrap("host", "f", || {}).unwrap();
    let instance = linker.instantiate(&mut store, module).unwrap();
    let run = instance
        .get_typed_func::<i32, ()>(&mut store, "run")
        .unwrap();
    let started = Instant::now();
    run.call(&mut store, CALLS_PER_ROUND).unwrap();
    started.elapsed()
}

fn main() {
    let engine = Engine::default();
    let module = Module::new(&engine, CALL_LOOP).expect("the call loop compiles");
    let mut plain = Vec::new();
    let mut hooked = Vec::new();
    for _ in 0..ROUNDS {
        plain.push(round(&engine, &module, false));
        hooked.push(round(&engine, &module, true));
    }
    let per_call = |total: Duration| total.as_nanos() as f64 / f64::from(CALLS_PER_ROUND);
    let plain = per_call(common::median(plain));
    let hooked = per_call(common::median(hooked));
    println!("host calls: {CALLS_PER_ROUND} per round, median of {ROUNDS} rounds");
    println!("  no call hook (baseline)        {plain:.1} ns per call");
    println!(
        "  call hook charging host work   {hooked:.1} ns per call  ({:.2}x)",
        hooked / plain
    );
    common::scoreboard(
        "host_calls",
        &format!("{hooked:.1} ns"),
        &format!("{plain:.1} ns"),
        &format!("{:.2}x", hooked / plain),
    );
}
