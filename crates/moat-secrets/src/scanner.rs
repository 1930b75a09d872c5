//! The scanner: keyword prefilter, windowed regex matching and gitleaks'
//! post-processing (secret group, entropy, allowlists, generic filter).

use moat_core::clock::CoarseInstant;
use std::sync::Arc;

use regex_automata::Input;

use crate::decode::{encoding_names, DecodeLimits, Passes, Segment, Span, MAX_DECODE_DEPTH};
use crate::keywords::KeywordFinder;
use crate::rules::{Required, Rule, RuleSet, RulesError, SkippedRule};

pub use crate::rules::DEFAULT_RULES;

/// gitleaks' inline opt-out marker: a finding whose line carries it is ignored.
pub const ALLOW_SIGNATURE: &[u8] = b"gitleaks:allow";

/// Matches post-processed between two reads of the clock.
const DEADLINE_STRIDE: usize = 64;

/// One secret found in a payload. Never holds the secret itself: only offsets.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// Id of the rule that matched.
    pub rule_id: Arc<str>,
    /// The rule's description.
    pub description: Arc<str>,
    /// Byte offset of the match (newlines trimmed, as gitleaks does).
    pub start: usize,
    /// Byte offset one past the match.
    pub end: usize,
    /// Newlines the regex matched just before `start`, trimmed from the match.
    /// gitleaks still locates the match from the first of them, over the trimmed
    /// length: its report gives `start - leading_newlines .. end - leading_newlines`.
    pub leading_newlines: usize,
    /// Byte offset of the secret (the selected capture group) in the payload.
    pub secret_start: usize,
    /// Byte offset one past the secret.
    pub secret_end: usize,
    /// 1-based line of the match start (0 for path-only findings).
    pub line: usize,
    /// 1-based byte column of the match start (0 for path-only findings).
    pub column: usize,
    /// Shannon entropy of the secret.
    pub entropy: f64,
    /// True for a path-only rule ("file detected").
    pub path_only: bool,
    /// For a secret found in decoded text: how it was encoded. `start..end`
    /// (and `secret_start..secret_end`) is then the encoded text in the payload.
    pub decoded: Option<Decoded>,
    /// For a composite rule (`[[rules.required]]`): the findings of its required
    /// rules near this one.
    pub required: Vec<RequiredFinding>,
}

/// How a secret found by recursive decoding was encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// The encodings undone to reach it, in gitleaks' order: `percent`,
    /// `unicode`, `hex`, `base64`.
    pub encodings: Vec<&'static str>,
    /// The decoding pass that revealed it (1: decoded once).
    pub depth: usize,
    /// The match in the decoded text (newlines trimmed): gitleaks' `Match`.
    pub matched: Vec<u8>,
    /// The secret in the decoded text: gitleaks' `Secret`.
    pub secret: Vec<u8>,
    /// Up to [`PRECEDING_BYTES`] of the decoded text before the match: the
    /// context an inline decision reads (the raw text is at hand for the others).
    pub preceding: Vec<u8>,
}

/// How much decoded text before a decoded match [`Decoded::preceding`] keeps.
pub const PRECEDING_BYTES: usize = 48;

impl Decoded {
    /// gitleaks' tags: `decoded:<encoding>` for each encoding, then `decode-depth:N`.
    pub fn tags(&self) -> Vec<String> {
        let mut t: Vec<String> = self
            .encodings
            .iter()
            .map(|e| format!("decoded:{e}"))
            .collect();
        t.push(format!("decode-depth:{}", self.depth));
        t
    }
}

/// A required rule's finding attached to a composite rule's finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequiredFinding {
    /// The required rule.
    pub rule_id: Arc<str>,
    /// Byte offset of its match in the payload.
    pub start: usize,
    /// Byte offset one past its match.
    pub end: usize,
    /// 1-based line of its match (0 for a path-only rule).
    pub line: usize,
    /// 1-based byte column of its match (0 for a path-only rule).
    pub column: usize,
}

impl Finding {
    /// The match with the secret replaced by `*****`, safe to show and log.
    pub fn redacted(&self, data: &[u8]) -> String {
        if self.path_only {
            return "file detected".to_string();
        }
        let (s, e) = (self.start.min(data.len()), self.end.min(data.len()));
        let (ss, se) = (self.secret_start.clamp(s, e), self.secret_end.clamp(s, e));
        if se <= ss {
            return "*****".to_string();
        }
        let mut out = String::new();
        out.push_str(&String::from_utf8_lossy(&data[s..ss]));
        out.push_str("*****");
        out.push_str(&String::from_utf8_lossy(&data[se..e]));
        if out.len() > 200 {
            let mut cut = 200;
            while !out.is_char_boundary(cut) {
                cut -= 1;
            }
            out.truncate(cut);
            out.push('…');
        }
        out
    }
}

/// Result of a scan with a deadline.
#[derive(Debug, Default)]
pub struct ScanOutcome {
    /// Findings, in payload order.
    pub findings: Vec<Finding>,
    /// True when the deadline passed before every rule ran (findings are partial).
    pub timed_out: bool,
    /// True when decoding stopped at [`DecodeLimits::max_decoded_bytes`]
    /// before [`DecodeLimits::max_depth`] passes (findings of deeper passes may
    /// be missing).
    pub decode_truncated: bool,
}

