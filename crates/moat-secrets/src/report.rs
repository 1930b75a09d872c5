//! Reports in gitleaks' formats, so tools that read gitleaks' reports read moat's.
//!
//! [`ReportFinding`] is gitleaks' `report.Finding` JSON schema (v8.30: `RuleID`,
//! `Description`, `StartLine`, `EndLine`, `StartColumn`, `EndColumn`, `Match`,
//! `Secret`, `File`, `SymlinkFile`, `Commit`, `Entropy`, `Author`, `Email`, `Date`,
//! `Message`, `Tags`, `Fingerprint`), with gitleaks' field semantics:
//!
//! * lines are 1-based and count from the start of the fragment scanned (a file, or
//!   for git history the first added line of a diff hunk, numbered in the new file);
//! * columns are gitleaks' (`detect/location.go`): on the first line of a fragment
//!   the 1-based byte column of the match start (`StartColumn`) and of its last byte
//!   (`EndColumn`); on later lines both are measured from the newline that ends the
//!   previous line, one more than the plain 1-based byte column;
//! * `Match` is the regex match, `Secret` its secret group (for a secret found in
//!   decoded text, both decoded, located at the encoded text); `Entropy` the
//!   secret's Shannon entropy (float32);
//! * `Fingerprint` is `file:rule:line`, or `commit:file:rule:line` for history;
//! * `Date` is the author date in UTC, RFC 3339.
//!
//! Writers: [`write_json`], [`write_csv`], [`write_junit`], [`write_sarif`], and
//! [`write_template`] (a subset of Go's text/template). [`is_new`] is gitleaks'
//! baseline comparison and [`IgnoreList`] its `.gitleaksignore`.

use std::collections::HashSet;
use std::io::{self, Write};

use serde::{Deserialize, Serialize};

use crate::scanner::Finding;

pub mod template;
pub use template::TemplateError;

/// One finding in gitleaks' report schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct ReportFinding {
    /// The rule's id.
    #[serde(rename = "RuleID")]
    pub rule_id: String,
    /// The rule's description.
    #[serde(rename = "Description")]
    pub description: String,
    /// 1-based line of the match start (0 for a path-only rule).
    #[serde(rename = "StartLine")]
    pub start_line: usize,
    /// 1-based line of the match end.
    #[serde(rename = "EndLine")]
    pub end_line: usize,
    /// gitleaks' start column (see the module documentation).
    #[serde(rename = "StartColumn")]
    pub start_column: usize,
    /// gitleaks' end column (inclusive).
    #[serde(rename = "EndColumn")]
    pub end_column: usize,
    /// The source line(s) of the match as gitleaks cuts them (from the newline
    /// before the match to the one after it); not in JSON reports (as gitleaks'
    /// `json:"-"`), only for templates.
    #[serde(skip)]
    pub line: String,
    /// The regex match (redacted with `--redact`).
    #[serde(rename = "Match")]
    pub match_text: String,
    /// The secret (redacted with `--redact`).
    #[serde(rename = "Secret")]
    pub secret: String,
    /// The file (for history, its path in the commit).
    #[serde(rename = "File")]
    pub file: String,
    /// The symlink the file was reached through, when symlinks are followed.
    #[serde(rename = "SymlinkFile")]
    pub symlink_file: String,
    /// The commit, for history scans.
    #[serde(rename = "Commit")]
    pub commit: String,
    /// A link to the finding on a hosting platform (empty: omitted).
    #[serde(rename = "Link", skip_serializing_if = "String::is_empty")]
    pub link: String,
    /// Shannon entropy of the secret.
    #[serde(rename = "Entropy")]
    pub entropy: f32,
    /// The commit's author name.
    #[serde(rename = "Author")]
    pub author: String,
    /// The commit's author email.
    #[serde(rename = "Email")]
    pub email: String,
    /// The commit's author date, UTC, RFC 3339.
    #[serde(rename = "Date")]
    pub date: String,
    /// The commit message.
    #[serde(rename = "Message")]
    pub message: String,
    /// The rule's tags, then decoding tags (`decoded:base64`, `decode-depth:1`).
    #[serde(rename = "Tags", deserialize_with = "null_as_empty")]
    pub tags: Vec<String>,
    /// `file:rule:line` or `commit:file:rule:line` (what `.gitleaksignore` lists).
    #[serde(rename = "Fingerprint")]
    pub fingerprint: String,
}

