//! What a migration says about the keys it read: the ones it could not carry over (with the
//! reason) and the ones it carried over differently from what the file literally says.

use std::fmt;

/// The kind of a remark about one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoteKind {
    /// The key's setting is not in the crius config.
    NotCarried,
    /// The key was carried over, but not one to one.
    Note,
}

/// One remark about one key of the containerd config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub kind: NoteKind,
    /// The key's full TOML path, e.g. `plugins."io.containerd.grpc.v1.cri".enable_selinux`.
    pub key: String,
    pub reason: String,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            NoteKind::NotCarried => "not carried over",
            NoteKind::Note => "note",
        };
        write!(f, "{kind}: {}: {}", self.key, self.reason)
    }
}

/// Every remark of one migration, in the order the keys were read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub notes: Vec<Note>,
}

impl Report {
    pub(crate) fn not_carried(&mut self, key: impl Into<String>, reason: impl Into<String>) {
        self.notes.push(Note {
            kind: NoteKind::NotCarried,
            key: key.into(),
            reason: reason.into(),
        });
    }

    pub(crate) fn note(&mut self, key: impl Into<String>, reason: impl Into<String>) {
        self.notes.push(Note {
            kind: NoteKind::Note,
            key: key.into(),
            reason: reason.into(),
        });
    }

    /// The keys that were not carried over.
    pub fn not_carried_keys(&self) -> Vec<&str> {
        self.notes
            .iter()
            .filter(|n| n.kind == NoteKind::NotCarried)
            .map(|n| n.key.as_str())
            .collect()
    }

    /// The remark about `key`, if there is one.
    pub fn find(&self, key: &str) -> Option<&Note> {
        self.notes.iter().find(|n| n.key == key)
    }
}

/// `key` as it is written in a TOML path: bare when it may be, else quoted.
pub(crate) fn quote_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare {
        key.to_string()
    } else {
        let escaped = key.replace('\\', "\\\\").replace('"', "\\\"");
        format!("\"{escaped}\"")
    }
}

/// `prefix.key`, with `key` quoted as TOML needs.
pub(crate) fn join_key(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        quote_key(key)
    } else {
        format!("{prefix}.{}", quote_key(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_quoted_only_when_toml_needs_it() {
        assert_eq!(
            join_key("plugins", "io.containerd.grpc.v1.cri"),
            "plugins.\"io.containerd.grpc.v1.cri\""
        );
        assert_eq!(join_key("a", "runc"), "a.runc");
        assert_eq!(join_key("", "say \"hi\""), "\"say \\\"hi\\\"\"");
        assert_eq!(
            Note {
                kind: NoteKind::NotCarried,
                key: "k".into(),
                reason: "why".into()
            }
            .to_string(),
            "not carried over: k: why"
        );
    }
}
