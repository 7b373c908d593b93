//! The factory the client is given: it loads each alloc's runner component through the
//! shared [`Runtime`] and builds its [`WasmAllocRunner`], with what the agent offers and caps.

use super::{Admission, WasmAllocRunner};
use crate::allocrunner::{AllocRunner, AllocRunnerConfig, AllocRunnerFactory};
use crate::model::capabilities::CapabilityPolicy;
use crate::model::structs::LimitCaps;
use crate::runtime::Runtime;
use std::path::Path;
use std::sync::Arc;

/// Builds [`WasmAllocRunner`]s, loading each alloc's `runner` component through the shared
/// [`Runtime`] (compiled once per distinct component).
#[derive(Clone)]
pub struct WasmAllocRunnerFactory {
    runtime: Runtime,
    offered: Arc<CapabilityPolicy>,
    caps: Option<LimitCaps>,
}

impl WasmAllocRunnerFactory {
    /// A factory on `runtime` whose allocs get no capability beyond their directory.
    pub fn new(runtime: Runtime) -> Self {
        WasmAllocRunnerFactory {
            runtime,
            offered: Arc::default(),
            caps: None,
        }
    }

    /// The same factory refusing to start an alloc whose limits are over `caps` (the agent's
    /// `[client.limit_caps]`): a job is checked when it is submitted, but the caps may have
    /// been lowered since, and an alloc placed again after a restart must meet today's.
    pub fn capped(self, caps: LimitCaps) -> Self {
        WasmAllocRunnerFactory {
            caps: Some(caps),
            ..self
        }
    }

    /// The same factory granting allocs what they ask of `offered` (the agent's
    /// `[client.capabilities]`). An alloc asking for more fails when it starts, naming what.
    pub fn offering(self, offered: Arc<CapabilityPolicy>) -> Self {
        WasmAllocRunnerFactory { offered, ..self }
    }

    /// Builds the runner for one alloc; fails when its component cannot be loaded.
    pub fn build(&self, config: AllocRunnerConfig) -> anyhow::Result<Arc<WasmAllocRunner>> {
        let component = self.runtime.load_file(Path::new(&config.alloc.runner))?;
        crate::allocrunner::record_loaded_build(&config.span, &config.alloc, &component.hash);
        Ok(Arc::new(WasmAllocRunner::new(
            self.runtime.clone(),
            component,
            config,
            Admission {
                offered: self.offered.clone(),
                caps: self.caps,
            },
        )))
    }

    /// This factory as the client's [`AllocRunnerFactory`].
    pub fn into_factory(self) -> AllocRunnerFactory {
        Arc::new(move |config| Ok(self.build(config)? as Arc<dyn AllocRunner>))
    }
}
