//! Start (a container's init or an exec) and Exec (an exec's record and process spec).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use containerd_shim_protos::api::Status;
use containerd_shim_protos::events::task::{TaskExecAdded, TaskExecStarted, TaskStart};
use serde::Deserialize;

use crate::error::ShimError;
use crate::runtime::reaper::Exit;
use crate::runtime::runc::read_pid_file;
use crate::task::container::Container;
use crate::task::create::{prepare_stdio, receive_console};
use crate::task::events::topic;
use crate::task::process::Process;
use crate::task::shim::Shim;
use crate::task::stdio::{ProcessIo, StdioPaths};

impl Shim {
    pub async fn start(&self, id: &str, exec_id: &str) -> Result<i32, ShimError> {
        let container = self.container(id)?;
        let process = container
            .process(exec_id)
            .ok_or_else(|| ShimError::NotFound(format!("exec {exec_id} of container {id}")))?;
        // A restored init runs from create on: if it ended already, its start is its pid
        // (its exit was reported when it came).
        if exec_id.is_empty() && container.is_restored() && process.exit().is_some() {
            return Ok(process.pid());
        }
        if exec_id.is_empty() && container.held_pod && process.exit().is_some() {
            return Err(ShimError::FailedPrecondition(format!(
                "the holder of pod {id} exited before its start"
            )));
        }
        if process.exit().is_some() || !process.begin_start() {
            return Err(ShimError::FailedPrecondition(format!(
                "process {} of container {id} was started already",
                process.event_id()
            )));
        }
        let started = if exec_id.is_empty() {
            self.start_init(&container).await
        } else {
            self.start_exec(&container, &process).await
        };
        // An exit that came during the start goes out after the start event.
        if let Some(exit) = process.end_start(started.is_ok()) {
            self.process_exited(&process, exit);
        }
        started
    }

    async fn start_init(&self, container: &Container) -> Result<i32, ShimError> {
        let _ops = container.ops.lock().await;
        let init = &container.init;
        // A held pod's holder runs from its create on, as a restored init does.
        if !container.is_restored() && !container.held_pod {
            container
                .runc
                .start_created(
                    &self.reaper,
                    &container.id,
                    init.pid(),
                    container.poststart_hooks,
                )
                .await?;
        }
        init.set_status(Status::RUNNING);
        let pid = init.pid();
        self.events.publish(
            topic::START,
            Box::new(TaskStart {
                container_id: container.id.clone(),
                pid: pid as u32,
                ..Default::default()
            }),
        );
        Ok(pid)
    }

    async fn start_exec(
        &self,
        container: &Container,
        process: &Arc<Process>,
    ) -> Result<i32, ShimError> {
        // Exits of the new process are kept from here until its pid is registered.
        let starting = self.begin_starting();
        match self.run_exec(container, process).await {
            Ok(pid) => {
                process.set_status(Status::RUNNING);
                self.events.publish(
                    topic::EXEC_STARTED,
                    Box::new(TaskExecStarted {
                        container_id: container.id.clone(),
                        exec_id: process.exec_id.clone(),
                        pid: pid as u32,
                        ..Default::default()
                    }),
                );
                self.register_pid(&starting, pid, process);
                Ok(pid)
            }
            Err(e) => {
                // It never ran: its waiters get an exit rather than waiting forever.
                process.set_exited(Exit {
                    status: 255,
                    at: SystemTime::now(),
                });
                Err(e)
            }
        }
    }

    /// The exec started detached, with the stdio the process gets: by the shim's own
    /// exec when it can, else (or when its helper declines) by runc.
    async fn run_exec(&self, container: &Container, process: &Process) -> Result<i32, ShimError> {
        let spec_file = process
            .spec_file
            .clone()
            .ok_or_else(|| ShimError::Internal("exec without a process spec".into()))?;
        let pid_file = spec_file.with_extension("pid");
        let started = self
            .start_exec_process(container, process, &spec_file, &pid_file)
            .await;
        let io = match started {
            Ok(io) => io,
            Err(e) => {
                let _ = std::fs::remove_file(&pid_file);
                return Err(e);
            }
        };
        let pid = read_pid_file(&pid_file)
            .map_err(|e| ShimError::io(format!("read {}", pid_file.display()), e))?;
        let _ = std::fs::remove_file(&pid_file);
        process.set_created(pid, io);
        Ok(pid)
    }

