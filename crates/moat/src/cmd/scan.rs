//! `moat scan`: find secrets in files, directories or stdin with gitleaks-format rules.
//!
//! Exit status: 0 nothing found, 1 secrets found, 2 input errors (unreadable
//! rules or paths; this wins over 1).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use moat_secrets::{Finding, Scanner};

/// Output formats of `moat scan`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ScanFormat {
    /// One `path:line:column: rule-id: description` line per finding.
    Text,
    /// One JSON array of findings.
    Json,
    /// SARIF 2.1.0.
    Sarif,
}

/// Arguments of `moat scan`.
#[derive(clap::Args)]
pub struct ScanArgs {
    /// A gitleaks-format TOML ruleset (default: moat's embedded rules).
    #[arg(long)]
    rules: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    format: ScanFormat,
    /// Files larger than this many bytes are skipped with a warning.
    #[arg(long, default_value_t = 256 << 20)]
    max_file_size: u64,
    /// Recursive decoding passes (base64, hex, percent, unicode escapes), as
    /// gitleaks' `--max-decode-depth`; 0 turns decoding off.
    #[arg(long, default_value_t = moat_secrets::GITLEAKS_DEFAULT_DECODE_DEPTH as u64,
          value_parser = clap::value_parser!(u64).range(0..=moat_secrets::MAX_DECODE_DEPTH as u64))]
    max_decode_depth: u64,
    /// Files or directories (walked recursively; `.git` is skipped), or `-` for stdin.
    #[arg(required = true)]
    paths: Vec<String>,
}

struct Report {
    path: String,
    rule_id: String,
    description: String,
    line: usize,
    column: usize,
    start: usize,
    end: usize,
    redacted: String,
    /// gitleaks' decoding tags (`decoded:base64`, `decode-depth:1`) of a finding in
    /// decoded text; empty otherwise.
    tags: Vec<String>,
}

/// Runs `moat scan`.
pub fn run(args: ScanArgs) -> ExitCode {
    let scanner = match &args.rules {
        Some(p) => Scanner::from_file(p),
        None => Scanner::builtin(),
    };
    let mut scanner = match scanner {
        Ok(s) => s,
        Err(e) => {
            eprintln!("moat scan: {e}");
            return ExitCode::from(2);
        }
    };
    scanner.set_max_decode_depth(usize::try_from(args.max_decode_depth).unwrap_or(usize::MAX));
    for s in scanner.skipped() {
        eprintln!(
            "moat scan: rule `{}` cannot run and is skipped: {}",
            s.rule_id, s.reason
        );
    }
    let mut errors = 0usize;
    let mut reports: Vec<Report> = Vec::new();
    for p in &args.paths {
        if p == "-" {
            let mut data = Vec::new();
            match std::io::stdin()
                .take(args.max_file_size.saturating_add(1))
                .read_to_end(&mut data)
            {
                Ok(_) if data.len() as u64 > args.max_file_size => {
                    eprintln!(
                        "moat scan: stdin exceeds --max-file-size {}",
                        args.max_file_size
                    );
                    errors += 1;
                }
                Ok(_) => scan_one(&scanner, "-", &data, None, &mut reports),
                Err(e) => {
                    eprintln!("moat scan: stdin: {e}");
                    errors += 1;
                }
            }
            continue;
        }
        let path = Path::new(p);
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => walk(&scanner, path, &args, &mut reports, &mut errors),
            Ok(_) => scan_file(&scanner, path, &args, &mut reports, &mut errors),
            Err(e) => {
                eprintln!("moat scan: {p}: {e}");
                errors += 1;
            }
        }
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let written = match args.format {
        ScanFormat::Text => write_text(&mut out, &reports),
        ScanFormat::Json => write_json(&mut out, &reports),
        ScanFormat::Sarif => write_sarif(&mut out, &reports),
    };
    if let Err(e) = written.and_then(|_| out.flush()) {
        eprintln!("moat scan: cannot write output: {e}");
        return ExitCode::from(2);
    }
    if errors > 0 {
        ExitCode::from(2)
    } else if reports.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn walk(
    scanner: &Scanner,
    dir: &Path,
    args: &ScanArgs,
    reports: &mut Vec<Report>,
    errors: &mut usize,
) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) => {
                eprintln!("moat scan: {}: {e}", d.display());
                *errors += 1;
                continue;
            }
        };
        let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        children.sort();
        // Depth-first in sorted order: push reversed so the first child pops first.
        let mut subdirs = Vec::new();
        for c in children {
            match std::fs::symlink_metadata(&c) {
                Ok(m) if m.is_dir() => {
                    if c.file_name().is_some_and(|n| n == ".git") {
                        continue;
                    }
                    subdirs.push(c);
                }
                Ok(m) if m.is_file() => scan_file(scanner, &c, args, reports, errors),
                Ok(_) => {}
                Err(e) => {
                    eprintln!("moat scan: {}: {e}", c.display());
                    *errors += 1;
                }
            }
        }
        stack.extend(subdirs.into_iter().rev());
    }
}

