//! Cross-site scripting: an HTML tag tokenizer (tag names with namespace
//! prefixes, attributes with quoted/unquoted values, `/` as separator, missing
//! `>`), attribute semantics (event handlers, URL attributes with
//! `javascript:`/`data:` targets after entity decoding, CSS `expression()`),
//! and a JavaScript-context scan (sink calls, global-object bracket access,
//! constructor chains, JSFuck, regex-source concatenation).

use super::{Attack, Classes, Hit};
use crate::decode::html_decode;
use crate::util::{contains_ci, starts_with_ci};

const DANGEROUS_TAGS: &[&str] = &[
    "script", "iframe", "frame", "frameset", "object", "embed", "applet", "base", "meta", "import",
    "portal",
];

const URL_ATTRS: &[&str] = &[
    "href",
    "src",
    "action",
    "formaction",
    "data",
    "background",
    "poster",
    "lowsrc",
    "dynsrc",
    "codebase",
    "code",
    "values",
    "from",
    "to",
    "by",
    "content",
    "xlink:href",
    "srcset",
    "ping",
    "archive",
    "cite",
    "longdesc",
    "usemap",
    "manifest",
    "icon",
];

/// Strips what browsers ignore inside URL schemes (whitespace, controls) and
/// lowercases, up to `limit` bytes.
fn scheme_norm(v: &str, limit: usize) -> String {
    let mut out = String::with_capacity(limit.min(v.len()));
    for ch in v.chars() {
        if out.len() >= limit {
            break;
        }
        if ch.is_whitespace() || (ch as u32) < 0x20 || ch == '\u{feff}' {
            continue;
        }
        out.extend(ch.to_lowercase());
    }
    out
}

fn dangerous_url(v: &str) -> bool {
    let decoded = html_decode(v);
    let n = scheme_norm(&decoded, 40);
    n.starts_with("javascript:")
        || n.starts_with("vbscript:")
        || n.starts_with("livescript:")
        || n.starts_with("data:text/html")
        || n.starts_with("data:image/svg")
        || n.starts_with("data:application/")
        || n.starts_with("data:text/xml")
        || contains_ci(scheme_norm(&decoded, 4096).as_bytes(), b";javascript:")
}

struct Tag<'a> {
    name: &'a str,
    closed: bool,
    start: usize,
    end: usize,
    attrs: Vec<(&'a str, Option<&'a str>)>,
}

/// Parses the tag starting at `s[i] == '<'`; `None` when it is not a tag.
fn parse_tag(s: &str, i: usize) -> Option<Tag<'_>> {
    let b = s.as_bytes();
    let mut j = i + 1;
    if j < b.len() && b[j] == b'/' {
        j += 1;
    }
    let ns = j;
    if j >= b.len() || !b[j].is_ascii_alphabetic() {
        return None;
    }
    while j < b.len()
        && (b[j].is_ascii_alphanumeric() || b[j] == b':' || b[j] == b'-' || b[j] == b'_')
    {
        j += 1;
    }
    let name = &s[ns..j];
    // after the name: whitespace, '/', '>' or end
    if j < b.len() && !matches!(b[j], b' ' | b'\t' | b'\n' | b'\r' | 0x0c | b'/' | b'>') {
        return None;
    }
    let mut attrs = Vec::new();
    loop {
        while j < b.len() && matches!(b[j], b' ' | b'\t' | b'\n' | b'\r' | 0x0c | b'/') {
            j += 1;
        }
        if j >= b.len() || b[j] == b'>' || attrs.len() >= 64 {
            break;
        }
        if b[j] == b'<' {
            break;
        }
        let an = j;
        while j < b.len()
            && !matches!(
                b[j],
                b' ' | b'\t' | b'\n' | b'\r' | 0x0c | b'/' | b'>' | b'='
            )
        {
            j += 1;
        }
        let aname = &s[an..j];
        while j < b.len() && matches!(b[j], b' ' | b'\t' | b'\n' | b'\r' | 0x0c) {
            j += 1;
        }
        if j < b.len() && b[j] == b'=' {
            j += 1;
            while j < b.len() && matches!(b[j], b' ' | b'\t' | b'\n' | b'\r' | 0x0c) {
                j += 1;
            }
            if j < b.len() && (b[j] == b'"' || b[j] == b'\'' || b[j] == b'`') {
                let q = b[j];
                let vs = j + 1;
                j = vs;
                while j < b.len() && b[j] != q {
                    j += 1;
                }
                attrs.push((aname, Some(&s[vs..j])));
                j = (j + 1).min(b.len());
            } else {
                let vs = j;
                while j < b.len() && !matches!(b[j], b' ' | b'\t' | b'\n' | b'\r' | 0x0c | b'>') {
                    j += 1;
                }
                attrs.push((aname, Some(&s[vs..j])));
            }
        } else if aname.is_empty() {
            j += 1;
        } else {
            attrs.push((aname, None));
        }
    }
    Some(Tag {
        name,
        closed: j < b.len() && b[j] == b'>',
        start: i,
        end: (j + 1).min(b.len()),
        attrs,
    })
}

