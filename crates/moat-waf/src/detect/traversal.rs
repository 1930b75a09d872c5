//! Path traversal / local file inclusion and URL-path normalisation bypasses.

use std::sync::LazyLock;

use aho_corasick::AhoCorasick;

use super::matcher::{first_match, matcher};
use super::{Attack, Hit};
use crate::util::{contains_ci, find_ci};

static SENSITIVE_AC: LazyLock<Option<AhoCorasick>> =
    LazyLock::new(|| matcher(SENSITIVE.iter().copied()));

const SENSITIVE: &[&str] = &[
    "etc/passwd",
    "etc/shadow",
    "etc/group",
    "etc/hosts",
    "etc/issue",
    "etc/hostname",
    "etc/sudoers",
    "etc/crontab",
    "proc/self/",
    "proc/version",
    "win.ini",
    "boot.ini",
    "system.ini",
    "windows/system32",
    "web-inf/",
    "meta-inf/",
    ".htaccess",
    ".htpasswd",
    ".git/config",
    ".git/head",
    ".ssh/",
    "id_rsa",
    "var/log/",
    ".bash_history",
    "wp-config.php",
    ".env",
    "/dev/tcp/",
    "bin/sh",
    "ntuser.dat",
    "bin/bash",
    "cmd.exe",
];

/// Counts `../` style steps (either slash, `..;/`, trailing `/..`).
fn up_steps(b: &[u8]) -> usize {
    let mut n = 0;
    let mut i = 0;
    while i + 1 < b.len() {
        if b[i] == b'.' && b[i + 1] == b'.' {
            let before_ok =
                i == 0 || matches!(b[i - 1], b'/' | b'\\' | b'=' | b' ' | b':' | b'\'' | b'"');
            let after = b.get(i + 2).copied();
            let after_ok = matches!(after, Some(b'/' | b'\\') | None)
                || (after == Some(b';') && matches!(b.get(i + 3), Some(b'/' | b'\\')));
            if before_ok && after_ok {
                n += 1;
                i += 2;
                continue;
            }
        }
        i += 1;
    }
    n
}

/// Path traversal and local file inclusion.
pub fn traversal(s: &str) -> Option<Hit> {
    // every separator-dependent form below needs a `/` or a `\\`: prose has neither,
    // and one memchr2 saves it five substring searches
    let separators = memchr::memchr2(b'/', b'\\', s.as_bytes()).is_some();
    if separators && (s.contains("/./") || s.contains("\\.\\") || s.contains("//")) {
        let mut n = s.replace("\\.\\", "\\");
        while n.contains("/./") {
            n = n.replace("/./", "/");
        }
        let n = n.replace("///", "/");
        if n.len() != s.len() {
            if let Some(h) = traversal_inner(&n, true) {
                return Some(h);
            }
        }
    }
    // `....//` and `..././` are what a filter that strips `../` once leaves as `../`:
    // judge the string that filter would pass on
    // (every such form holds `...`: one search rules them out for nearly every value)
    if separators
        && memchr::memmem::find(s.as_bytes(), b"...").is_some()
        && (s.contains("....") || s.contains(".../") || s.contains("...\\"))
    {
        let stripped = s.replace("../", "").replace("..\\", "");
        if stripped.len() != s.len() {
            if let Some(h) = traversal_inner(&stripped, true) {
                return Some(h);
            }
        }
    }
    traversal_inner(s, separators)
}

