//! `make soak` (not part of `make test`): pods and containers created, exec'd, stopped and
//! removed in parallel, the way a kubelet with a few dozen pods does, for `SOAK_MINUTES`
//! (default 10), while faults are injected at random: crius killed (-9) and restarted the
//! way systemd would, its containerd killed (-9) and restarted cleanly, single shims killed,
//! the OCI runtime killed in the middle of a create, the stream server filled with idle
//! connections. The client retries as kubelet does. At the end, with everything removed,
//! nothing may be left (netns, IP, containerd container, task, active snapshot, lease,
//! ingest, shim, mount, cgroup, state directory, descriptor), every container that ran has
//! its exit recorded, no call got INTERNAL or UNKNOWN, and crius's memory is within 10% of
//! what it was a minute after it started. It prints a summary and fails on any of these.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Crius, PrivateContainerd, TestNetwork, pod_config};
use crius::api::v1::{
    ContainerConfig, ContainerFilter, ContainerMetadata, ContainerState, ContainerStatusRequest,
    CreateContainerRequest, ExecSyncRequest, ImageSpec, LinuxPodSandboxConfig,
    ListContainersRequest, ListPodSandboxRequest, PodSandboxConfig, PodSandboxFilter,
    RemoveContainerRequest, RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest,
    StopContainerRequest, StopPodSandboxRequest,
};
use crius_testkit::CriClient;
use rand::Rng;
use tonic::{Code, Status};

/// Pod lifecycles run at once: about this many pods exist at any time.
const WORKERS: usize = 40;
/// Each call's deadline, as kubelet's runtime request timeout.
const CALL_DEADLINE: Duration = Duration::from_secs(30);
/// How long one operation is retried before the soak gives up on it.
const GIVE_UP: Duration = Duration::from_secs(180);
/// What the error of an operation retried for [`GIVE_UP`] says.
const GAVE_UP: &str = "still failing after";
const POD_LABEL: &str = "soak.pod";
const CONTAINER_LABEL: &str = "soak.container";

/// What happened, for the summary and the verdict.
#[derive(Default)]
struct Record {
    latencies: Mutex<BTreeMap<&'static str, Vec<Duration>>>,
    errors: Mutex<BTreeMap<(&'static str, String), usize>>,
    /// Calls answered INTERNAL or UNKNOWN.
    bad_codes: Mutex<Vec<String>>,
    /// Containers that ran and were stopped without an exit recorded, and other
    /// inconsistencies.
    inconsistencies: Mutex<Vec<String>>,
    faults: Mutex<BTreeMap<&'static str, usize>>,
    retries: AtomicUsize,
    operations: AtomicUsize,
    cycles: AtomicUsize,
}

impl Record {
    fn latency(&self, op: &'static str, took: Duration) {
        self.operations.fetch_add(1, Ordering::Relaxed);
        lock(&self.latencies).entry(op).or_default().push(took);
    }

    fn error(&self, op: &'static str, status: &Status) {
        *lock(&self.errors)
            .entry((op, format!("{:?}", status.code())))
            .or_default() += 1;
        if matches!(status.code(), Code::Internal | Code::Unknown) {
            lock(&self.bad_codes).push(format!("{op}: {:?}: {}", status.code(), status.message()));
        }
    }

    fn inconsistent(&self, what: String) {
        eprintln!("[soak] inconsistency: {what}");
        lock(&self.inconsistencies).push(what);
    }

