//! Create: the container's runtime options and rootfs, runc create with its stdio, and the
//! watchers that outlive the call (OOM, the reaper's pid).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use containerd_shim_protos::api::Mount;
use containerd_shim_protos::events::task::{TaskCreate, TaskIO, TaskOOM};

use crate::error::ShimError;
use crate::pod::Pod;
use crate::pod::held::HeldPod;
use crate::runtime::bundle_spec::{BundleSpec, SpecFacts};
use crate::runtime::direct_exec::{ExecDefaults, ExecTarget};
use crate::runtime::runc::{ProcessStdio, Runc, RuncOptions, read_pid_file};
use crate::task::container::Container;
use crate::task::events::topic;
use crate::task::process::Process;
use crate::task::shim::Shim;
use crate::task::stdio::{self, ConsoleSocket, ProcessIo, StdioPaths};

/// How long the shim waits for runc to send a new terminal.
const CONSOLE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a create request carries, past the stdio.
pub struct CreateRequest {
    pub id: String,
    pub bundle: PathBuf,
    pub rootfs: Vec<Mount>,
    pub stdio: StdioPaths,
    pub runc: RuncOptions,
    /// CRIU's images to restore the init from (containerd unpacked them); `None`: a new
    /// init. A restored init runs from create on, and start only reports it.
    pub checkpoint: Option<PathBuf>,
}

impl Shim {
    pub async fn create(&self, request: CreateRequest) -> Result<i32, ShimError> {
        let CreateRequest {
            id,
            bundle,
            rootfs,
            stdio,
            runc,
            checkpoint,
        } = request;
        if id.is_empty() {
            return Err(ShimError::InvalidArgument("container id is empty".into()));
        }
        if self.has_container(&id) {
            return Err(ShimError::AlreadyExists(format!("container {id}")));
        }
        let runc = crate::runtime::runc::runc_for(&runc, &self.namespace, &bundle);
        let spec = read_spec(&bundle).await?;
        if let Some(held) = HeldPod::from_spec(&id, &spec)? {
            return self.create_held(id, bundle, runc, stdio, held, &spec).await;
        }
        let cgroups_path = spec
            .linux
            .as_ref()
            .map(|l| l.cgroups_path.clone())
            .unwrap_or_default();
        let (facts, rootfs, exec_defaults) =
            prepare_bundle(&bundle, &runc, rootfs, self.pod(), spec).await?;

        // Exits of the new init are kept from here until its pid is registered.
        let starting = self.begin_starting();
        let launched = self
            .run_create(&id, &bundle, &runc, &stdio, checkpoint.as_deref())
            .await;
        let (pid, io) = match launched {
            Ok(created) => created,
            Err(e) => {
                if let Some(rootfs) = rootfs {
                    unmount_rootfs(rootfs).await;
                }
                crate::pod::cgroup_leaf::remove_empty(&cgroups_path);
                return Err(e);
            }
        };
        let init = Arc::new(Process::new(&id, "", stdio.clone(), None));
        init.set_created(pid, io);
        let cgroup = containerd_shim::cgroup::get_cgroup(pid as u32)
            .map_err(|e| log::warn!("no cgroup for {id}'s stats: {e}"))
            .ok();
        let container = Arc::new(Container::new(
            &id,
            &bundle,
            runc,
            init.clone(),
            rootfs,
            facts,
            cgroup,
        ));
        if checkpoint.is_some() {
            container.mark_restored();
        }
        // An init reaped already: a pidfd may be of a process that took its pid.
        if !container.held_pod && !self.exit_kept(pid) {
            match crate::runtime::pidfd::open(pid) {
                Ok(fd) => {
                    let _ = container.init_pidfd.set(fd);
                }
                Err(e) => log::debug!("kills of {id} go to runc: no pidfd of its init: {e}"),
            }
        }
        if let Some(defaults) = exec_defaults {
            match ExecTarget::open(pid, defaults) {
                // An init reaped already: the pidfd may be of a process that took its pid.
                Ok(_) if self.exit_kept(pid) => {}
                Ok(target) => {
                    let _ = container.exec_target.set(target);
                }
                Err(e) => log::warn!("execs in {id} go to runc: no pidfd of its init: {e}"),
            }
        }
        self.add_container(container.clone());
        self.watch_oom(&container, pid);
        self.publish_created(&id, &bundle, &stdio, pid);
        self.register_pid(&starting, pid, &init);
        drop(starting);
        Ok(pid)
    }

