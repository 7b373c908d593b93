//! Runners from OCI registries, against a real registry (the CNCF distribution registry on
//! loopback): `caravan runner push` publishes a component in the Wasm OCI artifact layout, a
//! job names it by tag and runs the digest the tag named when it registered, a tag moved and
//! the job registered again upgrades every alloc in place, and each refusal (no such tag, a
//! registry that wants credentials, one not listed as plain HTTP, a manifest that is not a
//! wasm artifact) is one line that registers nothing.

use crate::live_upgrade::new_build_of;
use crate::registry::Registry;
use crate::support::*;
use caravan_host::runner_store::sha256_hex;
use caravan_test_artifacts::SLEEPER;
use serde_json::{Value, json};

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).to_string()
}

fn push(component: &std::path::Path, reference: &str) -> std::process::Output {
    run_caravan(
        &[
            "runner",
            "push",
            component.to_str().unwrap(),
            reference,
            "--insecure",
        ],
        None,
    )
}

#[tokio::test]
async fn a_pushed_runner_runs_by_its_reference_and_a_moved_tag_upgrades_every_alloc_in_place() {
    let registry = Registry::start().await;
    let reference = registry.reference("team/web:1");
    let pushed = push(std::path::Path::new(SLEEPER), &reference);
    assert_succeeded(&pushed);
    let first = sha256_hex(&std::fs::read(SLEEPER).unwrap());
    assert!(
        String::from_utf8_lossy(&pushed.stdout).contains(&format!("component sha256:{first}")),
        "{}",
        String::from_utf8_lossy(&pushed.stdout)
    );

    let (manifest, config) = artifact(&registry.host, "team/web", "1").await;
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.wasm.config.v0+json"
    );
    assert_eq!(
        manifest["layers"].as_array().unwrap().len(),
        1,
        "{manifest}"
    );
    assert_eq!(manifest["layers"][0]["mediaType"], "application/wasm");
    assert_eq!(manifest["layers"][0]["digest"], format!("sha256:{first}"));
    assert_eq!(
        (&config["architecture"], &config["os"]),
        (&json!("wasm"), &json!("wasip2"))
    );
    assert_eq!(config["layerDigests"], json!([format!("sha256:{first}")]));
    let exports = config["component"]["exports"].to_string();
    assert!(exports.contains("caravan:runner/runner"), "{config}");
    assert!(config["created"].is_string(), "{config}");

    let agent = AgentProcess::start_configured(
        &["--dev"],
        &format!("insecure_registries = [{:?}]\n", registry.host),
    );
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("web.toml");
    std::fs::write(
        &job,
        format!(
            "[job]\nid = \"web\"\ntype = \"service\"\ncount = 2\nrunner = {reference:?}\n\
             [[job.tasks]]\nname = \"web\"\n"
        ),
    )
    .unwrap();
    let run = agent.caravan(&["job", "run", job.to_str().unwrap()]);
    assert_succeeded(&run);
    let (_, view) = http(agent.socket_addr(), "GET", "/v1/job/web", None, None).await;
    assert_eq!(view["runner_sha256"], first.as_str(), "{view}");
    let pinned = view["runner"].as_str().unwrap();
    assert!(
        pinned.starts_with(&format!("{reference}@sha256:")),
        "the tag is pinned to the digest it named: {pinned}"
    );
    let (_, allocs) = http(
        agent.socket_addr(),
        "GET",
        "/v1/job/web/allocations",
        None,
        None,
    )
    .await;
    let ids: Vec<String> = allocs
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_string())
        .collect();

    // A new build under the same tag, and the job registered again: the same allocs, upgraded.
    let second = new_build_of(SLEEPER, dir.path(), "second.wasm");
    let pushed = push(&second, &reference);
    assert_succeeded(&pushed);
    let second_sha256 = sha256_hex(&std::fs::read(&second).unwrap());
    let rerun = agent.caravan(&["job", "run", job.to_str().unwrap()]);
    assert_succeeded(&rerun);
    assert!(
        String::from_utf8_lossy(&rerun.stdout).contains("2 upgraded in place"),
        "{}",
        String::from_utf8_lossy(&rerun.stdout)
    );
    let addr = agent.socket_addr();
    let (ids, second_sha256) = (&ids, &second_sha256);
    eventually_async("both allocs run the new build", || async move {
        let mut upgraded = 0;
        for id in ids {
            let (_, local) = http(
                addr,
                "GET",
                &format!("/v1/client/allocation/{id}"),
                None,
                None,
            )
            .await;
            upgraded += usize::from(local["runner_sha256"] == second_sha256.as_str());
        }
        upgraded == 2
    })
    .await;
    agent.stop();
}

