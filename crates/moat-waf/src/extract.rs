//! Request decomposition: every inspectable value with its named location,
//! decoded and handed to the detectors.

use std::borrow::Cow;
use std::fmt;

use crate::clean_cache;
use crate::decode;
use crate::detect::{
    self, crlf, deser, jndi, scanner, traversal, upload, xss, xxe, Attack, Classes, Hit, Scope,
};
use crate::util::{find2, lossy};

/// Where a value was found. Rendered (`query:id`, `json:/user/name`) only when
/// a finding is reported, so benign values cost no allocation.
#[derive(Debug, Clone, Copy)]
pub enum Loc<'a> {
    /// The decoded URL path.
    Path,
    /// One path segment (index from 0).
    PathSegment(usize),
    /// A query argument value.
    Query(&'a str),
    /// A query argument name.
    QueryName(&'a str),
    /// A urlencoded form field value.
    Form(&'a str),
    /// A urlencoded form field name.
    FormName(&'a str),
    /// A multipart field value.
    Multipart(&'a str),
    /// A multipart file name.
    Filename(&'a str),
    /// A JSON string value or key, by JSON pointer.
    Json(&'a str),
    /// An XML text node or attribute (`element` or `element@attr`).
    Xml(&'a str),
    /// A cookie value.
    Cookie(&'a str),
    /// A cookie name.
    CookieName(&'a str),
    /// A header value.
    Header(&'a str),
    /// A query argument of a URL carried in a header (Referer).
    HeaderArg(&'a str, &'a str),
    /// The body as a whole.
    Body,
}

impl fmt::Display for Loc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loc::Path => f.write_str("path"),
            Loc::PathSegment(i) => write!(f, "path:{i}"),
            Loc::Query(n) => write!(f, "query:{n}"),
            Loc::QueryName(n) => write!(f, "query-name:{n}"),
            Loc::Form(n) => write!(f, "form:{n}"),
            Loc::FormName(n) => write!(f, "form-name:{n}"),
            Loc::Multipart(n) => write!(f, "multipart:{n}"),
            Loc::Filename(n) => write!(f, "filename:{n}"),
            Loc::Json(p) => write!(f, "json:{p}"),
            Loc::Xml(p) => write!(f, "xml:{p}"),
            Loc::Cookie(n) => write!(f, "cookie:{n}"),
            Loc::CookieName(n) => write!(f, "cookie-name:{n}"),
            Loc::Header(n) => write!(f, "header:{n}"),
            Loc::HeaderArg(h, n) => write!(f, "header:{h}:{n}"),
            Loc::Body => f.write_str("body"),
        }
    }
}

/// A finding of the engine.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    /// Attack family / detector.
    pub attack: Attack,
    /// Location, e.g. `query:id`.
    pub location: String,
    /// Matched fragment (decoded, truncated).
    pub fragment: String,
    /// Confidence 0-100 (after context adjustments).
    pub confidence: u8,
    /// Virtual-patch rule id (`attack` is `virtual-patch`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

/// How much context lowers shape-based findings (from the sensitivity).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Policy {
    /// Subtracted in a code-submission field.
    pub code_penalty: u8,
    /// Subtracted inside a large JSON beacon.
    pub beacon_penalty: u8,
}

/// Field names (last name component, lowercase) that carry source code or
/// markup in code playgrounds, CMS editors and snippet services.
const CODE_FIELDS: &[&str] = &[
    "code",
    "source",
    "sourcecode",
    "source_code",
    "src",
    "html",
    "css",
    "scss",
    "less",
    "js",
    "javascript",
    "ts",
    "typescript",
    "jsx",
    "tsx",
    "snippet",
    "content",
    "markup",
    "editor",
    "program",
    "solution",
    "answer",
    "patch",
    "diff",
];

/// The last name component of a field name or JSON pointer, e.g. `content` for
/// `files[0][content]` or `/files/0/content`.
fn last_component(name: &str) -> &str {
    name.rsplit(['[', ']', '.', '/'])
        .find(|p| !p.is_empty() && !p.bytes().all(|c| c.is_ascii_digit()))
        .unwrap_or(name)
}

/// True when a field is a code submission: its name is a code field (or ends
/// in `code`/`source`/`html`/`css`/`js`/`script` after a separator) and its value
/// is code-shaped: at least 3 lines, 80 bytes and 8 structural characters.
pub(crate) fn code_field(name: &str, value: &str) -> bool {
    if value.len() < 80 {
        return false;
    }
    // the line count first: one vector scan rules out most long values (free
    // text on one line) before the name is split and compared
    let b = value.as_bytes();
    if memchr::memchr_iter(b'\n', b).take(3).count() < 3 {
        return false;
    }
    let last = last_component(name);
    let mut lbuf = [0u8; 32];
    if last.len() > lbuf.len() {
        return false;
    }
    let l = &mut lbuf[..last.len()];
    l.copy_from_slice(last.as_bytes());
    l.make_ascii_lowercase();
    let l = std::str::from_utf8(l).unwrap_or("");
    let named = CODE_FIELDS.contains(&l)
        || [
            "_code", "-code", "_source", "_html", "_css", "_js", "_script",
        ]
        .iter()
        .any(|s| l.ends_with(s));
    if !named {
        return false;
    }
    let structural = b
        .iter()
        .filter(|c| matches!(c, b'{' | b'}' | b'(' | b')' | b';' | b'<' | b'>' | b'='))
        .take(8)
        .count();
    structural >= 8
}

/// Size from which a JSON body is treated as an analytics beacon.
pub(crate) const BEACON_BYTES: usize = 4 << 10;

/// Limits the inspector enforces (copied from the config).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lim {
    pub max_params: usize,
    pub max_depth: usize,
}

/// Per-request inspection state.
pub(crate) struct Inspector<'e> {
    pub lim: Lim,
    pub params: usize,
    pub findings: Vec<Finding>,
    pub limits: Vec<crate::LimitHit>,
    pub filter: &'e dyn Fn(Attack, Option<&str>, &str) -> bool,
    /// Context penalties.
    pub policy: Policy,
    /// The value being analysed is a code submission.
    pub code_ctx: bool,
    /// The body being analysed is a large JSON beacon.
    pub beacon: bool,
    /// Virtual patches whose parameter conditions see every decoded parameter.
    pub patches: Option<&'e crate::vpatch::PatchSet>,
    /// What the parameters satisfied so far.
    pub facts: crate::vpatch::ParamFacts,
    stopped: bool,
    /// Engine id, the key of the clean-header memo.
    engine: u64,
    /// Detector and limit hits so far, counted before exclusions and caps.
    outcomes: usize,
}

/// `select` in an otherwise inert value with spaces: a keyword that sends such a value
/// to the detectors (besides [`numeric_clause`]), searched for in every long free-text
/// value.
static SELECT: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"select"));

/// A number followed by an `ORDER BY` / `GROUP BY` (`1 order by 3--`, the column count
/// probe), or the clause alone as the fragment a scanner appends (` ORDER BY 3--`): a
/// numeric context's breakout needs no byte outside the inert classes.
fn numeric_clause(b: &[u8]) -> bool {
    let t = b.trim_ascii_start();
    let lead = t.first().is_some_and(u8::is_ascii_digit)
        || t.get(..6).is_some_and(|w| {
            w.eq_ignore_ascii_case(b"order ") || w.eq_ignore_ascii_case(b"group ")
        });
    lead && crate::util::find_ci(b, b" by ").is_some()
}

/// Text in a JSON object's or array's brackets (trimmed already): worth a JSON walk.
fn json_shaped(t: &str) -> bool {
    t.len() >= 2
        && ((t.starts_with('{') && t.ends_with('}')) || (t.starts_with('[') && t.ends_with(']')))
}

/// Most findings kept per request.
const MAX_FINDINGS: usize = 32;
/// Nesting of decoders that re-enter the inspector (base64 -> JSON -> base64 ...).
const MAX_NEST: u8 = 3;
/// Largest value analysed as a whole (longer values are analysed in windows).
const MAX_VALUE: usize = 256 << 10;

/// Values shorter than this are not analysed when [`inert`]: too short for the
/// serialized-object marker, a base64 blob or embedded base64.
const SHORT_VALUE: usize = 12;

/// A value with no class that an injection detector needs (only `.`, `-#*`,
/// non-ASCII and `@!^~,?`), or too short for any injection.
fn inert(c: Classes, raw: &str) -> bool {
    !c.any(!(Classes::DOT | Classes::COMMENT | Classes::HIGH | Classes::MISC)) || raw.len() < 3
}

impl<'e> Inspector<'e> {
    pub fn new(
        lim: Lim,
        engine: u64,
        filter: &'e dyn Fn(Attack, Option<&str>, &str) -> bool,
        policy: Policy,
    ) -> Self {
        Inspector {
            policy,
            code_ctx: false,
            beacon: false,
            patches: None,
            facts: Default::default(),
            lim,
            params: 0,
            findings: Vec::new(),
            limits: Vec::new(),
            filter,
            stopped: false,
            engine,
            outcomes: 0,
        }
    }

    pub fn limit(&mut self, what: crate::Limit, loc: Loc<'_>) {
        self.outcomes += 1;
        if self.limits.len() < 8 {
            self.limits
                .push(crate::LimitHit::new(what, loc.to_string()));
        }
    }

    fn count(&mut self, loc: Loc<'_>) -> bool {
        if self.stopped {
            return false;
        }
        self.params += 1;
        if self.params > self.lim.max_params {
            self.stopped = true;
            self.limit(crate::Limit::MaxParams, loc);
            return false;
        }
        true
    }

    /// Reports a virtual-patch hit.
    pub fn report_rule(&mut self, h: crate::vpatch::PatchHit) {
        self.outcomes += 1;
        if self.findings.len() >= MAX_FINDINGS
            || !(self.filter)(Attack::VirtualPatch, Some(&h.rule), &h.location)
        {
            return;
        }
        if self
            .findings
            .iter()
            .any(|f| f.rule.as_deref() == Some(h.rule.as_str()))
        {
            return;
        }
        self.findings.push(Finding {
            attack: Attack::VirtualPatch,
            location: h.location,
            fragment: h.fragment,
            confidence: h.confidence,
            rule: Some(h.rule),
        });
    }

    /// Reports a detector hit at `loc` (context penalties and exclusions apply).
    pub fn report_hit(&mut self, loc: Loc<'_>, h: Hit) {
        self.report(loc, h)
    }

    fn report(&mut self, loc: Loc<'_>, mut h: Hit) {
        self.outcomes += 1;
        if self.findings.len() >= MAX_FINDINGS {
            return;
        }
        if h.attack.shape_based() {
            let mut pen = 0;
            if self.code_ctx {
                pen += self.policy.code_penalty;
            }
            if self.beacon {
                pen += self.policy.beacon_penalty;
            }
            h.confidence = h.confidence.saturating_sub(pen);
        }
        let location = loc.to_string();
        if !(self.filter)(h.attack, None, &location) {
            return;
        }
        if let Some(f) = self
            .findings
            .iter_mut()
            .find(|f| f.attack == h.attack && f.location == location)
        {
            if f.confidence < h.confidence {
                f.confidence = h.confidence;
                f.fragment = h.fragment;
            }
            return;
        }
        self.findings.push(Finding {
            attack: h.attack,
            location,
            fragment: h.fragment,
            confidence: h.confidence,
            rule: None,
        });
    }

    /// Inspects one value (already URL-decoded once by its container).
    pub fn value(&mut self, loc: Loc<'_>, v: &str, scope: Scope) {
        if !self.count(loc) {
            return;
        }
        self.analyze(loc, v, scope, 0);
    }

    /// Inspects a named body field (form, multipart, JSON), in code-submission
    /// context when the field is one (see [`code_field`]).
    fn field_value(&mut self, loc: Loc<'_>, name: &str, v: &str, counted: bool) {
        if !counted && !self.count(loc) {
            return;
        }
        let code = code_field(name, v);
        let before = self.code_ctx;
        self.code_ctx |= code;
        self.analyze(loc, v, Scope::Body, 0);
        self.code_ctx = before;
    }

    /// Inspects a name (parameter name, JSON key).
    pub fn name(&mut self, loc: Loc<'_>, v: &str) {
        self.name_classified(loc, v, Classes::of(v.as_bytes()));
    }

    /// [`Inspector::name`] for a name whose classes the caller has computed
    /// (`c` must be `Classes::of(v)`; the JSON walk needs them for the pointer).
    ///
    /// Inlined: most names have no class that a name detector needs, and
    /// return here without a call.
    #[inline]
    fn name_classified(&mut self, loc: Loc<'_>, v: &str, c: Classes) {
        debug_assert_eq!(c, Classes::of(v.as_bytes()));
        if v.is_empty() || self.stopped {
            return;
        }
        // `$` is a class of its own (DOLLAR) and already counts; `#` shares COMMENT with
        // `-` and `*`, so it is searched for only when that class is present
        let trigger = c.any(!(Classes::DOT | Classes::COMMENT | Classes::HIGH | Classes::BRACKET))
            || (c.any(Classes::COMMENT) && memchr::memchr(b'#', v.as_bytes()).is_some());
        if trigger {
            self.name_detect(loc, v, c);
        }
    }

    /// The name detectors on a name that has their trigger classes `c`.
    #[inline(never)]
    fn name_detect(&mut self, loc: Loc<'_>, v: &str, c: Classes) {
        match decode::url_decode_repeated(v.as_bytes()) {
            Cow::Borrowed(_) => {
                detect::run_all_classified(v, c, Scope::Name, &mut |h| self.report(loc, h))
            }
            Cow::Owned(d) => detect::run_all(&lossy(&d), Scope::Name, &mut |h| self.report(loc, h)),
        }
    }

    /// Runs the detectors on a value, and on what it decodes to (in windows
    /// when it is longer than [`MAX_VALUE`]).
    ///
    /// Inlined for its first test: a short value with no class that a
    /// detector needs (most short values) returns without a call.
    #[inline]
    fn analyze(&mut self, loc: Loc<'_>, raw: &str, scope: Scope, nest: u8) {
        if raw.len() < SHORT_VALUE {
            let c = Classes::of(raw.as_bytes());
            if !inert(c, raw) {
                self.analyze_classified(loc, raw, c, scope, nest);
            }
            return;
        }
        self.analyze_long(loc, raw, scope, nest);
    }

    /// [`Inspector::analyze`] of a value of [`SHORT_VALUE`] bytes or more.
    #[inline(never)]
    fn analyze_long(&mut self, loc: Loc<'_>, raw: &str, scope: Scope, nest: u8) {
        if raw.len() > MAX_VALUE {
            // analyse overlapping windows so a long value stays linear and bounded
            let mut start = 0;
            while start < raw.len() {
                let mut a = start;
                while !raw.is_char_boundary(a) {
                    a += 1;
                }
                let mut e = (a + MAX_VALUE).min(raw.len());
                while !raw.is_char_boundary(e) {
                    e -= 1;
                }
                let w = &raw[a..e];
                self.analyze_classified(loc, w, Classes::of(w.as_bytes()), scope, nest);
                if e == raw.len() {
                    break;
                }
                start = e.saturating_sub(1024);
            }
            return;
        }
        self.analyze_classified(loc, raw, Classes::of(raw.as_bytes()), scope, nest);
    }

    /// The analysis of a value whose classes `c` the caller has computed
    /// (`Classes::of(raw)`): [`Inspector::analyze`] has returned already for
    /// a short inert value, and windows of a long one are never short.
    #[inline(never)]
    fn analyze_classified(&mut self, loc: Loc<'_>, raw: &str, c: Classes, scope: Scope, nest: u8) {
        debug_assert_eq!(c, Classes::of(raw.as_bytes()));
        let inert = inert(c, raw);
        if inert && raw.len() >= 24 {
            if let Some(h) = deser::deser_marker(raw) {
                self.report(loc, h);
            }
        }
        // a long run of base64 alphabet only (binary blob, token): no detector
        // applies to the text itself; only the serialized-object marker and the
        // decoded text (below) are checked
        let blob = raw.len() >= 64
            && !c.any(!(Classes::PLUS | Classes::SLASH | Classes::EQ | Classes::COMMENT))
            && !raw.contains(['-', '#', '*']);
        // an inert value of this length was checked for the marker above already
        if blob && !inert {
            if let Some(h) = deser::deser_marker(raw) {
                self.report(loc, h);
            }
        }
        if !inert && !blob {
            // decode: URL (repeated), HTML entities, JS escapes
            let u: Cow<'_, str> = if c.any(Classes::PERCENT) {
                match decode::url_decode_repeated(raw.as_bytes()) {
                    Cow::Borrowed(_) => Cow::Borrowed(raw),
                    Cow::Owned(v) => Cow::Owned(crate::util::lossy_owned(v)),
                }
            } else {
                Cow::Borrowed(raw)
            };
            // a form field's line breaks are a textarea's layout, but a break the field
            // still spells as `%0A` after the form's own decoding was encoded twice,
            // which no browser does: the decoded text is judged as a query value is
            let scope = if scope == Scope::Body
                && matches!(loc, Loc::Form(_))
                && matches!(u, Cow::Owned(_))
                && memchr::memchr2(b'\n', b'\r', raw.as_bytes()).is_none()
                && memchr::memchr2(b'\n', b'\r', u.as_bytes()).is_some()
            {
                Scope::Value
            } else {
                scope
            };
            let h1 = decode::html_decode(&u);
            // double-encoded references (`&amp;lt;`): one more round
            let h: Cow<'_, str> = if matches!(h1, Cow::Owned(_)) && h1.contains('&') {
                Cow::Owned(decode::html_decode(&h1).into_owned())
            } else {
                h1
            };
            let j = decode::js_unescape(&h);
            let fin: &str = &j;
            let findings_before = self.findings.len();
            // a value no decoder changed has the classes computed above
            let unchanged = matches!(
                (&u, &h, &j),
                (Cow::Borrowed(_), Cow::Borrowed(_), Cow::Borrowed(_))
            );
            let fin_classes = if unchanged {
                c
            } else {
                Classes::of(fin.as_bytes())
            };
            detect::run_all_classified(fin, fin_classes, scope, &mut |h| self.report(loc, h));
            if matches!(j, Cow::Owned(_)) {
                // backslashes may be path separators (UNC, Windows paths), not escapes
                detect::run_all(&h, scope, &mut |x| self.report(loc, x));
            }
            if let Some(u7) = decode::utf7_decode(fin) {
                detect::run_all(&u7, scope, &mut |h| self.report(loc, h));
            }
            // base64 tokens embedded in a structured value (serialized objects, JSON)
            if nest < MAX_NEST && self.findings.len() == findings_before && fin.len() >= 16 {
                self.embedded_base64(loc, fin, scope, nest);
            }
            // nested JSON in a string value
            let t = fin.trim();
            if nest < MAX_NEST && json_shaped(t) && self.findings.len() == findings_before {
                self.json(t.as_bytes(), loc, nest + 1);
            }
        } else if raw.len() >= 10
            && memchr::memchr(b' ', raw.as_bytes()).is_some()
            && (crate::util::find_ci_with(raw.as_bytes(), b"select", Some(&SELECT)).is_some()
                || numeric_clause(raw.as_bytes()))
        {
            detect::run_all_classified(raw, c, scope, &mut |h| self.report(loc, h));
        }
        if nest < MAX_NEST
            && raw.len() >= 12
            && !c.any(
                !(Classes::PLUS | Classes::SLASH | Classes::EQ | Classes::COMMENT | Classes::MISC),
            )
            && memchr::memchr(b' ', raw.as_bytes()).is_none()
        {
            if let Some(text) = decode::base64_text(raw) {
                let t = text.trim();
                // braces alone do not make JSON: `{{7*7}}` decoded from base64 is a
                // template, and the lenient JSON walk would skip it as garbage
                let json =
                    json_shaped(t) && serde_json::from_str::<serde::de::IgnoredAny>(t).is_ok();
                if json {
                    self.json(t.as_bytes(), loc, nest + 1);
                } else {
                    self.analyze(loc, &text, scope, nest + 1);
                }
            }
        }
    }

    /// Decodes base64 runs (16+ chars, at most 8 per value) found inside a value.
    fn embedded_base64(&mut self, loc: Loc<'_>, s: &str, scope: Scope, nest: u8) {
        let b = s.as_bytes();
        let is_b64 =
            |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=' | b'-' | b'_');
        let mut i = 0;
        let mut tried = 0;
        while i < b.len() && tried < 8 {
            if !is_b64(b[i]) {
                i += 1;
                continue;
            }
            let st = i;
            while i < b.len() && is_b64(b[i]) {
                i += 1;
            }
            if i - st >= 16 && (st > 0 || i < b.len()) {
                tried += 1;
                if let Some(text) = decode::base64_text(&s[st..i]) {
                    self.analyze(loc, &text, scope, nest + 1);
                }
            }
        }
    }

    /// Inspects a `?a=b&c=d` query string or urlencoded form. Names and values
    /// are decoded into two buffers reused across pairs (no per-pair allocation).
    pub fn urlencoded(&mut self, q: &[u8], form: bool) {
        let mut nbuf: Vec<u8> = Vec::new();
        let mut vbuf: Vec<u8> = Vec::new();
        // validated once: a name or value without escapes is then borrowed as text
        // without validating it again (`&` and `=` are ASCII: char boundaries)
        let whole = std::str::from_utf8(q).ok();
        let mut start = 0;
        while start <= q.len() {
            let end = find2(&q[start..], b'&', b'&')
                .map(|x| start + x)
                .unwrap_or(q.len());
            let pair = &q[start..end];
            let pair_at = start;
            start = end + 1;
            if pair.is_empty() {
                continue;
            }
            if self.stopped {
                return;
            }
            let (n, v, v_at) = match find2(pair, b'=', b'=') {
                Some(p) => (&pair[..p], &pair[p + 1..], pair_at + p + 1),
                None => (&pair[..0], pair, pair_at),
            };
            let n = text_of(n, pair_at, whole, &mut nbuf);
            let v = text_of(v, v_at, whole, &mut vbuf);
            if let Some(p) = self.patches {
                p.observe(&n, &v, &mut self.facts);
            }
            // The backend may read every other parameter in the encoding this one names
            // (charset.rs): one it cannot, the WAF cannot either.
            if n == crate::charset::FORM_FIELD && !crate::charset::form_field_readable(v.as_bytes())
            {
                let at = if form { Loc::Form(&n) } else { Loc::Query(&n) };
                self.limit(crate::Limit::Charset, at);
            }
            if form {
                self.name(Loc::FormName(&n), &n);
                self.field_value(Loc::Form(&n), &n, &v, false);
            } else {
                self.name(Loc::QueryName(&n), &n);
                self.value(Loc::Query(&n), &v, Scope::Value);
            }
        }
    }

    /// Feeds the query's parameters to the virtual patches only (the body
    /// phase: the head phase analysed them already).
    pub fn observe_query(&mut self, q: &[u8]) {
        let Some(p) = self.patches else {
            return;
        };
        let mut nbuf: Vec<u8> = Vec::new();
        let mut vbuf: Vec<u8> = Vec::new();
        for pair in q
            .split(|&c| c == b'&')
            .filter(|x| !x.is_empty())
            .take(self.lim.max_params)
        {
            let (n, v) = match memchr::memchr(b'=', pair) {
                Some(i) => (&pair[..i], &pair[i + 1..]),
                None => (&pair[..0], pair),
            };
            let n = lossy(decode_into(n, &mut nbuf)).into_owned();
            let v = lossy(decode_into(v, &mut vbuf));
            p.observe(&n, &v, &mut self.facts);
        }
    }

    /// Inspects the URL path: the whole decoded path and every segment.
    pub fn path(&mut self, raw: &[u8]) {
        let d = decode::url_decode_repeated(raw);
        let p = lossy(&d);
        if !self.count(Loc::Path) {
            return;
        }
        let c = Classes::of(p.as_bytes());
        if c.any(Classes::DOT | Classes::BACKSLASH | Classes::COLON) {
            if let Some(h) = traversal::traversal(&p) {
                self.report(Loc::Path, h);
            }
            if let Some(h) = traversal::path_normalisation(raw, &p) {
                self.report(Loc::Path, h);
            }
        }
        if c.any(Classes::CTRL | Classes::HIGH) {
            if let Some(h) = crlf::crlf(&p) {
                self.report(Loc::Path, h);
            }
        }
        if c.any(Classes::DOLLAR) && c.any(Classes::BRACE) {
            if let Some(h) = jndi::jndi(&p) {
                self.report(Loc::Path, h);
            }
        }
        // a tag whose attribute holds a URL is cut by its own slashes into segments
        // that are no tag on their own (`/<script/src=http://x.example/a.js>`):
        // the whole path is read as markup too
        if c.any(Classes::ANGLE) {
            if let Some(h) = xss::detect(&p, c) {
                self.report(Loc::Path, h);
            }
        }
        let last = moat_core::last_path_segment(&p);
        if !last.is_empty() {
            if let Some(h) = upload::double_extension(last) {
                self.report(Loc::Path, h);
            }
        }
        for (i, seg) in p.split('/').filter(|s| !s.is_empty()).enumerate().take(64) {
            let sc = Classes::of(seg.as_bytes());
            if sc.any(!(Classes::DOT | Classes::COMMENT | Classes::HIGH | Classes::MISC)) {
                self.analyze(Loc::PathSegment(i), seg, Scope::Header, 0);
            }
        }
        self.path_base64(&p);
    }

    /// Base64 in the path: an encoded payload containing `/` is cut into
    /// segments that do not decode on their own, and one without `+`/`=`
    /// (unpadded, URL-safe) has no trigger byte, so the per-segment analysis
    /// skips it. The trailing run of whole segments made only of base64
    /// characters is decoded as one value.
    fn path_base64(&mut self, p: &str) {
        let b = p.as_bytes();
        let is_b64 =
            |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=' | b'-' | b'_');
        let mut st = b.len();
        while st > 0 && is_b64(b[st - 1]) {
            st -= 1;
        }
        if st > 0 {
            // the run starts inside a segment: begin at the next whole segment
            match memchr::memchr(b'/', &b[st..]) {
                Some(x) => st += x,
                None => return,
            }
        }
        let run = p[st..].trim_start_matches('/');
        // one segment with `+` or `=` was already decoded by the per-segment analysis;
        // a shorter run than a value's (12, `base64_text` checks) is never decoded:
        // `/KGFsZXJ0KSgxKQ` is `(alert)(1)`, and a random id of 12 or more characters
        // decodes to printable text about once in ten thousand, and then to no attack
        let one_segment = memchr::memchr(b'/', run.as_bytes()).is_none();
        if one_segment && Classes::of(run.as_bytes()).any(Classes::PLUS | Classes::EQ) {
            return;
        }
        if let Some(text) = decode::base64_text(run) {
            self.analyze(Loc::Path, &text, Scope::Header, 1);
        }
    }

    /// Inspects a Cookie header.
    pub fn cookies(&mut self, h: &str) {
        for part in h.split(';') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (n, v) = part.split_once('=').unwrap_or(("", part));
            let v = decode::url_decode_once(v.as_bytes(), false);
            let v = lossy(&v);
            self.name(Loc::CookieName(n), n);
            self.value(Loc::Cookie(n), &v, Scope::Header);
        }
    }

    /// Inspects a header value (its bytes as received); URL-carrying headers also
    /// get their query split.
    pub fn header(&mut self, name: &str, raw: &[u8]) {
        if (name == "referer" || name == "origin") && memchr::memchr(b'?', raw).is_some() {
            let v = lossy(raw);
            if let Some(q) = v.find('?') {
                let (path, query) = (&v[..q], &v[q + 1..]);
                let query = query.split('#').next().unwrap_or(query);
                for pair in query.split('&') {
                    if self.stopped {
                        return;
                    }
                    let (n, val) = pair.split_once('=').unwrap_or(("", pair));
                    let val = decode::url_decode_once(val.as_bytes(), true);
                    let val = lossy(&val);
                    self.value(Loc::HeaderArg(name, n), &val, Scope::Header);
                }
                let d = decode::url_decode_repeated(path.as_bytes());
                let d = lossy(&d);
                if let Some(h) = traversal::traversal(&d) {
                    self.report(Loc::Header(name), h);
                }
                return;
            }
        }
        // a value this engine found clean before on this thread: counted, not
        // re-analysed (looked up by its bytes, before they are converted to text)
        if !self.stopped && clean_cache::seen(self.engine, name, raw) {
            self.count(Loc::Header(name));
            return;
        }
        let v = lossy(raw);
        let before = self.outcomes;
        if name == "user-agent" {
            if let Some(h) = scanner::scanner(&v) {
                self.report(Loc::Header(name), h);
            }
        }
        self.value(Loc::Header(name), &v, Scope::Header);
        if self.outcomes == before && !self.stopped {
            clean_cache::insert(self.engine, name, raw);
        }
    }

    /// Inspects a JSON document: every key and string value, with a depth limit.
    /// Returns false when the document is not JSON.
    pub fn json(&mut self, data: &[u8], base: Loc<'_>, nest: u8) -> bool {
        json_walk(self, data, base, nest)
    }

    /// Inspects an XML document: DOCTYPE/entities, text nodes and attribute values.
    pub fn xml(&mut self, data: &[u8]) {
        let s = lossy(data);
        if let Some(h) = deser::java_xml(&s) {
            self.report(Loc::Body, h);
        }
        if let Some(h) = xxe::xxe(&s) {
            self.report(Loc::Body, h);
        }
        let b = s.as_bytes();
        let mut i = 0;
        let mut stack: Vec<(usize, usize)> = Vec::new();
        while i < b.len() && !self.stopped {
            let Some(p) = memchr::memchr(b'<', &b[i..]) else {
                let text = s[i..].trim();
                if !text.is_empty() {
                    self.value(Loc::Body, text, Scope::Body);
                }
                break;
            };
            let lt = i + p;
            let text = s[i..lt].trim();
            if !text.is_empty() {
                let el = stack.last().map(|&(a, e)| &s[a..e]).unwrap_or("");
                let el = el.to_string();
                self.value(Loc::Xml(&el), text, Scope::Body);
            }
            if b[lt..].starts_with(b"<![CDATA[") {
                let st = lt + 9;
                let end = memchr::memmem::find(&b[st..], b"]]>")
                    .map(|x| st + x)
                    .unwrap_or(b.len());
                let el = stack
                    .last()
                    .map(|&(a, e)| s[a..e].to_string())
                    .unwrap_or_default();
                self.value(Loc::Xml(&el), &s[st..end], Scope::Body);
                i = (end + 3).min(b.len());
                continue;
            }
            if b[lt..].starts_with(b"<!--") {
                let end = memchr::memmem::find(&b[lt..], b"-->")
                    .map(|x| lt + x + 3)
                    .unwrap_or(b.len());
                i = end;
                continue;
            }
            let Some(gt) = memchr::memchr(b'>', &b[lt..]).map(|x| lt + x) else {
                break;
            };
            let tag = &s[lt + 1..gt];
            i = gt + 1;
            if tag.starts_with('?') || tag.starts_with('!') {
                continue;
            }
            if let Some(rest) = tag.strip_prefix('/') {
                let _ = rest;
                stack.pop();
                continue;
            }
            let self_closing = tag.ends_with('/');
            let name_end = tag
                .find(|c: char| c.is_whitespace() || c == '/')
                .unwrap_or(tag.len());
            let name_abs = (lt + 1, lt + 1 + name_end);
            // attributes
            let attrs = &tag[name_end..];
            let mut rest = attrs;
            while let Some(eq) = rest.find('=') {
                let an = rest[..eq].trim();
                let after = rest[eq + 1..].trim_start();
                let q = after.chars().next();
                let (val, next) = match q {
                    Some(c @ ('"' | '\'')) => {
                        let body = &after[1..];
                        match body.find(c) {
                            Some(e) => (&body[..e], &body[e + 1..]),
                            None => (body, ""),
                        }
                    }
                    _ => {
                        let e = after.find(char::is_whitespace).unwrap_or(after.len());
                        (&after[..e], &after[e..])
                    }
                };
                if !val.is_empty() {
                    let loc = format!("{}@{}", &s[name_abs.0..name_abs.1], an);
                    self.value(Loc::Xml(&loc), val, Scope::Body);
                }
                rest = next;
            }
            if !self_closing {
                if stack.len() >= self.lim.max_depth {
                    self.limit(crate::Limit::MaxJsonDepth, Loc::Body);
                    return;
                }
                stack.push(name_abs);
            }
        }
    }

    /// Inspects a multipart/form-data body.
    pub fn multipart(&mut self, data: &[u8], boundary: &str) {
        let delim = format!("--{boundary}");
        let d = delim.as_bytes();
        let mut pos = match memchr::memmem::find(data, d) {
            Some(p) => p + d.len(),
            None => return,
        };
        // RFC 2046 has parsers ignore the preamble and the epilogue, but a lenient one
        // that misses a delimiter reads them as a part: they are inspected as text.
        self.multipart_outside(&data[..pos - d.len()]);
        let finder = memchr::memmem::Finder::new(d);
        let mut parts = 0;
        while pos < data.len() && !self.stopped {
            if data[pos..].starts_with(b"--") {
                self.multipart_outside(&data[pos + 2..]);
                break;
            }
            let end = finder
                .find(&data[pos..])
                .map(|x| pos + x)
                .unwrap_or(data.len());
            let part = &data[pos..end];
            pos = end + d.len();
            parts += 1;
            if parts > self.lim.max_params {
                self.limit(crate::Limit::MaxParams, Loc::Body);
                return;
            }
            let part = part
                .strip_prefix(b"\r\n")
                .or_else(|| part.strip_prefix(b"\n"))
                .unwrap_or(part);
            let (head, body) = match memchr::memmem::find(part, b"\r\n\r\n") {
                Some(p) => (&part[..p], &part[p + 4..]),
                None => match memchr::memmem::find(part, b"\n\n") {
                    Some(p) => (&part[..p], &part[p + 2..]),
                    None => (part, &part[part.len()..]),
                },
            };
            let body = body
                .strip_suffix(b"\r\n")
                .or_else(|| body.strip_suffix(b"\n"))
                .unwrap_or(body);
            let head = lossy(head);
            let mut name = String::new();
            let mut filename: Option<String> = None;
            let mut ctype = String::new();
            for line in head.lines() {
                let l = line.to_ascii_lowercase();
                if l.starts_with("content-disposition:") {
                    name = disposition_param(line, "name").unwrap_or_default();
                    filename = disposition_param(line, "filename");
                } else if let Some(v) = l.strip_prefix("content-type:") {
                    ctype = v.trim().to_string();
                }
            }
            // A part read in its own `charset` (ASP.NET Core decodes a form section in
            // it): unreadable ones are the charset limit, UTF-16/32 ones are read
            // transcoded and as they are.
            let declared = crate::charset::declared(ctype.as_bytes()).map(crate::charset::of_label);
            if declared == Some(crate::charset::BodyText::Unreadable) {
                self.limit(crate::Limit::Charset, Loc::Multipart(&name));
                continue;
            }
            let transcoded = declared.and_then(|text| crate::charset::to_utf8(body, text));
            if let Some(t) = &transcoded {
                match &filename {
                    Some(_) => self.value(Loc::Multipart(&name), t, Scope::Body),
                    None => self.field_value(Loc::Multipart(&name), &name, t, false),
                }
            }
            if let Some(p) = self.patches {
                let v = if filename.is_none() {
                    lossy(&body[..body.len().min(4096)])
                } else {
                    std::borrow::Cow::Borrowed("")
                };
                p.observe(&name, &v, &mut self.facts);
            }
            match filename {
                Some(f) => {
                    if let Some(h) = upload::upload(&f, Some(body)) {
                        self.report(Loc::Filename(&name), h);
                    }
                    self.value(Loc::Filename(&name), &f, Scope::Header);
                    if ctype.starts_with("text/") || ctype.contains("json") || ctype.contains("xml")
                    {
                        let t = lossy(body);
                        self.value(Loc::Multipart(&name), &t, Scope::Body);
                    }
                }
                None => {
                    if name == crate::charset::FORM_FIELD
                        && !crate::charset::form_field_readable(body)
                    {
                        self.limit(crate::Limit::Charset, Loc::Multipart(&name));
                    }
                    self.name(Loc::Multipart(&name), &name);
                    let t = lossy(body);
                    self.field_value(Loc::Multipart(&name), &name, &t, false);
                }
            }
        }
    }

    /// Inspects a multipart preamble or epilogue (text outside the parts) as one value,
    /// unless it is only whitespace.
    fn multipart_outside(&mut self, text: &[u8]) {
        if text.iter().all(u8::is_ascii_whitespace) || self.stopped {
            return;
        }
        let t = lossy(text);
        self.value(Loc::Body, &t, Scope::Body);
    }
}

