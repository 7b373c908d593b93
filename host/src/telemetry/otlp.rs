//! OpenTelemetry export (`[telemetry] otlp_endpoint`): the agent's spans and its metrics
//! sent to a collector over OTLP/HTTP in protobuf, every `collection_interval`. The
//! Prometheus endpoint stays; this is for operators whose telemetry goes through a collector.
//!
//! - **Spans** are the agent's tracing spans, through `tracing-opentelemetry`: an alloc's
//!   life on its node (`alloc`, from its runner's start to its collection, with every line
//!   logged in it as an event: the runner's starts, restarts and upgrades, and the guest's
//!   own lines with the alloc's attributes), a job's registration (`job.register`), a
//!   failed alloc's replacement by the server (`alloc.reschedule`) and a collection
//!   (`alloc.gc`). A span's events are held in memory until it ends, and an alloc's span
//!   lasts as long as the alloc: at most [`EVENTS_PER_SPAN`] (the SDK's own limit, 128)
//!   and [`EVENT_BYTES_PER_SPAN`] of their fields are kept, the first ones, and the rest are
//!   never held, so a runner that logs long lines for weeks costs the agent at most 64 KiB.
//!   Its lines all stay in the agent's log and the alloc's log file.
//! - **Metrics** are what `/v1/metrics` shows, read from the same text at each export and
//!   sent as gauges, one per metric, its labels as attributes ([`export_metrics`]).
//!
//! Export runs on the SDK's own threads, so a slow collector never holds up a request or a
//! runner; what cannot be sent is dropped after the exporter's timeout, and said once.
//! It knows nothing of the agent: the agent hands it the text of its metrics.

use opentelemetry::KeyValue;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Where and how often the agent exports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpSettings {
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`); `/v1/traces` and
    /// `/v1/metrics` are added to it.
    pub endpoint: String,
    /// How often spans and metrics are sent.
    pub interval: Duration,
    /// Named in every span and metric as `service.instance.id`: the agent's node.
    pub instance: String,
}

/// Most events kept per span: OpenTelemetry's default span limit.
pub const EVENTS_PER_SPAN: u32 = 128;
/// Most bytes of field names and values kept per span, all its events together.
pub const EVENT_BYTES_PER_SPAN: usize = 64 << 10;

/// How long one export may take before it is dropped.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The running export, kept for [`shutdown`].
struct Export {
    tracer: SdkTracerProvider,
    meter: SdkMeterProvider,
    interval: Duration,
}

static EXPORT: OnceLock<Export> = OnceLock::new();

/// Starts the exporters and returns the tracing layer that feeds spans to them. Fails when
/// the endpoint is not an `http://` or `https://` URL.
pub(super) fn start<S>(
    settings: &OtlpSettings,
) -> anyhow::Result<
    tracing_subscriber::filter::Filtered<
        tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>,
        EventsPerSpan,
        S,
    >,
>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    let base = settings.endpoint.trim_end_matches('/');
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        anyhow::bail!(
            "telemetry.otlp_endpoint {:?} must be an http:// or https:// URL (OTLP over HTTP, \
             such as http://127.0.0.1:4318)",
            crate::util::text::cut(&settings.endpoint, 128)
        );
    }
    crate::tls::install_process_crypto();
    let resource = Resource::builder()
        .with_service_name("caravan")
        .with_attribute(KeyValue::new(
            "service.instance.id",
            settings.instance.clone(),
        ))
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let spans = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("{base}/v1/traces"))
        .with_timeout(EXPORT_TIMEOUT)
        .build()?;
    let batches = BatchConfigBuilder::default()
        .with_scheduled_delay(settings.interval)
        .build();
    let tracer = SdkTracerProvider::builder()
        .with_span_processor(
            BatchSpanProcessor::builder(spans)
                .with_batch_config(batches)
                .build(),
        )
        .with_resource(resource.clone())
        .build();
    let metrics = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("{base}/v1/metrics"))
        .with_timeout(EXPORT_TIMEOUT)
        .build()?;
    let meter = SdkMeterProvider::builder()
        .with_reader(
            PeriodicReader::builder(metrics)
                .with_interval(settings.interval)
                .build(),
        )
        .with_resource(resource)
        .build();
    let layer = tracing_subscriber::Layer::with_filter(
        tracing_opentelemetry::layer().with_tracer(tracer.tracer("caravan")),
        EventsPerSpan {
            events: EVENTS_PER_SPAN,
            bytes: EVENT_BYTES_PER_SPAN,
        },
    );
    let export = Export {
        tracer,
        meter,
        interval: settings.interval,
    };
    if EXPORT.set(export).is_err() {
        anyhow::bail!("the OpenTelemetry export is started once per process");
    }
    Ok(layer)
}