/// A compiled ruleset ready to scan. Cheap to share (`Arc`), `Sync`.
#[derive(Debug)]
pub struct Scanner {
    set: RuleSet,
    prefilter: KeywordFinder,
    /// The distinct keywords, in first-seen order (the prefilter's numbering).
    keywords: Vec<String>,
    /// Keyword index -> rules using that keyword.
    kw_rules: Vec<Vec<u32>>,
    /// Rules with no keywords (or an empty one, found everywhere): always run.
    always: Vec<u32>,
    /// Recursive decoding bounds (default: no decoding).
    decode: DecodeLimits,
}

/// Where a keyword hit lets a rule's match start: `lo..=hi` of the scanned
/// text, or everywhere (`hi == FULL`).
#[derive(Clone, Copy)]
struct Region {
    rule: u32,
    lo: usize,
    hi: usize,
}

/// [`Region::hi`] of a rule that runs over the whole text.
const FULL: usize = usize::MAX;

/// The regions of one scan, with at most one whole-text region per rule
/// however many of its keywords occur.
#[derive(Default)]
struct Plan {
    regions: Vec<Region>,
    /// Rules given a whole-text region (a bit per rule; allocated on first use).
    full: Vec<u64>,
}

impl Plan {
    /// Rule `rule` (of `rules`) runs over the whole text.
    fn full(&mut self, rule: u32, rules: usize) {
        if self.full.is_empty() {
            self.full.resize(rules.div_ceil(64), 0);
        }
        let (word, bit) = (rule as usize / 64, 1u64 << (rule % 64));
        if let Some(w) = self.full.get_mut(word).filter(|w| **w & bit == 0) {
            *w |= bit;
            self.regions.push(Region {
                rule,
                lo: 0,
                hi: FULL,
            });
        }
    }
}

impl Scanner {
    /// Builds a scanner from a gitleaks-format TOML text.
    pub fn from_toml(text: &str, origin: &str) -> Result<Scanner, RulesError> {
        Self::from_ruleset(RuleSet::from_toml(text, origin)?)
    }

    /// Reads and builds a gitleaks-format TOML file.
    /// A relative `[extend] path` in it is resolved from the file's directory.
    pub fn from_file(path: &std::path::Path) -> Result<Scanner, RulesError> {
        Self::from_ruleset(RuleSet::from_file(path)?)
    }

    /// The scanner over moat's embedded default ruleset.
    pub fn builtin() -> Result<Scanner, RulesError> {
        Self::from_toml(DEFAULT_RULES, "<moat default rules>")
    }

    /// Builds a scanner from a compiled ruleset.
    pub fn from_ruleset(set: RuleSet) -> Result<Scanner, RulesError> {
        let mut keywords: Vec<String> = Vec::new();
        let mut kw_rules: Vec<Vec<u32>> = Vec::new();
        let mut always = Vec::new();
        for (idx, rule) in set.rules.iter().enumerate() {
            if rule.skip_report {
                // Only run as another rule's required rule.
                continue;
            }
            if rule.keywords.is_empty() || rule.keywords.iter().any(String::is_empty) {
                always.push(idx as u32);
                continue;
            }
            for k in &rule.keywords {
                let pid = match keywords.iter().position(|x| x == k) {
                    Some(p) => p,
                    None => {
                        keywords.push(k.clone());
                        kw_rules.push(Vec::new());
                        keywords.len() - 1
                    }
                };
                if !kw_rules[pid].contains(&(idx as u32)) {
                    kw_rules[pid].push(idx as u32);
                }
            }
        }
        Ok(Scanner {
            set,
            prefilter: KeywordFinder::new(&keywords),
            keywords,
            kw_rules,
            always,
            decode: DecodeLimits::default(),
        })
    }

    /// Sets how many decoding passes follow the scan of the original text
    /// (gitleaks' `--max-decode-depth`; 0, the default, turns decoding off).
    /// Values above [`MAX_DECODE_DEPTH`] are capped to it.
    pub fn set_max_decode_depth(&mut self, depth: usize) {
        self.decode.max_depth = depth.min(MAX_DECODE_DEPTH);
    }

    /// Sets the decoding bounds (depth capped to [`MAX_DECODE_DEPTH`]).
    pub fn set_decode_limits(&mut self, limits: DecodeLimits) {
        self.decode = DecodeLimits {
            max_depth: limits.max_depth.min(MAX_DECODE_DEPTH),
            ..limits
        };
    }

    /// The decoding bounds in force.
    pub fn decode_limits(&self) -> DecodeLimits {
        self.decode
    }

