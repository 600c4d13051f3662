//! The shim's state: containers by id, running processes by pid for the reaper, and the
//! handling of exits. The task operations are in `create.rs`, `exec.rs` and `control.rs`.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime};

use containerd_shim_protos::events::task::TaskExit;
use containerd_shim_protos::protobuf::well_known_types::timestamp::Timestamp;
use tokio::sync::{Notify, mpsc};

use crate::error::ShimError;
use crate::pod::Pod;
use crate::runtime::reaper::Exit;
use crate::runtime::reaper::{ProcessExit, Reaper};
use crate::task::container::Container;
use crate::task::events::{Events, topic};
use crate::task::process::Process;

pub struct Shim {
    pub namespace: String,
    pub(crate) reaper: Arc<Reaper>,
    pub(crate) events: Events,
    state: Mutex<State>,
    pub(crate) exec_files: AtomicU64,
    pub shutdown: Notify,
    /// The pod the shim holds itself (sandbox API), once CreateSandbox made it.
    pod: Mutex<Option<Arc<Pod>>>,
}

#[derive(Default)]
struct State {
    containers: HashMap<String, Arc<Container>>,
    /// Running processes by pid, for the reaper's exits.
    by_pid: HashMap<i32, Arc<Process>>,
    /// runc create/exec commands in flight: while there are any, exits of unknown pids are
    /// kept, since the process may exit before its pid file is read.
    starting: usize,
    unclaimed: HashMap<i32, Unclaimed>,
}

/// An exit of a pid nobody had registered, and when the reaper saw it.
struct Unclaimed {
    exit: Exit,
    seen: Instant,
}

