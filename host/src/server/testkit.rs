//! Plain records for the scheduler's unit tests: jobs and allocs built by hand, no server.
//! Test-only; production code must not use it.

use super::records::{AllocRecord, JobRecord};
use crate::model::capabilities::Capabilities;
use crate::model::jobspec::{JobSpec, JobType};
use crate::model::structs::{Alloc, AllocState, ClientStatus, DesiredStatus, LimitOverrides, Task};
use std::sync::Arc;
use tokio::time::Instant;

/// A job spec of one task running `r.wasm`.
pub fn spec(id: &str, job_type: JobType, count: u32) -> JobSpec {
    JobSpec {
        namespace: "default".into(),
        id: id.into(),
        job_type,
        count,
        runner: "r.wasm".into(),
        runner_sha256: None,
        limits: LimitOverrides::default(),
        tasks: vec![Task::named("main")],
        meta: vec![],
        capabilities: Capabilities::default(),
        reschedule: None,
        restart: None,
        update: Default::default(),
        constraints: Vec::new(),
        placement: Default::default(),
        migrate: Default::default(),
        disconnect: None,
    }
}

/// Nodes named `names` that say nothing of themselves.
pub fn nodes(names: &[&str]) -> crate::server::placement::Nodes {
    names
        .iter()
        .map(|n| (n.to_string(), crate::model::node::NodeInfo::default()))
        .collect()
}

/// A running job at `version`, never stopped, with no restarts used.
pub fn job(spec: JobSpec, version: u64) -> JobRecord {
    JobRecord {
        spec,
        version,
        stopped: false,
        purged: false,
        restarts: 0,
    }
}

/// Alloc `<job_id>-<sequence>` of version 1 of the job, desired to run on `node`, with no
/// state reported yet.
pub fn alloc_on(job_id: &str, sequence: u64, node: Option<&str>) -> AllocRecord {
    let alloc = Alloc::new(
        format!("{job_id}-{sequence}"),
        job_id,
        "r.wasm",
        vec![Task::named("main")],
    );
    AllocRecord {
        alloc: Arc::new(alloc),
        node_id: node.map(str::to_string),
        client_state: None,
        job_version: 1,
        sequence,
        terminal_since: None,
        replaced: false,
        disconnected_unix_ms: None,
        stands_in_for: None,
    }
}

/// `record`, reported by its client with `status` (terminal since `since` when terminal).
pub fn reported(record: AllocRecord, status: ClientStatus, since: Instant) -> AllocRecord {
    AllocRecord {
        client_state: Some(AllocState {
            client_status: status,
            description: String::new(),
            task_states: vec![],
        }),
        terminal_since: status.is_terminal().then_some(since),
        ..record
    }
}

/// `record`, reported complete just now.
pub fn terminal(record: AllocRecord) -> AllocRecord {
    reported(record, ClientStatus::Complete, Instant::now())
}

/// `record`, reported failed just now.
pub fn failed(record: AllocRecord) -> AllocRecord {
    reported(record, ClientStatus::Failed, Instant::now())
}

/// `record`, asked to stop.
pub fn stopping(record: AllocRecord) -> AllocRecord {
    AllocRecord {
        alloc: Arc::new(Alloc {
            desired_status: DesiredStatus::Stop,
            ..Alloc::clone(&record.alloc)
        }),
        ..record
    }
}
