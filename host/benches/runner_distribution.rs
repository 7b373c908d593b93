//! How long a 12 MiB runner (the JavaScript sleeper) takes to reach 100 nodes: fetched by
//! hash from an agent (peer fetch, as every node of a cluster does from the leader), and
//! pulled from an OCI registry (Debian's docker-registry on loopback); and the compile
//! cache's share of a node's time to be ready to start it.
//!
//! Run: `cargo bench -p caravan-host --bench runner_distribution` (see `scripts/bench`).
//! Options after `--`: `--nodes N` (default 100), `--rounds R` (default 5; the median is
//! reported).
//!
//! Each round gives every node a fresh runner store of its own (its own directory, as a
//! machine's) and has all of them ask for the build at once, as the nodes of a job of N
//! allocs placed over N machines do: by peer fetch from one real `caravan agent` that has it
//! (over HTTP on loopback, each store with its own connection pool), then from the registry
//! (each pulling the manifest, then the blob). Bytes are hashed as they arrive, as in the
//! agent. The baseline of the same run is what a shared path cost before runners travelled:
//! each node copying the file from a local disk. Loopback has no network between the nodes,
//! so this measures the agent's and the registry's serving and the stores' checking, not a
//! wire. After fetching, a node compiles the build (once per machine) or reads the machine
//! code from its disk cache: both are measured once, and their share of a node's time to be
//! ready is printed.

#[path = "../tests/all/etcd.rs"]
#[allow(dead_code)]
mod etcd;
#[path = "../tests/all/registry.rs"]
#[allow(dead_code)]
mod registry;

mod common;

use caravan_host::runner_store::{RunnerStore, fixed_peers, oci::Registries, sha256_hex};
use caravan_host::runtime::{Runtime, RuntimeConfig};
use common::{count_arg, median, spawn_agent};
use std::time::{Duration, Instant};

const JS_RUNNER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../target/guests/js/sleeper.wasm"
);

fn main() {
    let nodes = count_arg("--nodes", 100);
    let rounds = count_arg("--rounds", 5);
    let bytes = std::fs::read(JS_RUNNER)
        .unwrap_or_else(|e| panic!("{JS_RUNNER}: {e}; run guests/js/build (./run-tests does)"));
    let sha256 = sha256_hex(&bytes);
    let mib = bytes.len() as f64 / f64::from(1 << 20);
    let work = tempfile::tempdir().unwrap();

    // The agent that has the build: its store filled before it starts.
    let agent_dir = work.path().join("agent");
    RunnerStore::open(&agent_dir)
        .unwrap()
        .put_file(std::path::Path::new(JS_RUNNER))
        .unwrap();
    let config = work.path().join("agent.toml");
    std::fs::write(&config, "").unwrap();
    let agent = spawn_agent(&agent_dir, &config, &[]);
    let agent_url = format!("http://{}", agent.addr);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (peer, pull, copy) = runtime.block_on(async {
        let registry = registry::Registry::start().await;
        let reference = registry.reference("bench/js-sleeper:1");
        let registries = Registries::new(vec![registry.host.clone()]);
        let pushed = registries.push(bytes.clone(), &reference).await.unwrap();
        assert_eq!(pushed.sha256, sha256);
        let pinned = registries.resolve(&reference).await.unwrap().pinned;

        let (mut peer, mut pull, mut copy) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let dir = work.path().join(format!("round-{round}"));
            peer.push(reach_all(&dir.join("peer"), nodes, &sha256, None, Some(&agent_url)).await);
            pull.push(reach_all(&dir.join("pull"), nodes, &sha256, Some(&pinned), None).await);
            copy.push(copy_to_all(&dir.join("copy"), nodes));
            let _ = std::fs::remove_dir_all(&dir);
        }
        (median(peer), median(pull), median(copy))
    });
    agent.stop();

    // A node's time to be ready once it has the bytes: a compile, or its disk cache's copy.
    let cache = work.path().join("compile-cache");
    let compile = load_once(&bytes, &cache);
    let from_cache = load_once(&bytes, &cache);
    // Every node waits for the whole fetch (they all fetch at once), then compiles.
    let share = |load: Duration| 100.0 * load.as_secs_f64() / (peer + load).as_secs_f64();
    println!(
        "runner_distribution: a {mib:.1} MiB runner to {nodes} nodes at once (median of \
         {rounds}): peer fetch {peer:.2?}, registry pull {pull:.2?}, local copy (baseline) \
         {copy:.2?}; ratios {:.2}x and {:.2}x the copy. Then per node: compile {compile:.2?}, \
         or {from_cache:.2?} from the compile cache: {:.0}% of a node's time to be ready \
         after a peer fetch is compiling, {:.0}% with the cache",
        peer.as_secs_f64() / copy.as_secs_f64(),
        pull.as_secs_f64() / copy.as_secs_f64(),
        share(compile),
        share(from_cache),
    );
    common::scoreboard(
        "runner_distribution",
        &format!(
            "{mib:.1} MiB runner to {nodes} nodes: peer fetch {peer:.2?}, registry pull {pull:.2?}; \
             then compile {compile:.2?} per node ({:.0}% of its time to ready), {from_cache:.2?} \
             from its cache ({:.0}%)",
            share(compile),
            share(from_cache)
        ),
        &format!("{copy:.2?} copying the file to {nodes} dirs"),
        &format!(
            "{:.2}x (peer), {:.2}x (registry)",
            peer.as_secs_f64() / copy.as_secs_f64(),
            pull.as_secs_f64() / copy.as_secs_f64()
        ),
    );
}

