//! `UpdateRuntimeConfig` (the pod CIDR, and a conflist from the conf template) and
//! `RuntimeConfig` (the cgroup driver).

use crate::api::v1::{
    CgroupDriver, LinuxRuntimeConfiguration, RuntimeConfigRequest, RuntimeConfigResponse,
    UpdateRuntimeConfigRequest, UpdateRuntimeConfigResponse,
};
use tonic::Status;

use crate::cri::CriService;

/// The file UpdateRuntimeConfig writes from the conf template.
pub const TEMPLATE_CONF_NAME: &str = "10-crius-net.conflist";

impl CriService {
    pub async fn update_runtime_config(
        &self,
        req: UpdateRuntimeConfigRequest,
    ) -> Result<UpdateRuntimeConfigResponse, Status> {
        let pod_cidr = req
            .runtime_config
            .and_then(|c| c.network_config)
            .map(|n| n.pod_cidr)
            .unwrap_or_default();
        if pod_cidr.is_empty() {
            return Ok(UpdateRuntimeConfigResponse {});
        }
        let cidrs: Vec<&str> = pod_cidr.split(',').map(str::trim).collect();
        if let Some(bad) = cidrs.iter().find(|c| !is_cidr(c)) {
            return Err(Status::invalid_argument(format!(
                "pod CIDR {bad:?} is not an IP network in CIDR notation"
            )));
        }
        *self.pod_cidr.lock().unwrap_or_else(|p| p.into_inner()) = pod_cidr.clone();
        tracing::info!(%pod_cidr, "pod CIDR updated");

        let template_path = &self.config.cni.conf_template;
        if template_path.is_empty() {
            return Ok(UpdateRuntimeConfigResponse {});
        }
        if self.cni.ready().is_ok() {
            tracing::info!(template = %template_path, "network is ready; not writing a conflist from the template");
            return Ok(UpdateRuntimeConfigResponse {});
        }
        let template = std::fs::read_to_string(template_path).map_err(|e| {
            Status::failed_precondition(format!(
                "failed to read CNI conf template {template_path}: {e}"
            ))
        })?;
        let target = self.cni.conf_dir().join(TEMPLATE_CONF_NAME);
        crate::sys::fsutil::write_atomic(
            &target,
            render_template(&template, &cidrs).as_bytes(),
            0o644,
        )
        .map_err(|e| {
            Status::internal(format!(
                "failed to write CNI config {}: {e}",
                target.display()
            ))
        })?;
        tracing::info!(file = %target.display(), "wrote CNI config from template");
        let cni = self.cni.clone();
        tokio::task::spawn_blocking(move || cni.reload())
            .await
            .map_err(|e| Status::internal(format!("reloading the CNI config: {e}")))?;
        Ok(UpdateRuntimeConfigResponse {})
    }

    pub async fn runtime_config(
        &self,
        _req: RuntimeConfigRequest,
    ) -> Result<RuntimeConfigResponse, Status> {
        let systemd = self
            .config
            .runtime("")
            .is_some_and(|r| r.options.systemd_cgroup);
        let driver = if systemd {
            CgroupDriver::Systemd
        } else {
            CgroupDriver::Cgroupfs
        };
        Ok(RuntimeConfigResponse {
            linux: Some(LinuxRuntimeConfiguration {
                cgroup_driver: driver as i32,
            }),
        })
    }
}

fn is_cidr(text: &str) -> bool {
    let Some((addr, prefix)) = text.split_once('/') else {
        return false;
    };
    let Ok(prefix) = prefix.parse::<u8>() else {
        return false;
    };
    match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => prefix <= 32,
        Ok(std::net::IpAddr::V6(_)) => prefix <= 128,
        Err(_) => false,
    }
}

/// Fills the conf template: `{{.PodCIDR}}` is the first CIDR, `{{.PodCIDRRanges}}` the
/// host-local range sets (`[{"subnet": "..."}], ...`) and `{{.Routes}}` a default route per
/// address family (`{"dst": "0.0.0.0/0"}, ...`).
fn render_template(template: &str, cidrs: &[&str]) -> String {
    let ranges = cidrs
        .iter()
        .map(|c| format!("[{{\"subnet\": \"{c}\"}}]"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut routes = Vec::new();
    if cidrs.iter().any(|c| !c.contains(':')) {
        routes.push("{\"dst\": \"0.0.0.0/0\"}");
    }
    if cidrs.iter().any(|c| c.contains(':')) {
        routes.push("{\"dst\": \"::/0\"}");
    }
    template
        .replace("{{.PodCIDRRanges}}", &ranges)
        .replace("{{.PodCIDR}}", cidrs.first().copied().unwrap_or_default())
        .replace("{{.Routes}}", &routes.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_ranges_and_routes_for_dual_stack() {
        let out = render_template(
            r#"{"subnet":"{{.PodCIDR}}","ranges":[{{.PodCIDRRanges}}],"routes":[{{.Routes}}]}"#,
            &["10.1.0.0/24", "fd00::/64"],
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["subnet"], "10.1.0.0/24");
        assert_eq!(v["ranges"][1][0]["subnet"], "fd00::/64");
        assert_eq!(v["routes"][0]["dst"], "0.0.0.0/0");
        assert_eq!(v["routes"][1]["dst"], "::/0");
    }

    #[test]
    fn cidr_check() {
        assert!(is_cidr("10.88.0.0/16"));
        assert!(is_cidr("fd00::/64"));
        assert!(!is_cidr("10.88.0.0"));
        assert!(!is_cidr("10.88.0.0/33"));
        assert!(!is_cidr("bogus/8"));
    }
}
