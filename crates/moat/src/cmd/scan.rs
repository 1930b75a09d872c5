//! `moat scan`: find secrets in directories, git history or stdin with
//! gitleaks-format rules, with gitleaks' command line and report formats, so it can
//! replace gitleaks in CI (docs/secrets.md).
//!
//! `moat scan dir [PATH]`, `moat scan git [REPO]`, `moat scan stdin`, and the
//! older `moat scan PATH...|-`. Exit status: 0 nothing found, `--exit-code` (1)
//! secrets found, 2 input errors (unreadable rules, paths or repository; this wins).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use moat_secrets::gitlog::{self, Fragment};
use moat_secrets::report::{self, CommitInfo, IgnoreList, Lines, Origin, ReportFinding, SarifTool};
use moat_secrets::Scanner;

/// Report formats of `moat scan`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ScanFormat {
    /// One `path:line:column: rule-id: description [match]` line per finding.
    Text,
    /// gitleaks' JSON report (an array of findings).
    Json,
    /// gitleaks' CSV report.
    Csv,
    /// gitleaks' JUnit XML report.
    Junit,
    /// SARIF 2.1.0.
    Sarif,
    /// `--report-template` rendered over the findings.
    Template,
}

/// Arguments of `moat scan`.
#[derive(clap::Args)]
pub struct ScanArgs {
    #[command(subcommand)]
    source: Option<Source>,
    /// A gitleaks-format TOML ruleset. Default: `$GITLEAKS_CONFIG`, the TOML text in
    /// `$GITLEAKS_CONFIG_TOML`, `<source>/.gitleaks.toml`, then moat's embedded rules.
    #[arg(short = 'c', long = "config", visible_alias = "rules", global = true)]
    config: Option<PathBuf>,
    /// Report format (default: from the --report-path extension, else json; without
    /// --report-path, text on standard output).
    #[arg(
        short = 'f',
        long = "report-format",
        visible_alias = "format",
        value_enum,
        global = true
    )]
    report_format: Option<ScanFormat>,
    /// Write the report to this file (`-` for standard output).
    #[arg(short = 'r', long, global = true)]
    report_path: Option<PathBuf>,
    /// Template for `--report-format template` (a subset of Go's text/template:
    /// `{{ range . }}`, `{{ .Field }}`, `{{ end }}`, `{{ len . }}`).
    #[arg(long, global = true)]
    report_template: Option<PathBuf>,
    /// Redact secrets in reports: `--redact` hides them, `--redact=PERCENT` keeps the
    /// first 100-PERCENT % of each.
    #[arg(long, global = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "100", value_parser = clap::value_parser!(u32).range(0..=100))]
    redact: Option<u32>,
    /// Exit status when secrets are found.
    #[arg(long, global = true, default_value_t = 1)]
    exit_code: u8,
    /// A previous JSON report: findings already in it are not reported.
    #[arg(short = 'b', long, global = true)]
    baseline_path: Option<PathBuf>,
    /// A `.gitleaksignore` file or a directory holding one (fingerprints to ignore);
    /// `<source>/.gitleaksignore` is read too.
    #[arg(short = 'i', long, global = true, default_value = ".")]
    gitleaks_ignore_path: PathBuf,
    /// Recursive decoding passes (base64, hex, percent, unicode escapes); 0 turns
    /// decoding off.
    #[arg(long, global = true, default_value_t = moat_secrets::GITLEAKS_DEFAULT_DECODE_DEPTH as u64,
          value_parser = clap::value_parser!(u64).range(0..=moat_secrets::MAX_DECODE_DEPTH as u64))]
    max_decode_depth: u64,
    /// Files larger than this many megabytes (10^6 bytes) are skipped (0: no limit
    /// beyond --max-file-size).
    #[arg(long, global = true, default_value_t = 0)]
    max_target_megabytes: u64,
    /// Files larger than this many bytes are skipped with a warning.
    #[arg(long, global = true, default_value_t = 256 << 20)]
    max_file_size: u64,
    /// Only report these rules (comma-separated ids).
    #[arg(long, global = true, value_delimiter = ',')]
    enable_rule: Vec<String>,
    /// Also print each finding (text) on standard output when the report goes to a file.
    #[arg(short = 'v', long, global = true)]
    verbose: bool,
    /// Accepted for gitleaks compatibility (moat prints no banner).
    #[arg(long, global = true)]
    no_banner: bool,
    /// Directory scans: skip what `.gitignore`, `.ignore` and `.git/info/exclude`
    /// exclude (gitleaks scans every file; so does moat by default).
    #[arg(long, global = true)]
    gitignore: bool,
    /// Directory scans: scan files that symbolic links point to (not followed by default).
    #[arg(long, global = true)]
    follow_symlinks: bool,
    /// Worker threads (default: one per core).
    #[arg(long, global = true)]
    threads: Option<usize>,
    /// Files or directories, or `-` for stdin (the form before `dir`/`git`/`stdin`).
    paths: Vec<String>,
}

