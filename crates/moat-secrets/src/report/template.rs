//! `--report-format template`: report templates in Go's text/template language, as
//! gitleaks renders them (`report/template.go`: text/template with sprig's functions
//! minus `env`, `expandenv` and `getHostByName`), over the findings.
//!
//! An interpreter of the part of the language report templates use, written here
//! rather than taken from a crate: the Rust implementations of text/template
//! (`gtmpl`, last released in 2021; `gotmpl`) have none of sprig's functions, which
//! gitleaks' own templates call (`quote`, `sub`, `now`, `date`), and a report
//! template needs few of the language's corners. Supported:
//!
//! * text, `{{/* comments */}}`, `{{-` and `-}}` whitespace trimming;
//! * `{{ pipeline }}`: commands joined by `|` (the previous result is the last
//!   argument); arguments are `.`, fields (`.File`, `.Tags`, `$f.RuleID`),
//!   variables, strings (`"..."` with Go escapes, `` `raw` ``), numbers, `true`,
//!   `false`, `nil` and `( pipelines )`;
//! * `{{ $x := pipeline }}`, `{{ $x = pipeline }}`, scoped as in Go;
//! * `{{ if }}`/`{{ else if }}`/`{{ else }}`/`{{ end }}`, `{{ range }}` (a list or
//!   an integer, `$i, $v :=`, `{{ else }}`, `{{ break }}`, `{{ continue }}`),
//!   `{{ with }}`/`{{ else with }}`/`{{ else }}`;
//! * Go's functions `and`, `or`, `not`, `len`, `index`, `print`, `printf`,
//!   `println`, `eq`, `ne`, `lt`, `le`, `gt`, `ge`, `html`, `js`, `urlquery`;
//! * sprig's `quote`, `squote`, `upper`, `lower`, `title`, `trim`, `trimPrefix`,
//!   `trimSuffix`, `trimAll`, `replace`, `contains`, `hasPrefix`, `hasSuffix`,
//!   `repeat`, `substr`, `trunc`, `abbrev`, `nospace`, `indent`, `nindent`, `cat`,
//!   `join`, `list`, `first`, `last`, `default`, `empty`, `coalesce`, `ternary`,
//!   `toString`, `toJson`, `b64enc`, `add`, `add1`, `sub`, `mul`, `div`, `mod`,
//!   `max`, `min`, `int`, `now`, `date`, `unixEpoch`.
//!
//! `printf` takes the verbs `%s %q %v %d %f %g %e %x %X %t %c %%` with flags,
//! width and precision. `date` takes Go's reference-time layouts (`2006-01-02
//! 15:04:05`, `Jan _2`, `Monday`, `MST`, `-07:00`, `.000`...); times are UTC. A
//! finding's fields are gitleaks' `report.Finding` fields, `Line` (the source
//! line of the match, as gitleaks cuts it) and `Link` included. Anything else (a
//! function or field not listed, `define`, `template`, `block`, method calls) is
//! an error naming the line, never silently empty output.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use super::ReportFinding;

/// A template error: what is wrong and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("template: {0}")]
pub struct TemplateError(pub String);

/// Nesting of blocks and parentheses a template may have (a bound on recursion).
const MAX_DEPTH: usize = 100;
/// The largest output a template may produce (`repeat` and ranges could otherwise
/// exhaust memory).
const MAX_OUTPUT: usize = 256 << 20;

/// Renders `template` over `findings` (gitleaks' `TemplateReporter`).
pub fn render(template: &str, findings: &[ReportFinding]) -> Result<String, TemplateError> {
    render_at(template, findings, Time::now())
}

/// [`render`] with `now` as the current time.
fn render_at(
    template: &str,
    findings: &[ReportFinding],
    now: Time,
) -> Result<String, TemplateError> {
    let nodes = Parser::new(template).parse()?;
    let top = Value::List(findings.iter().map(Value::Finding).collect());
    let mut ex = Exec {
        out: String::new(),
        vars: vec![("$".to_string(), top.clone())],
        now,
    };
    match ex.walk(&nodes, &top, 0)? {
        Flow::Normal => Ok(ex.out),
        Flow::Break | Flow::Continue => Err(TemplateError(
            "{{break}} or {{continue}} outside {{range}}".into(),
        )),
    }
}

// ---------------------------------------------------------------- syntax

#[derive(Debug, Clone)]
enum Node {
    Text(String),
    /// An action printing its pipeline (`decl`/assignment pipelines print nothing).
    Action(usize, Pipe),
    If(usize, Pipe, Vec<Node>, Vec<Node>),
    With(usize, Pipe, Vec<Node>, Vec<Node>),
    Range(usize, Pipe, Vec<Node>, Vec<Node>),
    Break,
    Continue,
}

#[derive(Debug, Clone)]
struct Pipe {
    /// Declared (`:=`) or assigned (`=`) variables.
    vars: Vec<String>,
    assign: bool,
    cmds: Vec<Vec<Arg>>,
}

#[derive(Debug, Clone)]
enum Arg {
    /// `.` then fields: `.`, `.File`, `.A.B`.
    Dot(Vec<String>),
    /// `$x` then fields.
    Var(String, Vec<String>),
    Func(String),
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Nil,
    /// `( pipeline )` then fields.
    Sub(Box<Pipe>, Vec<String>),
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Dot(Vec<String>),
    Var(String, Vec<String>),
    Ident(String),
    Str(String),
    Num(String),
    Pipe,
    Open,
    /// `)` then fields.
    Close(Vec<String>),
    Declare,
    Assign,
    Comma,
}

/// What ended a list of nodes.
enum Stop {
    Eof,
    End,
    Else(Option<(usize, String)>),
}

struct Parser<'t> {
    rest: &'t str,
    line: usize,
    trim_next: bool,
    depth: usize,
}

impl<'t> Parser<'t> {
    fn new(t: &'t str) -> Self {
        Parser {
            rest: t,
            line: 1,
            trim_next: false,
            depth: 0,
        }
    }

    fn err<T>(&self, line: usize, msg: impl std::fmt::Display) -> Result<T, TemplateError> {
        Err(TemplateError(format!("line {line}: {msg}")))
    }

    fn parse(mut self) -> Result<Vec<Node>, TemplateError> {
        let (nodes, end) = self.list()?;
        match end {
            Stop::Eof => Ok(nodes),
            Stop::End => self.err(self.line, "unexpected {{end}}"),
            Stop::Else(_) => self.err(self.line, "unexpected {{else}}"),
        }
    }

    /// Nodes up to `{{end}}`, `{{else ...}}` or the end of the text.
    fn list(&mut self) -> Result<(Vec<Node>, Stop), TemplateError> {
        let mut nodes = Vec::new();
        loop {
            let Some(action) = self.next_action(&mut nodes)? else {
                return Ok((nodes, Stop::Eof));
            };
            let line = self.line;
            let (word, rest) = split_word(action);
            match word {
                "end" if rest.is_empty() => return Ok((nodes, Stop::End)),
                "else" => {
                    let tail = (!rest.is_empty()).then(|| (line, rest.to_string()));
                    return Ok((nodes, Stop::Else(tail)));
                }
                "if" | "with" | "range" => {
                    let node = self.block(word, rest, line)?;
                    nodes.push(node);
                }
                "break" if rest.is_empty() => nodes.push(Node::Break),
                "continue" if rest.is_empty() => nodes.push(Node::Continue),
                "define" | "template" | "block" => {
                    return self.err(line, format!("{{{{{word}}}}} is not supported"))
                }
                _ => {
                    let pipe = self.pipe(action, line)?;
                    nodes.push(Node::Action(line, pipe));
                }
            }
            self.line += action.matches('\n').count();
        }
    }

