//! crius's own Prometheus metrics: what it does for kubelet, how long that takes, and what
//! the process costs.
//!
//! One process-wide set ([`metrics()`]): every part records into it whether or not the
//! listener is on (each record is an atomic add). `[metrics] address` serves them over HTTP
//! ([`serve`]); `crius metrics` prints what each one means ([`describe`]). Names follow
//! Prometheus's conventions: the `crius_` prefix, base units in the name, `_total` on
//! counters only (the encoder adds it once).

mod process;
mod server;

use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

pub use server::{MetricsServer, ServeError};

/// 0.1 ms to 15 s: a cached read answers in well under a millisecond, a pod start takes
/// tens of milliseconds, a stop up to its grace period.
fn rpc_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.5, 14))
}

/// 1 ms to 4 min: an image pull is a few milliseconds when the image is present, minutes
/// for a large one.
fn pull_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 3.0, 12))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    pub rpc: &'static str,
    pub code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcName {
    pub rpc: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CniLabels {
    pub operation: &'static str,
    pub network: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Every metric crius exports.
pub struct Metrics {
    registry: Registry,
    /// `crius metrics`: one line per metric.
    described: Vec<String>,
    rpc_duration: HistogramFamily<RpcLabels>,
    rpcs_in_flight: Family<RpcName, Gauge>,
    cni_duration: HistogramFamily<CniLabels>,
    cni_errors: Family<CniLabels, Counter>,
    pulls: Family<ResultLabel, Counter>,
    pull_bytes: Counter,
    pull_duration: HistogramFamily<ResultLabel>,
    pulls_in_progress: Gauge,
    container_exits: Family<ReasonLabel, Counter>,
    events_dropped: Counter,
    stream_sessions: Family<KindLabel, Gauge>,
    recovery_duration: Gauge<f64, AtomicU64>,
    process: process::ProcessGauges,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

impl Metrics {
    fn new() -> Self {
        let mut catalog = Catalog::new();
        let rpc_duration = HistogramFamily::new_with_constructor(rpc_buckets as fn() -> _);
        catalog.add(
            "rpc_duration",
            "How long CRI calls took, by method and gRPC status code (the count is the calls)",
            Some(Unit::Seconds),
            rpc_duration.clone(),
        );
        let rpcs_in_flight = Family::default();
        catalog.add(
            "rpcs_in_flight",
            "CRI calls being served, by method",
            None,
            Family::clone(&rpcs_in_flight),
        );
        let cni_duration = HistogramFamily::new_with_constructor(rpc_buckets as fn() -> _);
        catalog.add(
            "cni_operation_duration",
            "How long CNI ADD and DEL of one network (all its plugins) took, by network",
            Some(Unit::Seconds),
            cni_duration.clone(),
        );
        let cni_errors = Family::default();
        catalog.add(
            "cni_operation_errors",
            "CNI ADD and DEL calls that failed, by network",
            None,
            Family::clone(&cni_errors),
        );
        let pulls = Family::default();
        catalog.add(
            "image_pulls",
            "Image pulls by result (success, failure); pulls joined by another caller count once",
            None,
            Family::clone(&pulls),
        );
        let pull_bytes = Counter::default();
        catalog.add(
            "image_pull",
            "Layer bytes received from registries by image pulls",
            Some(Unit::Bytes),
            pull_bytes.clone(),
        );
        let pull_duration = HistogramFamily::new_with_constructor(pull_buckets as fn() -> _);
        catalog.add(
            "image_pull_duration",
            "How long image pulls took, by result",
            Some(Unit::Seconds),
            pull_duration.clone(),
        );
        let pulls_in_progress = Gauge::default();
        catalog.add(
            "image_pulls_in_progress",
            "Image pulls running now",
            None,
            pulls_in_progress.clone(),
        );
        let container_exits = Family::default();
        catalog.add(
            "container_exits",
            "Container exits crius saw, by reason (Completed, Error, OOMKilled)",
            None,
            Family::clone(&container_exits),
        );
        let events_dropped = Counter::default();
        catalog.add(
            "container_events_dropped",
            "Container events a GetContainerEvents subscriber missed because it fell behind",
            None,
            events_dropped.clone(),
        );
        let stream_sessions = Family::default();
        catalog.add(
            "stream_sessions",
            "Open exec, attach and port-forward sessions, by kind",
            None,
            Family::clone(&stream_sessions),
        );
        let recovery_duration = Gauge::<f64, AtomicU64>::default();
        catalog.add(
            "recovery_duration",
            "How long recovering pods, containers and images took at start-up",
            Some(Unit::Seconds),
            recovery_duration.clone(),
        );
        let process = process::ProcessGauges::register(&mut catalog);
        Self {
            registry: catalog.registry,
            described: catalog.described,
            rpc_duration,
            rpcs_in_flight,
            cni_duration,
            cni_errors,
            pulls,
            pull_bytes,
            pull_duration,
            pulls_in_progress,
            container_exits,
            events_dropped,
            stream_sessions,
            recovery_duration,
            process,
        }
    }

    /// Counts one CRI call in flight until [`RpcCall::finish`] records its code and latency;
    /// a call dropped before that (its client went away) is recorded as `Canceled`.
    pub fn rpc_started(&'static self, rpc: &'static str) -> RpcCall {
        let in_flight = self.rpcs_in_flight.get_or_create_owned(&RpcName { rpc });
        in_flight.inc();
        RpcCall {
            metrics: self,
            rpc,
            started: Instant::now(),
            in_flight,
            finished: false,
        }
    }

    fn rpc_finished(&self, rpc: &'static str, code: tonic::Code, took: Duration) {
        self.rpc_duration
            .get_or_create(&RpcLabels {
                rpc,
                code: code_name(code),
            })
            .observe(took.as_secs_f64());
    }

    /// Records one CNI ADD or DEL (`operation`: "add", "del") of `network`.
    pub fn cni_operation(&self, operation: &'static str, network: &str, took: Duration, ok: bool) {
        let labels = CniLabels {
            operation,
            network: network.to_string(),
        };
        self.cni_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        if !ok {
            self.cni_errors.get_or_create(&labels).inc();
        }
    }

    /// Counts one image pull in progress until [`PullTimer::finish`] (or its drop, as a
    /// failure).
    pub fn pull_started(&'static self) -> PullTimer {
        self.pulls_in_progress.inc();
        PullTimer {
            metrics: self,
            started: Instant::now(),
            done: false,
        }
    }

    /// Counts layer bytes as they come in: a long pull's progress shows while it runs.
    pub fn pull_received(&self, bytes: u64) {
        self.pull_bytes.inc_by(bytes);
    }

    pub fn container_exited(&self, reason: &'static str) {
        self.container_exits
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub fn events_dropped(&self, missed: u64) {
        self.events_dropped.inc_by(missed);
    }

    /// Counts one open stream session (`kind`: exec, attach, port_forward) until the guard
    /// drops.
    pub fn stream_session_opened(&'static self, kind: &'static str) -> InFlight {
        let gauge = self
            .stream_sessions
            .get_or_create_owned(&KindLabel { kind });
        gauge.inc();
        InFlight(gauge)
    }

    pub fn recovered(&self, took: Duration) {
        self.recovery_duration.set(took.as_secs_f64());
    }

    /// The OpenMetrics text exposition of every metric, the process's own read now.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        self.process.refresh();
        let mut text = String::with_capacity(8 * 1024);
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// One CRI call being served.
pub struct RpcCall {
    metrics: &'static Metrics,
    rpc: &'static str,
    started: Instant,
    in_flight: Gauge,
    finished: bool,
}

impl RpcCall {
    /// Records how the call ended.
    pub fn finish(mut self, code: tonic::Code) {
        self.finished = true;
        self.metrics
            .rpc_finished(self.rpc, code, self.started.elapsed());
    }
}

impl Drop for RpcCall {
    fn drop(&mut self) {
        self.in_flight.dec();
        if !self.finished {
            self.metrics
                .rpc_finished(self.rpc, tonic::Code::Cancelled, self.started.elapsed());
        }
    }
}

/// A gauge held up by one while the guard lives.
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One image pull being timed.
pub struct PullTimer {
    metrics: &'static Metrics,
    started: Instant,
    done: bool,
}

impl PullTimer {
    /// Records the pull's result.
    pub fn finish(mut self, ok: bool) {
        self.record(ok);
    }

    fn record(&mut self, ok: bool) {
        if self.done {
            return;
        }
        self.done = true;
        let result = ResultLabel {
            result: if ok { "success" } else { "failure" },
        };
        self.metrics.pulls_in_progress.dec();
        self.metrics.pulls.get_or_create(&result).inc();
        self.metrics
            .pull_duration
            .get_or_create(&result)
            .observe(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for PullTimer {
    /// A pull dropped before it finished (its caller went away) failed.
    fn drop(&mut self) {
        self.record(false);
    }
}

/// gRPC's names for its codes, as grpc-go's interceptors label them.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// One line per metric: its name as scraped, its type and what it means (`crius metrics`).
pub fn describe() -> String {
    Metrics::new().described.join("\n") + "\n"
}

/// The registry under construction, and each metric's description as it is registered.
pub(crate) struct Catalog {
    registry: Registry,
    described: Vec<String>,
}

impl Catalog {
    fn new() -> Self {
        Self {
            registry: Registry::with_prefix(PREFIX),
            described: Vec::new(),
        }
    }

    /// Registers `metric` as `crius_<name>[_<unit>]`; counters are scraped with `_total`.
    pub(crate) fn add(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        metric: impl prometheus_client::registry::Metric,
    ) {
        let metric_type = prometheus_client::encoding::EncodeMetric::metric_type(&metric);
        let kind = metric_type.as_str();
        let mut scraped = format!("{PREFIX}_{name}");
        if let Some(unit) = &unit {
            scraped = format!("{scraped}_{}", unit.as_str());
        }
        if kind == "counter" {
            scraped.push_str("_total");
        }
        self.described.push(format!("{scraped} ({kind}): {help}"));
        match unit {
            Some(unit) => self.registry.register_with_unit(name, help, unit, metric),
            None => self.registry.register(name, help, metric),
        }
    }
}

const PREFIX: &str = "crius";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_named_by_the_conventions() {
        let described = describe();
        let names: Vec<&str> = described
            .lines()
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        assert!(names.len() >= 15, "{described}");
        for name in names {
            assert!(name.starts_with("crius_"), "{name}");
            assert!(!name.contains("_total_"), "{name}");
            assert!(!name.ends_with("_total_total"), "{name}");
            assert!(
                !name.contains("_seconds_seconds") && !name.contains("_bytes_bytes"),
                "{name}"
            );
        }
        assert!(described.contains("crius_image_pulls_total (counter)"));
        assert!(described.contains("crius_image_pull_bytes_total (counter)"));
        assert!(described.contains("crius_rpc_duration_seconds (histogram)"));
        assert!(described.contains("crius_process_resident_memory_bytes (gauge)"));
    }

    #[test]
    fn calls_and_their_codes_are_counted_by_method() {
        let metrics = Box::leak(Box::new(Metrics::new()));
        let call = metrics.rpc_started("Version");
        let text = metrics.encode().unwrap();
        assert!(
            text.contains("crius_rpcs_in_flight{rpc=\"Version\"} 1"),
            "{text}"
        );
        call.finish(tonic::Code::Ok);
        metrics
            .rpc_started("ContainerStatus")
            .finish(tonic::Code::NotFound);
        // A client that went away before the answer.
        drop(metrics.rpc_started("ListContainers"));
        let text = metrics.encode().unwrap();
        assert!(
            text.contains(
                "crius_rpc_duration_seconds_count{rpc=\"ListContainers\",code=\"Canceled\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("crius_rpcs_in_flight{rpc=\"ListContainers\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("crius_rpcs_in_flight{rpc=\"Version\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("crius_rpc_duration_seconds_count{rpc=\"Version\",code=\"OK\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "crius_rpc_duration_seconds_count{rpc=\"ContainerStatus\",code=\"NotFound\"} 1"
            ),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn a_pull_dropped_unfinished_counts_as_a_failure_once() {
        let metrics = Box::leak(Box::new(Metrics::new()));
        let pull = metrics.pull_started();
        assert_eq!(metrics.pulls_in_progress.get(), 1);
        drop(pull);
        let pull = metrics.pull_started();
        metrics.pull_received(1000);
        metrics.pull_received(234);
        pull.finish(true);
        assert_eq!(metrics.pulls_in_progress.get(), 0);
        let text = metrics.encode().unwrap();
        assert!(
            text.contains("crius_image_pulls_total{result=\"failure\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("crius_image_pulls_total{result=\"success\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("crius_image_pull_bytes_total 1234\n"),
            "{text}"
        );
    }

    #[test]
    fn cni_failures_are_counted_by_network_and_operation() {
        let metrics = Box::leak(Box::new(Metrics::new()));
        metrics.cni_operation("add", "crius-bridge", Duration::from_millis(30), true);
        metrics.cni_operation("del", "crius-bridge", Duration::from_millis(5), false);
        let text = metrics.encode().unwrap();
        assert!(
            text.contains(
                "crius_cni_operation_errors_total{operation=\"del\",network=\"crius-bridge\"} 1"
            ),
            "{text}"
        );
        assert!(
            !text.contains("crius_cni_operation_errors_total{operation=\"add\""),
            "{text}"
        );
        assert!(
            text.contains(
                "crius_cni_operation_duration_seconds_count{operation=\"add\",network=\"crius-bridge\"} 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_process_reports_its_memory_fds_and_threads() {
        let text = metrics().encode().unwrap();
        for name in [
            "crius_process_resident_memory_bytes ",
            "crius_process_open_fds ",
            "crius_process_threads ",
        ] {
            let value: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap_or_else(|| panic!("{name} missing: {text}"))
                .parse()
                .unwrap();
            assert!(value > 0.0, "{name}{value}");
        }
    }
}
