//! Locks by name, made on first use and gone once no one holds or waits for them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// One async lock per key.
#[derive(Default)]
pub struct KeyedLocks {
    locks: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl KeyedLocks {
    /// The lock of `key`, made when no one holds or waits for it.
    pub fn get(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(lock) = locks.get(key).and_then(Weak::upgrade) {
            return lock;
        }
        locks.retain(|_, lock| lock.strong_count() > 0);
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        locks.insert(key.to_string(), Arc::downgrade(&lock));
        lock
    }

    /// Holds the lock of `key` until the guard drops.
    pub async fn lock(&self, key: &str) -> tokio::sync::OwnedMutexGuard<()> {
        self.get(key).lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_holder_per_key_and_unused_locks_go() {
        let locks = KeyedLocks::default();
        let held = locks.lock("a").await;
        assert!(locks.get("a").try_lock().is_err(), "a is held");
        assert!(locks.get("b").try_lock().is_ok(), "b is another lock");
        drop(held);
        assert!(locks.get("a").try_lock().is_ok());
        let _c = locks.lock("c").await;
        let kept = locks.locks.lock().unwrap().len();
        assert!(kept <= 2, "{kept} locks kept");
    }
}
