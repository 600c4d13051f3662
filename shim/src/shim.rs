//! The shim's state and the task operations on it: containers by id, processes by pid for
//! the reaper, and the events each operation publishes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use containerd_shim_protos::api::{Mount, Status};
use containerd_shim_protos::events::task::{
    TaskCheckpointed, TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskIO,
    TaskOOM, TaskPaused, TaskResumed, TaskStart,
};
use containerd_shim_protos::protobuf::well_known_types::timestamp::Timestamp;
use tokio::sync::{Notify, mpsc};

use crate::container::{BundleSpec, Container};
use crate::error::ShimError;
use crate::events::{Events, topic};
use crate::process::{Exit, Process};
use crate::reaper::{ProcessExit, Reaper};
use crate::runc::{CheckpointFlags, Runc, RuncError, RuncOptions, read_pid_file};
use crate::stdio::{self, ConsoleSocket, ProcessIo, StdioPaths};

/// How long the shim waits for runc to send a new terminal.
const CONSOLE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a create request carries, past the stdio.
pub struct CreateRequest {
    pub id: String,
    pub bundle: PathBuf,
    pub rootfs: Vec<Mount>,
    pub stdio: StdioPaths,
    pub runc: RuncOptions,
}

pub struct Shim {
    pub namespace: String,
    reaper: Arc<Reaper>,
    events: Events,
    state: Mutex<State>,
    exec_files: AtomicU64,
    pub shutdown: Notify,
}

#[derive(Default)]
struct State {
    containers: HashMap<String, Arc<Container>>,
    /// Running processes by pid, for the reaper's exits.
    by_pid: HashMap<i32, Arc<Process>>,
    /// runc create/exec commands in flight: while there are any, exits of unknown pids are
    /// kept, since the process may exit before its pid file is read.
    starting: usize,
    unclaimed: HashMap<i32, Exit>,
}

/// Marks a runc create/exec in flight until dropped.
struct Starting<'a>(&'a Shim);

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.starting -= 1;
        if state.starting == 0 {
            state.unclaimed.clear();
        }
    }
}

pub fn timestamp(at: SystemTime) -> Timestamp {
    let since = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let mut ts = Timestamp::new();
    ts.seconds = i64::try_from(since.as_secs()).unwrap_or(i64::MAX);
    ts.nanos = since.subsec_nanos() as i32;
    ts
}

