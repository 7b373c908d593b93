//! Every key cluster mode reads or writes, in one place: the layout (and the reason for each
//! key) is documented in `docs/cluster.md`, and a change to it is a schema change.

use super::KEY_PREFIX;

/// The key of the ACL token whose secret has the SHA-256 `digest` (hex).
pub fn acl_token_key(digest: &str) -> String {
    format!("{KEY_PREFIX}acl/tokens/{digest}")
}

/// The prefix of every ACL token.
pub fn acl_tokens_prefix() -> String {
    format!("{KEY_PREFIX}acl/tokens/")
}

/// The key that says the ACLs were bootstrapped (it holds the first token's accessor id).
pub fn acl_bootstrap_key() -> String {
    format!("{KEY_PREFIX}acl/bootstrapped")
}

/// The key of `alloc_id`'s desired state on `node_id` (written by the scheduler).
pub fn alloc_key(node_id: &str, alloc_id: &str) -> String {
    format!("{KEY_PREFIX}allocs/{node_id}/{alloc_id}")
}

/// The prefix of every alloc placed on `node_id`: what the node watches.
pub fn node_allocs_prefix(node_id: &str) -> String {
    format!("{KEY_PREFIX}allocs/{node_id}/")
}

/// The prefix of every placed alloc.
pub fn allocs_prefix() -> String {
    format!("{KEY_PREFIX}allocs/")
}

/// The key of an alloc waiting for a node (written by the scheduler).
pub fn unplaced_key(alloc_id: &str) -> String {
    format!("{KEY_PREFIX}unplaced/{alloc_id}")
}

/// The prefix of every alloc waiting for a node.
pub fn unplaced_prefix() -> String {
    format!("{KEY_PREFIX}unplaced/")
}

/// The key of `alloc_id`'s client state (written by its node).
pub fn status_key(alloc_id: &str) -> String {
    format!("{KEY_PREFIX}status/{alloc_id}")
}

/// The prefix of every client state.
pub fn status_prefix() -> String {
    format!("{KEY_PREFIX}status/")
}

/// The key of `node_id`'s record (written by the node when it registers).
pub fn node_key(node_id: &str) -> String {
    format!("{KEY_PREFIX}nodes/{node_id}")
}

/// The prefix of every node record.
pub fn nodes_prefix() -> String {
    format!("{KEY_PREFIX}nodes/")
}

/// The key that says `node_id` is alive, held under its agent's lease.
pub fn live_key(node_id: &str) -> String {
    format!("{KEY_PREFIX}live/{node_id}")
}

/// The prefix of every live node.
pub fn live_prefix() -> String {
    format!("{KEY_PREFIX}live/")
}

/// The key of job `job_id` (written by the scheduler).
pub fn job_key(job_id: &str) -> String {
    format!("{KEY_PREFIX}jobs/{job_id}")
}

/// The prefix of every job.
pub fn jobs_prefix() -> String {
    format!("{KEY_PREFIX}jobs/")
}

/// What operators set for nodes (eligibility and drains), one record written by the
/// scheduler: a node's drain outlives its lease and the leader.
pub fn node_schedules_key() -> String {
    format!("{KEY_PREFIX}node_schedules")
}

/// The scheduler's own counters (written by the scheduler).
pub fn scheduler_meta_key() -> String {
    format!("{KEY_PREFIX}scheduler")
}

/// Written with every transaction of the scheduler, which compares its last change: what
/// orders one leadership's transactions (see `FencedWriter`).
pub fn scheduler_sequence_key() -> String {
    format!("{KEY_PREFIX}scheduler_sequence")
}

/// The key whose holder schedules, held under its agent's lease.
pub fn leader_key() -> String {
    format!("{KEY_PREFIX}leader")
}

/// Whether `name` can be a node name: it is a key segment, so no `/`, and it is shown to
/// operators, so printable ASCII of at most 64 bytes.
pub fn valid_node_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!("node name {name:?} must be 1 to 64 characters"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "node name {name:?} may hold only letters, digits, '-', '_' and '.', not {c:?}"
        ));
    }
    Ok(())
}
