//! YAML loading with errors that point at the problem.
//!
//! Every configuration file moat reads (its own config, Istio policies, bench
//! scenarios) goes through [`from_str`] or [`from_str_multi`], so a user always
//! gets `file:line:column: field a.b[2].c: what is wrong`.
//!
//! Values may reference the environment and files: `${NAME}`,
//! `${NAME:-default}`, `${file:PATH}` (`$${` for a literal `${`), substituted
//! before parsing with positions mapped back to the text as written ([`subst`]).
//!
//! Types deserialized here should use `#[serde(deny_unknown_fields)]`: an
//! unknown key is an error, never silently ignored.

#![warn(missing_docs)]

use std::cell::RefCell;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;

pub mod subst;

/// A configuration error with its position in the source file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file the text came from (or a label such as `<embedded>`).
    pub file: PathBuf,
    /// 1-based line, 0 when unknown.
    pub line: u32,
    /// 1-based column, 0 when unknown.
    pub column: u32,
    /// Dotted path of the offending field, e.g. `routes[1].cluster`; empty at top level.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl ConfigError {
    /// An error about a field found after deserialization (a semantic check),
    /// located by [`Spanned`](serde_saphyr::Spanned) or left at line 0.
    pub fn semantic(
        file: impl Into<PathBuf>,
        line: u32,
        column: u32,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ConfigError {
            file: file.into(),
            line,
            column,
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        if !self.field.is_empty() {
            write!(f, ": field `{}`", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Deserializes one YAML document from `text`, which was read from `file`.
///
/// `${...}` references are substituted first ([`subst`]); error positions are those
/// of the text as written. For moat's own configuration files; data files whose text
/// may hold `${` literally (Istio policies, WAF rule files) use [`from_str_verbatim`].
pub fn from_str<T: DeserializeOwned>(file: &Path, text: &str) -> Result<T, ConfigError> {
    let expanded = subst::expand(file, text)?;
    deserialize(file, &expanded.text).map_err(|mut err| {
        (err.line, err.column) = expanded.original_position(text, err.line, err.column);
        err
    })
}

/// Deserializes one YAML document from `text` as written, without `${...}`
/// substitution: for policy and rule files, where `${jndi:` is a pattern, not a
/// variable.
pub fn from_str_verbatim<T: DeserializeOwned>(file: &Path, text: &str) -> Result<T, ConfigError> {
    deserialize(file, text)
}

fn deserialize<T: DeserializeOwned>(file: &Path, text: &str) -> Result<T, ConfigError> {
    let path = RefCell::new(String::new());
    let result = serde_saphyr::with_deserializer_from_str(text, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            *path.borrow_mut() = clean_path(&e.path().to_string());
            e.into_inner()
        })
    });
    result.map_err(|e| to_config_error(file, &path.into_inner(), &e))
}

/// Deserializes every document of a multi-document YAML stream (`---` separated), as
/// written (no `${...}` substitution: these are Kubernetes-style policy files).
/// Empty documents are skipped.
pub fn from_str_multi<T: DeserializeOwned>(file: &Path, text: &str) -> Result<Vec<T>, ConfigError> {
    // Split on document markers ourselves so each document is deserialized
    // through serde_path_to_error and line numbers stay file-relative.
    let mut out = Vec::new();
    for (start_line, doc) in split_documents(text) {
        if doc.lines().all(|l| {
            let t = l.trim();
            t.is_empty() || t.starts_with('#')
        }) {
            continue;
        }
        match from_str_verbatim::<T>(file, doc) {
            Ok(v) => out.push(v),
            Err(mut e) => {
                if e.line > 0 {
                    e.line += start_line;
                }
                return Err(e);
            }
        }
    }
    Ok(out)
}

/// Returns `(lines_before_doc, doc_text)` for each `---`-separated document.
fn split_documents(text: &str) -> Vec<(u32, &str)> {
    let mut docs = Vec::new();
    let mut doc_start_byte = 0;
    let mut doc_start_line = 0u32;
    let mut offset = 0;
    for (idx, line) in text.split_inclusive('\n').enumerate() {
        let trimmed = line.trim_end();
        if trimmed == "---" || trimmed.starts_with("--- ") || trimmed == "..." {
            docs.push((doc_start_line, &text[doc_start_byte..offset]));
            doc_start_byte = offset + line.len();
            doc_start_line = idx as u32 + 1;
        }
        offset += line.len();
    }
    docs.push((doc_start_line, &text[doc_start_byte..]));
    docs
}

/// Reads and deserializes one YAML file.
pub fn from_file<T: DeserializeOwned>(file: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(file).map_err(|e| ConfigError {
        file: file.to_path_buf(),
        line: 0,
        column: 0,
        field: String::new(),
        message: format!("cannot read: {e}"),
    })?;
    from_str(file, &text)
}

fn clean_path(p: &str) -> String {
    if p == "." {
        String::new()
    } else {
        p.to_string()
    }
}

fn to_config_error(file: &Path, field: &str, e: &serde_saphyr::Error) -> ConfigError {
    let (line, column) = e
        .location()
        .map(|l| (l.line() as u32, l.column() as u32))
        .unwrap_or((0, 0));
    // The saphyr Display output embeds a source snippet; keep only the first line's message.
    let full = e.to_string();
    let first = full.lines().next().unwrap_or("").trim();
    let message = strip_location_prefix(first).to_string();
    ConfigError {
        file: file.to_path_buf(),
        line,
        column,
        field: field.to_string(),
        message,
    }
}

/// Drops saphyr's own `error: line N column M: ` prefix: we print the position ourselves.
fn strip_location_prefix(msg: &str) -> &str {
    let msg = msg.strip_prefix("error: ").unwrap_or(msg);
    if let Some(rest) = msg.strip_prefix("line ") {
        if let Some(idx) = rest.find(": ") {
            return &rest[idx + 2..];
        }
    }
    msg
}

/// Parses a duration as every moat config, policy file and command line writes it:
/// protobuf style with fractional seconds (`1.5s`, as Istio's policies use) or a
/// humantime span (`250ms`, `5s`, `1m30s`, `2h`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if let Some(secs) = s.strip_suffix('s') {
        if secs.contains('.') {
            if let Ok(f) = secs.parse::<f64>() {
                if f.is_finite() && (0.0..1e9).contains(&f) {
                    return Ok(Duration::from_secs_f64(f));
                }
            }
        }
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("invalid duration `{s}`: {e} (e.g. `250ms`, `5s`, `1.5s`)"))
}