impl Shim {
    pub fn new(namespace: &str, reaper: Arc<Reaper>, events: Events) -> Self {
        Self {
            namespace: namespace.to_string(),
            reaper,
            events,
            state: Mutex::new(State::default()),
            exec_files: AtomicU64::new(0),
            shutdown: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn container(&self, id: &str) -> Result<Arc<Container>, ShimError> {
        self.state()
            .containers
            .get(id)
            .cloned()
            .ok_or_else(|| ShimError::NotFound(format!("container {id}")))
    }

    pub fn process(&self, id: &str, exec_id: &str) -> Result<Arc<Process>, ShimError> {
        self.container(id)?
            .process(exec_id)
            .ok_or_else(|| ShimError::NotFound(format!("process {exec_id} of container {id}")))
    }

    pub fn is_empty(&self) -> bool {
        self.state().containers.is_empty()
    }

    /// The init pid of a container, 0 when unknown.
    pub fn init_pid(&self, id: &str) -> i32 {
        self.container(id).map(|c| c.init.pid()).unwrap_or(0)
    }

    fn begin_start(&self) -> Starting<'_> {
        self.state().starting += 1;
        Starting(self)
    }

    /// Records a new process's pid; if it has exited already, records that too.
    fn register_pid(&self, pid: i32, process: &Arc<Process>) {
        let early = {
            let mut state = self.state();
            match state.unclaimed.remove(&pid) {
                Some(exit) => Some(exit),
                None => {
                    state.by_pid.insert(pid, process.clone());
                    None
                }
            }
        };
        if let Some(exit) = early {
            self.process_exited(process, exit);
        }
    }

    /// Handles the reaper's exits until it stops.
    pub async fn handle_exits(self: Arc<Self>, mut exits: mpsc::UnboundedReceiver<ProcessExit>) {
        while let Some(exit) = exits.recv().await {
            let process = {
                let mut state = self.state();
                let process = state.by_pid.remove(&exit.pid);
                if process.is_none() && state.starting > 0 {
                    state.unclaimed.insert(
                        exit.pid,
                        Exit {
                            status: exit.status,
                            at: exit.at,
                        },
                    );
                }
                process
            };
            if let Some(process) = process {
                self.process_exited(
                    &process,
                    Exit {
                        status: exit.status,
                        at: exit.at,
                    },
                );
            }
        }
    }

    fn process_exited(&self, process: &Arc<Process>, exit: Exit) {
        if !process.set_exited(exit) {
            return;
        }
        self.events.publish(
            topic::EXIT,
            Box::new(TaskExit {
                container_id: process.container_id.clone(),
                id: process.event_id().to_string(),
                pid: process.pid() as u32,
                exit_status: exit.status,
                exited_at: Some(timestamp(exit.at)).into(),
                ..Default::default()
            }),
        );
        if process.is_init() {
            self.kill_orphans(&process.container_id);
        }
    }

    /// When an init without its own PID namespace exits, what it started lives on: end it
    /// as the runtime's kill --all does.
    fn kill_orphans(&self, id: &str) {
        let Ok(container) = self.container(id) else {
            return;
        };
        if container.own_pid_namespace {
            return;
        }
        let reaper = self.reaper.clone();
        tokio::spawn(async move {
            let _ = container
                .runc
                .kill(&reaper, &container.id, libc::SIGKILL as u32, true)
                .await;
        });
    }

    pub async fn create(&self, request: CreateRequest) -> Result<i32, ShimError> {
        let CreateRequest {
            id,
            bundle,
            rootfs,
            stdio,
            runc,
        } = request;
        if id.is_empty() {
            return Err(ShimError::InvalidArgument("container id is empty".into()));
        }
        if self.state().containers.contains_key(&id) {
            return Err(ShimError::AlreadyExists(format!("container {id}")));
        }
        let spec = BundleSpec::read(&bundle)
            .map_err(|e| ShimError::io(format!("read {}/config.json", bundle.display()), e))?;
        let runc = crate::runc::runc_for(&runc, &self.namespace, &bundle);
        crate::bundle::save_runc(&bundle, &runc)?;
        let rootfs = crate::bundle::mount_rootfs(&bundle, &rootfs)?;
        let created = self.create_init(&id, &bundle, &runc, &stdio).await;
        let (pid, io) = match created {
            Ok(created) => created,
            Err(e) => {
                if let Some(rootfs) = &rootfs {
                    crate::bundle::unmount_rootfs(rootfs);
                }
                return Err(e);
            }
        };
        let init = Arc::new(Process::new(&id, "", stdio.clone(), None));
        init.set_created(pid, io);
        let container = Arc::new(Container::new(
            &id,
            &bundle,
            runc,
            init.clone(),
            rootfs,
            spec.own_pid_namespace(),
        ));
        self.state()
            .containers
            .insert(id.clone(), container.clone());
        self.register_pid(pid, &init);
        self.watch_oom(&container, pid);
        self.events.publish(
            topic::CREATE,
            Box::new(TaskCreate {
                container_id: id,
                bundle: bundle.display().to_string(),
                io: Some(task_io(&stdio)).into(),
                pid: pid as u32,
                ..Default::default()
            }),
        );
        Ok(pid)
    }

    async fn create_init(
        &self,
        id: &str,
        bundle: &Path,
        runc: &Runc,
        stdio: &StdioPaths,
    ) -> Result<(i32, ProcessIo), ShimError> {
        let _starting = self.begin_start();
        let pid_file = bundle.join("init.pid");
        let (io, console) = prepare_stdio(stdio)?;
        let (process_stdio, io) = io;
        runc.create(
            &self.reaper,
            id,
            bundle,
            &pid_file,
            console.as_ref().map(|c| c.path()).as_deref(),
            process_stdio,
        )
        .await?;
        let pid = read_pid_file(&pid_file)
            .map_err(|e| ShimError::io(format!("read {}", pid_file.display()), e))?;
        let io = match console {
            Some(console) => receive_console(console, stdio).await?,
            None => io,
        };
        Ok((pid, io))
    }

    fn watch_oom(&self, container: &Arc<Container>, pid: i32) {
        let events = self.events.clone();
        let id = container.id.clone();
        match crate::oom::watch(pid, move || {
            events.publish(
                topic::OOM,
                Box::new(TaskOOM {
                    container_id: id.clone(),
                    ..Default::default()
                }),
            );
        }) {
            Ok(watch) => container.set_oom_watch(watch),
            Err(e) => log::warn!("no OOM notification for {}: {e}", container.id),
        }
    }

    pub async fn start(&self, id: &str, exec_id: &str) -> Result<i32, ShimError> {
        let container = self.container(id)?;
        if exec_id.is_empty() {
            return self.start_init(&container).await;
        }
        let process = container
            .process(exec_id)
            .ok_or_else(|| ShimError::NotFound(format!("exec {exec_id} of container {id}")))?;
        if process.pid() != 0 {
            return Err(ShimError::FailedPrecondition(format!(
                "exec {exec_id} was started already"
            )));
        }
        let pid = self.start_exec(&container, &process).await?;
        self.events.publish(
            topic::EXEC_STARTED,
            Box::new(TaskExecStarted {
                container_id: id.to_string(),
                exec_id: exec_id.to_string(),
                pid: pid as u32,
                ..Default::default()
            }),
        );
        Ok(pid)
    }

    async fn start_init(&self, container: &Container) -> Result<i32, ShimError> {
        let init = &container.init;
        let snapshot = init.snapshot();
        if snapshot.status != Status::CREATED || snapshot.exit.is_some() {
            return Err(ShimError::FailedPrecondition(format!(
                "container {} is not in the created state",
                container.id
            )));
        }
        container.runc.start(&self.reaper, &container.id).await?;
        init.set_status(Status::RUNNING);
        self.events.publish(
            topic::START,
            Box::new(TaskStart {
                container_id: container.id.clone(),
                pid: snapshot.pid as u32,
                ..Default::default()
            }),
        );
        Ok(snapshot.pid)
    }

    async fn start_exec(
        &self,
        container: &Container,
        process: &Arc<Process>,
    ) -> Result<i32, ShimError> {
        let spec_file = process
            .spec_file
            .clone()
            .ok_or_else(|| ShimError::Internal("exec without a process spec".into()))?;
        let pid_file = spec_file.with_extension("pid");
        let _starting = self.begin_start();
        let (io, console) = prepare_stdio(&process.stdio)?;
        let (process_stdio, io) = io;
        container
            .runc
            .exec(
                &self.reaper,
                &container.id,
                &spec_file,
                &pid_file,
                console.as_ref().map(|c| c.path()).as_deref(),
                process_stdio,
            )
            .await?;
        let pid = read_pid_file(&pid_file)
            .map_err(|e| ShimError::io(format!("read {}", pid_file.display()), e))?;
        let _ = std::fs::remove_file(&pid_file);
        let io = match console {
            Some(console) => receive_console(console, &process.stdio).await?,
            None => io,
        };
        process.set_created(pid, io);
        process.set_status(Status::RUNNING);
        self.register_pid(pid, process);
        Ok(pid)
    }

    pub fn add_exec(
        &self,
        id: &str,
        exec_id: &str,
        stdio: StdioPaths,
        spec: &[u8],
    ) -> Result<(), ShimError> {
        let container = self.container(id)?;
        if exec_id.is_empty() {
            return Err(ShimError::InvalidArgument("exec id is empty".into()));
        }
        if container.init.exit().is_some() {
            return Err(ShimError::FailedPrecondition(format!(
                "container {id} is not running"
            )));
        }
        let spec: serde_json::Value = serde_json::from_slice(spec)
            .map_err(|e| ShimError::InvalidArgument(format!("exec process spec: {e}")))?;
        if !spec.is_object() {
            return Err(ShimError::InvalidArgument(
                "exec process spec is not an object".into(),
            ));
        }
        let n = self.exec_files.fetch_add(1, Ordering::Relaxed);
        let spec_file = container.bundle.join(format!("exec-{n}.json"));
        std::fs::write(&spec_file, spec.to_string())
            .map_err(|e| ShimError::io(format!("write {}", spec_file.display()), e))?;
        let process = Arc::new(Process::new(id, exec_id, stdio, Some(spec_file.clone())));
        if !container.add_exec(process) {
            let _ = std::fs::remove_file(&spec_file);
            return Err(ShimError::AlreadyExists(format!(
                "exec {exec_id} in container {id}"
            )));
        }
        self.events.publish(
            topic::EXEC_ADDED,
            Box::new(TaskExecAdded {
                container_id: id.to_string(),
                exec_id: exec_id.to_string(),
                ..Default::default()
            }),
        );
        Ok(())
    }

    pub async fn kill(
        &self,
        id: &str,
        exec_id: &str,
        signal: u32,
        all: bool,
    ) -> Result<(), ShimError> {
        let container = self.container(id)?;
        let process = container
            .process(exec_id)
            .ok_or_else(|| ShimError::NotFound(format!("process {exec_id} of container {id}")))?;
        if process.exit().is_some() {
            return Err(ShimError::NotFound("process already finished".into()));
        }
        if !exec_id.is_empty() {
            let pid = process.pid();
            if pid <= 0 {
                return Err(ShimError::FailedPrecondition(format!(
                    "exec {exec_id} was not started"
                )));
            }
            let signal = nix::sys::signal::Signal::try_from(signal as i32)
                .map_err(|_| ShimError::InvalidArgument(format!("signal {signal}")))?;
            return match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal) {
                Ok(()) => Ok(()),
                Err(nix::errno::Errno::ESRCH) => {
                    Err(ShimError::NotFound("process already finished".into()))
                }
                Err(e) => Err(ShimError::io("kill".into(), e.into())),
            };
        }
        match container.runc.kill(&self.reaper, id, signal, all).await {
            Err(e) if e.is_gone() => Err(ShimError::NotFound("process already finished".into())),
            other => Ok(other?),
        }
    }

