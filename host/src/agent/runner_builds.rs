//! The agent's runner store ([`crate::runner_store`]) and what only the agent knows about it:
//! which builds are in use (its server's jobs and allocs, or in cluster mode every job in
//! etcd, and its own node's allocs), so that the collector removes only builds nothing uses.

use crate::client::Client;
use crate::runner_store::{RunnerStore, gc};
use crate::server::EmbeddedServer;
use futures_util::future::BoxFuture;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;

/// Every build a job or an alloc the cluster knows names, or why that cannot be said now
/// (then nothing is collected this round).
pub(super) type ClusterBuilds =
    Arc<dyn Fn() -> BoxFuture<'static, Result<HashSet<String>, String>> + Send + Sync>;

/// The builds the server answering here knows: every job's and every alloc's (an alloc of
/// an older version may run a build its job no longer names).
fn server_builds(server: &EmbeddedServer) -> HashSet<String> {
    let jobs = server
        .jobs()
        .into_iter()
        .filter_map(|j| j.spec.runner_sha256);
    let allocs = server
        .allocs()
        .into_iter()
        .filter_map(|a| a.alloc.runner_sha256.clone());
    jobs.chain(allocs).collect()
}

/// [`server_builds`], off the async workers (a server of 100,000 allocs takes a while).
pub(super) async fn server_builds_off_workers(
    server: Arc<EmbeddedServer>,
) -> Result<HashSet<String>, String> {
    tokio::task::spawn_blocking(move || server_builds(&server))
        .await
        .map_err(|e| e.to_string())
}

/// The builds this node's allocs run or name.
fn node_builds(client: &Client) -> HashSet<String> {
    client
        .alloc_ids()
        .into_iter()
        .filter_map(|id| client.runner(&id))
        .filter_map(|runner| runner.runner_sha256())
        .collect()
}

/// Removes unused builds every while until the task is aborted: a build neither `cluster`
/// nor this node's allocs name, unused for `grace`. Said on a failure to list, and tried
/// again next round.
pub(super) async fn collect_unused_builds(
    store: RunnerStore,
    grace: Duration,
    cluster: ClusterBuilds,
    client: Client,
) {
    let every = (grace / 2).clamp(Duration::from_secs(1), Duration::from_secs(600));
    let mut rounds = tokio::time::interval(every);
    rounds.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    rounds.tick().await;
    loop {
        rounds.tick().await;
        let mut referenced = match cluster().await {
            Ok(builds) => builds,
            Err(why) => {
                tracing::warn!(why = %why, "cannot tell which runner builds jobs use; keeping all");
                continue;
            }
        };
        referenced.extend(node_builds(&client));
        let store = store.clone();
        let collected = tokio::task::spawn_blocking(move || {
            gc::collect_unused(&store, &referenced, grace, SystemTime::now())
        })
        .await;
        if let Ok(Err(error)) = collected {
            tracing::warn!(error = %error, "cannot list the runner store");
        }
    }
}

/// In the single-node mode, the builds are the embedded server's.
pub(super) fn embedded_builds(
    servers: watch::Receiver<Option<Arc<EmbeddedServer>>>,
) -> ClusterBuilds {
    Arc::new(move || {
        let server = servers.borrow().clone();
        Box::pin(async move { server_builds_off_workers(server.ok_or("no server")?).await })
    })
}
