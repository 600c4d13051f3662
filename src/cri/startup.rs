//! Start-up: recover what containerd and the disk hold, start the critical tasks (event
//! monitor, CNI conf syncer, stream server, usage syncers) and open the initialized gate.

use tokio::task::JoinSet;

use super::{CriService, ServiceError, TaskEnd};

impl CriService {
    /// Recovers state and starts the critical tasks, then marks the service initialized.
    pub(crate) async fn start(
        &self,
        tasks: &mut JoinSet<TaskEnd>,
        stream_server: crate::streaming::StreamServer,
    ) -> Result<(), ServiceError> {
        crate::failpoint::hit("startup").await?;
        let recovery = std::time::Instant::now();
        super::recovery::recover_images(&self.containerd, &self.images).await?;
        super::recovery::recover_sandboxes(self).await?;
        super::recovery::recover_containers(self).await?;
        super::recovery::clean_up_leftovers(self).await;
        crate::metrics::metrics().recovered(recovery.elapsed());
        if self.config.image.sandbox_image.is_empty()
            && let Err(e) = self
                .ensure_sandbox_image(&self.config.containerd.snapshotter)
                .await
        {
            tracing::warn!(error = %e, "the built-in pause image is not available yet");
        }

        let monitor = crate::cri::events::EventMonitor::new(
            self.containerd.clone(),
            self.images.clone(),
            std::sync::Arc::new(self.clone()),
        );
        let cancel = self.shutdown.clone();
        tasks.spawn(async move {
            let ended = monitor.run(cancel).await;
            ("containerd event monitor", ended.map_err(|e| e.to_string()))
        });

        let syncer = crate::cni::syncer::CniConfSyncer::new(self.cni.clone());
        let cancel = self.shutdown.clone();
        tasks.spawn(async move {
            let ended = syncer.run(cancel).await;
            ("CNI conf syncer", ended.map_err(|e| e.to_string()))
        });

        let cancel = self.shutdown.clone();
        tasks.spawn(async move {
            stream_server.serve(cancel).await;
            ("stream server", Ok(()))
        });

        let service = self.clone();
        tasks.spawn(async move {
            service
                .run_layer_usage_syncer(
                    service.config.stats_collect_period,
                    service.shutdown.clone(),
                )
                .await;
            ("snapshot usage syncer", Ok(()))
        });

        if !self.config.cpu_sample_period.is_zero() {
            let service = self.clone();
            tasks.spawn(async move {
                service
                    .run_cpu_sampler(service.config.cpu_sample_period, service.shutdown.clone())
                    .await;
                ("CPU sampler", Ok(()))
            });
        }

        let service = self.clone();
        tasks.spawn(async move {
            service
                .image_fs
                .run_syncer(
                    service.config.stats_collect_period,
                    service.shutdown.clone(),
                )
                .await;
            ("image filesystem usage syncer", Ok(()))
        });

        self.mark_initialized();
        Ok(())
    }
}
