//! The agent's file descriptor limit: raised to the most the system allows, once, at start.
//!
//! Every file a guest opens through WASI is a host descriptor, and so is every connection to
//! the API, every log file and the state DB. Linux's default soft limit (1,024) is far under
//! what a node with many allocs needs, and the hard limit is there to be used: servers such as
//! nginx, etcd and Nomad raise their soft limit to it. Touches only this process's limit.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// Raises the soft open-file limit to the hard one and says so; returns the limit in force.
pub fn raise_open_files_limit() -> Option<u64> {
    let limit = getrlimit(Resource::Nofile);
    let (Some(soft), hard) = (limit.current, limit.maximum) else {
        return None; // Unlimited already.
    };
    let Some(hard) = hard else {
        // No ceiling: pick a generous one rather than ask for infinity, which Linux refuses.
        return raise_to(soft, 1 << 20);
    };
    if soft >= hard {
        return Some(soft);
    }
    raise_to(soft, hard)
}

/// Descriptors kept for the agent itself: the API's connections, the state DB, etcd's
/// connections; each live alloc's log file comes on top.
const AGENT_RESERVE: u64 = 1024;

/// The descriptors runners may hold together on an agent whose limit is `limit`: what the
/// limit leaves after the agent's reserve and two per live alloc (its log file, and its
/// directory held open for its sandbox), and never less than half the limit (`None`: no
/// limit, no budget). Warns only when the configuration can really run out: when the log files
/// alone could take the agent's descriptors, or when the budget would not let one alloc
/// open as many files as it may (`one_alloc_may_hold`). Runners are held to this budget
/// (`runtime::sandbox::descriptors`), so they cannot take the agent's own descriptors
/// however many run.
pub fn runner_budget(
    limit: Option<u64>,
    max_live_allocs: u32,
    one_alloc_may_hold: u64,
) -> Option<u64> {
    let limit = limit?;
    let agent_needs = AGENT_RESERVE.saturating_add(2 * u64::from(max_live_allocs));
    let budget = limit.saturating_sub(agent_needs).max(limit / 2);
    if budget < one_alloc_may_hold || agent_needs > limit - budget {
        tracing::warn!(
            limit,
            max_live_allocs,
            runners_may_hold = budget,
            one_alloc_may_hold,
            "this agent may open too few file descriptors: its live allocs' log files and \
             one alloc's open files may not all fit; raise the hard limit (ulimit -Hn), or \
             lower client.max_live_allocs or client.limit_caps.open_files"
        );
    } else {
        tracing::debug!(
            limit,
            runners_may_hold = budget,
            "runners share a descriptor budget"
        );
    }
    Some(budget)
}

/// Warns when `max_live_allocs`, each holding up to `handles_per_alloc` descriptors, could
/// take more than `limit` leaves after the agent's own reserve: a node configured so can run
/// out of descriptors with every alloc within its own limit. Returns whether it warned.
pub fn warn_if_allocs_can_exhaust(
    limit: Option<u64>,
    max_live_allocs: u32,
    handles_per_alloc: u64,
) -> bool {
    let Some(limit) = limit else {
        return false;
    };
    let allocs_may_hold = u64::from(max_live_allocs).saturating_mul(handles_per_alloc);
    if allocs_may_hold.saturating_add(AGENT_RESERVE) <= limit {
        return false;
    }
    tracing::warn!(
        limit,
        max_live_allocs,
        handles_per_alloc,
        "live allocs together may hold more file descriptors than this agent may open; \
         raise the hard limit (ulimit -Hn), or lower client.max_live_allocs or \
         client.limit_caps.open_files"
    );
    true
}

fn raise_to(soft: u64, target: u64) -> Option<u64> {
    let current = getrlimit(Resource::Nofile);
    let raised = Rlimit {
        current: Some(target),
        maximum: current.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            tracing::info!(
                from = soft,
                to = target,
                "raised the open file descriptor limit"
            );
            Some(target)
        }
        Err(error) => {
            tracing::warn!(
                limit = soft,
                error = %error,
                "cannot raise the open file descriptor limit; allocs and the API share {soft} descriptors"
            );
            Some(soft)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runners_get_what_the_agent_and_its_log_files_leave() {
        assert_eq!(runner_budget(Some(20_000), 1_000, 1_024), Some(16_976));
        // Never less than half: a small limit is shared, and warned about.
        assert_eq!(runner_budget(Some(1_024), 1_000, 1_024), Some(512));
        assert_eq!(runner_budget(None, 1_000, 1_024), None);
    }

    #[test]
    fn a_node_whose_allocs_could_take_every_descriptor_is_warned_about() {
        assert!(!warn_if_allocs_can_exhaust(Some(1 << 20), 1000, 1024));
        assert!(warn_if_allocs_can_exhaust(Some(65_536), 1000, 1024));
        assert!(!warn_if_allocs_can_exhaust(None, u32::MAX, 1024));
    }

    #[test]
    fn the_soft_limit_ends_at_the_hard_limit() {
        let raised = raise_open_files_limit();
        let limit = getrlimit(Resource::Nofile);
        assert_eq!(raised, limit.current);
        if let (Some(soft), Some(hard)) = (limit.current, limit.maximum) {
            assert_eq!(soft, hard);
        }
    }
}
