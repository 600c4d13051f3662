//! Unique names for sandboxes and containers: a name is reserved for one ID until released.

use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("name {name:?} is reserved for {holder:?}")]
pub struct NameReserved {
    pub name: String,
    pub holder: String,
}

#[derive(Default)]
pub struct NameRegistrar {
    names: Mutex<HashMap<String, String>>,
}

impl NameRegistrar {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reserves `name` for `key`; reserving it again for the same key is fine.
    pub fn reserve(&self, name: &str, key: &str) -> Result<(), NameReserved> {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        match names.get(name) {
            Some(holder) if holder != key => Err(NameReserved {
                name: name.to_string(),
                holder: holder.clone(),
            }),
            _ => {
                names.insert(name.to_string(), key.to_string());
                Ok(())
            }
        }
    }

    /// Releases `name` if `key` holds it.
    pub fn release(&self, name: &str, key: &str) {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        if names.get(name).is_some_and(|holder| holder == key) {
            names.remove(name);
        }
    }

    pub fn holder(&self, name: &str) -> Option<String> {
        self.names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_has_one_holder_until_released() {
        let names = NameRegistrar::new();
        names.reserve("web_default_uid_0", "id1").unwrap();
        names.reserve("web_default_uid_0", "id1").unwrap();
        let err = names.reserve("web_default_uid_0", "id2").unwrap_err();
        assert_eq!(err.holder, "id1");
        names.release("web_default_uid_0", "id2");
        assert_eq!(names.holder("web_default_uid_0").as_deref(), Some("id1"));
        names.release("web_default_uid_0", "id1");
        names.reserve("web_default_uid_0", "id2").unwrap();
    }
}