/// `separators`: whether `s` holds a `/` or a `\\` (normalising keeps that true).
fn traversal_inner(s: &str, separators: bool) -> Option<Hit> {
    let b = s.as_bytes();
    // UNC path to an administrative share: \\host\c$\...
    if let Some(p) = separators
        .then(|| memchr::memmem::find(b, b"\\\\"))
        .flatten()
    {
        let rest = &s[p + 2..];
        if let Some(slash) = rest.find('\\') {
            let share = rest[slash + 1..].split('\\').next().unwrap_or("");
            if share.len() == 2 && share.ends_with('$')
                || share.eq_ignore_ascii_case("admin$")
                || share.eq_ignore_ascii_case("ipc$")
            {
                return Some(Hit::new(Attack::PathTraversal, 85, s, p, p + 2 + slash + 4));
            }
        }
    }
    let ups = if memchr::memmem::find(b, b"..").is_some() {
        up_steps(b)
    } else {
        0
    };
    let sensitive = first_match(&SENSITIVE_AC, SENSITIVE, b).map(|(_, p, e)| (p, e - p));
    // wrappers (every one contains `://`: one search rules them all out)
    let wrappers: &[&[u8]] = if separators && memchr::memmem::find(b, b"://").is_some() {
        &[
            b"php://",
            b"expect://",
            b"phar://",
            b"zip://",
            b"compress.zlib://",
            b"glob://",
            b"data://text",
        ]
    } else {
        &[]
    };
    for &w in wrappers {
        if let Some(p) = find_ci(b, w) {
            let at_start = s[..p].trim().is_empty()
                || matches!(b.get(p.wrapping_sub(1)), Some(b'=' | b'"' | b'\''));
            if at_start {
                return Some(Hit::new(Attack::PathTraversal, 90, s, p, p + w.len() + 24));
            }
        }
    }
    if ups >= 1 {
        if let Some((p, l)) = sensitive {
            return Some(Hit::new(Attack::PathTraversal, 90, s, 0, p + l));
        }
        if ups >= 3 {
            return Some(Hit::new(Attack::PathTraversal, 80, s, 0, s.len()));
        }
        if ups == 2 {
            return Some(Hit::new(Attack::PathTraversal, 55, s, 0, s.len()));
        }
    }
    if let Some((p, l)) = sensitive {
        // an absolute path (or drive) to a sensitive file as the whole value
        let before = &s[..p];
        let t = before.trim_start();
        let abs = t.is_empty()
            || t == "/"
            || t.ends_with(":\\")
            || t.ends_with(":/")
            || t.ends_with("://")
            || (t.starts_with('/') && t.len() <= 16 && !t.contains(' '))
            || t.ends_with("/./")
            || t.ends_with("\\");
        // an entry ending in `/` names a directory (`proc/self/`, `var/log/`, `.ssh/`,
        // `web-inf/`): a file under it follows without a space
        // (`/proc/self/environ`, `/var/log/nginx/access.log`)
        let dir_file = b[p + l - 1] == b'/'
            && b.len() > p + l
            && !b[p + l..].iter().any(|c| c.is_ascii_whitespace());
        let rest_ok = b.len() == p + l
            || dir_file
            || matches!(b.get(p + l), Some(b'\0' | b'%' | b'?' | b'#' | b' ' | b'{'));
        if abs && (rest_ok || t.ends_with("/./")) {
            return Some(Hit::new(
                Attack::PathTraversal,
                80,
                s,
                p.saturating_sub(1),
                p + l,
            ));
        }
    }
    None
}

/// Path-normalisation bypasses in the URL path (`raw` as received, `decoded`
/// after URL decoding): a `..` segment carrying a path parameter (`..;/`,
/// Tomcat/Jetty), a dot segment or separator that was percent-encoded
/// (`%2e%2e/`, `..%2f`, `%252e`: clients normalise plain `..` themselves, only
/// crafted requests encode them), and servlet-private directories
/// (`WEB-INF`, `META-INF`) which no client may request.
pub fn path_normalisation(raw: &[u8], decoded: &str) -> Option<Hit> {
    let mut dot_dot = false;
    for seg in decoded.split(['/', '\\']) {
        let bare = seg.split(';').next().unwrap_or(seg);
        if bare == ".." || bare == "." && seg.len() > 1 {
            dot_dot |= bare == "..";
            if seg.contains(';') {
                let p = decoded.find(seg).unwrap_or(0);
                return Some(Hit::new(
                    Attack::PathTraversal,
                    85,
                    decoded,
                    p,
                    p + seg.len() + 16,
                ));
            }
        }
        if seg.eq_ignore_ascii_case("web-inf") || seg.eq_ignore_ascii_case("meta-inf") {
            let p = decoded.find(seg).unwrap_or(0);
            return Some(Hit::new(
                Attack::PathTraversal,
                85,
                decoded,
                p,
                p + seg.len() + 24,
            ));
        }
    }
    if dot_dot {
        let encoded = ["%2e", "%2f", "%5c", "%25", "%c0", "%c1", "%u002e", "%e0%80"]
            .iter()
            .any(|e| contains_ci(raw, e.as_bytes()));
        if encoded {
            return Some(Hit::new(
                Attack::PathTraversal,
                85,
                decoded,
                0,
                decoded.len(),
            ));
        }
        return Some(Hit::new(
            Attack::PathTraversal,
            55,
            decoded,
            0,
            decoded.len(),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traversal_cases() {
        assert!(traversal("../../../../etc/passwd").is_some());
        assert!(traversal("file2/../../../../etc/passwd").is_some());
        assert!(traversal("/etc/passwd").is_some());
        assert!(traversal("php://filter/convert.base64-encode/resource=index").is_some());
        assert!(traversal("/cgi-bin/../../../../bin/sh").is_some());
        assert!(traversal("/images/logo.png").is_none());
        assert!(traversal("see ../readme for details").is_none());
        // what a filter that strips `../` once turns into `../../../etc/passwd`
        assert!(traversal("....//....//....//etc/passwd").is_some());
        assert!(traversal("..././..././..././etc/passwd").is_some());
        assert!(traversal("/proc/self/environ").is_some());
        assert!(traversal("/proc/self/fd/0").is_some());
        // files under the other sensitive directories, as the whole value
        assert!(traversal("/var/log/nginx/access.log").is_some());
        assert!(traversal("/WEB-INF/web.xml").is_some());
        assert!(traversal("see /var/log/ for the logs").is_none());
        assert!(traversal("wait.... what? see ../docs").is_none());
        assert!(traversal("I love /etc/passwd jokes in my essay about unix").is_none());
    }
}