/// Serde helpers for human durations such as `250ms`, `5s`, `1m30s` (see
/// [`parse_duration`]).
pub mod duration {
    use super::*;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Deserializes a duration string (see [`parse_duration`]) into a [`Duration`].
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s).map_err(serde::de::Error::custom)
    }

    /// Serializes a [`Duration`] as a humantime string.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }
}

/// Serde helpers for byte sizes: an integer, or a string such as `64KiB`, `1MiB`, `10MB`.
pub mod byte_size {
    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Int(u64),
        Text(String),
    }

    /// Parses `1024`, `64KiB`, `1MiB`, `2GiB`, `10KB`, `5MB`.
    pub fn parse(s: &str) -> Result<u64, String> {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let n: u64 = num
            .parse()
            .map_err(|_| format!("invalid size `{s}` (e.g. `1048576`, `64KiB`, `1MiB`)"))?;
        let mult: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" | "K" | "k" => 1 << 10,
            "MiB" | "M" => 1 << 20,
            "GiB" | "G" => 1 << 30,
            "KB" | "kB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            other => return Err(format!("unknown size unit `{other}` in `{s}`")),
        };
        n.checked_mul(mult)
            .ok_or_else(|| format!("size `{s}` is too large"))
    }

    /// Deserializes a byte size.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(n),
            Raw::Text(s) => parse(&s).map_err(serde::de::Error::custom),
        }
    }

    /// Serializes a byte size as an integer.
    pub fn serialize<S: Serializer>(n: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(*n)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_protobuf_and_humantime() {
        use std::time::Duration;
        assert_eq!(super::parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(
            super::parse_duration("1.5s").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            super::parse_duration("250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            super::parse_duration("1m30s").unwrap(),
            Duration::from_secs(90)
        );
        assert!(super::parse_duration("soon").is_err());
        assert!(super::parse_duration("").is_err());
        assert!(super::parse_duration("-1.5s").is_err());
        assert!(super::parse_duration("NaNs").is_err());
    }

    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Top {
        #[allow(dead_code)]
        name: String,
        #[allow(dead_code)]
        routes: Vec<Route>,
    }
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Route {
        #[allow(dead_code)]
        port: u16,
        #[serde(default, with = "duration")]
        #[allow(dead_code)]
        timeout: Duration,
    }

    #[test]
    fn unknown_field_names_file_line_and_field() {
        let text = "name: x\nroutes:\n  - port: 80\n  - prt: 9\n";
        let e = from_str::<Top>(Path::new("moat.yaml"), text).unwrap_err();
        assert_eq!((e.line, e.column), (4, 5));
        assert!(e.message.contains("unknown field `prt`"), "{e}");
        assert!(e.field.starts_with("routes[1]"), "{e}");
        assert!(
            e.to_string().starts_with("moat.yaml:4:5: field `routes[1]"),
            "{e}"
        );
    }

    #[test]
    fn bad_value_names_field() {
        let text = "name: x\nroutes:\n  - port: 99999\n";
        let e = from_str::<Top>(Path::new("c.yaml"), text).unwrap_err();
        assert_eq!(e.line, 3);
        assert_eq!(e.field, "routes[0].port");
    }

    #[test]
    fn bad_duration_is_reported() {
        let text = "name: x\nroutes:\n  - port: 1\n    timeout: soon\n";
        let e = from_str::<Top>(Path::new("c.yaml"), text).unwrap_err();
        assert_eq!(e.field, "routes[0].timeout");
        assert!(e.message.contains("invalid duration"), "{e}");
    }

    #[test]
    fn multi_document_lines_are_file_relative() {
        let text = "name: a\nroutes: []\n---\nname: b\nroutes:\n  - port: 1\n    bogus: 2\n";
        let e = from_str_multi::<Top>(Path::new("p.yaml"), text).unwrap_err();
        assert_eq!(e.line, 7, "{e}");
        let ok = from_str_multi::<Top>(
            Path::new("p.yaml"),
            "name: a\nroutes: []\n---\n---\nname: b\nroutes: []\n",
        )
        .unwrap();
        assert_eq!(ok.len(), 2);
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(byte_size::parse("1MiB").unwrap(), 1 << 20);
        assert_eq!(byte_size::parse("10KB").unwrap(), 10_000);
        assert!(byte_size::parse("10XB").is_err());
        assert!(byte_size::parse("99999999999999999999GiB").is_err());
    }

    #[test]
    fn syntax_error_is_located() {
        let e = from_str::<Top>(Path::new("c.yaml"), "name: [x\n").unwrap_err();
        assert!(e.line >= 1, "{e}");
    }
}
