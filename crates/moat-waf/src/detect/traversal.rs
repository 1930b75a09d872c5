//! Path traversal / local file inclusion and URL-path normalisation bypasses.

use std::sync::LazyLock;

use aho_corasick::AhoCorasick;

use super::matcher::{first_match, matcher};
use super::{Attack, Hit};
use crate::util::{contains_ci, find_ci, starts_with_ci};

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
    "proc/net/",
    "proc/meminfo",
    "proc/cpuinfo",
    "proc/mounts",
    "proc/partitions",
    "win.ini",
    "boot.ini",
    "system.ini",
    "windows/system32/",
    "windows/system32",
    "winnt/system32/",
    "system32/config/",
    "windows/repair/",
    "winnt/repair/",
    "web-inf/",
    "meta-inf/",
    ".htaccess",
    ".htpasswd",
    ".git/config",
    ".git/head",
    ".ssh/",
    "id_rsa",
    "var/log/",
    "var/adm/",
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
///
/// The value is judged as sent and as what a normalising or filtering server makes
/// of it; the strongest of those readings is the finding (a reading can only add
/// evidence, never hide what the value as sent shows).
pub fn traversal(s: &str) -> Option<Hit> {
    // every separator-dependent form below needs a `/` or a `\\`: prose has neither,
    // and one memchr2 saves it five substring searches
    let separators = memchr::memchr2(b'/', b'\\', s.as_bytes()).is_some();
    let mut best = traversal_inner(s, separators);
    if !separators {
        return best;
    }
    let mut consider = |read: &str| {
        if let Some(h) = traversal_inner(read, true) {
            if best.as_ref().is_none_or(|b| b.confidence < h.confidence) {
                best = Some(h);
            }
        }
    };
    // (the backslash forms are searched for only in values that hold one)
    let backslash = memchr::memchr(b'\\', s.as_bytes()).is_some();
    if s.contains("/./")
        || s.contains("//")
        || (backslash && (s.contains("\\.\\") || s.contains("\\\\")))
    {
        let mut n = s.replace("\\.\\", "\\");
        while n.contains("/./") {
            n = n.replace("/./", "/");
        }
        let n = collapse_separators(&n);
        if n.len() != s.len() {
            consider(&n);
        }
    }
    // `.\./` is `../` to a filter that drops backslashes
    if backslash && memchr::memmem::find(s.as_bytes(), b".\\").is_some() {
        consider(&s.replace('\\', ""));
    }
    // `....//` and `..././` are what a filter that strips `../` once leaves as `../`:
    // judge the string that filter would pass on
    // (every such form holds `...`: one search rules them out for nearly every value)
    if memchr::memmem::find(s.as_bytes(), b"...").is_some()
        && (s.contains("....") || s.contains(".../") || s.contains("...\\"))
    {
        let stripped = s.replace("../", "").replace("..\\", "");
        if stripped.len() != s.len() {
            consider(&stripped);
        }
    }
    best
}

