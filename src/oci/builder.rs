//! The steps a runtime spec is assembled from, shared by the sandbox (pause container) and
//! container specs: one small function per concern, so each CRI feature lands in one place.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Capabilities, Linux, LinuxCapabilities, LinuxCapabilitiesBuilder, LinuxDeviceCgroup,
    LinuxDeviceCgroupBuilder, LinuxIdMappingBuilder, LinuxNamespace, LinuxNamespaceBuilder,
    LinuxNamespaceType, Mount, Process, RootBuilder, Spec, SpecBuilder, User, UserBuilder,
};

use super::{MASKED_PATHS, OCI_VERSION, READONLY_PATHS, SpecError, annotations, default_mounts};
use crate::api::v1::PodSandboxMetadata;

/// A namespace to create (`path` `None`) or to join.
pub fn namespace(
    typ: LinuxNamespaceType,
    path: Option<PathBuf>,
) -> Result<LinuxNamespace, SpecError> {
    let mut builder = LinuxNamespaceBuilder::default().typ(typ);
    if let Some(path) = path {
        builder = builder.path(path);
    }
    Ok(builder.build()?)
}

/// The process user.
pub fn user(uid: u32, gid: u32, additional_gids: Vec<u32>) -> Result<User, SpecError> {
    Ok(UserBuilder::default()
        .uid(uid)
        .gid(gid)
        .additional_gids(additional_gids)
        .build()?)
}

/// The capability sets: `permitted` bounds, is effective and permitted; `ambient` is also
/// inheritable.
pub fn capability_sets(
    permitted: &Capabilities,
    ambient: &Capabilities,
) -> Result<LinuxCapabilities, SpecError> {
    Ok(LinuxCapabilitiesBuilder::default()
        .bounding(permitted.clone())
        .effective(permitted.clone())
        .permitted(permitted.clone())
        .inheritable(ambient.clone())
        .ambient(ambient.clone())
        .build()?)
}

/// No default rlimits: the process inherits the shim's, as in containerd's CRI.
pub fn without_rlimits(mut process: Process) -> Process {
    process.set_rlimits(None);
    process
}

/// containerd's default mounts, without its `/dev/shm` (the pod has its own).
pub fn base_mounts() -> Result<Vec<Mount>, SpecError> {
    let mut mounts = default_mounts()?;
    mounts.retain(|m| m.destination() != Path::new("/dev/shm"));
    Ok(mounts)
}

/// The device cgroup rule that denies every device; allowed ones are added after it.
pub fn deny_all_devices() -> Result<LinuxDeviceCgroup, SpecError> {
    Ok(LinuxDeviceCgroupBuilder::default()
        .allow(false)
        .access("rwm")
        .build()?)
}

/// The device cgroup rule that allows every device (privileged containers).
pub fn allow_all_devices() -> Result<LinuxDeviceCgroup, SpecError> {
    Ok(LinuxDeviceCgroupBuilder::default()
        .allow(true)
        .access("rwm")
        .build()?)
}

/// The masked and read-only paths: none when privileged, else the CRI's lists or, when
/// those are empty, containerd's defaults.
pub fn masked_and_readonly_paths(
    privileged: bool,
    masked: &[String],
    readonly: &[String],
) -> (Vec<String>, Vec<String>) {
    if privileged {
        return (Vec::new(), Vec::new());
    }
    let or_default = |given: &[String], default: &[&str]| {
        if given.is_empty() {
            default.iter().map(|p| p.to_string()).collect()
        } else {
            given.to_vec()
        }
    };
    (
        or_default(masked, MASKED_PATHS),
        or_default(readonly, READONLY_PATHS),
    )
}

/// The CRI annotations both kinds carry: the container type and the pod's identity, over
/// the handler's pass-through annotations.
pub fn pod_annotations(
    passthrough: &HashMap<String, String>,
    container_type: &str,
    sandbox_id: &str,
    pod: &PodSandboxMetadata,
) -> HashMap<String, String> {
    let mut all = passthrough.clone();
    all.extend([
        (
            annotations::CONTAINER_TYPE.to_string(),
            container_type.to_string(),
        ),
        (annotations::SANDBOX_ID.to_string(), sandbox_id.to_string()),
        (annotations::SANDBOX_NAME.to_string(), pod.name.clone()),
        (
            annotations::SANDBOX_NAMESPACE.to_string(),
            pod.namespace.clone(),
        ),
        (annotations::SANDBOX_UID.to_string(), pod.uid.clone()),
    ]);
    all
}