#[derive(clap::Subcommand)]
enum Source {
    /// Scan a directory or file (as `gitleaks dir`).
    #[command(visible_alias = "directory", alias = "files")]
    Dir {
        /// Directory or file to scan.
        #[arg(default_value = ".")]
        path: String,
    },
    /// Scan a git repository's history: every commit's added lines (as `gitleaks git`).
    Git {
        /// The repository.
        #[arg(default_value = ".")]
        repo: String,
        /// Options for `git log` instead of `--full-history --all` (e.g. `--since=2024-01-01`,
        /// `main..feature`), split on spaces.
        #[arg(long, allow_hyphen_values = true)]
        log_opts: Option<String>,
        /// Scan the staged changes (`git diff --staged`), for pre-commit hooks.
        #[arg(long)]
        staged: bool,
        /// Scan the unstaged changes (`git diff`).
        #[arg(long)]
        pre_commit: bool,
    },
    /// Scan standard input (as `gitleaks stdin`).
    Stdin,
}

/// One finding with what the text format shows.
struct Hit {
    report: ReportFinding,
    /// Plain 1-based byte column of the match start.
    column: usize,
    /// The match with the secret replaced by `*****`.
    safe_match: String,
    /// Commit order (history scans), for a stable report order.
    order: usize,
}

/// What every scan needs.
struct Ctx {
    scanner: Scanner,
    max_size: u64,
    errors: AtomicUsize,
    /// The report and baseline files (canonical): never scanned, as gitleaks.
    own_files: Vec<PathBuf>,
}