fn local_name(name: &str) -> &str {
    name.rsplit(':').next().unwrap_or(name)
}

fn html_hit(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    let mut best: Option<Hit> = None;
    let mut i = 0;
    let mut tags = 0;
    while let Some(p) = memchr::memchr(b'<', &b[i..]) {
        let at = i + p;
        i = at + 1;
        let Some(tag) = parse_tag(s, at) else {
            continue;
        };
        tags += 1;
        if tags > 256 {
            break;
        }
        let closing = b.get(at + 1) == Some(&b'/');
        let lname = local_name(tag.name);
        let mut conf = 0u8;
        if !closing && DANGEROUS_TAGS.iter().any(|t| t.eq_ignore_ascii_case(lname)) {
            conf = if lname.eq_ignore_ascii_case("meta") || lname.eq_ignore_ascii_case("base") {
                if tag.attrs.is_empty() {
                    0
                } else {
                    80
                }
            } else if tag.closed {
                90
            } else if tag.attrs.iter().any(|(n, v)| {
                v.as_deref().is_some_and(|v| v.contains('/'))
                    && ["src", "data", "href", "code"]
                        .iter()
                        .any(|u| n.eq_ignore_ascii_case(u))
            }) {
                // left open for the page's next `>` to close, with a path or URL to
                // load: `"><script src=//evil.example/x.js`
                75
            } else {
                50
            };
        }
        for (an, av) in &tag.attrs {
            let an_l = an.to_ascii_lowercase();
            let an_local = an_l.rsplit(':').next().unwrap_or(&an_l);
            if an_local.len() > 2
                && an_local.starts_with("on")
                && an_local[2..].bytes().all(|c| c.is_ascii_alphabetic())
                && av.is_some()
            {
                conf = conf.max(90);
            }
            if let Some(v) = av {
                if (URL_ATTRS.contains(&an_l.as_str()) || URL_ATTRS.contains(&an_local))
                    && dangerous_url(v)
                {
                    conf = conf.max(90);
                }
                if an_l == "style" {
                    let d = html_decode(v);
                    let n = scheme_norm(&d, 4096);
                    if n.contains("expression(")
                        || n.contains("javascript:")
                        || n.contains("behavior:")
                        || n.contains("-moz-binding")
                    {
                        conf = conf.max(85);
                    }
                }
                if an_l == "srcdoc" {
                    let d = html_decode(v);
                    if html_hit(&d).is_some() {
                        conf = conf.max(90);
                    }
                }
                if an_l == "http-equiv" && v.eq_ignore_ascii_case("refresh") {
                    conf = conf.max(70);
                }
            }
        }
        if conf > 0 && best.as_ref().is_none_or(|h| h.confidence < conf) {
            best = Some(Hit::new(Attack::Xss, conf, s, tag.start, tag.end));
        }
    }
    best
}

const SINKS: &[&str] = &[
    "alert",
    "prompt",
    "confirm",
    "eval",
    "atob",
    "fromcharcode",
    "execscript",
    "settimeout",
    "setinterval",
    "function",
    "constructor",
    "import",
    "write",
    "writeln",
    "print",
];