    fn publish_created(&self, id: &str, bundle: &Path, stdio: &StdioPaths, pid: i32) {
        self.events.publish(
            topic::CREATE,
            Box::new(TaskCreate {
                container_id: id.to_string(),
                bundle: bundle.display().to_string(),
                io: Some(task_io(stdio)).into(),
                pid: pid as u32,
                ..Default::default()
            }),
        );
    }

    /// runc create (or restore, from `checkpoint`), with the stdio the process gets; a
    /// container whose create failed or did not finish is deleted again (a runc killed in
    /// the middle leaves its init waiting).
    async fn run_create(
        &self,
        id: &str,
        bundle: &Path,
        runc: &Runc,
        stdio: &StdioPaths,
        checkpoint: Option<&Path>,
    ) -> Result<(i32, ProcessIo), ShimError> {
        let pid_file = bundle.join("init.pid");
        let (process_stdio, io, console) = prepare_stdio(stdio)?;
        let console_path = console.as_ref().map(|c| c.path());
        let launched = match checkpoint {
            Some(images) => {
                let launch = crate::runtime::runc::InitLaunch {
                    id,
                    bundle,
                    pid_file: &pid_file,
                    console_socket: console_path.as_deref(),
                };
                runc.restore(&self.reaper, &launch, images, process_stdio)
                    .await
            }
            None => {
                runc.create(
                    &self.reaper,
                    id,
                    bundle,
                    &pid_file,
                    console_path.as_deref(),
                    process_stdio,
                )
                .await
            }
        };
        if let Err(e) = launched {
            let _ = runc.delete(&self.reaper, id, true).await;
            return Err(e.into());
        }
        let finished = async {
            let pid = read_pid_file(&pid_file)
                .map_err(|e| ShimError::io(format!("read {}", pid_file.display()), e))?;
            let io = match console {
                Some(console) => receive_console(console, stdio).await?,
                None => io,
            };
            Ok((pid, io))
        };
        let result = finished.await;
        if result.is_err() {
            let _ = runc.delete(&self.reaper, id, true).await;
        }
        result
    }

    /// Creates a pod sandbox crius marked for holding: its holder, in place of runc's
    /// container; it runs from here on (start only reports it), as a pause container's
    /// process waits for nothing either.
    async fn create_held(
        &self,
        id: String,
        bundle: PathBuf,
        runc: Runc,
        stdio: StdioPaths,
        held: HeldPod,
        spec: &BundleSpec,
    ) -> Result<i32, ShimError> {
        if !stdio.stdin.is_empty() || !stdio.stdout.is_empty() || !stdio.stderr.is_empty() {
            return Err(ShimError::InvalidArgument(format!(
                "held pod {id}: its holder has no stdio"
            )));
        }
        check_runtime(&runc)?;
        let facts = SpecFacts {
            own_pid_namespace: spec.own_pid_namespace(),
            poststart_hooks: false,
            held_pod: true,
        };
        let starting = self.begin_starting();
        let dir = bundle.clone();
        let (pid, cgroup) = tokio::task::spawn_blocking(move || held.spawn(&dir))
            .await
            .map_err(|e| ShimError::Internal(format!("hold pod {id}: {e}")))??;
        let init = Arc::new(Process::new(&id, "", stdio.clone(), None));
        init.set_created(pid, Default::default());
        let container = Arc::new(Container::new(
            &id,
            &bundle,
            runc,
            init.clone(),
            None,
            facts,
            cgroup,
        ));
        self.add_container(container.clone());
        self.watch_oom(&container, pid);
        self.publish_created(&id, &bundle, &stdio, pid);
        self.register_pid(&starting, pid, &init);
        drop(starting);
        log::info!("pod {id} held by pid {pid}");
        Ok(pid)
    }

    fn watch_oom(&self, container: &Arc<Container>, pid: i32) {
        let events = self.events.clone();
        let id = container.id.clone();
        let watch = crate::task::oom::watch(pid, move || {
            events.publish(
                topic::OOM,
                Box::new(TaskOOM {
                    container_id: id.clone(),
                    ..Default::default()
                }),
            );
        });
        match watch {
            Ok(watch) => container.set_oom_watch(watch),
            Err(e) => log::warn!("no OOM notification for {}: {e}", container.id),
        }
    }
}

