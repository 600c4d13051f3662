//! The exec's OCI process spec as the shim's own exec carries it out, and what in it (or in
//! the container's spec) only runc may carry out.

use std::collections::BTreeMap;

use serde::Deserialize;

/// An exec's process (`runtime-spec`'s `process`), the keys the shim's exec knows.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecProcess {
    #[serde(default)]
    pub terminal: bool,
    #[serde(default)]
    pub user: User,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub cwd: String,
    #[serde(default)]
    pub capabilities: Option<Capabilities>,
    #[serde(default)]
    pub rlimits: Vec<Rlimit>,
    #[serde(default)]
    pub no_new_privileges: bool,
    #[serde(default)]
    pub apparmor_profile: String,
    #[serde(default)]
    pub oom_score_adj: Option<i32>,
    #[serde(default)]
    pub selinux_label: String,
    /// A terminal's size: runc's alone, with the terminal.
    #[serde(default, rename = "consoleSize")]
    _console_size: Option<serde_json::Value>,
    /// Keys the shim's exec does not know (a scheduler, an I/O priority, a CPU affinity):
    /// such a process goes to runc.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct User {
    #[serde(default)]
    pub uid: u32,
    #[serde(default)]
    pub gid: u32,
    /// runc's exec leaves the umask as it finds it (the shim's): read, not applied.
    #[serde(default, rename = "umask")]
    _umask: Option<u32>,
    #[serde(default)]
    pub additional_gids: Vec<u32>,
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Capabilities {
    #[serde(default)]
    pub bounding: Vec<String>,
    #[serde(default)]
    pub effective: Vec<String>,
    #[serde(default)]
    pub inheritable: Vec<String>,
    #[serde(default)]
    pub permitted: Vec<String>,
    #[serde(default)]
    pub ambient: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub struct Rlimit {
    #[serde(rename = "type")]
    pub kind: String,
    pub hard: u64,
    pub soft: u64,
}

/// The capability sets as bit masks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CapSets {
    pub bounding: u64,
    pub effective: u64,
    pub inheritable: u64,
    pub permitted: u64,
    pub ambient: u64,
}

impl CapSets {
    /// The sets without capabilities above `last_cap` (ones this kernel does not have).
    pub fn known_to(self, last_cap: u32) -> Self {
        let known = if last_cap >= 63 {
            u64::MAX
        } else {
            (1u64 << (last_cap + 1)) - 1
        };
        Self {
            bounding: self.bounding & known,
            effective: self.effective & known,
            inheritable: self.inheritable & known,
            permitted: self.permitted & known,
            ambient: self.ambient & known,
        }
    }
}

/// The capabilities by name, in the kernel's numbering.
const CAPABILITIES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// `setrlimit`'s resource type: glibc names it, musl takes an int.
#[cfg(target_env = "gnu")]
pub type Resource = libc::__rlimit_resource_t;
#[cfg(not(target_env = "gnu"))]
pub type Resource = libc::c_int;

/// The resource limits by name, as `setrlimit(2)` numbers them.
const RLIMITS: [(&str, Resource); 16] = [
    ("RLIMIT_CPU", libc::RLIMIT_CPU),
    ("RLIMIT_FSIZE", libc::RLIMIT_FSIZE),
    ("RLIMIT_DATA", libc::RLIMIT_DATA),
    ("RLIMIT_STACK", libc::RLIMIT_STACK),
    ("RLIMIT_CORE", libc::RLIMIT_CORE),
    ("RLIMIT_RSS", libc::RLIMIT_RSS),
    ("RLIMIT_NPROC", libc::RLIMIT_NPROC),
    ("RLIMIT_NOFILE", libc::RLIMIT_NOFILE),
    ("RLIMIT_MEMLOCK", libc::RLIMIT_MEMLOCK),
    ("RLIMIT_AS", libc::RLIMIT_AS),
    ("RLIMIT_LOCKS", libc::RLIMIT_LOCKS),
    ("RLIMIT_SIGPENDING", libc::RLIMIT_SIGPENDING),
    ("RLIMIT_MSGQUEUE", libc::RLIMIT_MSGQUEUE),
    ("RLIMIT_NICE", libc::RLIMIT_NICE),
    ("RLIMIT_RTPRIO", libc::RLIMIT_RTPRIO),
    ("RLIMIT_RTTIME", libc::RLIMIT_RTTIME),
];

fn capability_mask(names: &[String]) -> Option<u64> {
    names.iter().try_fold(0u64, |mask, name| {
        let bit = CAPABILITIES.iter().position(|c| c == name)?;
        Some(mask | 1 << bit)
    })
}

