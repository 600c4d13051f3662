//! Image references, parsed and normalised as Docker and containerd do:
//! `busybox` → `docker.io/library/busybox:latest`; `host:5000/a/b` keeps its host;
//! `name@sha256:…` and `name:tag@sha256:…` carry a digest.

use std::fmt;

/// The registry that references without a host name.
pub const DEFAULT_DOMAIN: &str = "docker.io";
const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
const OFFICIAL_REPO_PREFIX: &str = "library/";
const DEFAULT_TAG: &str = "latest";
const MAX_NAME_LEN: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid image reference {reference:?}: {reason}")]
pub struct ReferenceError {
    pub reference: String,
    pub reason: String,
}

/// A normalised reference: `domain/path[:tag][@digest]`, with a tag or a digest or both.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    pub domain: String,
    pub path: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl Reference {
    /// Parses `text` as Docker does, defaulting the domain, the `library/` prefix and the
    /// `latest` tag.
    pub fn parse(text: &str) -> Result<Self, ReferenceError> {
        let fail = |reason: &str| ReferenceError {
            reference: text.to_string(),
            reason: reason.to_string(),
        };
        if text.is_empty() {
            return Err(fail("empty reference"));
        }
        if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(fail(
                "a 64-character hexadecimal string is an image ID, not a repository name",
            ));
        }
        let (rest, digest) = match text.split_once('@') {
            Some((rest, digest)) => {
                validate_digest(digest).map_err(|r| fail(&r))?;
                (rest, Some(digest.to_string()))
            }
            None => (text, None),
        };
        let (name, tag) = split_tag(rest);
        if let Some(tag) = tag {
            validate_tag(tag).map_err(|r| fail(&r))?;
        }
        let (domain, path) = split_domain(name);
        if let Some(domain) = &domain {
            validate_domain(domain).map_err(|r| fail(&r))?;
        }
        let mut domain = domain.unwrap_or(DEFAULT_DOMAIN).to_string();
        if domain == LEGACY_DEFAULT_DOMAIN {
            domain = DEFAULT_DOMAIN.to_string();
        }
        if path.chars().any(|c| c.is_ascii_uppercase()) {
            return Err(fail("repository name must be lowercase"));
        }
        validate_path(path).map_err(|r| fail(&r))?;
        let path = if domain == DEFAULT_DOMAIN && !path.contains('/') {
            format!("{OFFICIAL_REPO_PREFIX}{path}")
        } else {
            path.to_string()
        };
        if domain.len() + 1 + path.len() > MAX_NAME_LEN {
            return Err(fail("repository name is longer than 255 characters"));
        }
        let tag = match (tag, &digest) {
            (Some(tag), _) => Some(tag.to_string()),
            (None, None) => Some(DEFAULT_TAG.to_string()),
            (None, Some(_)) => None,
        };
        Ok(Self {
            domain,
            path,
            tag,
            digest,
        })
    }

    /// `domain/path`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.domain, self.path)
    }

    /// What the registry is asked for: the digest when there is one, else the tag.
    pub fn object(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or(DEFAULT_TAG)
    }

    /// `domain/path:tag`, when the reference has a tag.
    pub fn tagged(&self) -> Option<String> {
        self.tag.as_ref().map(|t| format!("{}:{t}", self.name()))
    }

    /// `domain/path@digest` for any digest of this repository.
    pub fn with_digest(&self, digest: &str) -> String {
        format!("{}@{digest}", self.name())
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// Splits `name:tag`, where the colon must come after the last slash (else it is a port).
fn split_tag(text: &str) -> (&str, Option<&str>) {
    match text.rfind(':') {
        Some(colon) if !text[colon..].contains('/') => (&text[..colon], Some(&text[colon + 1..])),
        _ => (text, None),
    }
}

/// Splits off the domain: the first component when it looks like a host.
fn split_domain(name: &str) -> (Option<&str>, &str) {
    match name.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (Some(first), rest)
        }
        _ => (None, name),
    }
}

fn validate_digest(digest: &str) -> Result<(), String> {
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return Err(format!("digest {digest:?} has no algorithm"));
    };
    let expected_len = match algorithm {
        "sha256" => 64,
        "sha512" => 128,
        _ => return Err(format!("unsupported digest algorithm {algorithm:?}")),
    };
    if hex.len() != expected_len || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(format!(
            "digest {digest:?} is not {expected_len} lowercase hex digits"
        ));
    }
    Ok(())
}

