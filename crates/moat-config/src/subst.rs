//! `${...}` substitution in YAML text, before it is parsed.
//!
//! * `${NAME}`: the environment variable `NAME` (an error when it is not set);
//! * `${NAME:-default}`: `NAME`, or `default` when it is unset or empty;
//! * `${file:PATH}`: the content of a file (relative paths are relative to the
//!   directory of the file being loaded), without its trailing line breaks: a
//!   Kubernetes Secret mounted as a volume;
//! * `$${` is a literal `${`.
//!
//! Substitution is YAML-aware, so a value can never change the structure of the
//! document: inside a double-quoted string the value is escaped, inside a
//! single-quoted string its quotes are doubled, in a block scalar (`|`, `>`) its
//! lines are indented, and as a plain scalar it is inserted as is when it is a
//! single word (so `port: ${PORT}` is still a number), else as a double-quoted
//! string. Comments are left alone. Positions reported by the parser are mapped
//! back to the text as written (see [`Expanded::original_position`]).

use std::path::Path;

use crate::ConfigError;

/// Text after substitution, with what is needed to map positions back.
#[derive(Debug)]
pub struct Expanded {
    /// The text to parse.
    pub text: String,
    /// `(original start, original end, new start, new end)` byte ranges of each
    /// substitution, in order.
    edits: Vec<(usize, usize, usize, usize)>,
}

impl Expanded {
    /// Maps a 1-based `(line, column)` of [`Expanded::text`] to the same place in
    /// `original` (a position inside a substituted value maps to its `${`).
    pub fn original_position(&self, original: &str, line: u32, column: u32) -> (u32, u32) {
        if self.edits.is_empty() || line == 0 {
            return (line, column);
        }
        let Some(new_off) = offset_of(&self.text, line, column) else {
            return (line, column);
        };
        let mut orig_off = new_off;
        for &(os, oe, ns, ne) in &self.edits {
            if ns > new_off {
                break;
            }
            orig_off = if new_off < ne {
                os
            } else {
                oe + (new_off - ne)
            };
        }
        position_of(original, orig_off.min(original.len()))
    }
}

/// Byte offsets where lines start, with YAML's line breaks: CR LF, LF and a bare CR
/// (so positions agree with the ones the YAML parser reports). The first is 0; a
/// text ending with a line break ends with `text.len()`.
pub fn line_starts(text: &str) -> impl Iterator<Item = usize> + '_ {
    let b = text.as_bytes();
    std::iter::once(0).chain(b.iter().enumerate().filter_map(move |(i, &c)| {
        let breaks = c == b'\n' || (c == b'\r' && b.get(i + 1) != Some(&b'\n'));
        breaks.then_some(i + 1)
    }))
}

/// Byte offset of a 1-based line and (character) column.
fn offset_of(text: &str, line: u32, column: u32) -> Option<usize> {
    let start = line_starts(text).nth((line as usize).max(1) - 1)?;
    let rest = &text[start..];
    let col = column.saturating_sub(1) as usize;
    let within = rest
        .char_indices()
        .nth(col)
        .map(|(i, _)| i)
        .unwrap_or(rest.len());
    Some(start + within)
}

/// 1-based line and character column of a byte offset.
fn position_of(text: &str, off: usize) -> (u32, u32) {
    let mut off = off.min(text.len());
    while !text.is_char_boundary(off) {
        off -= 1;
    }
    let (mut line, mut line_start) = (0u32, 0);
    for start in line_starts(text).take_while(|&s| s <= off) {
        line += 1;
        line_start = start;
    }
    let column = text[line_start..off].chars().count() as u32 + 1;
    (line, column)
}

/// Where a `${` was found.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Context {
    /// A plain (unquoted) scalar; `whole` when the reference is the entire scalar.
    Plain { whole: bool },
    /// Inside `"..."`.
    Double,
    /// Inside `'...'`.
    Single,
    /// A line of a block scalar indented by this many spaces.
    Block { indent: usize },
}