impl Ctx {
    fn error(&self, msg: impl std::fmt::Display) {
        eprintln!("moat scan: {msg}");
        self.errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs `moat scan`.
pub fn run(args: ScanArgs) -> ExitCode {
    let source_dir: PathBuf = match &args.source {
        Some(Source::Dir { path }) => {
            let p = Path::new(path);
            if p.is_dir() {
                p.to_path_buf()
            } else {
                p.parent().map(Path::to_path_buf).unwrap_or_default()
            }
        }
        Some(Source::Git { repo, .. }) => PathBuf::from(repo),
        _ => PathBuf::from("."),
    };
    if args.source.is_none() && args.paths.is_empty() {
        eprintln!("moat scan: nothing to scan: `moat scan dir [PATH]`, `moat scan git [REPO]`, `moat scan stdin`, or `moat scan PATH...|-`");
        return ExitCode::from(2);
    }
    let mut scanner = match load_scanner(&args, &source_dir) {
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
    if let Some(unknown) = args
        .enable_rule
        .iter()
        .find(|id| !scanner.rules().iter().any(|r| &*r.id == id.as_str()))
    {
        eprintln!("moat scan: --enable-rule: no rule `{unknown}` in the ruleset");
        return ExitCode::from(2);
    }
    let max_size = match args.max_target_megabytes {
        0 => args.max_file_size,
        mb => args.max_file_size.min(mb.saturating_mul(1_000_000)),
    };
    let own_files = [&args.report_path, &args.baseline_path]
        .into_iter()
        .flatten()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    let ctx = Ctx {
        scanner,
        max_size,
        errors: AtomicUsize::new(0),
        own_files,
    };
    let threads = args.threads.filter(|&t| t > 0).unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let mut hits: Vec<Hit> = Vec::new();
    match &args.source {
        Some(Source::Dir { path }) => walk(&ctx, Path::new(path), &args, threads, &mut hits),
        Some(Source::Git {
            repo,
            log_opts,
            staged,
            pre_commit,
        }) => scan_git(
            &ctx,
            repo,
            log_opts.as_deref(),
            *staged,
            *pre_commit,
            threads,
            &mut hits,
        ),
        Some(Source::Stdin) => scan_stdin(&ctx, "", &mut hits),
        None => {
            for p in &args.paths {
                if p == "-" {
                    scan_stdin(&ctx, "-", &mut hits);
                    continue;
                }
                walk(&ctx, Path::new(p), &args, threads, &mut hits);
            }
        }
    }
    let hits = match filter(hits, &args, &source_dir) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("moat scan: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = write_report(&args, &ctx.scanner, &hits) {
        eprintln!("moat scan: {e}");
        return ExitCode::from(2);
    }
    if ctx.errors.load(Ordering::Relaxed) > 0 {
        ExitCode::from(2)
    } else if hits.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(args.exit_code)
    }
}

/// The ruleset, found as gitleaks finds its config.
fn load_scanner(args: &ScanArgs, source_dir: &Path) -> Result<Scanner, String> {
    if let Some(p) = &args.config {
        return Scanner::from_file(p).map_err(|e| e.to_string());
    }
    if let Some(p) = std::env::var_os("GITLEAKS_CONFIG").filter(|v| !v.is_empty()) {
        return Scanner::from_file(Path::new(&p)).map_err(|e| e.to_string());
    }
    if let Ok(text) = std::env::var("GITLEAKS_CONFIG_TOML") {
        if !text.is_empty() {
            return Scanner::from_toml(&text, "$GITLEAKS_CONFIG_TOML").map_err(|e| e.to_string());
        }
    }
    let local = source_dir.join(".gitleaks.toml");
    if local.is_file() {
        return Scanner::from_file(&local).map_err(|e| e.to_string());
    }
    Scanner::builtin().map_err(|e| e.to_string())
}

/// Findings of one payload.
#[allow(clippy::too_many_arguments)]
fn scan_payload(
    ctx: &Ctx,
    data: &[u8],
    rule_path: Option<&str>,
    file: &str,
    symlink: &str,
    first_line: usize,
    commit: Option<(&CommitInfo, usize)>,
    out: &mut Vec<Hit>,
) {
    let sha = commit.map(|c| c.0.sha.as_str());
    let findings = ctx.scanner.scan_in_commit(data, rule_path, sha);
    if findings.is_empty() {
        return;
    }
    let lines = Lines::new(data);
    for f in &findings {
        let tags = ctx
            .scanner
            .rules()
            .iter()
            .find(|r| r.id == f.rule_id)
            .map(|r| r.tags.as_slice())
            .unwrap_or(&[]);
        let origin = Origin {
            file,
            symlink,
            first_line,
            commit: commit.map(|c| c.0),
        };
        let report = report::report_finding(f, data, &lines, origin, tags);
        out.push(Hit {
            report,
            column: f.column,
            safe_match: f.redacted(data),
            order: commit.map(|c| c.1).unwrap_or(0),
        });
    }
}

fn scan_stdin(ctx: &Ctx, name: &str, out: &mut Vec<Hit>) {
    let mut data = Vec::new();
    match std::io::stdin()
        .take(ctx.max_size.saturating_add(1))
        .read_to_end(&mut data)
    {
        Ok(_) if data.len() as u64 > ctx.max_size => {
            ctx.error(format_args!(
                "stdin exceeds the size limit {}",
                ctx.max_size
            ));
        }
        Ok(_) => scan_payload(ctx, &data, None, name, "", 1, None, out),
        Err(e) => ctx.error(format_args!("stdin: {e}")),
    }
}

/// Magic numbers of the binary formats gitleaks skips (its file-type check treats
/// `application/*` types as binary): executables, archives, databases, PDF, wasm.
fn is_binary(head: &[u8]) -> bool {
    const MAGIC: &[&[u8]] = &[
        b"\x7fELF",
        b"MZ",
        b"\xfe\xed\xfa\xce",
        b"\xfe\xed\xfa\xcf",
        b"\xce\xfa\xed\xfe",
        b"\xcf\xfa\xed\xfe",
        b"\xca\xfe\xba\xbe",
        b"PK\x03\x04",
        b"PK\x05\x06",
        b"\x1f\x8b",
        b"BZh",
        b"\xfd7zXZ\x00",
        b"7z\xbc\xaf\x27\x1c",
        b"Rar!\x1a\x07",
        b"\x28\xb5\x2f\xfd",
        b"%PDF-",
        b"SQLite format 3\x00",
        b"\x00asm",
        b"!<arch>\n",
        b"\xed\xab\xee\xdb",
        b"dex\n",
    ];
    MAGIC.iter().any(|m| head.starts_with(m)) || head.get(257..262).is_some_and(|u| u == b"ustar")
}

/// Scans one file; `display` is the path as reported (gitleaks' `File`).
fn scan_file(ctx: &Ctx, path: &Path, display: &str, symlink: &str, out: &mut Vec<Hit>) {
    let len = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) => return ctx.error(format_args!("{display}: {e}")),
    };
    if len == 0 {
        return;
    }
    if !ctx.own_files.is_empty()
        && std::fs::canonicalize(path).is_ok_and(|c| ctx.own_files.contains(&c))
    {
        return;
    }
    if len > ctx.max_size {
        eprintln!(
            "moat scan: {display}: skipped, larger than the size limit {}",
            ctx.max_size
        );
        return;
    }
    match std::fs::read(path) {
        Ok(data) if is_binary(&data) => {}
        Ok(data) => scan_payload(ctx, &data, Some(display), display, symlink, 1, None, out),
        Err(e) => ctx.error(format_args!("{display}: {e}")),
    }
}

