//! A CRI request fuzzer against one running crius: thousands of malformed requests for every
//! RPC of the RuntimeService and the ImageService, mixed with valid-looking requests in the
//! wrong order on a handful of real pods and containers. Afterwards crius must still answer,
//! must have answered every bad request with a client error (never INTERNAL or UNKNOWN),
//! and, once the fuzzer removed what it made, must have left nothing behind.
//!
//! The run is seeded: the seed is printed, `CRIUS_FUZZ_SEED=<seed>` replays it (the same
//! requests, as long as crius answers the same), `CRIUS_FUZZ_REQUESTS=<n>` sets how many
//! requests are sent and `CRIUS_FUZZ_VERBOSE=1` shows a sample message for every answer code.

mod common;

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::pod::{container, image};
use common::{Crius, TestNetwork, eventually};
use crius::api::v1::*;
use crius_testkit::CriClient;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use tonic::{Code, Status};

/// Requests sent when `CRIUS_FUZZ_REQUESTS` does not say.
const DEFAULT_REQUESTS: usize = 2000;
/// Real pods the fuzzer makes on purpose, and how many may live at once: each costs a
/// netns, an IP, a shim and ~100 ms.
const MAX_PODS: usize = 16;
const MAX_LIVE_PODS: usize = 4;
/// Real containers the fuzzer makes on purpose.
const MAX_CONTAINERS: usize = 40;
/// The deadline of every request, as kubelet sets one...
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// ...but for this share of them, whose client gives up within 100 ms.
const IMPATIENT: f64 = 0.03;
/// How long an endless stream (GetContainerEvents) is read before the fuzzer hangs up.
const STREAM_WAIT: Duration = Duration::from_millis(50);
/// How long asynchronous teardown may take before a leftover counts as leaked.
const SETTLE: Duration = Duration::from_secs(15);
/// Open files crius may hold beyond its count before the fuzz (connections it pools).
const FD_SLACK: usize = 8;
/// The test's own CNI network (bridge `criust150`).
const NETWORK_TAG: u8 = 150;
/// The command of the fuzzer's real containers: it ends at once on SIGTERM, so a stop with
/// a long timeout does not wait for it.
const SLEEPER: &[&str] = &["sh", "-c", "trap 'exit 0' TERM; sleep 100000 & wait"];

/// Picks one of `options`, which may themselves draw from the fuzzer.
macro_rules! pick {
    ($fuzzer:expr, [$($option:expr),+ $(,)?]) => {{
        let options = [$($option),+];
        $fuzzer.pick(&options)
    }};
}

#[tokio::test]
async fn malformed_and_out_of_order_requests_get_client_errors_and_leak_nothing() {
    let seed = env_number("CRIUS_FUZZ_SEED").unwrap_or_else(rand::random);
    let requests = env_number("CRIUS_FUZZ_REQUESTS").map_or(DEFAULT_REQUESTS, |n| n as usize);
    println!("request fuzz: seed {seed}, {requests} requests (replay: CRIUS_FUZZ_SEED={seed})");

    let mut network = None;
    let mut crius = Crius::start_with(
        |c| network = Some(TestNetwork::install(c, NETWORK_TAG)),
        &[],
    )
    .await;
    let network = network.expect("the test network");
    let netns = NetnsWatcher::start(crius.config.root.join("sandboxes"));
    let mut fuzzer = Fuzzer::new(seed, &crius).await;
    fuzzer.warm_up().await;
    let fds_before = open_fds(&crius);

    let started = Instant::now();
    fuzzer.run(requests).await;
    let fuzzed = started.elapsed();
    assert_still_answers(&mut crius).await;

    let started = Instant::now();
    let cleanup_errors = fuzzer.remove_everything().await;
    let leaks = leaks(&crius, &network, &netns.seen(), fds_before).await;
    println!(
        "request fuzz: {} requests in {fuzzed:?} made {} pods and {} containers; cleanup and \
         leak checks took {:?}; crius has {} files open ({fds_before} before)\n{}",
        fuzzer.sent,
        fuzzer.pods.len(),
        fuzzer.containers.len(),
        started.elapsed(),
        open_fds(&crius),
        fuzzer.code_table()
    );
    let problems = [
        ("server errors", &fuzzer.findings),
        ("accepted malformed requests", &fuzzer.accepted),
        ("cleanup errors", &cleanup_errors),
        ("leaks", &leaks),
    ];
    if problems.iter().any(|(_, items)| !items.is_empty()) {
        // The test's directory goes with it: keep crius's side of the story.
        let kept_log = std::env::temp_dir().join(format!("crius-request-fuzz-{seed}.log"));
        let _ = std::fs::write(&kept_log, crius.log());
        println!("crius's log is kept in {}", kept_log.display());
    }
    for (what, items) in problems {
        if !items.is_empty() {
            println!("{what}:\n{}", items.join("\n"));
        }
    }

    assert!(
        fuzzer.findings.is_empty(),
        "seed {seed}: {} requests got a server error for bad input:\n{}",
        fuzzer.findings.len(),
        fuzzer.findings.join("\n")
    );
    assert!(
        fuzzer.accepted.is_empty(),
        "seed {seed}: {} malformed requests were accepted:\n{}",
        fuzzer.accepted.len(),
        fuzzer.accepted.join("\n")
    );
    assert!(
        cleanup_errors.is_empty(),
        "seed {seed}: removing what the fuzzer made failed:\n{}",
        cleanup_errors.join("\n")
    );
    assert!(
        leaks.is_empty(),
        "seed {seed}: left behind after everything was removed:\n{}",
        leaks.join("\n")
    );
    let log = crius.log();
    assert!(
        !log.contains("panicked"),
        "seed {seed}: crius panicked:\n{log}"
    );
}

fn env_number(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    Some(
        text.parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a number")),
    )
}

/// crius is alive and answers Version within a second.
async fn assert_still_answers(crius: &mut Crius) {
    if let Some(status) = crius.try_wait() {
        panic!("crius died during the fuzz ({status}):\n{}", crius.log());
    }
    let started = Instant::now();
    let answered = tokio::time::timeout(Duration::from_secs(1), async {
        crius
            .client()
            .await
            .runtime
            .version(VersionRequest::default())
            .await
    })
    .await;
    assert!(
        matches!(answered, Ok(Ok(_))),
        "crius did not answer Version within 1 s after the fuzz ({:?}, {answered:?}):\n{}",
        started.elapsed(),
        crius.log()
    );
}

// ---------------------------------------------------------------------------------------
// The requests
// ---------------------------------------------------------------------------------------

/// What a successful request made, as far as the fuzzer needs to know.
enum Reply {
    Pod(String),
    Container(String),
    Nothing,
}

impl Reply {
    fn of(response: &dyn Any) -> Self {
        if let Some(r) = response.downcast_ref::<RunPodSandboxResponse>() {
            Reply::Pod(r.pod_sandbox_id.clone())
        } else if let Some(r) = response.downcast_ref::<CreateContainerResponse>() {
            Reply::Container(r.container_id.clone())
        } else {
            Reply::Nothing
        }
    }
}

fn with_deadline<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(CALL_TIMEOUT);
    request
}

/// Reads a server stream to its end (an endless one for [`STREAM_WAIT`]).
async fn drain<T>(mut stream: tonic::Streaming<T>) -> Result<Reply, Status> {
    let read = async {
        while stream.message().await?.is_some() {}
        Ok(Reply::Nothing)
    };
    tokio::time::timeout(STREAM_WAIT, read)
        .await
        .unwrap_or(Ok(Reply::Nothing))
}

/// `Call`, one CRI request of any RPC, with its name and how it is sent.
macro_rules! calls {
    ($($kind:ident $service:ident $rpc:ident($request:ident) => $method:ident;)*) => {
        // Requests are made and sent one at a time: their size does not matter.
        #[allow(clippy::large_enum_variant)]
        #[derive(Clone, Debug)]
        enum Call {
            $($rpc($request),)*
        }

        impl Call {
            fn rpc(&self) -> &'static str {
                match self {
                    $(Call::$rpc(_) => stringify!($rpc),)*
                }
            }

            /// Sends the request with a deadline `timeout` away.
            async fn send(
                &self,
                client: &mut CriClient,
                timeout: Duration,
            ) -> Result<Reply, Status> {
                match self {
                    $(Call::$rpc(request) => {
                        let mut request = tonic::Request::new(request.clone());
                        request.set_timeout(timeout);
                        let response = client.$service.$method(request).await?;
                        calls!(@$kind response)
                    })*
                }
            }
        }
    };
    (@unary $response:ident) => { Ok(Reply::of(&$response.into_inner())) };
    (@stream $response:ident) => { drain($response.into_inner()).await };
}

