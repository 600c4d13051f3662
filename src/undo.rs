//! Undo steps for multi-step operations: each step that made something pushes how to unmake
//! it; on failure they run in reverse order, on success they are dropped unrun.

use futures::future::BoxFuture;

/// A stack of undo steps. Steps are lazy futures: nothing runs until [`Undo::run`].
#[derive(Default)]
pub struct Undo {
    steps: Vec<(&'static str, BoxFuture<'static, ()>)>,
}

impl Undo {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records how to undo the step `what`.
    pub fn push(&mut self, what: &'static str, step: impl Future<Output = ()> + Send + 'static) {
        self.steps.push((what, Box::pin(step)));
    }

    /// Undoes every recorded step, newest first.
    pub async fn run(mut self) {
        while let Some((what, step)) = self.steps.pop() {
            tracing::debug!(step = what, "undoing");
            step.await;
        }
    }

    /// Forgets the steps: the operation succeeded.
    pub fn disarm(mut self) {
        self.steps.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[tokio::test]
    async fn runs_in_reverse_or_not_at_all() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut undo = Undo::new();
        for i in 0..3 {
            let log = log.clone();
            undo.push("step", async move { log.lock().unwrap().push(i) });
        }
        undo.run().await;
        assert_eq!(*log.lock().unwrap(), vec![2, 1, 0]);

        let mut undo = Undo::new();
        let log2 = log.clone();
        undo.push("step", async move { log2.lock().unwrap().push(9) });
        undo.disarm();
        assert_eq!(log.lock().unwrap().len(), 3);
    }
}