    /// An `if`/`with`/`range` block whose pipeline text is `head`.
    fn block(&mut self, kind: &str, head: &str, line: usize) -> Result<Node, TemplateError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.err(line, "blocks nested too deep");
        }
        let pipe = self.pipe(head, line)?;
        self.line += head.matches('\n').count();
        let (body, end) = self.list()?;
        let other = match end {
            Stop::Eof => return self.err(line, format!("{{{{{kind}}}}} without {{{{end}}}}")),
            Stop::End => Vec::new(),
            Stop::Else(None) => match self.list()? {
                (e, Stop::End) => e,
                _ => {
                    return self.err(
                        line,
                        format!("{{{{{kind}}}}}...{{{{else}}}} without {{{{end}}}}"),
                    )
                }
            },
            // `{{else if ...}}` / `{{else with ...}}`: a block of its own that the
            // outer `{{end}}` closes.
            Stop::Else(Some((l, tail))) => {
                let (w, rest) = split_word(&tail);
                if kind == "range" || w != kind {
                    return self.err(l, format!("unexpected {{{{else {tail}}}}}"));
                }
                vec![self.block(w, rest, l)?]
            }
        };
        self.depth -= 1;
        Ok(match kind {
            "if" => Node::If(line, pipe, body, other),
            "with" => Node::With(line, pipe, body, other),
            _ => Node::Range(line, pipe, body, other),
        })
    }

    /// Moves past the next text and action: pushes the text, returns the action's
    /// inside (`None` at the end; comments are skipped).
    fn next_action(&mut self, nodes: &mut Vec<Node>) -> Result<Option<&'t str>, TemplateError> {
        loop {
            let open = self.rest.find("{{");
            let mut text = &self.rest[..open.unwrap_or(self.rest.len())];
            if self.trim_next {
                text = text.trim_start_matches(is_space);
            }
            let Some(open) = open else {
                self.push_text(nodes, text);
                self.rest = "";
                return Ok(None);
            };
            let mut inner = &self.rest[open + 2..];
            // `{{- ` trims the text before (the dash needs a space after it)
            if let Some(after) = inner.strip_prefix('-') {
                if after.starts_with(is_space) {
                    text = text.trim_end_matches(is_space);
                    inner = after;
                }
            }
            self.push_text(nodes, text);
            self.line += self.rest[..open].matches('\n').count();
            let body = inner.trim_start_matches(is_space);
            let close = if body.starts_with("/*") {
                match body.find("*/") {
                    Some(c) => body[c + 2..]
                        .find("}}")
                        .map(|x| (inner.len() - body.len()) + c + 2 + x),
                    None => None,
                }
            } else {
                find_close(inner)
            };
            let Some(close) = close else {
                return self.err(self.line, "unclosed action: `{{` without `}}`");
            };
            let mut action = &inner[..close];
            self.trim_next = false;
            if let Some(a) = action.strip_suffix('-') {
                if a.ends_with(is_space) {
                    action = a;
                    self.trim_next = true;
                }
            }
            self.rest = &inner[close + 2..];
            let action = action.trim_matches(is_space);
            if action.starts_with("/*") {
                if !action.ends_with("*/") {
                    return self.err(self.line, "comment ends before `*/`");
                }
                self.line += action.matches('\n').count();
                continue;
            }
            if action.is_empty() {
                return self.err(self.line, "missing value for command");
            }
            return Ok(Some(action));
        }
    }

    fn push_text(&self, nodes: &mut Vec<Node>, text: &str) {
        if !text.is_empty() {
            nodes.push(Node::Text(text.to_string()));
        }
    }

    fn pipe(&self, text: &str, line: usize) -> Result<Pipe, TemplateError> {
        let toks = lex(text).map_err(|e| TemplateError(format!("line {line}: {e}")))?;
        let mut pos = 0;
        let pipe = parse_pipe(&toks, &mut pos, line, 0)?;
        if pos != toks.len() {
            return self.err(line, format!("unexpected {:?} in `{text}`", toks[pos]));
        }
        Ok(pipe)
    }
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn split_word(s: &str) -> (&str, &str) {
    match s.find(is_space) {
        Some(i) => (&s[..i], s[i..].trim_matches(is_space)),
        None => (s, ""),
    }
}

/// The offset of the `}}` closing an action, skipping quoted strings.
fn find_close(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'`' => {
                i += 1;
                while i < b.len() && b[i] != b'`' {
                    i += 1;
                }
            }
            b'}' if b.get(i + 1) == Some(&b'}') => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

fn lex(s: &str) -> Result<Vec<Tok>, String> {
    let b = s.as_bytes();
    let mut toks = Vec::new();
    let mut i = 0;
    let ident_end = |mut j: usize| {
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
            j += 1;
        }
        j
    };
    // `.A.B` field chain starting at `j` (on a `.`): the names and the end
    let fields = |mut j: usize| -> (Vec<String>, usize) {
        let mut names = Vec::new();
        while j < b.len() && b[j] == b'.' {
            let e = ident_end(j + 1);
            if e == j + 1 {
                break;
            }
            names.push(s[j + 1..e].to_string());
            j = e;
        }
        (names, j)
    };
    while i < b.len() {
        let c = b[i];
        match c {
            b' ' | b'\t' | b'\r' | b'\n' => i += 1,
            b'|' => {
                toks.push(Tok::Pipe);
                i += 1;
            }
            b'(' => {
                toks.push(Tok::Open);
                i += 1;
            }
            b')' => {
                let (f, e) = fields(i + 1);
                toks.push(Tok::Close(f));
                i = e;
            }
            b',' => {
                toks.push(Tok::Comma);
                i += 1;
            }
            b':' if b.get(i + 1) == Some(&b'=') => {
                toks.push(Tok::Declare);
                i += 2;
            }
            b'=' => {
                toks.push(Tok::Assign);
                i += 1;
            }
            b'.' if !b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                let (f, e) = fields(i);
                if e == i {
                    toks.push(Tok::Dot(Vec::new()));
                    i += 1;
                } else {
                    toks.push(Tok::Dot(f));
                    i = e;
                }
            }
            b'$' => {
                let e = ident_end(i + 1);
                let (f, e2) = fields(e);
                toks.push(Tok::Var(s[i..e].to_string(), f));
                i = e2;
            }
            b'"' => {
                let mut j = i + 1;
                let mut out = String::new();
                loop {
                    let Some(&ch) = b.get(j) else {
                        return Err("unterminated string".into());
                    };
                    match ch {
                        b'"' => break,
                        b'\\' => {
                            let (decoded, used) = unescape(&s[j..])?;
                            out.push_str(&decoded);
                            j += used;
                        }
                        _ => {
                            let ch = s[j..].chars().next().unwrap_or('\u{fffd}');
                            out.push(ch);
                            j += ch.len_utf8();
                        }
                    }
                }
                toks.push(Tok::Str(out));
                i = j + 1;
            }
            b'`' => {
                let Some(e) = s[i + 1..].find('`') else {
                    return Err("unterminated raw string".into());
                };
                toks.push(Tok::Str(s[i + 1..i + 1 + e].to_string()));
                i += e + 2;
            }
            b'-' | b'+' | b'0'..=b'9' | b'.' => {
                let mut j = i + 1;
                while j < b.len() && (b[j].is_ascii_alphanumeric() || matches!(b[j], b'.' | b'_')) {
                    j += 1;
                }
                toks.push(Tok::Num(s[i..j].to_string()));
                i = j;
            }
            b'\'' => {
                let rest = &s[i + 1..];
                let (ch, used) = if rest.starts_with('\\') {
                    let (d, u) = unescape(rest)?;
                    (d, u)
                } else {
                    let ch = rest.chars().next().ok_or("unterminated character")?;
                    (ch.to_string(), ch.len_utf8())
                };
                if s.as_bytes().get(i + 1 + used) != Some(&b'\'') {
                    return Err("unterminated character constant".into());
                }
                let code = ch.chars().next().map(|c| c as i64).unwrap_or(0);
                toks.push(Tok::Num(code.to_string()));
                i += used + 2;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let e = ident_end(i);
                toks.push(Tok::Ident(s[i..e].to_string()));
                i = e;
            }
            _ => {
                let ch = s[i..].chars().next().unwrap_or('?');
                return Err(format!("unexpected `{ch}`"));
            }
        }
    }
    Ok(toks)
}

