//! Paths of the runner components in `guests/`, built for `wasm32-wasip2` by this crate's
//! build script. Test-only: the host depends on it as a dev-dependency.

include!(concat!(env!("OUT_DIR"), "/guests.rs"));