#[tokio::test]
async fn registry_refusals_are_one_line_naming_the_reference_and_register_nothing() {
    let _logs = LogCapture::start();
    let registry = Registry::start().await;
    let guarded = Registry::start_with_password("ci", "s3cret").await;
    let failing = failing_registry().await;
    let listed = vec![registry.host.clone(), guarded.host.clone(), failing.clone()];
    let (agent, _dir) = agent(|config| config.insecure_registries = listed).await;
    let addr = agent.addr;
    let submit = |runner: String| async move {
        let body =
            json!({ "job": { "id": "web", "type": "service", "count": 1, "runner": runner }});
        http(addr, "POST", "/v1/jobs", Some(&body.to_string()), None).await
    };
    let refused = |answer: &Value| answer["error"].as_str().unwrap_or_default().to_string();

    let missing = registry.reference("team/web:nope");
    let (status, answer) = submit(missing.clone()).await;
    assert_eq!(
        (status, &answer["field"]),
        (400, &json!("job.runner")),
        "{answer}"
    );
    assert_eq!(
        refused(&answer),
        format!("job.runner: {missing}: the registry has no such repository, tag or digest (404)")
    );

    let (status, answer) = submit(guarded.reference("team/web:1")).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        refused(&answer).contains("the registry refused access (401)"),
        "{answer}"
    );

    // A registry not listed as plain HTTP is spoken to over HTTPS, which it does not speak.
    let elsewhere = Registry::start().await;
    let (status, answer) = submit(elsewhere.reference("team/web:1")).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        refused(&answer).contains("cannot reach the registry over HTTPS")
            && refused(&answer).contains("must be listed in [client] insecure_registries"),
        "{answer}"
    );

    // A registry that fails (the one fault no real registry shows on demand: a fake one).
    let (status, answer) = submit(format!("oci://{failing}/team/web:1")).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        refused(&answer).contains("the registry answered 500: disk on fire"),
        "{answer}"
    );

    // Something that is not a wasm component artifact: a container image's shape.
    let image = registry.reference("team/image:1");
    push_container_image(&registry.host, "team/image:1").await;
    let (status, answer) = submit(image.clone()).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        refused(&answer).starts_with(&format!(
            "job.runner: {image}: it is not a wasm component artifact: its config is \
             application/vnd.oci.image.config.v1+json"
        )),
        "{answer}"
    );
    let (status, _) = http(agent.addr, "GET", "/v1/job/web", None, None).await;
    assert_eq!(status, 404, "nothing registered");
    let (_, builds) = http(agent.addr, "GET", "/v1/runners", None, None).await;
    assert_eq!(builds, json!([]), "nothing stored");

    // The CLI: credentials from the environment, a file that is not a component, a
    // reference without its registry.
    let denied = push(
        std::path::Path::new(SLEEPER),
        &guarded.reference("team/web:1"),
    );
    assert_eq!(denied.status.code(), Some(2));
    assert!(
        stderr(&denied).contains("the registry refused access (401)"),
        "{}",
        stderr(&denied)
    );
    let mut with_password = caravan_command();
    with_password
        .args([
            "runner",
            "push",
            SLEEPER,
            &guarded.reference("team/web:1"),
            "--insecure",
        ])
        .env("CARAVAN_REGISTRY_HOST", &guarded.host)
        .env("CARAVAN_REGISTRY_USERNAME", "ci")
        .env("CARAVAN_REGISTRY_PASSWORD", "s3cret");
    let pushed = with_password.output().unwrap();
    assert_succeeded(&pushed);
    // Credentials are sent only to the registry they name: named for another, none are sent.
    let mut for_another = caravan_command();
    for_another
        .args([
            "runner",
            "push",
            SLEEPER,
            &guarded.reference("team/web:2"),
            "--insecure",
        ])
        .env("CARAVAN_REGISTRY_HOST", "registry.example:5000")
        .env("CARAVAN_REGISTRY_USERNAME", "ci")
        .env("CARAVAN_REGISTRY_PASSWORD", "s3cret");
    let refused_there = for_another.output().unwrap();
    assert_eq!(refused_there.status.code(), Some(2));
    assert!(
        stderr(&refused_there).contains("the registry refused access (401)"),
        "{}",
        stderr(&refused_there)
    );
    let text = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(text.path(), "not wasm").unwrap();
    let bad = push(text.path(), &registry.reference("team/text:1"));
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("not a WebAssembly component"),
        "{}",
        stderr(&bad)
    );
    let bare = push(std::path::Path::new(SLEEPER), "oci://web:1");
    assert!(
        stderr(&bare).contains("name the registry: oci://HOST[:PORT]/REPOSITORY:TAG"),
        "{}",
        stderr(&bare)
    );
    agent.stop().await;
}