    /// Deletes an exec's record, or a container: its runtime state, its rootfs mount.
    pub async fn delete(&self, id: &str, exec_id: &str) -> Result<(i32, Exit), ShimError> {
        let container = self.container(id)?;
        if !exec_id.is_empty() {
            return self.delete_exec(&container, exec_id);
        }
        let init = container.init.clone();
        let snapshot = init.snapshot();
        let exit = match snapshot.exit {
            Some(exit) => {
                match container.runc.delete(&self.reaper, id, false).await {
                    Err(e) if !e.is_gone() => return Err(e.into()),
                    _ => {}
                }
                exit
            }
            None if snapshot.status == Status::CREATED => {
                container.runc.delete(&self.reaper, id, true).await?;
                tokio::time::timeout(Duration::from_secs(2), init.wait())
                    .await
                    .unwrap_or(Exit {
                        status: 137,
                        at: SystemTime::now(),
                    })
            }
            None => {
                return Err(ShimError::FailedPrecondition(format!(
                    "container {id} is running: kill it first"
                )));
            }
        };
        container.stop_oom_watch();
        if let Some(rootfs) = &container.rootfs {
            crate::bundle::unmount_rootfs(rootfs);
        }
        {
            let mut state = self.state();
            state.containers.remove(id);
            state.by_pid.retain(|_, p| p.container_id != id);
        }
        self.events.publish(
            topic::DELETE,
            Box::new(TaskDelete {
                container_id: id.to_string(),
                pid: snapshot.pid as u32,
                exit_status: exit.status,
                exited_at: Some(timestamp(exit.at)).into(),
                ..Default::default()
            }),
        );
        Ok((snapshot.pid, exit))
    }