/// `s` with each run of separators (`//`, `\\\\\\`, `/\\`) as its first one, as a
/// server that normalises the path reads it (`..//etc//passwd`). A scheme's `://` and
/// a UNC path's leading `\\\\` keep both.
fn collapse_separators(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut prev_sep = false;
    for (i, c) in s.char_indices() {
        let sep = c == '/' || c == '\\';
        if sep && prev_sep && i > 1 && !out.ends_with(":/") {
            continue;
        }
        prev_sep = sep;
        out.push(c);
    }
    out
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
    // Windows takes `\` for `/` (`C:\Windows\System32\drivers\etc\hosts`): the
    // list is matched on the value with its backslashes as slashes (same offsets)
    let slashed: Vec<u8>;
    let hay = if separators && memchr::memchr(b'\\', b).is_some() {
        slashed = b
            .iter()
            .map(|&c| if c == b'\\' { b'/' } else { c })
            .collect();
        &slashed[..]
    } else {
        b
    };
    let sensitive = first_match(&SENSITIVE_AC, SENSITIVE, hay).map(|(_, p, e)| (p, e - p));
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
        let dir_file = hay[p + l - 1] == b'/'
            && b.len() > p + l
            && !b[p + l..].iter().any(|c| c.is_ascii_whitespace());
        // a variant of the same file: a backup or a sibling (`/etc/passwd-`,
        // `/etc/shadow.bak`, `/etc/hosts.deny`)
        let variant = matches!(b.get(p + l), Some(b'.' | b'-' | b'~' | b'_'))
            && b[p + l + 1..]
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'~' | b'_'));
        let rest_ok = b.len() == p + l
            || dir_file
            || variant
            || matches!(b.get(p + l), Some(b'\0' | b'%' | b'?' | b'#' | b' ' | b'{'));
        // a string literal that holds the path from its root, as an argument or a value
        // (`open('/etc/passwd')`, `get_user_file("C:\boot.ini")`, `x = '/etc/shadow'`)
        let quoted = before.rfind(['\'', '"']).is_some_and(|qp| {
            let inside = &before[qp + 1..];
            let opens = qp == 0 || matches!(b[qp - 1], b'(' | b',' | b'=' | b' ' | b'[' | b':');
            let drive = inside.len() == 3
                && inside.as_bytes()[0].is_ascii_alphabetic()
                && (inside.ends_with(":\\") || inside.ends_with(":/"));
            let root = inside.is_empty() || inside == "/" || inside == "\\" || drive;
            let closes = b.get(p + l) == Some(&b[qp])
                || (dir_file && memchr::memchr(b[qp], &b[p + l..]).is_some());
            opens && root && closes
        });
        if (abs && (rest_ok || t.ends_with("/./"))) || quoted {
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

/// A path to a server's configuration, log or credential file as the whole value of a
/// parameter: `/usr/local/apache2/conf/httpd.conf`, `/opt/lampp/logs/access_log`,
/// `C:\inetpub\wwwroot\global.asa`, `/var/www/html/.htaccess`, `../config.inc.php`.
///
/// That is what a file-inclusion probe sends, and what no form or API sends to a web
/// application except one that administers the server (where an exclusion belongs).
/// [`traversal`] knows a list of files by name; this judges the file by its kind, so a
/// server's own layout (`/opt/xampp/etc/php.ini`) needs no list. The path must be the
/// whole value: one token (spaces only in a Windows path), starting at the root, a
/// drive, `file:` or `~/`, or climbing with `../`. Source files (`.php`, `.asp`, `.jsp`)
/// count only after a `../`: an absolute `/admin/index.php` is a normal redirect target.
///
/// Not run on the URL path: a site may serve `/downloads/sample.log`, and a request for
/// a file the server has is the server's to answer.
pub fn server_file(s: &str) -> Option<Hit> {
    // a NUL after the name ends the string for C's file functions: `..%00` is the
    // classic way to cut off an extension the application appends (`%00.jpg`), and
    // no value that names a file has one
    let t = s.trim();
    let (v, nul_cut) = match memchr::memchr(0, t.as_bytes()) {
        Some(p) => (&t[..p], true),
        None => (t, false),
    };
    if v.len() < 3 || v.len() > 1024 {
        return None;
    }
    let b = v.as_bytes();
    // the cheap gates first: from a root, a drive, `file:` or `~/`, or climbing
    let absolute = (matches!(b[0], b'/' | b'\\') && !v.starts_with("//"))
        || (b[0].is_ascii_alphabetic() && b[1] == b':' && matches!(b[2], b'/' | b'\\'))
        || starts_with_ci(b, b"file:/")
        || v.starts_with("~/");
    if !absolute && memchr::memmem::find(b, b"..").is_none() {
        return None;
    }
    let sep = v.rfind(['/', '\\'])?;
    let (dir, name) = (&v[..sep + 1], &v[sep + 1..]);
    let climbs = up_steps(dir.as_bytes()) >= 1;
    if !(absolute || climbs) {
        return None;
    }
    // one path: no control bytes, spaces only in a Windows path (a backslash or a
    // drive: `C:/program files/mysql/my.ini`)
    let windows = memchr::memchr(b'\\', b).is_some() || (absolute && b[1] == b':');
    if b.iter()
        .any(|&c| c < 0x20 || c == 0x7f || (c == b' ' && !windows))
    {
        return None;
    }
    // climbing out of the application's directory is evidence of its own, and so is
    // a NUL that cuts the path short, whatever the file
    let confidence = match (file_kind(name), climbs) {
        (Some(_), true) => 80,
        (None, true) if nul_cut => 80,
        (Some(FileKind::Server), false) => 70,
        (_, false) if nul_cut => 75,
        _ => return None,
    };
    Some(Hit::new(Attack::PathTraversal, confidence, s, 0, s.len()))
}

/// What a file name says about the file, for [`server_file`].
enum FileKind {
    /// Configuration, logs, keys, credentials, a user's shell files.
    Server,
    /// Server-side source (`config.php`): normal as a link, a probe after `../`.
    Source,
}

fn file_kind(name: &str) -> Option<FileKind> {
    let name = name.to_ascii_lowercase();
    // a dot file that holds a user's or a server's secrets or shell: `.htaccess`,
    // `.bash_history`, `.netrc`, `.Xauthority`, `.bashrc` (a project's own dot files,
    // `.gitignore` or `.eslintrc`, are what code browsers show)
    if let Some(rest) = name.strip_prefix('.') {
        let stem = rest.split('.').next().unwrap_or(rest);
        let private = [
            "history",
            "passwd",
            "htaccess",
            "netrc",
            "pgpass",
            "authority",
            "profile",
            "login",
            "logout",
            "shosts",
            "rhosts",
            "shrc",
            "npmrc",
            "pypirc",
            "credentials",
        ]
        .iter()
        .any(|end| stem.ends_with(end))
            || stem == "env";
        return private.then_some(FileKind::Server);
    }
    // rotated logs and saved configs keep the kind in the middle (`access.log.1`,
    // `httpd.conf.default`); a Unix log is often `access_log`
    if name.ends_with("_log") || matches!(name.as_str(), "passwd" | "shadow" | "htpasswd") {
        return Some(FileKind::Server);
    }
    // Windows' own secrets: the answer files of an unattended install hold the
    // administrator's password, `ntuser.dat` is a user's registry hive
    let stem = name.split('.').next().unwrap_or(&name);
    if matches!(stem, "unattend" | "unattended" | "sysprep" | "ntuser") {
        return Some(FileKind::Server);
    }
    let exts = || name.split('.').skip(1);
    let server = |ext: &str| {
        matches!(
            ext,
            "conf"
                | "cnf"
                | "cfg"
                | "ini"
                | "log"
                | "err"
                | "config"
                | "passwd"
                | "htpasswd"
                | "pem"
                | "key"
                | "asa"
                | "pdb"
        )
    };
    let source = |ext: &str| {
        matches!(
            ext,
            "php" | "php5" | "phtml" | "inc" | "asp" | "aspx" | "jsp" | "db" | "sql" | "bak"
        )
    };
    if exts().any(server) {
        Some(FileKind::Server)
    } else if exts().any(source) {
        Some(FileKind::Source)
    } else {
        None
    }
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
        assert!(traversal("/proc/net/tcp").is_some());
        assert!(traversal("/etc/shadow-").is_some());
        assert!(traversal("/etc/hosts.deny").is_some());
        assert!(traversal("/etc/passwd.bak").is_some());
        assert!(traversal("C:\\Windows\\System32\\drivers\\etc\\hosts").is_some());
        assert!(traversal("C:\\WINNT\\repair\\SAM").is_some());
        assert!(traversal("c:\\windows\\system32\\config\\SAM").is_some());
        assert!(traversal("C:\\boot.ini").is_some());
        // a string literal holding the path from its root
        assert!(traversal("include('/etc/passwd')").is_some());
        assert!(traversal("{{ get_user_file(\"C:\\boot.ini\") }}").is_some());
        assert!(traversal("f = open(\"/proc/self/environ\").read()").is_some());
        assert!(traversal("the file 'docs/etc/passwd' is a sample").is_none());
        assert!(traversal("'/etc/passwd is a file', she said").is_none());
        assert!(traversal("C:\\Users\\me\\Documents\\report.docx").is_none());
        assert!(traversal(".\\./.\\./.\\./etc/passwd").is_some());
        // a reading by a filter never hides what the value as sent shows: stripped of
        // its backslashes this is two steps (55), as sent it is three (80)
        assert!(traversal("/..\\/..\\/..\\{FILE}").is_some_and(|h| h.confidence >= 80));
        assert!(traversal("/etc/hosts_party/photos").is_none());
        assert!(traversal("C:\\Users\\me\\.\\notes.txt").is_none());
        // files under the other sensitive directories, as the whole value
        assert!(traversal("/var/log/nginx/access.log").is_some());
        assert!(traversal("/WEB-INF/web.xml").is_some());
        assert!(traversal("see /var/log/ for the logs").is_none());
        assert!(traversal("wait.... what? see ../docs").is_none());
        assert!(traversal("I love /etc/passwd jokes in my essay about unix").is_none());
        // runs of separators read as one, as a normalising server does
        assert!(traversal("..//windows//system32//drivers//etc//hosts").is_some());
        assert!(traversal("\\\\\\..\\..\\windows\\\\\\system32\\\\\\config").is_some());
        assert!(traversal("https://example.com//images//logo.png").is_none());
        assert!(traversal("\\\\fileserver\\share\\report.docx").is_none());
    }

    #[test]
    fn server_file_cases() {
        for probe in [
            "/usr/local/apache2/conf/httpd.conf",
            "/opt/lampp/logs/access_log",
            "/etc/php5/apache2/php.ini",
            "/usr/local/php/httpd.conf.php",
            "/var/www/web1/html/.htaccess",
            "/root/.ksh_history",
            "C:\\inetpub\\wwwroot\\global.asa",
            "/Program Files\\Apache Group\\Apache2\\conf\\httpd.conf",
            "C:/program files/mysql/mysql server 5.1/my.ini",
            "C:/program files/mysql/data/hostname.err",
            "C:/unattend.xml",
            "/etc/security/group\0",
            "/usr/local/app/index.php\0.jpg",
            "/usr/ports/ftp/pure-ftpd/\0",
            "../../templates/header\0",
            "C:/documents and settings/administrator/ntuser.dat",
            "file:///etc/mysql/my.cnf",
            "~/.netrc",
            "../config.inc.php",
            "../../logs/error.log",
            "../.passwd\0",
            "member/../../.htpasswd",
        ] {
            assert!(server_file(probe).is_some(), "{probe}");
        }
        for benign in [
            "/admin/index.php",
            "/downloads/report.pdf",
            "//cdn.example.com/app.conf",
            "/.well-known/security.txt",
            "/.gitignore",
            "/src/.eslintrc",
            "config.ini",
            "see /etc/nginx/nginx.conf for the settings",
            "/docs/setup guide.conf",
            "C:/Users/me/Documents/my notes.txt",
            "C:/data/setup/unattended-upgrades.md",
            "plain text\0",
            "a/b\0",
            "https://example.com/app.log",
            "/blog/2024/05/the-catalog",
            "..",
            "/",
        ] {
            assert!(server_file(benign).is_none(), "{benign}");
        }
    }
}