    /// The keyword finder's code path: `"avx512"` (AVX-512 VBMI), `"avx2"` or
    /// `"portable"`, the widest the CPU has unless the environment variable
    /// `MOAT_SECRETS_SIMD` (`avx2` or `portable`, read when the rules are
    /// compiled) caps it. Every path finds the same keywords; benches print it.
    pub fn keyword_path(&self) -> &'static str {
        self.prefilter.path().name()
    }

    /// Every keyword occurrence as `(keyword, start)`, in start order; the
    /// prefilter's output, exposed to check it against a plain search.
    pub fn keyword_hits(&self, data: &[u8]) -> Vec<(String, usize)> {
        let mut out = Vec::new();
        self.prefilter.for_each(data, |k, start, _| {
            out.push((self.keywords[k].clone(), start))
        });
        out.sort();
        out
    }

    /// Rules that were loaded but cannot run, with the reason.
    pub fn skipped(&self) -> &[SkippedRule] {
        &self.set.skipped
    }

    /// The compiled rules, in file order.
    pub fn rules(&self) -> &[Rule] {
        &self.set.rules
    }

    /// Scans `data`; `path` (a file path) enables path rules and path allowlists.
    pub fn scan(&self, data: &[u8], path: Option<&str>) -> Vec<Finding> {
        self.scan_with_deadline(data, path, None).findings
    }

    /// Scans `data`, giving up (with partial findings) once `deadline` passes.
    pub fn scan_with_deadline(
        &self,
        data: &[u8],
        path: Option<&str>,
        deadline: Option<CoarseInstant>,
    ) -> ScanOutcome {
        self.scan_impl(data, path, None, deadline, true)
    }

    /// Scans `data` found in `commit` of a repository's history (`path` its file):
    /// allowlists listing the commit apply, as in gitleaks' history scans.
    pub fn scan_in_commit(
        &self,
        data: &[u8],
        path: Option<&str>,
        commit: Option<&str>,
    ) -> Vec<Finding> {
        self.scan_impl(data, path, commit, None, true).findings
    }

    /// Reference scan, as gitleaks does it: the payload is lowercased, a rule
    /// runs over the whole payload when one of its keywords is a substring of
    /// that copy. Same results as [`Scanner::scan`], much slower; kept to check
    /// the keyword prefilter and the windowed matcher against.
    pub fn scan_reference(&self, data: &[u8], path: Option<&str>) -> Vec<Finding> {
        self.scan_impl(data, path, None, None, false).findings
    }

    fn scan_impl(
        &self,
        data: &[u8],
        path: Option<&str>,
        commit: Option<&str>,
        deadline: Option<CoarseInstant>,
        use_windows: bool,
    ) -> ScanOutcome {
        let mut out = ScanOutcome::default();
        let path = path.filter(|p| !p.is_empty());
        if self.set.global.iter().any(|a| a.path_allows(path, commit)) {
            return out;
        }
        let mut ctx = Ctx {
            data,
            path,
            commit,
            newlines: None,
            allow_marks: None,
        };
        let mut hits: Vec<Hit> = Vec::new();
        let mut passes = Passes::default();
        let original = PassText {
            text: data,
            level: None,
        };
        if !self.scan_text(
            &original,
            &passes,
            &mut ctx,
            deadline,
            use_windows,
            &mut hits,
        ) {
            out.timed_out = true;
        } else {
            // gitleaks' ScanLoop: decode the previous pass's text, scan the result.
            let mut budget = self.decode.max_decoded_bytes;
            let mut current: Option<Vec<u8>> = None;
            for _ in 0..self.decode.max_depth.min(MAX_DECODE_DEPTH) {
                if deadline.is_some_and(|d| CoarseInstant::now() >= d) {
                    out.timed_out = true;
                    break;
                }
                let text: &[u8] = current.as_deref().unwrap_or(data);
                let Some(next) = passes.decode(text) else {
                    break;
                };
                if next.len() > budget {
                    passes.levels.pop();
                    out.decode_truncated = true;
                    break;
                }
                budget -= next.len();
                let pass = PassText {
                    text: &next,
                    level: Some(passes.levels.len() - 1),
                };
                if !self.scan_text(&pass, &passes, &mut ctx, deadline, use_windows, &mut hits) {
                    out.timed_out = true;
                    break;
                }
                current = Some(next);
            }
        }
        out.findings = generic_filter(hits, data);
        out.findings
            .sort_by(|a, b| (a.line, a.start, &a.rule_id).cmp(&(b.line, b.start, &b.rule_id)));
        out
    }

    /// One pass of gitleaks' ScanLoop: every rule whose keywords occur in the
    /// pass's text runs over it. Returns false when the deadline passed.
    fn scan_text(
        &self,
        pass: &PassText<'_>,
        passes: &Passes,
        ctx: &mut Ctx<'_>,
        deadline: Option<CoarseInstant>,
        use_windows: bool,
        hits: &mut Vec<Hit>,
    ) -> bool {
        let data = pass.text;
        // What each rule runs over: a region per keyword hit, or the whole text.
        // Only rules with a region run, so a scan costs its hits rather than the
        // size of the ruleset, and allocates nothing when no keyword occurs.
        let mut plan = Plan::default();
        let n = self.set.rules.len();
        for &r in &self.always {
            plan.full(r, n);
        }
        let rules = &self.set.rules;
        let kw_rules = &self.kw_rules;
        if use_windows {
            self.prefilter.for_each(data, |k, start, end| {
                for &r in &kw_rules[k] {
                    let rule = &rules[r as usize];
                    if rule
                        .keyword_case
                        .is_some_and(|c| !c.admits(&data[start..end]))
                    {
                        continue;
                    }
                    match rule.window.or(rule.prefix.as_ref().map(|p| p.1)) {
                        Some(_) if rule.starts_at_keyword => plan.regions.push(Region {
                            rule: r,
                            lo: start,
                            hi: start,
                        }),
                        Some(l) => plan.regions.push(Region {
                            rule: r,
                            lo: end.saturating_sub(l),
                            hi: start,
                        }),
                        None => plan.full(r, n),
                    }
                }
            });
        } else {
            let lower = data.to_ascii_lowercase();
            for (k, kw) in self.keywords.iter().enumerate() {
                if memchr::memmem::find(&lower, kw.as_bytes()).is_some() {
                    for &r in &kw_rules[k] {
                        plan.full(r, n);
                    }
                }
            }
        }
        let mut regions = plan.regions;
        regions.sort_unstable_by_key(|g| (g.rule, g.lo));
        let mut matches: Vec<(usize, usize)> = Vec::new();
        let mut rest = &regions[..];
        while let Some(first) = rest.first() {
            let idx = first.rule as usize;
            let (windows, tail) = rest.split_at(rest.partition_point(|g| g.rule == first.rule));
            rest = tail;
            let rule = &rules[idx];
            let full = windows.iter().any(|g| g.hi == FULL);
            if deadline.is_some_and(|d| CoarseInstant::now() >= d) {
                return false;
            }
            matches.clear();
            let first = hits.len();
            if !self.rule_applies(rule, ctx, pass.level.is_none(), hits) {
                continue;
            }
            let Some(re) = &rule.regex else {
                continue;
            };
            if full || !use_windows {
                matches.extend(re.find_iter(data).map(|m| (m.start(), m.end())));
            } else if let Some(l) = rule.window {
                if rule.starts_at_keyword {
                    anchored_at_starts(re, data, windows, l, &mut matches);
                } else {
                    windowed(re, data, windows, l, &mut matches);
                }
            } else if let Some((pre, l)) = &rule.prefix {
                prefixed(re, pre, data, windows, *l, &mut matches);
            } else {
                matches.extend(re.find_iter(data).map(|m| (m.start(), m.end())));
            }
            for (i, &(s, e)) in matches.iter().enumerate() {
                // A body dense in matches makes this loop the scan's cost: the
                // deadline is checked here too, not only between rules.
                if i % DEADLINE_STRIDE == DEADLINE_STRIDE - 1
                    && deadline.is_some_and(|d| CoarseInstant::now() >= d)
                {
                    return false;
                }
                if let Some(h) = self.post_process(rule, ctx, pass, passes, s, e) {
                    hits.push(h);
                }
            }
            if !rule.required.is_empty() {
                self.require(rule, pass, passes, ctx, hits, first);
            }
        }
        true
    }

    /// gitleaks' `processRequiredRules` for the findings `hits[first..]` of the
    /// composite `rule`: each required rule runs over the whole text (keywords
    /// are not consulted, `skipReport` does not apply); a finding is kept when
    /// every required rule has a finding within `withinLines` / `withinColumns`
    /// of it, and carries those findings.
    fn require(
        &self,
        rule: &Rule,
        pass: &PassText<'_>,
        passes: &Passes,
        ctx: &mut Ctx<'_>,
        hits: &mut Vec<Hit>,
        first: usize,
    ) {
        if hits.len() == first {
            return;
        }
        let mut found: Vec<Vec<Hit>> = Vec::with_capacity(rule.required.len());
        for q in &rule.required {
            let mut v = Vec::new();
            if let Some(aux) = self.set.rules.get(q.rule) {
                if self.rule_applies(aux, ctx, pass.level.is_none(), &mut v) {
                    if let Some(re) = &aux.regex {
                        let ms: Vec<(usize, usize)> = re
                            .find_iter(pass.text)
                            .map(|m| (m.start(), m.end()))
                            .collect();
                        for (s, e) in ms {
                            if let Some(h) = self.post_process(aux, ctx, pass, passes, s, e) {
                                v.push(h);
                            }
                        }
                    }
                }
            }
            found.push(v);
        }
        let primaries: Vec<Hit> = hits.drain(first..).collect();
        for mut p in primaries {
            let mut attached: Vec<RequiredFinding> = Vec::new();
            let mut have: Vec<&str> = Vec::new();
            for (q, v) in rule.required.iter().zip(&found) {
                for h in v {
                    if within(&p.finding, &h.finding, q) {
                        attached.push(RequiredFinding {
                            rule_id: h.finding.rule_id.clone(),
                            start: h.finding.start,
                            end: h.finding.end,
                            line: h.finding.line,
                            column: h.finding.column,
                        });
                        have.push(&h.finding.rule_id);
                    }
                }
            }
            if !attached.is_empty() && rule.required.iter().all(|q| have.contains(&&*q.rule_id)) {
                p.finding.required = attached;
                hits.push(p);
            }
        }
    }

    /// Path checks of gitleaks' detectRule. Returns false when the rule's content
    /// regex must not run; pushes a path-only finding when one applies (only in
    /// the scan of the original text: `path_only_ok`).
    fn rule_applies(
        &self,
        rule: &Rule,
        ctx: &mut Ctx<'_>,
        path_only_ok: bool,
        out: &mut Vec<Hit>,
    ) -> bool {
        if rule
            .allowlists
            .iter()
            .any(|a| a.path_allows(ctx.path, ctx.commit))
        {
            return false;
        }
        if let Some(pre) = &rule.path {
            let p = ctx.path.unwrap_or("");
            let path_ok = pre.is_match(p.as_bytes());
            if rule.regex.is_none() {
                if path_ok && path_only_ok {
                    out.push(Hit {
                        finding: Finding {
                            rule_id: rule.id.clone(),
                            description: rule.description.clone(),
                            start: 0,
                            end: 0,
                            leading_newlines: 0,
                            secret_start: 0,
                            secret_end: 0,
                            line: 0,
                            column: 0,
                            entropy: 0.0,
                            path_only: true,
                            decoded: None,
                            required: Vec::new(),
                        },
                        secret: None,
                    });
                }
                return false;
            }
            if !path_ok {
                return false;
            }
        }
        rule.regex.is_some()
    }

    /// gitleaks' per-match processing in detectRule: newline trim, location,
    /// `gitleaks:allow`, secret group, entropy, allowlists. In a decoded pass,
    /// a match must touch a segment decoded in that pass; its location is the
    /// original encoded text it came from, and the `line` allowlist target is
    /// the decoded line.
    fn post_process(
        &self,
        rule: &Rule,
        ctx: &mut Ctx<'_>,
        pass: &PassText<'_>,
        passes: &Passes,
        s: usize,
        e: usize,
    ) -> Option<Hit> {
        let data = ctx.data;
        let text = pass.text;
        let re = rule.regex.as_ref()?;
        let raw = &text[s..e];
        let lead = raw.iter().take_while(|&&b| b == b'\n').count();
        let trail = if lead == raw.len() {
            0
        } else {
            raw.iter().rev().take_while(|&&b| b == b'\n').count()
        };
        let trimmed = &raw[lead..raw.len() - trail];
        let t_start = s + lead;
        // Decoded pass: the segments the match touches and its original span.
        let mut decoded = None;
        let mut current_line: Option<&[u8]> = None;
        let (loc_start, loc_end) = match pass.level {
            None => (t_start, t_start + trimmed.len()),
            Some(level) => {
                let span = Span {
                    start: s as i64,
                    end: e as i64,
                };
                let segs: Vec<&Segment> = passes
                    .levels
                    .get(level)?
                    .iter()
                    .filter(|g| g.decoded.overlaps(span))
                    .collect();
                let first = segs.first()?;
                let adj = passes.to_original(level, &segs, span);
                let clamp = |v: i64| usize::try_from(v).unwrap_or(0).min(data.len());
                let (a, b) = (clamp(adj.start), clamp(adj.end));
                let bits = segs.iter().fold(0u8, |acc, g| acc | g.encodings);
                decoded = Some(Decoded {
                    encodings: encoding_names(bits),
                    depth: first.depth,
                    matched: Vec::new(),
                    secret: Vec::new(),
                    preceding: text[t_start.saturating_sub(PRECEDING_BYTES)..t_start].to_vec(),
                });
                current_line = Some(decoded_line(&segs, text));
                (a, b.max(a))
            }
        };
        // gitleaks computes the location from [start, start + len(trimmed)) (or
        // the mapped span of a decoded match).
        let (lb_start, lb_end) = match pass.level {
            None => (s, s + trimmed.len()),
            Some(_) => (loc_start, loc_end),
        };
        let (sli, eli) = ctx.line_bounds(lb_start, lb_end);
        let (line_start, line_end) = (sli.min(data.len()), eli.max(lb_end).min(data.len()));
        let line = &data[line_start..line_end.max(line_start)];
        if ctx.allow_marked(line_start, line_end) {
            return None;
        }
        // Capture groups are recomputed on the trimmed match as a standalone string.
        let (mut ss, mut se) = (0, trimmed.len());
        let mut caps = re.create_captures();
        re.search_captures(&Input::new(trimmed), &mut caps);
        let ngroups = caps.group_len();
        if caps.is_match() && ngroups >= 2 {
            if rule.secret_group > 0 {
                match caps.get_group(rule.secret_group) {
                    Some(sp) => (ss, se) = (sp.start, sp.end),
                    None => (ss, se) = (0, 0),
                }
            } else {
                for g in 1..ngroups {
                    if let Some(sp) = caps.get_group(g) {
                        if sp.end > sp.start {
                            (ss, se) = (sp.start, sp.end);
                            break;
                        }
                    }
                }
            }
        }
        let secret = &trimmed[ss..se];
        let entropy = shannon_entropy(secret);
        if rule.entropy != 0.0 && entropy <= rule.entropy {
            return None;
        }
        let target_line = current_line.unwrap_or(line);
        for a in self.set.global.iter().chain(rule.allowlists.iter()) {
            if a.finding_allows(secret, trimmed, target_line, ctx.path, ctx.commit) {
                return None;
            }
        }
        let (line_no, col) = ctx.line_col(loc_start);
        if let Some(d) = decoded.as_mut() {
            d.matched = trimmed.to_vec();
            d.secret = secret.to_vec();
        }
        let (secret_start, secret_end, kept) = match decoded {
            None => (t_start + ss, t_start + se, None),
            Some(_) => (loc_start, loc_end, Some(Box::<[u8]>::from(secret))),
        };
        Some(Hit {
            finding: Finding {
                rule_id: rule.id.clone(),
                description: rule.description.clone(),
                start: loc_start,
                end: loc_end,
                leading_newlines: if pass.level.is_none() { lead } else { 0 },
                secret_start,
                secret_end,
                line: line_no,
                column: col,
                entropy,
                path_only: false,
                decoded,
                required: Vec::new(),
            },
            secret: kept,
        })
    }
}

