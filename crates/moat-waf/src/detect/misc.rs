//! Structural detectors: path traversal / LFI, SSRF / RFI, XXE, CRLF, code
//! and template injection, JNDI lookups, LDAP, XPath, NoSQL operators,
//! dangerous uploads and scanner User-Agents.

use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

use super::{Attack, Classes, Hit};
use crate::util::{contains_ci, find_ci, starts_with_ci};

/// A case-insensitive multi-pattern matcher built once; `None` only if the
/// automaton could not be built (then callers fall back to per-pattern search).
fn matcher<'a>(pats: impl IntoIterator<Item = &'a str>) -> Option<AhoCorasick> {
    AhoCorasickBuilder::new()
        .ascii_case_insensitive(true)
        .match_kind(MatchKind::LeftmostFirst)
        .build(pats)
        .ok()
}

static SENSITIVE_AC: LazyLock<Option<AhoCorasick>> =
    LazyLock::new(|| matcher(SENSITIVE.iter().copied()));
static CODE_AC: LazyLock<Option<AhoCorasick>> =
    LazyLock::new(|| matcher(CODE_MARKERS.iter().map(|m| m.0)));
static PHP_AC: LazyLock<Option<AhoCorasick>> = LazyLock::new(|| matcher(PHP_FUNCS.iter().copied()));
static SCANNER_AC: LazyLock<Option<AhoCorasick>> =
    LazyLock::new(|| matcher(SCANNERS.iter().copied()));
static XPATH_AC: LazyLock<Option<AhoCorasick>> =
    LazyLock::new(|| matcher(XPATH_MARKERS.iter().copied()));

/// First match of any pattern: (pattern index, start, end).
fn first_match(ac: &Option<AhoCorasick>, pats: &[&str], b: &[u8]) -> Option<(usize, usize, usize)> {
    match ac {
        Some(ac) => ac
            .find(b)
            .map(|m| (m.pattern().as_usize(), m.start(), m.end())),
        None => pats
            .iter()
            .enumerate()
            .find_map(|(i, t)| find_ci(b, t.as_bytes()).map(|p| (i, p, p + t.len()))),
    }
}

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
    if s.contains("/./") || s.contains("\\.\\") || s.contains("//") {
        let mut n = s.replace("\\.\\", "\\");
        while n.contains("/./") {
            n = n.replace("/./", "/");
        }
        let n = n.replace("///", "/");
        if n.len() != s.len() {
            if let Some(h) = traversal_inner(&n) {
                return Some(h);
            }
        }
    }
    traversal_inner(s)
}

