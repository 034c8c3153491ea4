//! Host paths as the kernel resolves them, for comparing a path a pod names (or the runtime
//! reports) with the places exitorder guards: no spelling gets around a comparison.

/// A path's components with `//`, `.` and `..` resolved (`..` at the root stays at the root,
/// as the kernel resolves it).
pub fn components(path: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            p => out.push(p),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_resolve_alike() {
        let want = vec!["var", "lib", "exitorder"];
        for p in [
            "/var/lib/exitorder",
            "/var/lib//exitorder/",
            "/var/./lib/x/../exitorder",
            "/../var/lib/exitorder",
        ] {
            assert_eq!(components(p), want, "{p}");
        }
        assert!(components("/").is_empty());
    }
}
