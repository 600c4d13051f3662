//! The streaming twins of the List RPCs (`StreamPodSandboxes`, `StreamContainers`,
//! `StreamContainerStats`, `StreamPodSandboxStats`, `StreamPodSandboxMetrics`,
//! `StreamImages`; kubelet's `CRIListStreaming`): the same filters and content as the List
//! call, cut into messages of bounded size so a node with many pods never needs one message
//! over the CRI's size limit.

use prost::Message;
use tonic::Status;

use crate::api::v1::{
    ListContainerStatsRequest, ListContainersRequest, ListImagesRequest,
    ListPodSandboxMetricsRequest, ListPodSandboxRequest, ListPodSandboxStatsRequest,
    StreamContainerStatsRequest, StreamContainerStatsResponse, StreamContainersRequest,
    StreamContainersResponse, StreamImagesRequest, StreamImagesResponse,
    StreamPodSandboxMetricsRequest, StreamPodSandboxMetricsResponse, StreamPodSandboxStatsRequest,
    StreamPodSandboxStatsResponse, StreamPodSandboxesRequest, StreamPodSandboxesResponse,
};
use crate::cri::CriService;

/// The most encoded bytes of items one streamed message carries (a single larger item is
/// sent alone). A quarter of the 16 MiB message limit leaves room for any framing.
pub const STREAM_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Cuts `items` into consecutive groups whose encoded size stays under `limit`, keeping
/// their order. Every group has at least one item; an empty list gives no group.
pub fn chunk_by_size<T: Message>(items: Vec<T>, limit: usize) -> Vec<Vec<T>> {
    let mut chunks = Vec::new();
    let mut current = Vec::new();
    let mut bytes = 0;
    for item in items {
        // The repeated field's tag and length prefix: at most 1 + 10 bytes per item.
        let size = item.encoded_len() + 11;
        if !current.is_empty() && bytes + size > limit {
            chunks.push(std::mem::take(&mut current));
            bytes = 0;
        }
        bytes += size;
        current.push(item);
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

impl CriService {
    pub async fn stream_pod_sandboxes(
        &self,
        req: StreamPodSandboxesRequest,
    ) -> Result<Vec<StreamPodSandboxesResponse>, Status> {
        let list = self
            .list_pod_sandbox(ListPodSandboxRequest { filter: req.filter })
            .await?;
        Ok(chunk_by_size(list.items, STREAM_MESSAGE_BYTES)
            .into_iter()
            .map(|pod_sandboxes| StreamPodSandboxesResponse { pod_sandboxes })
            .collect())
    }

    pub async fn stream_containers(
        &self,
        req: StreamContainersRequest,
    ) -> Result<Vec<StreamContainersResponse>, Status> {
        let list = self
            .list_containers(ListContainersRequest { filter: req.filter })
            .await?;
        Ok(chunk_by_size(list.containers, STREAM_MESSAGE_BYTES)
            .into_iter()
            .map(|containers| StreamContainersResponse { containers })
            .collect())
    }

    pub async fn stream_container_stats(
        &self,
        req: StreamContainerStatsRequest,
    ) -> Result<Vec<StreamContainerStatsResponse>, Status> {
        let list = self
            .list_container_stats(ListContainerStatsRequest { filter: req.filter })
            .await?;
        Ok(chunk_by_size(list.stats, STREAM_MESSAGE_BYTES)
            .into_iter()
            .map(|container_stats| StreamContainerStatsResponse { container_stats })
            .collect())
    }

    pub async fn stream_pod_sandbox_stats(
        &self,
        req: StreamPodSandboxStatsRequest,
    ) -> Result<Vec<StreamPodSandboxStatsResponse>, Status> {
        let list = self
            .list_pod_sandbox_stats(ListPodSandboxStatsRequest { filter: req.filter })
            .await?;
        Ok(chunk_by_size(list.stats, STREAM_MESSAGE_BYTES)
            .into_iter()
            .map(|pod_sandbox_stats| StreamPodSandboxStatsResponse { pod_sandbox_stats })
            .collect())
    }

    pub async fn stream_pod_sandbox_metrics(
        &self,
        _req: StreamPodSandboxMetricsRequest,
    ) -> Result<Vec<StreamPodSandboxMetricsResponse>, Status> {
        let list = self
            .list_pod_sandbox_metrics(ListPodSandboxMetricsRequest {})
            .await?;
        Ok(chunk_by_size(list.pod_metrics, STREAM_MESSAGE_BYTES)
            .into_iter()
            .map(|pod_sandbox_metrics| StreamPodSandboxMetricsResponse {
                pod_sandbox_metrics,
            })
            .collect())
    }

    pub async fn stream_images(
        &self,
        req: StreamImagesRequest,
    ) -> Result<Vec<StreamImagesResponse>, Status> {
        let list = self
            .list_images(ListImagesRequest { filter: req.filter })
            .await?;
        Ok(chunk_by_size(list.images, STREAM_MESSAGE_BYTES)
            .into_iter()
            .map(|images| StreamImagesResponse { images })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1::Image;

    fn image(id: &str, tags: usize) -> Image {
        Image {
            id: id.to_string(),
            repo_tags: (0..tags)
                .map(|i| format!("example.com/repo:{i:04}"))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn chunks_stay_under_the_limit_and_keep_every_item_in_order() {
        let items: Vec<Image> = (0..100)
            .map(|i| image(&format!("sha256:{i}"), 20))
            .collect();
        let one = items[0].encoded_len() + 11;
        let limit = one * 7 + 3;
        let chunks = chunk_by_size(items.clone(), limit);
        assert!(chunks.len() >= 100 / 7);
        for chunk in &chunks {
            let bytes: usize = chunk.iter().map(|i| i.encoded_len() + 11).sum();
            assert!(bytes <= limit, "{bytes} > {limit}");
        }
        let flat: Vec<Image> = chunks.into_iter().flatten().collect();
        assert_eq!(flat, items);
    }

    #[test]
    fn an_item_over_the_limit_goes_alone_and_nothing_gives_no_message() {
        let chunks = chunk_by_size(vec![image("a", 1), image("big", 500), image("c", 1)], 200);
        let ids: Vec<Vec<&str>> = chunks
            .iter()
            .map(|c| c.iter().map(|i| i.id.as_str()).collect())
            .collect();
        assert_eq!(ids, vec![vec!["a"], vec!["big"], vec!["c"]]);
        assert!(chunk_by_size(Vec::<Image>::new(), 200).is_empty());
    }
}
