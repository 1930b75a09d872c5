//! Deserialization: polymorphic type tags, Java object graphs in XML, serialized
//! Java stream markers.

use std::sync::LazyLock;

use super::{Attack, Hit};
use crate::util::{contains_ci, find_ci, starts_with_ci};

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
