//! Parsing `git log -p -U0` output into the fragments gitleaks scans: per commit,
//! per file, per hunk, the added lines (joined, with their line breaks) and the
//! number in the new file of the first one.
//!
//! The log is produced with [`LOG_FORMAT`] so commit metadata is NUL-delimited
//! (a message cannot be mistaken for a diff line), with the author date in UTC:
//! run git with `TZ=UTC` and `--date=format-local:%Y-%m-%dT%H:%M:%SZ` (see
//! [`log_args`]).

use crate::report::CommitInfo;

/// `--format` of the log: NUL, SHA, author, email, date, raw message, NUL-separated.
pub const LOG_FORMAT: &str = "--format=%x00%H%x00%an%x00%ae%x00%ad%x00%B%x00";

/// The arguments after `git -C REPO`: gitleaks' `log -p -U0 --full-history --all
/// --diff-filter=tuxdb` (or `log -p -U0` plus the user's `--log-opts`), with the
/// metadata format above, no colour, no external diff or textconv.
pub fn log_args(log_opts: Option<&str>) -> Vec<String> {
    let mut args: Vec<String> = [
        "log",
        "-p",
        "-U0",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "--date=format-local:%Y-%m-%dT%H:%M:%SZ",
        LOG_FORMAT,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    match log_opts.map(str::trim).filter(|s| !s.is_empty()) {
        Some(opts) => args.extend(
            opts.split(' ')
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        ),
        None => args.extend(
            ["--full-history", "--all", "--diff-filter=tuxdb"]
                .iter()
                .map(|s| s.to_string()),
        ),
    }
    args
}

/// Added lines of one hunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fragment {
    /// Index of the commit in [`History::commits`], `None` for a plain diff.
    pub commit: Option<usize>,
    /// The file's path in the new tree.
    pub path: String,
    /// The new-file line number of the first added line.
    pub first_line: usize,
    /// The added lines, each with its line break (except a last line without one).
    pub text: Vec<u8>,
}

/// A parsed history.
#[derive(Debug, Default)]
pub struct History {
    /// Commits in log order.
    pub commits: Vec<CommitInfo>,
    /// Every hunk with added lines, in log order.
    pub fragments: Vec<Fragment>,
}

/// Parses the output of `git log` run with [`log_args`].
pub fn parse_log(out: &[u8]) -> History {
    let mut h = History::default();
    // NUL-split: [before, sha, author, email, date, message, diff, sha, ...].
    let parts: Vec<&[u8]> = out.split(|&b| b == 0).collect();
    let mut i = 1;
    while i + 5 < parts.len() {
        let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        h.commits.push(CommitInfo {
            sha: s(parts[i]).trim().to_string(),
            author: s(parts[i + 1]),
            email: s(parts[i + 2]),
            date: s(parts[i + 3]),
            message: s(parts[i + 4]).trim_end().to_string(),
        });
        let idx = h.commits.len() - 1;
        parse_diff(parts[i + 5], Some(idx), &mut h.fragments);
        i += 6;
    }
    h
}

/// Parses a plain `git diff -U0` (no commit metadata).
pub fn parse_diff_only(out: &[u8]) -> Vec<Fragment> {
    let mut v = Vec::new();
    parse_diff(out, None, &mut v);
    v
}