    fn fault(&self, name: &'static str) {
        *lock(&self.faults).entry(name).or_default() += 1;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What every worker shares.
struct Ctx {
    socket: PathBuf,
    record: Record,
    deadline: Instant,
    cgroup_root: String,
    logs: PathBuf,
    busybox: String,
}

/// The error an operation gave up with.
type OpError = String;

impl Ctx {
    async fn client(&self) -> Option<CriClient> {
        CriClient::connect(&self.socket).await.ok()
    }

    /// Calls `op` the way kubelet does: each attempt with a deadline; after a failure, the
    /// same request again (a new connection, a growing pause) until it succeeds, fails for
    /// good (`accept` says which answers end it), or [`GIVE_UP`] passes.
    async fn call<T, F, Fut>(
        &self,
        op: &'static str,
        accept: impl Fn(&Status) -> Option<Result<T, OpError>>,
        mut f: F,
    ) -> Result<T, OpError>
    where
        F: FnMut(CriClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let started = Instant::now();
        let mut pause = Duration::from_millis(100);
        loop {
            let outcome = match self.client().await {
                Some(client) => match tokio::time::timeout(CALL_DEADLINE, f(client)).await {
                    Ok(result) => result,
                    Err(_) => Err(Status::deadline_exceeded("the call's deadline passed")),
                },
                None => Err(Status::unavailable("crius is not serving")),
            };
            match outcome {
                Ok(value) => {
                    self.record.latency(op, started.elapsed());
                    return Ok(value);
                }
                Err(status) => {
                    // A connection refused or cut while crius restarts is not an answer of
                    // crius's.
                    if !is_transport_failure(&status) {
                        self.record.error(op, &status);
                    }
                    if let Some(end) = accept(&status) {
                        self.record.latency(op, started.elapsed());
                        return end;
                    }
                    if started.elapsed() > GIVE_UP {
                        return Err(format!("{op}: {GAVE_UP} {GIVE_UP:?}: {status:?}"));
                    }
                    self.record.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}

/// Whether the client made `status` itself because the connection failed (refused, or cut
/// by a crius killed in the middle of the call): tonic says UNAVAILABLE, or UNKNOWN
/// "transport error" with the connection's error as its source.
fn is_transport_failure(status: &Status) -> bool {
    use std::error::Error;
    status.code() == Code::Unavailable
        || (status.code() == Code::Unknown
            && status.message() == "transport error"
            && status.source().is_some())
}

fn with_timeout<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(CALL_DEADLINE);
    request
}

/// Answers that end an operation at once (the rest are retried).
fn retry_all<T>(_: &Status) -> Option<Result<T, OpError>> {
    None
}

/// NOT_FOUND ends a stop or remove as done (what kubelet makes of it).
fn gone_is_done(status: &Status) -> Option<Result<(), OpError>> {
    (status.code() == Code::NotFound).then_some(Ok(()))
}

/// A pod's config: its own cgroup parent, logs in the soak's directory, a label naming it.
fn soak_pod_config(ctx: &Ctx, name: &str) -> PodSandboxConfig {
    let mut config = pod_config(name);
    config.log_directory = ctx.logs.join(name).display().to_string();
    config.labels.insert(POD_LABEL.into(), name.into());
    config.linux = Some(LinuxPodSandboxConfig {
        cgroup_parent: format!("{}/{name}", ctx.cgroup_root),
        ..Default::default()
    });
    config
}

/// A container that exits at once on SIGTERM.
fn app_config(ctx: &Ctx, name: &str) -> ContainerConfig {
    let mut labels = HashMap::new();
    labels.insert(CONTAINER_LABEL.to_string(), name.to_string());
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: ctx.busybox.clone(),
            ..Default::default()
        }),
        command: vec![
            "sh".into(),
            "-c".into(),
            "trap 'exit 0' TERM; while true; do sleep 1; done".into(),
        ],
        log_path: format!("{name}.log"),
        labels,
        ..Default::default()
    }
}

/// The ID of the pod labelled `name`, when a RunPodSandbox that failed made it after all.
async fn find_pod(ctx: &Ctx, name: &str) -> Option<String> {
    let mut client = ctx.client().await?;
    let filter = PodSandboxFilter {
        label_selector: HashMap::from([(POD_LABEL.to_string(), name.to_string())]),
        ..Default::default()
    };
    client
        .runtime
        .list_pod_sandbox(ListPodSandboxRequest {
            filter: Some(filter),
        })
        .await
        .ok()?
        .into_inner()
        .items
        .into_iter()
        .next()
        .map(|p| p.id)
}

async fn find_container(ctx: &Ctx, pod_id: &str, name: &str) -> Option<String> {
    let mut client = ctx.client().await?;
    let filter = ContainerFilter {
        pod_sandbox_id: pod_id.to_string(),
        label_selector: HashMap::from([(CONTAINER_LABEL.to_string(), name.to_string())]),
        ..Default::default()
    };
    client
        .runtime
        .list_containers(ListContainersRequest {
            filter: Some(filter),
        })
        .await
        .ok()?
        .into_inner()
        .containers
        .into_iter()
        .next()
        .map(|c| c.id)
}

async fn run_pod(ctx: &Ctx, config: &PodSandboxConfig, name: &str) -> Result<String, OpError> {
    let made = ctx
        .call("RunPodSandbox", retry_all, |mut c| {
            let config = config.clone();
            async move {
                let request = with_timeout(RunPodSandboxRequest {
                    config: Some(config),
                    runtime_handler: String::new(),
                });
                c.runtime
                    .run_pod_sandbox(request)
                    .await
                    .map(|r| r.into_inner().pod_sandbox_id)
            }
        })
        .await;
    match made {
        Ok(id) => Ok(id),
        // A first attempt that made the pod before its answer was lost.
        Err(e) => find_pod(ctx, name).await.ok_or(e),
    }
}

async fn create_and_start(
    ctx: &Ctx,
    pod_id: &str,
    pod: &PodSandboxConfig,
    name: &str,
) -> Result<String, OpError> {
    let config = app_config(ctx, name);
    let created = ctx
        .call(
            "CreateContainer",
            |s: &Status| {
                // The pod died under a fault: nothing to retry.
                (s.code() == Code::NotFound).then(|| Err(format!("CreateContainer: {s:?}")))
            },
            |mut c| {
                let (config, pod) = (config.clone(), pod.clone());
                let pod_id = pod_id.to_string();
                async move {
                    c.runtime
                        .create_container(with_timeout(CreateContainerRequest {
                            pod_sandbox_id: pod_id,
                            config: Some(config),
                            sandbox_config: Some(pod),
                        }))
                        .await
                        .map(|r| r.into_inner().container_id)
                }
            },
        )
        .await;
    let id = match created {
        Ok(id) => id,
        Err(e) => find_container(ctx, pod_id, name).await.ok_or(e)?,
    };
    ctx.call(
        "StartContainer",
        |s: &Status| {
            matches!(s.code(), Code::NotFound | Code::FailedPrecondition)
                .then(|| Err(format!("StartContainer: {s:?}")))
        },
        |mut c| {
            let id = id.clone();
            async move {
                c.runtime
                    .start_container(with_timeout(StartContainerRequest { container_id: id }))
                    .await
                    .map(|_| ())
            }
        },
    )
    .await
    .map(|()| id)
}

/// Execs `echo ok` in the container; one that died under a fault answers an error.
async fn exec_ok(ctx: &Ctx, id: &str) -> Result<(), OpError> {
    let out = ctx
        .call(
            "ExecSync",
            |s: &Status| {
                matches!(s.code(), Code::NotFound | Code::FailedPrecondition)
                    .then(|| Err(format!("ExecSync: {s:?}")))
            },
            |mut c| {
                let id = id.to_string();
                async move {
                    c.runtime
                        .exec_sync(with_timeout(ExecSyncRequest {
                            container_id: id,
                            cmd: vec!["echo".into(), "ok".into()],
                            timeout: 10,
                        }))
                        .await
                        .map(|r| r.into_inner())
                }
            },
        )
        .await?;
    if out.exit_code != 0 || out.stdout != b"ok\n" {
        return Err(format!("ExecSync answered {out:?}"));
    }
    Ok(())
}

/// Stops the container and checks its exit is recorded, then removes it.
async fn stop_and_remove(ctx: &Ctx, id: &str) -> Result<(), OpError> {
    ctx.call("StopContainer", gone_is_done, |mut c| {
        let id = id.to_string();
        async move {
            c.runtime
                .stop_container(with_timeout(StopContainerRequest {
                    container_id: id,
                    timeout: 5,
                }))
                .await
                .map(|_| ())
        }
    })
    .await?;
    let status = ctx
        .call(
            "ContainerStatus",
            |s: &Status| (s.code() == Code::NotFound).then(|| Err(format!("{s:?}"))),
            |mut c| {
                let id = id.to_string();
                async move {
                    c.runtime
                        .container_status(ContainerStatusRequest {
                            container_id: id,
                            verbose: false,
                        })
                        .await
                        .map(|r| r.into_inner().status)
                }
            },
        )
        .await;
    match status {
        Ok(Some(s)) if s.state == ContainerState::ContainerExited as i32 && s.finished_at > 0 => {}
        Ok(other) => ctx.record.inconsistent(format!(
            "container {id} stopped without an exit recorded: {other:?}"
        )),
        Err(e) => ctx
            .record
            .inconsistent(format!("container {id} lost after it ran: {e}")),
    }
    ctx.call("RemoveContainer", gone_is_done, |mut c| {
        let id = id.to_string();
        async move {
            c.runtime
                .remove_container(with_timeout(RemoveContainerRequest { container_id: id }))
                .await
                .map(|_| ())
        }
    })
    .await
}

async fn stop_and_remove_pod(ctx: &Ctx, pod_id: &str) -> Result<(), OpError> {
    ctx.call("StopPodSandbox", gone_is_done, |mut c| {
        let id = pod_id.to_string();
        async move {
            c.runtime
                .stop_pod_sandbox(with_timeout(StopPodSandboxRequest { pod_sandbox_id: id }))
                .await
                .map(|_| ())
        }
    })
    .await?;
    ctx.call("RemovePodSandbox", gone_is_done, |mut c| {
        let id = pod_id.to_string();
        async move {
            c.runtime
                .remove_pod_sandbox(with_timeout(RemovePodSandboxRequest { pod_sandbox_id: id }))
                .await
                .map(|_| ())
        }
    })
    .await
}

/// One pod's life: run, a container started, exec'd a few times over a random while,
/// stopped (its exit checked) and removed, then the pod stopped and removed.
async fn pod_cycle(ctx: &Ctx, worker: usize, n: usize) -> Result<(), OpError> {
    let name = format!("soak-{worker}-{n}");
    let config = soak_pod_config(ctx, &name);
    let pod_id = run_pod(ctx, &config, &name).await?;
    let body = async {
        let id = create_and_start(ctx, &pod_id, &config, "app").await?;
        let hold = Duration::from_secs(rand::rng().random_range(5..40));
        let until = Instant::now() + hold;
        while Instant::now() < until {
            // A container killed with its shim is not an error of crius's.
            if let Err(e) = exec_ok(ctx, &id).await {
                eprintln!("[soak] {name}: {e}");
                break;
            }
            let pause = Duration::from_secs(rand::rng().random_range(1..6));
            tokio::time::sleep(pause).await;
        }
        stop_and_remove(ctx, &id).await
    }
    .await;
    let removed = stop_and_remove_pod(ctx, &pod_id).await;
    body.and(removed)
}

async fn worker(ctx: Arc<Ctx>, worker: usize) -> Vec<OpError> {
    let mut failures = Vec::new();
    let mut n = 0;
    while Instant::now() < ctx.deadline {
        // An operation refused for good (a container that died with its shim, a start
        // whose runtime was killed) ends the cycle, as kubelet would start over; one that
        // kept failing is a failure of the soak.
        if let Err(e) = pod_cycle(&ctx, worker, n).await {
            eprintln!("[soak] worker {worker} cycle {n}: {e}");
            if e.contains(GAVE_UP) {
                failures.push(e);
            }
        }
        ctx.record.cycles.fetch_add(1, Ordering::Relaxed);
        n += 1;
    }
    failures
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    KillCrius,
    KillContainerd,
    RestartContainerd,
    KillShim,
    KillRuntimeMidCreate,
    FloodStreamServer,
}

const FAULTS: [Fault; 6] = [
    Fault::KillCrius,
    Fault::KillContainerd,
    Fault::RestartContainerd,
    Fault::KillShim,
    Fault::KillRuntimeMidCreate,
    Fault::FloodStreamServer,
];

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::KillCrius => "crius killed (-9) and restarted",
            Fault::KillContainerd => "containerd killed (-9) and restarted",
            Fault::RestartContainerd => "containerd restarted cleanly",
            Fault::KillShim => "a shim killed (-9)",
            Fault::KillRuntimeMidCreate => "runc killed (-9) in a create or start",
            Fault::FloodStreamServer => "stream server flooded with 2000 idle connections",
        }
    }
}