/// gitleaks writes `"Tags": null` for rules without tags.
fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<String>>::deserialize(d)?.unwrap_or_default())
}

/// Commit metadata of a history finding.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitInfo {
    /// Full SHA.
    pub sha: String,
    /// Author name.
    pub author: String,
    /// Author email.
    pub email: String,
    /// Author date, UTC, RFC 3339.
    pub date: String,
    /// The full message.
    pub message: String,
}

/// Newline offsets of a payload, computed once for every finding in it.
#[derive(Debug)]
pub struct Lines {
    newlines: Vec<usize>,
}

impl Lines {
    /// Indexes the newlines of `data`.
    pub fn new(data: &[u8]) -> Lines {
        let mut newlines: Vec<usize> = memchr::memchr_iter(b'\n', data).collect();
        if newlines.is_empty() {
            // gitleaks counts a payload without newlines as one line ending at its end.
            newlines.push(data.len());
        }
        Lines { newlines }
    }

    /// gitleaks' location of `start..end`: 0-based start and end line indexes and
    /// its start and end columns.
    pub fn location(&self, start: usize, end: usize) -> (usize, usize, usize, usize) {
        // The line holding `start`: the first newline at or after it.
        let idx = self.newlines.partition_point(|&nl| nl <= start);
        let prev = |i: usize| if i == 0 { 0 } else { self.newlines[i - 1] };
        if idx == self.newlines.len() {
            // After the last newline: gitleaks' "last line without a newline" case.
            let p = prev(idx);
            return (idx, idx, start - p + 1, end.saturating_sub(p));
        }
        let start_col = start - prev(idx) + 1;
        // The line holding the last byte: the first newline at or after `end`.
        let eidx = self.newlines.partition_point(|&nl| nl < end);
        if eidx == self.newlines.len() {
            // Ends past the last newline: gitleaks keeps the start line's values.
            return (idx, idx, start_col, 0);
        }
        (idx, eidx, start_col, end - prev(eidx))
    }
}

impl Lines {
    /// gitleaks' `Line` of the match `start..end` (`detect/location.go`): from the
    /// newline before the match's line (the payload's start for its first line) to
    /// the newline ending the match's last line, at least to the match's end. A
    /// match after the last newline takes, as in gitleaks, everything from the
    /// payload's start to the end of its line.
    pub fn line_span(&self, data: &[u8], start: usize, end: usize) -> (usize, usize) {
        let prev = |i: usize| if i == 0 { 0 } else { self.newlines[i - 1] };
        let idx = self.newlines.partition_point(|&nl| nl <= start);
        let (from, to) = if idx == self.newlines.len() {
            let rest = data.get(end..).unwrap_or(&[]);
            let n = memchr::memchr2(b'\n', b'\r', rest).unwrap_or(rest.len());
            (0, end + n)
        } else {
            let eidx = self.newlines.partition_point(|&nl| nl < end);
            let to = self.newlines.get(eidx).unwrap_or(&self.newlines[idx]);
            (prev(idx), *to)
        };
        let to = to.max(end).min(data.len());
        (from.min(to), to)
    }
}

/// Where a payload came from.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    /// The file as reported (gitleaks' `File`; empty for stdin).
    pub file: &'a str,
    /// The symlink it was reached through, or empty.
    pub symlink: &'a str,
    /// Line number of the payload's first line: 1 for a file, the hunk's first
    /// new line for history.
    pub first_line: usize,
    /// The commit, for history.
    pub commit: Option<&'a CommitInfo>,
}

