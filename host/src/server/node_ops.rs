//! What operators see and set of nodes: each node as it registered with what its allocs
//! hold, its drain and its eligibility, and the tick that moves drains and disconnected
//! allocs on (see [`super::drain`] for the rules, `apply` for their effects). It decides
//! nothing itself.

use super::{EmbeddedServer, RequestError, drain, placement};
use crate::model::node::NodeInfo;
use std::time::Duration;

/// A registered node as an operator sees it.
#[derive(Debug, Clone)]
pub struct NodeDetails {
    /// Its name.
    pub id: String,
    /// What it said of itself.
    pub info: NodeInfo,
    /// What its allocs hold.
    pub used: placement::Usage,
    /// What an operator set for it.
    pub schedule: drain::NodeSchedule,
}

/// A drain as an operator asks for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainRequest {
    /// How long allocs may stay before every one left is moved; `None`: no deadline.
    pub deadline: Option<Duration>,
    /// Nomad's `-ignore-system` (no effect: Caravan has no system jobs).
    pub ignore_system: bool,
}

impl EmbeddedServer {
    /// Registered nodes, with what each said of itself, what its allocs hold, and what an
    /// operator set for it.
    pub fn node_details(&self) -> Vec<NodeDetails> {
        let state = self.lock();
        let placer = placement::Placer::new(&state.nodes, state.allocs.values());
        let usage = placer.usage();
        state
            .nodes
            .iter()
            .map(|(id, info)| NodeDetails {
                id: id.clone(),
                info: info.clone(),
                used: usage.get(id.as_str()).copied().unwrap_or_default(),
                schedule: state.schedules.get(id).cloned().unwrap_or_default(),
            })
            .collect()
    }

    /// Starts (`Some`) or ends (`None`) the drain of registered node `node_id` (see
    /// [`drain`]). Ending one marks the node eligible again unless `keep_ineligible`.
    pub fn set_drain(
        &self,
        node_id: &str,
        drain: Option<DrainRequest>,
        keep_ineligible: bool,
    ) -> Result<drain::NodeSchedule, RequestError> {
        let now = crate::util::timestamp::unix_ms_now();
        self.request(|state, _| {
            if !state.nodes.contains_key(node_id) {
                return Err(RequestError::NodeNotFound(node_id.to_string()));
            }
            let mut schedule = state.schedules.get(node_id).cloned().unwrap_or_default();
            match drain {
                Some(asked) => {
                    schedule.ineligible = true;
                    schedule.drain = Some(drain::Drain {
                        started_unix_ms: now,
                        deadline_unix_ms: asked.deadline.map(|d| {
                            now.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                        }),
                        ignore_system: asked.ignore_system,
                    });
                    tracing::info!(node_id, deadline = ?asked.deadline, "node drain started");
                }
                None => {
                    if schedule.drain.take().is_some() {
                        tracing::info!(node_id, "node drain disabled");
                    }
                    schedule.ineligible = keep_ineligible;
                }
            }
            state.set_schedule(node_id, schedule.clone());
            Ok(schedule)
        })?
    }

    /// Marks registered node `node_id` eligible for new allocs or not; a draining node
    /// cannot be made eligible (409).
    pub fn set_eligibility(
        &self,
        node_id: &str,
        eligible: bool,
    ) -> Result<drain::NodeSchedule, RequestError> {
        self.request(|state, _| {
            if !state.nodes.contains_key(node_id) {
                return Err(RequestError::NodeNotFound(node_id.to_string()));
            }
            let mut schedule = state.schedules.get(node_id).cloned().unwrap_or_default();
            if eligible && schedule.drain.is_some() {
                return Err(RequestError::NodeDraining(node_id.to_string()));
            }
            schedule.ineligible = !eligible;
            state.set_schedule(node_id, schedule.clone());
            Ok(schedule)
        })?
    }

    /// Moves what waits on the clock on: a drain's deadline, an unknown alloc's
    /// `lost_after`. Called every few seconds by whoever runs the server (each change moves
    /// them on too); nothing is done or saved while no node drains and nothing is unknown.
    pub fn tick(&self) -> Result<(), RequestError> {
        {
            let state = self.lock();
            if state.unknown.is_empty() && state.schedules.values().all(|s| s.drain.is_none()) {
                return Ok(());
            }
        }
        self.request(|_, _| ())
    }
}