fn validate_tag(tag: &str) -> Result<(), String> {
    let mut chars = tag.chars();
    let valid = tag.len() <= 128
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if valid {
        Ok(())
    } else {
        Err(format!("invalid tag {tag:?}"))
    }
}

fn validate_domain(domain: &str) -> Result<(), String> {
    let (host, port) = match domain.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || domain.starts_with('[') => (host, Some(port)),
        _ => (domain, None),
    };
    if let Some(port) = port
        && (port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!("invalid port in {domain:?}"));
    }
    let host_ok = if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        inner.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    };
    if host_ok {
        Ok(())
    } else {
        Err(format!("invalid registry host {domain:?}"))
    }
}

/// Path components: lowercase alphanumerics joined by `.`, `_`, `__` or runs of `-`.
fn validate_path(path: &str) -> Result<(), String> {
    for component in path.split('/') {
        if !valid_component(component) {
            return Err(format!("invalid repository path component {component:?}"));
        }
    }
    Ok(())
}

fn valid_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        // A separator: ".", "_", "__" or one or more "-", followed by an alphanumeric.
        let start = i;
        match bytes[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if i < bytes.len() && bytes[i] == b'_' {
                    i += 1;
                }
            }
            b'-' => {
                while i < bytes.len() && bytes[i] == b'-' {
                    i += 1;
                }
            }
            _ => return false,
        }
        if i == start || i >= bytes.len() || !alnum(bytes[i]) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn norm(text: &str) -> String {
        Reference::parse(text).unwrap().to_string()
    }

    #[test]
    fn normalises_like_docker() {
        assert_eq!(norm("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(norm("busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(norm("library/busybox"), "docker.io/library/busybox:latest");
        assert_eq!(norm("me/app"), "docker.io/me/app:latest");
        assert_eq!(norm("index.docker.io/me/app"), "docker.io/me/app:latest");
        assert_eq!(norm("host:5000/a/b"), "host:5000/a/b:latest");
        assert_eq!(norm("localhost/app:v1"), "localhost/app:v1");
        assert_eq!(
            norm("127.0.0.1:5010/busybox"),
            "127.0.0.1:5010/busybox:latest"
        );
        assert_eq!(
            norm("registry.k8s.io/pause:3.9"),
            "registry.k8s.io/pause:3.9"
        );
        assert_eq!(
            norm(&format!("busybox@{DIGEST}")),
            format!("docker.io/library/busybox@{DIGEST}")
        );
        assert_eq!(
            norm(&format!("busybox:1.36@{DIGEST}")),
            format!("docker.io/library/busybox:1.36@{DIGEST}")
        );
        assert_eq!(
            norm("a__b-c---d/e_f.g"),
            "docker.io/a__b-c---d/e_f.g:latest"
        );
    }

    #[test]
    fn object_prefers_the_digest() {
        let r = Reference::parse(&format!("busybox:1.36@{DIGEST}")).unwrap();
        assert_eq!(r.object(), DIGEST);
        assert_eq!(r.tagged().unwrap(), "docker.io/library/busybox:1.36");
        let r = Reference::parse("busybox").unwrap();
        assert_eq!(r.object(), "latest");
        assert_eq!(
            r.with_digest(DIGEST),
            format!("docker.io/library/busybox@{DIGEST}")
        );
    }

    #[test]
    fn rejects_invalid_references() {
        for bad in [
            "",
            "Busybox",
            "busybox:",
            "busybox:-tag",
            "busybox@sha256:abc",
            "busybox@md5:d41d8cd98f00b204e9800998ecf8427e",
            "a//b",
            "a/b/",
            "-a",
            "a..b",
            "a___b",
            "host:port/a",
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "a b",
        ] {
            let err = Reference::parse(bad).expect_err(bad);
            assert_eq!(err.reference, bad);
        }
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::fuzz_config())]

        #[test]
        fn any_text_parses_or_fails_cleanly(text in "\\PC{0,80}") {
            let _ = Reference::parse(&text);
        }

        #[test]
        fn a_parsed_reference_prints_as_itself(text in "[a-z0-9.:/@_-]{1,60}") {
            if let Ok(reference) = Reference::parse(&text) {
                let again = Reference::parse(&reference.to_string()).unwrap();
                prop_assert_eq!(again, reference);
            }
        }
    }
}