/// gitleaks `CurrentLine`: from the newline before the (merged) decoded range
/// of `segs` to the newline after it, in the decoded text.
fn decoded_line<'t>(segs: &[&Segment], text: &'t [u8]) -> &'t [u8] {
    let Some(first) = segs.first() else {
        return text;
    };
    let (mut ds, mut de) = (first.decoded.start, first.decoded.end);
    for g in &segs[1..] {
        ds = ds.min(g.decoded.start);
        de = de.max(g.decoded.end);
    }
    let ds = usize::try_from(ds).unwrap_or(0).min(text.len());
    let de = usize::try_from(de).unwrap_or(0).min(text.len());
    let start = if ds < text.len() {
        memchr::memrchr(b'\n', &text[..=ds]).unwrap_or(0)
    } else {
        0
    };
    let end = memchr::memchr(b'\n', &text[de..]).map_or(text.len(), |i| de + i);
    &text[start..end.max(start)]
}

/// gitleaks `withinProximity`, on its line numbers and columns (a column on a
/// line after the first counts from the newline before it, one more than
/// moat's; a path-only finding has line and column 0).
fn within(primary: &Finding, aux: &Finding, q: &Required) -> bool {
    let col = |f: &Finding| {
        if f.line > 1 {
            f.column as i64 + 1
        } else {
            f.column as i64
        }
    };
    if let Some(l) = q.within_lines {
        if (primary.line as i64 - aux.line as i64).abs() > l {
            return false;
        }
    }
    if let Some(c) = q.within_columns {
        if (col(primary) - col(aux)).abs() > c {
            return false;
        }
    }
    true
}