/// The `setrlimit` resource of an OCI rlimit type.
pub fn rlimit_resource(kind: &str) -> Option<Resource> {
    RLIMITS.iter().find(|(n, _)| *n == kind).map(|(_, r)| *r)
}

impl ExecProcess {
    /// Parses an exec's process spec.
    pub fn parse(text: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(text).map_err(|e| format!("exec process spec: {e}"))
    }

    /// Why runc must run this process rather than the shim: what the shim's exec does not
    /// do (a terminal, an LSM label, keys it does not know) or would do differently from
    /// runc (a capability or limit it cannot name, an environment runc refuses). None: the
    /// shim can.
    pub fn needs_runc(&self) -> Option<&'static str> {
        if self.terminal {
            return Some("a terminal");
        }
        if !self.apparmor_profile.is_empty() || !self.selinux_label.is_empty() {
            return Some("an LSM label");
        }
        if !self.other.is_empty() || !self.user.other.is_empty() {
            return Some("process keys the shim does not carry out");
        }
        if self.args.is_empty() || self.args[0].is_empty() {
            return Some("no program");
        }
        let strings = self.args.iter().chain(&self.env).chain([&self.cwd]);
        if strings.into_iter().any(|s| s.contains('\0')) {
            return Some("a NUL byte");
        }
        // runc refuses these with its own words.
        if self
            .env
            .iter()
            .any(|e| e.find('=').is_none_or(|at| at == 0))
        {
            return Some("an environment variable without a name or '='");
        }
        if !self.cwd.starts_with('/') {
            return Some("a relative working directory");
        }
        // -1 to setresuid means "leave it": runc refuses such ids.
        let ids = [self.user.uid, self.user.gid]
            .into_iter()
            .chain(self.user.additional_gids.iter().copied());
        if ids.into_iter().any(|id| id > i32::MAX as u32) {
            return Some("a user or group id out of range");
        }
        if self.cap_sets().is_none() {
            return Some("a capability the shim cannot name");
        }
        if self
            .rlimits
            .iter()
            .any(|r| rlimit_resource(&r.kind).is_none())
        {
            return Some("a resource limit the shim cannot name");
        }
        None
    }

    /// The capability sets (none given: none at all, as runc does).
    pub fn cap_sets(&self) -> Option<CapSets> {
        let Some(caps) = &self.capabilities else {
            return Some(CapSets::default());
        };
        Some(CapSets {
            bounding: capability_mask(&caps.bounding)?,
            effective: capability_mask(&caps.effective)?,
            inheritable: capability_mask(&caps.inheritable)?,
            permitted: capability_mask(&caps.permitted)?,
            ambient: capability_mask(&caps.ambient)?,
        })
    }

    /// The process's environment as runc gives it: each name once (the last value wins, in
    /// the place of its first), and `HOME` from the user's passwd entry when it has none.
    pub fn environment(&self, home: &str) -> Vec<String> {
        let mut env: Vec<String> = Vec::with_capacity(self.env.len() + 1);
        for entry in &self.env {
            let name = entry.split('=').next().unwrap_or_default();
            match env.iter_mut().find(|e| e.split('=').next() == Some(name)) {
                Some(existing) => existing.clone_from(entry),
                None => env.push(entry.clone()),
            }
        }
        match env.iter_mut().find(|e| e.starts_with("HOME=")) {
            Some(empty) if empty.len() == "HOME=".len() => *empty = format!("HOME={home}"),
            Some(_) => {}
            None => env.push(format!("HOME={home}")),
        }
        env
    }
}