/// The span gitleaks locates a finding by: from the first newline its regex
/// matched before the trimmed match, over the trimmed length.
fn gitleaks_span(f: &Finding) -> (usize, usize) {
    (
        f.start.saturating_sub(f.leading_newlines),
        f.end.saturating_sub(f.leading_newlines),
    )
}

/// Builds the report entry of `f` found in `data` (whose newlines are `lines`),
/// with the rule's tags.
pub fn report_finding(
    f: &Finding,
    data: &[u8],
    lines: &Lines,
    origin: Origin<'_>,
    rule_tags: &[String],
) -> ReportFinding {
    let Origin {
        file,
        symlink,
        first_line,
        commit,
    } = origin;
    let mut tags: Vec<String> = rule_tags.to_vec();
    if let Some(d) = &f.decoded {
        tags.extend(d.tags());
    }
    let text = |s: usize, e: usize| {
        let (s, e) = (s.min(data.len()), e.min(data.len()));
        String::from_utf8_lossy(&data[s..e.max(s)]).into_owned()
    };
    let (ls, le) = gitleaks_span(f);
    let (start_line, end_line, start_column, end_column, match_text, secret) = if f.path_only {
        (0, 0, 0, 0, format!("file detected: {file}"), String::new())
    } else {
        let (sl, el, sc, ec) = lines.location(ls, le);
        // A secret found in decoded text is reported decoded, as gitleaks does; its
        // location is the encoded text it came from.
        let (m, sec) = match &f.decoded {
            Some(d) => (
                String::from_utf8_lossy(&d.matched).into_owned(),
                String::from_utf8_lossy(&d.secret).into_owned(),
            ),
            None => (text(f.start, f.end), text(f.secret_start, f.secret_end)),
        };
        (first_line + sl, first_line + el, sc, ec, m, sec)
    };
    let mut r = ReportFinding {
        rule_id: f.rule_id.to_string(),
        description: f.description.to_string(),
        start_line,
        end_line,
        start_column,
        end_column,
        match_text,
        secret,
        file: file.to_string(),
        symlink_file: symlink.to_string(),
        line: if f.path_only {
            String::new()
        } else {
            let (from, to) = lines.line_span(data, ls, le);
            text(from, to)
        },
        entropy: f.entropy as f32,
        tags,
        ..ReportFinding::default()
    };
    if let Some(c) = commit {
        r.commit = c.sha.clone();
        r.author = c.author.clone();
        r.email = c.email.clone();
        r.date = c.date.clone();
        r.message = c.message.clone();
    }
    r.fingerprint = r.fingerprint_value();
    r
}

impl ReportFinding {
    /// `file:rule:line` (no commit) or `commit:file:rule:line`.
    pub fn fingerprint_value(&self) -> String {
        if self.commit.is_empty() {
            self.global_fingerprint()
        } else {
            format!(
                "{}:{}:{}:{}",
                self.commit, self.file, self.rule_id, self.start_line
            )
        }
    }

    /// `file:rule:line`, which `.gitleaksignore` may list for any commit.
    pub fn global_fingerprint(&self) -> String {
        format!("{}:{}:{}", self.file, self.rule_id, self.start_line)
    }

    /// gitleaks' `--redact=PERCENT`: keeps the first `100 - percent`% of the
    /// secret followed by `...` (`REDACTED` at 100), in `Secret` and `Match`.
    pub fn redact(&mut self, percent: u32) {
        let masked = mask(&self.secret, percent);
        if !self.secret.is_empty() {
            self.match_text = self.match_text.replace(&self.secret, &masked);
        }
        self.secret = masked;
    }
}