/// Gives `nodes` fresh stores under `dir` the build at once, each from `registry` (a pinned
/// reference) or from the agent at `peer`; returns how long until the last has it.
async fn reach_all(
    dir: &std::path::Path,
    nodes: usize,
    sha256: &str,
    registry: Option<&str>,
    peer: Option<&str>,
) -> Duration {
    let registries = Registries::new(
        registry
            .map(|r| {
                let host = r.trim_start_matches("oci://").split('/').next().unwrap();
                vec![host.to_string()]
            })
            .unwrap_or_default(),
    );
    let stores: Vec<RunnerStore> = (0..nodes)
        .map(|n| {
            let store = RunnerStore::open(&dir.join(format!("node-{n}")))
                .unwrap()
                .with_registries(registries.clone());
            if let Some(peer) = peer {
                store.fetch_from(
                    fixed_peers(vec![peer.to_string()]),
                    None,
                    caravan_host::rpc::transport::AgentPool::new(),
                );
            }
            store
        })
        .collect();
    let started = Instant::now();
    let fetches = stores.iter().map(|store| async move {
        store
            .get_or_fetch(sha256, registry)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    });
    futures_util::future::join_all(fetches).await;
    started.elapsed()
}

/// Copies the runner into `nodes` directories under `dir`: what a node reading its own copy
/// of a shared path costs.
fn copy_to_all(dir: &std::path::Path, nodes: usize) -> Duration {
    let started = Instant::now();
    for n in 0..nodes {
        let node = dir.join(format!("node-{n}"));
        std::fs::create_dir_all(&node).unwrap();
        std::fs::copy(JS_RUNNER, node.join("sleeper.wasm")).unwrap();
    }
    started.elapsed()
}

/// Loads the component in a new runtime whose compile cache is `cache`: a compile the first
/// time, a read of the cached machine code after.
fn load_once(bytes: &[u8], cache: &std::path::Path) -> Duration {
    let runtime = Runtime::new(&RuntimeConfig {
        cache_dir: Some(cache.to_path_buf()),
        max_live_allocs: 16,
        ..RuntimeConfig::default()
    })
    .unwrap();
    let started = Instant::now();
    runtime
        .load_bytes(std::path::Path::new("sleeper.wasm"), bytes)
        .unwrap();
    started.elapsed()
}
