//! Unique names for sandboxes and containers: a name is reserved for one ID until released.
//!
//! A reservation may carry the fingerprint of the request that made it. When kubelet retries
//! a RunPodSandbox or CreateContainer whose first call it gave up on, the retry has the same
//! fingerprint: instead of "name is reserved" it waits for the first call to settle and gets
//! its result. A different request under a taken name is still refused.

use std::collections::HashMap;
use std::sync::Mutex;

use sha2::{Digest, Sha256};
use tokio::sync::watch;

#[derive(Debug, Clone, thiserror::Error)]
#[error("name {name:?} is reserved for {holder:?}")]
pub struct NameReserved {
    pub name: String,
    pub holder: String,
    /// Whether the holder was reserved by a request with the same fingerprint.
    pub same_request: bool,
    /// Turns true once the holder's operation has finished (or its reservation is gone).
    pub settled: watch::Receiver<bool>,
}

impl NameReserved {
    /// Waits until the holder's operation has finished, or its reservation is gone.
    pub async fn wait_settled(mut self) {
        let _ = self.settled.wait_for(|settled| *settled).await;
    }
}

struct Reservation {
    key: String,
    fingerprint: Option<String>,
    settled: watch::Sender<bool>,
}

#[derive(Default)]
pub struct NameRegistrar {
    names: Mutex<HashMap<String, Reservation>>,
}

/// The fingerprint of a request: a digest of its canonical JSON (map keys sorted), so equal
/// requests match whatever order their maps came in.
pub fn fingerprint<T: serde::Serialize>(request: &T) -> String {
    let value = serde_json::to_value(request).unwrap_or(serde_json::Value::Null);
    let mut canonical = String::new();
    write_canonical(&value, &mut canonical);
    format!("{:x}", Sha256::digest(canonical.as_bytes()))
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for key in keys {
                out.push_str(&serde_json::Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
                out.push(',');
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for item in items {
                write_canonical(item, out);
                out.push(',');
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

impl NameRegistrar {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reserves `name` for `key`, settled at once (recovery: the object exists already).
    pub fn reserve(&self, name: &str, key: &str) -> Result<(), NameReserved> {
        self.reserve_for(name, key, None)?;
        self.settle(name, key);
        Ok(())
    }

    /// Reserves `name` for `key` made by a request with `fingerprint`, unsettled until
    /// [`Self::settle`]; reserving it again for the same key is fine.
    pub fn reserve_for(
        &self,
        name: &str,
        key: &str,
        fingerprint: Option<&str>,
    ) -> Result<(), NameReserved> {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        match names.get(name) {
            Some(holder) if holder.key != key => Err(NameReserved {
                name: name.to_string(),
                holder: holder.key.clone(),
                same_request: fingerprint.is_some() && holder.fingerprint.as_deref() == fingerprint,
                settled: holder.settled.subscribe(),
            }),
            Some(_) => Ok(()),
            None => {
                names.insert(
                    name.to_string(),
                    Reservation {
                        key: key.to_string(),
                        fingerprint: fingerprint.map(str::to_string),
                        settled: watch::channel(false).0,
                    },
                );
                Ok(())
            }
        }
    }

    /// Records the fingerprint of the request `key` was made by (recovery knows it from the
    /// stored config).
    pub fn set_fingerprint(&self, name: &str, key: &str, fingerprint: String) {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(holder) = names.get_mut(name).filter(|h| h.key == key) {
            holder.fingerprint = Some(fingerprint);
        }
    }

    /// The operation that reserved `name` for `key` has finished.
    pub fn settle(&self, name: &str, key: &str) {
        let names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(holder) = names.get(name).filter(|h| h.key == key) {
            holder.settled.send_replace(true);
        }
    }

    /// The operation that reserved `name` for `key` answered its client in time: a request
    /// alike from now on is a duplicate, refused as containerd's CRI refuses it, not a retry
    /// of a call whose answer was lost.
    pub fn answered(&self, name: &str, key: &str) {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(holder) = names.get_mut(name).filter(|h| h.key == key) {
            holder.fingerprint = None;
        }
    }

    /// Releases `name` if `key` holds it; whoever waits on it is woken.
    pub fn release(&self, name: &str, key: &str) {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        if names.get(name).is_some_and(|holder| holder.key == key)
            && let Some(holder) = names.remove(name)
        {
            holder.settled.send_replace(true);
        }
    }

    pub fn holder(&self, name: &str) -> Option<String> {
        self.names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .map(|h| h.key.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_name_has_one_holder_until_released() {
        let names = NameRegistrar::new();
        names.reserve("web_default_uid_0", "id1").unwrap();
        names.reserve("web_default_uid_0", "id1").unwrap();
        let err = names.reserve("web_default_uid_0", "id2").unwrap_err();
        assert_eq!(err.holder, "id1");
        assert!(!err.same_request);
        names.release("web_default_uid_0", "id2");
        assert_eq!(names.holder("web_default_uid_0").as_deref(), Some("id1"));
        names.release("web_default_uid_0", "id1");
        names.reserve("web_default_uid_0", "id2").unwrap();
    }

    #[tokio::test]
    async fn a_retry_of_the_same_request_waits_for_the_first_to_settle() {
        let names = std::sync::Arc::new(NameRegistrar::new());
        names.reserve_for("n", "first", Some("fp")).unwrap();
        let same = names.reserve_for("n", "second", Some("fp")).unwrap_err();
        assert!(same.same_request);
        assert_eq!(same.holder, "first");
        let other = names.reserve_for("n", "third", Some("other")).unwrap_err();
        assert!(!other.same_request);

        let waiter = tokio::spawn(same.wait_settled());
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        names.settle("n", "first");
        tokio::time::timeout(std::time::Duration::from_secs(1), waiter)
            .await
            .expect("settling wakes the retry")
            .unwrap();

        // A release (the first failed) wakes a waiter too.
        names.reserve_for("m", "first", Some("fp")).unwrap();
        let waiting = names.reserve_for("m", "second", Some("fp")).unwrap_err();
        names.release("m", "first");
        tokio::time::timeout(std::time::Duration::from_secs(1), waiting.wait_settled())
            .await
            .expect("a release wakes the retry");
    }

    #[test]
    fn fingerprints_ignore_map_order_and_see_every_field() {
        let a: HashMap<String, String> =
            (0..20).map(|i| (format!("k{i}"), i.to_string())).collect();
        let mut b = HashMap::new();
        for i in (0..20).rev() {
            b.insert(format!("k{i}"), i.to_string());
        }
        assert_eq!(fingerprint(&a), fingerprint(&b));
        b.insert("k0".into(), "changed".into());
        assert_ne!(fingerprint(&a), fingerprint(&b));
    }
}