/// A Go escape sequence at the start of `s` (on the backslash): the text and the
/// bytes it used.
fn unescape(s: &str) -> Result<(String, usize), String> {
    let b = s.as_bytes();
    let simple = |c: char| Ok((c.to_string(), 2));
    match b.get(1) {
        Some(b'n') => simple('\n'),
        Some(b't') => simple('\t'),
        Some(b'r') => simple('\r'),
        Some(b'a') => simple('\u{7}'),
        Some(b'b') => simple('\u{8}'),
        Some(b'f') => simple('\u{c}'),
        Some(b'v') => simple('\u{b}'),
        Some(b'\\') => simple('\\'),
        Some(b'"') => simple('"'),
        Some(b'\'') => simple('\''),
        Some(&k @ (b'x' | b'u' | b'U')) => {
            let n = match k {
                b'x' => 2,
                b'u' => 4,
                _ => 8,
            };
            let hex = s.get(2..2 + n).ok_or("short escape")?;
            let v = u32::from_str_radix(hex, 16).map_err(|_| format!("bad escape \\{hex}"))?;
            let c = char::from_u32(v).ok_or_else(|| format!("bad escape \\{hex}"))?;
            Ok((c.to_string(), 2 + n))
        }
        _ => Err("unknown escape sequence".into()),
    }
}

fn parse_pipe(
    toks: &[Tok],
    pos: &mut usize,
    line: usize,
    depth: usize,
) -> Result<Pipe, TemplateError> {
    let err = |m: String| Err(TemplateError(format!("line {line}: {m}")));
    if depth > MAX_DEPTH {
        return err("parentheses nested too deep".into());
    }
    let mut pipe = Pipe {
        vars: Vec::new(),
        assign: false,
        cmds: Vec::new(),
    };
    // `$a :=`, `$a, $b :=`, `$a =`
    let mut look = *pos;
    let mut names = Vec::new();
    while let Some(Tok::Var(n, f)) = toks.get(look) {
        if !f.is_empty() {
            break;
        }
        names.push(n.clone());
        look += 1;
        match toks.get(look) {
            Some(Tok::Comma) if names.len() < 2 => look += 1,
            Some(Tok::Declare) | Some(Tok::Assign) => {
                pipe.assign = toks.get(look) == Some(&Tok::Assign);
                pipe.vars = std::mem::take(&mut names);
                *pos = look + 1;
                break;
            }
            _ => break,
        }
    }
    let mut cmd = Vec::new();
    loop {
        match toks.get(*pos) {
            None | Some(Tok::Close(_)) => break,
            Some(Tok::Pipe) => {
                if cmd.is_empty() {
                    return err("missing command before `|`".into());
                }
                pipe.cmds.push(std::mem::take(&mut cmd));
                *pos += 1;
            }
            Some(Tok::Open) => {
                *pos += 1;
                let inner = parse_pipe(toks, pos, line, depth + 1)?;
                let Some(Tok::Close(f)) = toks.get(*pos) else {
                    return err("unclosed `(`".into());
                };
                cmd.push(Arg::Sub(Box::new(inner), f.clone()));
                *pos += 1;
            }
            Some(t) => {
                cmd.push(match t {
                    Tok::Dot(f) => Arg::Dot(f.clone()),
                    Tok::Var(n, f) => Arg::Var(n.clone(), f.clone()),
                    Tok::Str(s) => Arg::Str(s.clone()),
                    Tok::Num(n) => {
                        parse_number(n).map_err(|e| TemplateError(format!("line {line}: {e}")))?
                    }
                    Tok::Ident(w) => match w.as_str() {
                        "true" => Arg::Bool(true),
                        "false" => Arg::Bool(false),
                        "nil" => Arg::Nil,
                        _ => Arg::Func(w.clone()),
                    },
                    other => return err(format!("unexpected {other:?}")),
                });
                *pos += 1;
            }
        }
    }
    if cmd.is_empty() {
        return err("missing value for command".into());
    }
    pipe.cmds.push(cmd);
    Ok(pipe)
}

fn parse_number(n: &str) -> Result<Arg, String> {
    let clean = n.replace('_', "");
    let (neg, digits) = match clean.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, clean.strip_prefix('+').unwrap_or(&clean)),
    };
    let int = if let Some(h) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        i64::from_str_radix(h, 16).ok()
    } else if let Some(o) = digits.strip_prefix("0o") {
        i64::from_str_radix(o, 8).ok()
    } else if let Some(bn) = digits.strip_prefix("0b") {
        i64::from_str_radix(bn, 2).ok()
    } else {
        digits.parse::<i64>().ok()
    };
    match (int, clean.parse::<f64>()) {
        (Some(v), _) => Ok(Arg::Int(if neg { -v } else { v })),
        (None, Ok(f)) if f.is_finite() => Ok(Arg::Float(f)),
        _ => Err(format!("bad number `{n}`")),
    }
}

// ---------------------------------------------------------------- values

#[derive(Debug, Clone)]
enum Value<'a> {
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// gitleaks' `Entropy` is a float32 (printed with float32 precision).
    Float32(f32),
    Str(String),
    List(Vec<Value<'a>>),
    Finding(&'a ReportFinding),
    Time(Time),
}

impl Value<'_> {
    fn truth(&self) -> bool {
        match self {
            Value::Nil => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::Float(f) => *f != 0.0,
            Value::Float32(f) => *f != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::List(l) => !l.is_empty(),
            Value::Finding(_) | Value::Time(_) => true,
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            Value::Nil => "nil",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float64",
            Value::Float32(_) => "float32",
            Value::Str(_) => "string",
            Value::List(_) => "slice",
            Value::Finding(_) => "report.Finding",
            Value::Time(_) => "time.Time",
        }
    }

    /// fmt's `%v`.
    fn print(&self, out: &mut String) {
        match self {
            Value::Nil => out.push_str("<nil>"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Value::Float(f) => out.push_str(&go_g(*f, None, false)),
            Value::Float32(f) => out.push_str(&go_g32(*f)),
            Value::Str(s) => out.push_str(s),
            Value::List(l) => {
                out.push('[');
                for (i, v) in l.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    v.print(out);
                }
                out.push(']');
            }
            Value::Finding(f) => {
                let _ = write!(out, "{{{} {}:{}}}", f.rule_id, f.file, f.start_line);
            }
            Value::Time(t) => out.push_str(&t.format("2006-01-02 15:04:05.999999999 -0700 MST")),
        }
    }

    fn to_text(&self) -> String {
        let mut s = String::new();
        self.print(&mut s);
        s
    }

    /// sprig's `toInt64` (strings are parsed, anything else is 0).
    fn int(&self) -> i64 {
        match self {
            Value::Int(i) => *i,
            Value::Float(f) => *f as i64,
            Value::Float32(f) => *f as i64,
            Value::Bool(b) => i64::from(*b),
            Value::Str(s) => s
                .trim()
                .parse::<i64>()
                .or_else(|_| s.trim().parse::<f64>().map(|f| f as i64))
                .unwrap_or(0),
            Value::Time(t) => t.secs,
            _ => 0,
        }
    }
}

/// A field of a finding, by its `report.Finding` name.
fn finding_field<'a>(f: &'a ReportFinding, name: &str) -> Result<Value<'a>, String> {
    {
        let s = |v: &str| Value::Str(v.to_string());
        let n = |v: usize| Value::Int(i64::try_from(v).unwrap_or(i64::MAX));
        Ok(match name {
            "RuleID" => s(&f.rule_id),
            "Description" => s(&f.description),
            "StartLine" => n(f.start_line),
            "EndLine" => n(f.end_line),
            "StartColumn" => n(f.start_column),
            "EndColumn" => n(f.end_column),
            "Line" => s(&f.line),
            "Match" => s(&f.match_text),
            "Secret" => s(&f.secret),
            "File" => s(&f.file),
            "SymlinkFile" => s(&f.symlink_file),
            "Commit" => s(&f.commit),
            "Link" => s(&f.link),
            "Entropy" => Value::Float32(f.entropy),
            "Author" => s(&f.author),
            "Email" => s(&f.email),
            "Date" => s(&f.date),
            "Message" => s(&f.message),
            "Tags" => Value::List(f.tags.iter().map(|t| s(t)).collect()),
            "Fingerprint" => s(&f.fingerprint),
            _ => {
                return Err(format!(
                    "can't evaluate field {name} in type report.Finding"
                ))
            }
        })
    }
}