calls! {
    unary runtime Version(VersionRequest) => version;
    unary runtime RunPodSandbox(RunPodSandboxRequest) => run_pod_sandbox;
    unary runtime StopPodSandbox(StopPodSandboxRequest) => stop_pod_sandbox;
    unary runtime RemovePodSandbox(RemovePodSandboxRequest) => remove_pod_sandbox;
    unary runtime PodSandboxStatus(PodSandboxStatusRequest) => pod_sandbox_status;
    unary runtime ListPodSandbox(ListPodSandboxRequest) => list_pod_sandbox;
    stream runtime StreamPodSandboxes(StreamPodSandboxesRequest) => stream_pod_sandboxes;
    unary runtime CreateContainer(CreateContainerRequest) => create_container;
    unary runtime StartContainer(StartContainerRequest) => start_container;
    unary runtime StopContainer(StopContainerRequest) => stop_container;
    unary runtime RemoveContainer(RemoveContainerRequest) => remove_container;
    unary runtime ListContainers(ListContainersRequest) => list_containers;
    stream runtime StreamContainers(StreamContainersRequest) => stream_containers;
    unary runtime ContainerStatus(ContainerStatusRequest) => container_status;
    unary runtime UpdateContainerResources(UpdateContainerResourcesRequest) => update_container_resources;
    unary runtime ReopenContainerLog(ReopenContainerLogRequest) => reopen_container_log;
    unary runtime ExecSync(ExecSyncRequest) => exec_sync;
    unary runtime Exec(ExecRequest) => exec;
    unary runtime Attach(AttachRequest) => attach;
    unary runtime PortForward(PortForwardRequest) => port_forward;
    unary runtime ContainerStats(ContainerStatsRequest) => container_stats;
    unary runtime ListContainerStats(ListContainerStatsRequest) => list_container_stats;
    stream runtime StreamContainerStats(StreamContainerStatsRequest) => stream_container_stats;
    unary runtime PodSandboxStats(PodSandboxStatsRequest) => pod_sandbox_stats;
    unary runtime ListPodSandboxStats(ListPodSandboxStatsRequest) => list_pod_sandbox_stats;
    stream runtime StreamPodSandboxStats(StreamPodSandboxStatsRequest) => stream_pod_sandbox_stats;
    unary runtime UpdateRuntimeConfig(UpdateRuntimeConfigRequest) => update_runtime_config;
    unary runtime Status(StatusRequest) => status;
    unary runtime CheckpointContainer(CheckpointContainerRequest) => checkpoint_container;
    stream runtime GetContainerEvents(GetEventsRequest) => get_container_events;
    unary runtime ListMetricDescriptors(ListMetricDescriptorsRequest) => list_metric_descriptors;
    unary runtime ListPodSandboxMetrics(ListPodSandboxMetricsRequest) => list_pod_sandbox_metrics;
    stream runtime StreamPodSandboxMetrics(StreamPodSandboxMetricsRequest) => stream_pod_sandbox_metrics;
    unary runtime RuntimeConfig(RuntimeConfigRequest) => runtime_config;
    unary runtime UpdatePodSandboxResources(UpdatePodSandboxResourcesRequest) => update_pod_sandbox_resources;
    unary image ListImages(ListImagesRequest) => list_images;
    stream image StreamImages(StreamImagesRequest) => stream_images;
    unary image ImageStatus(ImageStatusRequest) => image_status;
    unary image PullImage(PullImageRequest) => pull_image;
    unary image RemoveImage(RemoveImageRequest) => remove_image;
    unary image ImageFsInfo(ImageFsInfoRequest) => image_fs_info;
}

impl Call {
    /// The request as a short line (huge fields cut).
    fn summary(&self) -> String {
        shorten(&format!("{self:?}"), 600)
    }
}

/// One generated step: the requests (sent concurrently when more than one), and why crius
/// must refuse them when they are malformed beyond doubt (empty: it may accept them).
struct Case {
    calls: Vec<Call>,
    refuse_because: Vec<&'static str>,
}

impl Case {
    fn any(call: Call) -> Self {
        Self::refused_if(Vec::new(), call)
    }

    fn refused_if(refuse_because: Vec<&'static str>, call: Call) -> Self {
        Self {
            calls: vec![call],
            refuse_because,
        }
    }
}

