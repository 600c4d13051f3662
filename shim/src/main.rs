//! containerd-shim-crius-v2: crius's runtime v2 shim. containerd starts it per container
//! (`start`), it serves all containers of one pod from one process over ttrpc, runs runc
//! for them, reaps them, and publishes their events back to containerd. Started for a pod
//! through containerd 2.x's sandbox API, it also holds the pod itself (no pause container).

mod entry;
mod error;
mod pod;
mod protos;
mod runtime;
mod task;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // A pod's holder: the shim clones it into the pod's namespaces and execs it so.
    if args.len() == 1 && args[0] == pod::holder::PAUSE_ACTION {
        pod::holder::pause();
    }
    // An exec the shim runs itself, where crius-exec-helper is not installed beside it: the
    // shim runs a sealed copy of its own binary for it.
    if args.first().map(String::as_str) == Some(runtime::direct_exec::helper::ACTION) {
        runtime::direct_exec::helper::run(&args);
    }
    let flags = match containerd_shim::parse(&args) {
        Ok(flags) => flags,
        Err(e) => {
            eprintln!("containerd-shim-crius-v2: {e}");
            std::process::exit(2);
        }
    };
    if flags.version {
        println!("containerd-shim-crius-v2 {}", task::service::VERSION);
        return;
    }
    if flags.info {
        if let Err(e) = entry::info::run() {
            eprintln!("containerd-shim-crius-v2: {e}");
            std::process::exit(1);
        }
        return;
    }
    let result = match flags.action.as_str() {
        "start" => entry::start::run(&flags),
        "delete" => entry::delete::run(&flags),
        "" => entry::serve::run(&flags),
        other => Err(format!("unknown action {other:?}").into()),
    };
    if let Err(e) = result {
        eprintln!("containerd-shim-crius-v2: {e}");
        std::process::exit(1);
    }
}
