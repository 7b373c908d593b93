//! The cluster as separate hosts: three network namespaces joined by a bridge
//! ([`crate::support::hosts`]), each with its own etcd member, its own agent and its own
//! directory, and nothing shared but the network. The test itself stands for the operator's
//! laptop, outside every host: the runner file exists only there, and is deleted once the job
//! is submitted. A failing test prints what every agent logged.
//!
//! Secured as `docs/cluster.md` says an operator secures a cluster, with certificates made as
//! `caravan tls` makes them: etcd serves clients over TLS only, takes only certificates from
//! the cluster's CA, and lets in the `caravan` user (read and write on `/caravan/`) only; the
//! agents serve HTTPS only, require a certificate of every caller, and reach each other
//! (forwarding, builds by hash, checkpoints) over mutual TLS; the laptop's CLI and the test's
//! own calls present an operator's certificate.

use crate::etcd::EtcdCluster;
use crate::registry::Registry;
use crate::support::hosts::Hosts;
use crate::support::pki::{Identity, Pki};
use crate::support::{
    AgentProcess, assert_succeeded, eventually_async, http_via, live_by_node, run_caravan, running,
    service_job_file,
};
use caravan_host::cli::tls::Role;
use caravan_host::rpc::transport::AgentPool;
use caravan_host::runner_store::sha256_hex;
use caravan_test_artifacts::SLEEPER;
use serde_json::Value;
use std::collections::BTreeSet;

mod scheduling;

/// Nodes' lease TTL: as in the loopback cluster tests.
const NODE_TTL: &str = "4s";

/// The etcd user `caravan`'s password.
const ETCD_PASSWORD: &str = "hosts-s3cret";

/// Three hosts, an etcd member and an agent on each. Fields drop in order: the processes
/// before the namespaces they run in.
struct HostCluster {
    agents: Vec<AgentProcess>,
    _etcd: EtcdCluster,
    /// The etcd members' client URLs, for an agent that joins later.
    endpoints: String,
    /// On a fourth host of its own, when asked for.
    registry: Option<Registry>,
    /// The test's (the laptop's) calls: the CA, an operator's certificate.
    pool: AgentPool,
    /// The cluster's CA and every certificate made from it, and etcd's password file.
    pki: Pki,
    password_file: std::path::PathBuf,
    cli: Identity,
    hosts: Hosts,
}

impl HostCluster {
    /// The cluster, or `None` where namespaces cannot be made (see [`Hosts::make`]).
    async fn start() -> Option<HostCluster> {
        HostCluster::start_with(Layout::default()).await
    }

    /// The cluster as `layout` says: with an OCI registry on a host of its own, which the
    /// agents reach over plain HTTP, and spare hosts for agents that join later.
    async fn start_with(layout: Layout) -> Option<HostCluster> {
        const NODES: usize = 3;
        let with_registry = layout.with_registry;
        let hosts = Hosts::make(NODES + usize::from(with_registry) + layout.spare_hosts)?;
        let registry = match with_registry {
            false => None,
            true => {
                let command = hosts.command(NODES, "/usr/bin/docker-registry");
                Some(Registry::start_with(command, &hosts.addr(NODES).to_string()).await)
            }
        };
        let spots: Vec<_> = (0..NODES)
            .map(|i| (hosts.namespace(i), hosts.addr(i), hosts.dir(i)))
            .collect();
        let pki = Pki::new("hosts");
        let member_ips: Vec<std::net::IpAddr> = spots.iter().map(|s| s.1.into()).collect();
        let member = pki.issue_for_ips(Role::Server, "etcd-member", &member_ips);
        let mut etcd =
            EtcdCluster::start_on_hosts(&spots, &pki.ca, (&member.cert, &member.key)).await;
        etcd.enable_auth("caravan", ETCD_PASSWORD).await;
        let password_file = hosts.dir(0).with_file_name("etcd-password");
        std::fs::write(&password_file, format!("{ETCD_PASSWORD}\n")).unwrap();
        let endpoints = etcd.endpoints().join(",");
        let insecure = registry
            .as_ref()
            .map(|r| format!("insecure_registries = [{:?}]\n", r.host))
            .unwrap_or_default();
        let cli = pki.issue(Role::Cli, "laptop");
        let mut cluster = HostCluster {
            agents: Vec::new(),
            _etcd: etcd,
            endpoints,
            registry,
            pool: pki.pool(Some(&cli)),
            pki,
            password_file,
            cli,
            hosts,
        };
        let client_config = format!("{insecure}{}", layout.client_config);
        for i in 0..NODES {
            cluster.join(i, &client_config);
        }
        eventually_async("three hosts ready", || async {
            cluster.ready_nodes(0).await.len() == 3
        })
        .await;
        Some(cluster)
    }

