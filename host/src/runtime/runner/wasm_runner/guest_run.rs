//! One run of the alloc's runner: a fresh store for a build, instantiated and called, watched
//! for the disk quota, the wall time and (after an upgrade asked it to end) the kill
//! timeout. The run loop (`restarts`) decides which build runs and what follows.

use super::Checkpoint;
use super::Shared;
use super::upgrade::Build;
use crate::allocrunner::Latch;
use crate::model::structs::Alloc;
use crate::runtime::imports::bindings;
use crate::runtime::imports::event_queue::EventReceiver;
use crate::runtime::runner::outcome::{RunOutcome, describe_failure};
use crate::runtime::sandbox::disk_ledger::{DiskLedger, DiskQuota, QuotaExceeded};
use crate::runtime::{LoadedComponent, StoreData};
use crate::util::units::format_duration;
use std::sync::Arc;
use wasmtime::Store;

/// What one run starts from: the build's component and alloc, the checkpoint, and the latch
/// through which an upgrade asks it to end.
struct GuestRun<'a> {
    component: &'a LoadedComponent,
    alloc: &'a Arc<Alloc>,
    restored: Option<Checkpoint>,
    upgrade_asked: Latch,
}

impl Shared {
    /// One run of `build` in a fresh store, `restored` being the checkpoint it starts from
    /// and `upgrade_asked` how an upgrade asks it to end; returns how it ended and, when the
    /// store was built, the event queue back.
    pub(super) async fn run_guest(
        self: Arc<Self>,
        events: EventReceiver,
        build: &Build,
        restored: Option<Checkpoint>,
        upgrade_asked: Latch,
    ) -> (RunOutcome, Option<EventReceiver>) {
        let alloc = &build.alloc;
        let (disk, over_quota) =
            DiskLedger::new(self.config.alloc_dir.clone(), DiskQuota::of(&self.limits));
        let made = self.new_store(
            &build.component,
            alloc,
            events,
            disk.clone(),
            upgrade_asked.clone(),
        );
        let (mut store, first_look_due) = match made {
            Ok(made) => made,
            Err(error) => {
                let outcome = RunOutcome::Failed(format!("cannot set up the sandbox: {error:#}"));
                return (outcome, None);
            }
        };
        let run = GuestRun {
            component: &build.component,
            alloc,
            restored,
            upgrade_asked,
        };
        let outcome = self
            .run_in_store(&mut store, run, disk, over_quota, first_look_due)
            .await;
        store.data_mut().cpu.run_ended();
        (outcome, Some(store.into_data().host_api.into_events()))
    }

    async fn run_in_store(
        &self,
        store: &mut Store<StoreData>,
        run: GuestRun<'_>,
        disk: Arc<DiskLedger>,
        mut over_quota: QuotaExceeded,
        first_look_due: bool,
    ) -> RunOutcome {
        let GuestRun {
            component,
            alloc,
            restored,
            upgrade_asked,
        } = run;
        // What the directory holds already (a restored or restarted alloc's files) counts
        // from the start. One made now is empty, and one the runner cannot reach it cannot
        // fill: skipping the look spares the start a trip through the blocking pool, which
        // cost more than the rest of the start.
        if first_look_due {
            let looking = disk.clone();
            let _ = tokio::task::spawn_blocking(move || looking.look_now()).await;
        }
        let instantiating = std::time::Instant::now();
        let polls = store.data().cpu.poll_counter();
        let instance = match polls
            .clone()
            .count(component.pre.instantiate_async(&mut *store))
            .await
        {
            Ok(instance) => {
                self.runtime
                    .inner
                    .instantiations
                    .record(instantiating.elapsed());
                instance
            }
            Err(error) => {
                return RunOutcome::Failed(describe_failure(
                    &error,
                    store.data(),
                    "cannot instantiate",
                ));
            }
        };
        let alloc_wit = bindings::alloc_to_wit(alloc);
        let polls = store.data().cpu.poll_counter();
        let call = polls.count(instance.caravan_runner_runner().call_run(
            &mut *store,
            &alloc_wit,
            restored.as_deref(),
        ));
        // The run, unless the alloc dir goes over its quota first (a look finds it over, or
        // the WASI layer refuses a write past it), or the guest outlives the kill timeout
        // after an upgrade asked it to end (the upgrade then goes on from its last
        // checkpoint, as an agent restart would).
        // A runner that imports no `wasi:filesystem` cannot change its directory, so it is not
        // looked at: at 100,000 live allocs, that would be 100,000 directory reads a second.
        let _watch = component
            .imports_filesystem
            .then(|| self.runtime.inner.disk_watcher.watch(disk));
        let upgrade_grace_over = async {
            upgrade_asked.wait().await;
            tokio::time::sleep(self.limits.kill_timeout).await;
        };
        let watched = async {
            let result = tokio::select! {
                over = over_quota.description() => return Err(RunOutcome::Failed(over)),
                () = upgrade_grace_over => return Err(RunOutcome::ShutdownTimedOut),
                result = call => result,
            };
            // A guest whose write was refused may end its run on that error within the same
            // poll: the cause to name is then the quota.
            match over_quota.try_description() {
                Some(over) => Err(RunOutcome::Failed(over)),
                None => Ok(result),
            }
        };
        let watched = match self.limits.wall_time {
            Some(limit) => {
                match tokio::time::timeout_at(self.wall_deadline(limit), watched).await {
                    Ok(watched) => watched,
                    Err(_) => {
                        return RunOutcome::Failed(format!(
                            "wall time limit of {} exceeded",
                            format_duration(limit)
                        ));
                    }
                }
            }
            None => watched.await,
        };
        let result = match watched {
            Ok(result) => result,
            Err(ended) => {
                store.data().logging.flush();
                return ended;
            }
        };
        store.data().logging.flush();
        match result {
            Ok(returned) => RunOutcome::Returned(returned),
            Err(error) => RunOutcome::Failed(describe_failure(&error, store.data(), "wasm trap")),
        }
    }
}
