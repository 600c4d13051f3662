#![allow(dead_code)] // each benchmark uses what it needs
//! What the benchmarks that compare daemons read about them: the pids `make bench` writes,
//! and the CPU time a process has used.

/// The pid in the pid file that the environment variable `var` names (`make bench` sets it).
pub fn pid_from_file(var: &str) -> u32 {
    let path = std::env::var(var).unwrap_or_else(|_| panic!("{var} is not set: use `make bench`"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .parse()
        .expect("pid")
}

/// The CPU time `pid` and its waited-for children have used, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    // The fields after the command's closing parenthesis, from the state (field 3) on:
    // utime, stime, cutime and cstime are fields 14 to 17.
    let after_comm = &stat[stat.rfind(')').expect("comm in stat") + 2..];
    let ticks: u64 = (after_comm.split_whitespace().skip(11).take(4))
        .map(|f| f.parse::<u64>().expect("CPU ticks"))
        .sum();
    // SAFETY: sysconf has no memory arguments.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    ticks as f64 / per_second as f64
}
