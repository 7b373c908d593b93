//! The factory the client is given: it loads each alloc's runner component through the
//! shared [`Runtime`] and builds its [`WasmAllocRunner`], with what the agent offers and caps.

use super::WasmAllocRunner;
use crate::allocrunner::{AllocRunner, AllocRunnerConfig, AllocRunnerFactory};
use crate::model::admission::Admission;
use crate::runner_store::RunnerStore;
use crate::runtime::Runtime;
use std::sync::Arc;

/// Builds [`WasmAllocRunner`]s, loading each alloc's `runner` component through the shared
/// [`Runtime`] (compiled once per distinct component).
#[derive(Clone)]
pub struct WasmAllocRunnerFactory {
    runtime: Runtime,
    admission: Admission,
    store: Option<RunnerStore>,
}

impl WasmAllocRunnerFactory {
    /// A factory on `runtime` whose allocs get no capability beyond their directory.
    pub fn new(runtime: Runtime) -> Self {
        WasmAllocRunnerFactory {
            runtime,
            admission: Admission::default(),
            store: None,
        }
    }

    /// The same factory loading each alloc's build by the SHA-256 its job names, from
    /// `store` (fetched from another agent when the store lacks it), rather than from the
    /// runner's path: an agent's allocs run the build their job was registered with,
    /// whatever has become of the file since.
    pub fn with_store(self, store: RunnerStore) -> Self {
        WasmAllocRunnerFactory {
            store: Some(store),
            ..self
        }
    }

    /// The same factory admitting allocs as `admission` says (the agent's caps and offer):
    /// a job is checked when it is submitted, but the caps and the offer may have changed
    /// since, and an alloc placed again after a restart must meet today's. An alloc that
    /// does not fails when it starts, naming the key at fault.
    pub fn admitting(self, admission: Admission) -> Self {
        WasmAllocRunnerFactory { admission, ..self }
    }

    /// Builds the runner for one alloc; fails when its component cannot be loaded.
    pub fn build(&self, config: AllocRunnerConfig) -> anyhow::Result<Arc<WasmAllocRunner>> {
        let component = self
            .runtime
            .load_for_alloc(&config.alloc, self.store.as_ref(), false)?;
        crate::allocrunner::record_loaded_build(&config.span, &config.alloc, &component.hash);
        Ok(Arc::new(WasmAllocRunner::new(
            self.runtime.clone(),
            component,
            config,
            self.admission.clone(),
            self.store.clone(),
        )))
    }

    /// This factory as the client's [`AllocRunnerFactory`].
    pub fn into_factory(self) -> AllocRunnerFactory {
        Arc::new(move |config| Ok(self.build(config)? as Arc<dyn AllocRunner>))
    }
}
