//! In-process corpus replay: the blazehttp request corpus and gotestwaf's
//! payloads and false-positive texts (as placed by gotestwaf's encoders and
//! placeholders), scored the way those tools score a WAF (blocked = the
//! engine would answer with its block status).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use base64::Engine as _;
use serde::Deserialize;

use crate::rawhttp::RawRequest;
use crate::{BodyView, WafEngine};

/// Counts for one category.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Tally {
    /// Attacks blocked.
    pub tp: u64,
    /// Attacks let through.
    pub fn_: u64,
    /// Normal requests let through.
    pub tn: u64,
    /// Normal requests blocked.
    pub fp: u64,
}

impl Tally {
    fn add(&mut self, attack: bool, blocked: bool) {
        match (attack, blocked) {
            (true, true) => self.tp += 1,
            (true, false) => self.fn_ += 1,
            (false, false) => self.tn += 1,
            (false, true) => self.fp += 1,
        }
    }
    /// Detection rate in percent (blocked attacks / attacks).
    pub fn detection(&self) -> f64 {
        pct(self.tp, self.tp + self.fn_)
    }
    /// False-positive rate in percent (blocked normal / normal).
    pub fn fp_rate(&self) -> f64 {
        pct(self.fp, self.fp + self.tn)
    }
    /// Accuracy in percent.
    pub fn accuracy(&self) -> f64 {
        pct(self.tp + self.tn, self.tp + self.tn + self.fp + self.fn_)
    }
}

fn pct(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 * 100.0 / b as f64
    }
}

/// One of the two fixed halves of a corpus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Half {
    /// The development half: tuning looks at its mistakes only.
    A,
    /// The held-back half: reported, never looked at while tuning.
    B,
}

impl std::str::FromStr for Half {
    type Err = String;
    fn from_str(s: &str) -> Result<Half, String> {
        match s {
            "A" | "a" => Ok(Half::A),
            "B" | "b" => Ok(Half::B),
            _ => Err(format!("`{s}`: expected A or B")),
        }
    }
}

/// Salt of the split: changing it re-deals every sample.
pub const SPLIT_SEED: &str = "moat-waf-split-1:";

/// The half a sample belongs to: FNV-1a (64-bit) of [`SPLIT_SEED`] followed by
/// the sample id; even hashes are half A. Ids: blazehttp's `id` field;
/// gotestwaf `<file path under testcases/>#<payload index>` (every encoder and
/// placeholder of one payload falls in the same half).
pub fn half_of(id: &str) -> Half {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in SPLIT_SEED.bytes().chain(id.bytes()) {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    if h.is_multiple_of(2) {
        Half::A
    } else {
        Half::B
    }
}

/// Result of replaying the blazehttp corpus.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct BlazeReport {
    /// All samples.
    pub total: Tally,
    /// Half A ([`half_of`]) - the development half.
    pub half_a: Tally,
    /// Half B - the held-back half.
    pub half_b: Tally,
    /// Per category (`attack:sqli`, `normal:GET no-body`, ...): half A, half B.
    pub by_category: BTreeMap<String, [Tally; 2]>,
    /// Samples that failed to parse.
    pub errors: u64,
    /// Misses and false positives of the selected half: (id, category, blocked, strongest finding or "-").
    pub mistakes: Vec<(String, String, bool, String)>,
    /// Normal requests that passed but carried monitor-level findings (tuning input).
    pub near_misses: Vec<(String, String, String)>,
}

#[derive(Deserialize)]
struct BlazeLine {
    id: String,
    label: String,
    raw_b64: String,
}