const EVENTS: &[&str] = &[
    "error",
    "load",
    "click",
    "mouseover",
    "mouseenter",
    "mouseout",
    "focus",
    "blur",
    "change",
    "input",
    "submit",
    "keydown",
    "keyup",
    "keypress",
    "toggle",
    "animationstart",
    "animationend",
    "transitionend",
    "pageshow",
    "begin",
    "end",
    "afterscriptexecute",
    "beforescriptexecute",
    "pointerover",
    "pointerenter",
    "pointerdown",
    "auxclick",
    "dblclick",
    "drag",
    "dragstart",
    "drop",
    "wheel",
    "scroll",
    "resize",
    "message",
    "hashchange",
    "popstate",
    "copy",
    "paste",
    "cut",
    "contextmenu",
    "mousedown",
    "mouseup",
    "mousemove",
    "select",
    "search",
    "show",
    "start",
    "finish",
    "focusin",
    "focusout",
    "loadstart",
    "durationchange",
    "canplay",
    "play",
    "readystatechange",
    "unload",
    "beforeunload",
];

const GLOBALS: &[&str] = &[
    "window",
    "top",
    "self",
    "parent",
    "frames",
    "globalthis",
    "this",
    "document",
    "content",
    "opener",
];

fn ident_before(b: &[u8], end: usize) -> (usize, usize) {
    let mut s = end;
    while s > 0 && (b[s - 1].is_ascii_alphanumeric() || b[s - 1] == b'_' || b[s - 1] == b'$') {
        s -= 1;
    }
    (s, end)
}