/// A fake registry on loopback that answers every request with 500; its `HOST:PORT`.
async fn failing_registry() -> String {
    let app = axum::Router::new()
        .fallback(|| async { (hyper::StatusCode::INTERNAL_SERVER_ERROR, "disk on fire") });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr.to_string()
}

/// The manifest of `repository:tag` and its config, as any OCI client reads them.
async fn artifact(host: &str, repository: &str, tag: &str) -> (Value, Value) {
    let api = caravan_host::rpc::transport::AgentPool::new()
        .agent(&format!("http://{host}"), None)
        .unwrap();
    let read = |path: String, accept: &'static str| {
        let api = api.clone();
        async move {
            let request = hyper::Request::get(path)
                .header("accept", accept)
                .body(axum::body::Body::empty())
                .unwrap();
            let response = api.relay(request, DEADLINE).await.unwrap();
            assert_eq!(response.status().as_u16(), 200);
            let body = caravan_host::rpc::transport::read_body(response.into_body(), 1 << 20)
                .await
                .unwrap();
            serde_json::from_slice::<Value>(&body).unwrap()
        }
    };
    let manifest = read(
        format!("/v2/{repository}/manifests/{tag}"),
        "application/vnd.oci.image.manifest.v1+json",
    )
    .await;
    let digest = manifest["config"]["digest"].as_str().unwrap().to_string();
    let config = read(format!("/v2/{repository}/blobs/{digest}"), "*/*").await;
    (manifest, config)
}

/// Pushes a manifest shaped as a container image's (an image config, a tar layer) to
/// `host/path`, with the registry's plain HTTP API.
async fn push_container_image(host: &str, path: &str) {
    let (repository, tag) = path.split_once(':').unwrap();
    let api = caravan_host::rpc::transport::AgentPool::new()
        .agent(&format!("http://{host}"), None)
        .unwrap();
    let mut digests = Vec::new();
    for blob in [b"{}".as_slice(), b"a layer".as_slice()] {
        let digest = format!("sha256:{}", sha256_hex(blob));
        // An upload session, then its one chunk with the digest (the registry's API).
        let started = api
            .send(
                hyper::Method::POST,
                &format!("/v2/{repository}/blobs/uploads/"),
                axum::body::Body::empty(),
                DEADLINE,
            )
            .await
            .unwrap();
        assert_eq!(started.status().as_u16(), 202, "upload started");
        let location = started.headers()["location"].to_str().unwrap().to_string();
        let separator = if location.contains('?') { '&' } else { '?' };
        let request = hyper::Request::put(format!("{location}{separator}digest={digest}"))
            .body(axum::body::Body::from(blob.to_vec()))
            .unwrap();
        let finished = api.relay(request, DEADLINE).await.unwrap();
        assert_eq!(finished.status().as_u16(), 201, "upload finished");
        digests.push((digest, blob.len()));
    }
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": digests[0].0, "size": digests[0].1 },
        "layers": [{ "mediaType": "application/vnd.oci.image.layer.v1.tar",
                     "digest": digests[1].0, "size": digests[1].1 }],
    });
    let request = hyper::Request::put(format!("http://{host}/v2/{repository}/manifests/{tag}"))
        .header("content-type", "application/vnd.oci.image.manifest.v1+json")
        .body(axum::body::Body::from(manifest.to_string()))
        .unwrap();
    let response = api.relay(request, DEADLINE).await.unwrap();
    assert_eq!(response.status().as_u16(), 201, "manifest put");
}