/// Go's `%g` / `%v` of a float64 (shortest representation, exponent form outside
/// 1e-4..1e6, as strconv's shortest `g`), or with a precision.
fn go_g(f: f64, prec: Option<usize>, upper: bool) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    let exp_form = |s: String| -> String {
        // Rust `1.5e-7` -> Go `1.5e-07`
        match s.split_once('e') {
            Some((m, e)) => {
                let (sign, digits) = match e.strip_prefix('-') {
                    Some(d) => ('-', d),
                    None => ('+', e),
                };
                let e = if digits.len() < 2 {
                    format!("0{digits}")
                } else {
                    digits.to_string()
                };
                let r = format!("{m}e{sign}{e}");
                if upper {
                    r.to_uppercase()
                } else {
                    r
                }
            }
            None => s,
        }
    };
    match prec {
        None => {
            let exp = if f == 0.0 {
                0
            } else {
                f.abs().log10().floor() as i32
            };
            if (-4..6).contains(&exp) {
                format!("{f}")
            } else {
                exp_form(format!("{f:e}"))
            }
        }
        Some(p) => {
            let p = p.max(1);
            let exp = if f == 0.0 {
                0
            } else {
                format!("{f:.*e}", p - 1)
                    .split_once('e')
                    .and_then(|(_, e)| e.parse::<i32>().ok())
                    .unwrap_or(0)
            };
            if exp < -4 || exp >= p as i32 {
                let s = format!("{f:.*e}", p - 1);
                let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
                let m = if m.contains('.') {
                    m.trim_end_matches('0').trim_end_matches('.')
                } else {
                    m
                };
                exp_form(format!("{m}e{e}"))
            } else {
                let decimals = usize::try_from(p as i32 - 1 - exp).unwrap_or(0);
                let s = format!("{f:.decimals$}");
                if s.contains('.') {
                    s.trim_end_matches('0').trim_end_matches('.').to_string()
                } else {
                    s
                }
            }
        }
    }
}

/// Go's `%v` of a float32: the shortest text that reads back as the same float32.
fn go_g32(f: f32) -> String {
    let exp = if f == 0.0 {
        0
    } else {
        f64::from(f).abs().log10().floor() as i32
    };
    if (-4..6).contains(&exp) || !f.is_finite() {
        if f.is_finite() {
            format!("{f}")
        } else {
            go_g(f64::from(f), None, false)
        }
    } else {
        let s = format!("{f:e}");
        go_g(s.parse::<f64>().unwrap_or(0.0), None, false)
    }
}

/// A UTC instant.
#[derive(Debug, Clone, Copy)]
struct Time {
    secs: i64,
    nanos: u32,
}

impl Time {
    fn now() -> Time {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Time {
            secs: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nanos: d.subsec_nanos(),
        }
    }

    /// Formats with a Go reference-time layout (`Mon Jan 2 15:04:05 MST 2006`).
    fn format(&self, layout: &str) -> String {
        const MONTHS: [&str; 12] = [
            "January",
            "February",
            "March",
            "April",
            "May",
            "June",
            "July",
            "August",
            "September",
            "October",
            "November",
            "December",
        ];
        const DAYS: [&str; 7] = [
            "Sunday",
            "Monday",
            "Tuesday",
            "Wednesday",
            "Thursday",
            "Friday",
            "Saturday",
        ];
        let days = self.secs.div_euclid(86_400);
        let sod = self.secs.rem_euclid(86_400);
        let (y, m, d) = civil(days);
        let (hh, mm, ss) = (sod / 3600, sod / 60 % 60, sod % 60);
        let wd = usize::try_from((days + 4).rem_euclid(7)).unwrap_or(0);
        let month = MONTHS[usize::try_from(m - 1).unwrap_or(0)];
        let h12 = if hh % 12 == 0 { 12 } else { hh % 12 };
        // longest tokens first, so `2006` wins over `2` and `January` over `Jan`
        let tokens: [(&str, String); 27] = [
            ("January", month.to_string()),
            ("Monday", DAYS[wd].to_string()),
            ("Z07:00", "Z".into()),
            ("-07:00", "+00:00".into()),
            ("Z0700", "Z".into()),
            ("-0700", "+0000".into()),
            ("2006", format!("{y:04}")),
            ("Jan", month[..3].to_string()),
            ("Mon", DAYS[wd][..3].to_string()),
            ("MST", "UTC".into()),
            ("Z07", "Z".into()),
            ("-07", "+00".into()),
            ("002", format!("{:03}", day_of_year(y, m, d))),
            ("_2", format!("{d:>2}")),
            ("01", format!("{m:02}")),
            ("02", format!("{d:02}")),
            ("03", format!("{h12:02}")),
            ("04", format!("{mm:02}")),
            ("05", format!("{ss:02}")),
            ("06", format!("{:02}", y.rem_euclid(100))),
            ("15", format!("{hh:02}")),
            ("PM", if hh >= 12 { "PM" } else { "AM" }.into()),
            ("pm", if hh >= 12 { "pm" } else { "am" }.into()),
            ("1", m.to_string()),
            ("2", d.to_string()),
            ("3", h12.to_string()),
            ("4", mm.to_string()),
        ];
        let mut out = String::new();
        let mut rest = layout;
        'outer: while !rest.is_empty() {
            // fractional seconds: `.000` / `,000` (fixed), `.999` (trailing zeros cut)
            if let Some(after) = rest.strip_prefix(['.', ',']) {
                let n = after.bytes().take_while(|&b| b == b'0').count();
                let n9 = after.bytes().take_while(|&b| b == b'9').count();
                let (n, trim) = if n > 0 { (n, false) } else { (n9, true) };
                if n > 0 && !after[n..].starts_with(|c: char| c.is_ascii_digit()) {
                    let digits = format!("{:09}", self.nanos);
                    let mut frac = digits[..n.min(9)].to_string();
                    if trim {
                        frac = frac.trim_end_matches('0').to_string();
                    }
                    if !frac.is_empty() {
                        out.push_str(&rest[..1]);
                        out.push_str(&frac);
                    }
                    rest = &after[n..];
                    continue;
                }
            }
            if let Some(after) = rest.strip_prefix('5') {
                out.push_str(&ss.to_string());
                rest = after;
                continue;
            }
            for (tok, val) in &tokens {
                if let Some(after) = rest.strip_prefix(tok) {
                    out.push_str(val);
                    rest = after;
                    continue 'outer;
                }
            }
            let ch = rest.chars().next().unwrap_or(' ');
            out.push(ch);
            rest = &rest[ch.len_utf8()..];
        }
        out
    }
}