/// URL-decodes (`+` as space) into `buf` when needed; borrows `raw` otherwise.
fn decode_into<'a>(raw: &'a [u8], buf: &'a mut Vec<u8>) -> &'a [u8] {
    if find2(raw, b'%', b'+').is_none() {
        return raw;
    }
    decode::url_decode_into(raw, true, buf);
    buf
}

/// The decoded text of `raw`, which starts at `at` in a document whose text is
/// `whole` when it is valid UTF-8: borrowed from it when `raw` has no escape,
/// decoded into `buf` (and validated) otherwise.
fn text_of<'a>(
    raw: &'a [u8],
    at: usize,
    whole: Option<&'a str>,
    buf: &'a mut Vec<u8>,
) -> Cow<'a, str> {
    if find2(raw, b'%', b'+').is_none() {
        if let Some(t) = whole.and_then(|w| w.get(at..at + raw.len())) {
            return Cow::Borrowed(t);
        }
        return lossy(raw);
    }
    decode::url_decode_into(raw, true, buf);
    lossy(buf)
}

fn disposition_param(line: &str, key: &str) -> Option<String> {
    let lower = line.to_ascii_lowercase();
    let mut from = 0;
    while let Some(p) = lower[from..].find(key) {
        let at = from + p;
        from = at + key.len();
        let before = lower[..at].chars().last();
        if !matches!(before, Some(' ' | ';' | '\t')) {
            continue;
        }
        let rest = line[at + key.len()..].trim_start();
        let Some(rest) = rest.strip_prefix('=') else {
            continue;
        };
        let rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix('"') {
            return Some(r.split('"').next().unwrap_or(r).to_string());
        }
        return Some(rest.split(';').next().unwrap_or(rest).trim().to_string());
    }
    None
}