fn mask(secret: &str, percent: u32) -> String {
    if percent >= 100 {
        return "REDACTED".to_string();
    }
    if secret.is_empty() {
        return String::new();
    }
    let keep = (secret.len() as f64 * f64::from(100 - percent) / 100.0).round_ties_even() as usize;
    let mut keep = keep.min(secret.len());
    while !secret.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}...", &secret[..keep])
}

/// gitleaks' baseline test: `f` is new unless an entry of `baseline` has the same
/// rule, description, position, file, commit metadata and entropy (and the same
/// match and secret when not redacting).
pub fn is_new(f: &ReportFinding, redacting: bool, baseline: &[ReportFinding]) -> bool {
    !baseline.iter().any(|b| {
        f.rule_id == b.rule_id
            && f.description == b.description
            && f.start_line == b.start_line
            && f.end_line == b.end_line
            && f.start_column == b.start_column
            && f.end_column == b.end_column
            && (redacting || (f.match_text == b.match_text && f.secret == b.secret))
            && f.file == b.file
            && f.commit == b.commit
            && f.author == b.author
            && f.email == b.email
            && f.date == b.date
            && f.message == b.message
            && f.entropy == b.entropy
    })
}

/// Fingerprints listed in `.gitleaksignore` files.
#[derive(Debug, Default)]
pub struct IgnoreList {
    entries: HashSet<String>,
}

impl IgnoreList {
    /// Adds the entries of one `.gitleaksignore` text: one fingerprint a line,
    /// `#` comments; backslashes in the file part become slashes. Returns the
    /// lines that are not fingerprints (they are ignored).
    pub fn add(&mut self, text: &str) -> Vec<String> {
        let mut invalid = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut parts: Vec<String> = line.split(':').map(str::to_string).collect();
            match parts.len() {
                3 => parts[0] = parts[0].replace('\\', "/"),
                4 => parts[1] = parts[1].replace('\\', "/"),
                _ => invalid.push(line.to_string()),
            }
            self.entries.insert(parts.join(":"));
        }
        invalid
    }

    /// True when the finding's global or commit fingerprint is listed.
    pub fn ignores(&self, f: &ReportFinding) -> bool {
        self.entries.contains(&f.global_fingerprint())
            || (!f.commit.is_empty() && self.entries.contains(&f.fingerprint_value()))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no entry was added.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// serde_json's output with Go's `encoding/json` string escaping (`<`, `>`, `&`,
/// U+2028 and U+2029 as `\u003c`..., Go's HTML-safe default) and float format, so
/// moat's reports are byte for byte what gitleaks writes for the same findings.
struct GoJson<F>(F);

/// Go's `encoding/json` text of a finite float: the shortest digits that read back
/// as the same value (`v`'s `Display`, at `v`'s own width, so a float32 entropy of 3
/// is `3`, not serde_json's `3.0`), in exponent form (`1e-7`, `1e+21`) only when
/// `small_or_large`, Go's test for values below 1e-6 or from 1e21.
fn write_go_float<W, T>(w: &mut W, v: T, small_or_large: bool) -> io::Result<()>
where
    W: ?Sized + Write,
    T: std::fmt::Display + std::fmt::LowerExp,
{
    if !small_or_large {
        return write!(w, "{v}");
    }
    // Rust writes `1e21` and `1e-7`; Go writes the exponent's sign always, and
    // encoding/json trims `e-07` to `e-7`, which is what Rust writes.
    let s = format!("{v:e}");
    match s.split_once('e') {
        Some((mantissa, exp)) if !exp.starts_with('-') => write!(w, "{mantissa}e+{exp}"),
        _ => w.write_all(s.as_bytes()),
    }
}

macro_rules! delegate {
    ($($name:ident),*) => {$(
        fn $name<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
            self.0.$name(w)
        }
    )*};
}