    /// Runs the exec's start command; returns the shim's side of its stdio.
    async fn start_exec_process(
        &self,
        container: &Container,
        process: &Process,
        spec_file: &Path,
        pid_file: &Path,
    ) -> Result<ProcessIo, ShimError> {
        if let Some(io) = self
            .exec_directly(container, process, spec_file, pid_file)
            .await?
        {
            return Ok(io);
        }
        let (process_stdio, io, console) = prepare_stdio(&process.stdio)?;
        container
            .runc
            .exec(
                &self.reaper,
                &container.id,
                spec_file,
                pid_file,
                console.as_ref().map(|c| c.path()).as_deref(),
                process_stdio,
            )
            .await?;
        match console {
            Some(console) => Ok(receive_console(console, &process.stdio).await?),
            None => Ok(io),
        }
    }

    /// The shim's own exec (`direct_exec`). None: runc is to run it (the container or the
    /// exec needs runc, the binary's copy failed, or the helper declined before touching
    /// the container).
    async fn exec_directly(
        &self,
        container: &Container,
        process: &Process,
        spec_file: &Path,
        pid_file: &Path,
    ) -> Result<Option<ProcessIo>, ShimError> {
        let Some(target) = container.exec_target.get() else {
            return Ok(None);
        };
        if !process.direct_exec || process.stdio.terminal {
            return Ok(None);
        }
        let goes_to_runc = |e: &dyn std::fmt::Display| {
            log::warn!("exec in {} goes to runc: {e}", container.id);
        };
        let prepared = match crate::runtime::direct_exec::prepare(target).await {
            Ok(prepared) => prepared,
            Err(e) => {
                goes_to_runc(&e);
                return Ok(None);
            }
        };
        let (process_stdio, io, _) = prepare_stdio(&process.stdio)?;
        let ran = crate::runtime::direct_exec::exec(
            &self.reaper,
            &container.runc,
            &container.id,
            prepared,
            spec_file,
            pid_file,
            process_stdio,
        )
        .await;
        match ran {
            Ok(()) => Ok(Some(io)),
            Err(e) if crate::runtime::direct_exec::declined(&e) => {
                goes_to_runc(&e);
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
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
        container.refuse_if_held("exec in")?;
        if container.init.exit().is_some() {
            return Err(ShimError::FailedPrecondition(format!(
                "container {id} is not running"
            )));
        }
        let spec: serde_json::Value = serde_json::from_slice(spec)
            .map_err(|e| ShimError::InvalidArgument(format!("exec process spec: {e}")))?;
        let serde_json::Value::Object(mut spec) = spec else {
            return Err(ShimError::InvalidArgument(
                "exec process spec is not an object".into(),
            ));
        };
        // For the shim's own exec the spec gets what runc would take from the container.
        let direct = container.exec_target.get().is_some_and(|target| {
            let mut completed = spec.clone();
            target.defaults.apply(&mut completed);
            let fits = crate::runtime::direct_exec::spec::ExecProcess::deserialize(&completed)
                .is_ok_and(|p| p.needs_runc().is_none());
            if fits {
                spec = completed;
            }
            fits
        });
        let spec = serde_json::Value::Object(spec);
        // Named by a counter, not by the exec id, which is the client's text.
        let n = self.exec_files.fetch_add(1, Ordering::Relaxed);
        let spec_file = container.bundle.join(format!("exec-{n}.json"));
        std::fs::write(&spec_file, spec.to_string())
            .map_err(|e| ShimError::io(format!("write {}", spec_file.display()), e))?;
        let mut process = Process::new(id, exec_id, stdio, Some(spec_file.clone()));
        process.direct_exec = direct;
        let process = Arc::new(process);
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
}