/// How a walked path is reported: as given, without a leading `./`.
fn display_path(p: &Path) -> String {
    let s = p.to_string_lossy();
    s.strip_prefix("./").unwrap_or(&s).to_string()
}

/// Walks a directory (or scans a file) in parallel with the `ignore` crate: `.git`
/// is skipped, hidden files are scanned, ignore files only with `--gitignore`,
/// symbolic links are not followed unless `--follow-symlinks` (then files they
/// point to are scanned, reported with the link as `SymlinkFile`; links to
/// directories are never followed, as gitleaks).
fn walk(ctx: &Ctx, root: &Path, args: &ScanArgs, threads: usize, out: &mut Vec<Hit>) {
    match std::fs::symlink_metadata(root) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            let display = display_path(root);
            return scan_file(ctx, root, &display, "", out);
        }
        Err(e) => return ctx.error(format_args!("{}: {e}", root.display())),
    }
    let collected = Mutex::new(Vec::new());
    let walker = ignore::WalkBuilder::new(root)
        .hidden(false)
        .parents(args.gitignore)
        .ignore(args.gitignore)
        .git_ignore(args.gitignore)
        .git_global(args.gitignore)
        .git_exclude(args.gitignore)
        .require_git(false)
        .follow_links(false)
        .threads(threads)
        .filter_entry(|e| e.file_name() != ".git")
        .build_parallel();
    walker.run(|| {
        let collected = &collected;
        Box::new(move |entry| {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    ctx.error(e);
                    return ignore::WalkState::Continue;
                }
            };
            let Some(ft) = entry.file_type() else {
                return ignore::WalkState::Continue;
            };
            let mut local = Vec::new();
            let display = display_path(entry.path());
            if ft.is_file() {
                scan_file(ctx, entry.path(), &display, "", &mut local);
            } else if ft.is_symlink() && args.follow_symlinks {
                if let Ok(real) = std::fs::canonicalize(entry.path()) {
                    if real.is_file() {
                        let real_display = real.to_string_lossy().into_owned();
                        scan_file(ctx, &real, &real_display, &display, &mut local);
                    }
                }
            }
            if !local.is_empty() {
                if let Ok(mut c) = collected.lock() {
                    c.append(&mut local);
                }
            }
            ignore::WalkState::Continue
        })
    });
    out.extend(collected.into_inner().unwrap_or_else(|p| p.into_inner()));
}