/// The text one pass scans: the original (`level` None) or decoding pass `level + 1`.
struct PassText<'t> {
    text: &'t [u8],
    level: Option<usize>,
}

/// A finding with, for a decoded one, its secret (not in the original text).
struct Hit {
    finding: Finding,
    secret: Option<Box<[u8]>>,
}

impl Hit {
    fn secret<'a>(&'a self, data: &'a [u8]) -> &'a [u8] {
        match &self.secret {
            Some(s) => s,
            None => data
                .get(self.finding.secret_start..self.finding.secret_end)
                .unwrap_or(&[]),
        }
    }
}

/// The regions (sorted by `lo`) as `(lo, hi)` spans, overlapping and adjacent
/// regions merged into one: a search runs once over each span.
fn merged(regions: &[Region]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let first = regions.get(i)?;
        let (lo, mut hi) = (first.lo, first.hi);
        i += 1;
        while let Some(next) = regions.get(i).filter(|r| r.lo <= hi.saturating_add(1)) {
            hi = hi.max(next.hi);
            i += 1;
        }
        Some((lo, hi))
    })
}

/// Runs `re` over the regions where a match may start, reproducing exactly the
/// matches `find_iter` would report over the whole payload: every match contains
/// a keyword hit and is at most `l` bytes long, so it starts in some
/// `[hit_end - l, hit_start]` and ends before `region_hi + l`. Searches keep the
/// whole payload as context for `\b`, `^`, `$`.
fn windowed(
    re: &regex_automata::meta::Regex,
    data: &[u8],
    regions: &[Region],
    l: usize,
    out: &mut Vec<(usize, usize)>,
) {
    let mut pos = 0usize;
    for (lo, hi) in merged(regions) {
        let mut at = lo.max(pos);
        while at <= hi {
            let end = hi.saturating_add(l).min(data.len());
            if at > end {
                break;
            }
            let input = Input::new(data).range(at..end);
            match re.find(input) {
                Some(m) if m.start() <= hi => {
                    out.push((m.start(), m.end()));
                    pos = resume_after(&m);
                    at = pos;
                }
                _ => break,
            }
        }
    }
}

