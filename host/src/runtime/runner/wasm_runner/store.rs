//! One run's store: the alloc's sandbox (its directory, WASI context, host API, logging,
//! memory and CPU meters), built fresh for each run of the alloc's runner.

use super::Shared;
use crate::allocrunner::Latch;
use crate::model::structs::Alloc;
use crate::runtime::imports::event_queue::EventReceiver;
use crate::runtime::imports::host_api::{EndingLatches, HostApi};
use crate::runtime::imports::logging::{GuestLogSink, GuestLogging, LogLimits};
use crate::runtime::imports::wasi_ctx::{Directories, sandbox_wasi};
use crate::runtime::sandbox::alloc_dir::create_alloc_dir;
use crate::runtime::sandbox::cpu_meter::CpuMeter;
use crate::runtime::sandbox::descriptors::HeldDescriptors;
use crate::runtime::sandbox::disk_ledger::DiskLedger;
use crate::runtime::sandbox::store_limits::MemoryLimiter;
use crate::runtime::{LoadedComponent, StoreData};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use wasmtime::Store;
use wasmtime::component::ResourceTable;

impl Shared {
    /// The alloc's sandbox for `component`, with its directory made if it was not there and
    /// the runner can reach files: returns the store and whether the disk quota's first look
    /// is due (a directory it can reach that was there before, holding what it holds).
    pub(super) fn new_store(
        &self,
        component: &LoadedComponent,
        alloc: &Arc<Alloc>,
        events: EventReceiver,
        disk: Arc<DiskLedger>,
        upgrade_asked: Latch,
    ) -> anyhow::Result<(Store<StoreData>, bool)> {
        let ending = EndingLatches {
            upgrade_asked,
            kill_sent: self.kill_sent.latch(),
        };
        // Admitted again here, by the rules the job was submitted under: the agent's offer and
        // caps may have changed since.
        let grants = self
            .admission
            .admit(&alloc.limits, &self.limits, &alloc.capabilities)?;
        let alloc_dir = &self.config.alloc_dir;
        let directories = if component.imports_filesystem {
            Directories::Open
        } else {
            Directories::Unreachable
        };
        let first_look_due = match directories {
            Directories::Open => {
                // Read by destroy, which waits for the runner to stop: no store is made after.
                self.alloc_dir_may_exist.store(true, Ordering::SeqCst);
                !create_alloc_dir(alloc_dir)?
            }
            // Nor is a runner that cannot reach files given a directory: it would stay empty,
            // and making and removing it was most of a short alloc's cost on disk.
            Directories::Unreachable => false,
        };
        let sink = GuestLogSink::new(
            self.config.span.clone(),
            LogLimits::of(&self.limits),
            self.config.log_writer.clone(),
        );
        let wasi = sandbox_wasi(alloc_dir, directories, &grants, &sink)?;
        let data = StoreData {
            wasi,
            table: ResourceTable::new(),
            host_api: HostApi::new(
                alloc.clone(),
                events,
                self.queued_task_actions.clone(),
                self.state.clone(),
                self.config.span.clone(),
                &self.limits,
                ending,
            ),
            logging: GuestLogging::new(sink),
            memory: MemoryLimiter::new(self.limits.memory_bytes).reporting_to(self.usage.clone()),
            cpu: CpuMeter::new(self.limits.cpu, self.limits.cpu_share)
                .charged_already(self.usage.snapshot().cpu_used)
                .reporting_to(self.usage.clone()),
            limits: self.limits.clone(),
            disk,
            descriptors: HeldDescriptors::of(self.runtime.inner.descriptors.clone()),
        };
        let mut store = Store::new(&self.runtime.inner.engine, data);
        crate::runtime::sandbox::install(&mut store, &self.limits);
        Ok((store, first_look_due))
    }
}