    fn delete_exec(&self, container: &Container, exec_id: &str) -> Result<(i32, Exit), ShimError> {
        let process = container.process(exec_id).ok_or_else(|| {
            ShimError::NotFound(format!("exec {exec_id} of container {}", container.id))
        })?;
        let snapshot = process.snapshot();
        let exit = match snapshot.exit {
            Some(exit) => exit,
            None if snapshot.pid == 0 => Exit {
                status: 0,
                at: SystemTime::now(),
            },
            None => {
                return Err(ShimError::FailedPrecondition(format!(
                    "exec {exec_id} is running"
                )));
            }
        };
        container.remove_exec(exec_id);
        if let Some(spec_file) = &process.spec_file {
            let _ = std::fs::remove_file(spec_file);
        }
        Ok((snapshot.pid, exit))
    }

    pub async fn pause(&self, id: &str) -> Result<(), ShimError> {
        let container = self.running(id)?;
        container.runc.pause(&self.reaper, id).await?;
        container.init.set_status(Status::PAUSED);
        self.events.publish(
            topic::PAUSED,
            Box::new(TaskPaused {
                container_id: id.to_string(),
                ..Default::default()
            }),
        );
        Ok(())
    }

    pub async fn resume(&self, id: &str) -> Result<(), ShimError> {
        let container = self.container(id)?;
        if container.init.snapshot().status != Status::PAUSED {
            return Err(ShimError::FailedPrecondition(format!(
                "container {id} is not paused"
            )));
        }
        container.runc.resume(&self.reaper, id).await?;
        container.init.set_status(Status::RUNNING);
        self.events.publish(
            topic::RESUMED,
            Box::new(TaskResumed {
                container_id: id.to_string(),
                ..Default::default()
            }),
        );
        Ok(())
    }