/// Runs `re` anchored at the start `lo` of each region (keyword hits, sorted),
/// for a rule whose every match starts with a keyword and is at most `l` bytes
/// long ([`Rule::starts_at_keyword`]). This reproduces `find_iter`: a match can
/// start nowhere but at a hit, the leftmost start is the first hit past the last
/// match where an anchored attempt succeeds, and there the anchored search
/// prefers the same match. An attempt that fails reads only as far as the regex
/// can still match (`SKU-` fails at the `U`), where [`windowed`]' search reads
/// the whole window.
fn anchored_at_starts(
    re: &regex_automata::meta::Regex,
    data: &[u8],
    regions: &[Region],
    l: usize,
    out: &mut Vec<(usize, usize)>,
) {
    let mut pos = 0usize;
    for g in regions {
        let s = g.lo;
        if s < pos {
            continue;
        }
        let end = s.saturating_add(l).min(data.len());
        let input = Input::new(data)
            .range(s..end)
            .anchored(regex_automata::Anchored::Yes);
        match re.find(input) {
            Some(m) => {
                out.push((m.start(), m.end()));
                pos = resume_after(&m);
            }
            None => pos = s + 1,
        }
    }
}

/// Anchored attempts [`prefixed`] makes per rule and scan before it falls back
/// to unanchored searches. An attempt that fails scans as far as the rule's
/// unbounded part runs (at worst the rest of the payload), so the budget bounds
/// the extra work on hostile input to this many passes over the payload.
const ANCHORED_ATTEMPTS: usize = 16;