fn category(attack: bool, r: &RawRequest) -> String {
    if attack {
        let t = &r.target;
        let rest = match memchr::memmem::find(t, b"://") {
            Some(p) if t.first() != Some(&b'/') => {
                let x = &t[p + 3..];
                &x[x.iter().position(|&c| c == b'/').unwrap_or(x.len())..]
            }
            _ => &t[..],
        };
        if let Some(v) = rest.strip_prefix(b"/vulnerabilities/") {
            let name: String = v
                .iter()
                .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
                .map(|&c| c as char)
                .collect();
            if !name.is_empty() {
                return format!("attack:{name}");
            }
        }
        return "attack:other(non-DVWA)".into();
    }
    let fam = if r.body.is_empty() {
        "no-body".to_string()
    } else {
        match r.header("content-type") {
            None => "no-content-type".into(),
            Some(ct) => {
                let ct = String::from_utf8_lossy(ct).to_ascii_lowercase();
                if ct.contains("json") {
                    "json"
                } else if ct.contains("x-www-form-urlencoded") {
                    "form"
                } else if ct.contains("multipart/") {
                    "multipart"
                } else if ct.contains("xml") {
                    "xml"
                } else if ct.contains("protobuf") || ct.contains("grpc") {
                    "protobuf"
                } else if ct.trim_start().starts_with("text/") {
                    "text"
                } else {
                    "other"
                }
                .into()
            }
        }
    };
    format!("normal:{} {}", r.method, fam)
}

/// Runs one raw request through the engine; returns (blocked, strongest finding).
pub fn judge_raw(engine: &WafEngine, raw: &RawRequest) -> (bool, String) {
    let limits = moat_core::DecodeLimits {
        max_output: usize::try_from(engine.config().limits.max_decode_output).unwrap_or(usize::MAX),
        max_ratio: 100,
    };
    let view = raw.view();
    let (body, limit_err) = match raw.decoded_body(limits) {
        Ok(b) => (b, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    let max = usize::try_from(engine.config().limits.max_body_bytes).unwrap_or(usize::MAX);
    let truncated = body.len() > max;
    let data = &body[..body.len().min(max)];
    let mut f = engine.inspect("eval", &view, Some(BodyView { data, truncated }));
    if let Some(e) = limit_err {
        f.limits.push(crate::LimitHit::new(
            crate::Limit::of_decode_error(&e),
            "body",
        ));
    }
    let blocked = engine.would_block(&f);
    let desc = f
        .findings
        .first()
        .map(|x| {
            format!(
                "{} {} {} {:?}",
                x.attack, x.confidence, x.location, x.fragment
            )
        })
        .or_else(|| {
            f.limits
                .first()
                .map(|l| format!("limit {} {}", l.limit, l.location))
        })
        .unwrap_or_else(|| "-".into());
    (blocked, desc)
}

/// Replays `dev.jsonl.gz` (or a plain `.jsonl`). With `only`, samples of the
/// other half are skipped.
pub fn blaze(engine: &WafEngine, path: &Path, only: Option<Half>) -> std::io::Result<BlazeReport> {
    let file = std::fs::File::open(path)?;
    let reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let mut rep = BlazeReport::default();
    for line in BufReader::new(reader).lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let Ok(l) = serde_json::from_str::<BlazeLine>(&line) else {
            rep.errors += 1;
            continue;
        };
        let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(l.raw_b64.trim()) else {
            rep.errors += 1;
            continue;
        };
        let Ok(req) = RawRequest::parse(&raw) else {
            rep.errors += 1;
            continue;
        };
        let attack = l.label == "attack";
        let half = half_of(&l.id);
        if only.is_some_and(|h| h != half) {
            continue;
        }
        let (blocked, desc) = judge_raw(engine, &req);
        let cat = category(attack, &req);
        rep.total.add(attack, blocked);
        let hi = match half {
            Half::A => {
                rep.half_a.add(attack, blocked);
                0
            }
            Half::B => {
                rep.half_b.add(attack, blocked);
                1
            }
        };
        rep.by_category.entry(cat.clone()).or_default()[hi].add(attack, blocked);
        if attack != blocked {
            rep.mistakes.push((l.id, cat, blocked, desc));
        } else if !attack && desc != "-" {
            rep.near_misses.push((l.id, cat, desc));
        }
    }
    Ok(rep)
}

#[derive(Deserialize)]
struct GtwFile {
    payload: Vec<String>,
    encoder: Vec<String>,
    placeholder: Vec<serde_json::Value>,
    #[serde(rename = "type", default)]
    kind: String,
}

/// Result of replaying gotestwaf test cases.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GotestwafReport {
    /// Per test-case type and half (A, B): (blocked, total).
    pub by_type: BTreeMap<String, [(u64, u64); 2]>,
    /// False-positive texts per half (A, B): (blocked, total).
    pub false_pos: [(u64, u64); 2],
    /// Blocked false-positive texts and missed attacks (type, placeholder, encoder, payload, finding).
    pub mistakes: Vec<(String, String, String, String, String)>,
    /// Combinations skipped (placeholders moat does not model: gRPC).
    pub skipped: u64,
    /// Test-case files that could not be read as gotestwaf YAML, with the error:
    /// reported, never silently left out of the totals.
    pub unreadable: Vec<String>,
}

