//! One process of a container, its init or an exec: its state, its stdio and its exit.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use containerd_shim_protos::api::Status;
use tokio::sync::watch;

use crate::runtime::reaper::Exit;
use crate::task::stdio::{ProcessIo, StdioPaths};

pub struct Process {
    pub container_id: String,
    /// Empty for a container's init process.
    pub exec_id: String,
    pub stdio: StdioPaths,
    /// The OCI process spec file of an exec.
    pub spec_file: Option<PathBuf>,
    /// An exec the shim may run itself (`direct_exec`), not through runc.
    pub direct_exec: bool,
    state: Mutex<ProcessState>,
    exited: watch::Sender<Option<Exit>>,
}

struct ProcessState {
    pid: i32,
    status: Status,
    io: ProcessIo,
    start: StartState,
    /// An exit that came while the process was being started: handled once the start
    /// event is out, so a client never sees the exit before the start.
    held_exit: Option<Exit>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StartState {
    NotStarted,
    Starting,
    Started,
}

/// A process's state as the task service reports it.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    pub pid: i32,
    pub status: Status,
    pub exit: Option<Exit>,
}

impl Process {
    pub fn new(
        container_id: &str,
        exec_id: &str,
        stdio: StdioPaths,
        spec_file: Option<PathBuf>,
    ) -> Self {
        Self {
            container_id: container_id.to_string(),
            exec_id: exec_id.to_string(),
            stdio,
            spec_file,
            direct_exec: false,
            state: Mutex::new(ProcessState {
                pid: 0,
                status: Status::CREATED,
                io: ProcessIo::default(),
                start: StartState::NotStarted,
                held_exit: None,
            }),
            exited: watch::channel(None).0,
        }
    }

    fn state(&self) -> MutexGuard<'_, ProcessState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn is_init(&self) -> bool {
        self.exec_id.is_empty()
    }

    /// The id events carry: the exec id, or the container id for init.
    pub fn event_id(&self) -> &str {
        if self.is_init() {
            &self.container_id
        } else {
            &self.exec_id
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        let state = self.state();
        Snapshot {
            pid: state.pid,
            status: state.status,
            exit: *self.exited.borrow(),
        }
    }

    pub fn pid(&self) -> i32 {
        self.state().pid
    }

    pub fn exit(&self) -> Option<Exit> {
        *self.exited.borrow()
    }

    /// Records the pid of a created process and the stdio the shim holds for it.
    pub fn set_created(&self, pid: i32, io: ProcessIo) {
        let mut state = self.state();
        state.pid = pid;
        state.io = io;
    }

    pub fn set_status(&self, status: Status) {
        let mut state = self.state();
        if state.status != Status::STOPPED {
            state.status = status;
        }
    }

    /// Marks the process as being started; false when it is started or starting already.
    pub fn begin_start(&self) -> bool {
        let mut state = self.state();
        if state.start != StartState::NotStarted {
            return false;
        }
        state.start = StartState::Starting;
        true
    }

    /// Ends a start (successful or not) and returns an exit that came meanwhile.
    pub fn end_start(&self, started: bool) -> Option<Exit> {
        let mut state = self.state();
        state.start = if started {
            StartState::Started
        } else {
            StartState::NotStarted
        };
        state.held_exit.take()
    }

    /// Keeps an exit while the process is being started; true when it was kept.
    pub fn hold_exit(&self, exit: Exit) -> bool {
        let mut state = self.state();
        if state.start != StartState::Starting {
            return false;
        }
        state.held_exit.get_or_insert(exit);
        true
    }

    /// Records the exit and lets go of the stdio; false when it was recorded already.
    pub fn set_exited(&self, exit: Exit) -> bool {
        let mut state = self.state();
        if self.exited.borrow().is_some() {
            return false;
        }
        state.status = Status::STOPPED;
        state.io.release();
        self.exited.send_replace(Some(exit));
        true
    }

    pub async fn wait(&self) -> Exit {
        let mut exited = self.exited.subscribe();
        loop {
            if let Some(exit) = *exited.borrow_and_update() {
                return exit;
            }
            if exited.changed().await.is_err() {
                return Exit {
                    status: 255,
                    at: SystemTime::now(),
                };
            }
        }
    }

    pub fn with_io<T>(&self, f: impl FnOnce(&mut ProcessIo) -> T) -> T {
        f(&mut self.state().io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn waiters_get_the_first_exit_only() {
        let process = std::sync::Arc::new(Process::new("c", "", StdioPaths::default(), None));
        process.set_created(42, ProcessIo::default());
        process.set_status(Status::RUNNING);
        let waiter = tokio::spawn({
            let process = process.clone();
            async move { process.wait().await }
        });
        let first = Exit {
            status: 3,
            at: SystemTime::now(),
        };
        assert!(process.set_exited(first));
        assert!(!process.set_exited(Exit {
            status: 9,
            at: SystemTime::now()
        }));
        assert_eq!(waiter.await.expect("waiter"), first);
        let snapshot = process.snapshot();
        assert_eq!(snapshot.status, Status::STOPPED);
        assert_eq!(snapshot.exit, Some(first));
        // A stopped process stays stopped.
        process.set_status(Status::RUNNING);
        assert_eq!(process.snapshot().status, Status::STOPPED);
    }

    #[test]
    fn an_exit_during_the_start_waits_for_its_end_and_starts_happen_once() {
        let process = Process::new("c", "e", StdioPaths::default(), None);
        let exit = Exit {
            status: 1,
            at: SystemTime::now(),
        };
        assert!(!process.hold_exit(exit), "nothing is held outside a start");
        assert!(process.begin_start());
        assert!(!process.begin_start(), "a second start is refused");
        assert!(process.hold_exit(exit));
        assert_eq!(process.exit(), None);
        assert_eq!(process.end_start(true), Some(exit));
        assert!(!process.begin_start(), "started once");
    }
}