fn js_hit(s: &str, c: Classes) -> Option<Hit> {
    let b = s.as_bytes();
    let mut best: Option<Hit> = None;
    let put = |conf: u8, a: usize, e: usize, best: &mut Option<Hit>| {
        if best.as_ref().is_none_or(|h| h.confidence < conf) {
            *best = Some(Hit::new(Attack::Xss, conf, s, a, e));
        }
    };
    // javascript: URL as the whole value
    let trimmed = s.trim_start_matches(|ch: char| {
        ch.is_whitespace() || (ch as u32) < 0x20 || ch == '"' || ch == '\''
    });
    if c.any(Classes::COLON) {
        let n = scheme_norm(trimmed, 16);
        if n.starts_with("javascript:") || n.starts_with("vbscript:") {
            let rest = trimmed.split_once(':').map(|x| x.1).unwrap_or("");
            let r = rest.trim().trim_end_matches(';').trim();
            let void = r.eq_ignore_ascii_case("void(0)")
                || r.eq_ignore_ascii_case("void 0")
                || r.is_empty();
            if !void
                && (rest.contains(['(', '`', '=']) || rest.starts_with(['/', '\\', '%', '\'', '"']))
            {
                put(85, 0, s.len().min(60), &mut best);
            }
        }
    }
    // JSFuck / bracket-heavy code
    if c.any(Classes::BRACKET) && b.len() >= 24 {
        let sym = b
            .iter()
            .filter(|&&x| matches!(x, b'[' | b']' | b'(' | b')' | b'!' | b'+'))
            .count();
        let jsfuck_shape = memchr::memmem::find(b, b"[]").is_some()
            && memchr::memchr(b'!', b).is_some()
            && memchr::memchr(b'(', b).is_some();
        if jsfuck_shape && sym >= 24 && sym * 10 >= b.len() * 7 {
            put(90, 0, b.len(), &mut best);
        }
    }
    if !c.any(Classes::PAREN | Classes::QUOTE | Classes::BRACKET) {
        return best;
    }
    // Sink calls: name( or name` with a JS-ish boundary before the name.
    let last_call = memchr::memmem::rfind(b, b"](")
        .into_iter()
        .chain(memchr::memmem::rfind(b, b"]`"))
        .max();
    let mut i = 0;
    while i < b.len() {
        let ch = b[i];
        if ch == b'(' || ch == b'`' {
            let mut k = i;
            if k >= 2 && b[k - 1] == b'.' && b[k - 2] == b'?' {
                k -= 2;
            }
            while k > 0 && (b[k - 1] == b' ' || b[k - 1] == b'\t') && k + 2 > i {
                k -= 1;
            }
            let (is, ie) = ident_before(b, k);
            if ie > is {
                let name = &s[is..ie];
                if SINKS.iter().any(|x| x.eq_ignore_ascii_case(name)) {
                    let before = if is == 0 { b' ' } else { b[is - 1] };
                    let boundary = is == 0
                        || matches!(
                            before,
                            b';' | b'='
                                | b'('
                                | b','
                                | b'+'
                                | b'-'
                                | b'!'
                                | b'|'
                                | b'&'
                                | b':'
                                | b'\''
                                | b'"'
                                | b'{'
                                | b'['
                                | b'.'
                                | b'>'
                                | b'*'
                                | b'/'
                                | b'?'
                                | b'}'
                                | b']'
                                | b' '
                                | b'\n'
                                | b'\t'
                                | b'~'
                                | b'^'
                                | b'`'
                        );
                    // The argument must look like JS: literal, identifier, quote, paren.
                    let arg = b.get(i + 1).copied().unwrap_or(b')');
                    let arg_ok = arg.is_ascii_alphanumeric()
                        || matches!(
                            arg,
                            b'\''
                                | b'"'
                                | b'`'
                                | b'('
                                | b')'
                                | b'/'
                                | b'['
                                | b'{'
                                | b'-'
                                | b'_'
                                | b'$'
                                | b'.'
                                | b'+'
                                | b'!'
                        );
                    let js_syntax = c.any(
                        Classes::SEP
                            | Classes::QUOTE
                            | Classes::EQ
                            | Classes::ANGLE
                            | Classes::BRACKET
                            | Classes::COMMENT
                            | Classes::PLUS
                            | Classes::SLASH,
                    ) || is == 0
                        // a template literal's substitution: `${alert(1)}`
                        || (is >= 2 && &b[is - 2..is] == b"${");
                    let lname = name.to_ascii_lowercase();
                    let strong = matches!(
                        lname.as_str(),
                        "alert"
                            | "prompt"
                            | "confirm"
                            | "eval"
                            | "atob"
                            | "fromcharcode"
                            | "execscript"
                    );
                    let space_before_paren =
                        k != i && !(i >= 2 && b[i - 1] == b'.' && b[i - 2] == b'?');
                    if boundary && arg_ok && js_syntax && (strong || !space_before_paren) {
                        let conf = if strong {
                            if before == b' '
                                && is > 0
                                && !c.any(
                                    Classes::SEP | Classes::QUOTE | Classes::EQ | Classes::ANGLE,
                                )
                            {
                                55
                            } else {
                                85
                            }
                        } else if lname == "constructor" || lname == "function" {
                            if before == b'.' || before == b'[' || before == b'\'' || before == b'"'
                            {
                                80
                            } else {
                                0
                            }
                        } else if before == b'.' && (lname == "write" || lname == "writeln") {
                            let (os, _) = ident_before(b, is - 1);
                            if s[os..is - 1].eq_ignore_ascii_case("document") {
                                80
                            } else {
                                0
                            }
                        } else if lname == "settimeout"
                            || lname == "setinterval"
                            || lname == "import"
                        {
                            if arg == b'\'' || arg == b'"' || arg == b'`' {
                                75
                            } else {
                                0
                            }
                        } else {
                            0
                        };
                        if conf > 0 {
                            put(conf, is, (i + 12).min(b.len()), &mut best);
                        }
                    }
                }
            }
        }
        if ch == b'[' && i > 0 {
            let (is, ie) = ident_before(b, i);
            if ie > is && GLOBALS.iter().any(|g| g.eq_ignore_ascii_case(&s[is..ie])) {
                let nx = b.get(i + 1).copied().unwrap_or(0);
                let before_ok = is == 0 || !b[is - 1].is_ascii_alphanumeric() && b[is - 1] != b'.';
                // `top[8680439..toString(30)]` is `top['alert']`: a number written
                // in base 30
                let radix = nx.is_ascii_digit()
                    && crate::util::find_ci(&b[i..b.len().min(i + 48)], b"..tostring(").is_some();
                if before_ok
                    && (radix
                        || matches!(nx, b'\'' | b'"' | b'`' | b'/' | b'(' | b'[' | b'!' | b'+'))
                {
                    // the bracket expression is called somewhere after (positions
                    // computed once per value: linear time)
                    if last_call.is_some_and(|p| p > i) {
                        put(85, is, (i + 20).min(b.len()), &mut best);
                    }
                }
            }
        }
        i += 1;
    }
    // a=alert;a(1) : a sink used as a value
    for sink in ["alert", "prompt", "confirm", "eval"] {
        if let Some(p) = crate::util::find_ci(b, sink.as_bytes()) {
            let before = if p == 0 { b'=' } else { b[p - 1] };
            let after = b.get(p + sink.len()).copied().unwrap_or(b';');
            // the sole argument of a method call: `[1].find(alert)`, `[1].map(eval)`
            let callback = before == b'(' && after == b')' && p >= 2 && {
                let (ms, me) = ident_before(b, p - 1);
                me > ms && ms > 0 && b[ms - 1] == b'.'
            };
            if matches!(before, b'=' | b',' | b'(' | b':')
                && matches!(after, b';' | b',' | b')')
                && (c.any(Classes::SEP | Classes::EQ) || callback)
            {
                put(75, p, p + sink.len() + 1, &mut best);
            }
        }
    }
    // indirect calls of a sink: `(alert)(1)`, `(0,eval)(x)`, `prompt.call(null,1)`,
    // `confirm.apply(...)`, `alert.bind()(1)`: the sink is a value, then called
    if let Some((ps, pe)) = indirect_sink_call(b) {
        put(85, ps, pe, &mut best);
    }
    // document['cookie'], window["location"]
    for pat in [
        &b"['cookie"[..],
        b"[\"cookie",
        b"['domain",
        b"[\"domain",
        b"['location",
        b"[\"location",
    ] {
        if let Some(p) = crate::util::find_ci(b, pat) {
            let (is, ie) = ident_before(b, p);
            if ie > is && GLOBALS.iter().any(|g| g.eq_ignore_ascii_case(&s[is..ie])) {
                put(80, is, p + pat.len() + 2, &mut best);
            }
        }
    }
    // an event-handler attribute injected into an existing tag: `" onerror=alert(1)`
    let mut from = 0;
    while let Some(p) = crate::util::find_ci(&b[from..], b"on") {
        let at = from + p;
        from = at + 2;
        let before_ok = at == 0
            || matches!(
                b[at - 1],
                b' ' | b'"' | b'\'' | b'/' | b'+' | b'\t' | b'\n' | b'\x0c'
            );
        if !before_ok {
            continue;
        }
        let mut j = at + 2;
        while j < b.len() && b[j].is_ascii_alphabetic() {
            j += 1;
        }
        if j - at < 5 || j >= b.len() || b[j] != b'=' {
            continue;
        }
        let name = &s[at..j];
        let v = s[j + 1..].trim_start_matches(['"', '\'', ' ']);
        let call = v.find(['(', '`']).is_some_and(|x| {
            x < 40
                && v[..x].bytes().all(|c| {
                    c.is_ascii_alphanumeric()
                        || matches!(c, b'.' | b'_' | b'$' | b'[' | b']' | b'\'' | b'"' | b'?')
                })
        });
        if call || v.starts_with("javascript:") {
            let known = EVENTS.iter().any(|e| e.eq_ignore_ascii_case(&name[2..]));
            if known {
                put(85, at, (j + 20).min(b.len()), &mut best);
            }
        }
    }
    // /al/.source + /ert/.source
    if contains_ci(b, b"/.source") && contains_ci(b, b"+") {
        put(80, 0, b.len(), &mut best);
    }
    // document.cookie / document.domain / location assignments in JS syntax
    for pat in [
        &b"document.cookie"[..],
        b"document.domain",
        b"document.location",
        b".innerhtml=",
        b"location.href=",
    ] {
        if let Some(p) = crate::util::find_ci(b, pat) {
            if c.any(Classes::SEP | Classes::QUOTE | Classes::PAREN) {
                put(70, p, p + pat.len(), &mut best);
            }
        }
    }
    best
}