fn encode(enc: &str, p: &str) -> Option<String> {
    Some(match enc {
        "Plain" => p.to_string(),
        "URL" => percent_all(p),
        "Base64" => base64::engine::general_purpose::STANDARD.encode(p),
        "Base64Flat" => base64::engine::general_purpose::STANDARD_NO_PAD.encode(p),
        "JSUnicode" => p.encode_utf16().map(|u| format!("\\u{u:04x}")).collect(),
        "XMLEntity" => p.chars().map(|c| format!("&#x{:x};", c as u32)).collect(),
        _ => return None,
    })
}

fn percent_all(p: &str) -> String {
    let mut o = String::with_capacity(p.len() * 3);
    for b in p.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

fn json_escape(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// Builds the raw request gotestwaf sends for `placeholder` with `payload`.
fn place(ph: &serde_json::Value, payload: &str) -> Option<(String, RawRequest)> {
    let mk =
        |method: &str, target: String, headers: Vec<(&str, String)>, body: String| RawRequest {
            method: method.into(),
            target: target.into_bytes(),
            headers: headers
                .into_iter()
                .map(|(n, v)| (n.to_string(), v.into_bytes()))
                .collect(),
            body: body.into_bytes(),
        };
    let host = ("Host", "example.test".to_string());
    let ua = (
        "User-Agent",
        "Mozilla/5.0 (X11; Linux x86_64) gotestwaf-replay".to_string(),
    );
    if let Some(name) = ph.as_str() {
        let req = match name {
            "URLParam" => mk("GET", format!("/?p={}", query_escape(payload)), vec![host, ua], String::new()),
            "URLPath" => mk("GET", format!("/{}", path_escape(payload)), vec![host, ua], String::new()),
            "Header" => {
                if payload.contains(['\r', '\n']) {
                    return None;
                }
                mk("GET", "/".into(), vec![host, ua, ("X-Payload", payload.to_string())], String::new())
            }
            "UserAgent" => {
                if payload.contains(['\r', '\n']) {
                    return None;
                }
                mk("GET", "/".into(), vec![host, ("User-Agent", payload.to_string())], String::new())
            }
            "JSONRequest" => mk(
                "POST",
                "/".into(),
                vec![host, ua, ("Content-Type", "application/json".into())],
                format!("{{\"p\": {}}}", json_escape(payload)),
            ),
            "JSONBody" => mk("POST", "/".into(), vec![host, ua, ("Content-Type", "application/json".into())], payload.to_string()),
            "HTMLForm" => mk(
                "POST",
                "/".into(),
                vec![host, ua, ("Content-Type", "application/x-www-form-urlencoded".into())],
                format!("p={}", query_escape(payload)),
            ),
            "HTMLMultipartForm" => mk(
                "POST",
                "/".into(),
                vec![host, ua, ("Content-Type", "multipart/form-data; boundary=gtwboundary".into())],
                format!("--gtwboundary\r\nContent-Disposition: form-data; name=\"p\"\r\n\r\n{payload}\r\n--gtwboundary--\r\n"),
            ),
            "XMLBody" => mk("POST", "/".into(), vec![host, ua, ("Content-Type", "text/xml".into())], payload.to_string()),
            "SOAPBody" => mk(
                "POST",
                "/".into(),
                vec![host, ua, ("Content-Type", "text/xml".into()), ("SOAPAction", "urn:x".into())],
                format!("<?xml version=\"1.0\"?><soap:Envelope xmlns:soap=\"http://schemas.xmlsoap.org/soap/envelope/\"><soap:Body><p>{payload}</p></soap:Body></soap:Envelope>"),
            ),
            _ => return None,
        };
        return Some((name.to_string(), req));
    }
    let obj = ph.as_object()?;
    let (name, spec) = obj.iter().next()?;
    match name.as_str() {
        "GraphQL" => {
            let method = spec.get("method").and_then(|m| m.as_str()).unwrap_or("GET");
            let req = if method.eq_ignore_ascii_case("GET") {
                mk(
                    "GET",
                    format!("/graphql?query={}", query_escape(payload)),
                    vec![host, ua],
                    String::new(),
                )
            } else {
                mk(
                    "POST",
                    "/graphql".into(),
                    vec![host, ua, ("Content-Type", "application/json".into())],
                    payload.to_string(),
                )
            };
            Some((name.clone(), req))
        }
        "RawRequest" => {
            let method = spec.get("method").and_then(|m| m.as_str()).unwrap_or("GET");
            let path = spec
                .get("path")
                .and_then(|m| m.as_str())
                .unwrap_or("/")
                .replace("{{payload}}", payload);
            let body = spec
                .get("body")
                .and_then(|m| m.as_str())
                .unwrap_or("")
                .replace("{{payload}}", payload);
            let mut headers = vec![("Host".to_string(), b"example.test".to_vec())];
            let mut gzip = false;
            if let Some(h) = spec.get("headers").and_then(|h| h.as_object()) {
                for (k, v) in h {
                    let v = v.as_str().unwrap_or("").replace("{{payload}}", payload);
                    if k.eq_ignore_ascii_case("content-encoding") && v.contains("gzip") {
                        gzip = true;
                    }
                    headers.push((k.clone(), v.into_bytes()));
                }
            }
            let body = body.replace('\n', "\r\n").into_bytes();
            let body = if gzip {
                use std::io::Write;
                let mut e =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                let _ = e.write_all(&body);
                e.finish().unwrap_or_default()
            } else {
                body
            };
            Some((
                name.clone(),
                RawRequest {
                    method: method.into(),
                    target: path.into_bytes(),
                    headers,
                    body,
                },
            ))
        }
        _ => None,
    }
}

fn query_escape(p: &str) -> String {
    let mut o = String::with_capacity(p.len());
    for b in p.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            o.push(b as char);
        } else if b == b' ' {
            o.push('+');
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

fn path_escape(p: &str) -> String {
    let mut o = String::with_capacity(p.len());
    for b in p.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/!$&'()*+,;=:@".contains(&b) {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

/// Replays every gotestwaf test case under `dir` (recursively); files under
/// `false-pos/` are benign texts. With `only`, payloads of the other half are skipped.
pub fn gotestwaf(
    engine: &WafEngine,
    dir: &Path,
    only: Option<Half>,
) -> std::io::Result<GotestwafReport> {
    let mut rep = GotestwafReport::default();
    let mut files = Vec::new();
    collect_yml(dir, &mut files)?;
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f)?;
        // Test cases are data, not moat config: no `${VAR}` interpolation.
        let doc = match moat_config::from_str_verbatim::<GtwFile>(&f, &go_yaml_escapes(&text)) {
            Ok(doc) => doc,
            Err(e) => {
                rep.unreadable.push(e.to_string());
                continue;
            }
        };
        let benign = f.components().any(|c| c.as_os_str() == "false-pos");
        let rel = f
            .strip_prefix(dir)
            .unwrap_or(&f)
            .to_string_lossy()
            .replace('\\', "/");
        for (pi, payload) in doc.payload.iter().enumerate() {
            let half = half_of(&format!("{rel}#{pi}"));
            if only.is_some_and(|h| h != half) {
                continue;
            }
            let hi = usize::from(half == Half::B);
            for enc in &doc.encoder {
                let Some(encoded) = encode(enc, payload) else {
                    rep.skipped += 1;
                    continue;
                };
                for ph in &doc.placeholder {
                    let Some((phname, req)) = place(ph, &encoded) else {
                        rep.skipped += 1;
                        continue;
                    };
                    let (blocked, desc) = judge_raw(engine, &req);
                    if benign {
                        rep.false_pos[hi].1 += 1;
                        if blocked {
                            rep.false_pos[hi].0 += 1;
                        }
                    } else {
                        let e = &mut rep.by_type.entry(doc.kind.clone()).or_default()[hi];
                        e.1 += 1;
                        if blocked {
                            e.0 += 1;
                        }
                    }
                    if benign == blocked {
                        rep.mistakes.push((
                            if benign {
                                "false-pos".into()
                            } else {
                                doc.kind.clone()
                            },
                            phname,
                            enc.clone(),
                            payload.chars().take(100).collect(),
                            desc,
                        ));
                    }
                }
            }
        }
    }
    Ok(rep)
}

/// gotestwaf's files are read by Go's YAML parser, a port of libyaml, which
/// accepts `\'` in a double-quoted scalar as an escaped `'`; YAML 1.2 (and
/// this parser) does not. Rewritten on double-quoted list items only, where it
/// can only mean that.
fn go_yaml_escapes(text: &str) -> Cow<'_, str> {
    if !text.contains("\\'") {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        if !line.trim_start().starts_with("- \"") {
            out.push_str(line);
            continue;
        }
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            if c != '\\' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('\'') => out.push('\''),
                Some(next) => {
                    out.push('\\');
                    out.push(next);
                }
                None => out.push('\\'),
            }
        }
    }
    Cow::Owned(out)
}

