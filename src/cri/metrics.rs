//! `ListMetricDescriptors` and `ListPodSandboxMetrics`: the CRI's own metrics, which kubelet
//! can serve instead of cAdvisor's. The names and meanings are cAdvisor's for CPU, memory,
//! the writable layer and network; values are whole units, as the CRI's integers allow.

use crate::api::v1::{
    ContainerMetrics, ContainerStats, ListMetricDescriptorsRequest, ListMetricDescriptorsResponse,
    ListPodSandboxMetricsRequest, ListPodSandboxMetricsResponse, Metric, MetricDescriptor,
    MetricType, NetworkUsage, PodSandboxMetadata, PodSandboxMetrics, UInt64Value,
};
use std::sync::Arc;
use tonic::Status;

use crate::cri::CriService;
use crate::store::{Sandbox, SandboxState};

const CONTAINER_LABELS: [&str; 6] = ["container", "id", "image", "name", "namespace", "pod"];
/// The pause container's name in cAdvisor's pod-level series.
const POD_CONTAINER: &str = "POD";

/// (name, help, type, per interface)
const METRICS: [(&str, &str, MetricType, bool); 9] = [
    (
        "container_cpu_usage_seconds_total",
        "Cumulative cpu time consumed in seconds.",
        MetricType::Counter,
        false,
    ),
    (
        "container_memory_usage_bytes",
        "Current memory usage in bytes, including all memory regardless of when it was accessed.",
        MetricType::Gauge,
        false,
    ),
    (
        "container_memory_working_set_bytes",
        "Current working set in bytes.",
        MetricType::Gauge,
        false,
    ),
    (
        "container_memory_rss",
        "Size of RSS in bytes.",
        MetricType::Gauge,
        false,
    ),
    (
        "container_fs_usage_bytes",
        "Number of bytes that are consumed by the container on this filesystem.",
        MetricType::Gauge,
        false,
    ),
    (
        "container_network_receive_bytes_total",
        "Cumulative count of bytes received.",
        MetricType::Counter,
        true,
    ),
    (
        "container_network_transmit_bytes_total",
        "Cumulative count of bytes transmitted.",
        MetricType::Counter,
        true,
    ),
    (
        "container_network_receive_errors_total",
        "Cumulative count of errors encountered while receiving.",
        MetricType::Counter,
        true,
    ),
    (
        "container_network_transmit_errors_total",
        "Cumulative count of errors encountered while transmitting.",
        MetricType::Counter,
        true,
    ),
];

fn metric(name: &str, kind: MetricType, labels: &[String], timestamp: i64, value: u64) -> Metric {
    Metric {
        name: name.to_string(),
        timestamp,
        metric_type: kind as i32,
        label_values: labels.to_vec(),
        value: Some(UInt64Value { value }),
    }
}

/// CPU, memory and writable-layer metrics of one container.
fn container_metrics(stats: &ContainerStats, labels: &[String]) -> Vec<Metric> {
    let mut metrics = Vec::new();
    if let Some(cpu) = &stats.cpu
        && let Some(total) = &cpu.usage_core_nano_seconds
    {
        metrics.push(metric(
            METRICS[0].0,
            METRICS[0].2,
            labels,
            cpu.timestamp,
            total.value / 1_000_000_000,
        ));
    }
    if let Some(memory) = &stats.memory {
        for (index, field) in [
            (1, &memory.usage_bytes),
            (2, &memory.working_set_bytes),
            (3, &memory.rss_bytes),
        ] {
            if let Some(v) = field {
                metrics.push(metric(
                    METRICS[index].0,
                    METRICS[index].2,
                    labels,
                    memory.timestamp,
                    v.value,
                ));
            }
        }
    }
    if let Some(layer) = &stats.writable_layer
        && let Some(used) = &layer.used_bytes
    {
        metrics.push(metric(
            METRICS[4].0,
            METRICS[4].2,
            labels,
            layer.timestamp,
            used.value,
        ));
    }
    metrics
}

impl CriService {
    pub async fn list_metric_descriptors(
        &self,
        _req: ListMetricDescriptorsRequest,
    ) -> Result<ListMetricDescriptorsResponse, Status> {
        let descriptors = METRICS
            .iter()
            .map(|(name, help, _, per_interface)| {
                let mut label_keys: Vec<String> =
                    CONTAINER_LABELS.iter().map(|l| l.to_string()).collect();
                if *per_interface {
                    label_keys.push("interface".to_string());
                }
                MetricDescriptor {
                    name: name.to_string(),
                    help: help.to_string(),
                    label_keys,
                }
            })
            .collect();
        Ok(ListMetricDescriptorsResponse { descriptors })
    }