/// Like [`windowed`] for a rule whose matches are unbounded but always start
/// where `pre` matches (bounded by `l`, containing a keyword). In a region, the
/// leftmost start `q` of `pre` is found first; no match of the rule starts
/// before it. The rule's match anchored at `q`, if any, is then the one
/// `find_iter` reports (the leftmost start, and at that start the same
/// preferred match); if there is none, the next start of `pre` is tried. Most
/// prefixes that fail (`key: &str`) fail within a few bytes, where an
/// unanchored search would run to the end of the payload. Past
/// [`ANCHORED_ATTEMPTS`], the rule's leftmost match from `q` is searched over the
/// rest of the payload instead; that result is kept until the scan reaches it,
/// and a search that finds nothing ends the rule.
fn prefixed(
    re: &regex_automata::meta::Regex,
    pre: &regex_automata::meta::Regex,
    data: &[u8],
    regions: &[Region],
    l: usize,
    out: &mut Vec<(usize, usize)>,
) {
    let mut pos = 0usize;
    let mut attempts = ANCHORED_ATTEMPTS;
    // (searched from, leftmost match at or after it)
    let mut cache: Option<(usize, Option<(usize, usize)>)> = None;
    for (lo, hi) in merged(regions) {
        let mut at = lo.max(pos);
        while at <= hi {
            if let Some((from, res)) = cache {
                if from <= at {
                    match res {
                        None => return,
                        Some((s, e)) if s >= at => {
                            if s > hi {
                                break;
                            }
                            out.push((s, e));
                            pos = if e > s { e } else { e + 1 };
                            at = pos;
                            cache = None;
                            continue;
                        }
                        Some(_) => cache = None,
                    }
                }
            }
            let end = hi.saturating_add(l).min(data.len());
            if at > end {
                break;
            }
            let q = match pre.find(Input::new(data).range(at..end)) {
                Some(m) if m.start() <= hi => m.start(),
                _ => break,
            };
            if attempts > 0 {
                attempts -= 1;
                let input = Input::new(data)
                    .range(q..data.len())
                    .anchored(regex_automata::Anchored::Yes);
                match re.find(input) {
                    Some(m) => {
                        out.push((m.start(), m.end()));
                        pos = resume_after(&m);
                        at = pos;
                    }
                    None => at = q + 1,
                }
                continue;
            }
            let found = re
                .find(Input::new(data).range(q..data.len()))
                .map(|m| (m.start(), m.end()));
            cache = Some((q, found));
            at = q;
        }
    }
}

struct Ctx<'a> {
    data: &'a [u8],
    path: Option<&'a str>,
    /// The commit of a history scan (commit allowlists).
    commit: Option<&'a str>,
    newlines: Option<Vec<usize>>,
    /// Start offsets of every `gitleaks:allow` in `data`, found once per scan:
    /// searching each match's line instead costs matches × line length, which a
    /// one-line body dense in matches turns into seconds.
    allow_marks: Option<Vec<usize>>,
}