    /// Starts an agent named `host-N` on host `host` (N is `host` + 1), with
    /// `client_config` in its `[client]` block, joining the cluster: its own certificate
    /// (valid for its host's address), TLS on its API, etcd reached as `caravan`.
    fn join(&mut self, host: usize, client_config: &str) {
        let (name, data_dir) = (
            format!("host-{}", host + 1),
            self.hosts.dir_arg(host, "agent"),
        );
        let args = [
            "--cluster",
            "etcd",
            "--etcd-endpoints",
            &self.endpoints,
            "--node-name",
            &name,
            "--data-dir",
            &data_dir,
        ];
        let certificate = self.pki.issue_for_ips(
            Role::Server,
            &format!("host-{}", host + 1),
            &[self.hosts.addr(host).into()],
        );
        let config = format!(
            "{}{}{}",
            agent_config(client_config),
            self.pki.etcd_keys(&certificate, &self.password_file),
            self.pki.agent_config(&certificate, true)
        );
        let agent = AgentProcess::start_on_host(&self.hosts, host, &args, &config)
            .with_cli_env(self.pki.cli_env(&self.cli));
        self.agents.push(agent);
    }

    async fn get(&self, i: usize, path: &str) -> (u16, Value) {
        http_via(&self.pool, &self.agents[i].addr, "GET", path, None, None).await
    }

    async fn ready_nodes(&self, via: usize) -> BTreeSet<String> {
        crate::support::ready_nodes_via(&self.pool, &self.agents[via].addr).await
    }

    async fn allocs(&self, via: usize, job: &str) -> Vec<Value> {
        let (status, allocs) = self.get(via, &format!("/v1/job/{job}/allocations")).await;
        if status != 200 {
            return Vec::new();
        }
        allocs.as_array().cloned().unwrap_or_default()
    }

    /// Writes a runner and a job of `count` of it on "the laptop" (a directory of no host),
    /// submits it through host `via`'s agent with the CLI, and deletes the runner.
    fn submit_from_outside(&self, via: usize, count: u32) -> String {
        let laptop = tempfile::tempdir().unwrap();
        let runner = laptop.path().join("web.wasm");
        std::fs::copy(SLEEPER, &runner).unwrap();
        let job = service_job_file(laptop.path(), "web", count, "web.wasm");
        let run = self.agents[via].caravan(&["job", "run", "--detach", job.to_str().unwrap()]);
        assert_succeeded(&run);
        std::fs::remove_file(&runner).unwrap();
        sha256_hex(&std::fs::read(SLEEPER).unwrap())
    }
}

/// What a [`HostCluster`] is made of beyond its three hosts.
#[derive(Default)]
struct Layout {
    /// An OCI registry on a host of its own (the fourth).
    with_registry: bool,
    /// Hosts with nothing on them, for agents that [`HostCluster::join`] later.
    spare_hosts: usize,
    /// More of every agent's `[client]` block.
    client_config: &'static str,
}

/// An agent's config: `client` in its `[client]` block, and the cluster's node TTL.
fn agent_config(client: &str) -> String {
    format!("max_live_allocs = 64\n{client}[cluster]\nnode_ttl = \"{NODE_TTL}\"\n")
}