/// State carried from one line to the next.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Normal,
    Double,
    Single,
    /// Inside a block scalar whose parent line is indented by this many spaces.
    Block {
        parent: usize,
    },
}

/// Expands `text` (read from `file`) with the process environment.
pub fn expand(file: &Path, text: &str) -> Result<Expanded, ConfigError> {
    expand_with(file, text, &|name| std::env::var(name).ok())
}

/// Expands `text` (read from `file`), looking variables up with `env`.
pub fn expand_with(
    file: &Path,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Expanded, ConfigError> {
    let mut out = Expanded {
        text: String::with_capacity(text.len()),
        edits: Vec::new(),
    };
    if !text.contains("${") {
        out.text.push_str(text);
        return Ok(out);
    }
    let mut state = State::Normal;
    let mut line_start = 0;
    for line in text.split_inclusive('\n') {
        let indent = line.len() - line.trim_start_matches(' ').len();
        if let State::Block { parent } = state {
            let blank = line.trim().is_empty();
            if blank || indent > parent {
                expand_block_line(file, text, line_start, line, indent, env, &mut out)?;
                line_start += line.len();
                continue;
            }
            state = State::Normal;
        }
        state = expand_line(file, text, line_start, line, indent, state, env, &mut out)?;
        line_start += line.len();
    }
    Ok(out)
}

/// A line of block scalar content: every `${` is replaced, multi-line values indented.
fn expand_block_line(
    file: &Path,
    text: &str,
    line_start: usize,
    line: &str,
    indent: usize,
    env: &dyn Fn(&str) -> Option<String>,
    out: &mut Expanded,
) -> Result<(), ConfigError> {
    let b = line.as_bytes();
    let mut i = 0;
    let mut copied = 0;
    while i < b.len() {
        if b[i] == b'$' && b.get(i + 1) == Some(&b'$') && b.get(i + 2) == Some(&b'{') {
            out.text.push_str(&line[copied..i]);
            push_edit(out, line_start + i, line_start + i + 2, "$");
            i += 2;
            copied = i;
            continue;
        }
        if b[i] == b'$' && b.get(i + 1) == Some(&b'{') {
            out.text.push_str(&line[copied..i]);
            let (end, value) = reference(file, text, line_start + i, env)?;
            let rendered = render(
                file,
                text,
                line_start + i,
                &value,
                Context::Block { indent },
            )?;
            push_edit(out, line_start + i, end, &rendered);
            i = end - line_start;
            copied = i;
            continue;
        }
        i += 1;
    }
    out.text.push_str(&line[copied..]);
    Ok(())
}

/// One line outside block scalars. Returns the state for the next line.
#[allow(clippy::too_many_arguments)]
fn expand_line(
    file: &Path,
    text: &str,
    line_start: usize,
    line: &str,
    indent: usize,
    mut state: State,
    env: &dyn Fn(&str) -> Option<String>,
    out: &mut Expanded,
) -> Result<State, ConfigError> {
    let b = line.as_bytes();
    let mut i = 0;
    let mut copied = 0;
    // Whether the next non-space character starts a scalar (line start, after
    // `: `, `- `, `[`, `{`, `,`, `? `).
    let mut scalar_start = state == State::Normal;
    // The last significant character outside quotes: `|` or `>` at the end of a
    // line after a key or dash starts a block scalar.
    let mut last_token_start: Option<usize> = None;
    while i < b.len() {
        let c = b[i];
        match state {
            State::Double => {
                if c == b'\\' {
                    i += 2;
                    continue;
                }
                if c == b'"' {
                    state = State::Normal;
                    scalar_start = false;
                    i += 1;
                    continue;
                }
            }
            State::Single => {
                if c == b'\'' {
                    if b.get(i + 1) == Some(&b'\'') {
                        i += 2;
                        continue;
                    }
                    state = State::Normal;
                    scalar_start = false;
                    i += 1;
                    continue;
                }
            }
            State::Normal => {
                let prev_space = i == 0 || b[i - 1] == b' ' || b[i - 1] == b'\t';
                if c == b'#' && prev_space {
                    // A comment: the rest of the line is copied as is.
                    break;
                }
                if c == b' ' || c == b'\t' || c == b'\n' || c == b'\r' {
                    i += 1;
                    continue;
                }
                if scalar_start && c == b'"' {
                    state = State::Double;
                    i += 1;
                    continue;
                }
                if scalar_start && c == b'\'' {
                    state = State::Single;
                    i += 1;
                    continue;
                }
                let next_space = matches!(b.get(i + 1), None | Some(b' ' | b'\t' | b'\n' | b'\r'));
                if matches!(c, b'[' | b'{' | b',')
                    || (c == b':' && next_space)
                    || (matches!(c, b'-' | b'?') && next_space && prev_space)
                {
                    scalar_start = true;
                    last_token_start = None;
                    i += 1;
                    continue;
                }
                if last_token_start.is_none() || prev_space {
                    last_token_start = Some(i);
                }
            }
            State::Block { .. } => {}
        }
        if c == b'$' && b.get(i + 1) == Some(&b'$') && b.get(i + 2) == Some(&b'{') {
            out.text.push_str(&line[copied..i]);
            push_edit(out, line_start + i, line_start + i + 2, "$");
            i += 2;
            copied = i;
            scalar_start = false;
            continue;
        }
        if c == b'$' && b.get(i + 1) == Some(&b'{') {
            out.text.push_str(&line[copied..i]);
            let (end, value) = reference(file, text, line_start + i, env)?;
            let ctx = match state {
                State::Double => Context::Double,
                State::Single => Context::Single,
                _ => {
                    let rest = &line[end - line_start..];
                    let rest_trim = rest.trim_start_matches([' ', '\t']);
                    let ends_scalar = rest_trim.is_empty()
                        || rest_trim.starts_with(['\n', '\r', ',', ']', '}'])
                        || (rest_trim.starts_with('#') && rest_trim.len() < rest.len());
                    Context::Plain {
                        whole: scalar_start && ends_scalar,
                    }
                }
            };
            let rendered = render(file, text, line_start + i, &value, ctx)?;
            push_edit(out, line_start + i, end, &rendered);
            i = end - line_start;
            copied = i;
            scalar_start = false;
            continue;
        }
        if state == State::Normal {
            scalar_start = false;
        }
        i += 1;
    }
    out.text.push_str(&line[copied..]);
    if state == State::Normal {
        if let Some(t) = last_token_start {
            let token = line[t..]
                .split([' ', '\t', '\n', '\r'])
                .next()
                .unwrap_or("");
            let is_indicator = (token.starts_with('|') || token.starts_with('>'))
                && token[1..]
                    .bytes()
                    .all(|c| c == b'+' || c == b'-' || c.is_ascii_digit());
            let rest = line[t + token.len()..].trim();
            if is_indicator && (rest.is_empty() || rest.starts_with('#')) {
                // The parent is the key on this line: after any `- ` sequence markers.
                let mut parent = indent;
                let mut tail = &line[indent..];
                while let Some(t) = tail.strip_prefix("- ") {
                    let t2 = t.trim_start_matches(' ');
                    parent += tail.len() - t2.len();
                    tail = t2;
                }
                return Ok(State::Block { parent });
            }
        }
    }
    Ok(state)
}

fn push_edit(out: &mut Expanded, orig_start: usize, orig_end: usize, replacement: &str) {
    let new_start = out.text.len();
    out.text.push_str(replacement);
    out.edits
        .push((orig_start, orig_end, new_start, out.text.len()));
}

fn error(file: &Path, text: &str, at: usize, message: String) -> ConfigError {
    let (line, column) = position_of(text, at);
    ConfigError {
        file: file.to_path_buf(),
        line,
        column,
        field: String::new(),
        message,
    }
}

/// Resolves the reference starting at `text[at..]` (`${`): its end offset and value.
fn reference(
    file: &Path,
    text: &str,
    at: usize,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(usize, String), ConfigError> {
    let body_start = at + 2;
    let line_end = text[body_start..]
        .find('\n')
        .map(|i| body_start + i)
        .unwrap_or(text.len());
    let Some(close) = text[body_start..line_end].find('}') else {
        return Err(error(
            file,
            text,
            at,
            "`${` without a closing `}` on the same line (write `$${` for a literal `${`)"
                .to_string(),
        ));
    };
    let body = &text[body_start..body_start + close];
    let end = body_start + close + 1;
    if let Some(path) = body.strip_prefix("file:") {
        let path = path.trim();
        if path.is_empty() {
            return Err(error(
                file,
                text,
                at,
                "`${file:}` names no file".to_string(),
            ));
        }
        let p = Path::new(path);
        let full = if p.is_relative() {
            file.parent()
                .map(|d| d.join(p))
                .unwrap_or_else(|| p.to_path_buf())
        } else {
            p.to_path_buf()
        };
        return match std::fs::read_to_string(&full) {
            Ok(s) => Ok((end, s.trim_end_matches(['\n', '\r']).to_string())),
            Err(e) => Err(error(
                file,
                text,
                at,
                format!("`${{{body}}}`: cannot read {}: {e}", full.display()),
            )),
        };
    }
    let (name, default) = match body.split_once(":-") {
        Some((n, d)) => (n, Some(d)),
        None => (body, None),
    };
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_');
    if !valid {
        return Err(error(
            file,
            text,
            at,
            format!(
                "`${{{body}}}`: not a variable name (use `${{NAME}}`, `${{NAME:-default}}` or `${{file:PATH}}`; `$${{` for a literal `${{`)"
            ),
        ));
    }
    match (env(name), default) {
        (Some(v), Some(d)) if v.is_empty() => Ok((end, d.to_string())),
        (Some(v), _) => Ok((end, v)),
        (None, Some(d)) => Ok((end, d.to_string())),
        (None, None) => Err(error(
            file,
            text,
            at,
            format!(
                "environment variable `{name}` is not set (referenced as `${{{name}}}`; `${{{name}:-default}}` gives a default)"
            ),
        )),
    }
}

/// A single word that YAML reads back as the same plain scalar.
fn plain_safe(v: &str) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && !matches!(
            b[0],
            b'@' | b'%' | b'-' | b'?' | b':' | b'!' | b'&' | b'*' | b'|' | b'>'
        )
        && b.iter().enumerate().all(|(i, &c)| {
            c.is_ascii_alphanumeric()
                || matches!(
                    c,
                    b'.' | b'_' | b'/' | b'@' | b'+' | b'=' | b'~' | b'%' | b'-'
                )
                || (c == b':' && i + 1 < b.len())
        })
}

/// The value as it is written into the text in `ctx`.
fn render(
    file: &Path,
    text: &str,
    at: usize,
    value: &str,
    ctx: Context,
) -> Result<String, ConfigError> {
    match ctx {
        Context::Plain { whole: true } if value.is_empty() => Ok("\"\"".to_string()),
        Context::Plain { .. } if value.is_empty() || plain_safe(value) => Ok(value.to_string()),
        Context::Plain { whole: true } => Ok(double_quoted(value, true)),
        Context::Plain { whole: false } => Err(error(
            file,
            text,
            at,
            "a value with spaces, quotes or YAML punctuation cannot be inserted into an unquoted string: put the whole string in double quotes".to_string(),
        )),
        Context::Double => Ok(double_quoted(value, false)),
        Context::Single if value.contains(['\n', '\r']) => Err(error(
            file,
            text,
            at,
            "a multi-line value cannot go into a single-quoted string: use double quotes or a block scalar".to_string(),
        )),
        Context::Single => Ok(value.replace('\'', "''")),
        Context::Block { indent } => {
            let pad = " ".repeat(indent);
            Ok(value.replace('\n', &format!("\n{pad}")))
        }
    }
}

/// `value` escaped for a double-quoted YAML scalar, with the quotes when `quotes`.
fn double_quoted(value: &str, quotes: bool) -> String {
    let mut s = String::with_capacity(value.len() + 2);
    if quotes {
        s.push('"');
    }
    for c in value.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                s.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => s.push(c),
        }
    }
    if quotes {
        s.push('"');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("s3cr3t-t0ken".into()),
            "PORT" => Some("8443".into()),
            "EMPTY" => Some(String::new()),
            "SPACED" => Some("two words: \"quoted\" # not a comment".into()),
            "QUOTE" => Some("it's".into()),
            "MULTI" => Some("line one\nline two".into()),
            _ => None,
        }
    }

    fn x(text: &str) -> Result<String, ConfigError> {
        expand_with(Path::new("dir/moat.yaml"), text, &env).map(|e| e.text)
    }

    #[test]
    fn plain_values_keep_their_type() {
        assert_eq!(
            x("admin: { token: ${TOKEN} }\nport: ${PORT}\n").unwrap(),
            "admin: { token: s3cr3t-t0ken }\nport: 8443\n"
        );
        assert_eq!(
            x("url: http://h:${PORT}/x\n").unwrap(),
            "url: http://h:8443/x\n"
        );
    }

    #[test]
    fn unsafe_plain_values_are_quoted_when_whole_and_refused_inside() {
        assert_eq!(
            x("a: ${SPACED}\n").unwrap(),
            "a: \"two words: \\\"quoted\\\" # not a comment\"\n"
        );
        assert_eq!(
            x("- ${MULTI} # c\n").unwrap(),
            "- \"line one\\nline two\" # c\n"
        );
        let e = x("a: pre-${SPACED}\n").unwrap_err();
        assert_eq!((e.line, e.column), (1, 8), "{e}");
        assert!(e.message.contains("double quotes"), "{e}");
    }

    #[test]
    fn quoted_strings_and_block_scalars() {
        assert_eq!(
            x("a: \"x ${SPACED} ${MULTI}\"\n").unwrap(),
            "a: \"x two words: \\\"quoted\\\" # not a comment line one\\nline two\"\n"
        );
        assert_eq!(x("a: 'x ${QUOTE}'\n").unwrap(), "a: 'x it''s'\n");
        assert!(x("a: '${MULTI}'\n").is_err());
        assert_eq!(
            x("k:\n  v: |\n    ${MULTI}\n    end\n  w: ${PORT}\n").unwrap(),
            "k:\n  v: |\n    line one\n    line two\n    end\n  w: 8443\n"
        );
        assert_eq!(
            x("- v: >-\n    a ${SPACED}\n  w: ${SPACED}\n").unwrap(),
            "- v: >-\n    a two words: \"quoted\" # not a comment\n  w: \"two words: \\\"quoted\\\" # not a comment\"\n"
        );
    }

    #[test]
    fn defaults_escapes_and_comments() {
        assert_eq!(x("a: ${NOPE:-dflt}\n").unwrap(), "a: dflt\n");
        assert_eq!(x("a: ${EMPTY:-dflt}\n").unwrap(), "a: dflt\n");
        assert_eq!(x("a: ${EMPTY}x\n").unwrap(), "a: x\n");
        assert_eq!(
            x("a: $${NOPE}\nb: \"$${X}\"\n").unwrap(),
            "a: ${NOPE}\nb: \"${X}\"\n"
        );
        assert_eq!(
            x("# ${NOPE}\na: 1 # ${NOPE}\n").unwrap(),
            "# ${NOPE}\na: 1 # ${NOPE}\n"
        );
        assert_eq!(x("a: b#${PORT}\n").unwrap(), "a: b#8443\n");
    }

    #[test]
    fn errors_name_file_line_column_and_variable() {
        let e = x("a: 1\nadmin:\n  token: ${ADMIN_TOKEN}\n").unwrap_err();
        assert_eq!((e.line, e.column), (3, 10));
        assert!(
            e.to_string()
                .starts_with("dir/moat.yaml:3:10: environment variable `ADMIN_TOKEN` is not set"),
            "{e}"
        );
        let e = x("a: ${TOKEN\n}").unwrap_err();
        assert!(e.message.contains("closing"), "{e}");
        let e = x("a: ${9X}\n").unwrap_err();
        assert!(e.message.contains("not a variable name"), "{e}");
        let e = x("a: ${file:missing.pem}\n").unwrap_err();
        assert!(e.message.contains("cannot read dir/missing.pem"), "{e}");
    }

    #[test]
    fn files_are_read_relative_to_the_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("secrets")).unwrap();
        std::fs::write(dir.path().join("secrets/token"), "from-file\n").unwrap();
        std::fs::write(
            dir.path().join("secrets/key.pem"),
            "-----BEGIN X-----\nAAAA\n-----END X-----\n",
        )
        .unwrap();
        let cfg = dir.path().join("moat.yaml");
        let text = "token: ${file:secrets/token}\nkey: ${file:secrets/key.pem}\n";
        let out = expand(&cfg, text).unwrap().text;
        assert_eq!(
            out,
            "token: from-file\nkey: \"-----BEGIN X-----\\nAAAA\\n-----END X-----\"\n"
        );
        #[derive(Deserialize)]
        struct T {
            token: String,
            key: String,
        }
        let t: T = crate::from_str(&cfg, text).unwrap();
        assert_eq!(t.token, "from-file");
        assert_eq!(t.key, "-----BEGIN X-----\nAAAA\n-----END X-----");
    }

    #[test]
    fn the_process_environment_is_read() {
        let home = std::env::var("HOME").unwrap_or_default();
        if home.is_empty() {
            return;
        }
        #[derive(Deserialize)]
        struct T {
            h: String,
        }
        let t: T = crate::from_str(Path::new("t.yaml"), "h: \"${HOME}\"\n").unwrap();
        assert_eq!(t.h, home);
    }

    #[test]
    fn parser_errors_after_a_substitution_point_at_the_text_as_written() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct L {
            name: String,
            port: u16,
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct T {
            l: L,
        }
        let text = "l: { name: \"${SPACED}\", port: 99999 }\n";
        let e = expand_with(Path::new("t.yaml"), text, &env).unwrap();
        let err = crate::from_str::<T>(Path::new("t.yaml"), &e.text).unwrap_err();
        let (line, col) = e.original_position(text, err.line, err.column);
        assert_eq!(line, 1);
        assert_eq!(&text[col as usize - 1..col as usize + 4], "99999", "{err}");
        // Inside a substituted value: the `${`.
        let inside = e.original_position(text, 1, 15);
        assert_eq!(inside, (1, 13));
    }
}

#[cfg(test)]
mod line_break_tests {
    use super::*;

    #[test]
    fn positions_count_every_yaml_line_break() {
        // Found by the `config` fuzz target: with a bare CR the error's column ran past
        // the end of the line the YAML parser counts.
        let text = "a: 1\rb: ${bad name}\r\nc: 2\nd: 3";
        let at = text.find("${").unwrap();
        assert_eq!(position_of(text, at), (2, 4));
        assert_eq!(offset_of(text, 2, 4), Some(at));
        assert_eq!(position_of(text, text.find("c:").unwrap()), (3, 1));
        assert_eq!(position_of(text, text.find("d:").unwrap()), (4, 1));
        assert_eq!(offset_of(text, 4, 1), text.find("d:"));
        let e = expand_with(Path::new("x.yaml"), text, &|_| None).unwrap_err();
        assert_eq!((e.line, e.column), (2, 4), "{e}");
    }
}
