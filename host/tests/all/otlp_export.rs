//! OpenTelemetry export end to end: the real agent, `[telemetry] otlp_endpoint` pointed at
//! a receiver in this test that speaks OTLP/HTTP and decodes each request with the
//! protocol's own protobuf messages. A batch job's registration, its alloc's life (with the
//! guest's own log line as an event, carrying the alloc's attributes) and its collection
//! arrive as spans, and the agent's metrics as gauges.

use crate::support::{AgentProcess, eventually_async, http};
use caravan_test_artifacts::BATCH;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message;
use std::sync::{Arc, Mutex};

/// One span as received: its name, attributes and events' names.
#[derive(Debug, Clone)]
struct ReceivedSpan {
    name: String,
    attributes: Vec<(String, String)>,
    events: Vec<String>,
    service: String,
}

impl ReceivedSpan {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// What the receiver decoded.
#[derive(Debug, Default)]
struct Received {
    spans: Vec<ReceivedSpan>,
    metrics: Vec<String>,
    undecodable: usize,
}

fn text(value: &Option<AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(n)) => n.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn pairs(attributes: &[KeyValue]) -> Vec<(String, String)> {
    attributes
        .iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

/// An OTLP/HTTP receiver on loopback: `/v1/traces` and `/v1/metrics`, protobuf bodies.
async fn receiver() -> (std::net::SocketAddr, Arc<Mutex<Received>>) {
    let received = Arc::new(Mutex::new(Received::default()));
    let traces = received.clone();
    let metrics = received.clone();
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| async move {
                let mut received = traces.lock().unwrap();
                match ExportTraceServiceRequest::decode(body) {
                    Ok(request) => {
                        for resource in request.resource_spans {
                            let service = resource
                                .resource
                                .as_ref()
                                .map(|r| pairs(&r.attributes))
                                .unwrap_or_default()
                                .into_iter()
                                .find(|(k, _)| k == "service.name")
                                .map(|(_, v)| v)
                                .unwrap_or_default();
                            for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                                received.spans.push(ReceivedSpan {
                                    name: span.name,
                                    attributes: pairs(&span.attributes),
                                    events: span.events.into_iter().map(|e| e.name).collect(),
                                    service: service.clone(),
                                });
                            }
                        }
                    }
                    Err(_) => received.undecodable += 1,
                }
                ""
            }),
        )
        .route(
            "/v1/metrics",
            axum::routing::post(move |body: axum::body::Bytes| async move {
                let mut received = metrics.lock().unwrap();
                match ExportMetricsServiceRequest::decode(body) {
                    Ok(request) => received.metrics.extend(
                        request
                            .resource_metrics
                            .into_iter()
                            .flat_map(|r| r.scope_metrics)
                            .flat_map(|s| s.metrics)
                            .map(|m| m.name),
                    ),
                    Err(_) => received.undecodable += 1,
                }
                ""
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocs_life_and_the_agents_metrics_reach_an_otlp_collector() {
    let (collector, received) = receiver().await;
    let config = format!(
        "[telemetry]\ncollection_interval = \"200ms\"\notlp_endpoint = \"http://{collector}\"\n"
    );
    let agent = AgentProcess::start_configured(&["--dev"], &config);
    let job = serde_json::json!({ "job": {
        "id": "squares", "type": "batch", "count": 1, "runner": BATCH,
    }})
    .to_string();
    let (status, answer) = http(agent.socket_addr(), "POST", "/v1/jobs", Some(&job), None).await;
    assert_eq!(status, 200, "{answer}");
    let alloc_id = answer["placed"][0].as_str().unwrap().to_string();
    eventually_async("the batch alloc complete", || async {
        let path = format!("/v1/allocation/{alloc_id}");
        http(agent.socket_addr(), "GET", &path, None, None).await.1["client_status"] == "complete"
    })
    .await;
    // Collected by its node, then forgotten by the server: its runner goes, and its span
    // ends.
    let (status, _) = http(agent.socket_addr(), "POST", "/v1/client/gc", None, None).await;
    assert_eq!(status, 200);
    let (status, _) = http(agent.socket_addr(), "PUT", "/v1/system/gc", None, None).await;
    assert_eq!(status, 200);

    let span_of = |name: &str| {
        let received = received.lock().unwrap();
        received
            .spans
            .iter()
            .find(|s| s.name == name && s.attribute("alloc_id").is_none_or(|a| a == alloc_id))
            .cloned()
    };
    let arrived = tokio::time::timeout(crate::support::DEADLINE, async {
        while span_of("alloc").is_none() || span_of("alloc.gc").is_none() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    if arrived.is_err() {
        let spans: Vec<String> = received
            .lock()
            .unwrap()
            .spans
            .iter()
            .map(|s| format!("{} {:?}", s.name, s.attributes))
            .collect();
        panic!(
            "the alloc's spans never reached the collector; it received {spans:#?}\nthe agent logged {:#?}",
            agent.unread_lines()
        );
    }
    let alloc = span_of("alloc").unwrap();
    assert_eq!(
        alloc.attribute("alloc_id"),
        Some(alloc_id.as_str()),
        "{alloc:?}"
    );
    assert_eq!(alloc.attribute("job"), Some("squares"), "{alloc:?}");
    assert_eq!(alloc.service, "caravan");
    assert!(
        alloc
            .events
            .iter()
            .any(|e| e.contains("computed the sum of squares of 1..1000")),
        "the guest's own line is an event of its alloc's span: {:?}",
        alloc.events
    );
    let registered = span_of("job.register").expect("the job's registration as a span");
    assert_eq!(registered.attribute("job_id"), Some("squares"));
    assert!(
        registered.events.iter().any(|e| e == "job registered"),
        "{registered:?}"
    );
    eventually_async("the agent's metrics at the collector", || async {
        let received = received.lock().unwrap();
        received
            .metrics
            .iter()
            .any(|m| m == "caravan_runner_descriptors_held")
    })
    .await;
    assert_eq!(received.lock().unwrap().undecodable, 0);
    agent.stop();
}

#[test]
fn an_otlp_endpoint_that_is_not_an_http_url_is_refused_naming_the_key() {
    let (code, stderr) = crate::support::agent_refusing_to_start(
        &["--dev"],
        "[telemetry]\notlp_endpoint = \"collector:4317\"\n",
    );
    assert_ne!(code, Some(0));
    assert!(
        stderr.contains("telemetry.otlp_endpoint") && stderr.contains("http://"),
        "{stderr}"
    );
}
