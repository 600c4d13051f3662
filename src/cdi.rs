//! CDI, the Container Device Interface: devices named `vendor.com/class=name` in a
//! container's `CDI_devices` or in its `cdi.k8s.io/*` annotations, found in the spec files
//! (JSON or YAML) of the CDI directories and applied to the container's OCI spec as their
//! container edits say: device nodes (with their cgroup rules), mounts, environment, hooks
//! and additional groups.
//!
//! The directories are read again for each container that asks for devices, so a spec a
//! driver writes or removes counts from the next container on, as with the CNI conf dir.
//! Spec files are the drivers' bytes on disk: each is bounded in size, and a broken one only
//! costs the devices it would have named.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    HookBuilder, Hooks, LinuxDeviceCgroupBuilder, LinuxDeviceType, MountBuilder, Spec,
};
use serde::Deserialize;

/// Container annotations that name CDI devices (comma-separated).
pub const ANNOTATION_PREFIX: &str = "cdi.k8s.io/";
const MAX_SPEC_FILE: u64 = 1 << 20;
const MAX_SPEC_FILES: usize = 1024;
/// All spec files together: what one container's create may read.
const MAX_SPEC_BYTES: u64 = 16 << 20;
/// The CDI spec versions crius reads (kubelet's drivers write 0.3.0 to 1.1.0).
const VERSIONS: [&str; 9] = [
    "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0", "1.1.1",
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CdiError {
    #[error("CDI device {0:?} is not a qualified name (vendor.com/class=name)")]
    BadName(String),
    #[error("CDI device {device} is not in any CDI spec{}", broken_files(.broken))]
    Unknown { device: String, broken: Vec<String> },
    #[error("CDI device {device} (from {file}): {reason}")]
    BadEdit {
        device: String,
        file: String,
        reason: String,
    },
}

fn broken_files(broken: &[String]) -> String {
    if broken.is_empty() {
        String::new()
    } else {
        format!(" (unreadable CDI specs: {})", broken.join("; "))
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecFile {
    cdi_version: String,
    kind: String,
    #[serde(default)]
    devices: Vec<DeviceSpec>,
    #[serde(default)]
    container_edits: ContainerEdits,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeviceSpec {
    name: String,
    #[serde(default)]
    container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerEdits {
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    device_nodes: Vec<DeviceNode>,
    #[serde(default)]
    hooks: Vec<HookEdit>,
    #[serde(default)]
    mounts: Vec<MountEdit>,
    #[serde(default)]
    additional_gids: Vec<u32>,
    /// Edits crius cannot apply: a device that needs them is refused, not half given.
    #[serde(default)]
    intel_rdt: Option<serde_json::Value>,
    #[serde(default)]
    net_devices: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeviceNode {
    path: String,
    #[serde(default)]
    host_path: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    major: Option<i64>,
    #[serde(default)]
    minor: Option<i64>,
    #[serde(default)]
    file_mode: Option<u32>,
    #[serde(default)]
    permissions: Option<String>,
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    gid: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HookEdit {
    hook_name: String,
    path: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    timeout: Option<i64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MountEdit {
    host_path: String,
    container_path: String,
    #[serde(default)]
    options: Vec<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
}

/// One device found in a spec file: the spec's own edits, then the device's.
#[derive(Debug, Clone)]
struct Found {
    file: PathBuf,
    spec_edits: ContainerEdits,
    device_edits: ContainerEdits,
}

/// Every device of the spec directories, and the files that could not be read.
#[derive(Debug, Default)]
struct Loaded {
    devices: HashMap<String, Found>,
    broken: Vec<String>,
}

/// The names a container asks for: its `CDI_devices`, then its annotations' (in key order).
pub fn requested(cdi_devices: &[String], annotations: &HashMap<String, String>) -> Vec<String> {
    let mut names: Vec<String> = cdi_devices.to_vec();
    let mut keys: Vec<&String> = annotations
        .keys()
        .filter(|k| k.starts_with(ANNOTATION_PREFIX))
        .collect();
    keys.sort();
    for key in keys {
        names.extend(
            annotations[key]
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(String::from),
        );
    }
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

/// Checks `vendor.com/class=name`: a vendor of DNS-ish labels, a class and a name of
/// letters, digits and `-_.:` (the name starts with a letter or digit).
fn check_name(name: &str) -> Result<(), CdiError> {
    let bad = || CdiError::BadName(name.to_string());
    let (kind, device) = name.split_once('=').ok_or_else(bad)?;
    check_kind(kind).map_err(|_| bad())?;
    let mut chars = device.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
    if !first_ok || !rest_ok {
        return Err(bad());
    }
    Ok(())
}

fn check_kind(kind: &str) -> Result<(), String> {
    let (vendor, class) = kind
        .split_once('/')
        .ok_or_else(|| format!("kind {kind:?} is not vendor.com/class"))?;
    let label = |s: &str| {
        !s.is_empty()
            && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    if !label(vendor) || !label(class) {
        return Err(format!("kind {kind:?} is not vendor.com/class"));
    }
    Ok(())
}

/// Reads every spec file of `dirs`; a device in a later directory replaces one of the same
/// name in an earlier one (`/var/run/cdi` over `/etc/cdi`).
fn load(dirs: &[PathBuf]) -> Loaded {
    let mut loaded = Loaded::default();
    let mut files = 0;
    let mut bytes = 0;
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            if !matches!(ext, "json" | "yaml" | "yml") {
                continue;
            }
            files += 1;
            if files > MAX_SPEC_FILES {
                loaded.broken.push(format!(
                    "{}: past {MAX_SPEC_FILES} spec files",
                    path.display()
                ));
                continue;
            }
            let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            bytes += size.min(MAX_SPEC_FILE + 1);
            if bytes > MAX_SPEC_BYTES {
                loaded.broken.push(format!(
                    "{}: past {MAX_SPEC_BYTES} bytes of spec files",
                    path.display()
                ));
                continue;
            }
            match read_spec(&path) {
                Ok(spec) => add_spec(&mut loaded, &path, spec),
                Err(reason) => loaded.broken.push(format!("{}: {reason}", path.display())),
            }
        }
    }
    loaded
}

fn read_spec(path: &Path) -> Result<SpecFile, String> {
    // Only a regular file: a FIFO or device in a spec dir is an error, never waited on.
    let text = crate::sys::fsutil::read_bounded(path, MAX_SPEC_FILE).map_err(|e| e.to_string())?;
    let spec: SpecFile = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_slice(&text).map_err(|e| e.to_string())?
    } else {
        yaml_serde::from_slice(&text).map_err(|e| e.to_string())?
    };
    if !VERSIONS.contains(&spec.cdi_version.as_str()) {
        return Err(format!("unknown cdiVersion {:?}", spec.cdi_version));
    }
    check_kind(&spec.kind)?;
    Ok(spec)
}

fn add_spec(loaded: &mut Loaded, path: &Path, spec: SpecFile) {
    for device in spec.devices {
        let name = format!("{}={}", spec.kind, device.name);
        if check_name(&name).is_err() {
            loaded.broken.push(format!(
                "{}: bad device name {:?}",
                path.display(),
                device.name
            ));
            continue;
        }
        loaded.devices.insert(
            name,
            Found {
                file: path.to_path_buf(),
                spec_edits: spec.container_edits.clone(),
                device_edits: device.container_edits,
            },
        );
    }
}

/// Applies the devices `names` to `spec`. Nothing is applied unless every device resolves.
pub fn inject(spec: &mut Spec, dirs: &[PathBuf], names: &[String]) -> Result<(), CdiError> {
    if names.is_empty() {
        return Ok(());
    }
    for name in names {
        check_name(name)?;
    }
    let loaded = load(dirs);
    let mut found = Vec::new();
    for name in names {
        let device = loaded.devices.get(name).ok_or_else(|| CdiError::Unknown {
            device: name.clone(),
            broken: loaded.broken.clone(),
        })?;
        found.push((name, device));
    }
    let mut edited = spec.clone();
    let mut applied_specs = std::collections::HashSet::new();
    for (name, device) in found {
        let fail = |reason: String| CdiError::BadEdit {
            device: name.clone(),
            file: device.file.display().to_string(),
            reason,
        };
        // A spec's own edits apply once, however many of its devices are asked for.
        if applied_specs.insert(device.file.clone()) {
            apply(&mut edited, &device.spec_edits).map_err(fail)?;
        }
        apply(&mut edited, &device.device_edits).map_err(fail)?;
    }
    *spec = edited;
    Ok(())
}

fn apply(spec: &mut Spec, edits: &ContainerEdits) -> Result<(), String> {
    if edits.intel_rdt.is_some() || edits.net_devices.is_some() {
        return Err("intelRdt and netDevices edits are not supported by crius".into());
    }
    apply_env(spec, &edits.env);
    apply_gids(spec, &edits.additional_gids);
    for node in &edits.device_nodes {
        apply_device_node(spec, node)?;
    }
    for mount in &edits.mounts {
        apply_mount(spec, mount)?;
    }
    for hook in &edits.hooks {
        apply_hook(spec, hook)?;
    }
    Ok(())
}

fn apply_env(spec: &mut Spec, env: &[String]) {
    if env.is_empty() {
        return;
    }
    let Some(process) = spec.process_mut() else {
        return;
    };
    let mut all = process.env().clone().unwrap_or_default();
    for entry in env {
        let key = entry.split('=').next().unwrap_or_default();
        all.retain(|e| e.split('=').next() != Some(key));
        all.push(entry.clone());
    }
    process.set_env(Some(all));
}

fn apply_gids(spec: &mut Spec, gids: &[u32]) {
    if gids.is_empty() {
        return;
    }
    let Some(process) = spec.process_mut() else {
        return;
    };
    let user = process.user_mut();
    let mut all = user.additional_gids().clone().unwrap_or_default();
    for gid in gids {
        if *gid != 0 && !all.contains(gid) {
            all.push(*gid);
        }
    }
    user.set_additional_gids(Some(all));
}

fn apply_device_node(spec: &mut Spec, node: &DeviceNode) -> Result<(), String> {
    if !node.path.starts_with('/') {
        return Err(format!("device path {:?} is not absolute", node.path));
    }
    let host = node.host_path.as_deref().unwrap_or(&node.path);
    let permissions = node.permissions.as_deref().unwrap_or("rwm");
    if permissions.is_empty() || !permissions.chars().all(|c| "rwm".contains(c)) {
        return Err(format!("device permissions {permissions:?} are not of rwm"));
    }
    // The host's node says what the spec leaves out (type, numbers, mode, owner).
    let (mut device, _) = crate::oci::security::device(Path::new(host), &node.path, permissions)
        .map_err(|e| format!("device node {host}: {e}"))?;
    if let Some(kind) = &node.kind {
        let kind = match kind.as_str() {
            "c" | "u" => LinuxDeviceType::C,
            "b" => LinuxDeviceType::B,
            "p" => LinuxDeviceType::P,
            other => return Err(format!("device type {other:?}")),
        };
        device.set_typ(kind);
    }
    if let Some(major) = node.major {
        device.set_major(major);
    }
    if let Some(minor) = node.minor {
        device.set_minor(minor);
    }
    if node.file_mode.is_some() {
        device.set_file_mode(node.file_mode);
    }
    if node.uid.is_some() {
        device.set_uid(node.uid);
    }
    if node.gid.is_some() {
        device.set_gid(node.gid);
    }
    let rule = LinuxDeviceCgroupBuilder::default()
        .allow(true)
        .typ(device.typ())
        .major(device.major())
        .minor(device.minor())
        .access(permissions)
        .build()
        .map_err(|e| e.to_string())?;
    let linux = spec.linux_mut().get_or_insert_with(Default::default);
    let mut devices = linux.devices().clone().unwrap_or_default();
    devices.retain(|d| d.path() != device.path());
    devices.push(device);
    linux.set_devices(Some(devices));
    let resources = linux.resources_mut().get_or_insert_with(Default::default);
    let mut rules = resources.devices().clone().unwrap_or_default();
    rules.push(rule);
    resources.set_devices(Some(rules));
    Ok(())
}

fn apply_mount(spec: &mut Spec, edit: &MountEdit) -> Result<(), String> {
    if !edit.container_path.starts_with('/') {
        return Err(format!(
            "mount destination {:?} is not absolute",
            edit.container_path
        ));
    }
    let mut options = edit.options.clone();
    let kind = edit.kind.clone().unwrap_or_else(|| "bind".to_string());
    if kind == "bind" && !options.iter().any(|o| o == "bind" || o == "rbind") {
        options.push("bind".to_string());
    }
    let mount = MountBuilder::default()
        .destination(PathBuf::from(&edit.container_path))
        .source(PathBuf::from(&edit.host_path))
        .typ(kind)
        .options(options)
        .build()
        .map_err(|e| e.to_string())?;
    let mut mounts = spec.mounts().clone().unwrap_or_default();
    mounts.retain(|m| m.destination() != mount.destination());
    mounts.push(mount);
    spec.set_mounts(Some(mounts));
    Ok(())
}

fn apply_hook(spec: &mut Spec, edit: &HookEdit) -> Result<(), String> {
    let mut builder = HookBuilder::default().path(PathBuf::from(&edit.path));
    if !edit.args.is_empty() {
        builder = builder.args(edit.args.clone());
    }
    if !edit.env.is_empty() {
        builder = builder.env(edit.env.clone());
    }
    if let Some(timeout) = edit.timeout {
        builder = builder.timeout(timeout);
    }
    let hook = builder.build().map_err(|e| e.to_string())?;
    let hooks = spec.hooks_mut().get_or_insert_with(Hooks::default);
    let add = |list: &Option<Vec<oci_spec::runtime::Hook>>| {
        let mut list = list.clone().unwrap_or_default();
        list.push(hook.clone());
        Some(list)
    };
    match edit.hook_name.as_str() {
        "prestart" => {
            #[allow(deprecated)]
            let list = add(hooks.prestart());
            #[allow(deprecated)]
            hooks.set_prestart(list);
        }
        "createRuntime" => {
            hooks.set_create_runtime(add(hooks.create_runtime()));
        }
        "createContainer" => {
            hooks.set_create_container(add(hooks.create_container()));
        }
        "startContainer" => {
            hooks.set_start_container(add(hooks.start_container()));
        }
        "poststart" => {
            hooks.set_poststart(add(hooks.poststart()));
        }
        "poststop" => {
            hooks.set_poststop(add(hooks.poststop()));
        }
        other => return Err(format!("unknown hook {other:?}")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{ProcessBuilder, SpecBuilder};

    fn spec() -> Spec {
        SpecBuilder::default()
            .process(
                ProcessBuilder::default()
                    .env(vec!["PATH=/bin".to_string(), "A=old".to_string()])
                    .build()
                    .expect("process"),
            )
            .build()
            .expect("spec")
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).expect("write spec");
    }

    const YAML: &str = r#"
cdiVersion: "0.6.0"
kind: "example.com/fake"
containerEdits:
  env: ["FAKE_VENDOR=1"]
devices:
  - name: null0
    containerEdits:
      env: ["A=new", "FAKE_DEVICE=null0"]
      deviceNodes:
        - path: /dev/fake-null
          hostPath: /dev/null
          permissions: rw
      mounts:
        - hostPath: /etc/hostname
          containerPath: /etc/fake-hostname
          options: [ro]
      hooks:
        - hookName: createContainer
          path: /bin/true
          args: ["true", "x"]
      additionalGids: [4242]
"#;

    #[test]
    fn devices_come_from_the_container_field_then_the_annotations() {
        let annotations = HashMap::from([
            (
                "cdi.k8s.io/b".to_string(),
                "v.com/c=2, v.com/c=1".to_string(),
            ),
            ("cdi.k8s.io/a".to_string(), "v.com/c=3".to_string()),
            ("other".to_string(), "v.com/c=9".to_string()),
        ]);
        assert_eq!(
            requested(&["v.com/c=1".to_string()], &annotations),
            ["v.com/c=1", "v.com/c=3", "v.com/c=2"]
        );
    }

    #[test]
    fn names_must_be_qualified() {
        for good in ["example.com/gpu=0", "nvidia.com/gpu=all", "a/b=c:d.e_f-g"] {
            assert_eq!(check_name(good), Ok(()), "{good}");
        }
        for bad in [
            "gpu0",
            "example.com=0",
            "example.com/gpu=",
            "/gpu=0",
            "a/b=-x",
            "a/b/c=d",
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_yaml_device_is_applied_with_its_specs_edits() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "fake.yaml", YAML);
        let mut spec = spec();
        inject(
            &mut spec,
            &[dir.path().to_path_buf()],
            &["example.com/fake=null0".to_string()],
        )
        .expect("inject");
        let process = spec.process().as_ref().expect("process");
        let env = process.env().clone().unwrap_or_default();
        for entry in ["PATH=/bin", "A=new", "FAKE_VENDOR=1", "FAKE_DEVICE=null0"] {
            assert!(env.contains(&entry.to_string()), "{entry} in {env:?}");
        }
        assert!(!env.contains(&"A=old".to_string()));
        assert_eq!(
            process.user().additional_gids().clone().unwrap_or_default(),
            [4242]
        );
        let linux = spec.linux().as_ref().expect("linux");
        let device = &linux.devices().as_ref().expect("devices")[0];
        assert_eq!(device.path(), Path::new("/dev/fake-null"));
        assert_eq!((device.major(), device.minor()), (1, 3));
        let rules = linux
            .resources()
            .as_ref()
            .and_then(|r| r.devices().clone())
            .expect("rules");
        assert_eq!(rules[0].access().as_deref(), Some("rw"));
        let mount = spec
            .mounts()
            .as_ref()
            .and_then(|m| m.last().cloned())
            .expect("mount");
        assert_eq!(mount.destination(), Path::new("/etc/fake-hostname"));
        assert_eq!(mount.options().clone().unwrap_or_default(), ["ro", "bind"]);
        let hooks = spec.hooks().as_ref().expect("hooks");
        assert_eq!(hooks.create_container().as_ref().map(Vec::len), Some(1));
    }

    #[test]
    fn unknown_devices_and_broken_files_are_named_and_apply_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "fake.yaml", YAML);
        write(dir.path(), "broken.json", "{\"cdiVersion\": ");
        write(
            dir.path(),
            "old.json",
            r#"{"cdiVersion":"9.9.9","kind":"x.com/y","devices":[]}"#,
        );
        let dirs = [dir.path().to_path_buf()];
        let mut spec = spec();
        let before = spec.clone();
        let err = inject(
            &mut spec,
            &dirs,
            &[
                "example.com/fake=null0".to_string(),
                "example.com/fake=nope".to_string(),
            ],
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("example.com/fake=nope"), "{text}");
        assert!(text.contains("broken.json"), "{text}");
        assert!(text.contains("9.9.9"), "{text}");
        assert_eq!(spec, before, "nothing applied");
        // The good device still works beside the broken files.
        inject(&mut spec, &dirs, &["example.com/fake=null0".to_string()]).expect("inject");
    }

    #[test]
    fn a_later_directory_wins_and_json_works() {
        let first = tempfile::tempdir().expect("tempdir");
        let second = tempfile::tempdir().expect("tempdir");
        write(first.path(), "a.yaml", YAML);
        write(
            second.path(),
            "a.json",
            r#"{"cdiVersion":"1.0.0","kind":"example.com/fake",
                "devices":[{"name":"null0","containerEdits":{"env":["FROM=run"]}}]}"#,
        );
        let mut spec = spec();
        inject(
            &mut spec,
            &[first.path().to_path_buf(), second.path().to_path_buf()],
            &["example.com/fake=null0".to_string()],
        )
        .expect("inject");
        let env = spec
            .process()
            .as_ref()
            .and_then(|p| p.env().clone())
            .unwrap_or_default();
        assert!(env.contains(&"FROM=run".to_string()), "{env:?}");
        assert!(!env.contains(&"FAKE_DEVICE=null0".to_string()), "{env:?}");
    }

    #[test]
    fn unsupported_edits_and_bad_nodes_refuse_the_device() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(
            dir.path(),
            "x.yaml",
            r#"
cdiVersion: "1.1.0"
kind: "example.com/x"
devices:
  - name: net
    containerEdits:
      netDevices: [{hostInterfaceName: eth9, name: eth0}]
  - name: notadevice
    containerEdits:
      deviceNodes: [{path: /dev/x, hostPath: /etc/hostname}]
"#,
        );
        let dirs = [dir.path().to_path_buf()];
        for name in ["example.com/x=net", "example.com/x=notadevice"] {
            let err = inject(&mut spec(), &dirs, &[name.to_string()]).unwrap_err();
            assert!(
                matches!(&err, CdiError::BadEdit { device, .. } if device == name),
                "{err}"
            );
        }
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::fuzz_config())]

        #[test]
        fn any_spec_file_reads_or_fails_cleanly(text in "\\PC{0,400}", yaml in any::<bool>()) {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join(if yaml { "x.yaml" } else { "x.json" });
            std::fs::write(&path, &text).expect("write");
            let _ = read_spec(&path);
        }

        #[test]
        fn any_shaped_spec_applies_or_fails_cleanly(
            kind in "[a-z.]{1,8}/[a-z]{1,5}",
            name in "[a-z0-9:._-]{0,8}",
            env in prop::collection::vec("\\PC{0,20}", 0..3),
            path in "\\PC{0,20}",
            perms in "[rwmx]{0,4}",
            hook in "[a-zA-Z]{0,16}",
        ) {
            let spec = serde_json::json!({
                "cdiVersion": "0.6.0",
                "kind": kind,
                "devices": [{"name": name, "containerEdits": {
                    "env": env,
                    "deviceNodes": [{"path": path, "hostPath": "/dev/null", "permissions": perms}],
                    "mounts": [{"hostPath": "/tmp", "containerPath": path}],
                    "hooks": [{"hookName": hook, "path": "/bin/true"}],
                }}],
            });
            let dir = tempfile::tempdir().expect("tempdir");
            std::fs::write(dir.path().join("x.json"), spec.to_string()).expect("write");
            let mut oci = oci_spec::runtime::Spec::default();
            let _ = inject(&mut oci, &[dir.path().to_path_buf()], &[format!("{kind}={name}")]);
        }
    }
}
