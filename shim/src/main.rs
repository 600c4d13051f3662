//! containerd-shim-crius-v2: crius's runtime v2 shim. containerd starts it per container
//! (`start`), it serves all containers of one pod from one process over ttrpc, runs runc
//! for them, reaps them, and publishes their events back to containerd. Started for a pod
//! through containerd 2.x's sandbox API, it also holds the pod itself (no pause container).

mod bootstrap;
mod bundle;
mod bundle_spec;
mod caps;
mod cgroup_leaf;
mod container;
mod control;
mod create;
mod delete;
mod direct_exec;
mod elf;
mod error;
mod events;
mod exec;
mod exec_fifo;
mod held;
mod holder;
mod idmap;
mod info;
mod oom;
mod pidfd;
mod pod;
mod process;
mod protos;
mod reaper;
mod runc;
mod sandbox_service;
mod serve;
mod service;
mod shim;
mod start;
mod stats;
mod stdio;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // A pod's holder: the shim clones it into the pod's namespaces and execs it so.
    if args.len() == 1 && args[0] == holder::PAUSE_ACTION {
        holder::pause();
    }
    // An exec the shim runs itself, where crius-exec-helper is not installed beside it: the
    // shim runs a sealed copy of its own binary for it.
    if args.first().map(String::as_str) == Some(direct_exec::helper::ACTION) {
        direct_exec::helper::run(&args);
    }
    let flags = match containerd_shim::parse(&args) {
        Ok(flags) => flags,
        Err(e) => {
            eprintln!("containerd-shim-crius-v2: {e}");
            std::process::exit(2);
        }
    };
    if flags.version {
        println!("containerd-shim-crius-v2 {}", service::VERSION);
        return;
    }
    if flags.info {
        if let Err(e) = info::run() {
            eprintln!("containerd-shim-crius-v2: {e}");
            std::process::exit(1);
        }
        return;
    }
    let result = match flags.action.as_str() {
        "start" => start::run(&flags),
        "delete" => delete::run(&flags),
        "" => serve::run(&flags),
        other => Err(format!("unknown action {other:?}").into()),
    };
    if let Err(e) = result {
        eprintln!("containerd-shim-crius-v2: {e}");
        std::process::exit(1);
    }
}