/// The processes whose command line matches `pattern` (`pgrep -f`).
fn pgrep(pattern: &str) -> Vec<u32> {
    std::process::Command::new("pgrep")
        .args(["-f", pattern])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn kill9(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

struct Injector {
    crius: Crius,
    containerd: PrivateContainerd,
    /// When the crius process now running started, and what it used a minute later.
    started: Instant,
    first_minute: Option<Usage>,
    /// Each crius process that lived past its first minute: what it used then, and what it
    /// used when it was killed (or at the end).
    lifetimes: Vec<(Usage, Usage)>,
    stream_port: u16,
}

#[derive(Clone, Copy, Debug)]
struct Usage {
    rss_kib: u64,
    fds: usize,
}

fn usage(pid: i32) -> Option<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some(Usage { rss_kib, fds })
}

impl Injector {
    /// Injects `fault`; false when there was nothing to hit (no shim, no runc in time).
    async fn inject(&mut self, fault: Fault) -> bool {
        match fault {
            Fault::KillCrius => {
                self.end_lifetime();
                self.crius.restart_after_crash().await;
                self.started = Instant::now();
                self.first_minute = None;
            }
            Fault::KillContainerd => self.containerd.restart().await,
            Fault::RestartContainerd => self.containerd.restart_cleanly().await,
            Fault::KillShim => {
                let shims = pgrep(&format!(
                    "containerd-shim.*-address {}",
                    self.containerd.address.display()
                ));
                if shims.is_empty() {
                    return false;
                }
                let pick = rand::rng().random_range(0..shims.len());
                kill9(shims[pick]);
            }
            Fault::KillRuntimeMidCreate => {
                // Wait for a runc creating or starting a container of this containerd's,
                // then kill it.
                let until = Instant::now() + Duration::from_secs(10);
                let marker = self.containerd.dir.display().to_string();
                loop {
                    let creating = pgrep(&format!("^([^ ]*/)?runc .*{marker}"))
                        .into_iter()
                        .find(|pid| {
                            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                                c.split(|b| *b == 0)
                                    .any(|a| a == b"create" || a == b"start")
                            })
                        });
                    if let Some(pid) = creating {
                        kill9(pid);
                        break;
                    }
                    if Instant::now() >= until {
                        return false;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            Fault::FloodStreamServer => {
                let mut idle = Vec::new();
                for _ in 0..2000 {
                    match tokio::net::TcpStream::connect(("127.0.0.1", self.stream_port)).await {
                        Ok(conn) => idle.push(conn),
                        Err(_) => break,
                    }
                }
                tokio::time::sleep(Duration::from_secs(10)).await;
                drop(idle);
            }
        }
        true
    }

    /// Records what the running crius used against its first minute.
    fn end_lifetime(&mut self) {
        if let (Some(first), Some(last)) = (self.first_minute, usage(self.crius.pid().as_raw())) {
            self.lifetimes.push((first, last));
        }
    }

    fn sample(&mut self) {
        if self.first_minute.is_none() && self.started.elapsed() >= Duration::from_secs(60) {
            self.first_minute = usage(self.crius.pid().as_raw());
        }
    }
}

async fn inject_faults(injector: &mut Injector, ctx: &Ctx) {
    while Instant::now() < ctx.deadline {
        let wait = Duration::from_secs(rand::rng().random_range(5..20));
        let until = Instant::now() + wait;
        while Instant::now() < until {
            injector.sample();
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if Instant::now() >= ctx.deadline {
            break;
        }
        let fault = FAULTS[rand::rng().random_range(0..FAULTS.len())];
        if injector.inject(fault).await {
            eprintln!("[soak] fault: {}", fault.name());
            ctx.record.fault(fault.name());
        } else {
            eprintln!("[soak] nothing to hit: {}", fault.name());
        }
    }
}

/// Removes every pod crius still lists (what workers that gave up left).
async fn remove_everything(ctx: &Ctx) {
    let Some(mut client) = ctx.client().await else {
        return;
    };
    let pods = client
        .runtime
        .list_pod_sandbox(ListPodSandboxRequest { filter: None })
        .await
        .map(|r| r.into_inner().items)
        .unwrap_or_default();
    for pod in pods {
        let _ = stop_and_remove_pod(ctx, &pod.id).await;
    }
}

/// Entries of `dir` (none when it is missing).
fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Every leak left once everything is removed.
async fn leaks(
    ctx: &Ctx,
    crius: &Crius,
    containerd: &PrivateContainerd,
    network: &TestNetwork,
    netns_before: &HashSet<String>,
) -> Vec<String> {
    let mut found = Vec::new();
    let mut report = |what: &str, items: Vec<String>| {
        if !items.is_empty() {
            found.push(format!("{what}: {items:?}"));
        }
    };
    if let Some(mut client) = ctx.client().await {
        let pods = client
            .runtime
            .list_pod_sandbox(ListPodSandboxRequest { filter: None })
            .await
            .map(|r| r.into_inner().items.into_iter().map(|p| p.id).collect())
            .unwrap_or_else(|e| vec![format!("ListPodSandbox failed: {e}")]);
        report("pods crius lists", pods);
        let containers = client
            .runtime
            .list_containers(ListContainersRequest { filter: None })
            .await
            .map(|r| {
                r.into_inner()
                    .containers
                    .into_iter()
                    .map(|c| c.id)
                    .collect()
            })
            .unwrap_or_else(|e| vec![format!("ListContainers failed: {e}")]);
        report("containers crius lists", containers);
    }
    let lines =
        |args: &[&str]| -> Vec<String> { crius.ctr(args).lines().map(str::to_string).collect() };
    report("containerd containers", lines(&["containers", "ls", "-q"]));
    report(
        "containerd tasks",
        lines(&["tasks", "ls"]).into_iter().skip(1).collect(),
    );
    report(
        "active snapshots",
        lines(&["snapshots", "ls"])
            .into_iter()
            .filter(|l| l.contains("Active"))
            .collect(),
    );
    report("leases", crius.leases_left());
    report(
        "content ingests",
        lines(&["content", "active"]).into_iter().skip(1).collect(),
    );
    report(
        "shims",
        pgrep(&format!(
            "containerd-shim.*-address {}",
            containerd.address.display()
        ))
        .into_iter()
        .map(|p| p.to_string())
        .collect(),
    );
    let netns_now: HashSet<String> = entries(Path::new("/var/run/netns")).into_iter().collect();
    report(
        "netns",
        netns_now.difference(netns_before).cloned().collect(),
    );
    report("IP reservations", network.reserved_ips());
    let dirs = [crius.config.root.clone(), crius.config.state.clone()];
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    report(
        "mounts",
        mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(1))
            .filter(|m| {
                dirs.iter().any(|d| m.starts_with(&*d.to_string_lossy()))
                    || m.starts_with(&*containerd.dir.join("state").to_string_lossy())
            })
            .map(str::to_string)
            .collect(),
    );
    for base in &dirs {
        for kind in ["containers", "sandboxes"] {
            report(
                &format!("{}/{kind}", base.display()),
                entries(&base.join(kind)),
            );
        }
    }
    // Container cgroups below the pods' parents (the parents are kubelet's to remove).
    let mut cgroups = Vec::new();
    for controller in entries(Path::new("/sys/fs/cgroup")) {
        let root = Path::new("/sys/fs/cgroup")
            .join(&controller)
            .join(ctx.cgroup_root.trim_start_matches('/'));
        for pod in entries(&root) {
            let pod_dir = root.join(&pod);
            if !pod_dir.is_dir() {
                continue;
            }
            for child in entries(&pod_dir) {
                if pod_dir.join(&child).is_dir() {
                    cgroups.push(format!("{controller}/{pod}/{child}"));
                }
            }
        }
    }
    report("cgroups", cgroups);
    found
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn summary(record: &Record, minutes: u64, containerd: &str) -> String {
    let mut out = format!(
        "soak: {minutes} min beside {containerd}: {} pod lifecycles, {} operations, {} retries\n",
        record.cycles.load(Ordering::Relaxed),
        record.operations.load(Ordering::Relaxed),
        record.retries.load(Ordering::Relaxed),
    );
    out.push_str("faults injected:\n");
    for (fault, n) in lock(&record.faults).iter() {
        out.push_str(&format!("  {n:>4}  {fault}\n"));
    }
    out.push_str("operation          count      p50      p99\n");
    for (op, latencies) in lock(&record.latencies).iter_mut() {
        latencies.sort();
        out.push_str(&format!(
            "  {op:<16} {:>6} {:>7.0}ms {:>7.0}ms\n",
            latencies.len(),
            percentile(latencies, 0.5).as_secs_f64() * 1000.0,
            percentile(latencies, 0.99).as_secs_f64() * 1000.0,
        ));
    }
    let errors = lock(&record.errors);
    if !errors.is_empty() {
        out.push_str("errors answered (retried or final):\n");
        for ((op, code), n) in errors.iter() {
            out.push_str(&format!("  {n:>4}  {op} {code}\n"));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a soak of many minutes: make soak"]
async fn soak() {
    let minutes: u64 = std::env::var("SOAK_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(10);
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("setrlimit");
    let netns_before: HashSet<String> = entries(Path::new("/var/run/netns")).into_iter().collect();
    let containerd = PrivateContainerd::start().await;
    let stream_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let mut network = None;
    let crius = Crius::start_with(
        |c| {
            containerd.configure(c);
            c.stream.port = stream_port;
            network = Some(TestNetwork::install(c, 190));
        },
        &[],
    )
    .await;
    let network = network.expect("network");
    let busybox = common::pod::image("busybox:latest");
    common::pod::pull(&mut crius.client().await, "busybox:latest").await;
    let ctx = Arc::new(Ctx {
        socket: crius.grpc_socket().to_path_buf(),
        record: Record::default(),
        deadline: Instant::now() + Duration::from_secs(minutes * 60),
        cgroup_root: format!("/crius-soak-{}", std::process::id()),
        logs: crius.config.root.parent().expect("test dir").join("logs"),
        busybox,
    });
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| tokio::spawn(worker(ctx.clone(), w)))
        .collect();
    let mut injector = Injector {
        crius,
        containerd,
        started: Instant::now(),
        first_minute: None,
        lifetimes: Vec::new(),
        stream_port,
    };
    inject_faults(&mut injector, &ctx).await;
    let mut failures = Vec::new();
    for w in workers {
        failures.extend(w.await.expect("worker"));
    }
    remove_everything(&ctx).await;
    // What crius and containerd collect in the background (leases, snapshots) is given a
    // moment.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let leaks = leaks(
        &ctx,
        &injector.crius,
        &injector.containerd,
        &network,
        &netns_before,
    )
    .await;
    injector.end_lifetime();
    let containerd_name = std::env::var("CRIUS_TEST_CONTAINERD_NAME").unwrap_or_default();
    let mut report = summary(&ctx.record, minutes, &containerd_name);
    let mut verdict = Vec::new();
    report.push_str(&format!(
        "crius processes that lived past their first minute: {}\n",
        injector.lifetimes.len()
    ));
    for (first, last) in &injector.lifetimes {
        report.push_str(&format!(
            "  {} KiB RSS, {} descriptors after a minute; {} KiB, {} at its end\n",
            first.rss_kib, first.fds, last.rss_kib, last.fds
        ));
        if last.rss_kib * 10 > first.rss_kib * 11 {
            verdict.push(format!(
                "crius's memory grew from {} to {} KiB",
                first.rss_kib, last.rss_kib
            ));
        }
    }
    // With everything removed, the last crius holds no more descriptors than it did with
    // pods a minute after it started.
    if let (Some((first, last)), true) =
        (injector.lifetimes.last(), injector.first_minute.is_some())
        && last.fds > first.fds + 16
    {
        verdict.push(format!(
            "crius's descriptors grew from {} to {}",
            first.fds, last.fds
        ));
    }
    report.push_str(&format!("leaks found: {}\n", leaks.len()));
    for leak in &leaks {
        report.push_str(&format!("  {leak}\n"));
    }
    verdict.extend(leaks);
    let bad = lock(&ctx.record.bad_codes).clone();
    if !bad.is_empty() {
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for answer in &bad {
            *kinds.entry(answer.chars().take(160).collect()).or_default() += 1;
        }
        verdict.push(format!("{} calls answered INTERNAL or UNKNOWN:", bad.len()));
        verdict.extend(kinds.into_iter().map(|(kind, n)| format!("  {n} x {kind}")));
    }
    let inconsistent = lock(&ctx.record.inconsistencies).clone();
    verdict.extend(inconsistent);
    verdict.extend(failures);
    eprintln!("{report}");
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    let _ = std::fs::write(target.join("soak-summary.txt"), &report);
    // crius's log (of every process it ran as), for what the summary cannot say.
    let _ = std::fs::write(target.join("soak-crius.log"), injector.crius.log());
    for controller in entries(Path::new("/sys/fs/cgroup")) {
        let root = Path::new("/sys/fs/cgroup")
            .join(&controller)
            .join(ctx.cgroup_root.trim_start_matches('/'));
        for pod in entries(&root) {
            let _ = std::fs::remove_dir(root.join(pod));
        }
        let _ = std::fs::remove_dir(&root);
    }
    assert!(
        verdict.is_empty(),
        "the soak found:\n{}",
        verdict.join("\n")
    );
}
