//! The serving shim: the task service on the listener `start` handed over, the reaper, and
//! the event queue, on one thread.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use containerd_shim::Flags;
use containerd_shim_protos::shim_async::create_task;
use containerd_shim_protos::ttrpc::r#async::Server;

use crate::entry::start::ActionResult;
use crate::protos::sandbox_ttrpc::create_sandbox;
use crate::runtime::reaper::Reaper;
use crate::task::events::Events;
use crate::task::sandbox_service::SandboxService;
use crate::task::service::TaskService;
use crate::task::shim::Shim;

const LISTENER_FD: i32 = 3;

pub fn run(flags: &Flags) -> ActionResult {
    // Container processes whose runc parent exits come to the shim to be reaped.
    nix::sys::prctl::set_child_subreaper(true)?;
    init_logging(flags.debug);
    // SAFETY: setting a signal disposition before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    one_malloc_arena();
    // Blocking work (mounts) is rare: its threads go soon after.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(4)
        .thread_keep_alive(Duration::from_secs(1))
        .build()?;
    runtime.block_on(serve(flags))
}

/// One malloc arena with glibc: the shim is idle nearly always, and each arena costs memory
/// (musl's allocator has none).
fn one_malloc_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: a malloc tunable, set before any thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Logs to the `log` FIFO containerd reads, when it is there.
fn init_logging(debug: bool) {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(file) = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("log")
    else {
        return;
    };
    let logger = containerd_shim::logger::FifoLogger::with_file(file);
    if log::set_boxed_logger(Box::new(logger)).is_ok() {
        log::set_max_level(if debug {
            log::LevelFilter::Debug
        } else {
            log::LevelFilter::Info
        });
    }
}

async fn serve(flags: &Flags) -> ActionResult {
    let (reaper, exits) = Reaper::new();
    reaper.clone().watch()?;
    let ttrpc_address =
        std::env::var("TTRPC_ADDRESS").unwrap_or_else(|_| format!("{}.ttrpc", flags.address));
    let events = Events::start(ttrpc_address, flags.namespace.clone());
    let shim = Arc::new(Shim::new(&flags.namespace, reaper, events.clone()));
    tokio::spawn(shim.clone().handle_exits(exits));

    let service = Arc::new(TaskService(shim.clone()));
    let mut services = create_task(service.clone());
    // containerd 1.6 and 2.x call a shim that printed a bare address as task v2; the
    // messages are the same as v3's.
    if let Some(v2) = create_task(service).remove("containerd.task.v3.Task") {
        services.insert("containerd.task.v2.Task".to_string(), v2);
    }
    // containerd 2.x drives a pod it hands to the shim through the sandbox service.
    services.extend(create_sandbox(Arc::new(SandboxService(shim.clone()))));
    // SAFETY: fd 3 is the listener `start` passed, owned by nothing else here.
    let listener = unsafe { OwnedFd::from_raw_fd(LISTENER_FD) };
    // Not for runc, nor the hooks it runs: a listener kept alive by them would make a dead
    // shim's socket look alive to the next `start`.
    nix::fcntl::fcntl(
        &listener,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    let listener = std::os::unix::net::UnixListener::from(listener);
    listener.set_nonblocking(true)?;
    let listener = tokio::net::UnixListener::from_std(listener)?;
    let mut server = Server::new()
        .add_listener(listener.into())
        .register_service(services);
    server.start().await?;
    log::info!(
        "shim serving {} in namespace {}",
        flags.socket,
        flags.namespace
    );

    shim.shutdown.notified().await;
    // Let the Shutdown answer and the last events go out first.
    tokio::time::sleep(Duration::from_millis(20)).await;
    events.flush(Duration::from_secs(2)).await;
    // The publisher forwards from a queue of its own.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _ = std::fs::remove_file(flags.socket.trim_start_matches("unix://"));
    let _ = tokio::task::spawn_blocking(crate::pod::cgroup_leaf::finish_pending).await;
    log::info!("shim exiting: no containers or pod left");
    Ok(())
}
