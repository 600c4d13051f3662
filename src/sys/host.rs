//! Facts about the host itself.

/// The node's hostname (empty when the kernel's cannot be read).
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Puts the calling thread in the `SCHED_IDLE` class: it runs only when no other thread
/// wants the CPU. For background work (a disk-usage walk) that must never slow a pull or
/// an RPC; the thread should end with its work (leaving that class needs privileges).
pub fn make_this_thread_idle() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` lives across the call; pid 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