impl<F: serde_json::ser::Formatter> serde_json::ser::Formatter for GoJson<F> {
    delegate!(
        begin_array,
        end_array,
        end_array_value,
        begin_object,
        end_object,
        begin_object_value,
        end_object_value
    );

    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.0.begin_array_value(w, first)
    }

    fn write_f32<W: ?Sized + Write>(&mut self, w: &mut W, v: f32) -> io::Result<()> {
        let a = v.abs();
        write_go_float(w, v, a != 0.0 && !(1e-6..1e21).contains(&a))
    }

    fn write_f64<W: ?Sized + Write>(&mut self, w: &mut W, v: f64) -> io::Result<()> {
        let a = v.abs();
        write_go_float(w, v, a != 0.0 && !(1e-6..1e21).contains(&a))
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.0.begin_object_key(w, first)
    }

    fn write_string_fragment<W: ?Sized + Write>(&mut self, w: &mut W, s: &str) -> io::Result<()> {
        let mut last = 0;
        for (i, c) in s.char_indices() {
            let esc = match c {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            w.write_all(&s.as_bytes()[last..i])?;
            w.write_all(esc.as_bytes())?;
            last = i + c.len_utf8();
        }
        w.write_all(&s.as_bytes()[last..])
    }
}

/// `v` as Go's `json.MarshalIndent(v, "", indent)` writes it.
fn to_writer_indented<W: Write, T: Serialize>(out: &mut W, v: &T, indent: &[u8]) -> io::Result<()> {
    let fmt = GoJson(serde_json::ser::PrettyFormatter::with_indent(indent));
    let mut ser = serde_json::Serializer::with_formatter(&mut *out, fmt);
    v.serialize(&mut ser).map_err(io::Error::other)
}

/// `v` as Go's `json.Marshal` writes it (compact); empty if it cannot be written.
fn go_json<T: Serialize + ?Sized>(v: &T) -> String {
    let mut out = Vec::new();
    let mut ser =
        serde_json::Serializer::with_formatter(&mut out, GoJson(serde_json::ser::CompactFormatter));
    match v.serialize(&mut ser) {
        Ok(()) => String::from_utf8_lossy(&out).into_owned(),
        Err(_) => String::new(),
    }
}

/// gitleaks' JSON report: an array of findings, one-space indentation.
pub fn write_json(out: &mut impl Write, findings: &[ReportFinding]) -> io::Result<()> {
    to_writer_indented(out, &findings, b" ")?;
    writeln!(out)
}

/// Quotes a CSV field as Go's encoding/csv does.
fn csv_field(s: &str) -> String {
    let needs = !s.is_empty()
        && (s == "\\." || s.contains([',', '"', '\r', '\n']) || s.starts_with([' ', '\t']));
    if needs {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// gitleaks' CSV report (nothing at all when there is no finding).
pub fn write_csv(out: &mut impl Write, findings: &[ReportFinding]) -> io::Result<()> {
    let Some(first) = findings.first() else {
        return Ok(());
    };
    let mut header = vec![
        "RuleID",
        "Commit",
        "File",
        "SymlinkFile",
        "Secret",
        "Match",
        "StartLine",
        "EndLine",
        "StartColumn",
        "EndColumn",
        "Author",
        "Message",
        "Date",
        "Email",
        "Fingerprint",
        "Tags",
    ];
    let link = !first.link.is_empty();
    if link {
        header.push("Link");
    }
    writeln!(out, "{}", header.join(","))?;
    for f in findings {
        let mut row = vec![
            f.rule_id.clone(),
            f.commit.clone(),
            f.file.clone(),
            f.symlink_file.clone(),
            f.secret.clone(),
            f.match_text.clone(),
            f.start_line.to_string(),
            f.end_line.to_string(),
            f.start_column.to_string(),
            f.end_column.to_string(),
            f.author.clone(),
            f.message.clone(),
            f.date.clone(),
            f.email.clone(),
            f.fingerprint.clone(),
            f.tags.join(" "),
        ];
        if link {
            row.push(f.link.clone());
        }
        let row: Vec<String> = row.iter().map(|s| csv_field(s)).collect();
        writeln!(out, "{}", row.join(","))?;
    }
    Ok(())
}

fn xml_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            '"' => o.push_str("&#34;"),
            '\'' => o.push_str("&#39;"),
            '\n' => o.push_str("&#xA;"),
            '\r' => o.push_str("&#xD;"),
            '\t' => o.push_str("&#x9;"),
            c if (c as u32) < 0x20 => o.push('\u{FFFD}'),
            c => o.push(c),
        }
    }
    o
}