fn parse_diff(diff: &[u8], commit: Option<usize>, out: &mut Vec<Fragment>) {
    let mut path: Option<String> = None;
    let mut skip_file = false;
    let mut in_hunk = false;
    let mut cur: Option<Fragment> = None;
    let flush = |cur: &mut Option<Fragment>, out: &mut Vec<Fragment>| {
        if let Some(f) = cur.take() {
            if !f.text.is_empty() {
                out.push(f);
            }
        }
    };
    for line in diff.split_inclusive(|&b| b == b'\n') {
        if line.starts_with(b"diff --git ") || line.starts_with(b"diff --cc ") {
            flush(&mut cur, out);
            in_hunk = false;
            skip_file = false;
            path = diff_git_new_path(line);
            continue;
        }
        if in_hunk {
            match line.first() {
                Some(b'+') => {
                    if let Some(f) = cur.as_mut() {
                        f.text.extend_from_slice(&line[1..]);
                    }
                    continue;
                }
                Some(b'-') | Some(b' ') => continue,
                Some(b'\\') => {
                    // "\ No newline at end of file": the previous line had none.
                    if let Some(f) = cur.as_mut() {
                        if f.text.last() == Some(&b'\n') {
                            f.text.pop();
                        }
                    }
                    continue;
                }
                _ => in_hunk = false,
            }
        }
        if line.starts_with(b"@@ ") {
            flush(&mut cur, out);
            in_hunk = true;
            if skip_file {
                continue;
            }
            if let (Some(p), Some(first)) = (path.clone(), hunk_new_start(line)) {
                cur = Some(Fragment {
                    commit,
                    path: p,
                    first_line: first,
                    text: Vec::new(),
                });
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix(b"+++ ") {
            let p = trim_eol(rest);
            if p == b"/dev/null" {
                skip_file = true;
            } else {
                let p = unquote(p);
                path = Some(p.strip_prefix("b/").map(str::to_string).unwrap_or(p));
            }
            continue;
        }
        if line.starts_with(b"deleted file mode") || line.starts_with(b"Binary files ") {
            skip_file = true;
        }
    }
    flush(&mut cur, out);
}

fn trim_eol(b: &[u8]) -> &[u8] {
    let b = b.strip_suffix(b"\n").unwrap_or(b);
    let b = b.strip_suffix(b"\r").unwrap_or(b);
    // git appends a tab to names with spaces in ---/+++ lines.
    b.strip_suffix(b"\t").unwrap_or(b)
}

/// The `b/` path of a `diff --git a/X b/Y` line (used until a `+++` line names it).
fn diff_git_new_path(line: &[u8]) -> Option<String> {
    let rest = trim_eol(line.strip_prefix(b"diff --git ")?);
    let text = String::from_utf8_lossy(rest);
    if text.starts_with('"') {
        // a/"quoted" b/"quoted": take the last quoted string.
        let start = text.rfind(" \"b/").or_else(|| text.rfind(" \""))?;
        let p = unquote(text[start + 1..].as_bytes());
        return Some(p.strip_prefix("b/").map(str::to_string).unwrap_or(p));
    }
    // Unquoted: "a/X b/X" with equal halves when not renamed.
    let half = (text.len().saturating_sub(1)) / 2;
    let b = &text[text.len() - half..];
    if text.len() % 2 == 1 && text.get(..half).map(|a| &a[2..]) == b.get(2..) {
        return Some(b.get(2..).unwrap_or("").to_string());
    }
    text.rfind(" b/").map(|i| text[i + 3..].to_string())
}

/// Undoes git's C-style quoting of a path (`"a\tb\303\251"`).
fn unquote(p: &[u8]) -> String {
    if p.len() < 2 || p[0] != b'"' || p[p.len() - 1] != b'"' {
        return String::from_utf8_lossy(p).into_owned();
    }
    let inner = &p[1..p.len() - 1];
    let mut out = Vec::with_capacity(inner.len());
    let mut i = 0;
    while i < inner.len() {
        if inner[i] == b'\\' && i + 1 < inner.len() {
            let c = inner[i + 1];
            let simple = match c {
                b'n' => Some(b'\n'),
                b't' => Some(b'\t'),
                b'r' => Some(b'\r'),
                b'a' => Some(7),
                b'b' => Some(8),
                b'f' => Some(12),
                b'v' => Some(11),
                b'\\' => Some(b'\\'),
                b'"' => Some(b'"'),
                _ => None,
            };
            if let Some(s) = simple {
                out.push(s);
                i += 2;
                continue;
            }
            if i + 3 < inner.len()
                && inner[i + 1..i + 4]
                    .iter()
                    .all(|d| (b'0'..=b'7').contains(d))
            {
                let v = inner[i + 1..i + 4]
                    .iter()
                    .fold(0u32, |a, d| a * 8 + u32::from(d - b'0'));
                out.push((v & 0xff) as u8);
                i += 4;
                continue;
            }
        }
        out.push(inner[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `c` of `@@ -a,b +c,d @@`.
fn hunk_new_start(line: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(line).ok()?;
    let plus = text.find(" +")?;
    let rest = &text[plus + 2..];
    let end = rest.find([',', ' '])?;
    rest[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commits_hunks_and_skips_deletions_and_binaries() {
        let log = b"\0abc123\0Ann\0ann@x.org\x002024-01-02T03:04:05Z\0subject\n\nbody\n\0\n\
diff --git a/src/a.txt b/src/a.txt\n\
index 1..2 100644\n\
--- a/src/a.txt\n\
+++ b/src/a.txt\n\
@@ -3,0 +4,2 @@ ctx\n\
+line four\n\
+line five\n\
@@ -9 +10,0 @@\n\
-gone\n\
diff --git a/img.png b/img.png\n\
Binary files a/img.png and b/img.png differ\n\
diff --git \"a/caf\\303\\251 x.txt\" \"b/caf\\303\\251 x.txt\"\n\
new file mode 100644\n\
--- /dev/null\n\
+++ \"b/caf\\303\\251 x.txt\"\n\
@@ -0,0 +1 @@\n\
+no newline\n\
\\ No newline at end of file\n\
\0def456\0Bob\0bob@x.org\x002024-01-01T00:00:00Z\0one line\n\0\n\
diff --git a/old.txt b/old.txt\n\
deleted file mode 100644\n\
--- a/old.txt\n\
+++ /dev/null\n\
@@ -1 +0,0 @@\n\
-x\n";
        let h = parse_log(log);
        assert_eq!(h.commits.len(), 2);
        assert_eq!(h.commits[0].sha, "abc123");
        assert_eq!(h.commits[0].message, "subject\n\nbody");
        assert_eq!(h.commits[0].date, "2024-01-02T03:04:05Z");
        assert_eq!(h.commits[1].author, "Bob");
        assert_eq!(h.fragments.len(), 2, "{:?}", h.fragments);
        assert_eq!(h.fragments[0].path, "src/a.txt");
        assert_eq!(h.fragments[0].first_line, 4);
        assert_eq!(h.fragments[0].text, b"line four\nline five\n");
        assert_eq!(h.fragments[1].path, "caf\u{e9} x.txt");
        assert_eq!(h.fragments[1].text, b"no newline");
        assert_eq!(h.fragments[1].commit, Some(0));
    }

    #[test]
    fn log_args_are_gitleaks() {
        let a = log_args(None);
        assert!(a.ends_with(&[
            "--full-history".to_string(),
            "--all".into(),
            "--diff-filter=tuxdb".into()
        ]));
        let b = log_args(Some("--since=2024-01-01 main"));
        assert!(b.ends_with(&["--since=2024-01-01".to_string(), "main".into()]));
        assert!(!b.contains(&"--all".to_string()));
    }
}