/// Scans a repository's history (or its staged / unstaged changes) as gitleaks does.
fn scan_git(
    ctx: &Ctx,
    repo: &str,
    log_opts: Option<&str>,
    staged: bool,
    pre_commit: bool,
    threads: usize,
    out: &mut Vec<Hit>,
) {
    let mut cmd = std::process::Command::new("git");
    cmd.arg("-C").arg(repo).env("TZ", "UTC");
    if staged || pre_commit {
        cmd.args([
            "diff",
            "-U0",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
        ]);
        if staged {
            cmd.arg("--staged");
        }
        cmd.arg(".");
    } else {
        cmd.args(gitlog::log_args(log_opts));
    }
    let output = match cmd.output() {
        Ok(o) => o,
        Err(e) => return ctx.error(format_args!("cannot run git: {e}")),
    };
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        return ctx.error(format_args!("git in {repo}: {}", err.trim()));
    }
    let (commits, fragments) = if staged || pre_commit {
        (Vec::new(), gitlog::parse_diff_only(&output.stdout))
    } else {
        let h = gitlog::parse_log(&output.stdout);
        (h.commits, h.fragments)
    };
    let next = AtomicUsize::new(0);
    let collected = Mutex::new(Vec::new());
    let scan_one = |f: &Fragment, local: &mut Vec<Hit>| {
        let commit = f.commit.and_then(|i| commits.get(i).map(|c| (c, i)));
        scan_payload(
            ctx,
            &f.text,
            Some(&f.path),
            &f.path,
            "",
            f.first_line,
            commit,
            local,
        );
    };
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                let mut local = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(f) = fragments.get(i) else { break };
                    scan_one(f, &mut local);
                }
                if let Ok(mut c) = collected.lock() {
                    c.append(&mut local);
                }
            });
        }
    });
    out.extend(collected.into_inner().unwrap_or_else(|p| p.into_inner()));
}

/// `--enable-rule`, `.gitleaksignore`, the baseline, `--redact`, then a stable order.
fn filter(hits: Vec<Hit>, args: &ScanArgs, source_dir: &Path) -> Result<Vec<Hit>, String> {
    let mut ignore = IgnoreList::default();
    let ip = &args.gitleaks_ignore_path;
    let mut files = vec![];
    if ip.is_file() {
        files.push(ip.clone());
    }
    files.push(ip.join(".gitleaksignore"));
    files.push(source_dir.join(".gitleaksignore"));
    files.dedup();
    for f in files.iter().filter(|f| f.is_file()) {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        for bad in ignore.add(&text) {
            eprintln!(
                "moat scan: {}: not a fingerprint, ignored: {bad}",
                f.display()
            );
        }
    }
    let baseline: Vec<ReportFinding> = match &args.baseline_path {
        Some(p) => {
            let text = std::fs::read(p).map_err(|e| format!("baseline {}: {e}", p.display()))?;
            serde_json::from_slice(&text).map_err(|e| {
                format!(
                    "baseline {}: not a JSON report of gitleaks or moat: {e}",
                    p.display()
                )
            })?
        }
        None => Vec::new(),
    };
    let mut kept: Vec<Hit> = hits
        .into_iter()
        .filter(|h| args.enable_rule.is_empty() || args.enable_rule.contains(&h.report.rule_id))
        .filter(|h| !ignore.ignores(&h.report))
        .filter(|h| {
            baseline.is_empty() || report::is_new(&h.report, args.redact.is_some(), &baseline)
        })
        .collect();
    if let Some(p) = args.redact {
        for h in &mut kept {
            h.report.redact(p);
        }
    }
    kept.sort_by(|a, b| {
        (
            a.order,
            &a.report.file,
            a.report.start_line,
            a.report.start_column,
            &a.report.rule_id,
        )
            .cmp(&(
                b.order,
                &b.report.file,
                b.report.start_line,
                b.report.start_column,
                &b.report.rule_id,
            ))
    });
    Ok(kept)
}

