//! Whether an executable needs a dynamic loader: the pod holder execs the shim inside an
//! empty root, where no loader is, so only a static shim can hold a pod.

use std::fs::File;
use std::os::unix::fs::FileExt;

const PT_INTERP: u32 = 3;
/// Program headers crius reads at most (a static binary has a dozen).
const MAX_HEADERS: u16 = 256;

/// The loader the 64-bit little-endian ELF `file` names (its `PT_INTERP`), None for a
/// static executable or a file that is not such an ELF.
pub fn dynamic_loader(file: &File) -> std::io::Result<Option<String>> {
    let mut header = [0u8; 64];
    file.read_exact_at(&mut header, 0)?;
    // "\x7fELF", 64-bit, little-endian.
    if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return Ok(None);
    }
    let phoff = u64::from_le_bytes(bytes(&header, 32));
    let phentsize = u16::from_le_bytes(bytes(&header, 54));
    let phnum = u16::from_le_bytes(bytes(&header, 56)).min(MAX_HEADERS);
    if phentsize < 56 {
        return Ok(None);
    }
    for i in 0..u64::from(phnum) {
        let mut entry = [0u8; 56];
        file.read_exact_at(&mut entry, phoff + i * u64::from(phentsize))?;
        if u32::from_le_bytes(bytes(&entry, 0)) != PT_INTERP {
            continue;
        }
        let offset = u64::from_le_bytes(bytes(&entry, 8));
        let size = u64::from_le_bytes(bytes(&entry, 32)).min(4096);
        let mut name = vec![0u8; usize::try_from(size).unwrap_or(0)];
        file.read_exact_at(&mut name, offset)?;
        let name = name.split(|b| *b == 0).next().unwrap_or_default();
        return Ok(Some(String::from_utf8_lossy(name).into_owned()));
    }
    Ok(None)
}

/// `N` bytes of `buf` from `at` (the caller's buffer is long enough by construction).
fn bytes<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&buf[at..at + N]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_executable_names_its_loader_and_a_static_one_none() {
        // This test binary links glibc dynamically.
        let me = File::open(std::env::current_exe().expect("exe")).expect("open");
        let loader = dynamic_loader(&me).expect("read").expect("a loader");
        assert!(
            loader.starts_with('/') && loader.contains("ld-"),
            "{loader}"
        );
        // Debian's busybox-static.
        let busybox = File::open("/bin/busybox").expect("busybox");
        assert_eq!(dynamic_loader(&busybox).expect("read"), None);
        // Not an ELF at all.
        let text = tempfile::NamedTempFile::new().expect("temp");
        std::fs::write(text.path(), [b'#'; 100]).expect("write");
        assert_eq!(dynamic_loader(text.as_file()).expect("read"), None);
    }
}