/// Lets at most `events` events of each span, and `bytes` of their fields, through to the
/// export; spans themselves, and events outside any span (which the export drops anyway),
/// all pass.
pub struct EventsPerSpan {
    events: u32,
    bytes: usize,
}

/// What of a span's events went through, kept in the span's extensions.
#[derive(Default)]
struct EventsPassed {
    events: u32,
    bytes: usize,
}

/// The bytes of an event's field names and values, as the export would hold them.
#[derive(Default)]
struct FieldBytes(usize);

impl tracing::field::Visit for FieldBytes {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0 += field.name().len() + value.len();
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let mut counted = CountedBytes(0);
        let _ = std::fmt::Write::write_fmt(&mut counted, format_args!("{value:?}"));
        self.0 += field.name().len() + counted.0;
    }
}

/// Counts what is written to it, keeping nothing.
struct CountedBytes(usize);

impl std::fmt::Write for CountedBytes {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        self.0 += text.len();
        Ok(())
    }
}

impl<S> tracing_subscriber::layer::Filter<S> for EventsPerSpan
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    fn enabled(
        &self,
        _: &tracing::Metadata<'_>,
        _: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        true
    }

    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        context: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        let Some(span) = context.event_span(event) else {
            return true;
        };
        let mut extensions = span.extensions_mut();
        if extensions.get_mut::<EventsPassed>().is_none() {
            extensions.insert(EventsPassed::default());
        }
        let Some(passed) = extensions.get_mut::<EventsPassed>() else {
            return false;
        };
        if passed.events >= self.events || passed.bytes >= self.bytes {
            return false;
        }
        let mut size = FieldBytes::default();
        event.record(&mut size);
        if passed.bytes + size.0 > self.bytes {
            // Full: nothing more of this span is held, however small.
            passed.bytes = self.bytes;
            return false;
        }
        passed.events += 1;
        passed.bytes += size.0;
        true
    }
}

/// Whether spans and metrics are exported.
pub fn exporting() -> bool {
    EXPORT.get().is_some()
}

/// Sends what is waiting and stops the exporters: called once, as the process ends.
pub fn shutdown() {
    if let Some(export) = EXPORT.get() {
        let _ = export.tracer.shutdown();
        let _ = export.meter.shutdown();
    }
}

/// The metrics `render` writes (Prometheus's text format, as `/v1/metrics` serves), exported
/// as gauges at every export: one render serves every gauge of an export. A metric's gauge is
/// registered when its name first appears, looked for at every export interval (a cluster
/// follower's server metrics appear when it starts to lead). Does nothing when not
/// exporting.
pub fn export_metrics(render: impl Fn() -> String + Send + Sync + 'static) {
    let Some(export) = EXPORT.get() else {
        return;
    };
    let meter = export.meter.meter("caravan");
    let samples = Arc::new(RenderedOnce {
        render: Box::new(render),
        last: Mutex::new(None),
    });
    let mut registered = std::collections::BTreeSet::new();
    register_new_metrics(&meter, &samples, &mut registered);
    let interval = export.interval;
    let spawned = std::thread::Builder::new()
        .name("otlp-metric-names".into())
        .spawn(move || {
            loop {
                std::thread::sleep(interval);
                register_new_metrics(&meter, &samples, &mut registered);
            }
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "cannot follow new metrics for the OTLP export; those of now are sent");
    }
}

/// Registers a gauge for each metric `samples` has that `registered` does not.
fn register_new_metrics(
    meter: &opentelemetry::metrics::Meter,
    samples: &Arc<RenderedOnce>,
    registered: &mut std::collections::BTreeSet<String>,
) {
    for name in samples.read().keys() {
        if !registered.insert(name.clone()) {
            continue;
        }
        let samples = samples.clone();
        let metric = name.clone();
        meter
            .f64_observable_gauge(name.clone())
            .with_callback(move |gauge| {
                for (labels, value) in samples.read().get(&metric).into_iter().flatten() {
                    let attributes: Vec<KeyValue> = labels
                        .iter()
                        .map(|(key, value)| KeyValue::new(key.clone(), value.clone()))
                        .collect();
                    gauge.observe(*value, &attributes);
                }
            })
            .build();
    }
}