fn write_text(out: &mut dyn Write, hits: &[Hit], redacting: bool) -> std::io::Result<()> {
    for h in hits {
        let r = &h.report;
        let file = if r.file.is_empty() { "-" } else { &r.file };
        let shown = if redacting {
            &r.match_text
        } else {
            &h.safe_match
        };
        let commit = if r.commit.is_empty() {
            String::new()
        } else {
            format!(" (commit {})", &r.commit[..r.commit.len().min(12)])
        };
        writeln!(
            out,
            "{file}:{}:{}: {}: {} [{shown}]{commit}",
            r.start_line, h.column, r.rule_id, r.description
        )?;
    }
    Ok(())
}

fn write_report(args: &ScanArgs, scanner: &Scanner, hits: &[Hit]) -> Result<(), String> {
    let format = match (args.report_format, &args.report_path, &args.report_template) {
        (Some(f), _, _) => f,
        (None, _, Some(_)) => ScanFormat::Template,
        (None, Some(p), None) => match p
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("csv") => ScanFormat::Csv,
            Some("sarif") => ScanFormat::Sarif,
            Some("xml") => ScanFormat::Junit,
            _ => ScanFormat::Json,
        },
        (None, None, None) => ScanFormat::Text,
    };
    if args.report_template.is_some() && format != ScanFormat::Template {
        return Err("--report-template needs --report-format template".into());
    }
    let to_stdout = args
        .report_path
        .as_ref()
        .is_none_or(|p| p.as_os_str() == "-");
    let mut sink: Box<dyn Write> = if to_stdout {
        Box::new(std::io::stdout().lock())
    } else {
        let p = args.report_path.as_deref().unwrap_or(Path::new("-"));
        let f = std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?;
        Box::new(std::io::BufWriter::new(f))
    };
    let reports: Vec<ReportFinding> = hits.iter().map(|h| h.report.clone()).collect();
    let written = match format {
        ScanFormat::Text => write_text(&mut sink, hits, args.redact.is_some()),
        ScanFormat::Json => report::write_json(&mut sink, &reports),
        ScanFormat::Csv => report::write_csv(&mut sink, &reports),
        ScanFormat::Junit => report::write_junit(&mut sink, &reports),
        ScanFormat::Sarif => {
            // in the ruleset's order, as gitleaks (`Config.OrderedRules`)
            let rules: Vec<(String, String)> = scanner
                .rules()
                .iter()
                .map(|r| (r.id.to_string(), r.description.to_string()))
                .collect();
            let tool = SarifTool {
                name: "moat",
                version: env!("CARGO_PKG_VERSION"),
                rules,
            };
            report::write_sarif(&mut sink, &tool, &reports)
        }
        ScanFormat::Template => {
            let Some(tp) = &args.report_template else {
                return Err("--report-format template needs --report-template FILE".into());
            };
            let t = std::fs::read_to_string(tp).map_err(|e| format!("{}: {e}", tp.display()))?;
            report::write_template(&mut sink, &t, &reports)
                .map_err(|e| format!("{}: {e}", tp.display()))?;
            Ok(())
        }
    };
    written
        .and_then(|_| sink.flush())
        .map_err(|e| format!("cannot write the report: {e}"))?;
    if args.verbose && !to_stdout {
        let mut out = std::io::stdout().lock();
        write_text(&mut out, hits, args.redact.is_some())
            .and_then(|_| out.flush())
            .map_err(|e| format!("cannot write output: {e}"))?;
    }
    Ok(())
}