fn collect_yml(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            collect_yml(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "yml" || x == "yaml") {
            out.push(p);
        }
    }
    Ok(())
}

/// Renders the blazehttp report as text tables (both halves per category).
pub fn render_blaze(r: &BlazeReport) -> String {
    let mut s = String::new();
    let row = |name: &str, t: &Tally| {
        format!(
            "{name:<28} {:>6} {:>6} {:>9.2}% {:>9.3}% {:>9.2}%\n",
            t.tp + t.fn_,
            t.tn + t.fp,
            t.detection(),
            t.fp_rate(),
            t.accuracy()
        )
    };
    s.push_str("blazehttp                    attack normal detection  false-pos  accuracy\n");
    s.push_str(&row("all", &r.total));
    s.push_str(&row("half A (develop)", &r.half_a));
    s.push_str(&row("half B (held back)", &r.half_b));
    s.push_str("\ncategory                          A: total blocked   B: total blocked\n");
    for (k, [a, b]) in &r.by_category {
        let n = |t: &Tally| t.tp + t.fn_ + t.tn + t.fp;
        s.push_str(&format!(
            "{k:<32} {:>9} {:>7}   {:>8} {:>7}\n",
            n(a),
            a.tp + a.fp,
            n(b),
            b.tp + b.fp
        ));
    }
    if r.errors > 0 {
        s.push_str(&format!("unparsable samples: {}\n", r.errors));
    }
    s
}