/// One metric's series: each label set and its value.
type Series = Vec<(Vec<(String, String)>, f64)>;

/// Every metric's series, by name.
type Parsed = Arc<BTreeMap<String, Series>>;

/// The rendered metrics, read again at most once per second: every gauge's callback of one
/// export asks for them.
struct RenderedOnce {
    render: Box<dyn Fn() -> String + Send + Sync>,
    last: Mutex<Option<(Instant, Parsed)>>,
}

impl RenderedOnce {
    fn read(&self) -> Parsed {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, parsed)) = last.as_ref()
            && at.elapsed() < Duration::from_secs(1)
        {
            return parsed.clone();
        }
        let parsed = Arc::new(parse_prometheus(&(self.render)()));
        *last = Some((Instant::now(), parsed.clone()));
        parsed
    }
}

/// Prometheus's text format, as this agent writes it, into each metric's series (comments
/// skipped; a line that does not read is skipped too).
fn parse_prometheus(text: &str) -> BTreeMap<String, Series> {
    let mut metrics: BTreeMap<String, Series> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, parse_labels(rest.trim_end_matches('}'))),
            None => (series, Vec::new()),
        };
        metrics
            .entry(name.to_string())
            .or_default()
            .push((labels, value));
    }
    metrics
}

/// `a="x",b="y"` into its pairs (values as this agent writes them: no comma or quote
/// inside).
fn parse_labels(text: &str) -> Vec<(String, String)> {
    text.split("\",")
        .filter_map(|pair| {
            let (key, value) = pair.split_once("=\"")?;
            Some((
                key.trim().to_string(),
                value.trim_end_matches('"').to_string(),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    /// Counts the events it is given.
    struct Counting(Arc<std::sync::atomic::AtomicU32>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Counting {
        fn on_event(&self, _: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn a_spans_events_past_the_limit_never_reach_the_export_and_other_spans_keep_theirs() {
        let seen = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let limits = EventsPerSpan {
            events: 3,
            bytes: 200,
        };
        let counting = tracing_subscriber::Layer::with_filter(Counting(seen.clone()), limits);
        let subscriber = tracing_subscriber::registry().with(counting);
        tracing::subscriber::with_default(subscriber, || {
            let chatty = tracing::info_span!("alloc", alloc_id = "a");
            for n in 0..10 {
                tracing::info!(parent: &chatty, n, "a guest line");
            }
            let quiet = tracing::info_span!("alloc", alloc_id = "b");
            tracing::info!(parent: &quiet, "its one line");
            tracing::info!("outside any span");
            // Long lines fill the byte budget first: one of 150 bytes passes, the next not,
            // and nothing after it, however short.
            let long = tracing::info_span!("alloc", alloc_id = "c");
            let line = "x".repeat(140);
            tracing::info!(parent: &long, line, "a");
            tracing::info!(parent: &long, line, "b");
            tracing::info!(parent: &long, "c");
        });
        assert_eq!(
            seen.load(std::sync::atomic::Ordering::Relaxed),
            3 + 1 + 1 + 1
        );
    }

    #[test]
    fn the_prometheus_text_reads_back_as_series_with_their_labels() {
        let text = "# HELP caravan_allocs Allocs.\n# TYPE caravan_allocs gauge\n\
                    caravan_allocs{status=\"running\",job=\"web\"} 3\n\
                    caravan_allocs{status=\"failed\",job=\"web\"} 1\n\
                    caravan_uptime_seconds 12.5\nnot a line\n";
        let metrics = parse_prometheus(text);
        assert_eq!(metrics["caravan_uptime_seconds"], vec![(vec![], 12.5)]);
        assert_eq!(
            metrics["caravan_allocs"][0],
            (
                vec![
                    ("status".to_string(), "running".to_string()),
                    ("job".to_string(), "web".to_string())
                ],
                3.0
            )
        );
        assert_eq!(metrics.len(), 2);
    }
}