/// The bytes that end a JSON number, literal or stray token: one table load per
/// byte where eleven comparisons were.
static ENDS_JSON_TOKEN: [bool; 256] = {
    let mut t = [false; 256];
    let ends = b",}] \n\r\t:\"{[";
    let mut k = 0;
    while k < ends.len() {
        t[ends[k] as usize] = true;
        k += 1;
    }
    t
};

/// Iterative JSON walk (no recursion): keys and string values with their
/// JSON pointer, bounded depth.
fn json_walk(ins: &mut Inspector<'_>, data: &[u8], base: Loc<'_>, nest: u8) -> bool {
    // sized for common documents up front: growing both on the way in cost more
    // than the walk of a small document's structure
    let mut ptr = String::with_capacity(64);
    if let Loc::Json(p) = base {
        ptr.push_str(p);
    }
    // container stack: (is_object, ptr length before this container's key, array index)
    let mut stack: Vec<(bool, usize, usize)> = Vec::with_capacity(8);
    let mut i = 0;
    let b = data;
    let mut scratch = String::new();
    // validated once; string contents are then borrowed by index
    let whole = std::str::from_utf8(data).ok();
    let mut expect_key = false;
    let mut type_key = false;
    let ws = |b: &[u8], mut i: usize| {
        while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\r' | b'\n') {
            i += 1;
        }
        i
    };
    i = ws(b, i);
    if i >= b.len() || !(b[i] == b'{' || b[i] == b'[') {
        return false;
    }
    // Only `ins.count` stops the inspector during a walk, and the walk returns
    // when it does; so stopping is checked once here, not once per token.
    if ins.stopped {
        return true;
    }
    while i < b.len() {
        match b[i] {
            b' ' | b'\t' | b'\r' | b'\n' => i = ws(b, i + 1),
            b'{' | b'[' => {
                if stack.len() >= ins.lim.max_depth {
                    ins.limit(crate::Limit::MaxJsonDepth, Loc::Json(&ptr));
                    return true;
                }
                let obj = b[i] == b'{';
                stack.push((obj, ptr.len(), 0));
                expect_key = obj;
                if !obj {
                    ptr.push_str("/0");
                }
                i += 1;
            }
            b'}' | b']' => {
                if let Some((_, l, _)) = stack.pop() {
                    ptr.truncate(l);
                }
                expect_key = false;
                i += 1;
            }
            b',' => {
                if let Some(top) = stack.last_mut() {
                    ptr.truncate(top.1);
                    if top.0 {
                        expect_key = true;
                    } else {
                        top.2 += 1;
                        ptr.push('/');
                        push_decimal(&mut ptr, top.2);
                    }
                }
                i += 1;
            }
            b':' => {
                expect_key = false;
                i += 1;
            }
            b'"' => {
                let st = i + 1;
                // jump between quotes and backslashes instead of walking every byte
                let mut j = st;
                let mut esc = false;
                loop {
                    match find2(&b[j.min(b.len())..], b'"', b'\\') {
                        None => {
                            j = b.len();
                            break;
                        }
                        Some(k) => {
                            j += k;
                            if b[j] == b'"' {
                                break;
                            }
                            esc = true;
                            j += 2;
                            if j >= b.len() {
                                break;
                            }
                        }
                    }
                }
                let end = j.min(b.len());
                let rawstr = &b[st..end];
                i = (j + 1).min(b.len());
                let text: &str = if esc {
                    scratch.clear();
                    json_unescape_into(&lossy(rawstr), &mut scratch);
                    &scratch
                } else {
                    // `st` follows a quote and `end` is a quote or the end, so both are
                    // char boundaries of a valid document: no per-string validation
                    match whole.and_then(|w| w.get(st..end)) {
                        Some(t) => t,
                        None => match std::str::from_utf8(rawstr) {
                            Ok(t) => t,
                            Err(_) => {
                                scratch.clear();
                                scratch.push_str(&String::from_utf8_lossy(rawstr));
                                &scratch
                            }
                        },
                    }
                };
                if expect_key {
                    let key = text;
                    ptr.push('/');
                    // one class scan serves the pointer (`~` is MISC, `/` SLASH)
                    // and the name's detectors
                    let classes = Classes::of(key.as_bytes());
                    if !classes.any(Classes::MISC | Classes::SLASH)
                        || !key.bytes().any(|c| c == b'~' || c == b'/')
                    {
                        ptr.push_str(key);
                    } else {
                        for ch in key.chars() {
                            match ch {
                                '~' => ptr.push_str("~0"),
                                '/' => ptr.push_str("~1"),
                                c => ptr.push(c),
                            }
                        }
                    }
                    ins.name_classified(Loc::Json(&ptr), key, classes);
                    // the first byte rules out nearly every key before four comparisons
                    type_key = matches!(key.as_bytes().first(), Some(b'@' | b'$' | b'_'))
                        && matches!(key, "@type" | "$type" | "@class" | "__type");
                    expect_key = false;
                } else if nest == 0 && !ins.count(Loc::Json(&ptr)) {
                    return true;
                } else {
                    if type_key {
                        if let Some(h) = deser::type_tag(text) {
                            ins.report(Loc::Json(&ptr), h);
                        }
                        type_key = false;
                    }
                    if text.len() >= 80 && code_field(&ptr, text) {
                        let before = ins.code_ctx;
                        ins.code_ctx = true;
                        ins.analyze(Loc::Json(&ptr), text, Scope::Body, nest);
                        ins.code_ctx = before;
                    } else {
                        ins.analyze(Loc::Json(&ptr), text, Scope::Body, nest);
                    }
                }
            }
            _ => {
                // numbers, true/false/null, or garbage: skip a token
                let st = i;
                while i < b.len() && !ENDS_JSON_TOKEN[usize::from(b[i])] {
                    i += 1;
                }
                if i == st {
                    i += 1;
                }
            }
        }
    }
    true
}