/// Days since 1970-01-01 to (year, month, day) (Howard Hinnant's `civil_from_days`).
fn civil(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn day_of_year(y: i64, m: i64, d: i64) -> i64 {
    const CUM: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    CUM[usize::try_from(m - 1).unwrap_or(0)] + d + i64::from(leap && m > 2)
}

// ---------------------------------------------------------------- execution

enum Flow {
    Normal,
    Break,
    Continue,
}

struct Exec<'a> {
    out: String,
    vars: Vec<(String, Value<'a>)>,
    now: Time,
}

impl<'a> Exec<'a> {
    fn walk(
        &mut self,
        nodes: &[Node],
        dot: &Value<'a>,
        depth: usize,
    ) -> Result<Flow, TemplateError> {
        for n in nodes {
            if self.out.len() > MAX_OUTPUT {
                return Err(TemplateError(format!(
                    "output larger than {MAX_OUTPUT} bytes"
                )));
            }
            match n {
                Node::Text(t) => self.out.push_str(t),
                Node::Action(line, p) => {
                    let v = self.pipe(p, dot, *line, depth)?;
                    match v {
                        _ if !p.vars.is_empty() => {}
                        // what text/template prints for a missing value
                        Value::Nil => self.out.push_str("<no value>"),
                        v => v.print(&mut self.out),
                    }
                }
                Node::If(line, p, then, other) | Node::With(line, p, then, other) => {
                    let mark = self.vars.len();
                    let v = self.pipe(p, dot, *line, depth)?;
                    let flow = if v.truth() {
                        let inner = if matches!(n, Node::With(..)) {
                            v
                        } else {
                            dot.clone()
                        };
                        self.walk(then, &inner, depth + 1)?
                    } else {
                        self.walk(other, dot, depth + 1)?
                    };
                    self.vars.truncate(mark);
                    if !matches!(flow, Flow::Normal) {
                        return Ok(flow);
                    }
                }
                Node::Range(line, p, body, other) => {
                    let mark = self.vars.len();
                    let decl = Pipe {
                        vars: Vec::new(),
                        assign: false,
                        cmds: p.cmds.clone(),
                    };
                    let v = self.pipe(&decl, dot, *line, depth)?;
                    let items: Vec<Value<'a>> = match v {
                        Value::List(l) => l,
                        Value::Int(n) => (0..n.max(0)).map(Value::Int).collect(),
                        Value::Nil => Vec::new(),
                        other => {
                            return Err(TemplateError(format!(
                                "line {line}: range can't iterate over {}",
                                other.type_name()
                            )))
                        }
                    };
                    if items.is_empty() {
                        self.walk(other, dot, depth + 1)?;
                    }
                    for (i, item) in items.into_iter().enumerate() {
                        let inner = self.vars.len();
                        match p.vars.as_slice() {
                            [] => {}
                            [e] => self.vars.push((e.clone(), item.clone())),
                            [k, e, ..] => {
                                self.vars
                                    .push((k.clone(), Value::Int(i64::try_from(i).unwrap_or(0))));
                                self.vars.push((e.clone(), item.clone()));
                            }
                        }
                        let flow = self.walk(body, &item, depth + 1)?;
                        self.vars.truncate(inner);
                        if matches!(flow, Flow::Break) {
                            break;
                        }
                    }
                    self.vars.truncate(mark);
                }
                Node::Break => return Ok(Flow::Break),
                Node::Continue => return Ok(Flow::Continue),
            }
        }
        Ok(Flow::Normal)
    }

    /// Evaluates a pipeline (declaring or assigning its variables).
    fn pipe(
        &mut self,
        p: &Pipe,
        dot: &Value<'a>,
        line: usize,
        depth: usize,
    ) -> Result<Value<'a>, TemplateError> {
        if depth > MAX_DEPTH {
            return Err(TemplateError(format!("line {line}: nested too deep")));
        }
        let mut last: Option<Value<'a>> = None;
        for cmd in &p.cmds {
            last = Some(self.command(cmd, dot, last, line, depth)?);
        }
        let v = last.unwrap_or(Value::Nil);
        if let Some(name) = p.vars.last() {
            if p.assign {
                match self.vars.iter_mut().rev().find(|(n, _)| n == name) {
                    Some(slot) => slot.1 = v.clone(),
                    None => {
                        return Err(TemplateError(format!(
                            "line {line}: undefined variable {name}"
                        )))
                    }
                }
            } else {
                self.vars.push((name.clone(), v.clone()));
            }
        }
        Ok(v)
    }

    fn command(
        &mut self,
        cmd: &[Arg],
        dot: &Value<'a>,
        piped: Option<Value<'a>>,
        line: usize,
        depth: usize,
    ) -> Result<Value<'a>, TemplateError> {
        let e = |m: String| TemplateError(format!("line {line}: {m}"));
        let Some((first, rest)) = cmd.split_first() else {
            return Err(e("empty command".into()));
        };
        if let Arg::Func(name) = first {
            let mut args = Vec::with_capacity(rest.len() + 1);
            for a in rest {
                args.push(self.arg(a, dot, line, depth)?);
            }
            if let Some(p) = piped {
                args.push(p);
            }
            return call(name, args, self.now).map_err(e);
        }
        if !rest.is_empty() || piped.is_some() {
            return Err(e(format!(
                "{first:?} is not a function: it takes no arguments"
            )));
        }
        self.arg(first, dot, line, depth)
    }

    fn arg(
        &mut self,
        a: &Arg,
        dot: &Value<'a>,
        line: usize,
        depth: usize,
    ) -> Result<Value<'a>, TemplateError> {
        let e = |m: String| TemplateError(format!("line {line}: {m}"));
        let chain = |mut v: Value<'a>, fields: &[String]| -> Result<Value<'a>, TemplateError> {
            for f in fields {
                v = match v {
                    Value::Finding(fd) => finding_field(fd, f).map_err(e)?,
                    Value::Nil => return Err(e(format!("nil pointer evaluating .{f}"))),
                    other => {
                        return Err(e(format!(
                            "can't evaluate field {f} in type {}",
                            other.type_name()
                        )))
                    }
                };
            }
            Ok(v)
        };
        Ok(match a {
            Arg::Dot(fields) => chain(dot.clone(), fields)?,
            Arg::Var(name, fields) => {
                let Some((_, v)) = self.vars.iter().rev().find(|(n, _)| n == name) else {
                    return Err(e(format!("undefined variable {name}")));
                };
                chain(v.clone(), fields)?
            }
            Arg::Sub(p, fields) => {
                let v = self.pipe(p, dot, line, depth + 1)?;
                chain(v, fields)?
            }
            Arg::Func(name) => call(name, Vec::new(), self.now).map_err(e)?,
            Arg::Str(s) => Value::Str(s.clone()),
            Arg::Int(i) => Value::Int(*i),
            Arg::Float(f) => Value::Float(*f),
            Arg::Bool(b) => Value::Bool(*b),
            Arg::Nil => return Err(e("nil is not a command".into())),
        })
    }
}

// ---------------------------------------------------------------- functions