fn traversal_inner(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    // UNC path to an administrative share: \\host\c$\...
    if let Some(p) = memchr::memmem::find(b, b"\\\\") {
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
    let wrappers: &[&[u8]] = if memchr::memmem::find(b, b"://").is_some() {
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
        let rest_ok = b.len() == p + l
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

fn host_of(url_rest: &str) -> &str {
    let end = url_rest
        .find(['/', '?', '#', '\\'])
        .unwrap_or(url_rest.len());
    let auth = &url_rest[..end];
    let host = auth.rsplit('@').next().unwrap_or(auth);
    if let Some(h) = host.strip_prefix('[') {
        return h.split(']').next().unwrap_or(h);
    }
    host.split(':').next().unwrap_or(host)
}

fn internal_host(h: &str) -> Option<u8> {
    let l = h.to_ascii_lowercase();
    let l = l.trim_end_matches('.');
    if matches!(
        l,
        "169.254.169.254"
            | "metadata.google.internal"
            | "metadata"
            | "100.100.100.200"
            | "fd00:ec2::254"
            | "169.254.170.2"
            | "instance-data"
    ) {
        return Some(90);
    }
    if l == "localhost" || l.ends_with(".localhost") || l == "::1" || l == "::" || l == "0.0.0.0" {
        return Some(55);
    }
    if l == "0" {
        return Some(80);
    }
    if l.starts_with("0x") || (l.len() >= 8 && l.bytes().all(|c| c.is_ascii_digit())) {
        // hex / decimal encodings of an address
        return Some(80);
    }
    if let Ok(ip) = l.parse::<std::net::Ipv4Addr>() {
        let o = ip.octets();
        if o[0] == 127 {
            return Some(if o == [127, 0, 0, 1] { 55 } else { 75 });
        }
        if o[0] == 169 && o[1] == 254 {
            return Some(85);
        }
        if ip.is_private() {
            return Some(40);
        }
    }
    if l.starts_with("0177.") || l.starts_with("017700") {
        return Some(80);
    }
    None
}

/// SSRF / RFI: dangerous schemes and URLs to internal or metadata hosts.
pub fn ssrf(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    let p = memchr::memmem::find(b, b"://")?;
    let scheme_start = b[..p]
        .iter()
        .rposition(|c| !(c.is_ascii_alphanumeric() || *c == b'+' || *c == b'.' || *c == b'-'))
        .map(|x| x + 1)
        .unwrap_or(0);
    let scheme = s[scheme_start..p].to_ascii_lowercase();
    match scheme.as_str() {
        "gopher" | "dict" | "tftp" | "jar" | "netdoc" | "ldap" | "ldaps" | "rmi" | "sftp" => {
            return Some(Hit::new(Attack::Ssrf, 85, s, scheme_start, p + 30));
        }
        "http" | "https" | "ftp" | "ws" | "wss" => {}
        _ => return None,
    }
    let host = host_of(&s[p + 3..]);
    let conf = internal_host(host)?;
    Some(Hit::new(
        Attack::Ssrf,
        conf,
        s,
        scheme_start,
        p + 3 + host.len(),
    ))
}

/// XML external entities and XInclude.
pub fn xxe(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    if let Some(p) = find_ci(b, b"<!entity") {
        let tail = &b[p..b.len().min(p + 400)];
        let conf = if contains_ci(tail, b"system") || contains_ci(tail, b"public") {
            95
        } else {
            80
        };
        return Some(Hit::new(Attack::Xxe, conf, s, p, p + 80));
    }
    if let Some(p) = find_ci(b, b"<!doctype") {
        let tail = &b[p..b.len().min(p + 400)];
        if contains_ci(tail, b" system ")
            || contains_ci(tail, b" system\"")
            || contains_ci(tail, b" public ")
        {
            return Some(Hit::new(Attack::Xxe, 85, s, p, p + 80));
        }
    }
    if let Some(p) = find_ci(b, b"xi:include") {
        if contains_ci(b, b"href") {
            return Some(Hit::new(Attack::Xxe, 85, s, p, p + 60));
        }
    }
    None
}

const INJECTED_HEADERS: &[&str] = &[
    "set-cookie",
    "location",
    "content-type",
    "content-length",
    "content-disposition",
    "refresh",
    "access-control-allow-origin",
    "x-xss-protection",
    "host",
    "bcc",
    "cc",
    "http/1.",
    "<script",
    "<html",
];

const SMTP_IMAP: &[&str] = &[
    "RCPT TO:",
    "MAIL FROM:",
    "HELO ",
    "EHLO ",
    "DATA",
    "QUIT",
    "RSET",
    "VRFY ",
    "EXPN ",
];
const IMAP_CMDS: &[&str] = &[
    "CAPABILITY",
    "FETCH",
    "LOGIN",
    "LOGOUT",
    "SELECT",
    "EXAMINE",
    "LIST",
    "STORE",
    "APPEND",
    "AUTHENTICATE",
    "DELETE",
    "RENAME",
    "COPY",
    "UID",
];

/// SMTP / IMAP command injection: a line break followed by a protocol command line.
pub fn mail(s: &str) -> Option<Hit> {
    let mut lines = s.split(['\r', '\n']);
    lines.next()?;
    for (n, line) in lines.enumerate() {
        if n > 64 {
            break;
        }
        let l = line.trim_end();
        if l.is_empty() {
            continue;
        }
        let smtp = SMTP_IMAP.iter().any(|c| {
            if c.ends_with(' ') || c.ends_with(':') {
                l.starts_with(c)
            } else {
                l == *c
            }
        });
        let imap = {
            let mut it = l.splitn(3, ' ');
            let tag = it.next().unwrap_or("");
            let cmd = it.next().unwrap_or("");
            !tag.is_empty()
                && tag.len() <= 8
                && tag.bytes().all(|c| c.is_ascii_alphanumeric())
                && IMAP_CMDS.contains(&cmd)
        };
        if smtp || imap {
            let p = s.find(l).unwrap_or(0);
            return Some(Hit::new(Attack::Crlf, 80, s, p, p + l.len()));
        }
    }
    None
}

/// CRLF / header injection: a line break (or a Unicode character whose low
/// byte is CR/LF) followed by a header line.
pub fn crlf(s: &str) -> Option<Hit> {
    for (i, ch) in s.char_indices() {
        let brk =
            matches!(ch, '\r' | '\n') || matches!(ch as u32, 0x560A | 0x560D | 0x010A | 0x010D);
        if !brk {
            continue;
        }
        let rest = s[i + ch.len_utf8()..]
            .trim_start_matches(['\r', '\n', ' ', '\t', '\u{560A}', '\u{560D}']);
        for h in INJECTED_HEADERS {
            if starts_with_ci(rest.as_bytes(), h.as_bytes()) {
                let after = rest.as_bytes().get(h.len()).copied();
                if h.starts_with('<')
                    || h.starts_with("http/")
                    || matches!(after, Some(b':') | Some(b' '))
                {
                    // cross-check the ':' within a short distance for header names
                    if h.starts_with('<')
                        || h.starts_with("http/")
                        || rest[h.len()..].trim_start().starts_with(':')
                    {
                        return Some(Hit::new(Attack::Crlf, 85, s, i, i + 40));
                    }
                }
            }
        }
    }
    None
}

const PHP_FUNCS: &[&str] = &[
    "system",
    "passthru",
    "shell_exec",
    "popen",
    "proc_open",
    "phpinfo",
    "base64_decode",
    "eval",
    "assert",
    "file_get_contents",
    "file_put_contents",
    "fopen",
    "fwrite",
    "include",
    "require",
    "include_once",
    "require_once",
    "call_user_func",
    "create_function",
    "str_rot13",
    "gzinflate",
    "pcntl_exec",
    "highlight_file",
    "show_source",
    "unserialize",
    "preg_replace",
    "array_map",
    "readfile",
    "exec",
];

const CODE_MARKERS: &[(&str, u8, Attack)] = &[
    ("java.lang.runtime", 90, Attack::CodeInjection),
    ("getruntime()", 90, Attack::CodeInjection),
    (".getruntime(", 90, Attack::CodeInjection),
    ("processbuilder", 80, Attack::CodeInjection),
    ("_memberaccess", 90, Attack::CodeInjection),
    ("@java.lang", 85, Attack::CodeInjection),
    ("getclass().forname", 90, Attack::CodeInjection),
    ("class.forname(", 85, Attack::CodeInjection),
    ("getdeclaredmethods", 85, Attack::CodeInjection),
    ("class.module.classloader", 90, Attack::CodeInjection),
    (
        "javax.script.scriptenginemanager",
        90,
        Attack::CodeInjection,
    ),
    ("ognlcontext", 90, Attack::CodeInjection),
    ("#context[", 80, Attack::CodeInjection),
    ("t(java.lang", 90, Attack::Ssti),
    ("freemarker.template.utility", 90, Attack::Ssti),
    ("?new()", 85, Attack::Ssti),
    ("__import__(", 90, Attack::CodeInjection),
    ("os.system(", 90, Attack::CodeInjection),
    ("os.popen(", 90, Attack::CodeInjection),
    ("subprocess.", 75, Attack::CodeInjection),
    ("__class__", 80, Attack::Ssti),
    ("__mro__", 85, Attack::Ssti),
    ("__subclasses__", 90, Attack::Ssti),
    ("__globals__", 90, Attack::Ssti),
    ("__builtins__", 90, Attack::Ssti),
    ("child_process", 90, Attack::CodeInjection),
    ("process.mainmodule", 90, Attack::CodeInjection),
    ("execsync(", 80, Attack::CodeInjection),
    ("process.binding(", 85, Attack::CodeInjection),
    ("constructor.constructor(", 85, Attack::CodeInjection),
    ("<!--#exec", 90, Attack::CodeInjection),
    ("<!--#include", 85, Attack::CodeInjection),
    ("<!--#echo", 80, Attack::CodeInjection),
    ("<!--#config", 80, Attack::CodeInjection),
    ("<!--#printenv", 80, Attack::CodeInjection),
    ("<?php", 90, Attack::CodeInjection),
    ("!!python/", 90, Attack::CodeInjection),
    ("call_user_func_array", 85, Attack::CodeInjection),
    ("invokefunction", 80, Attack::CodeInjection),
    ("jdbcrowsetimpl", 90, Attack::CodeInjection),
    ("templatesimpl", 90, Attack::CodeInjection),
    ("javax.naming.initialcontext", 90, Attack::CodeInjection),
    ("commons.collections.functors", 90, Attack::CodeInjection),
    ("com.sun.org.apache.xalan", 90, Attack::CodeInjection),
    ("bsh.interpreter", 85, Attack::CodeInjection),
    ("!!javax.", 90, Attack::CodeInjection),
    ("!!java.", 85, Attack::CodeInjection),
    ("!ruby/object", 90, Attack::CodeInjection),
    ("${@", 85, Attack::CodeInjection),
    ("$_get[", 80, Attack::CodeInjection),
    ("$_post[", 80, Attack::CodeInjection),
    ("$_request[", 80, Attack::CodeInjection),
    ("$_server[", 75, Attack::CodeInjection),
    ("$_cookie[", 75, Attack::CodeInjection),
    ("<#assign", 85, Attack::Ssti),
    ("$class.inspect", 85, Attack::Ssti),
    ("_self.env", 85, Attack::Ssti),
    ("registerundefinedfiltercallback", 90, Attack::Ssti),
    ("lipsum.__", 90, Attack::Ssti),
    ("cycler.__", 90, Attack::Ssti),
    ("request.application.", 80, Attack::Ssti),
    // Lua (Redis EVAL, OpenResty, game-server admin consoles)
    ("os.execute(", 90, Attack::CodeInjection),
    ("io.popen(", 90, Attack::CodeInjection),
    ("package.loadlib(", 90, Attack::CodeInjection),
    // Groovy / JVM scripting consoles (Jenkins script console, Elasticsearch scripts)
    (".execute().text", 90, Attack::CodeInjection),
    ("groovy.lang.groovyshell", 90, Attack::CodeInjection),
    ("@asttest(", 90, Attack::CodeInjection),
    ("scriptenginemanager", 90, Attack::CodeInjection),
    (".class.forname(", 85, Attack::CodeInjection),
    ("jdk.nashorn", 85, Attack::CodeInjection),
    ("defineclass(", 80, Attack::CodeInjection),
];

/// True when `inner` (a template expression) is arithmetic or object access
/// that only a probe or exploit would send.
fn template_expr(inner: &str) -> bool {
    let t = inner.trim();
    if t.is_empty() || t.len() > 400 {
        return false;
    }
    let b = t.as_bytes();
    // 7*7, 7*'7', 1337+1
    let mut i = 0;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    if i > 0 {
        let rest = t[i..].trim_start();
        if let Some(op) = rest.chars().next() {
            if matches!(op, '*' | '+' | '-' | '/' | '%') {
                let r = rest[1..].trim_start().trim_start_matches(['\'', '"']);
                if r.starts_with(|c: char| c.is_ascii_digit()) {
                    return true;
                }
            }
        }
    }
    let l = t.to_ascii_lowercase();
    l.contains("__")
        || l.starts_with("config")
        || l.starts_with("self")
        || l.contains(".getclass(")
        || l.contains("constructor")
        || l.contains("t(java")
        || l.contains("new java")
        || l.contains("runtime")
        || l.contains(".exec(")
        || l.contains("popen")
        || l.contains("import ")
        || l.contains("\"\".class")
        || l.contains("''.class")
        || l.contains("request.")
        || l.contains("#this")
        || l.starts_with("#")
        || l.contains("system(")
        || l.contains("include(")
        || l.contains("dump(")
        || l.contains("range.constructor")
}

fn ssti(s: &str, c: Classes) -> Option<Hit> {
    let b = s.as_bytes();
    // each opener with the byte class it needs: openers whose bytes are absent
    // are skipped without a search
    for (open, close, needs) in [
        ("{{", "}}", Classes::BRACE),
        ("${", "}", Classes::BRACE),
        ("#{", "}", Classes::BRACE),
        ("*{", "}", Classes::BRACE),
        ("<%=", "%>", Classes::ANGLE),
        ("{%", "%}", Classes::BRACE),
        ("@(", ")", Classes::PAREN),
        ("[[", "]]", Classes::BRACKET),
        ("{", "}", Classes::BRACE),
    ] {
        if !c.any(needs) {
            continue;
        }
        let mut from = 0;
        let mut n = 0;
        while let Some(p) = memchr::memmem::find(&b[from..], open.as_bytes()) {
            n += 1;
            if n > 32 {
                break;
            }
            let a = from + p + open.len();
            let Some(q) = memchr::memmem::find(&b[a..], close.as_bytes()) else {
                break;
            };
            let inner = &s[a..a + q];
            let ok = if open == "{" || open == "@(" || open == "[[" {
                // bare braces only with arithmetic probes or dunder access (Smarty, Razor)
                template_expr(inner)
                    && (inner.contains("__")
                        || inner.trim().starts_with(|c: char| c.is_ascii_digit()))
                    && inner.len() < 40
            } else if open == "{%" {
                let l = inner.to_ascii_lowercase();
                l.contains("import")
                    || l.contains("__")
                    || l.contains("system")
                    || l.contains("popen")
                    || l.contains("include")
                    || template_expr(inner)
            } else {
                template_expr(inner)
            };
            if ok {
                let st = from + p;
                return Some(Hit::new(Attack::Ssti, 85, s, st, a + q + close.len()));
            }
            from = a;
        }
    }
    None
}

/// A class name sent as a polymorphic type tag (`"@type"`, `"$type"`, `"class"`):
/// gadget-prone packages block, other dotted class names are monitored.
pub fn type_tag(v: &str) -> Option<Hit> {
    let t = v.trim();
    if !t.contains('.') || t.contains(['/', ' ']) && !t.contains(", ") || t.contains("://") {
        return None;
    }
    let l = t.to_ascii_lowercase();
    let dangerous = [
        "java.",
        "javax.",
        "com.sun.",
        "sun.",
        "org.apache.",
        "org.springframework.",
        "com.mchange.",
        "org.hibernate.",
        "ch.qos.logback",
        "system.windows.",
        "system.diagnostics.",
        "system.configuration.",
        "system.data.",
        "microsoft.",
        "bsh.",
    ]
    .iter()
    .any(|p| l.starts_with(p));
    Some(Hit::new(
        Attack::CodeInjection,
        if dangerous { 85 } else { 50 },
        v,
        0,
        v.len(),
    ))
}

/// Code injection (PHP, Java/EL/OGNL, Python, Node.js, SSI) and template injection.
pub fn code(s: &str, c: Classes) -> Option<Hit> {
    let b = s.as_bytes();
    let mut best: Option<Hit> = None;
    match &*CODE_AC {
        Some(ac) => {
            for m in ac.find_iter(b) {
                let (_, conf, kind) = CODE_MARKERS[m.pattern().as_usize()];
                if best.as_ref().is_none_or(|h| h.confidence < conf) {
                    best = Some(Hit::new(kind, conf, s, m.start(), m.end() + 20));
                }
            }
        }
        None => {
            for (m, conf, kind) in CODE_MARKERS {
                if let Some(p) = find_ci(b, m.as_bytes()) {
                    if best.as_ref().is_none_or(|h| h.confidence < *conf) {
                        best = Some(Hit::new(*kind, *conf, s, p, p + m.len() + 20));
                    }
                }
            }
        }
    }
    if best.as_ref().is_some_and(|h| h.confidence >= 85) {
        return best;
    }
    if c.any(Classes::PAREN) {
        // PHP function call with a code-shaped argument: system('id'), eval($_POST[x]), phpinfo()
        // candidates are checked as the automaton finds them: no per-value vector
        let mut check = |fi: usize, at: usize| {
            let f = &PHP_FUNCS[fi];
            {
                let before_ok = at == 0
                    || !(b[at - 1].is_ascii_alphanumeric()
                        || b[at - 1] == b'_'
                        || b[at - 1] == b'.');
                let mut k = at + f.len();
                while k < b.len() && b[k] == b' ' {
                    k += 1;
                }
                if !before_ok || b.get(k) != Some(&b'(') {
                    return;
                }
                let arg = &s[k + 1..];
                let arg_t = arg.trim_start();
                let strong_arg = arg_t.starts_with('$')
                    || arg_t.starts_with(")") && (*f == "phpinfo")
                    || ((arg_t.starts_with('\'')
                        || arg_t.starts_with('"')
                        || arg_t.starts_with('`'))
                        && !matches!(
                            *f,
                            "include"
                                | "require"
                                | "exec"
                                | "eval"
                                | "assert"
                                | "fopen"
                                | "preg_replace"
                                | "array_map"
                                | "unserialize"
                                | "readfile"
                        ))
                    || arg_t.starts_with("base64_decode")
                    || arg_t.starts_with("str_rot13")
                    || arg_t.starts_with("gzinflate")
                    || arg_t.starts_with("$_");
                if strong_arg {
                    let conf = if *f == "phpinfo"
                        || arg_t.starts_with('$')
                        || arg_t.starts_with("base64_decode")
                    {
                        85
                    } else {
                        75
                    };
                    if best.as_ref().is_none_or(|h| h.confidence < conf) {
                        best = Some(Hit::new(Attack::CodeInjection, conf, s, at, k + 20));
                    }
                }
            }
        };
        match &*PHP_AC {
            Some(ac) => {
                for m in ac.find_iter(b).take(16) {
                    check(m.pattern().as_usize(), m.start());
                }
            }
            None => {
                for (i, f) in PHP_FUNCS.iter().enumerate() {
                    if let Some(p) = find_ci(b, f.as_bytes()) {
                        check(i, p);
                    }
                }
            }
        }
    }
    if c.any(Classes::BRACE | Classes::ANGLE | Classes::PAREN) {
        if let Some(h) = ssti(s, c) {
            if best.as_ref().is_none_or(|x| x.confidence < h.confidence) {
                best = Some(h);
            }
        }
    }
    // OGNL / EL expression blocks: %{...} ${...} with method calls
    if let Some(p) = memchr::memmem::find(b, b"%{") {
        let inner = &b[p + 2..];
        let end = memchr::memchr(b'}', inner).unwrap_or(inner.len()).min(400);
        let inner = &inner[..end];
        let starts = inner
            .first()
            .is_some_and(|c| matches!(c, b'(' | b'#' | b'@') || c.is_ascii_alphabetic());
        let hash_ident = inner
            .windows(2)
            .any(|w| (w[0] == b'#' || w[0] == b'@') && w[1].is_ascii_alphabetic() || w[0] == b'_');
        if starts && inner.contains(&b'(') && hash_ident && inner.is_ascii() {
            let h = Hit::new(Attack::CodeInjection, 85, s, p, p + 60);
            if best.as_ref().is_none_or(|x| x.confidence < 85) {
                best = Some(h);
            }
        }
    }
    // Groovy: a string or list literal executed as a command: "id".execute(), ['sh','-c',x].execute()
    if c.any(Classes::QUOTE | Classes::BRACKET) {
        let mut from = 0;
        while let Some(p) = find_ci(&b[from..], b".execute(") {
            let at = from + p;
            from = at + 9;
            if at > 0 && matches!(b[at - 1], b'\'' | b'"' | b']') {
                let h = Hit::new(Attack::CodeInjection, 90, s, at.saturating_sub(30), at + 20);
                if best.as_ref().is_none_or(|x| x.confidence < 90) {
                    best = Some(h);
                }
                break;
            }
        }
    }
    // SpEL type references to JVM classes: T(java.lang.Runtime), T (java.lang.Runtime);
    // found from each `(` (rarer than the letter t) looking back
    if c.any(Classes::PAREN) {
        let mut n = 0;
        for k in memchr::memchr_iter(b'(', b) {
            n += 1;
            if n > 256 {
                break;
            }
            let mut t = k;
            while t > 0 && b[t - 1] == b' ' {
                t -= 1;
            }
            if t == 0 || !matches!(b[t - 1], b'T' | b't') {
                continue;
            }
            let at = t - 1;
            if at > 0
                && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_' || b[at - 1] == b'.')
            {
                continue;
            }
            let mut a = k + 1;
            while a < b.len() && b[a] == b' ' {
                a += 1;
            }
            let arg = &b[a..];
            if ["java.", "javax.", "org.springframework.", "jdk."]
                .iter()
                .any(|p| starts_with_ci(arg, p.as_bytes()))
            {
                let h = Hit::new(Attack::CodeInjection, 90, s, at, a + 24);
                if best.as_ref().is_none_or(|x| x.confidence < 90) {
                    best = Some(h);
                }
                break;
            }
        }
    }
    // OGNL chains: (#a=...).(#b=...)
    if memchr::memmem::find(b, b"(#").is_some() && memchr::memmem::find(b, b").(#").is_some() {
        let h = Hit::new(Attack::CodeInjection, 85, s, 0, 60);
        if best.as_ref().is_none_or(|x| x.confidence < 85) {
            best = Some(h);
        }
    }
    best
}

/// JNDI lookups, including nested-lookup obfuscation (`${${lower:j}ndi:...}`).
pub fn jndi(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    let first = memchr::memmem::find(b, b"${")?;
    if s.len() > 16 << 10 {
        return find_ci(b, b"${jndi:").map(|p| Hit::new(Attack::Jndi, 95, s, p, p + 40));
    }
    let mut cur: String = s[first..].to_string();
    for _ in 0..64 {
        // innermost ${...}
        let cb = cur.as_bytes();
        let Some(close) = cb.iter().position(|&c| c == b'}') else {
            break;
        };
        let Some(open) = cb[..close].windows(2).rposition(|w| w == b"${") else {
            // a '}' without an opener before it: drop it
            cur.replace_range(close..close + 1, "");
            continue;
        };
        let inner = &cur[open + 2..close];
        let li = inner.to_ascii_lowercase();
        if li.starts_with("jndi:") || li.starts_with("jndi :") {
            return Some(Hit::new(Attack::Jndi, 95, s, first, first + 60));
        }
        let repl: String = if let Some(p) = inner.rfind(":-") {
            inner[p + 2..].to_string()
        } else if let Some(rest) = li
            .strip_prefix("lower:")
            .or_else(|| li.strip_prefix("upper:"))
        {
            rest.to_string()
        } else {
            // unresolvable lookup (${env:X}, ${sys:y}): an opaque token
            "x".to_string()
        };
        cur.replace_range(open..close + 1, &repl);
    }
    None
}

/// LDAP filter injection.
pub fn ldap(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(p) = memchr::memmem::find(&b[from..], b")(") {
        let at = from + p;
        let rest = &b[at + 2..];
        let op = matches!(rest.first(), Some(b'|' | b'&' | b'!'));
        let mut k = 0;
        while k < rest.len()
            && (rest[k].is_ascii_alphanumeric() || rest[k] == b'-' || rest[k] == b'_')
        {
            k += 1;
        }
        let attr = k > 0
            && (rest.get(k) == Some(&b'=')
                || (matches!(rest.get(k), Some(b'~' | b'<' | b'>'))
                    && rest.get(k + 1) == Some(&b'=')));
        if op || attr {
            return Some(Hit::new(Attack::Ldap, 80, s, at.saturating_sub(8), at + 16));
        }
        from = at + 2;
    }
    // extensible match: attr:1.2.3.4:=value / attr:dn:1.2.3:=value
    if let Some(p) = memchr::memmem::find(b, b":=") {
        let before = &s[..p];
        if let Some(c) = before.rfind(':') {
            let oid = &before[c + 1..];
            let attr = &before[..c];
            let attr_ok = !attr.is_empty()
                && attr.rsplit(['(', ' ']).next().is_some_and(|a| {
                    !a.is_empty()
                        && a.bytes()
                            .all(|x| x.is_ascii_alphanumeric() || x == b':' || x == b'-')
                });
            if attr_ok && oid.contains('.') && oid.bytes().all(|x| x.is_ascii_digit() || x == b'.')
            {
                return Some(Hit::new(Attack::Ldap, 80, s, 0, p + 2));
            }
        }
    }
    let t = s.trim_start();
    if (t.starts_with("*)") || t.starts_with("(|(") || t.starts_with("(&(") || t.starts_with("*(|"))
        && t.contains('=')
    {
        return Some(Hit::new(Attack::Ldap, 80, s, 0, 24));
    }
    None
}

/// XPath injection.
pub fn xpath(s: &str) -> Option<Hit> {
    first_match(&XPATH_AC, XPATH_MARKERS, s.as_bytes())
        .map(|(_, p, _)| Hit::new(Attack::Xpath, 80, s, p, p + 30))
}

const XPATH_MARKERS: &[&str] = &[
    "::node()",
    "child::",
    "descendant::",
    "ancestor::",
    "following-sibling::",
    "name(/",
    "count(/",
    "string-length(name(",
    "substring(name(",
    "]|//",
    "] | //",
    "or name()=",
    "position()=",
];

const NOSQL_OPS: &[&str] = &[
    "ne",
    "gt",
    "gte",
    "lt",
    "lte",
    "in",
    "nin",
    "regex",
    "where",
    "exists",
    "expr",
    "function",
    "accumulator",
    "elemmatch",
    "eq",
    "not",
    "nor",
    "or",
    "and",
    "type",
    "size",
    "mod",
    "all",
    "text",
    "jsonschema",
    "lookup",
];

/// A parameter or JSON key naming a MongoDB query operator (`$ne`, `user[$regex]`).
pub fn nosql_name(name: &str) -> Option<Hit> {
    let p = memchr::memchr(b'$', name.as_bytes())?;
    let rest = &name[p + 1..];
    let op: String = rest
        .bytes()
        .take_while(|c| c.is_ascii_alphabetic())
        .map(|c| c.to_ascii_lowercase() as char)
        .collect();
    let before_ok = p == 0 || name.as_bytes()[p - 1] == b'[';
    if before_ok && NOSQL_OPS.contains(&op.as_str()) {
        let conf = if matches!(
            op.as_str(),
            "or" | "and" | "not" | "eq" | "in" | "type" | "size" | "text" | "all"
        ) {
            50
        } else {
            85
        };
        return Some(Hit::new(Attack::Nosql, conf, name, p, p + 1 + op.len()));
    }
    None
}

/// MongoDB shell calls (`db.users.find(`) and server-side JS sleep loops.
pub fn nosql_js(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(p) = memchr::memmem::find(&b[from..], b"db.") {
        let at = from + p;
        from = at + 3;
        if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'.') {
            continue;
        }
        let rest = &s[at + 3..];
        let coll_end = rest.find('.').unwrap_or(0);
        if coll_end == 0
            || !rest[..coll_end]
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'_')
        {
            continue;
        }
        let m = &rest[coll_end + 1..];
        for op in [
            "insert",
            "find",
            "drop",
            "remove",
            "update",
            "delete",
            "aggregate",
            "mapreduce",
            "getcollection",
            "dropdatabase",
            "save",
            "replace",
        ] {
            if starts_with_ci(m.as_bytes(), op.as_bytes())
                && m[op.len()..]
                    .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                    .starts_with('(')
            {
                return Some(Hit::new(
                    Attack::Nosql,
                    85,
                    s,
                    at,
                    at + 3 + coll_end + 1 + op.len() + 1,
                ));
            }
        }
    }
    if contains_ci(b, b"new date") && (contains_ci(b, b"while(") || contains_ci(b, b"while (")) {
        return Some(Hit::new(Attack::Nosql, 80, s, 0, 60));
    }
    None
}

/// NoSQL operators or `$where` JavaScript inside a value.
pub fn nosql_value(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    if let Some(p) = find_ci(b, b"$where") {
        return Some(Hit::new(Attack::Nosql, 85, s, p, p + 40));
    }
    let mut from = 0;
    while let Some(p) = memchr::memchr(b'$', &b[from..]) {
        let at = from + p;
        from = at + 1;
        let before = if at == 0 { b' ' } else { b[at - 1] };
        if !matches!(before, b'{' | b'"' | b'\'' | b'[' | b' ' | b',') {
            continue;
        }
        if let Some(h) = nosql_name(&s[at..]) {
            let after_name = &s[at + 1..];
            let shaped = after_name
                .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .trim_start_matches(['"', '\'', ']'])
                .trim_start()
                .starts_with(':')
                || before == b'[';
            let logic_array = after_name
                .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .trim_start_matches(['"', '\''])
                .trim_start()
                .strip_prefix(':')
                .is_some_and(|r| r.trim_start().starts_with('['));
            if shaped && (h.confidence >= 85 || logic_array) {
                return Some(Hit::new(Attack::Nosql, 80, s, at, at + 20));
            }
        }
    }
    None
}

const SCANNERS: &[&str] = &[
    "sqlmap",
    "nikto",
    "nmap",
    "masscan",
    "nuclei",
    "acunetix",
    "wpscan",
    "dirbuster",
    "gobuster",
    "ffuf",
    "zgrab",
    "w3af",
    "netsparker",
    "appscan",
    "openvas",
    "havij",
    "hydra",
    "jorgee",
    "fimap",
    "zmeu",
    "nessus",
    "arachni",
    "whatweb",
    "feroxbuster",
    "commix",
    "xsstrike",
    "dirsearch",
    "wfuzz",
    "burpcollaborator",
    "skipfish",
    "vega/",
    "paros",
    "webinspect",
    "qualys",
    "struts-pwn",
    "log4j-scan",
    "interactsh",
    "morfeus",
    "fuzz faster",
    "go-http-client/1.1 nuclei",
];

/// Scanner and exploit-tool User-Agents (monitor-level confidence).
pub fn scanner(ua: &str) -> Option<Hit> {
    first_match(&SCANNER_AC, SCANNERS, ua.as_bytes())
        .map(|(_, p, e)| Hit::new(Attack::Scanner, 40, ua, p, e))
}

const SCRIPT_EXT: &[&str] = &[
    "php", "php3", "php4", "php5", "php7", "php8", "phtml", "pht", "phar", "phps", "jsp", "jspx",
    "jspf", "asp", "aspx", "ashx", "asmx", "asa", "cer", "cfm", "cgi", "pl", "sh", "war", "shtml",
    "htaccess", "exe", "bat", "cmd", "ps1", "vbs", "hta", "py",
];

/// Upload of a server-side script: by file name (`shell.php`, `a.php.jpg`,
/// `.htaccess`, NUL tricks) or by content (`<?php`, `<%@`).
pub fn upload(filename: &str, content: Option<&[u8]>) -> Option<Hit> {
    let f = filename.trim().trim_matches('"').to_ascii_lowercase();
    let base = f.rsplit(['/', '\\']).next().unwrap_or(&f);
    let base = base.split('\0').next().unwrap_or(base);
    let parts: Vec<&str> = base.split('.').collect();
    if base == ".htaccess" || base == ".user.ini" || base == "web.config" {
        return Some(Hit::new(Attack::Upload, 85, filename, 0, filename.len()));
    }
    if parts.len() >= 2 {
        for (i, ext) in parts.iter().enumerate().skip(1) {
            let e = ext.trim_end_matches([' ', ':', ';', '$']);
            let e = e.split(';').next().unwrap_or(e);
            if SCRIPT_EXT.contains(&e)
                && !(matches!(
                    e,
                    "py" | "sh" | "exe" | "bat" | "cmd" | "ps1" | "pl" | "cgi"
                ) && i + 1 < parts.len())
            {
                return Some(Hit::new(Attack::Upload, 85, filename, 0, filename.len()));
            }
        }
    }
    if let Some(c) = content {
        let head = &c[..c.len().min(64 << 10)];
        for m in [
            &b"<?php"[..],
            b"<?=",
            b"<%@",
            b"<jsp:",
            b"<% ",
            b"<%\n",
            b"<%\r",
            b"eval(base64_decode",
            b"<?\n",
        ] {
            if let Some(p) = find_ci(head, m) {
                let text = String::from_utf8_lossy(&head[p..head.len().min(p + 40)]).into_owned();
                return Some(Hit {
                    attack: Attack::Upload,
                    confidence: 85,
                    fragment: text,
                });
            }
        }
    }
    None
}

/// A script extension followed by another extension in the last path segment
/// (`/uploads/shell.php.jpg`: Apache multi-extension handler abuse).
pub fn double_extension(segment: &str) -> Option<Hit> {
    let l = segment.to_ascii_lowercase();
    let parts: Vec<&str> = l.split('.').collect();
    if parts.len() < 3 {
        return None;
    }
    for ext in &parts[1..parts.len() - 1] {
        if matches!(
            *ext,
            "php" | "php3" | "php4" | "php5" | "phtml" | "jsp" | "asp" | "aspx" | "cgi" | "pl"
        ) {
            return Some(Hit::new(Attack::Upload, 70, segment, 0, segment.len()));
        }
    }
    None
}

/// Drupal-style render-array properties in a parameter or key name
/// (`mail[#post_render][]`, `#lazy_builder`): callbacks the server would invoke.
pub fn render_array(name: &str) -> Option<Hit> {
    const PROPS: &[&str] = &[
        "post_render",
        "pre_render",
        "lazy_builder",
        "access_callback",
        "markup",
        "process",
        "value_callback",
        "after_build",
        "element_validate",
        "submit",
        "validate",
        "ajax",
        "theme_wrappers",
        "attached",
        "type",
    ];
    let b = name.as_bytes();
    let mut from = 0;
    while let Some(p) = memchr::memchr(b'#', &b[from..]) {
        let at = from + p;
        from = at + 1;
        // the property opens a bracket level or the whole name
        if !(at == 0 || b[at - 1] == b'[') {
            continue;
        }
        let rest = &name[at + 1..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let prop = &rest[..end];
        let closed = at == 0 && end == rest.len() || rest[end..].starts_with(']');
        if closed && PROPS.iter().any(|x| x.eq_ignore_ascii_case(prop)) {
            // callbacks alone are strong; `#markup`/`#type` only with a bracket path
            let conf = if matches!(prop, "markup" | "type" | "attached" | "ajax") {
                if at == 0 {
                    continue;
                }
                75
            } else {
                90
            };
            return Some(Hit::new(
                Attack::CodeInjection,
                conf,
                name,
                at,
                at + 1 + end,
            ));
        }
    }
    None
}

/// Package prefixes of JVM classes used as deserialization gadgets or
/// command-execution primitives.
const JAVA_GADGET_PACKAGES: &[&str] = &[
    "java.",
    "javax.",
    "jdk.",
    "sun.",
    "com.sun.",
    "org.apache.commons.",
    "org.apache.xalan",
    "org.codehaus.groovy.",
    "groovy.",
    "org.springframework.",
    "com.mchange.",
    "org.hibernate.",
    "bsh.",
    "org.mozilla.javascript.",
];

/// Classes whose presence as an XML object (`class="..."`) means code runs when
/// the document is decoded.
const JAVA_EXEC_CLASSES: &[&str] = &[
    "java.lang.processbuilder",
    "java.lang.runtime",
    "java.beans.eventhandler",
    "java.beans.xmldecoder",
    "java.net.urlclassloader",
    "javax.script.",
    "javax.naming.",
    "javax.management.",
    "com.sun.rowset.",
    "com.sun.org.apache.",
    "org.apache.commons.collections",
    "org.codehaus.groovy.runtime.",
    "groovy.util.expando",
    "jdk.nashorn.",
    "org.springframework.beans.factory.config.methodinvokingfactorybean",
    "sun.misc.",
];

/// Java object graphs in XML: XStream element names that are gadget classes
/// (`<java.util.PriorityQueue>`, `<dynamic-proxy>`), XMLDecoder
/// `class="java.lang.ProcessBuilder"` / `<void method="start">`.
pub fn java_xml(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    if let Some(p) = find_ci(b, b"<dynamic-proxy") {
        return Some(Hit::new(Attack::Deserialization, 90, s, p, p + 40));
    }
    let mut from = 0;
    let mut n = 0;
    while let Some(p) = memchr::memchr(b'<', &b[from..]) {
        let at = from + p;
        from = at + 1;
        n += 1;
        if n > 4096 {
            break;
        }
        // tag names are short: a bounded look-ahead keeps `<<<<aaaa...` linear
        let rest = &b[at + 1..(at + 1 + 128).min(b.len())];
        let end = rest
            .iter()
            .position(|&c| !(c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'$' | b'-')))
            .unwrap_or(rest.len());
        let tag = &rest[..end];
        let dots = tag.iter().filter(|&&c| c == b'.').count();
        if dots >= 2
            && JAVA_GADGET_PACKAGES
                .iter()
                .any(|p| starts_with_ci(tag, p.as_bytes()))
        {
            return Some(Hit::new(
                Attack::Deserialization,
                90,
                s,
                at,
                at + 1 + end + 20,
            ));
        }
    }
    // class="..." / class='...' naming an execution class (XMLDecoder, Spring XML)
    let mut from = 0;
    let mut n = 0;
    while let Some(p) = find_ci(&b[from..], b"class=") {
        let at = from + p;
        from = at + 6;
        n += 1;
        if n > 256 {
            break;
        }
        let v = &b[from..];
        let v = v
            .strip_prefix(b"\"")
            .or_else(|| v.strip_prefix(b"'"))
            .unwrap_or(v);
        if JAVA_EXEC_CLASSES
            .iter()
            .any(|c| starts_with_ci(v, c.as_bytes()))
        {
            return Some(Hit::new(Attack::Deserialization, 90, s, at, at + 50));
        }
    }
    // <void method="exec"> / <void method="start"> with an <object class=...>
    if let Some(p) = find_ci(b, b"<void method=") {
        if contains_ci(b, b"<object class=") {
            return Some(Hit::new(Attack::Deserialization, 85, s, p, p + 40));
        }
    }
    None
}

/// Serialized Java objects: the stream magic `AC ED 00 05` as base64 (`rO0AB`)
/// or hex (`aced0005`) at the start of a token followed by more of the stream.
pub fn deser_marker(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    let token_start = |p: usize| {
        p == 0 || !(b[p - 1].is_ascii_alphanumeric() || b[p - 1] == b'+' || b[p - 1] == b'/')
    };
    static RO0AB: LazyLock<memchr::memmem::Finder<'static>> =
        LazyLock::new(|| memchr::memmem::Finder::new(b"rO0AB"));
    static HEX: LazyLock<memchr::memmem::Finder<'static>> =
        LazyLock::new(|| memchr::memmem::Finder::new(b"0005"));
    // both markers hold the digit 0: one SIMD scan rules most values out
    if b.len() < 24 || memchr::memchr(b'0', b).is_none() {
        return None;
    }
    let mut from = 0;
    while let Some(p) = RO0AB.find(&b[from..]) {
        let at = from + p;
        from = at + 5;
        // bounded look-ahead: overlapping markers cannot make the scan quadratic
        let run = b[at..]
            .iter()
            .take(24)
            .take_while(|c| {
                c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=' | b'-' | b'_')
            })
            .count();
        if token_start(at) && run >= 24 {
            return Some(Hit::new(Attack::Deserialization, 90, s, at, at + 40));
        }
    }
    // hex: find the digits `0005` (memmem), then check `aced` before them
    let mut from = 0;
    while let Some(p) = HEX.find(&b[from..]) {
        let d = from + p;
        from = d + 4;
        if d < 4 || !b[d - 4..d].eq_ignore_ascii_case(b"aced") {
            continue;
        }
        let at = d - 4;
        let run = b[at..]
            .iter()
            .take(24)
            .take_while(|c| c.is_ascii_hexdigit())
            .count();
        if token_start(at) && run >= 24 {
            return Some(Hit::new(Attack::Deserialization, 90, s, at, at + 40));
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
        assert!(traversal("I love /etc/passwd jokes in my essay about unix").is_none());
    }

    #[test]
    fn ssrf_cases() {
        assert!(
            ssrf("http://169.254.169.254/latest/meta-data/").is_some_and(|h| h.confidence >= 85)
        );
        assert!(ssrf("http://127.0.0.1:8080/admin").is_some());
        assert!(ssrf("gopher://x:25/_HELO").is_some());
        assert!(ssrf("url=http://www.example.com/tan?usp=4#8").is_none());
        assert!(ssrf("http://user@localhost/").is_some());
    }

    #[test]
    fn xxe_crlf() {
        assert!(xxe("<!DOCTYPE r [<!ENTITY x SYSTEM \"file:///etc/passwd\">]>").is_some());
        assert!(xxe("<a>b</a>").is_none());
        assert!(crlf("x\r\nSet-Cookie: a=b").is_some());
        assert!(crlf("\u{560D}\u{560A}Set-cookie:crlf=injection").is_some());
        assert!(crlf("line one\nline two: fine").is_none());
    }

    #[test]
    fn code_cases() {
        let c = |s: &str| code(s, Classes::of(s.as_bytes())).is_some_and(|h| h.confidence >= 60);
        assert!(c("{{7*7}}"));
        assert!(c("${7*'7'}"));
        assert!(c("{{''.__class__.__mro__[1]}}"));
        assert!(c("<?php system($_GET['c']); ?>"));
        assert!(c("system('id')"));
        assert!(c(
            "%{(#_memberAccess=@ognl.OgnlContext@DEFAULT_MEMBER_ACCESS)}"
        ));
        assert!(c("__import__('os').system('id')"));
        assert!(c("<!--#exec cmd=\"ls\" -->"));
        assert!(!c("Hello {{name}}, welcome"));
        assert!(!c(
            "}I would like to request the /cc serviceCode with the parameter: serviceCode|{}"
        ));
        assert!(!c("the system (as a whole) works"));
    }

    #[test]
    fn jndi_ldap_nosql() {
        assert!(jndi("${jndi:ldap://x/a}").is_some());
        assert!(jndi("${${lower:j}${::-n}di:rmi://x/a}").is_some());
        assert!(jndi("${env:HOME}").is_none());
        assert!(ldap("*)(uid=*))(|(uid=*").is_some());
        assert!(ldap("(a)(b)").is_none());
        assert!(nosql_name("user[$ne]").is_some());
        assert!(nosql_name("price$").is_none());
        assert!(nosql_value("{\"$where\": \"sleep(100)\"}").is_some());
        assert!(upload("shell.php", None).is_some());
        assert!(upload("a.php.jpg", None).is_some());
        assert!(upload("photo.jpg", Some(b"\xff\xd8")).is_none());
        assert!(double_extension("apache.php.jpeg").is_some());
        assert!(scanner("sqlmap/1.5").is_some());
        assert!(scanner("Mozilla/5.0").is_none());
    }
}