impl Ctx<'_> {
    /// Whether `data[start..end]` contains [`ALLOW_SIGNATURE`].
    fn allow_marked(&mut self, start: usize, end: usize) -> bool {
        let data = self.data;
        let marks = self
            .allow_marks
            .get_or_insert_with(|| memchr::memmem::find_iter(data, ALLOW_SIGNATURE).collect());
        let i = marks.partition_point(|&m| m < start);
        marks
            .get(i)
            .is_some_and(|&m| m + ALLOW_SIGNATURE.len() <= end)
    }

    fn newlines(&mut self) -> &[usize] {
        let data = self.data;
        self.newlines
            .get_or_insert_with(|| memchr::memchr_iter(b'\n', data).collect())
    }

    /// gitleaks' `location()` line index bounds for the match `[start, end)`.
    fn line_bounds(&mut self, start: usize, end: usize) -> (usize, usize) {
        let len = self.data.len();
        let data = self.data;
        let nls = self.newlines();
        let single = [len];
        let nls: &[usize] = if nls.is_empty() { &single } else { nls };
        let i = nls.partition_point(|&nl| nl <= start);
        if i < nls.len() {
            let sli = if i == 0 { 0 } else { nls[i - 1] };
            let mut eli = nls[i];
            let j = nls.partition_point(|&nl| nl < end);
            if j < nls.len() {
                let prev = if j == 0 { 0 } else { nls[j - 1] };
                if prev < end {
                    eli = nls[j];
                }
            }
            (sli, eli)
        } else {
            let mut k = end;
            while k < len && data[k] != b'\n' && data[k] != b'\r' {
                k += 1;
            }
            (0, k)
        }
    }

    fn line_col(&mut self, pos: usize) -> (usize, usize) {
        let nls = self.newlines();
        let i = nls.partition_point(|&nl| nl < pos);
        let line_start = if i == 0 { 0 } else { nls[i - 1] + 1 };
        (i + 1, pos - line_start + 1)
    }
}

/// gitleaks' `shannonEntropy`: rune frequencies over the byte length.
pub fn shannon_entropy(data: &[u8]) -> f64 {
    if data.is_empty() {
        return 0.0;
    }
    let inv = 1.0 / data.len() as f64;
    let mut entropy = 0.0;
    if data.is_ascii() {
        let mut counts = [0u32; 128];
        for &b in data {
            counts[b as usize] += 1;
        }
        for &c in counts.iter().filter(|&&c| c > 0) {
            let f = c as f64 * inv;
            entropy -= f * f.log2();
        }
        return entropy;
    }
    // Summed in character order: a hash map's order changes between runs, and with
    // it the last bit of the sum (the fuzzer found two scans of one secret differ).
    let mut counts: std::collections::BTreeMap<char, u32> = std::collections::BTreeMap::new();
    for chunk in data.utf8_chunks() {
        for ch in chunk.valid().chars() {
            *counts.entry(ch).or_default() += 1;
        }
        if !chunk.invalid().is_empty() {
            *counts.entry('\u{FFFD}').or_default() += chunk.invalid().len() as u32;
        }
    }
    for &c in counts.values() {
        let f = c as f64 * inv;
        entropy -= f * f.log2();
    }
    entropy
}

/// gitleaks' post-filter: a finding of a rule whose id contains "generic" is
/// dropped when a non-generic finding on the same line has a secret containing it.
fn generic_filter(hits: Vec<Hit>, data: &[u8]) -> Vec<Finding> {
    let is_generic = |f: &Finding| f.rule_id.to_lowercase().contains("generic");
    if !hits.iter().any(|h| is_generic(&h.finding)) {
        return hits.into_iter().map(|h| h.finding).collect();
    }
    let keep: Vec<bool> = hits
        .iter()
        .map(|h| {
            let f = &h.finding;
            if !is_generic(f) {
                return true;
            }
            let secret = h.secret(data);
            !hits.iter().any(|g| {
                g.finding.line == f.line
                    && g.finding.rule_id != f.rule_id
                    && !is_generic(&g.finding)
                    && (secret.is_empty() || memchr::memmem::find(g.secret(data), secret).is_some())
            })
        })
        .collect();
    hits.into_iter()
        .zip(keep)
        .filter_map(|(h, k)| k.then_some(h.finding))
        .collect()
}

/// Replaces each finding's secret with `marker(rule_id)`; overlapping secrets are
/// merged into the first. Path-only findings are ignored.
pub fn redact_with(data: &[u8], findings: &[Finding], marker: impl Fn(&str) -> String) -> Vec<u8> {
    let mut spans: Vec<(usize, usize, &str)> = findings
        .iter()
        .filter(|f| !f.path_only)
        .map(|f| {
            if f.secret_end > f.secret_start {
                (f.secret_start, f.secret_end, &*f.rule_id)
            } else {
                (f.start, f.end, &*f.rule_id)
            }
        })
        .filter(|(s, e, _)| e > s && *e <= data.len())
        .collect();
    spans.sort_by_key(|&(s, e, _)| (s, std::cmp::Reverse(e)));
    let mut out = Vec::with_capacity(data.len());
    let mut pos = 0;
    for (s, e, id) in spans {
        if s < pos {
            pos = pos.max(e);
            continue;
        }
        out.extend_from_slice(&data[pos..s]);
        out.extend_from_slice(marker(id).as_bytes());
        pos = e;
    }
    out.extend_from_slice(&data[pos.min(data.len())..]);
    out
}

/// Replaces each finding's secret with `[REDACTED:rule-id]`.
pub fn redact(data: &[u8], findings: &[Finding]) -> Vec<u8> {
    redact_with(data, findings, |id| format!("[REDACTED:{id}]"))
}

/// Where the next search starts after match `m`: its end, or one past it for an
/// empty match (which would otherwise be found again at the same place).
fn resume_after(m: &regex_automata::Match) -> usize {
    if m.end() > m.start() {
        m.end()
    } else {
        m.end() + 1
    }
}