fn want(name: &str, args: &[Value<'_>], n: usize) -> Result<(), String> {
    if args.len() == n {
        Ok(())
    } else {
        Err(format!(
            "wrong number of args for {name}: want {n} got {}",
            args.len()
        ))
    }
}

fn text<'v>(args: &'v [Value<'_>], i: usize) -> std::borrow::Cow<'v, str> {
    match args.get(i) {
        Some(Value::Str(s)) => std::borrow::Cow::Borrowed(s.as_str()),
        Some(Value::Nil) | None => std::borrow::Cow::Borrowed(""),
        Some(v) => std::borrow::Cow::Owned(v.to_text()),
    }
}

fn cmp_values(a: &Value<'_>, b: &Value<'_>) -> Result<std::cmp::Ordering, String> {
    use Value::*;
    let num = |v: &Value<'_>| match v {
        Int(i) => Some(*i as f64),
        Float(f) => Some(*f),
        Float32(f) => Some(f64::from(*f)),
        _ => None,
    };
    match (a, b) {
        (Int(x), Int(y)) => Ok(x.cmp(y)),
        (Str(x), Str(y)) => Ok(x.cmp(y)),
        (Bool(x), Bool(y)) => Ok(x.cmp(y)),
        _ => match (num(a), num(b)) {
            (Some(x), Some(y)) => x.partial_cmp(&y).ok_or_else(|| "NaN compared".to_string()),
            _ => Err(format!(
                "incompatible types for comparison: {} and {}",
                a.type_name(),
                b.type_name()
            )),
        },
    }
}

fn equal(a: &Value<'_>, b: &Value<'_>) -> Result<bool, String> {
    match (a, b) {
        (Value::Nil, Value::Nil) => Ok(true),
        (Value::Nil, _) | (_, Value::Nil) => Ok(false),
        _ => Ok(cmp_values(a, b)? == std::cmp::Ordering::Equal),
    }
}

fn call<'a>(name: &str, args: Vec<Value<'a>>, now: Time) -> Result<Value<'a>, String> {
    use Value::*;
    let s = |v: String| Str(v);
    let int = |i: usize| args.get(i).map(Value::int).unwrap_or(0);
    Ok(match name {
        // Go's builtins
        "and" => match args.iter().position(|v| !v.truth()) {
            Some(i) => args[i].clone(),
            None => args.last().cloned().ok_or("wrong number of args for and")?,
        },
        "or" => match args.iter().position(Value::truth) {
            Some(i) => args[i].clone(),
            None => args.last().cloned().ok_or("wrong number of args for or")?,
        },
        "not" => {
            want(name, &args, 1)?;
            Bool(!args[0].truth())
        }
        "len" => {
            want(name, &args, 1)?;
            Int(match &args[0] {
                Str(x) => x.len(),
                List(l) => l.len(),
                other => return Err(format!("len of type {}", other.type_name())),
            } as i64)
        }
        "index" => {
            let (first, idx) = args.split_first().ok_or("wrong number of args for index")?;
            let mut v = first.clone();
            for i in idx {
                v = match (&v, i) {
                    (List(l), Int(n)) => l
                        .get(usize::try_from(*n).map_err(|_| "index out of range")?)
                        .cloned()
                        .ok_or_else(|| format!("index out of range: {n}"))?,
                    (Str(x), Int(n)) => Int(i64::from(
                        *x.as_bytes()
                            .get(usize::try_from(*n).map_err(|_| "index out of range")?)
                            .ok_or_else(|| format!("index out of range: {n}"))?,
                    )),
                    _ => return Err(format!("can't index item of type {}", v.type_name())),
                };
            }
            v
        }
        "print" | "println" => {
            let mut out = String::new();
            for (i, v) in args.iter().enumerate() {
                // Print adds spaces between operands when neither is a string
                let sep = name == "println"
                    || (i > 0 && !matches!(v, Str(_)) && !matches!(args[i - 1], Str(_)));
                if i > 0 && sep {
                    out.push(' ');
                }
                v.print(&mut out);
            }
            if name == "println" {
                out.push('\n');
            }
            s(out)
        }
        "printf" => {
            let (f, rest) = args
                .split_first()
                .ok_or("wrong number of args for printf")?;
            s(sprintf(&f.to_text(), rest))
        }
        "eq" => {
            let (a, rest) = args
                .split_first()
                .ok_or("missing argument for comparison")?;
            if rest.is_empty() {
                return Err("missing argument for comparison".into());
            }
            let mut any = false;
            for b in rest {
                any |= equal(a, b)?;
            }
            Bool(any)
        }
        "ne" => {
            want(name, &args, 2)?;
            Bool(!equal(&args[0], &args[1])?)
        }
        "lt" | "le" | "gt" | "ge" => {
            want(name, &args, 2)?;
            let o = cmp_values(&args[0], &args[1])?;
            Bool(match name {
                "lt" => o.is_lt(),
                "le" => o.is_le(),
                "gt" => o.is_gt(),
                _ => o.is_ge(),
            })
        }
        "html" => s(html_escape(&concat(&args))),
        "js" => s(js_escape(&concat(&args))),
        "urlquery" => s(url_escape(&concat(&args))),
        // sprig: strings
        "quote" | "squote" => {
            let parts: Vec<String> = args
                .iter()
                .filter(|v| !matches!(v, Nil))
                .map(|v| {
                    if name == "quote" {
                        go_quote(&v.to_text())
                    } else {
                        format!("'{}'", v.to_text())
                    }
                })
                .collect();
            s(parts.join(" "))
        }
        "upper" => s(text(&args, 0).to_uppercase()),
        "lower" => s(text(&args, 0).to_lowercase()),
        "title" => s(title(&text(&args, 0))),
        "trim" => s(text(&args, 0).trim().to_string()),
        "nospace" => s(text(&args, 0)
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect()),
        "trimPrefix" | "trimSuffix" | "trimAll" => {
            want(name, &args, 2)?;
            let (cut, v) = (text(&args, 0), text(&args, 1));
            s(match name {
                "trimPrefix" => v.strip_prefix(&*cut).unwrap_or(&v).to_string(),
                "trimSuffix" => v.strip_suffix(&*cut).unwrap_or(&v).to_string(),
                _ => v.trim_matches(|c| cut.contains(c)).to_string(),
            })
        }
        "replace" => {
            want(name, &args, 3)?;
            s(text(&args, 2).replace(&*text(&args, 0), &text(&args, 1)))
        }
        "contains" | "hasPrefix" | "hasSuffix" => {
            want(name, &args, 2)?;
            let (needle, hay) = (text(&args, 0), text(&args, 1));
            Bool(match name {
                "contains" => hay.contains(&*needle),
                "hasPrefix" => hay.starts_with(&*needle),
                _ => hay.ends_with(&*needle),
            })
        }
        "repeat" => {
            want(name, &args, 2)?;
            let n = usize::try_from(int(0)).unwrap_or(0);
            let v = text(&args, 1);
            if n.saturating_mul(v.len()) > MAX_OUTPUT {
                return Err(format!("repeat: result larger than {MAX_OUTPUT} bytes"));
            }
            s(v.repeat(n))
        }
        "substr" => {
            want(name, &args, 3)?;
            let v = text(&args, 2);
            let (a, b) = (int(0), int(1));
            let len = v.len() as i64;
            let a = if a < 0 { 0 } else { a.min(len) };
            let b = if b < 0 || b > len { len } else { b };
            s(
                v.get(usize::try_from(a).unwrap_or(0)..usize::try_from(b.max(a)).unwrap_or(0))
                    .unwrap_or("")
                    .to_string(),
            )
        }
        "trunc" => {
            want(name, &args, 2)?;
            let v = text(&args, 1);
            let n = int(0);
            let len = v.len() as i64;
            let cut = |a: i64, b: i64| {
                v.get(usize::try_from(a).unwrap_or(0)..usize::try_from(b).unwrap_or(0))
                    .unwrap_or("")
                    .to_string()
            };
            s(if n < 0 && -n < len {
                cut(len + n, len)
            } else if n >= 0 && n < len {
                cut(0, n)
            } else {
                v.to_string()
            })
        }
        "abbrev" => {
            want(name, &args, 2)?;
            let v = text(&args, 1);
            let n = usize::try_from(int(0)).unwrap_or(0);
            s(if n < 4 || v.len() <= n {
                v.to_string()
            } else {
                format!("{}...", v.get(..n - 3).unwrap_or(&v))
            })
        }
        "indent" | "nindent" => {
            want(name, &args, 2)?;
            let pad = " ".repeat(usize::try_from(int(0)).unwrap_or(0).min(1 << 10));
            let v = format!("{pad}{}", text(&args, 1).replace('\n', &format!("\n{pad}")));
            s(if name == "nindent" {
                format!("\n{v}")
            } else {
                v
            })
        }
        "cat" => s(args
            .iter()
            .filter(|v| !matches!(v, Nil))
            .map(Value::to_text)
            .collect::<Vec<_>>()
            .join(" ")),
        "join" => {
            want(name, &args, 2)?;
            let sep = text(&args, 0);
            match &args[1] {
                List(l) => s(l.iter().map(Value::to_text).collect::<Vec<_>>().join(&sep)),
                other => s(other.to_text()),
            }
        }
        "toString" => s(text(&args, 0).into_owned()),
        "toJson" => {
            want(name, &args, 1)?;
            s(to_json(&args[0]))
        }
        "b64enc" => s(b64(text(&args, 0).as_bytes())),
        // sprig: lists and defaults
        "list" => List(args),
        "first" | "last" => {
            want(name, &args, 1)?;
            match &args[0] {
                List(l) => (if name == "first" { l.first() } else { l.last() })
                    .cloned()
                    .unwrap_or(Nil),
                other => {
                    return Err(format!(
                        "{name}: cannot find {name} on type {}",
                        other.type_name()
                    ))
                }
            }
        }
        "default" => {
            want(name, &args, 2)?;
            if args[1].truth() {
                args[1].clone()
            } else {
                args[0].clone()
            }
        }
        "empty" => {
            want(name, &args, 1)?;
            Bool(!args[0].truth())
        }
        "coalesce" => args.iter().find(|v| v.truth()).cloned().unwrap_or(Nil),
        "ternary" => {
            want(name, &args, 3)?;
            if args[2].truth() {
                args[0].clone()
            } else {
                args[1].clone()
            }
        }
        // sprig: numbers (int64 arithmetic, as sprig's toInt64)
        "add" => Int(args.iter().fold(0i64, |a, v| a.wrapping_add(v.int()))),
        "add1" => Int(int(0).wrapping_add(1)),
        "sub" => Int(int(0).wrapping_sub(int(1))),
        "mul" => Int(args.iter().fold(1i64, |a, v| a.wrapping_mul(v.int()))),
        "div" | "mod" => {
            want(name, &args, 2)?;
            let d = int(1);
            if d == 0 {
                return Err(format!("{name}: integer divide by zero"));
            }
            Int(if name == "div" {
                int(0).wrapping_div(d)
            } else {
                int(0).wrapping_rem(d)
            })
        }
        "max" | "min" => {
            let it = args.iter().map(Value::int);
            Int(if name == "max" { it.max() } else { it.min() }
                .ok_or_else(|| format!("wrong number of args for {name}"))?)
        }
        "int" => Int(int(0)),
        // sprig: dates (UTC)
        "now" => Time(now),
        "unixEpoch" => {
            want(name, &args, 1)?;
            s(args[0].int().to_string())
        }
        "date" => {
            want(name, &args, 2)?;
            // as sprig: a time, or Unix seconds; anything else means now
            let t = match &args[1] {
                Time(t) => *t,
                Int(secs) => self::Time {
                    secs: *secs,
                    nanos: 0,
                },
                _ => now,
            };
            s(t.format(&text(&args, 0)))
        }
        "env" | "expandenv" | "getHostByName" => {
            return Err(format!(
                "function {name:?} is removed by gitleaks (not defined)"
            ))
        }
        _ => return Err(format!("function {name:?} not defined")),
    })
}