/// Appends `n` in decimal without the formatting machinery (array indexes in pointers).
fn push_decimal(out: &mut String, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut k = digits.len();
    loop {
        k -= 1;
        digits[k] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[k..] {
        out.push(d as char);
    }
}

/// Decodes JSON string escapes (`\n \r \t \b \f`, `\uXXXX` with surrogate pairs;
/// any other escaped character stands for itself), appending to `out` (a buffer
/// reused across strings).
fn json_unescape_into(s: &str, out: &mut String) {
    // Hex digits are read from bytes: the four bytes after `\u` in hostile input need
    // not end on a char boundary, so slicing the `str` there would panic.
    fn hex4(d: &[u8]) -> Option<u32> {
        d.iter()
            .try_fold(0u32, |v, &c| Some(v << 4 | (c as char).to_digit(16)?))
    }
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 >= b.len() {
            let l = s[i..].chars().next().map(|c| c.len_utf8()).unwrap_or(1);
            out.push_str(&s[i..i + l]);
            i += l;
            continue;
        }
        match b[i + 1] {
            b'n' => out.push('\n'),
            b'r' => out.push('\r'),
            b't' => out.push('\t'),
            b'b' => out.push('\u{8}'),
            b'f' => out.push('\u{c}'),
            b'u' if i + 5 < b.len() => {
                if let Some(v) = hex4(&b[i + 2..i + 6]) {
                    let mut cp = v;
                    let mut adv = 6;
                    if (0xD800..0xDC00).contains(&v)
                        && i + 11 < b.len()
                        && &b[i + 6..i + 8] == b"\\u"
                    {
                        if let Some(lo) = hex4(&b[i + 8..i + 12]) {
                            if (0xDC00..0xE000).contains(&lo) {
                                cp = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
                                adv = 12;
                            }
                        }
                    }
                    out.push(char::from_u32(cp).unwrap_or('\u{FFFD}'));
                    i += adv;
                    continue;
                }
                out.push('u');
            }
            c => {
                let l = s[i + 1..].chars().next().map(|c| c.len_utf8()).unwrap_or(1);
                if c.is_ascii() {
                    out.push(c as char);
                } else {
                    out.push_str(&s[i + 1..i + 1 + l]);
                }
                i += 1 + l;
                continue;
            }
        }
        i += 2;
    }
}