/// `why` when `bad`, for a case's reasons to be refused.
fn because(bad: bool, why: &'static str) -> Option<&'static str> {
    bad.then_some(why)
}

/// A request generator: builds one step from the fuzzer's RNG and what it has made.
type Generator = fn(&mut Fuzzer) -> Case;

/// Every kind of step, with its weight: malformed requests for every RPC, and valid-looking
/// ones in the wrong order on the real pods and containers.
const GENERATORS: &[(u32, Generator)] = &[
    (1, |f| {
        Case::any(Call::Version(VersionRequest { version: f.text() }))
    }),
    (8, Fuzzer::malformed_run_pod),
    (3, |f| {
        Case::any(Call::StopPodSandbox(StopPodSandboxRequest {
            pod_sandbox_id: f.garbage_id(),
        }))
    }),
    (2, |f| {
        Case::any(Call::RemovePodSandbox(RemovePodSandboxRequest {
            pod_sandbox_id: f.garbage_id(),
        }))
    }),
    (3, |f| {
        Case::any(Call::PodSandboxStatus(PodSandboxStatusRequest {
            pod_sandbox_id: f.pod_id(),
            verbose: f.coin(),
        }))
    }),
    (2, |f| {
        Case::any(Call::ListPodSandbox(ListPodSandboxRequest {
            filter: f.pod_filter(),
        }))
    }),
    (1, |f| {
        Case::any(Call::StreamPodSandboxes(StreamPodSandboxesRequest {
            filter: f.pod_filter(),
        }))
    }),
    (10, Fuzzer::malformed_create_container),
    (3, |f| {
        Case::any(Call::StartContainer(StartContainerRequest {
            container_id: f.garbage_id(),
        }))
    }),
    (3, |f| {
        Case::any(Call::StopContainer(StopContainerRequest {
            container_id: f.garbage_id(),
            timeout: f.timeout(),
        }))
    }),
    (2, |f| {
        Case::any(Call::RemoveContainer(RemoveContainerRequest {
            container_id: f.garbage_id(),
        }))
    }),
    (2, |f| {
        Case::any(Call::ListContainers(ListContainersRequest {
            filter: f.container_filter(),
        }))
    }),
    (1, |f| {
        Case::any(Call::StreamContainers(StreamContainersRequest {
            filter: f.container_filter(),
        }))
    }),
    (3, |f| {
        Case::any(Call::ContainerStatus(ContainerStatusRequest {
            container_id: f.container_id(),
            verbose: f.coin(),
        }))
    }),
    (5, Fuzzer::malformed_update_container),
    (2, |f| {
        Case::any(Call::ReopenContainerLog(ReopenContainerLogRequest {
            container_id: f.container_id(),
        }))
    }),
    (4, Fuzzer::malformed_exec_sync),
    (3, Fuzzer::malformed_exec),
    (3, Fuzzer::malformed_attach),
    (2, Fuzzer::malformed_port_forward),
    (2, |f| {
        Case::any(Call::ContainerStats(ContainerStatsRequest {
            container_id: f.container_id(),
        }))
    }),
    (2, |f| {
        Case::any(Call::ListContainerStats(ListContainerStatsRequest {
            filter: f.stats_filter(),
        }))
    }),
    (1, |f| {
        Case::any(Call::StreamContainerStats(StreamContainerStatsRequest {
            filter: f.stats_filter(),
        }))
    }),
    (2, |f| {
        Case::any(Call::PodSandboxStats(PodSandboxStatsRequest {
            pod_sandbox_id: f.pod_id(),
        }))
    }),
    (2, |f| {
        Case::any(Call::ListPodSandboxStats(ListPodSandboxStatsRequest {
            filter: f.pod_stats_filter(),
        }))
    }),
    (1, |f| {
        Case::any(Call::StreamPodSandboxStats(StreamPodSandboxStatsRequest {
            filter: f.pod_stats_filter(),
        }))
    }),
    (2, Fuzzer::malformed_runtime_config),
    (1, |f| {
        Case::any(Call::Status(StatusRequest { verbose: f.coin() }))
    }),
    (1, |f| {
        Case::any(Call::CheckpointContainer(CheckpointContainerRequest {
            container_id: f.container_id(),
            location: f.text(),
            timeout: f.timeout(),
        }))
    }),
    (1, |_| {
        Case::any(Call::GetContainerEvents(GetEventsRequest {}))
    }),
    (1, |_| {
        Case::any(Call::ListMetricDescriptors(ListMetricDescriptorsRequest {}))
    }),
    (1, |_| {
        Case::any(Call::ListPodSandboxMetrics(ListPodSandboxMetricsRequest {}))
    }),
    (1, |_| {
        Case::any(Call::StreamPodSandboxMetrics(
            StreamPodSandboxMetricsRequest {},
        ))
    }),
    (1, |_| {
        Case::any(Call::RuntimeConfig(RuntimeConfigRequest {}))
    }),
    (4, Fuzzer::malformed_update_pod),
    (2, |f| {
        Case::any(Call::ListImages(ListImagesRequest {
            filter: f.image_filter(),
        }))
    }),
    (1, |f| {
        Case::any(Call::StreamImages(StreamImagesRequest {
            filter: f.image_filter(),
        }))
    }),
    (3, |f| {
        Case::any(Call::ImageStatus(ImageStatusRequest {
            image: f.odd_image_spec(),
            verbose: f.coin(),
        }))
    }),
    (5, Fuzzer::malformed_pull),
    (2, |f| {
        Case::any(Call::RemoveImage(RemoveImageRequest {
            image: f.odd_image_spec(),
        }))
    }),
    (1, |_| Case::any(Call::ImageFsInfo(ImageFsInfoRequest {}))),
    (30, Fuzzer::out_of_order),
    (1, Fuzzer::race_removal),
];

// ---------------------------------------------------------------------------------------
// The fuzzer and what it made
// ---------------------------------------------------------------------------------------

struct RealPod {
    id: String,
    config: PodSandboxConfig,
    removed: bool,
}

struct RealContainer {
    id: String,
    pod_id: String,
    config: ContainerConfig,
    removed: bool,
}

struct Fuzzer {
    rng: StdRng,
    client: CriClient,
    /// Where the fuzzer's pods log (under the test's directory).
    log_root: PathBuf,
    /// `busybox:latest` in the test registry, pulled.
    busybox: String,
    pods: Vec<RealPod>,
    containers: Vec<RealContainer>,
    /// Real pods and containers asked for on purpose (not those malformed requests made).
    pods_made: usize,
    containers_made: usize,
    names: usize,
    sent: usize,
    /// rpc -> code -> count.
    codes: BTreeMap<&'static str, BTreeMap<String, usize>>,
    /// The first message per (rpc, code), shown with `CRIUS_FUZZ_VERBOSE=1`.
    samples: BTreeMap<(&'static str, String), String>,
    /// Requests answered INTERNAL, UNKNOWN (or another server-fault code).
    findings: Vec<String>,
    /// Malformed requests crius accepted.
    accepted: Vec<String>,
}

impl Fuzzer {
    async fn new(seed: u64, crius: &Crius) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            client: crius.client().await,
            log_root: crius.dir.path().join("logs"),
            busybox: image("busybox:latest"),
            pods: Vec::new(),
            containers: Vec::new(),
            pods_made: 0,
            containers_made: 0,
            names: 0,
            sent: 0,
            codes: BTreeMap::new(),
            samples: BTreeMap::new(),
            findings: Vec::new(),
            accepted: Vec::new(),
        }
    }

    /// Pulls the test image and makes and removes one pod, so the open-file count taken
    /// afterwards includes crius's pooled connections and the pause image.
    async fn warm_up(&mut self) {
        self.client
            .image
            .pull_image(with_deadline(PullImageRequest {
                image: Some(ImageSpec {
                    image: self.busybox.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            }))
            .await
            .expect("pull busybox");
        let config = self.real_pod_config();
        let id = self
            .client
            .runtime
            .run_pod_sandbox(with_deadline(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            }))
            .await
            .expect("a warm-up pod")
            .into_inner()
            .pod_sandbox_id;
        self.client
            .runtime
            .remove_pod_sandbox(with_deadline(RemovePodSandboxRequest {
                pod_sandbox_id: id,
            }))
            .await
            .expect("remove the warm-up pod");
    }

    async fn run(&mut self, requests: usize) {
        while self.sent < requests {
            let (_, generate) = *GENERATORS
                .choose_weighted(&mut self.rng, |(weight, _)| *weight)
                .expect("positive weights");
            let case = generate(self);
            self.send(case).await;
            // Pods that malformed requests made beyond the budget go at once: each holds a
            // shim, a netns and an IP.
            if let Some(pod_sandbox_id) = self.surplus_pod() {
                let remove = Call::RemovePodSandbox(RemovePodSandboxRequest { pod_sandbox_id });
                self.send(Case::any(remove)).await;
            }
        }
    }

    fn surplus_pod(&self) -> Option<String> {
        let mut live = self.pods.iter().filter(|p| !p.removed);
        (live.clone().count() > MAX_LIVE_PODS)
            .then(|| live.next_back().map(|p| p.id.clone()))
            .flatten()
    }

    async fn send(&mut self, case: Case) {
        let sends = case.calls.iter().map(|call| {
            let mut client = self.client.clone();
            // Now and then a client that gives up at once, as kubelet does on a busy node:
            // what it asked for must still be made whole or undone.
            let timeout = if self.rng.random_bool(IMPATIENT) {
                Duration::from_millis(self.rng.random_range(1..=100))
            } else {
                CALL_TIMEOUT
            };
            async move { call.send(&mut client, timeout).await }
        });
        let results = futures::future::join_all(sends).await;
        for (call, result) in case.calls.iter().zip(results) {
            self.record(call, result, &case.refuse_because);
        }
    }

    fn record(&mut self, call: &Call, result: Result<Reply, Status>, refuse_because: &[&str]) {
        self.sent += 1;
        let code = result.as_ref().err().map_or(Code::Ok, Status::code);
        *self
            .codes
            .entry(call.rpc())
            .or_default()
            .entry(format!("{code:?}"))
            .or_default() += 1;
        if let Err(status) = &result {
            self.samples
                .entry((call.rpc(), format!("{code:?}")))
                .or_insert_with(|| shorten(status.message(), 300));
        }
        match result {
            Err(status) if is_server_fault(&status) => self.findings.push(format!(
                "{} {:?} {:?}\n    request: {}{}",
                call.rpc(),
                status.code(),
                shorten(status.message(), 600),
                call.summary(),
                self.origin(call)
            )),
            Err(_) => {}
            Ok(reply) => {
                if !refuse_because.is_empty() {
                    self.accepted.push(format!(
                        "{} accepted despite {refuse_because:?}: {}",
                        call.rpc(),
                        call.summary()
                    ));
                }
                self.learn(call, reply);
            }
        }
    }

    /// Keeps track of what a successful request made or removed.
    fn learn(&mut self, call: &Call, reply: Reply) {
        match (call, reply) {
            // A retry gets the pod or container it made before: known already.
            (Call::RunPodSandbox(request), Reply::Pod(id))
                if !self.pods.iter().any(|p| p.id == id && !p.removed) =>
            {
                self.pods.push(RealPod {
                    id,
                    config: request.config.clone().unwrap_or_default(),
                    removed: false,
                });
            }
            (Call::CreateContainer(request), Reply::Container(id))
                if !self.containers.iter().any(|c| c.id == id) =>
            {
                self.containers.push(RealContainer {
                    id,
                    pod_id: request.pod_sandbox_id.clone(),
                    config: request.config.clone().unwrap_or_default(),
                    removed: false,
                });
            }
            (Call::RemovePodSandbox(request), _) => {
                for pod in &mut self.pods {
                    if pod.id.starts_with(&request.pod_sandbox_id)
                        && !request.pod_sandbox_id.is_empty()
                    {
                        pod.removed = true;
                        // Its containers went with it.
                        for c in &mut self.containers {
                            c.removed |= c.pod_id == pod.id;
                        }
                    }
                }
            }
            (Call::RemoveContainer(request), _) => {
                for c in &mut self.containers {
                    if c.id.starts_with(&request.container_id) && !request.container_id.is_empty() {
                        c.removed = true;
                    }
                }
            }
            _ => {}
        }
    }

    /// How the pod or container a request names was made, for a finding's reader.
    fn origin(&self, call: &Call) -> String {
        let container_id = match call {
            Call::StartContainer(r) => &r.container_id,
            Call::StopContainer(r) => &r.container_id,
            Call::RemoveContainer(r) => &r.container_id,
            Call::ContainerStatus(r) => &r.container_id,
            Call::ContainerStats(r) => &r.container_id,
            Call::UpdateContainerResources(r) => &r.container_id,
            Call::ReopenContainerLog(r) => &r.container_id,
            Call::ExecSync(r) => &r.container_id,
            Call::Exec(r) => &r.container_id,
            Call::Attach(r) => &r.container_id,
            _ => "",
        };
        let pod_id = match call {
            Call::StopPodSandbox(r) => r.pod_sandbox_id.as_str(),
            Call::RemovePodSandbox(r) => &r.pod_sandbox_id,
            Call::PodSandboxStatus(r) => &r.pod_sandbox_id,
            Call::PodSandboxStats(r) => &r.pod_sandbox_id,
            Call::UpdatePodSandboxResources(r) => &r.pod_sandbox_id,
            Call::PortForward(r) => &r.pod_sandbox_id,
            _ => self
                .containers
                .iter()
                .find(|c| c.id == container_id)
                .map_or("", |c| c.pod_id.as_str()),
        };
        let mut origin = String::new();
        if let Some(c) = self.containers.iter().find(|c| c.id == container_id) {
            origin += &format!(
                "\n    container config: {}",
                shorten(&format!("{:?}", c.config), 600)
            );
        }
        if let Some(p) = self.pods.iter().find(|p| p.id == pod_id) {
            origin += &format!(
                "\n    pod config: {}",
                shorten(&format!("{:?}", p.config), 600)
            );
        }
        origin
    }

    fn code_table(&self) -> String {
        let verbose = std::env::var_os("CRIUS_FUZZ_VERBOSE").is_some();
        self.codes
            .iter()
            .map(|(rpc, codes)| {
                let codes: Vec<String> = codes
                    .iter()
                    .map(|(code, n)| match self.samples.get(&(*rpc, code.clone())) {
                        Some(sample) if verbose => format!("{code} {n} (e.g. {sample:?})"),
                        _ => format!("{code} {n}"),
                    })
                    .collect();
                format!("  {rpc}: {}", codes.join(", "))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Whether an answer says the server broke, not that the request was bad: a server-fault
/// code, or a response the client could not even read (an oversized one, say).
fn is_server_fault(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Internal | Code::Unknown | Code::DataLoss | Code::Unavailable
    ) || status.message().contains("h2 protocol error")
        || status.message().contains("transport error")
}

fn shorten(text: &str, keep: usize) -> String {
    if text.len() <= keep {
        return text.to_string();
    }
    let mut cut = keep;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes)", &text[..cut], text.len())
}

// ---------------------------------------------------------------------------------------
// Odd values
// ---------------------------------------------------------------------------------------

/// Valid UTF-8 that is odd wherever an ID, a name, a path or a key goes.
const ODD_TEXT: &[&str] = &[
    "",
    " ",
    ".",
    "..",
    "../../../../etc/passwd",
    "/etc/passwd",
    "/",
    "a/b",
    "-",
    "*",
    "?",
    "\0",
    "a\0b",
    "\n",
    "\r\n",
    "\t",
    "\u{7f}",
    "\u{85}",
    "\u{202e}gpj.exe",
    "\u{feff}",
    "\u{fffd}\u{fffd}",
    "ünïcödé",
    "🦀",
    "%s%n%x",
    "${HOME}",
    "$(reboot)",
    "`id`",
    "=",
    "a=b",
    "sha256:",
    "sha256:0",
    "k8s.io",
    "0",
    "-1",
    "C:\\Windows",
    "\\xff\\xfe",
    "a:b:c",
    "@",
];

impl Fuzzer {
    fn coin(&mut self) -> bool {
        self.rng.random_bool(0.5)
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items.choose(&mut self.rng).expect("a choice").clone()
    }

    fn next_name(&mut self, kind: &str) -> String {
        self.names += 1;
        format!("fuzz-{kind}-{}", self.names)
    }

    /// An odd string: a known odd one, a huge one, random code points, hex, or a known ID
    /// with something added.
    fn text(&mut self) -> String {
        match self.rng.random_range(0..20) {
            0..=10 => self.pick(ODD_TEXT).to_string(),
            11 => {
                let len = self.pick(&[256, 4097, 65_536, 65_536, 1 << 20]);
                "x".repeat(len)
            }
            12..=14 => {
                let len = self.rng.random_range(1..40);
                (0..len)
                    .map(|_| {
                        char::from_u32(self.rng.random_range(0..0x11000)).unwrap_or('\u{fffd}')
                    })
                    .collect()
            }
            15..=17 => {
                let len = self.rng.random_range(1..=64);
                (0..len)
                    .map(|_| char::from_digit(self.rng.random_range(0..16), 16).unwrap_or('0'))
                    .collect()
            }
            _ => {
                let known = self.known_id().unwrap_or_default();
                let junk = self.pick(&["/..", "\0", " ", "x", "/", "*"]);
                format!("{known}{junk}")
            }
        }
    }

    fn known_id(&mut self) -> Option<String> {
        let ids: Vec<String> = self
            .pods
            .iter()
            .map(|p| p.id.clone())
            .chain(self.containers.iter().map(|c| c.id.clone()))
            .collect();
        ids.choose(&mut self.rng).cloned()
    }

    /// An ID that names nothing, or a prefix of something, or junk.
    fn garbage_id(&mut self) -> String {
        match self.rng.random_range(0..6) {
            0 => format!("{:064x}", self.rng.random::<u128>()),
            1 => {
                let known = self.known_id().unwrap_or_default();
                let keep = self.rng.random_range(0..=known.len().min(8));
                known[..keep].to_string()
            }
            2 => self.known_id().unwrap_or_default().to_uppercase(),
            _ => self.text(),
        }
    }

    /// Mostly a pod the fuzzer made (ready, stopped or removed), else garbage.
    fn pod_id(&mut self) -> String {
        let removed: Vec<bool> = self.pods.iter().map(|p| p.removed).collect();
        match self.pick_known(&removed) {
            Some(i) => self.pods[i].id.clone(),
            None => self.garbage_id(),
        }
    }

    /// Mostly a container the fuzzer made (in any state), else garbage.
    fn container_id(&mut self) -> String {
        let removed: Vec<bool> = self.containers.iter().map(|c| c.removed).collect();
        match self.pick_known(&removed) {
            Some(i) => self.containers[i].id.clone(),
            None => self.garbage_id(),
        }
    }

    /// An index into things the fuzzer made (each removed or not) 70% of the time, one not
    /// removed mostly, so requests meet every state and not only the end of the story.
    fn pick_known(&mut self, removed: &[bool]) -> Option<usize> {
        if removed.is_empty() || !self.rng.random_bool(0.7) {
            return None;
        }
        let present: Vec<usize> = (0..removed.len()).filter(|&i| !removed[i]).collect();
        if !present.is_empty() && self.rng.random_bool(0.8) {
            present.choose(&mut self.rng).copied()
        } else {
            Some(self.rng.random_range(0..removed.len()))
        }
    }

    fn timeout(&mut self) -> i64 {
        self.pick(&[0, 1, 2, -1, -30, i64::MIN, i64::MAX, 1 << 40])
    }

    fn odd_map(&mut self) -> HashMap<String, String> {
        (0..self.rng.random_range(0..3))
            .map(|_| (self.text(), self.text()))
            .collect()
    }

    fn pod_filter(&mut self) -> Option<PodSandboxFilter> {
        self.coin().then(|| PodSandboxFilter {
            id: self.garbage_id(),
            state: self.coin().then(|| PodSandboxStateValue {
                state: self.pick(&[0, 1, 2, -1, 99]),
            }),
            label_selector: self.odd_map(),
        })
    }

    fn container_filter(&mut self) -> Option<ContainerFilter> {
        self.coin().then(|| ContainerFilter {
            id: self.garbage_id(),
            state: self.coin().then(|| ContainerStateValue {
                state: self.pick(&[0, 1, 2, 3, -1, 99]),
            }),
            pod_sandbox_id: self.garbage_id(),
            label_selector: self.odd_map(),
        })
    }

    fn stats_filter(&mut self) -> Option<ContainerStatsFilter> {
        self.coin().then(|| ContainerStatsFilter {
            id: self.garbage_id(),
            pod_sandbox_id: self.garbage_id(),
            label_selector: self.odd_map(),
        })
    }

    fn pod_stats_filter(&mut self) -> Option<PodSandboxStatsFilter> {
        self.coin().then(|| PodSandboxStatsFilter {
            id: self.garbage_id(),
            label_selector: self.odd_map(),
        })
    }

    /// An image spec that names no image crius has (never a real registry name, so no
    /// request leaves the machine).
    fn odd_image_spec(&mut self) -> Option<ImageSpec> {
        self.coin().then(|| ImageSpec {
            image: pick!(
                self,
                [
                    String::new(),
                    self.text(),
                    format!("{}/never-pulled:latest", registry()),
                    "sha256:".to_string(),
                    format!("sha256:{:064x}", 7),
                ]
            ),
            annotations: self.odd_map(),
            user_specified_image: self.text(),
            runtime_handler: self.text(),
            image_ref: self.text(),
        })
    }

    fn image_filter(&mut self) -> Option<ImageFilter> {
        self.coin().then(|| ImageFilter {
            image: self.odd_image_spec(),
        })
    }

    /// Resources with one value the kernel or the OCI runtime would refuse (`true`), or an
    /// odd but possible one (`false`).
    fn odd_resources(&mut self) -> (LinuxContainerResources, Option<&'static str>) {
        let mut resources = LinuxContainerResources::default();
        let (name, mutate) = *RESOURCE_MUTATIONS
            .choose(&mut self.rng)
            .expect("a mutation");
        let bad = mutate(self, &mut resources);
        (resources, because(bad, name))
    }
}

fn registry() -> String {
    common::Testbed::from_env().registry
}

/// Mutations that another one (`odd name`, `odd image`, `odd log path`...) would undo if it
/// ran after them: they run last.
const TAKE_AWAY: &[&str] = &[
    "no metadata",
    "empty name",
    "empty namespace",
    "empty uid",
    "no image",
    "log path outside the log directory",
];

/// A change to a request: `true` when it makes the request one crius must refuse.
type Mutation<R> = (&'static str, fn(&mut Fuzzer, &mut R) -> bool);

const RESOURCE_MUTATIONS: &[Mutation<LinuxContainerResources>] = &[
    ("malformed cpuset", |f, r| {
        r.cpuset_cpus = f
            .pick(&["1,,2", ",", "0-", "-1", "3-1", "a", "0-99999999", "1 2"])
            .into();
        true
    }),
    ("malformed memory nodes", |f, r| {
        r.cpuset_mems = f.pick(&["0,,", "x", "2-1", "99999999"]).into();
        true
    }),
    ("oom_score_adj out of range", |f, r| {
        r.oom_score_adj = f.pick(&[-1001, 1001, i64::MIN, i64::MAX]);
        true
    }),
    ("cpu shares out of range", |f, r| {
        r.cpu_shares = f.pick(&[-1, i64::MIN, 262_145, i64::MAX]);
        true
    }),
    ("cpu period out of range", |f, r| {
        r.cpu_period = f.pick(&[-1, 1, 999, 1_000_001, i64::MAX, i64::MIN]);
        true
    }),
    ("cpu quota too small", |f, r| {
        r.cpu_quota = f.pick(&[-2, 1, 999, i64::MIN]);
        true
    }),
    ("cpu quota huge", |f, r| {
        r.cpu_quota = f.pick(&[i64::MAX, 1 << 50]);
        false
    }),
    ("negative memory", |f, r| {
        r.memory_limit_in_bytes = f.pick(&[-1, i64::MIN]);
        true
    }),
    ("huge memory", |_, r| {
        r.memory_limit_in_bytes = i64::MAX;
        false
    }),
    ("swap below -1", |f, r| {
        r.memory_swap_limit_in_bytes = f.pick(&[-2, i64::MIN]);
        true
    }),
    ("swap below memory", |_, r| {
        r.memory_limit_in_bytes = 64 << 20;
        r.memory_swap_limit_in_bytes = 1 << 20;
        false
    }),
    ("malformed hugepage size", |f, r| {
        r.hugepage_limits.push(HugepageLimit {
            page_size: f.pick(&["", "2XB", "MB", "-2MB", "2mb", "2 MB"]).into(),
            limit: f.rng.random(),
        });
        true
    }),
    ("unified key that is a path", |f, r| {
        r.unified.insert(
            f.pick(&["", "../../x", ".hidden", "a/b", "ünï"]).into(),
            "1".into(),
        );
        true
    }),
    ("odd unified value", |f, r| {
        r.unified.insert("memory.nonexistent".into(), f.text());
        false
    }),
];

// ---------------------------------------------------------------------------------------
// Malformed requests
// ---------------------------------------------------------------------------------------

const POD_MUTATIONS: &[Mutation<PodSandboxConfig>] = &[
    ("no metadata", |_, c| {
        c.metadata = None;
        true
    }),
    ("empty name", |_, c| {
        meta(c).name.clear();
        true
    }),
    ("empty namespace", |_, c| {
        meta(c).namespace.clear();
        true
    }),
    ("empty uid", |_, c| {
        meta(c).uid.clear();
        true
    }),
    ("odd name", |f, c| {
        meta(c).name = f.text();
        !is_pod_name(&meta(c).name)
    }),
    ("odd namespace and uid", |f, c| {
        meta(c).namespace = f.text();
        meta(c).uid = f.text();
        !is_pod_name(&meta(c).namespace) || !is_pod_name(&meta(c).uid)
    }),
    ("huge attempt", |_, c| {
        meta(c).attempt = u32::MAX;
        false
    }),
    ("odd hostname", |f, c| {
        c.hostname = f.text();
        c.hostname.len() > 64 || has_control(&c.hostname)
    }),
    ("odd log directory", |f, c| {
        // Absolute ones stay under the test's directory: logs outlive their containers.
        let text = f.text();
        c.log_directory = if text.starts_with('/') {
            format!("{}/odd{text}", f.log_root.display())
        } else {
            text
        };
        !c.log_directory.is_empty() && !is_absolute_path(&c.log_directory)
    }),
    ("odd DNS config", |f, c| {
        let dns = DnsConfig {
            servers: vec![f.text()],
            searches: vec![f.text()],
            options: vec![f.text()],
        };
        let bad = dns
            .servers
            .iter()
            .chain(&dns.searches)
            .chain(&dns.options)
            .any(|v| has_control(v));
        c.dns_config = Some(dns);
        bad
    }),
    ("port mapping out of range", |f, c| {
        let mapping = PortMapping {
            protocol: f.pick(&[0, 1, 2, 99, -1]),
            container_port: f.pick(&[-1, 0, 65_536, i32::MAX, i32::MIN, 80]),
            host_port: f.pick(&[-1, 0, 65_536, i32::MIN, 8080]),
            host_ip: pick!(f, [String::new(), "127.0.0.1".into(), f.text()]),
        };
        let bad = !(1..=65_535).contains(&mapping.container_port)
            || !(0..=65_535).contains(&mapping.host_port)
            || !(0..=2).contains(&mapping.protocol)
            || !(mapping.host_ip.is_empty() || mapping.host_ip.parse::<std::net::IpAddr>().is_ok());
        c.port_mappings.push(mapping);
        bad
    }),
    ("odd labels", |f, c| {
        c.labels.extend(f.odd_map());
        c.labels.iter().any(|(k, v)| !is_label(k, v))
    }),
    ("label too long for containerd", |f, c| {
        // A key no other mutation writes: "odd labels" must not overwrite the value.
        let key = format!("fuzz.crius/too-long-{}", f.text().len());
        c.labels.insert(key, "v".repeat(5000));
        true
    }),
    ("odd annotations", |f, c| {
        c.annotations = f.odd_map();
        false
    }),
    ("odd cgroup parent", |f, c| {
        linux(c).cgroup_parent = pick!(f, ["../../../..".into(), "relative".into(), f.text()]);
        false
    }),
    ("sysctl that is not namespaced", |f, c| {
        let key: String = f
            .pick(&[
                "vm.swappiness",
                "kernel.panic",
                "",
                "../../x",
                "fs.file-max",
            ])
            .into();
        linux(c).sysctls.insert(key, "1".into());
        true
    }),
    ("odd sysctl value", |f, c| {
        let key: String = f
            .pick(&[
                "net.ipv4.ip_forward",
                "net.nonexistent.key",
                "kernel.shmmax",
            ])
            .into();
        linux(c).sysctls.insert(key, f.text());
        false
    }),
    ("pod resources out of range", |f, c| {
        let (resources, bad) = f.odd_resources();
        linux(c).resources = Some(resources);
        bad.is_some()
    }),
    ("pod overhead out of range", |f, c| {
        let (resources, bad) = f.odd_resources();
        linux(c).overhead = Some(resources);
        bad.is_some()
    }),
    ("namespace mode out of range", |f, c| {
        let options = NamespaceOption {
            network: f.pick(&[0, 2, 3, 99, -1]),
            pid: f.pick(&[0, 1, 2, 3, 99, -1]),
            ipc: f.pick(&[0, 2, 99]),
            target_id: f.garbage_id(),
            userns_options: None,
        };
        // POD, CONTAINER and NODE; TARGET names a container, never a pod.
        let bad = [options.network, options.pid, options.ipc]
            .iter()
            .any(|mode| !(0..=2).contains(mode));
        let userns_options = security(c)
            .namespace_options
            .take()
            .and_then(|o| o.userns_options);
        security(c).namespace_options = Some(NamespaceOption {
            userns_options,
            ..options
        });
        bad
    }),
    ("own user namespace", |f, c| {
        let userns = UserNamespace {
            mode: f.pick(&[0, 3, 99]),
            uids: vec![IdMapping {
                host_id: f.rng.random(),
                container_id: 0,
                length: f.rng.random(),
            }],
            gids: Vec::new(),
        };
        security(c)
            .namespace_options
            .get_or_insert_with(Default::default)
            .userns_options = Some(userns);
        true
    }),
    ("user out of range", |f, c| {
        security(c).run_as_user = Some(Int64Value {
            value: f.pick(&[-1, i64::MIN, 1 << 40]),
        });
        true
    }),
    ("group without a user", |f, c| {
        security(c).run_as_group = Some(Int64Value {
            value: f.pick(&[0, 1000]),
        });
        true
    }),
    ("odd supplemental groups", |f, c| {
        security(c).supplemental_groups = vec![f.pick(&[-1, i64::MIN, 1 << 40, 0])];
        security(c).supplemental_groups_policy = f.pick(&[0, 1, 99]);
        false
    }),
    ("unknown seccomp profile", |f, c| {
        security(c).seccomp = Some(SecurityProfile {
            profile_type: f.pick(&[2, 99, -1]),
            localhost_ref: pick!(f, ["/nonexistent/profile.json".into(), f.text()]),
        });
        true
    }),
    ("unknown AppArmor profile", |f, c| {
        // The pause process runs unconfined: a pod-level profile is the containers' default,
        // which kubelet resolves for each container.
        security(c).apparmor = Some(SecurityProfile {
            profile_type: f.pick(&[2, 99]),
            localhost_ref: f.text(),
        });
        false
    }),
    ("odd SELinux options", |f, c| {
        security(c).selinux_options = Some(SeLinuxOption {
            user: f.text(),
            role: f.text(),
            r#type: f.text(),
            level: f.text(),
        });
        false
    }),
    ("a Windows config", |f, c| {
        c.windows = Some(WindowsPodSandboxConfig {
            security_context: Some(WindowsSandboxSecurityContext {
                run_as_username: f.text(),
                credential_spec: f.text(),
                host_process: true,
                namespace_options: None,
            }),
        });
        false
    }),
];

/// What containerd keeps as a label: a key, at most 4096 bytes with its value.
fn is_label(key: &str, value: &str) -> bool {
    !key.is_empty() && key.len() + value.len() <= 4096
}

fn has_control(text: &str) -> bool {
    text.chars().any(char::is_control)
}

/// What a pod's name, namespace and UID may be: CNI carries them in `CNI_ARGS`.
fn is_pod_name(text: &str) -> bool {
    !text.is_empty() && text.len() <= 253 && !has_control(text) && !text.contains([';', '='])
}

fn is_absolute_path(text: &str) -> bool {
    text.starts_with('/') && !text.contains('\0')
}

fn meta(c: &mut PodSandboxConfig) -> &mut PodSandboxMetadata {
    c.metadata.get_or_insert_with(Default::default)
}

fn linux(c: &mut PodSandboxConfig) -> &mut LinuxPodSandboxConfig {
    c.linux.get_or_insert_with(Default::default)
}

fn security(c: &mut PodSandboxConfig) -> &mut LinuxSandboxSecurityContext {
    linux(c)
        .security_context
        .get_or_insert_with(Default::default)
}

const CONTAINER_MUTATIONS: &[Mutation<ContainerConfig>] = &[
    ("no metadata", |_, c| {
        c.metadata = None;
        true
    }),
    ("empty name", |_, c| {
        cmeta(c).name.clear();
        true
    }),
    ("odd name", |f, c| {
        cmeta(c).name = f.text();
        cmeta(c).name.is_empty() || cmeta(c).name.len() > 253 || has_control(&cmeta(c).name)
    }),
    ("huge attempt", |_, c| {
        cmeta(c).attempt = u32::MAX;
        false
    }),
    ("no image", |f, c| {
        c.image = f.pick(&[
            None,
            Some(ImageSpec::default()),
            Some(ImageSpec {
                image: format!("{}/never-pulled:latest", registry()),
                ..Default::default()
            }),
        ]);
        true
    }),
    ("odd image", |f, c| {
        c.image = f.odd_image_spec();
        false
    }),
    ("odd command", |f, c| {
        c.command = vec![f.text()];
        c.args = vec![f.text(), f.text()];
        c.command.iter().chain(&c.args).any(|a| a.contains('\0'))
    }),
    ("odd working dir", |f, c| {
        c.working_dir = pick!(f, ["relative".into(), "..".into(), f.text()]);
        !c.working_dir.is_empty() && !c.working_dir.starts_with('/')
    }),
    ("odd environment", |f, c| {
        let env = KeyValue {
            key: f.text(),
            value: pick!(f, [f.text().into_bytes(), vec![0xff, 0xfe, 0, b'\n']]),
        };
        let bad = env.key.is_empty() || env.key.contains(['=', '\0']) || env.value.contains(&0);
        c.envs.push(env);
        bad
    }),
    ("mount without a container path", |_, c| {
        c.mounts.push(Mount {
            container_path: String::new(),
            host_path: "/tmp".into(),
            ..Default::default()
        });
        true
    }),
    ("mount of a missing host path", |f, c| {
        c.mounts.push(Mount {
            container_path: "/data".into(),
            host_path: f.pick(&["/nonexistent/fuzz", "", "relative/path"]).into(),
            ..Default::default()
        });
        true
    }),
    ("odd mount", |f, c| {
        let mount = Mount {
            container_path: pick!(
                f,
                ["relative".into(), "/../../etc".into(), "/".into(), f.text()]
            ),
            host_path: f.pick(&["/tmp", "/proc", "/"]).into(),
            readonly: f.coin(),
            selinux_relabel: f.coin(),
            propagation: f.pick(&[0, 1, 2, 99, -1]),
            uid_mappings: Vec::new(),
            gid_mappings: Vec::new(),
            recursive_read_only: f.coin(),
            image: None,
            image_sub_path: String::new(),
        };
        // Inside the container, never over its root.
        let destination = &mount.container_path;
        let bad = !is_absolute_path(destination)
            || destination.split('/').any(|part| part == "..")
            || destination.split('/').all(str::is_empty);
        c.mounts.push(mount);
        bad
    }),
    ("image volume of an unknown image", |f, c| {
        c.mounts.push(Mount {
            container_path: "/image".into(),
            image: f.odd_image_spec().or_else(|| Some(ImageSpec::default())),
            image_sub_path: pick!(f, ["".into(), "../..".into(), f.text()]),
            ..Default::default()
        });
        true
    }),
    ("odd device", |f, c| {
        let device = Device {
            container_path: pick!(
                f,
                ["relative".into(), "".into(), "/dev/fuzz".into(), f.text()]
            ),
            host_path: f
                .pick(&["/dev/null", "/dev/nonexistent", "/etc/passwd", ""])
                .into(),
            permissions: f.pick(&["rwm", "xyz", "", "rrrr"]).into(),
        };
        let bad = !is_absolute_path(&device.container_path)
            || device.host_path != "/dev/null"
            || !device.permissions.chars().all(|p| "rwm".contains(p));
        c.devices.push(device);
        bad
    }),
    ("odd labels and annotations", |f, c| {
        c.labels.extend(f.odd_map());
        c.annotations = f.odd_map();
        c.labels.iter().any(|(k, v)| !is_label(k, v))
    }),
    ("label too long for containerd", |f, c| {
        // A key no other mutation writes: "odd labels" must not overwrite the value.
        let key = format!("fuzz.crius/too-long-{}", f.text().len());
        c.labels.insert(key, "v".repeat(5000));
        true
    }),
    ("log path outside the log directory", |f, c| {
        c.log_path = f
            .pick(&["../../escape.log", "/etc/evil.log", "a/../../b.log"])
            .into();
        true
    }),
    ("odd log path", |f, c| {
        c.log_path = f.text();
        // It must name a file inside the pod's log directory.
        let segments: Vec<&str> = c.log_path.split('/').collect();
        !c.log_path.is_empty()
            && (c.log_path.contains('\0')
                || segments.contains(&"..")
                || segments.iter().any(|s| s.len() > 255)
                || matches!(segments.last(), Some(&("" | "." | ".."))))
    }),
    ("odd stdio", |f, c| {
        c.stdin = f.coin();
        c.stdin_once = f.coin();
        c.tty = f.coin();
        false
    }),
    ("container resources out of range", |f, c| {
        let (resources, bad) = f.odd_resources();
        clinux(c).resources = Some(resources);
        bad.is_some()
    }),
    ("unknown capability", |f, c| {
        csecurity(c).capabilities = Some(Capability {
            add_capabilities: vec![pick!(f, ["CAP_NONSENSE".into(), "".into(), f.text()])],
            drop_capabilities: vec![f.text()],
            add_ambient_capabilities: vec![f.text()],
        });
        true
    }),
    ("user out of range", |f, c| {
        csecurity(c).run_as_user = Some(Int64Value {
            value: f.pick(&[-1, i64::MIN, 1 << 40]),
        });
        true
    }),
    ("unknown user name", |f, c| {
        // Names busybox's /etc/passwd does not have (odd text might be "0", a uid).
        csecurity(c).run_as_username = f.pick(&["nosuchuser", "no such user", "ünïcödé"]).into();
        true
    }),
    ("group without a user", |_, c| {
        csecurity(c).run_as_group = Some(Int64Value { value: 1000 });
        true
    }),
    ("privileged in an unprivileged pod", |_, c| {
        csecurity(c).privileged = true;
        true
    }),
    ("odd masked and read-only paths", |f, c| {
        csecurity(c).masked_paths = vec![f.text()];
        csecurity(c).readonly_paths = vec![f.text()];
        let security = csecurity(c);
        security
            .masked_paths
            .iter()
            .chain(&security.readonly_paths)
            .any(|p| !is_absolute_path(p))
    }),
    ("unknown seccomp profile", |f, c| {
        csecurity(c).seccomp = Some(SecurityProfile {
            profile_type: f.pick(&[2, 99, -1]),
            localhost_ref: f.pick(&[
                "/nonexistent/profile.json".into(),
                "../../etc/passwd".into(),
            ]),
        });
        true
    }),
    ("unknown AppArmor profile", |f, c| {
        csecurity(c).apparmor = Some(SecurityProfile {
            profile_type: f.pick(&[2, 99]),
            localhost_ref: f.text(),
        });
        true
    }),
    ("PID namespace of an unknown target", |f, c| {
        csecurity(c).namespace_options = Some(NamespaceOption {
            pid: 3,
            target_id: f.garbage_id(),
            ..Default::default()
        });
        false
    }),
    ("odd supplemental groups", |f, c| {
        csecurity(c).supplemental_groups = vec![f.pick(&[-1, i64::MIN, 1 << 40, 0])];
        csecurity(c).supplemental_groups_policy = f.pick(&[0, 1, 99]);
        false
    }),
    ("stop signal out of range", |f, c| {
        c.stop_signal = f.pick(&[-1, 99, 1000]);
        false
    }),
    ("odd CDI devices", |f, c| {
        c.cdi_devices = vec![CdiDevice { name: f.text() }];
        false
    }),
    ("a Windows config", |f, c| {
        c.windows = Some(WindowsContainerConfig {
            resources: Some(WindowsContainerResources {
                cpu_shares: -1,
                cpu_count: i64::MAX,
                ..Default::default()
            }),
            security_context: Some(WindowsContainerSecurityContext {
                run_as_username: f.text(),
                credential_spec: f.text(),
                host_process: true,
            }),
        });
        false
    }),
];

fn cmeta(c: &mut ContainerConfig) -> &mut ContainerMetadata {
    c.metadata.get_or_insert_with(Default::default)
}

fn clinux(c: &mut ContainerConfig) -> &mut LinuxContainerConfig {
    c.linux.get_or_insert_with(Default::default)
}

fn csecurity(c: &mut ContainerConfig) -> &mut LinuxContainerSecurityContext {
    clinux(c)
        .security_context
        .get_or_insert_with(Default::default)
}

impl Fuzzer {
    /// Applies one to three different mutations, those that take something away last (so
    /// no other one puts it back); the names of those that made the request certainly
    /// invalid.
    fn mutate<R>(&mut self, table: &[Mutation<R>], target: &mut R) -> Vec<&'static str> {
        let count = self.rng.random_range(1..=3);
        let mut chosen: Vec<Mutation<R>> = table
            .choose_multiple(&mut self.rng, count)
            .copied()
            .collect();
        chosen.sort_by_key(|(name, _)| TAKE_AWAY.contains(name));
        let mut bad = Vec::new();
        for (name, mutate) in chosen {
            if mutate(self, target) {
                bad.push(name);
            }
        }
        bad
    }

    /// A pod config that works: the test network, logs under the test's directory.
    fn real_pod_config(&mut self) -> PodSandboxConfig {
        let name = self.next_name("pod");
        let mut config = common::pod_config(&name);
        config.log_directory = self.log_root.join(&name).display().to_string();
        config
    }

    fn real_container_config(&mut self) -> ContainerConfig {
        let name = self.next_name("ctr");
        container(&name, "busybox:latest", SLEEPER)
    }

    fn malformed_run_pod(&mut self) -> Case {
        let mut config = self.real_pod_config();
        let mut bad = self.mutate(POD_MUTATIONS, &mut config);
        let runtime_handler = match self.rng.random_range(0..6) {
            0 => self.pick(&[
                "nonexistent-handler".to_string(),
                " ".into(),
                "runc/..".into(),
            ]),
            1 => self.text(),
            _ => String::new(),
        };
        bad.extend(because(
            !matches!(runtime_handler.as_str(), "" | "runc"),
            "unknown runtime handler",
        ));
        let config = if self.rng.random_bool(0.05) {
            bad.push("no config");
            None
        } else {
            Some(config)
        };
        Case::refused_if(
            bad,
            Call::RunPodSandbox(RunPodSandboxRequest {
                config,
                runtime_handler,
            }),
        )
    }

    /// A pod of the fuzzer's for a container: a live one mostly, any otherwise.
    fn some_pod(&mut self) -> Option<(String, PodSandboxConfig)> {
        let live: Vec<usize> = (0..self.pods.len())
            .filter(|&i| !self.pods[i].removed)
            .collect();
        let i = if !live.is_empty() && self.rng.random_bool(0.8) {
            *live.choose(&mut self.rng)?
        } else if !self.pods.is_empty() {
            self.rng.random_range(0..self.pods.len())
        } else {
            return None;
        };
        Some((self.pods[i].id.clone(), self.pods[i].config.clone()))
    }

    fn malformed_create_container(&mut self) -> Case {
        let mut config = self.real_container_config();
        let mut bad = self.mutate(CONTAINER_MUTATIONS, &mut config);
        let (pod_sandbox_id, sandbox_config) = match self.some_pod() {
            Some((id, config)) if self.rng.random_bool(0.9) => (id, Some(config)),
            _ => {
                bad.push("unknown pod");
                (format!("{:064x}", self.rng.random::<u128>()), None)
            }
        };
        let sandbox_config = if self.rng.random_bool(0.1) {
            None
        } else {
            sandbox_config
        };
        Case::refused_if(
            bad,
            Call::CreateContainer(CreateContainerRequest {
                pod_sandbox_id,
                config: Some(config),
                sandbox_config,
            }),
        )
    }

    fn malformed_update_container(&mut self) -> Case {
        let container_id = self.container_id();
        let (resources, bad) = self.odd_resources();
        let (linux, bad) = if self.rng.random_bool(0.1) {
            (None, Some("no linux resources"))
        } else {
            (Some(resources), bad)
        };
        let windows = self.coin().then(|| WindowsContainerResources {
            cpu_shares: -1,
            memory_limit_in_bytes: i64::MIN,
            ..Default::default()
        });
        Case::refused_if(
            bad.into_iter().collect(),
            Call::UpdateContainerResources(UpdateContainerResourcesRequest {
                container_id,
                linux,
                windows,
                annotations: self.odd_map(),
            }),
        )
    }

    fn malformed_update_pod(&mut self) -> Case {
        let pod_sandbox_id = self.pod_id();
        let (resources, bad) = self.odd_resources();
        let mut bad: Vec<&str> = bad.into_iter().collect();
        let overhead = if self.coin() {
            let (overhead, overhead_bad) = self.odd_resources();
            bad.extend(overhead_bad);
            Some(overhead)
        } else {
            None
        };
        Case::refused_if(
            bad,
            Call::UpdatePodSandboxResources(UpdatePodSandboxResourcesRequest {
                pod_sandbox_id,
                overhead,
                resources: Some(resources),
            }),
        )
    }

    fn malformed_exec_sync(&mut self) -> Case {
        let container_id = self.container_id();
        let cmd = self.command();
        Case::refused_if(
            because(cmd.is_empty(), "no command").into_iter().collect(),
            Call::ExecSync(ExecSyncRequest {
                container_id,
                cmd,
                timeout: self.pick(&[0, 1, -1, i64::MIN, i64::MAX]),
            }),
        )
    }

    /// A command for an exec: some work, some fail, some are junk; none runs long.
    fn command(&mut self) -> Vec<String> {
        let strings = |words: &[&str]| words.iter().map(|w| w.to_string()).collect();
        match self.rng.random_range(0..8) {
            0 => Vec::new(),
            1 => strings(&["true"]),
            2 => strings(&["sh", "-c", "echo out; echo err >&2; exit 3"]),
            3 => strings(&["/nonexistent/binary"]),
            4 => strings(&[""]),
            5 => strings(&["/etc/passwd"]),
            _ => vec![self.text(), self.text()],
        }
    }

    /// Which stdio flags make an exec or attach request malformed.
    fn stdio_faults(stdin: bool, stdout: bool, stderr: bool, tty: bool) -> Vec<&'static str> {
        [
            because(!(stdin || stdout || stderr), "no stdio"),
            because(tty && stderr, "tty and stderr"),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    fn malformed_exec(&mut self) -> Case {
        let (stdin, stdout, stderr, tty) = (self.coin(), self.coin(), self.coin(), self.coin());
        let cmd = self.command();
        let mut bad = Self::stdio_faults(stdin, stdout, stderr, tty);
        bad.extend(because(cmd.is_empty(), "no command"));
        Case::refused_if(
            bad,
            Call::Exec(ExecRequest {
                container_id: self.container_id(),
                cmd,
                tty,
                stdin,
                stdout,
                stderr,
            }),
        )
    }

    fn malformed_attach(&mut self) -> Case {
        let (stdin, stdout, stderr, tty) = (self.coin(), self.coin(), self.coin(), self.coin());
        Case::refused_if(
            Self::stdio_faults(stdin, stdout, stderr, tty),
            Call::Attach(AttachRequest {
                container_id: self.container_id(),
                stdin,
                tty,
                stdout,
                stderr,
            }),
        )
    }

    fn malformed_port_forward(&mut self) -> Case {
        let port: Vec<i32> = (0..self.rng.random_range(0..3))
            .map(|_| self.pick(&[-1, 0, 80, 65_535, 65_536, i32::MAX, i32::MIN]))
            .collect();
        let bad = port.iter().any(|p| !(1..=65_535).contains(p));
        Case::refused_if(
            because(bad, "port out of range").into_iter().collect(),
            Call::PortForward(PortForwardRequest {
                pod_sandbox_id: self.pod_id(),
                port,
            }),
        )
    }

    fn malformed_runtime_config(&mut self) -> Case {
        let pod_cidr = pick!(
            self,
            [
                "10.0.0.0/33".to_string(),
                "not-a-cidr".into(),
                "10.0.0.0/24,,".into(),
                "::/129".into(),
                self.text(),
            ]
        );
        let is_cidr = pod_cidr.split(',').all(|c| {
            c.trim().split_once('/').is_some_and(|(ip, bits)| {
                let bits: Option<u8> = bits.parse().ok();
                match ip.parse::<std::net::IpAddr>() {
                    Ok(std::net::IpAddr::V4(_)) => bits.is_some_and(|b| b <= 32),
                    Ok(std::net::IpAddr::V6(_)) => bits.is_some_and(|b| b <= 128),
                    Err(_) => false,
                }
            })
        });
        Case::refused_if(
            because(!pod_cidr.is_empty() && !is_cidr, "not a CIDR")
                .into_iter()
                .collect(),
            Call::UpdateRuntimeConfig(UpdateRuntimeConfigRequest {
                runtime_config: Some(RuntimeConfig {
                    network_config: Some(NetworkConfig { pod_cidr }),
                }),
            }),
        )
    }

    /// A pull that never leaves the machine: a malformed reference, or a name the test
    /// registry does not have, with odd credentials.
    fn malformed_pull(&mut self) -> Case {
        let registry = registry();
        let (image, bad) = match self.rng.random_range(0..8) {
            0 => (String::new(), Some("no image")),
            1 => (format!("{registry}/BusyBox:latest"), Some("upper case")),
            2 => (format!("{registry}/busybox@sha256:xyz"), Some("bad digest")),
            3 => (format!("{registry}/busybox:bad tag"), Some("bad tag")),
            4 => (
                format!("{registry}/never-pulled:latest"),
                Some("no such image"),
            ),
            5 => (
                format!("{registry}/busybox@sha256:{:064x}", 7),
                Some("no such digest"),
            ),
            6 => (format!("{registry}/{}", self.text()), None),
            _ => (format!("{registry}/busybox:{}", self.pick(ODD_TEXT)), None),
        };
        let auth = self.coin().then(|| AuthConfig {
            username: self.text(),
            password: self.text(),
            auth: self.pick(&["!!not base64".to_string(), "Zm9v".into(), String::new()]),
            server_address: pick!(self, [String::new(), registry.clone(), self.text()]),
            identity_token: String::new(),
            registry_token: String::new(),
        });
        Case::refused_if(
            bad.into_iter().collect(),
            Call::PullImage(PullImageRequest {
                image: Some(ImageSpec {
                    image,
                    annotations: self.odd_map(),
                    user_specified_image: self.text(),
                    runtime_handler: self.text(),
                    image_ref: String::new(),
                }),
                auth,
                sandbox_config: None,
            }),
        )
    }
}

// ---------------------------------------------------------------------------------------
// Valid-looking requests in the wrong order
// ---------------------------------------------------------------------------------------

impl Fuzzer {
    /// A lifecycle request on one of the fuzzer's real pods or containers, whatever state it
    /// is in: start before create, exec on a stopped container, remove a running pod, stop
    /// twice, create in a removed pod, update a removed container, reopen the log of a
    /// created container, attach to an exited one...
    fn out_of_order(&mut self) -> Case {
        let pod_id = self.pod_id();
        let container_id = self.container_id();
        match self.rng.random_range(0..20) {
            0 => self.run_real_pod(),
            1 | 18 | 19 => self.create_real_container(),
            2 | 3 => Case::any(Call::StartContainer(StartContainerRequest { container_id })),
            4 => Case::any(Call::StopContainer(StopContainerRequest {
                container_id,
                timeout: self.pick(&[0, 1, 30, i64::MAX]),
            })),
            5 => Case::any(Call::RemoveContainer(RemoveContainerRequest {
                container_id,
            })),
            6 => Case::any(Call::ExecSync(ExecSyncRequest {
                container_id,
                cmd: vec!["true".into()],
                timeout: 5,
            })),
            7 => Case::any(Call::Exec(ExecRequest {
                container_id,
                cmd: vec!["sh".into()],
                stdout: true,
                ..Default::default()
            })),
            8 => Case::any(Call::Attach(AttachRequest {
                container_id,
                stdout: true,
                stderr: true,
                ..Default::default()
            })),
            9 => Case::any(Call::ReopenContainerLog(ReopenContainerLogRequest {
                container_id,
            })),
            10 => Case::any(Call::UpdateContainerResources(
                UpdateContainerResourcesRequest {
                    container_id,
                    linux: Some(LinuxContainerResources {
                        cpu_shares: 512,
                        memory_limit_in_bytes: 128 << 20,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )),
            11 if self.rng.random_bool(0.3) => {
                Case::any(Call::StopPodSandbox(StopPodSandboxRequest {
                    pod_sandbox_id: pod_id,
                }))
            }
            12 if self.rng.random_bool(0.3) => {
                Case::any(Call::RemovePodSandbox(RemovePodSandboxRequest {
                    pod_sandbox_id: pod_id,
                }))
            }
            13 => Case::any(Call::PortForward(PortForwardRequest {
                pod_sandbox_id: pod_id,
                port: vec![80],
            })),
            14 => Case::any(Call::UpdatePodSandboxResources(
                UpdatePodSandboxResourcesRequest {
                    pod_sandbox_id: pod_id,
                    resources: Some(LinuxContainerResources {
                        cpu_shares: 1024,
                        ..Default::default()
                    }),
                    overhead: None,
                },
            )),
            15 => Case::any(Call::ContainerStatus(ContainerStatusRequest {
                container_id,
                verbose: true,
            })),
            16 => Case::any(Call::ContainerStats(ContainerStatsRequest { container_id })),
            _ => Case::any(Call::PodSandboxStatus(PodSandboxStatusRequest {
                pod_sandbox_id: pod_id,
                verbose: true,
            })),
        }
    }

    /// A new real pod while the budget lasts; then the same request as an earlier pod (a
    /// retry, which gets that pod back, or remakes it if it was removed).
    fn run_real_pod(&mut self) -> Case {
        let live = self.pods.iter().filter(|p| !p.removed).count();
        let config = if self.pods_made < MAX_PODS && live < MAX_LIVE_PODS {
            self.pods_made += 1;
            self.real_pod_config()
        } else {
            match self.pods.iter().find(|p| !p.removed) {
                Some(pod) => pod.config.clone(),
                None => return self.malformed_run_pod(),
            }
        };
        Case::any(Call::RunPodSandbox(RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        }))
    }

    /// A new real container in any of the fuzzer's pods (perhaps a stopped or removed one)
    /// while the budget lasts; then the same name again.
    fn create_real_container(&mut self) -> Case {
        let Some((pod_sandbox_id, sandbox_config)) = self.some_pod() else {
            return self.run_real_pod();
        };
        let config = if self.containers_made < MAX_CONTAINERS {
            self.containers_made += 1;
            self.real_container_config()
        } else {
            match self.containers.choose(&mut self.rng) {
                Some(c) => c.config.clone(),
                None => self.real_container_config(),
            }
        };
        Case::any(Call::CreateContainer(CreateContainerRequest {
            pod_sandbox_id,
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        }))
    }

    /// Removes a pod while status, stats, exec, create and start requests for it and its
    /// containers are in flight.
    fn race_removal(&mut self) -> Case {
        let Some((pod_id, pod_config)) = self.some_pod() else {
            return self.run_real_pod();
        };
        let containers: Vec<String> = self
            .containers
            .iter()
            .filter(|c| c.pod_id == pod_id)
            .map(|c| c.id.clone())
            .collect();
        let mut calls = vec![
            Call::RemovePodSandbox(RemovePodSandboxRequest {
                pod_sandbox_id: pod_id.clone(),
            }),
            Call::PodSandboxStatus(PodSandboxStatusRequest {
                pod_sandbox_id: pod_id.clone(),
                verbose: true,
            }),
            Call::PodSandboxStats(PodSandboxStatsRequest {
                pod_sandbox_id: pod_id.clone(),
            }),
            Call::ListContainerStats(ListContainerStatsRequest {
                filter: Some(ContainerStatsFilter {
                    pod_sandbox_id: pod_id.clone(),
                    ..Default::default()
                }),
            }),
            Call::CreateContainer(CreateContainerRequest {
                pod_sandbox_id: pod_id.clone(),
                config: Some(self.real_container_config()),
                sandbox_config: Some(pod_config),
            }),
        ];
        for container_id in containers {
            calls.push(Call::ContainerStatus(ContainerStatusRequest {
                container_id: container_id.clone(),
                verbose: true,
            }));
            calls.push(Call::ContainerStats(ContainerStatsRequest {
                container_id: container_id.clone(),
            }));
            calls.push(Call::ExecSync(ExecSyncRequest {
                container_id: container_id.clone(),
                cmd: vec!["true".into()],
                timeout: 5,
            }));
            calls.push(Call::StartContainer(StartContainerRequest { container_id }));
        }
        Case {
            calls,
            refuse_because: Vec::new(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Cleanup and leak checks
// ---------------------------------------------------------------------------------------

impl Fuzzer {
    /// Stops and removes every pod the fuzzer made or crius lists (also those whose creation
    /// the fuzzer thinks failed); returns what went wrong.
    /// Stops and removes every pod the fuzzer made and every pod crius lists, as kubelet's
    /// relists do, until crius has listed none for a while: a RunPodSandbox whose impatient
    /// client gave up may still finish after the first list.
    async fn remove_everything(&mut self) -> Vec<String> {
        const QUIET: Duration = Duration::from_secs(3);
        let started = Instant::now();
        let mut errors = Vec::new();
        let mut ids: BTreeSet<String> = self.pods.iter().map(|p| p.id.clone()).collect();
        let mut removed = BTreeSet::new();
        let mut last_seen = Instant::now();
        loop {
            match self
                .client
                .runtime
                .list_pod_sandbox(with_deadline(ListPodSandboxRequest::default()))
                .await
            {
                Ok(listed) => ids.extend(listed.into_inner().items.into_iter().map(|p| p.id)),
                Err(e) => errors.push(format!("ListPodSandbox: {e:?}")),
            }
            let fresh: Vec<String> = ids.difference(&removed).cloned().collect();
            if fresh.is_empty() {
                if last_seen.elapsed() >= QUIET || started.elapsed() >= SETTLE {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            last_seen = Instant::now();
            errors.extend(self.remove_pods(&fresh).await);
            removed.extend(fresh);
        }
        errors
    }

    async fn remove_pods(&mut self, ids: &[String]) -> Vec<String> {
        let mut errors = Vec::new();
        for id in ids {
            let mut stop = with_deadline(StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            });
            stop.set_timeout(Duration::from_secs(60));
            if let Err(e) = self.client.runtime.stop_pod_sandbox(stop).await {
                errors.push(format!("StopPodSandbox {id}: {e:?}"));
            }
            let mut remove = with_deadline(RemovePodSandboxRequest {
                pod_sandbox_id: id.clone(),
            });
            remove.set_timeout(Duration::from_secs(60));
            if let Err(e) = self.client.runtime.remove_pod_sandbox(remove).await {
                errors.push(format!("RemovePodSandbox {id}: {e:?}"));
            }
        }
        errors
    }
}

/// Polls the sandboxes' `netns` notes, so every network namespace crius made is known, also
/// for pods whose creation failed and was undone.
struct NetnsWatcher {
    seen: Arc<Mutex<BTreeSet<String>>>,
    stop: Arc<AtomicBool>,
}

impl NetnsWatcher {
    fn start(sandboxes: PathBuf) -> Self {
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (found, done) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                for entry in std::fs::read_dir(&sandboxes)
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    if let Ok(path) = std::fs::read_to_string(entry.path().join("netns")) {
                        found
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(path.trim().to_string());
                    }
                }
                std::thread::sleep(Duration::from_millis(3));
            }
        });
        Self { seen, stop }
    }

    fn seen(&self) -> BTreeSet<String> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for NetnsWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn open_fds(crius: &Crius) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", crius.pid()))
        .map(|entries| entries.count())
        .unwrap_or(0)
}

/// Lines of `ctr <args>` output (its header dropped when `header`).
fn ctr_lines(crius: &Crius, args: &[&str], header: bool) -> Vec<String> {
    crius
        .ctr(args)
        .lines()
        .skip(usize::from(header))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

fn mounts_under(dirs: &[&Path]) -> Vec<String> {
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .filter(|point| dirs.iter().any(|d| Path::new(point).starts_with(d)))
        .map(String::from)
        .collect()
}

fn dir_entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().display().to_string())
        .collect()
}

/// What is left of everything the fuzzer made, once teardown had [`SETTLE`] to finish:
/// one line per kind of leftover.
async fn leaks(
    crius: &Crius,
    network: &TestNetwork,
    netns: &BTreeSet<String>,
    fds_before: usize,
) -> Vec<String> {
    let namespace = crius.config.containerd.namespace.clone();
    let (root, state) = (crius.config.root.clone(), crius.config.state.clone());
    let check = || -> Vec<String> {
        let mut left = Vec::new();
        let mut note = |what: &str, items: Vec<String>| {
            if !items.is_empty() {
                left.push(format!("{what}: {items:?}"));
            }
        };
        note(
            "network namespaces",
            netns
                .iter()
                .filter(|p| Path::new(p).exists())
                .cloned()
                .collect(),
        );
        note("reserved IPs", network.reserved_ips());
        note(
            "containerd containers",
            ctr_lines(crius, &["containers", "ls", "-q"], false),
        );
        note("tasks", ctr_lines(crius, &["tasks", "ls", "-q"], false));
        note(
            "active snapshots",
            ctr_lines(crius, &["snapshots", "ls"], true)
                .into_iter()
                .filter(|l| l.ends_with("Active"))
                .collect(),
        );
        note("crius leases", crius.leases_left());
        let shims = Command::new("pgrep")
            .arg("-f")
            .arg(format!("containerd-shim.* -namespace {namespace} "))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        note(
            "shims",
            shims.split_whitespace().map(String::from).collect(),
        );
        note("mounts", mounts_under(&[root.as_path(), state.as_path()]));
        for dir in ["sandboxes", "containers"] {
            note(dir, dir_entries(&root.join(dir)));
            note(dir, dir_entries(&state.join(dir)));
        }
        let fds = open_fds(crius);
        if fds > fds_before + FD_SLACK {
            note(
                "open files",
                vec![format!("{fds} open, {fds_before} before the fuzz")],
            );
        }
        left
    };
    eventually(SETTLE, || std::future::ready(check().is_empty())).await;
    let mut left = check();
    // crius's own view must agree.
    if let Ok(mut client) = crius.client_now().await {
        let pods = client
            .runtime
            .list_pod_sandbox(ListPodSandboxRequest::default())
            .await
            .map(|r| r.into_inner().items.len());
        let containers = client
            .runtime
            .list_containers(ListContainersRequest::default())
            .await
            .map(|r| r.into_inner().containers.len());
        if !matches!((&pods, &containers), (Ok(0), Ok(0))) {
            left.push(format!(
                "crius still lists pods {pods:?} and containers {containers:?}"
            ));
        }
    }
    left
}