    pub async fn list_pod_sandbox_metrics(
        &self,
        _req: ListPodSandboxMetricsRequest,
    ) -> Result<ListPodSandboxMetricsResponse, Status> {
        let mut pod_metrics = Vec::new();
        for sandbox in self.sandboxes.list() {
            if sandbox.status().state == SandboxState::Ready {
                pod_metrics.push(self.pod_sandbox_metrics(&sandbox).await);
            }
        }
        Ok(ListPodSandboxMetricsResponse { pod_metrics })
    }

    /// One pod's series: its network at pod level, then each container's.
    async fn pod_sandbox_metrics(&self, sandbox: &Arc<Sandbox>) -> PodSandboxMetrics {
        let metadata = sandbox.metadata();
        let pod = metadata.config.metadata.clone().unwrap_or_default();
        let linux = self.sample_pod(sandbox).await.linux.unwrap_or_default();
        let pod_labels = [
            POD_CONTAINER.to_string(),
            metadata.id.clone(),
            metadata.image.clone(),
            metadata.name.clone(),
            pod.namespace.clone(),
            pod.name.clone(),
        ];
        let metrics = linux
            .network
            .as_ref()
            .map(|network| network_metrics(network, &pod_labels))
            .unwrap_or_default();
        let container_metrics = linux
            .containers
            .iter()
            .filter_map(|stats| self.one_container_metrics(stats, &pod))
            .collect();
        PodSandboxMetrics {
            pod_sandbox_id: metadata.id.clone(),
            metrics,
            container_metrics,
        }
    }

    /// A container's series, labelled as cAdvisor labels them; none for a container gone.
    fn one_container_metrics(
        &self,
        stats: &ContainerStats,
        pod: &PodSandboxMetadata,
    ) -> Option<ContainerMetrics> {
        let id = stats.attributes.as_ref()?.id.clone();
        let container = self.containers.get(&id).ok().flatten()?;
        let labels = vec![
            container
                .metadata
                .config
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default(),
            id.clone(),
            container.metadata.image_name.clone(),
            container.metadata.name.clone(),
            pod.namespace.clone(),
            pod.name.clone(),
        ];
        Some(ContainerMetrics {
            container_id: id,
            metrics: container_metrics(stats, &labels),
        })
    }
}

/// The pod's network series, one set per interface (its name the last label).
fn network_metrics(network: &NetworkUsage, pod_labels: &[String]) -> Vec<Metric> {
    let mut metrics = Vec::new();
    for interface in &network.interfaces {
        let mut labels = pod_labels.to_vec();
        labels.push(interface.name.clone());
        for (index, field) in [
            (5, &interface.rx_bytes),
            (6, &interface.tx_bytes),
            (7, &interface.rx_errors),
            (8, &interface.tx_errors),
        ] {
            if let Some(v) = field {
                metrics.push(metric(
                    METRICS[index].0,
                    METRICS[index].2,
                    &labels,
                    network.timestamp,
                    v.value,
                ));
            }
        }
    }
    metrics
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1::{CpuUsage, MemoryUsage};

    #[test]
    fn container_metrics_carry_labels_and_whole_units() {
        let stats = ContainerStats {
            cpu: Some(CpuUsage {
                timestamp: 7,
                usage_core_nano_seconds: Some(UInt64Value {
                    value: 3_500_000_000,
                }),
                usage_nano_cores: None,
                psi: None,
            }),
            memory: Some(MemoryUsage {
                timestamp: 7,
                working_set_bytes: Some(UInt64Value { value: 42 }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let labels: Vec<String> = CONTAINER_LABELS.iter().map(|l| format!("v-{l}")).collect();
        let metrics = container_metrics(&stats, &labels);
        assert_eq!(metrics.len(), 2);
        assert_eq!(metrics[0].name, "container_cpu_usage_seconds_total");
        assert_eq!(metrics[0].value, Some(UInt64Value { value: 3 }));
        assert_eq!(metrics[0].metric_type, MetricType::Counter as i32);
        assert_eq!(metrics[1].name, "container_memory_working_set_bytes");
        assert_eq!(metrics[1].label_values, labels);
    }
}
