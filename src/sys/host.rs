//! Facts about the host itself.

/// The node's hostname (empty when the kernel's cannot be read).
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
}