/// The home directory of `uid` in a passwd file's text (`/` when it has no entry, as runc).
pub fn home_of(passwd: &str, uid: u32) -> String {
    passwd
        .lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.len() >= 6 && fields[2].trim().parse() == Ok(uid))
                .then(|| fields[5].to_string())
        })
        .unwrap_or_else(|| "/".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(json: &str) -> ExecProcess {
        ExecProcess::parse(json.as_bytes()).expect("process spec")
    }

    #[test]
    fn a_plain_exec_is_the_shims_and_what_runc_alone_does_is_runcs() {
        let plain = process(
            r#"{"user":{"uid":1000,"gid":1000,"additionalGids":[10]},"args":["sh"],
                "env":["PATH=/bin"],"cwd":"/","noNewPrivileges":true,"oomScoreAdj":5,
                "capabilities":{"bounding":["CAP_KILL"],"effective":["CAP_KILL"],
                "permitted":["CAP_KILL"]},"rlimits":[{"type":"RLIMIT_NOFILE","hard":9,"soft":8}]}"#,
        );
        assert_eq!(plain.needs_runc(), None);
        let cases = [
            (r#"{"terminal":true,"args":["sh"],"cwd":"/"}"#, "a terminal"),
            (
                r#"{"apparmorProfile":"p","args":["sh"],"cwd":"/"}"#,
                "an LSM label",
            ),
            (
                r#"{"selinuxLabel":"l","args":["sh"],"cwd":"/"}"#,
                "an LSM label",
            ),
            (
                r#"{"scheduler":{"policy":"SCHED_OTHER"},"args":["sh"],"cwd":"/"}"#,
                "process keys the shim does not carry out",
            ),
            (
                r#"{"user":{"username":"x"},"args":["sh"],"cwd":"/"}"#,
                "process keys the shim does not carry out",
            ),
            (r#"{"args":[],"cwd":"/"}"#, "no program"),
            (r#"{"args":["a\u0000b"],"cwd":"/"}"#, "a NUL byte"),
            (
                r#"{"args":["sh"],"env":["NOVALUE"],"cwd":"/"}"#,
                "an environment variable without a name or '='",
            ),
            (
                r#"{"args":["sh"],"env":["=x"],"cwd":"/"}"#,
                "an environment variable without a name or '='",
            ),
            (
                r#"{"args":["sh"],"cwd":"tmp"}"#,
                "a relative working directory",
            ),
            (
                r#"{"args":["sh"],"cwd":"/","user":{"uid":4294967295}}"#,
                "a user or group id out of range",
            ),
            (
                r#"{"args":["sh"],"cwd":"/","user":{"additionalGids":[2147483648]}}"#,
                "a user or group id out of range",
            ),
            (
                r#"{"args":["sh"],"cwd":"/","capabilities":{"bounding":["CAP_NOPE"]}}"#,
                "a capability the shim cannot name",
            ),
            (
                r#"{"args":["sh"],"cwd":"/","rlimits":[{"type":"RLIMIT_X","hard":1,"soft":1}]}"#,
                "a resource limit the shim cannot name",
            ),
        ];
        for (json, why) in cases {
            assert_eq!(process(json).needs_runc(), Some(why), "{json}");
        }
    }

    #[test]
    fn capabilities_are_the_kernels_bits() {
        let p = process(
            r#"{"capabilities":{"bounding":["CAP_CHOWN","CAP_KILL","CAP_CHECKPOINT_RESTORE"],
                "ambient":["CAP_NET_RAW"]}}"#,
        );
        let sets = p.cap_sets().expect("known names");
        assert_eq!(sets.bounding, 1 | 1 << 5 | 1 << 40);
        assert_eq!(sets.ambient, 1 << 13);
        assert_eq!(sets.effective, 0);
        assert_eq!(process("{}").cap_sets(), Some(CapSets::default()));
        let trimmed = sets.known_to(39);
        assert_eq!(trimmed.bounding, 1 | 1 << 5);
        assert_eq!(trimmed.ambient, 1 << 13);
        assert_eq!(rlimit_resource("RLIMIT_NOFILE"), Some(libc::RLIMIT_NOFILE));
    }

    #[test]
    fn the_environment_has_each_name_once_and_a_home() {
        let p = process(r#"{"env":["A=1","PATH=/bin","A=2","B=x=y"]}"#);
        assert_eq!(
            p.environment("/root"),
            ["A=2", "PATH=/bin", "B=x=y", "HOME=/root"]
        );
        let own = process(r#"{"env":["HOME=/h"]}"#);
        assert_eq!(own.environment("/root"), ["HOME=/h"]);
        let empty = process(r#"{"env":["HOME=","X=1"]}"#);
        assert_eq!(empty.environment("/"), ["HOME=/", "X=1"]);
    }

    #[test]
    fn home_comes_from_the_users_passwd_entry() {
        let passwd = "root:x:0:0:root:/root:/bin/sh\n# note\nbad line\nu:x:1000:1000::/home/u:/bin/sh\nshort:x:5:5::/short\n";
        assert_eq!(home_of(passwd, 0), "/root");
        assert_eq!(home_of(passwd, 1000), "/home/u");
        assert_eq!(home_of(passwd, 5), "/short");
        assert_eq!(home_of(passwd, 7), "/");
        assert_eq!(home_of("", 0), "/");
    }
}
