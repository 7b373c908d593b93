//! Capabilities and caps: a runner reaches no network, host directory or environment variable
//! unless its job asks and the agent offers; a job asking for more than the agent offers is
//! refused at submit, and an alloc asking for more, or for limits over the caps, when it
//! starts fails alone. The `hostile`
//! fixture's probes report what they could reach as their description.

use crate::support::*;
use caravan_host::agent::Agent;
use caravan_host::allocrunner::AllocRunner;
use caravan_host::model::admission::Admission;
use caravan_host::model::capabilities::{Capabilities, CapabilityPolicy, VolumeMount};
use caravan_host::model::structs::{Alloc, ClientStatus, LimitCaps, LimitOverrides};
use caravan_host::runtime::WasmAllocRunnerFactory;
use caravan_test_artifacts::FIXTURE_HOSTILE;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;

/// A loopback listener no one else uses, and its address.
fn listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

#[tokio::test]
async fn by_default_a_runner_reaches_no_socket_no_host_directory_and_no_environment() {
    let _logs = LogCapture::start();
    let (listener, addr) = listener();
    let address = addr.to_string();

    let connect = start(hostile_attack("connect", &[("address", &address)]), None);
    let seen = connect.stopped().await;
    assert_eq!(seen.client_status, ClientStatus::Complete);
    assert!(
        seen.description
            .starts_with(&format!("cannot connect to {address}")),
        "{}",
        seen.description
    );
    listener.set_nonblocking(true).unwrap();
    assert!(
        listener.accept().is_err(),
        "nothing may have reached the listener"
    );

    let env = start(hostile_attack("env-probe", &[]), None)
        .stopped()
        .await;
    assert_eq!(
        env.description, "env: []",
        "the agent's environment is not passed on"
    );

    let volume = start(hostile_attack("volume-write", &[("path", "/data")]), None)
        .stopped()
        .await;
    assert!(
        volume.description.starts_with("read \"unreadable:")
            && volume.description.contains("write refused"),
        "{}",
        volume.description
    );
}

#[tokio::test]
async fn only_a_runner_importing_wasi_filesystem_is_given_an_alloc_dir() {
    let _logs = LogCapture::start();
    // The hostile fixture imports `wasi:filesystem`; the sleeper imports nothing of it.
    let blocking = Alloc {
        limits: LimitOverrides {
            kill_timeout: Some(std::time::Duration::from_millis(100)),
            ..LimitOverrides::default()
        },
        ..hostile_attack("block-after-kill", &[])
    };
    let with_files = start(blocking, None);
    let without = start(
        alloc(
            caravan_test_artifacts::SLEEPER,
            &["main"],
            &[("run_for", "1h")],
        ),
        None,
    );
    for started in [&with_files, &without] {
        started
            .recorder
            .wait_for_status(ClientStatus::Running)
            .await;
    }
    assert!(with_files.alloc_dir().is_dir(), "the alloc dir is made");
    // The disk quota's look, once a second, may hold one more for a moment.
    assert!(
        descriptors_open_on(&with_files.alloc_dir()) >= 1,
        "a runner that can name a directory has its alloc dir opened for it"
    );
    assert!(
        !without.alloc_dir().exists(),
        "a runner that cannot is given none: it would stay empty, and making and removing it \
         costs a short alloc more than the rest of its start"
    );
    for started in [&with_files, &without] {
        started.runner.destroy();
        within("the destroy", started.runner.destroyed().wait()).await;
    }
}

#[tokio::test]
async fn an_alloc_asking_for_what_its_agent_does_not_offer_fails_alone_naming_it() {
    let _logs = LogCapture::start();
    // Submit-time checks are the agent's; this alloc reaches the runtime regardless, as one
    // placed before the agent's config changed would.
    let asking = Alloc {
        capabilities: Capabilities {
            network: vec!["127.0.0.1:9".parse().unwrap()],
            ..Capabilities::default()
        },
        ..hostile_attack("connect", &[("address", "127.0.0.1:9")])
    };
    let state = start(asking, None).stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert_eq!(
        state.description,
        "cannot set up the sandbox: job.capabilities.network[0]: 127.0.0.1:9 is not a \
         destination this agent allows (client.capabilities.network)"
    );
    let volume = Alloc {
        capabilities: Capabilities {
            volumes: vec![VolumeMount {
                path: "/data".into(),
                volume: "shared".into(),
            }],
            ..Capabilities::default()
        },
        ..hostile_attack("volume-write", &[])
    };
    let state = start(volume, None).stopped().await;
    assert!(
        state
            .description
            .contains("volume \"shared\" is not offered by this agent"),
        "{}",
        state.description
    );
}

#[tokio::test]
async fn an_alloc_over_limits_lowered_since_its_job_was_submitted_fails_alone_naming_the_cap() {
    let _logs = LogCapture::start();
    let caps = LimitCaps {
        memory_bytes: 32 << 20,
        ..LimitCaps::default()
    };
    let asking = Alloc {
        limits: LimitOverrides {
            memory_bytes: Some(64 << 20),
            ..LimitOverrides::default()
        },
        ..hostile_attack("env-probe", &[])
    };
    let factory = WasmAllocRunnerFactory::new(runtime()).admitting(Admission {
        caps: Some(caps),
        ..Admission::default()
    });
    let state = start_with(factory, asking, None).stopped().await;
    assert_eq!(state.client_status, ClientStatus::Failed);
    assert_eq!(
        state.description,
        "cannot set up the sandbox: job.limits.memory: 64 MiB is over this agent's cap of \
         32 MiB (client.limit_caps.memory)"
    );
}