/// The strong sinks, called through a grouping, `call`, `apply` or `bind`.
fn indirect_sink_call(b: &[u8]) -> Option<(usize, usize)> {
    for sink in ["alert", "prompt", "confirm", "eval", "execscript"] {
        let mut from = 0;
        while let Some(p) = crate::util::find_ci(&b[from..], sink.as_bytes()) {
            let at = from + p;
            from = at + sink.len();
            let before = if at == 0 { b' ' } else { b[at - 1] };
            if before.is_ascii_alphanumeric() || matches!(before, b'_' | b'$') {
                continue;
            }
            let rest = &b[from..];
            let grouped = matches!(before, b'(' | b',') && rest.starts_with(b")(");
            let method = [&b".call("[..], b".apply(", b".bind("]
                .iter()
                .any(|m| starts_with_ci(rest, m));
            if grouped || method {
                return Some((at.saturating_sub(1), (from + 7).min(b.len())));
            }
        }
    }
    None
}

/// Runs the XSS detector.
pub fn detect(s: &str, c: Classes) -> Option<Hit> {
    let mut best = None;
    if c.any(Classes::ANGLE) {
        best = html_hit(s);
        if best.is_none() {
            // `<` hidden from the tag scanner by entities
            if let std::borrow::Cow::Owned(d) = html_decode(s) {
                best = html_hit(&d);
            }
        }
        if best.is_none() && s.contains('\0') {
            // NUL bytes inside a tag name (`<scr\0ipt>`), which HTML parsers
            // of old browsers dropped (CRS's `t:removeNulls`)
            best = html_hit(&s.replace('\0', ""));
        }
    }
    if best.as_ref().is_none_or(|h: &Hit| h.confidence < 85) {
        let j = js_hit(s, c);
        if j.as_ref().map(|h| h.confidence) > best.as_ref().map(|h| h.confidence) {
            best = j;
        }
    }
    if best.is_none() && starts_with_ci(s.trim_start().as_bytes(), b"<!--") {
        return None;
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(s: &str) -> bool {
        detect(s, Classes::of(s.as_bytes())).is_some_and(|h| h.confidence >= 60)
    }

    #[test]
    fn attacks() {
        for a in [
            "<script>alert(1)</script>",
            "<img src=x onerror=alert(1)>",
            "<svg/onload=prompt(8)>",
            "<a href=\"j&#x61vascript:alert(1)\">x</a>",
            "<a href=\"&#x6a avascript:alert(1)\">x</a>",
            "<xss onafterscriptexecute=alert(1)>",
            "<div style=\"color: expression(alert('XSS'))\">",
            "<x:script xmlns:x=\"http://www.w3.org/1999/xhtml\">alert(1)</x:script>",
            "';alert(1)//",
            "top['ale'+'rt'](top['doc'+'ument']['dom'+'ain']);//",
            "javascript:alert(1)",
            "self[/al/.source+/ert/.source](/XSS/.source);//",
            ";a=alert;a(1)",
            "(alert)(1)",
            "(0,eval)('alert(1)')",
            "prompt.call(null,1)",
            "confirm.apply(window,[1])",
            "alert.bind()(document.domain)",
            "${alert(1)}",
            "x${prompt`1`}",
            "<<scr\0ipt/src=http://xss.com/xss.js></script",
            // left open for the page's next `>`, with what it loads
            "\"><script src=//evil.example/x.js",
            "<script src=\"//evil.example&sol;1.js&num;",
            "<iframe src=//evil.example/x",
            "[1].find(alert)",
            "top[8680439..toString(30)](1)",
            "<iframe srcdoc=\"<svg onload=alert(1)>\"></iframe>",
            "<a href=data:text/html;base64,PHNjcmlwdD4=>1</a>",
            "<img src=x onerror=location=atob`amF2YQ==`>",
            "frames[(+{}+[])[+!![]]+(![]+[])[!+[]+!![]]+([][[]]+[])[!+[]+!![]+!![]]]((+{}+[])[+!![]]);//",
        ] {
            assert!(hit(a), "missed {a}");
        }
    }

    #[test]
    fn benign() {
        for b in [
            "h2<h1",
            "a < b and c > d",
            "<p>Hello <b>world</b></p>",
            "<img src=\"/logo.png\" alt=\"logo\">",
            "JavaScript: Basics of JavaScript Language",
            "Please confirm (yes/no) your order",
            "severity levels: (alert) (warning) (info)",
            "call the alerting team, then evaluate.apply rules",
            "prompts (alert)",
            "a\0b <b>bold</b>",
            "the <script tag goes in the head",
            "find (alert) in the docs",
            "levels (alert) and (warning)",
            "frames[2].toString()",
            "<script src= is how you load a file",
            ">url=/pi?mode=<;>",
            "this[0] = value",
            "I'd like to print (two) copies",
            "${price} (confirm at checkout)",
        ] {
            assert!(
                !hit(b),
                "false positive on {b}: {:?}",
                detect(b, Classes::of(b.as_bytes()))
            );
        }
    }
}