fn scan_file(
    scanner: &Scanner,
    path: &Path,
    args: &ScanArgs,
    reports: &mut Vec<Report>,
    errors: &mut usize,
) {
    let display = path.to_string_lossy().into_owned();
    match std::fs::metadata(path) {
        Ok(m) if m.len() > args.max_file_size => {
            eprintln!(
                "moat scan: {display}: skipped, larger than --max-file-size {}",
                args.max_file_size
            );
            return;
        }
        Ok(_) => {}
        Err(e) => {
            eprintln!("moat scan: {display}: {e}");
            *errors += 1;
            return;
        }
    }
    match std::fs::read(path) {
        Ok(data) => scan_one(scanner, &display, &data, Some(&display), reports),
        Err(e) => {
            eprintln!("moat scan: {display}: {e}");
            *errors += 1;
        }
    }
}

fn scan_one(
    scanner: &Scanner,
    display: &str,
    data: &[u8],
    path: Option<&str>,
    reports: &mut Vec<Report>,
) {
    for f in scanner.scan(data, path) {
        reports.push(report(display, data, &f));
    }
}

fn report(display: &str, data: &[u8], f: &Finding) -> Report {
    Report {
        path: display.to_string(),
        rule_id: f.rule_id.to_string(),
        description: f.description.to_string(),
        line: f.line,
        column: f.column,
        start: f.start,
        end: f.end,
        redacted: f.redacted(data),
        tags: f.decoded.as_ref().map(|d| d.tags()).unwrap_or_default(),
    }
}

fn write_text(out: &mut impl Write, reports: &[Report]) -> std::io::Result<()> {
    for r in reports {
        writeln!(
            out,
            "{}:{}:{}: {}: {} [{}]",
            r.path, r.line, r.column, r.rule_id, r.description, r.redacted
        )?;
    }
    Ok(())
}

fn json_value(r: &Report) -> serde_json::Value {
    serde_json::json!({
        "path": r.path,
        "rule_id": r.rule_id,
        "description": r.description,
        "line": r.line,
        "column": r.column,
        "start": r.start,
        "end": r.end,
        "redacted": r.redacted,
        "tags": r.tags,
    })
}

fn write_json(out: &mut impl Write, reports: &[Report]) -> std::io::Result<()> {
    let v: Vec<serde_json::Value> = reports.iter().map(json_value).collect();
    serde_json::to_writer_pretty(&mut *out, &v)?;
    writeln!(out)
}

fn write_sarif(out: &mut impl Write, reports: &[Report]) -> std::io::Result<()> {
    let mut rule_ids: Vec<(&str, &str)> = reports
        .iter()
        .map(|r| (r.rule_id.as_str(), r.description.as_str()))
        .collect();
    rule_ids.sort();
    rule_ids.dedup_by(|a, b| a.0 == b.0);
    let rules: Vec<serde_json::Value> = rule_ids
        .iter()
        .map(|(id, d)| serde_json::json!({"id": id, "shortDescription": {"text": d}}))
        .collect();
    let results: Vec<serde_json::Value> = reports
        .iter()
        .map(|r| {
            serde_json::json!({
                "ruleId": r.rule_id,
                "level": "error",
                "message": {"text": format!("{}: {}", r.rule_id, r.redacted)},
                "locations": [{
                    "physicalLocation": {
                        "artifactLocation": {"uri": r.path},
                        "region": {
                            "startLine": r.line.max(1),
                            "startColumn": r.column.max(1),
                            "byteOffset": r.start,
                            "byteLength": r.end - r.start,
                        }
                    }
                }],
                "properties": {"tags": r.tags},
            })
        })
        .collect();
    let doc = serde_json::json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "moat", "rules": rules}},
            "results": results,
        }]
    });
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)
}