fn probe_job(id: &str, attack: &str, settings: Value, capabilities: Value) -> String {
    let mut config = settings;
    config["attack"] = json!(attack);
    json!({ "job": {
        "id": id, "type": "batch", "count": 1, "runner": FIXTURE_HOSTILE,
        "tasks": [{ "name": "main", "config": config }],
        "capabilities": capabilities,
    }})
    .to_string()
}

/// Submits `job` and returns the description of its one alloc once it is complete.
async fn run_to_completion(agent: &Agent, id: &str, job: &str) -> String {
    let (status, body) = http(agent.addr, "POST", "/v1/jobs", Some(job), None).await;
    assert_eq!(status, 200, "{body}");
    let path = format!("/v1/job/{id}/allocations");
    let first_alloc = || async {
        let (_, allocs) = http(agent.addr, "GET", &path, None, None).await;
        allocs.get(0).cloned().unwrap_or_default()
    };
    eventually_async(&format!("{id}'s alloc to finish"), || async {
        matches!(
            first_alloc().await["client_status"].as_str(),
            Some("complete" | "failed")
        )
    })
    .await;
    let alloc = first_alloc().await;
    assert_eq!(alloc["client_status"], "complete", "{alloc}");
    alloc["description"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_grants_what_it_offers_and_refuses_more_at_submit() {
    let _logs = LogCapture::start();
    let (listener, addr) = listener();
    let shared = tempfile::tempdir().unwrap();
    std::fs::write(shared.path().join("hello.txt"), "hi").unwrap();
    let offered = CapabilityPolicy::parse(
        &[addr.to_string()],
        &BTreeMap::from([("shared".to_string(), PathBuf::from(shared.path()))]),
    )
    .unwrap();
    let (agent, _dir) = agent(|config| config.capabilities = offered).await;

    // Asking for a destination, a volume or a variable beyond the offer is refused whole.
    let mut other = addr;
    other.set_port(addr.port().wrapping_add(1).max(1));
    for (capabilities, field) in [
        (
            json!({ "network": [other.to_string()] }),
            "job.capabilities.network[0]",
        ),
        (
            json!({ "volumes": { "/data": "secrets" } }),
            "job.capabilities.volumes.\"/data\"",
        ),
        (
            json!({ "env": { "not-portable": "x" } }),
            "job.capabilities.env.\"not-portable\"",
        ),
    ] {
        let job = probe_job("greedy", "env-probe", json!({}), capabilities);
        let (status, body) = http(agent.addr, "POST", "/v1/jobs", Some(&job), None).await;
        assert_eq!(
            (status, body["field"].as_str()),
            (400, Some(field)),
            "{body}"
        );
    }
    let (_, jobs) = http(agent.addr, "GET", "/v1/jobs", None, None).await;
    assert_eq!(jobs, json!([]), "a refused job leaves nothing behind");

    // What is offered and asked for is granted.
    let connect = probe_job(
        "net",
        "connect",
        json!({ "address": addr.to_string() }),
        json!({ "network": [addr.to_string()] }),
    );
    let accepting = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut received = Vec::new();
        stream.read_to_end(&mut received).unwrap();
        received
    });
    let description = run_to_completion(&agent, "net", &connect).await;
    assert_eq!(description, format!("connected to {addr}"));
    assert_eq!(accepting.join().unwrap(), b"ping");

    // A grant is for its destination only: the same runner, granted that one, cannot reach
    // another port of the same host.
    let elsewhere = probe_job(
        "net-elsewhere",
        "connect",
        json!({ "address": other.to_string() }),
        json!({ "network": [addr.to_string()] }),
    );
    let description = run_to_completion(&agent, "net-elsewhere", &elsewhere).await;
    assert!(
        description.starts_with(&format!("cannot connect to {other}")),
        "{description}"
    );

    let env = probe_job(
        "env",
        "env-probe",
        json!({}),
        json!({ "env": { "GREETING": "hello" } }),
    );
    let description = run_to_completion(&agent, "env", &env).await;
    assert_eq!(description, "env: [GREETING=hello]");

    let volume = probe_job(
        "vol",
        "volume-write",
        json!({ "path": "/data" }),
        json!({ "volumes": { "/data": "shared" } }),
    );
    let description = run_to_completion(&agent, "vol", &volume).await;
    assert!(
        description.starts_with("read \"hi\"; write refused"),
        "{description}"
    );
    assert!(
        !shared.path().join("written.txt").exists(),
        "a volume is read-only"
    );
    agent.stop().await;
}

#[tokio::test]
async fn an_agent_offering_its_own_api_to_runners_refuses_to_start() {
    let data_dir = tempfile::tempdir().unwrap();
    let mut config = caravan_host::agent::config::AgentConfig {
        data_dir: data_dir.path().to_path_buf(),
        bind: "127.0.0.1:0".parse().unwrap(),
        ..Default::default()
    };
    config.capabilities = CapabilityPolicy::parse(&["127.0.0.1".into()], &BTreeMap::new()).unwrap();
    let Err(error) = Agent::start(config).await else {
        panic!("the agent must not start");
    };
    assert!(
        error
            .to_string()
            .starts_with("client.capabilities.network[0] lets runners reach this agent's own API"),
        "{error}"
    );
}