impl Drop for HostCluster {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for (i, agent) in self.agents.iter().enumerate() {
            let lines = agent.unread_lines();
            let tail = lines.len().saturating_sub(80);
            eprintln!(
                "--- host-{} logged (last {} lines):",
                i + 1,
                lines.len() - tail
            );
            for line in &lines[tail..] {
                eprintln!("{line}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_submitted_from_outside_runs_on_every_host_with_its_runner_only_on_the_laptop() {
    let Some(cluster) = HostCluster::start().await else {
        return;
    };
    let sha256 = cluster.submit_from_outside(1, 6);
    let cluster = &cluster;
    eventually_async("six allocs running, on every host", || async move {
        let allocs = cluster.allocs(0, "web").await;
        running(&allocs) == 6 && live_by_node(&allocs).len() == 3
    })
    .await;
    // The upload reached host 2; every other host fetched the build from another agent (the
    // hosts share the machine's files, so this is what proves it travelled).
    for (i, agent) in cluster.agents.iter().enumerate().filter(|(i, _)| *i != 1) {
        agent.wait_for(&format!("host {} fetching the build", i + 1), |line| {
            crate::support::message(line) == "fetched runner build from another agent"
        });
    }
    for i in 0..3 {
        let kept = cluster
            .hosts
            .dir(i)
            .join("agent/runners/sha256")
            .join(&sha256);
        assert!(
            kept.is_file(),
            "host {} keeps the build in its own store",
            i + 1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_cut_off_has_its_allocs_replaced_and_stops_them_when_it_returns() {
    let Some(cluster) = HostCluster::start().await else {
        return;
    };
    cluster.submit_from_outside(0, 6);
    let cluster = &cluster;
    eventually_async("six allocs running, on every host", || async move {
        let allocs = cluster.allocs(0, "web").await;
        running(&allocs) == 6 && live_by_node(&allocs).len() == 3
    })
    .await;
    let held: BTreeSet<String> = cluster
        .allocs(0, "web")
        .await
        .iter()
        .filter(|a| a["node_id"] == "host-3")
        .filter_map(|a| a["id"].as_str().map(str::to_string))
        .collect();
    assert!(!held.is_empty());

    // Host 3's link goes down: the other two see its lease expire, mark its allocs lost and
    // replace them between themselves. It cannot hear of it, and runs on meanwhile.
    cluster.hosts.cut(2);
    let held = &held;
    eventually_async(
        "the cut-off host's allocs lost and replaced",
        || async move {
            let allocs = cluster.allocs(0, "web").await;
            let lost = allocs
                .iter()
                .filter(|a| held.contains(a["id"].as_str().unwrap_or("")))
                .all(|a| a["client_status"] == "lost");
            lost && running(&allocs) == 6 && !live_by_node(&allocs).contains_key("host-3")
        },
    )
    .await;

    // Back on the network, it learns its allocs were replaced and stops them: the cluster
    // settles with six allocs, each running once.
    cluster.hosts.mend(2);
    eventually_async("the returning host stops what it held", || async move {
        let allocs = cluster.allocs(0, "web").await;
        let stopped = allocs
            .iter()
            .filter(|a| held.contains(a["id"].as_str().unwrap_or("")))
            .all(|a| a["client_status"] == "complete");
        stopped && cluster.ready_nodes(0).await.contains("host-3")
    })
    .await;
    let allocs = cluster.allocs(2, "web").await;
    assert_eq!(running(&allocs), 6, "{allocs:#?}");
    assert_eq!(live_by_node(&allocs).values().sum::<usize>(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_host_pulls_a_registry_build_and_a_moved_tag_upgrades_every_alloc_in_place() {
    let layout = Layout {
        with_registry: true,
        ..Layout::default()
    };
    let Some(cluster) = HostCluster::start_with(layout).await else {
        return;
    };
    let registry = cluster.registry.as_ref().unwrap();
    let reference = registry.reference("team/web:1");
    let laptop = tempfile::tempdir().unwrap();
    let push = |component: &std::path::Path| {
        let pushed = run_caravan(
            &[
                "runner",
                "push",
                component.to_str().unwrap(),
                &reference,
                "--insecure",
            ],
            None,
        );
        assert_succeeded(&pushed);
    };
    push(std::path::Path::new(SLEEPER));
    let job = service_job_file(laptop.path(), "web", 3, &reference);
    let submit = || {
        let run = cluster.agents[0].caravan(&["job", "run", "--detach", job.to_str().unwrap()]);
        assert_succeeded(&run);
        String::from_utf8_lossy(&run.stdout).to_string()
    };
    submit();
    let cluster = &cluster;
    eventually_async("one alloc running on each host", || async move {
        let allocs = cluster.allocs(0, "web").await;
        running(&allocs) == 3 && live_by_node(&allocs).len() == 3
    })
    .await;
    // Every host pulled the build from the registry itself (the leader when it checked the
    // job, the others when their alloc was placed): none got it from another agent.
    for agent in &cluster.agents {
        agent.wait_for("the build pulled from the registry", |line| {
            crate::support::message(line) == "pulled runner build from its registry"
        });
    }

    // A new build under the same tag, and the job registered again: upgraded in place.
    let second = crate::live_upgrade::new_build_of(SLEEPER, laptop.path(), "second.wasm");
    push(&second);
    let second_sha256 = sha256_hex(&std::fs::read(&second).unwrap());
    let said = submit();
    assert!(said.contains("3 upgraded in place"), "{said}");
    let second_sha256 = &second_sha256;
    eventually_async("every alloc runs the new build", || async move {
        let allocs = cluster.allocs(0, "web").await;
        let mut upgraded = 0;
        for alloc in allocs.iter().filter(|a| a["client_status"] == "running") {
            let path = format!("/v1/client/allocation/{}", alloc["id"].as_str().unwrap());
            let (_, local) = cluster.get(0, &path).await;
            upgraded += usize::from(local["runner_sha256"] == second_sha256.as_str());
        }
        upgraded == 3
    })
    .await;
}