/// Gives a container of a pod the shim holds the pod's files, reads the bundle's spec
/// (its PID namespace and poststart hooks), keeps the runtime in the bundle
/// and mounts the rootfs: off the runtime thread, since a hung mount or disk must not stop
/// the whole pod.
async fn prepare_bundle(
    bundle: &Path,
    runc: &Runc,
    mounts: Vec<Mount>,
    pod: Option<Arc<Pod>>,
    spec: BundleSpec,
) -> Result<(SpecFacts, Option<PathBuf>, Option<ExecDefaults>), ShimError> {
    let bundle = bundle.to_path_buf();
    let runc = runc.clone();
    tokio::task::spawn_blocking(move || {
        let mut userns = None;
        if let Some(pod) = pod {
            crate::task::bundle::add_pod_files(&bundle, &pod)?;
            userns = pod.userns_path();
        }
        crate::task::bundle::save_runc(&bundle, &runc)?;
        let rootfs = crate::task::bundle::mount_rootfs(&bundle, &mounts, userns.as_deref())?;
        let exec_defaults = crate::runtime::direct_exec::container_allows(&spec, &runc)
            .then(|| crate::runtime::direct_exec::ExecDefaults::of(&spec));
        Ok((spec.facts(), rootfs, exec_defaults))
    })
    .await
    .map_err(|e| ShimError::Internal(format!("prepare bundle: {e}")))?
}

/// A held pod's containers need its handler's runtime: a pod whose runtime is missing
/// fails at once, as runc's create of a pause container would.
fn check_runtime(runc: &Runc) -> Result<(), ShimError> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = runc.program.as_ref().is_some_and(|program| {
        std::fs::metadata(program).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    });
    if runnable {
        return Ok(());
    }
    Err(ShimError::FailedPrecondition(format!(
        "the pod's OCI runtime {} is not an executable file",
        runc.binary
    )))
}

/// The bundle's spec, read off the async threads (a hung disk must not stop the pod).
async fn read_spec(bundle: &Path) -> Result<BundleSpec, ShimError> {
    let bundle = bundle.to_path_buf();
    tokio::task::spawn_blocking(move || {
        BundleSpec::read(&bundle)
            .map_err(|e| ShimError::io(format!("read {}/config.json", bundle.display()), e))
    })
    .await
    .map_err(|e| ShimError::Internal(format!("read spec: {e}")))?
}

pub async fn unmount_rootfs(rootfs: PathBuf) {
    let _ = tokio::task::spawn_blocking(move || crate::task::bundle::unmount_rootfs(&rootfs)).await;
}

/// The stdio runc gets: the FIFOs themselves, or a console socket for a terminal.
pub fn prepare_stdio(
    stdio: &StdioPaths,
) -> Result<(ProcessStdio, ProcessIo, Option<ConsoleSocket>), ShimError> {
    if stdio.terminal {
        let console =
            ConsoleSocket::new().map_err(|e| ShimError::io("console socket".into(), e))?;
        return Ok((ProcessStdio::default(), ProcessIo::default(), Some(console)));
    }
    let (process_stdio, io) = stdio::open_direct(stdio)?;
    Ok((process_stdio, io, None))
}

pub async fn receive_console(
    console: ConsoleSocket,
    stdio: &StdioPaths,
) -> Result<ProcessIo, ShimError> {
    let master = tokio::time::timeout(CONSOLE_TIMEOUT, console.receive())
        .await
        .map_err(|_| ShimError::Internal("runc sent no terminal".into()))?
        .map_err(|e| ShimError::io("receive terminal".into(), e))?;
    stdio::attach_console(master, stdio).map_err(|e| ShimError::io("terminal stdio".into(), e))
}

fn task_io(stdio: &StdioPaths) -> TaskIO {
    TaskIO {
        stdin: stdio.stdin.clone(),
        stdout: stdio.stdout.clone(),
        stderr: stdio.stderr.clone(),
        terminal: stdio.terminal,
        ..Default::default()
    }
}
