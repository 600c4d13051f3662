//! One container in the shim: its bundle, its runtime, its init process and its execs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::task::JoinHandle;

use crate::runtime::bundle_spec::SpecFacts;
use crate::runtime::runc::Runc;
use crate::task::process::Process;

pub struct Container {
    pub id: String,
    pub bundle: PathBuf,
    pub runc: Runc,
    pub init: Arc<Process>,
    /// The rootfs the shim mounted (unmounted on delete).
    pub rootfs: Option<PathBuf>,
    /// Whether the container has a PID namespace of its own: when it does not, its init's
    /// exit does not end its other processes, and the shim kills them.
    pub own_pid_namespace: bool,
    /// Whether its spec has poststart hooks (which newer runc runs at start).
    pub poststart_hooks: bool,
    /// A pod sandbox the shim holds (`held.rs`): its init is the pod's holder, not runc's.
    pub held_pod: bool,
    /// What the shim's own exec needs of the container (`direct_exec`); unset: every
    /// exec goes to runc.
    pub exec_target: std::sync::OnceLock<crate::runtime::direct_exec::ExecTarget>,
    /// A pidfd of its init, taken at create: the shim signals a running init itself, as
    /// `runc kill` would, without a runc process; unset: every kill goes to runc.
    pub init_pidfd: std::sync::OnceLock<std::os::fd::OwnedFd>,
    /// The init's cgroup, found at create (a pid can be reused after the init exits).
    pub cgroup: Option<cgroups_rs::fs::Cgroup>,
    /// Held by every runtime command on the container itself (start, kill, delete, pause,
    /// resume, update, checkpoint): runc commands racing on one container see each other's
    /// transient states (a delete sees the cgroup a kill --all has frozen as "paused").
    pub ops: tokio::sync::Mutex<()>,
    execs: Mutex<HashMap<String, Arc<Process>>>,
    oom_watch: Mutex<Option<JoinHandle<()>>>,
    /// Its init was restored from a checkpoint: it runs already, start only reports it.
    restored: std::sync::atomic::AtomicBool,
}

impl Container {
    pub fn mark_restored(&self) {
        self.restored
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_restored(&self) -> bool {
        self.restored.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn new(
        id: &str,
        bundle: &Path,
        runc: Runc,
        init: Arc<Process>,
        rootfs: Option<PathBuf>,
        facts: SpecFacts,
        cgroup: Option<cgroups_rs::fs::Cgroup>,
    ) -> Self {
        Self {
            id: id.to_string(),
            bundle: bundle.to_path_buf(),
            runc,
            init,
            rootfs,
            own_pid_namespace: facts.own_pid_namespace,
            poststart_hooks: facts.poststart_hooks,
            held_pod: facts.held_pod,
            exec_target: std::sync::OnceLock::new(),
            init_pidfd: std::sync::OnceLock::new(),
            cgroup,
            ops: tokio::sync::Mutex::new(()),
            execs: Mutex::new(HashMap::new()),
            oom_watch: Mutex::new(None),
            restored: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A held pod's holder is no runtime's container: what only a runtime does to one
    /// (exec, pause, update, checkpoint) is refused.
    pub fn refuse_if_held(&self, what: &str) -> Result<(), crate::error::ShimError> {
        if self.held_pod {
            return Err(crate::error::ShimError::FailedPrecondition(format!(
                "cannot {what} pod {}: the shim holds it, it is not a container",
                self.id
            )));
        }
        Ok(())
    }

    fn exec_map(&self) -> MutexGuard<'_, HashMap<String, Arc<Process>>> {
        self.execs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The init process (`exec_id` empty) or an exec.
    pub fn process(&self, exec_id: &str) -> Option<Arc<Process>> {
        if exec_id.is_empty() {
            Some(self.init.clone())
        } else {
            self.exec_map().get(exec_id).cloned()
        }
    }

    /// Adds an exec; false when the id is taken.
    pub fn add_exec(&self, process: Arc<Process>) -> bool {
        let mut execs = self.exec_map();
        if execs.contains_key(&process.exec_id) {
            return false;
        }
        execs.insert(process.exec_id.clone(), process);
        true
    }

    pub fn execs(&self) -> Vec<Arc<Process>> {
        self.exec_map().values().cloned().collect()
    }

    pub fn remove_exec(&self, exec_id: &str) -> Option<Arc<Process>> {
        self.exec_map().remove(exec_id)
    }

    pub fn exec_pids(&self) -> HashMap<i32, String> {
        self.exec_map()
            .values()
            .map(|p| (p.pid(), p.exec_id.clone()))
            .collect()
    }

    pub fn set_oom_watch(&self, watch: JoinHandle<()>) {
        *self
            .oom_watch
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(watch);
    }

    pub fn stop_oom_watch(&self) {
        if let Some(watch) = self
            .oom_watch
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            watch.abort();
        }
    }
}
