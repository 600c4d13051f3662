//! Lookup of IDs by any unique prefix, as crictl users type them.

use std::collections::BTreeSet;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdLookupError {
    #[error("ID prefix {0:?} matches more than one ID")]
    Ambiguous(String),
    #[error("an empty ID prefix is not allowed")]
    Empty,
}

/// A set of IDs searchable by prefix.
#[derive(Debug, Default, Clone)]
pub struct IdIndex {
    ids: BTreeSet<String>,
}

impl IdIndex {
    pub fn insert(&mut self, id: &str) {
        self.ids.insert(id.to_string());
    }

    pub fn remove(&mut self, id: &str) {
        self.ids.remove(id);
    }

    /// The one ID that starts with `prefix`; `None` when there is none.
    pub fn get(&self, prefix: &str) -> Result<Option<&str>, IdLookupError> {
        if prefix.is_empty() {
            return Err(IdLookupError::Empty);
        }
        let mut matches = self
            .ids
            .range(prefix.to_string()..)
            .take_while(|id| id.starts_with(prefix));
        match (matches.next(), matches.next()) {
            (None, _) => Ok(None),
            (Some(id), None) => Ok(Some(id)),
            (Some(_), Some(_)) => Err(IdLookupError::Ambiguous(prefix.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_unique_prefixes_only() {
        let mut index = IdIndex::default();
        index.insert("abc123");
        index.insert("abd456");
        assert_eq!(index.get("abc").unwrap(), Some("abc123"));
        assert_eq!(index.get("abc123").unwrap(), Some("abc123"));
        assert_eq!(index.get("ab"), Err(IdLookupError::Ambiguous("ab".into())));
        assert_eq!(index.get("x").unwrap(), None);
        assert_eq!(index.get(""), Err(IdLookupError::Empty));
        index.remove("abd456");
        assert_eq!(index.get("ab").unwrap(), Some("abc123"));
    }
}
