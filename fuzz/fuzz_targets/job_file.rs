//! A job file as a user writes it, TOML or JSON (the first byte picks): parsed, every
//! problem collected, and never a panic.
#![no_main]

use caravan_host::model::jobspec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((pick, text)) = input.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(text);
    let _ = if pick % 2 == 0 {
        jobspec::parse_toml(&text)
    } else {
        jobspec::parse_json(&text)
    };
});