fn junit_message(f: &ReportFinding) -> String {
    if f.commit.is_empty() {
        format!(
            "{} has detected a secret in file {}, line {}.",
            f.rule_id, f.file, f.start_line
        )
    } else {
        format!(
            "{} has detected a secret in file {}, line {}, at commit {}.",
            f.rule_id, f.file, f.start_line, f.commit
        )
    }
}

/// gitleaks' JUnit report: one suite, one failed test case per finding.
pub fn write_junit(out: &mut impl Write, findings: &[ReportFinding]) -> io::Result<()> {
    writeln!(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>")?;
    writeln!(out, "<testsuites>")?;
    writeln!(
        out,
        "\t<testsuite failures=\"{n}\" name=\"moat\" tests=\"{n}\" time=\"\">",
        n = findings.len()
    )?;
    for f in findings {
        let mut data = Vec::new();
        to_writer_indented(&mut data, f, b"\t")?;
        let msg = xml_escape(&junit_message(f));
        writeln!(
            out,
            "\t\t<testcase classname=\"{}\" file=\"{}\" name=\"{msg}\" time=\"\">",
            xml_escape(&f.description),
            xml_escape(&f.file)
        )?;
        writeln!(
            out,
            "\t\t\t<failure message=\"{msg}\" type=\"{}\">{}</failure>",
            xml_escape(&f.description),
            xml_escape(&String::from_utf8_lossy(&data))
        )?;
        writeln!(out, "\t\t</testcase>")?;
    }
    writeln!(out, "\t</testsuite>")?;
    // no newline at the end, as Go's XML encoder
    write!(out, "</testsuites>")
}

/// The tool of a SARIF report.
#[derive(Debug, Clone)]
pub struct SarifTool<'a> {
    /// `tool.driver.name`.
    pub name: &'a str,
    /// `tool.driver.semanticVersion`.
    pub version: &'a str,
    /// Every rule of the ruleset, `(id, description)`, in the ruleset's order.
    pub rules: Vec<(String, String)>,
}

/// SARIF 2.1.0 as gitleaks writes it: every rule, and per result the location
/// (file or symlink, lines, columns, the secret as snippet), gitleaks'
/// `partialFingerprints` (commitSha, email, author, date, commitMessage) plus
/// moat's `fingerprint` (the `.gitleaksignore` form), and the tags.
pub fn write_sarif(
    out: &mut impl Write,
    tool: &SarifTool<'_>,
    findings: &[ReportFinding],
) -> io::Result<()> {
    let rules: Vec<serde_json::Value> = tool
        .rules
        .iter()
        .map(|(id, d)| serde_json::json!({"id": id, "shortDescription": {"text": d}}))
        .collect();
    let results: Vec<serde_json::Value> = findings
        .iter()
        .map(|f| {
            let text = if f.commit.is_empty() {
                format!("{} has detected secret for file {}.", f.rule_id, f.file)
            } else {
                format!(
                    "{} has detected secret for file {} at commit {}.",
                    f.rule_id, f.file, f.commit
                )
            };
            let uri = if f.symlink_file.is_empty() {
                &f.file
            } else {
                &f.symlink_file
            };
            serde_json::json!({
                "message": {"text": text},
                "ruleId": f.rule_id,
                "locations": [{
                    "physicalLocation": {
                        "artifactLocation": {"uri": uri},
                        "region": {
                            "startLine": f.start_line,
                            "startColumn": f.start_column,
                            "endLine": f.end_line,
                            "endColumn": f.end_column,
                            "snippet": {"text": f.secret},
                        }
                    }
                }],
                "partialFingerprints": {
                    "commitSha": f.commit,
                    "email": f.email,
                    "author": f.author,
                    "date": f.date,
                    "commitMessage": f.message,
                    "fingerprint": f.fingerprint,
                },
                "properties": {"tags": f.tags},
            })
        })
        .collect();
    let doc = serde_json::json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": tool.name,
                "semanticVersion": tool.version,
                "rules": rules,
            }},
            "results": results,
        }]
    });
    to_writer_indented(out, &doc, b" ")?;
    writeln!(out)
}