fn concat(args: &[Value<'_>]) -> String {
    let mut out = String::new();
    for v in args {
        v.print(&mut out);
    }
    out
}

fn title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut start = true;
    for c in s.chars() {
        if start && c.is_alphabetic() {
            out.extend(c.to_uppercase());
        } else {
            out.push(c);
        }
        start = !c.is_alphanumeric() && c != '\'' && c != '_';
    }
    out
}

/// Go's `strconv.Quote` (`%q` of a string).
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if is_go_printable(c) => out.push(c),
            c if (c as u32) < 0x10000 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
    out.push('"');
    out
}

/// An approximation of Go's `unicode.IsPrint` for text outside ASCII: control,
/// format, separator (other than space), private-use and unassigned-looking code
/// points are escaped.
fn is_go_printable(c: char) -> bool {
    let u = c as u32;
    !(c.is_control()
        || (0x2028..=0x202e).contains(&u)
        || (0x200b..=0x200f).contains(&u)
        || (0x2060..=0x206f).contains(&u)
        || u == 0xfeff
        || u == 0xad
        || u == 0xa0
        || (0xe000..=0xf8ff).contains(&u)
        || (0xfff9..=0xfffb).contains(&u)
        || u >= 0xf0000)
}

fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\'' => out.push_str("&#39;"),
            '"' => out.push_str("&#34;"),
            '\0' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

fn js_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '"' => out.push_str("\\\""),
            '<' => out.push_str("\\u003C"),
            '>' => out.push_str("\\u003E"),
            '&' => out.push_str("\\u0026"),
            '=' => out.push_str("\\u003D"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

fn url_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(b))
            }
            b' ' => out.push('+'),
            _ => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