/// Renders the gotestwaf report as text (both halves per type).
pub fn render_gotestwaf(r: &GotestwafReport) -> String {
    let mut s = String::from(
        "gotestwaf type                  A: blocked/total   rate    B: blocked/total   rate\n",
    );
    let mut sum = [(0u64, 0u64); 2];
    let cell = |(b, t): (u64, u64)| format!("{b:>7}/{t:<7} {:>6.1}%", pct(b, t));
    for (k, halves) in &r.by_type {
        for i in 0..2 {
            sum[i].0 += halves[i].0;
            sum[i].1 += halves[i].1;
        }
        s.push_str(&format!(
            "{k:<30} {}    {}\n",
            cell(halves[0]),
            cell(halves[1])
        ));
    }
    s.push_str(&format!(
        "{:<30} {}    {}\n",
        "all attacks",
        cell(sum[0]),
        cell(sum[1])
    ));
    s.push_str(&format!(
        "{:<30} {}    {}  (blocked benign texts)\n",
        "false-pos texts",
        cell(r.false_pos[0]),
        cell(r.false_pos[1])
    ));
    if r.skipped > 0 {
        s.push_str(&format!(
            "skipped combinations (gRPC, CR/LF in headers): {}\n",
            r.skipped
        ));
    }
    for e in &r.unreadable {
        s.push_str(&format!("unreadable test-case file (not counted): {e}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn gotestwaf_files_read_as_go_reads_them() {
        let text = "payload:\n  - \"\\'-alert(1)//\"\n  - \"a\\\\'b\"\n  - \"${jndi:ldap://x}\"\nencoder:\n  - Plain\nplaceholder:\n  - URLParam\ntype: XSS\n";
        let doc: GtwFile =
            moat_config::from_str_verbatim(Path::new("t.yml"), &go_yaml_escapes(text)).unwrap();
        // `\'` is a quote; an escaped backslash before a quote stays one backslash
        assert_eq!(doc.payload, ["'-alert(1)//", "a\\'b", "${jndi:ldap://x}"]);
    }
}