/// Renders a report template (Go's text/template with sprig's functions, as
/// gitleaks; the supported part of the language is listed in [`template`]).
pub fn write_template(
    out: &mut impl Write,
    template: &str,
    findings: &[ReportFinding],
) -> Result<(), TemplateError> {
    let text = template::render(template, findings)?;
    out.write_all(text.as_bytes())
        .map_err(|e| TemplateError(format!("cannot write: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_matches_gitleaks_location_go() {
        // First line: plain 1-based columns, EndColumn inclusive.
        let d = b"abc SECRET xyz\nline2 KEY=v\n";
        let l = Lines::new(d);
        assert_eq!(l.location(4, 10), (0, 0, 5, 10));
        // Later lines: measured from the newline before the line (one more).
        assert_eq!(l.location(21, 26), (1, 1, 8, 12));
        // No newline at all.
        let l = Lines::new(b"xx TOKEN");
        assert_eq!(l.location(3, 8), (0, 0, 4, 8));
        // Last line without a trailing newline.
        let d = b"a\nb TOKEN";
        let l = Lines::new(d);
        assert_eq!(l.location(4, 9), (1, 1, 4, 8));
    }

    #[test]
    fn redaction_is_gitleaks() {
        let mut f = ReportFinding {
            secret: "abcdefghij".into(),
            match_text: "key=abcdefghij".into(),
            ..Default::default()
        };
        f.redact(20);
        assert_eq!(f.secret, "abcdefgh...");
        assert_eq!(f.match_text, "key=abcdefgh...");
        let mut g = ReportFinding {
            secret: "abc".into(),
            match_text: "k=abc".into(),
            ..Default::default()
        };
        g.redact(100);
        assert_eq!(
            (g.secret.as_str(), g.match_text.as_str()),
            ("REDACTED", "k=REDACTED")
        );
        assert_eq!(mask("abcde", 50), "ab...", "2.5 rounds to even");
    }

    #[test]
    fn ignore_list_and_fingerprints() {
        let mut ig = IgnoreList::default();
        let bad = ig.add("# c\n\nsrc\\a.txt:rule:3\nabc123:b.txt:rule:7\nnonsense\n");
        assert_eq!(bad, ["nonsense"]);
        let mut f = ReportFinding {
            file: "src/a.txt".into(),
            rule_id: "rule".into(),
            start_line: 3,
            ..Default::default()
        };
        f.fingerprint = f.fingerprint_value();
        assert_eq!(f.fingerprint, "src/a.txt:rule:3");
        assert!(ig.ignores(&f));
        let mut g = ReportFinding {
            commit: "abc123".into(),
            file: "b.txt".into(),
            rule_id: "rule".into(),
            start_line: 7,
            ..Default::default()
        };
        g.fingerprint = g.fingerprint_value();
        assert_eq!(g.fingerprint, "abc123:b.txt:rule:7");
        assert!(ig.ignores(&g));
        g.commit = "other".into();
        assert!(!ig.ignores(&g));
    }

    /// Floats as Go's encoding/json writes them (float32 for `Entropy`): a whole
    /// entropy is `3` (gitleaks' reports for a base64 JWT hold `"Entropy": 3`),
    /// exponent form only below 1e-6 and from 1e21, with Go's signs.
    #[test]
    fn json_floats_are_go_encoding_json() {
        let entropy = |e: f32| {
            let f = ReportFinding {
                entropy: e,
                ..Default::default()
            };
            let mut out = Vec::new();
            write_json(&mut out, &[f]).unwrap();
            let s = String::from_utf8(out).unwrap();
            let at = s.find("\"Entropy\": ").unwrap() + 11;
            s[at..at + s[at..].find(',').unwrap()].to_string()
        };
        assert_eq!(entropy(3.0), "3");
        assert_eq!(entropy(0.0), "0");
        assert_eq!(entropy(3.846_439_4), "3.8464394");
        assert_eq!(entropy(4.5), "4.5");
        assert_eq!(entropy(1e-7), "1e-7");
        assert_eq!(entropy(2.5e-10), "2.5e-10");
        assert_eq!(entropy(1e21), "1e+21");
        assert_eq!(entropy(1e-6), "0.000001");
        let f64_text = |v: f64| go_json(&v);
        assert_eq!(f64_text(3.0), "3");
        assert_eq!(f64_text(-0.5), "-0.5");
        assert_eq!(f64_text(123_456_789.0), "123456789");
        assert_eq!(f64_text(1.5e300), "1.5e+300");
        assert_eq!(f64_text(-1e-7), "-1e-7");
    }

    #[test]
    fn json_schema_round_trips_and_reads_gitleaks_nulls() {
        let f = ReportFinding {
            rule_id: "r".into(),
            tags: vec!["t".into()],
            ..Default::default()
        };
        let mut buf = Vec::new();
        write_json(&mut buf, std::slice::from_ref(&f)).unwrap();
        let text = String::from_utf8(buf).unwrap();
        for key in [
            "RuleID",
            "Description",
            "StartLine",
            "EndLine",
            "StartColumn",
            "EndColumn",
            "Match",
            "Secret",
            "File",
            "SymlinkFile",
            "Commit",
            "Entropy",
            "Author",
            "Email",
            "Date",
            "Message",
            "Tags",
            "Fingerprint",
        ] {
            assert!(text.contains(&format!("\"{key}\":")), "{key} in {text}");
        }
        assert!(!text.contains("\"Link\""));
        let back: Vec<ReportFinding> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, [f]);
        let g: ReportFinding = serde_json::from_str("{\"RuleID\":\"x\",\"Tags\":null}").unwrap();
        assert!(g.tags.is_empty());
    }

    #[test]
    fn csv_quotes_as_go() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"x\""), "\"say \"\"x\"\"\"");
        assert_eq!(csv_field(" lead"), "\" lead\"");
        assert_eq!(csv_field("plain"), "plain");
        let mut buf = Vec::new();
        write_csv(&mut buf, &[]).unwrap();
        assert!(buf.is_empty());
    }

    #[test]
    fn templates() {
        let fs = vec![
            ReportFinding {
                rule_id: "a".into(),
                start_line: 1,
                ..Default::default()
            },
            ReportFinding {
                rule_id: "b".into(),
                start_line: 2,
                ..Default::default()
            },
        ];
        let mut out = Vec::new();
        write_template(
            &mut out,
            "n={{ len . }}\n{{- range . }}\n{{ .RuleID }}:{{ .StartLine }}{{ end }}\n",
            &fs,
        )
        .unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "n=2\na:1\nb:2\n");
        assert!(write_template(&mut Vec::new(), "{{ .Nope }}", &fs).is_err());
        assert!(write_template(&mut Vec::new(), "{{ range . }}{{ .Nope }}{{ end }}", &fs).is_err());
        assert!(write_template(&mut Vec::new(), "{{ if . }}", &fs).is_err());
        assert!(write_template(&mut Vec::new(), "{{ range . }}", &fs).is_err());
    }
}