/// Marks a runc create/exec in flight until dropped.
pub struct Starting<'a> {
    shim: &'a Shim,
    began: Instant,
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        let mut state = self.shim.state();
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
            pod: Mutex::new(None),
        }
    }

    pub fn pod(&self) -> Option<Arc<Pod>> {
        self.pod
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Keeps the pod CreateSandbox made; false when the shim holds one already.
    pub(crate) fn set_pod(&self, pod: Arc<Pod>) -> bool {
        let mut slot = self.pod.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_some() {
            return false;
        }
        *slot = Some(pod);
        true
    }

    /// The exit of `pid` the reaper saw while `starting` was in flight, before the pid was
    /// known. An exit seen before this start began was another process's that had the
    /// same pid (starts overlap, so the kept exits can be older than this one).
    pub(crate) fn take_early_exit(&self, starting: &Starting, pid: i32) -> Option<Exit> {
        Self::take_unclaimed(&mut self.state(), starting, pid)
    }

    /// Whether the reaper has an exit of `pid` that no process claimed yet: a process the
    /// shim knows by that pid may have ended and the pid been taken by another.
    pub(crate) fn exit_kept(&self, pid: i32) -> bool {
        self.state().unclaimed.contains_key(&pid)
    }

    fn take_unclaimed(state: &mut State, starting: &Starting, pid: i32) -> Option<Exit> {
        let unclaimed = state.unclaimed.remove(&pid)?;
        (unclaimed.seen >= starting.began).then_some(unclaimed.exit)
    }

    /// Whether a task Shutdown ends the shim: no containers, and no pod, which only
    /// ShutdownSandbox ends.
    pub fn is_idle(&self) -> bool {
        self.is_empty() && self.pod().is_none()
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

    pub fn has_container(&self, id: &str) -> bool {
        self.state().containers.contains_key(id)
    }

    pub(crate) fn add_container(&self, container: Arc<Container>) {
        self.state()
            .containers
            .insert(container.id.clone(), container);
    }

    /// Forgets a container and whatever of its processes the reaper still waits for.
    pub(crate) fn remove_container(&self, id: &str) {
        let mut state = self.state();
        state.containers.remove(id);
        state.by_pid.retain(|_, p| p.container_id != id);
    }

    pub fn is_empty(&self) -> bool {
        self.state().containers.is_empty()
    }

    /// The init pid of a container, 0 when unknown.
    pub fn init_pid(&self, id: &str) -> i32 {
        self.container(id).map(|c| c.init.pid()).unwrap_or(0)
    }

    /// Marks a runc create/exec in flight (see `State::starting`).
    pub(crate) fn begin_starting(&self) -> Starting<'_> {
        self.state().starting += 1;
        Starting {
            shim: self,
            began: Instant::now(),
        }
    }

    /// Records a new process's pid; if it has exited already, handles that exit. `starting`
    /// is the start of its command.
    pub(crate) fn register_pid(&self, starting: &Starting, pid: i32, process: &Arc<Process>) {
        let early = {
            let mut state = self.state();
            match Self::take_unclaimed(&mut state, starting, pid) {
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
        while let Some(ProcessExit { pid, status, at }) = exits.recv().await {
            let exit = Exit { status, at };
            if let Some(pod) = self.pod()
                && pod.pid() == pid
            {
                log::info!("pod {} holder {pid} exited with {status}", pod.id);
                pod.exited(exit);
                continue;
            }
            let process = {
                let mut state = self.state();
                let process = state.by_pid.remove(&pid);
                if process.is_none() && state.starting > 0 {
                    let seen = Instant::now();
                    state.unclaimed.insert(pid, Unclaimed { exit, seen });
                }
                process
            };
            if let Some(process) = process {
                self.process_exited(&process, exit);
            }
        }
    }

    /// Records an exit and publishes it, unless the process is being started: then the
    /// start handles it once its event is out.
    pub(crate) fn process_exited(&self, process: &Arc<Process>, exit: Exit) {
        if process.hold_exit(exit) || !process.set_exited(exit) {
            return;
        }
        self.publish_exit(process, exit);
        if process.is_init() {
            self.kill_orphans(&process.container_id);
        }
    }

    pub(crate) fn publish_exit(&self, process: &Process, exit: Exit) {
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
    }

    /// When an init without its own PID namespace exits, what it started lives on: end it
    /// as the runtime's kill --all does.
    fn kill_orphans(&self, id: &str) {
        let Ok(container) = self.container(id) else {
            return;
        };
        // A held pod's holder starts nothing that could outlive it.
        if container.own_pid_namespace || container.held_pod {
            return;
        }
        let reaper = self.reaper.clone();
        tokio::spawn(async move {
            let _ops = container.ops.lock().await;
            if let Err(e) = container
                .runc
                .kill(&reaper, &container.id, libc::SIGKILL as u32, true)
                .await
                && !e.is_gone()
            {
                log::warn!("killing what {} left running: {e}", container.id);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn unclaimed_after(shim: &Shim, pid: i32) {
        for _ in 0..100 {
            if shim.state().unclaimed.contains_key(&pid) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the exit of {pid} was not kept");
    }

    /// Starts overlap, so exits are kept for as long as any is in flight: one seen before a
    /// start began belonged to an earlier process with that pid, not to the new one.
    #[tokio::test]
    async fn a_start_takes_no_exit_seen_before_it_began() {
        let (reaper, _) = Reaper::new();
        let events = Events::start("/nonexistent/containerd.sock.ttrpc".into(), "t".into());
        let shim = Arc::new(Shim::new("t", reaper, events));
        let (exits, received) = mpsc::unbounded_channel();
        tokio::spawn(shim.clone().handle_exits(received));
        let exit = |pid| ProcessExit {
            pid,
            status: 137,
            at: SystemTime::now(),
        };

        let earlier = shim.begin_starting();
        exits.send(exit(4242)).expect("send");
        unclaimed_after(&shim, 4242).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
        let later = shim.begin_starting();
        assert!(shim.take_early_exit(&later, 4242).is_none());

        exits.send(exit(4343)).expect("send");
        unclaimed_after(&shim, 4343).await;
        let taken = shim
            .take_early_exit(&later, 4343)
            .expect("its own early exit");
        assert_eq!(taken.status, 137);
        drop((earlier, later));
        assert!(shim.state().unclaimed.is_empty());
    }
}