/// The parts of a spec, put together.
pub struct SpecParts {
    pub readonly_rootfs: bool,
    pub process: Process,
    pub mounts: Vec<Mount>,
    pub linux: Linux,
    pub annotations: HashMap<String, String>,
    /// `None`: no hostname of its own (the host's, or the pod's UTS namespace's).
    pub hostname: Option<String>,
}

/// A pod's own user namespace, which its pause process and every container join.
#[derive(Debug, Clone, Copy)]
pub struct PodUserNamespace<'a> {
    /// The pinned namespace.
    pub path: &'a Path,
    pub mappings: &'a crate::sys::userns::Mappings,
    /// The container's rootfs, idmapped to the namespace by crius; `None` for a remapped
    /// copy the runtime mounts as usual.
    pub rootfs: Option<&'a Path>,
    /// The pod is on the host's network, whose namespace the pod's user namespace does not
    /// own: sysfs cannot be mounted, so the host's /sys is bound read-only instead.
    pub host_network: bool,
}

/// Joins the pod's user namespace. The mappings go in too: the runtime reads them to know
/// which host IDs are root inside. The rootfs is the idmapped one crius mounted.
pub fn join_user_namespace(
    spec: &mut Spec,
    userns: &PodUserNamespace<'_>,
) -> Result<(), SpecError> {
    let id_mapping = |range: crate::sys::userns::IdRange| {
        LinuxIdMappingBuilder::default()
            .container_id(range.container_id)
            .host_id(range.host_id)
            .size(range.size)
            .build()
    };
    let uids = vec![id_mapping(userns.mappings.uids)?];
    let gids = vec![id_mapping(userns.mappings.gids)?];
    let linux = spec
        .linux_mut()
        .as_mut()
        .ok_or_else(|| SpecError::Invalid("the spec has no linux section".to_string()))?;
    let mut namespaces = linux.namespaces().clone().unwrap_or_default();
    namespaces.retain(|n| n.typ() != LinuxNamespaceType::User);
    namespaces.insert(
        0,
        namespace(LinuxNamespaceType::User, Some(userns.path.to_path_buf()))?,
    );
    linux.set_namespaces(Some(namespaces));
    linux.set_uid_mappings(Some(uids));
    linux.set_gid_mappings(Some(gids));
    if let (Some(root), Some(rootfs)) = (spec.root_mut(), userns.rootfs) {
        root.set_path(rootfs.to_path_buf());
    }
    if userns.host_network {
        bind_host_sysfs(spec)?;
    }
    Ok(())
}

/// Replaces a sysfs mount at /sys by a recursively read-only bind of the host's /sys: a
/// user namespace that does not own the network namespace cannot mount a sysfs of it.
fn bind_host_sysfs(spec: &mut Spec) -> Result<(), SpecError> {
    let Some(mounts) = spec.mounts_mut() else {
        return Ok(());
    };
    for mount in mounts.iter_mut() {
        if mount.destination() == Path::new("/sys") && mount.typ().as_deref() == Some("sysfs") {
            *mount = super::mount(
                "/sys",
                "bind",
                "/sys",
                &["rbind", "rro", "nosuid", "nodev", "noexec", "ro"],
            )?;
        }
    }
    Ok(())
}

pub fn assemble(parts: SpecParts) -> Result<Spec, SpecError> {
    let mut spec = SpecBuilder::default()
        .version(OCI_VERSION)
        .root(
            RootBuilder::default()
                .path(PathBuf::from("rootfs"))
                .readonly(parts.readonly_rootfs)
                .build()?,
        )
        .process(parts.process)
        .mounts(parts.mounts)
        .linux(parts.linux)
        .annotations(parts.annotations)
        .build()?;
    // The builder's default hostname is made up; only a real one is kept.
    spec.set_hostname(parts.hostname);
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn privileged_has_no_masked_paths_and_empty_lists_mean_the_defaults() {
        assert_eq!(
            masked_and_readonly_paths(true, &[], &[]),
            (Vec::new(), Vec::new())
        );
        let (masked, readonly) = masked_and_readonly_paths(false, &[], &["/ro".into()]);
        assert_eq!(masked.len(), MASKED_PATHS.len());
        assert_eq!(readonly, vec!["/ro".to_string()]);
    }

    #[test]
    fn a_joined_namespace_has_its_path_and_a_new_one_none() {
        let joined = namespace(LinuxNamespaceType::Network, Some("/proc/1/ns/net".into())).unwrap();
        assert_eq!(joined.path().as_deref(), Some(Path::new("/proc/1/ns/net")));
        assert_eq!(
            namespace(LinuxNamespaceType::Pid, None).unwrap().path(),
            &None
        );
    }
}