fn b64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |a, (i, &b)| a | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(A[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// sprig's `toJson`: Go's `json.Marshal`, findings with their fields in the struct's
/// order, a float32 entropy at float32 precision (`3.8464394`, `4`), and the empty
/// string when Marshal fails (a NaN or infinite float).
fn to_json(v: &Value<'_>) -> String {
    match v {
        Value::Nil => "null".into(),
        Value::Bool(b) => super::go_json(b),
        Value::Int(i) => super::go_json(i),
        Value::Float(f) if f.is_finite() => super::go_json(f),
        Value::Float32(f) if f.is_finite() => super::go_json(f),
        Value::Float(_) | Value::Float32(_) => String::new(),
        Value::Str(s) => super::go_json(s),
        Value::List(l) => {
            let items: Vec<String> = l.iter().map(to_json).collect();
            if items.iter().any(String::is_empty) {
                return String::new();
            }
            format!("[{}]", items.join(","))
        }
        Value::Finding(f) if f.entropy.is_finite() => super::go_json(*f),
        Value::Finding(_) => String::new(),
        Value::Time(t) => super::go_json(&t.format("2006-01-02T15:04:05.999999999Z07:00")),
    }
}

/// Go's `fmt.Sprintf` for the verbs report templates use.
fn sprintf(format: &str, args: &[Value<'_>]) -> String {
    let mut out = String::new();
    let mut next = 0;
    let mut chars = format.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let (mut minus, mut plus, mut zero, mut space, mut sharp) =
            (false, false, false, false, false);
        while let Some(&(_, f)) = chars.peek() {
            match f {
                '-' => minus = true,
                '+' => plus = true,
                '0' => zero = true,
                ' ' => space = true,
                '#' => sharp = true,
                _ => break,
            }
            chars.next();
        }
        let num = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
            let mut n: Option<usize> = None;
            while let Some(&(_, d)) = chars.peek() {
                let Some(v) = d.to_digit(10) else { break };
                n = Some(
                    n.unwrap_or(0)
                        .saturating_mul(10)
                        .saturating_add(v as usize)
                        .min(1 << 16),
                );
                chars.next();
            }
            n
        };
        let width = num(&mut chars);
        let prec = if chars.peek().is_some_and(|&(_, c)| c == '.') {
            chars.next();
            Some(num(&mut chars).unwrap_or(0))
        } else {
            None
        };
        let Some((_, verb)) = chars.next() else {
            out.push_str("%!(NOVERB)");
            break;
        };
        if verb == '%' {
            out.push('%');
            continue;
        }
        let Some(arg) = args.get(next) else {
            let _ = write!(out, "%!{verb}(MISSING)");
            continue;
        };
        next += 1;
        let numeric = matches!(arg, Value::Int(_) | Value::Float(_) | Value::Float32(_));
        let sign = |s: String, negative: bool| {
            if negative || !numeric {
                s
            } else if plus {
                format!("+{s}")
            } else if space {
                format!(" {s}")
            } else {
                s
            }
        };
        let body = match (verb, arg) {
            ('s' | 'v', Value::Str(st)) => match prec {
                Some(p) => st.chars().take(p).collect(),
                None => st.clone(),
            },
            ('v', v) => v.to_text(),
            ('s', v) => v.to_text(),
            ('q', v) => go_quote(&v.to_text()),
            ('d', Value::Int(i)) => sign(i.to_string(), *i < 0),
            ('t', Value::Bool(b)) => b.to_string(),
            ('x' | 'X', Value::Int(i)) => {
                let h = if verb == 'x' {
                    format!("{:x}", i.unsigned_abs())
                } else {
                    format!("{:X}", i.unsigned_abs())
                };
                let h = if sharp { format!("0{verb}{h}") } else { h };
                if *i < 0 {
                    format!("-{h}")
                } else {
                    h
                }
            }
            ('x' | 'X', Value::Str(st)) => st
                .bytes()
                .map(|b| {
                    if verb == 'x' {
                        format!("{b:02x}")
                    } else {
                        format!("{b:02X}")
                    }
                })
                .collect(),
            ('c', Value::Int(i)) => u32::try_from(*i)
                .ok()
                .and_then(char::from_u32)
                .unwrap_or('\u{fffd}')
                .to_string(),
            (
                'f' | 'F' | 'e' | 'E' | 'g' | 'G',
                v @ (Value::Int(_) | Value::Float(_) | Value::Float32(_)),
            ) => {
                let f = match v {
                    Value::Int(i) => {
                        let _ = write!(out, "%!{verb}(int={i})");
                        continue;
                    }
                    Value::Float32(x) => f64::from(*x),
                    Value::Float(x) => *x,
                    _ => 0.0,
                };
                let s = match verb {
                    'f' | 'F' => format!("{f:.*}", prec.unwrap_or(6)),
                    'e' | 'E' => go_exp(f, prec.unwrap_or(6), verb == 'E'),
                    _ => match (v, prec) {
                        (Value::Float32(x), None) => go_g32(*x),
                        _ => go_g(f, prec, verb == 'G'),
                    },
                };
                sign(s, f.is_sign_negative())
            }
            (verb, v) => format!("%!{verb}({}={})", v.type_name(), v.to_text()),
        };
        let w = width.unwrap_or(0);
        let len = body.chars().count();
        if len >= w {
            out.push_str(&body);
        } else if minus {
            out.push_str(&body);
            out.extend(std::iter::repeat_n(' ', w - len));
        } else if zero && numeric {
            let (sgn, digits) = match body.strip_prefix(['-', '+']) {
                Some(d) => (&body[..1], d),
                None => ("", body.as_str()),
            };
            out.push_str(sgn);
            out.extend(std::iter::repeat_n('0', w - len));
            out.push_str(digits);
        } else {
            out.extend(std::iter::repeat_n(' ', w - len));
            out.push_str(&body);
        }
    }
    if next < args.len() {
        out.push_str("%!(EXTRA ");
        let extra: Vec<String> = args[next..]
            .iter()
            .map(|v| format!("{}={}", v.type_name(), v.to_text()))
            .collect();
        out.push_str(&extra.join(", "));
        out.push(')');
    }
    out
}

/// Go's `%e` with a precision: `1.234560e+03`.
fn go_exp(f: f64, prec: usize, upper: bool) -> String {
    let s = format!("{f:.prec$e}");
    let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
    let (sign, digits) = match e.strip_prefix('-') {
        Some(d) => ('-', d),
        None => ('+', e),
    };
    let r = format!("{m}e{sign}{digits:0>2}");
    if upper {
        r.to_uppercase()
    } else {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn findings() -> Vec<ReportFinding> {
        vec![
            ReportFinding {
                rule_id: "test-pat".into(),
                description: "Test <token> & co".into(),
                start_line: 2,
                end_line: 2,
                start_column: 8,
                end_column: 47,
                line: "\nTOKEN=\"ghp_x\"".into(),
                match_text: "ghp_abc\"q".into(),
                secret: "ghp_abc".into(),
                file: "a/b.env".into(),
                commit: "0123456789abcdef".into(),
                entropy: 3.846_439_4,
                author: "Zoë".into(),
                email: "z@e.org".into(),
                date: "2024-03-04T03:06:07Z".into(),
                message: "m\nn\t\"x\"".into(),
                tags: vec!["t1".into(), "t2".into()],
                fingerprint: "fp".into(),
                ..Default::default()
            },
            ReportFinding {
                rule_id: "other".into(),
                description: "D2".into(),
                start_line: 10,
                end_line: 11,
                start_column: 1,
                end_column: 4,
                match_text: "m2".into(),
                secret: "s2".into(),
                file: "c.txt".into(),
                entropy: 4.0,
                ..Default::default()
            },
        ]
    }

    const NOW: Time = Time {
        secs: 1_700_000_000,
        nanos: 123_456_789,
    };

    /// tests/templates: gitleaks' own test templates (markdown, jsonextra) and
    /// templates using every supported construct and function; each `.out` is what
    /// Go's text/template with sprig v3.3.0's functions (gitleaks v8.30.1's
    /// dependencies) renders over the same two findings with the same `now`
    /// (tests/templates/README.md).
    #[test]
    fn renders_as_go_text_template() {
        let cases = [
            (
                include_str!("../../tests/templates/01-markdown.tmpl"),
                include_str!("../../tests/templates/01-markdown.out"),
            ),
            (
                include_str!("../../tests/templates/02-jsonextra.tmpl"),
                include_str!("../../tests/templates/02-jsonextra.out"),
            ),
            (
                include_str!("../../tests/templates/03-basic-constructs.tmpl"),
                include_str!("../../tests/templates/03-basic-constructs.out"),
            ),
            (
                include_str!("../../tests/templates/04-vars.tmpl"),
                include_str!("../../tests/templates/04-vars.out"),
            ),
            (
                include_str!("../../tests/templates/05-funcs.tmpl"),
                include_str!("../../tests/templates/05-funcs.out"),
            ),
            (
                include_str!("../../tests/templates/06-json.tmpl"),
                include_str!("../../tests/templates/06-json.out"),
            ),
        ];
        let fs = findings();
        for (i, (t, want)) in cases.iter().enumerate() {
            let got = render_at(t, &fs, NOW).unwrap_or_else(|e| panic!("template {}: {e}", i + 1));
            assert_eq!(got, *want, "template {}", i + 1);
        }
    }

    #[test]
    fn errors_name_the_line_and_never_panic() {
        let fs = findings();
        let err = |t: &str| match render_at(t, &fs, NOW) {
            Err(TemplateError(m)) => m,
            Ok(out) => panic!("{t:?} rendered {out:?}"),
        };
        assert!(err("a\n{{ range . }}{{ .Nope }}{{ end }}")
            .starts_with("line 2: can't evaluate field Nope"));
        assert!(err("{{ if . }}").contains("without {{end}}"));
        assert!(err("{{ end }}").contains("unexpected {{end}}"));
        assert!(err("{{ else }}").contains("unexpected {{else}}"));
        assert!(err("{{ nope 1 }}").contains("function \"nope\" not defined"));
        assert!(err("{{ env \"HOME\" }}").contains("removed by gitleaks"));
        assert!(err("{{ $x }}").contains("undefined variable $x"));
        assert!(err("{{ .File").contains("unclosed action"));
        assert!(err("{{ \"abc }}").contains("unclosed action"));
        assert!(err("{{ define \"x\" }}{{ end }}").contains("not supported"));
        assert!(err("{{ break }}").contains("outside {{range}}"));
        assert!(err("{{ range 3 }}{{ .File }}{{ end }}")
            .contains("can't evaluate field File in type int"));
        assert!(err("{{ lt \"a\" 1 }}").contains("incompatible types"));
        assert!(err("{{ div 1 0 }}").contains("divide by zero"));
        assert!(err("{{ index . 9 }}").contains("out of range"));
        assert!(err("{{ }}").contains("missing value"));
        // hostile input: deep nesting and huge output are errors, not a crash
        let deep = "{{ if 1 }}".repeat(MAX_DEPTH + 1);
        assert!(err(&deep).contains("nested too deep"));
        let parens = format!(
            "{{{{ {}1{} }}}}",
            "(".repeat(MAX_DEPTH + 2),
            ")".repeat(MAX_DEPTH + 2)
        );
        assert!(err(&parens).contains("nested too deep"));
        assert!(err("{{ repeat 1000000000 \"abc\" }}").contains("larger than"));
        assert!(
            err("{{ range 100000 }}{{ repeat 100000 \"abcdefgh\" }}{{ end }}")
                .contains("larger than")
        );
    }

    #[test]
    fn go_layouts() {
        let t = Time {
            secs: 951_782_400 + 3_723,
            nanos: 5_000_000,
        }; // 2000-02-29 01:02:03.005
        assert_eq!(
            t.format("2006-01-02 15:04:05.000 Mon Jan _2 3PM 002"),
            "2000-02-29 01:02:03.005 Tue Feb 29 1AM 060"
        );
        assert_eq!(t.format(".999 Z07:00"), ".005 Z");
        let before = Time { secs: -1, nanos: 0 };
        assert_eq!(before.format("2006-01-02T15:04:05"), "1969-12-31T23:59:59");
    }
}
