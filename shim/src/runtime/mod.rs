//! Running processes: runc and its exec FIFO, the shim's own execs without runc
//! (`direct_exec`, also built into crius-exec-helper), the reaper, pidfds, capabilities, the
//! bundle's spec and the ELF check. Nothing here knows of tasks or pods.

pub mod bundle_spec;
pub mod caps;
pub mod direct_exec;
pub mod elf;
pub mod exec_fifo;
pub mod pidfd;
pub mod reaper;
pub mod runc;
