//! `capset(2)` with its version 3 structures (64 capability bits in two words), for the
//! pod's holder and the exec helper's process.

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Sets the calling thread's effective, permitted and inheritable capabilities. A bare
/// system call (nothing allocated), so it may run between a fork and an exec; the result
/// is the call's (0, or -1 with errno set).
pub fn capset(effective: u64, permitted: u64, inheritable: u64) -> libc::c_long {
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let words = |mask: u64| [mask as u32, (mask >> 32) as u32];
    let (e, p, i) = (words(effective), words(permitted), words(inheritable));
    let data = [0, 1].map(|n| CapData {
        effective: e[n],
        permitted: p[n],
        inheritable: i[n],
    });
    // SAFETY: capset reads the header and two data structs of version 3.
    unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) }
}