    fn running(&self, id: &str) -> Result<Arc<Container>, ShimError> {
        let container = self.container(id)?;
        let snapshot = container.init.snapshot();
        if snapshot.status != Status::RUNNING || snapshot.exit.is_some() {
            return Err(ShimError::FailedPrecondition(format!(
                "container {id} is not running"
            )));
        }
        Ok(container)
    }

    pub async fn pids(&self, id: &str) -> Result<Vec<(u32, Option<String>)>, ShimError> {
        let container = self.container(id)?;
        let pids = container.runc.ps(&self.reaper, id).await?;
        let execs = container.exec_pids();
        Ok(pids
            .into_iter()
            .map(|pid| (pid, execs.get(&(pid as i32)).cloned()))
            .collect())
    }

    pub async fn update(&self, id: &str, resources: Vec<u8>) -> Result<(), ShimError> {
        let container = self.container(id)?;
        serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&resources)
            .map_err(|e| ShimError::InvalidArgument(format!("resources: {e}")))?;
        container.runc.update(&self.reaper, id, resources).await?;
        Ok(())
    }

    /// Checkpoints a running or paused container (containerd's client pauses it first).
    pub async fn checkpoint(&self, id: &str, flags: CheckpointFlags) -> Result<(), ShimError> {
        let container = self.container(id)?;
        let snapshot = container.init.snapshot();
        if !matches!(snapshot.status, Status::RUNNING | Status::PAUSED) || snapshot.exit.is_some() {
            return Err(ShimError::FailedPrecondition(format!(
                "container {id} is not running"
            )));
        }
        let mut flags = flags;
        if flags.work_path.is_empty() {
            // CRIU's log stays with the bundle, out of the image.
            flags.work_path = container.bundle.display().to_string();
        }
        container
            .runc
            .checkpoint(&self.reaper, id, &flags)
            .await
            .map_err(|e| match e {
                RuncError::Failed { verb, message } => RuncError::Failed {
                    verb,
                    message: format!("{message} (CRIU's log: {}/dump.log)", flags.work_path),
                },
                other => other,
            })?;
        self.events.publish(
            topic::CHECKPOINTED,
            Box::new(TaskCheckpointed {
                container_id: id.to_string(),
                checkpoint: flags.image_path.clone(),
                ..Default::default()
            }),
        );
        Ok(())
    }
}

type PreparedStdio = (
    (crate::runc::ProcessStdio, ProcessIo),
    Option<ConsoleSocket>,
);

/// The stdio runc gets: the FIFOs themselves, or a console socket for a terminal.
fn prepare_stdio(stdio: &StdioPaths) -> Result<PreparedStdio, ShimError> {
    if stdio.terminal {
        let console =
            ConsoleSocket::new().map_err(|e| ShimError::io("console socket".into(), e))?;
        return Ok(((Default::default(), ProcessIo::default()), Some(console)));
    }
    let direct = stdio::open_direct(stdio).map_err(|e| ShimError::io("stdio".into(), e))?;
    Ok((direct, None))
}

async fn receive_console(
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
