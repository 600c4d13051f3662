//! The shim is the subreaper of its containers: every child that ends here, a runc command
//! or a container process reparented to the shim, is reaped by one loop, and its status goes
//! to whoever waits for it.

use std::collections::HashMap;
use std::io;
use std::process::Command;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, oneshot};

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    pub status: u32,
    pub at: SystemTime,
}

/// A reaped process that was not a command the shim ran itself.
#[derive(Debug, Clone, Copy)]
pub struct ProcessExit {
    pub pid: i32,
    pub status: u32,
    pub at: SystemTime,
}

pub struct Reaper {
    /// Commands the shim spawned and waits for, by pid. Children are spawned and reaped
    /// under this lock, so no exit is reaped before its waiter is registered.
    commands: Mutex<HashMap<i32, oneshot::Sender<u32>>>,
    exits: mpsc::UnboundedSender<ProcessExit>,
}

impl Reaper {
    pub fn new() -> (Arc<Self>, mpsc::UnboundedReceiver<ProcessExit>) {
        let (exits, receiver) = mpsc::unbounded_channel();
        let reaper = Arc::new(Self {
            commands: Mutex::new(HashMap::new()),
            exits,
        });
        (reaper, receiver)
    }

    /// Spawns `command` and returns its pid and where its exit status will arrive.
    pub fn spawn(&self, command: &mut Command) -> io::Result<(i32, oneshot::Receiver<u32>)> {
        self.spawn_with(command, |_| ())
            .map(|(pid, (), status)| (pid, status))
    }

    /// Spawns `command`, takes what `take` wants from the child (its pipes), and returns
    /// its pid and where its exit status will arrive.
    pub fn spawn_with<T>(
        &self,
        command: &mut Command,
        take: impl FnOnce(&mut std::process::Child) -> T,
    ) -> io::Result<(i32, T, oneshot::Receiver<u32>)> {
        let mut commands = self.commands.lock().unwrap_or_else(PoisonError::into_inner);
        let mut child = command.spawn()?;
        let pid = i32::try_from(child.id()).map_err(io::Error::other)?;
        let taken = take(&mut child);
        let (sender, receiver) = oneshot::channel();
        commands.insert(pid, sender);
        Ok((pid, taken, receiver))
    }

    /// Reaps children on every SIGCHLD until the runtime ends. The signal handler must be
    /// installed before the first child is spawned: call this before serving.
    pub fn watch(self: Arc<Self>) -> io::Result<()> {
        let mut sigchld = signal(SignalKind::child())?;
        tokio::spawn(async move {
            loop {
                self.reap_all();
                if sigchld.recv().await.is_none() {
                    break;
                }
            }
        });
        Ok(())
    }

    fn reap_all(&self) {
        let mut commands = self.commands.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some((pid, status)) = reap_one() {
            match commands.remove(&pid) {
                Some(waiter) => {
                    let _ = waiter.send(status);
                }
                None => {
                    let _ = self.exits.send(ProcessExit {
                        pid,
                        status,
                        at: SystemTime::now(),
                    });
                }
            }
        }
    }
}

/// Reaps one ended child: its pid and exit status (128 + the signal that killed it, any
/// signal, real-time ones too). None when no child has ended.
fn reap_one() -> Option<(i32, u32)> {
    loop {
        let mut raw = 0;
        // SAFETY: waitpid writes the status of a child into `raw`.
        let pid = unsafe { libc::waitpid(-1, &mut raw, libc::WNOHANG) };
        if pid <= 0 {
            return None;
        }
        if libc::WIFEXITED(raw) {
            return Some((pid, libc::WEXITSTATUS(raw) as u32));
        }
        if libc::WIFSIGNALED(raw) {
            return Some((pid, 128 + libc::WTERMSIG(raw) as u32));
        }
        // Stopped or continued: not an end.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn commands_get_their_status_and_others_go_to_exits() {
        let (reaper, mut exits) = Reaper::new();
        reaper.clone().watch().expect("SIGCHLD handler");
        let (_, status) = reaper
            .spawn(Command::new("sh").args(["-c", "exit 3"]))
            .expect("spawn sh");
        assert_eq!(status.await.expect("status"), 3);

        // A child spawned without the reaper is a container process to it; the reaper,
        // not the test, waits for it.
        #[allow(clippy::zombie_processes)]
        let child = Command::new("sh")
            .args(["-c", "kill -9 $$"])
            .spawn()
            .expect("spawn sh");
        let exit = exits.recv().await.expect("exit");
        assert_eq!(exit.pid, child.id() as i32);
        assert_eq!(exit.status, 137);

        // A real-time signal is an exit too.
        let (_, status) = reaper
            .spawn(Command::new("sh").args(["-c", "kill -40 $$"]))
            .expect("spawn sh");
        assert_eq!(status.await.expect("status"), 128 + 40);

        // A runc command past its time limit is killed (here: in this one test, as two
        // reapers in one process would take each other's children).
        let (pid, mut status) = reaper
            .spawn(Command::new("sleep").arg("30"))
            .expect("spawn sleep");
        let limit = Some(std::time::Duration::from_millis(200));
        let err = crate::runtime::runc::within_limit("kill", limit, pid, &mut status, async {})
            .await
            .expect_err("sleep 30 within 200 ms");
        assert!(err.to_string().contains("was killed"), "{err}");
        let code = tokio::time::timeout(std::time::Duration::from_secs(5), status)
            .await
            .expect("the killed command was reaped")
            .expect("status");
        assert_eq!(code, 128 + 9);
        assert!(crate::runtime::runc::time_limit("checkpoint").is_none());
        assert!(crate::runtime::runc::time_limit("create").is_some());
    }
}
