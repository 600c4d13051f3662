//! Finding the exec's program the way runc does (Go's `exec.LookPath` over the process's
//! `PATH`), with runc's words for what goes wrong: crius tells an exec that cannot run from
//! a runtime failure by them.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The program `file` names: itself when it has a slash, else the first executable file of
/// that name in a `PATH` directory. The error is runc's text.
pub fn look_path(file: &str, path_env: Option<&str>) -> Result<String, String> {
    let quoted = format!("{file:?}");
    if file.contains('/') {
        return executable(file)
            .map(|()| file.to_string())
            .map_err(|why| format!("exec: {quoted}: {why}"));
    }
    // Go splits an empty PATH into no directories, not into one empty one.
    let dirs = path_env.filter(|p| !p.is_empty()).map(|p| p.split(':'));
    for dir in dirs.into_iter().flatten() {
        let candidate = join(dir, file);
        if executable(&candidate).is_ok() {
            if !candidate.starts_with('/') {
                return Err(format!(
                    "exec: {quoted}: cannot run executable found relative to current directory"
                ));
            }
            return Ok(candidate);
        }
    }
    Err(format!(
        "exec: {quoted}: executable file not found in $PATH"
    ))
}

/// `dir/file` as Go's `filepath.Join` gives it for a PATH entry (empty: the current
/// directory).
fn join(dir: &str, file: &str) -> String {
    match dir.trim_end_matches('/') {
        "" if dir.starts_with('/') => format!("/{file}"),
        "" | "." => file.to_string(),
        dir => format!("{dir}/{file}"),
    }
}

/// Whether `path` is a file some execute bit allows.
fn executable(path: &str) -> Result<(), String> {
    let meta = std::fs::metadata(Path::new(path))
        .map_err(|e| format!("stat {path}: {}", errno_text(&e)))?;
    if meta.is_dir() || meta.permissions().mode() & 0o111 == 0 {
        return Err("permission denied".to_string());
    }
    Ok(())
}

/// An OS error as Go words it: the C library's text with a small first letter.
pub fn errno_text(error: &std::io::Error) -> String {
    let Some(code) = error.raw_os_error() else {
        return error.to_string();
    };
    // SAFETY: strerror returns a pointer to a static or thread-local NUL-terminated text.
    let text = unsafe { std::ffi::CStr::from_ptr(libc::strerror(code)) };
    let mut text = text.to_string_lossy().into_owned();
    if let Some(first) = text.get(..1) {
        text.replace_range(..1, &first.to_ascii_lowercase());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn programs_are_found_and_missing_ones_are_named_as_runc_names_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).expect("bin");
        let tool = bin.join("tool");
        std::fs::write(&tool, "#!/bin/sh\n").expect("tool");
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).expect("mode");
        let plain = bin.join("plain");
        std::fs::write(&plain, "").expect("plain");
        let path = format!("/nonexistent:{}", bin.display());

        assert_eq!(
            look_path("tool", Some(&path)),
            Ok(tool.display().to_string())
        );
        let full = tool.display().to_string();
        assert_eq!(look_path(&full, None), Ok(full.clone()));
        assert_eq!(
            look_path("nope", Some(&path)),
            Err(r#"exec: "nope": executable file not found in $PATH"#.to_string())
        );
        assert_eq!(
            look_path("tool", None),
            Err(r#"exec: "tool": executable file not found in $PATH"#.to_string())
        );
        assert_eq!(
            look_path("/nonexistent/binary", None),
            Err(r#"exec: "/nonexistent/binary": stat /nonexistent/binary: no such file or directory"#.to_string())
        );
        let dir_name = bin.display().to_string();
        assert_eq!(
            look_path(&dir_name, None),
            Err(format!("exec: {dir_name:?}: permission denied"))
        );
        assert_eq!(
            look_path("plain", Some(&path)),
            Err(r#"exec: "plain": executable file not found in $PATH"#.to_string())
        );
    }

    #[test]
    fn path_entries_join_as_go_joins_them() {
        assert_eq!(join("/usr/bin/", "sh"), "/usr/bin/sh");
        assert_eq!(join("/", "sh"), "/sh");
        assert_eq!(join("", "sh"), "sh");
        assert_eq!(join(".", "sh"), "sh");
        assert_eq!(join("rel", "sh"), "rel/sh");
    }

    #[test]
    fn os_errors_read_as_go_writes_them() {
        let e = std::io::Error::from_raw_os_error(libc::ENOEXEC);
        assert_eq!(errno_text(&e), "exec format error");
        let e = std::io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(errno_text(&e), "no such file or directory");
    }
}
