//! A bare wasmtime embedding of a runner component, the baseline other benches measure
//! Caravan against: its own `bindgen!`, WASI, and Caravan imports that do nothing
//! (`next-event` answers `kill` at once, `log` drops the line). Included with `#[path]` by
//! the benches that need it, so the others do not compile its bindings.

use std::time::{Duration, Instant};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "alloc-runner",
        imports: { "caravan:runner/host.next-event": async },
        exports: { default: async },
    });
}

pub use bindings::caravan::runner::types;
use bindings::caravan::runner::{host as raw_host, types as raw_types};

/// The bare embedding's store: WASI plus no-op Caravan imports.
pub struct RawData {
    wasi: wasmtime_wasi::WasiCtx,
    table: wasmtime::component::ResourceTable,
    reported: Option<Instant>,
    /// Set for an instance that stays live: `next-event` then never answers, and the first
    /// report is told here.
    parked: Option<tokio::sync::oneshot::Sender<()>>,
    parks: bool,
}

impl RawData {
    fn new() -> RawData {
        RawData {
            wasi: wasmtime_wasi::WasiCtxBuilder::new().build(),
            table: wasmtime::component::ResourceTable::new(),
            reported: None,
            parked: None,
            parks: false,
        }
    }
}

impl wasmtime_wasi::WasiView for RawData {
    fn ctx(&mut self) -> wasmtime_wasi::WasiCtxView<'_> {
        wasmtime_wasi::WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl raw_types::Host for RawData {}

impl raw_host::Host for RawData {
    async fn next_event(&mut self, _timeout_ms: u64) -> Option<raw_types::Event> {
        if self.parks {
            std::future::pending::<()>().await;
        }
        Some(raw_types::Event::Kill)
    }

    fn update_state(&mut self, _state: raw_types::AllocState) -> Result<(), String> {
        self.reported.get_or_insert_with(Instant::now);
        if let Some(parked) = self.parked.take() {
            let _ = parked.send(());
        }
        Ok(())
    }

    fn checkpoint(&mut self, _data: Vec<u8>) -> Result<(), String> {
        Ok(())
    }
}

impl bindings::wasi::logging::logging::Host for RawData {
    fn log(&mut self, _: bindings::wasi::logging::logging::Level, _: String, _: String) {}
}

pub struct Baseline {
    engine: wasmtime::Engine,
    pre: std::sync::Arc<bindings::AllocRunnerPre<RawData>>,
}

impl Baseline {
    pub fn new(engine: &wasmtime::Engine, path: &str) -> Self {
        let mut linker = wasmtime::component::Linker::<RawData>::new(engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).unwrap();
        bindings::AllocRunner::add_to_linker::<_, wasmtime::component::HasSelf<_>>(
            &mut linker,
            |d| d,
        )
        .unwrap();
        let component = wasmtime::component::Component::from_file(engine, path).unwrap();
        let pre =
            bindings::AllocRunnerPre::new(linker.instantiate_pre(&component).unwrap()).unwrap();
        Baseline {
            engine: engine.clone(),
            pre: std::sync::Arc::new(pre),
        }
    }

    /// Instantiate and call `run` until the first `update-state`.
    pub async fn start_once(&self, alloc: &raw_types::Alloc) -> Duration {
        let begun = Instant::now();
        let mut store = wasmtime::Store::new(&self.engine, RawData::new());
        store.set_epoch_deadline(u64::MAX / 2);
        let instance = self.pre.instantiate_async(&mut store).await.unwrap();
        let _ = instance
            .caravan_runner_runner()
            .call_run(&mut store, alloc, None)
            .await
            .unwrap();
        store.data().reported.expect("the guest reported") - begun
    }

    /// Instantiates one on a task of its own and calls `run`, whose first `next-event` never
    /// answers: a live alloc with nothing of Caravan's around it, held until the process
    /// ends. Returns once the guest has reported its first state.
    #[allow(dead_code)] // alloc_start's density baseline; the logs bench includes this file too.
    pub async fn park_one(&self, alloc: raw_types::Alloc) {
        let (parked, reported) = tokio::sync::oneshot::channel();
        let mut data = RawData::new();
        data.parks = true;
        data.parked = Some(parked);
        let (engine, pre) = (self.engine.clone(), self.pre.clone());
        tokio::spawn(async move {
            let mut store = wasmtime::Store::new(&engine, data);
            store.set_epoch_deadline(u64::MAX / 2);
            let instance = pre.instantiate_async(&mut store).await.unwrap();
            let _ = instance
                .caravan_runner_runner()
                .call_run(&mut store, &alloc, None)
                .await;
        });
        reported.await.expect("the parked guest reported");
    }
}
