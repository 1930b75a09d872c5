//! Virtual patches: rules for known exploit endpoints and parameters of
//! popular products (a method, a path template, parameter conditions, CVE ids),
//! loaded from YAML through `moat_config` (errors carry file, line, column and
//! field) and compiled once into a [`PatchSet`].
//!
//! Rule file format (see `rules/virtual-patches.yaml`, the starter pack):
//!
//! ```yaml
//! rules:
//!   - id: CVE-2022-1388                 # unique; findings and exclusions name it
//!     cve: [CVE-2022-1388]
//!     description: F5 BIG-IP iControl REST auth bypass
//!     methods: [POST]                   # absent: any method
//!     path: /mgmt/tm/util/bash          # template: literal segments, `*` one segment,
//!                                       # `**` any number, `*.ext`/`pre*` in a segment
//!     when:                             # every condition must hold
//!       - { in: header, name: connection, contains: [x-f5-auth-token] }
//!     when_any: []                      # if given, at least one must hold
//!     confidence: 95
//!     examples:                         # checked by the tests: each rule blocks
//!       block: [{ method: POST, target: /mgmt/tm/util/bash, headers: {...} }]
//!       pass:  [{ target: /mgmt/tm/sys/version }]
//! ```
//!
//! A condition names a place (`path`: the URL-decoded path, `raw-path`: the path
//! as received, `query`: the decoded query string, `param`: a query/form/multipart
//! parameter by `name` (`name*` for a prefix), `param-name`: any parameter name,
//! `header`: a header by `name`, `body`: the decoded body, `any`: path, query,
//! headers or body) and tests (`equals`, `prefix`, `suffix`, `contains`, each a
//! list of alternatives, all ASCII case-insensitive). A condition without a test
//! requires the parameter or header to be present.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use moat_config::ConfigError;
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use crate::decode;
use crate::util::{contains_ci, starts_with_ci};

/// The starter pack shipped with moat.
pub const BUILTIN: &str = include_str!("../rules/virtual-patches.yaml");
/// Label used as the file name of the starter pack in errors.
pub const BUILTIN_NAME: &str = "<builtin>/virtual-patches.yaml";

/// A rule file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleFile {
    /// The rules.
    pub rules: Vec<RuleSpec>,
}

/// One rule as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Unique id (usually the CVE id).
    pub id: Spanned<String>,
    /// CVE ids this rule covers.
    #[serde(default)]
    pub cve: Vec<String>,
    /// What the rule stops.
    #[serde(default)]
    pub description: String,
    /// Methods (absent or empty: any).
    #[serde(default)]
    pub methods: Vec<Spanned<String>>,
    /// Path template (default `/**`).
    #[serde(default = "any_path")]
    pub path: Spanned<String>,
    /// Conditions that must all hold.
    #[serde(default)]
    pub when: Vec<CondSpec>,
    /// Conditions of which at least one must hold (when non-empty).
    #[serde(default)]
    pub when_any: Vec<CondSpec>,
    /// Confidence of the finding (default 95).
    #[serde(default = "default_confidence")]
    pub confidence: u8,
    /// Example requests: `block` must match, `pass` must not (checked by tests).
    #[serde(default)]
    pub examples: Examples,
}

fn any_path() -> Spanned<String> {
    let unknown = serde_saphyr::Location::UNKNOWN;
    Spanned::new("/**".to_string(), unknown, unknown)
}

fn default_confidence() -> u8 {
    95
}

/// Where a condition looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Place {
    /// URL-decoded path.
    Path,
    /// Path as received.
    RawPath,
    /// Decoded query string.
    Query,
    /// A parameter (query, urlencoded form, multipart field) by name.
    Param,
    /// Any parameter name.
    ParamName,
    /// A header by name.
    Header,
    /// The decoded body.
    Body,
    /// Path, query, any header or body.
    Any,
}

/// One condition as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CondSpec {
    /// Where to look.
    #[serde(rename = "in")]
    pub place: Spanned<Place>,
    /// Parameter or header name (`param`, `header`); `name*` matches a prefix.
    #[serde(default)]
    pub name: Option<String>,
    /// The value equals one of these.
    #[serde(default)]
    pub equals: Vec<String>,
    /// The value starts with one of these.
    #[serde(default)]
    pub prefix: Vec<String>,
    /// The value ends with one of these.
    #[serde(default)]
    pub suffix: Vec<String>,
    /// The value contains one of these.
    #[serde(default)]
    pub contains: Vec<String>,
}

/// Example requests of a rule.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Examples {
    /// Requests the rule must match.
    #[serde(default)]
    pub block: Vec<Example>,
    /// Requests the rule must not match.
    #[serde(default)]
    pub pass: Vec<Example>,
}

/// An example request.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Example {
    /// Method (default GET).
    #[serde(default = "get")]
    pub method: String,
    /// Request target (`/path?query`).
    pub target: String,
    /// Headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Body.
    #[serde(default)]
    pub body: String,
}

fn get() -> String {
    "GET".into()
}

#[derive(Debug, Clone)]
enum Seg {
    Lit(String),
    Prefix(String),
    Suffix(String),
    One,
    Many,
}

#[derive(Debug, Clone)]
struct Cond {
    /// Every test string has a byte other than letters, digits, `_`, `-`.
    special: bool,
    /// Index in [`PatchSet::param_conds`] (parameter conditions).
    pid: usize,
    /// A byte every test string contains (their common first byte, when not a
    /// letter): a value without it fails without a search per string.
    gate: Option<u8>,
    place: Place,
    name: Option<(String, bool)>,
    equals: Vec<String>,
    prefix: Vec<String>,
    suffix: Vec<String>,
    contains: Vec<String>,
}

/// A compiled rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Rule id.
    pub id: String,
    /// CVE ids.
    pub cve: Vec<String>,
    /// Description.
    pub description: String,
    methods: Vec<String>,
    segs: Vec<Seg>,
    /// Longest literal segment (lowercase): the path must contain it.
    anchor: Option<String>,
    all: Vec<Cond>,
    any: Vec<Cond>,
    /// Finding confidence.
    pub confidence: u8,
    uses_body: bool,
    /// Every condition is a parameter condition: nothing to do without parameter facts.
    facts_only: bool,
}

/// A compiled set of rules, indexed by the first literal path segment.
/// Parameter conditions are evaluated on the parameters the inspector decodes
/// anyway (see [`ParamFacts`]): no second parse of query, form or multipart.
#[derive(Debug, Clone, Default)]
pub struct PatchSet {
    rules: Vec<Rule>,
    /// Rules by first literal path segment (lowercase); a short list, scanned.
    by_first: Vec<(String, Vec<usize>)>,
    global: Vec<usize>,
    /// Every `param`/`param-name` condition (copies; `pid` is the index here).
    param_conds: Vec<Cond>,
    /// Bit n: some `param` condition names a parameter of length n (< 64).
    name_lens: u64,
    /// Some parameter condition can hold for a name of letters, digits, `_`, `-`
    /// whatever its length (a name prefix, a long name, a plain test string).
    plain_general: bool,
}

/// What the parameters of one request satisfied: per parameter condition of
/// the set, the first matching (location, fragment).
#[derive(Debug, Clone, Default)]
pub struct ParamFacts {
    hits: Vec<Option<(String, String)>>,
}

/// A rule match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchHit {
    /// Rule id.
    pub rule: String,
    /// Location of the deciding condition (`path`, `query:NAME`, `header:NAME`, `body`).
    pub location: String,
    /// What matched (truncated).
    pub fragment: String,
    /// Confidence.
    pub confidence: u8,
}

/// Parses one rule file (YAML) read from `file`.
pub fn parse(file: &Path, text: &str) -> Result<Vec<RuleSpec>, ConfigError> {
    Ok(moat_config::from_str::<RuleFile>(file, text)?.rules)
}

fn err<T>(file: &Path, s: &Spanned<T>, field: String, msg: impl Into<String>) -> ConfigError {
    ConfigError::semantic(
        file,
        s.referenced.line() as u32,
        s.referenced.column() as u32,
        field,
        msg,
    )
}

fn compile_cond(file: &Path, field: String, c: &CondSpec) -> Result<Cond, ConfigError> {
    let place = c.place.value;
    let needs_name = matches!(place, Place::Param | Place::Header);
    if needs_name && c.name.as_deref().is_none_or(str::is_empty) {
        return Err(err(
            file,
            &c.place,
            format!("{field}.name"),
            "`param` and `header` conditions need a `name`",
        ));
    }
    if !needs_name && c.name.is_some() {
        return Err(err(
            file,
            &c.place,
            format!("{field}.name"),
            "only `param` and `header` conditions take a `name`",
        ));
    }
    let tests = c.equals.len() + c.prefix.len() + c.suffix.len() + c.contains.len();
    if tests == 0 && !needs_name {
        return Err(err(
            file,
            &c.place,
            field,
            "a condition needs `equals`, `prefix`, `suffix` or `contains`",
        ));
    }
    let all = c.equals.iter().chain(&c.prefix).chain(&c.suffix);
    if all.chain(&c.contains).any(String::is_empty) {
        return Err(err(file, &c.place, field, "empty string in a test list"));
    }
    let low = |v: &Vec<String>| v.iter().map(|s| s.to_ascii_lowercase()).collect();
    // gate: a non-letter byte every test string contains (`$` for `${jndi:`...)
    let strings: Vec<String> = c
        .equals
        .iter()
        .chain(&c.prefix)
        .chain(&c.suffix)
        .chain(&c.contains)
        .map(|s| s.to_ascii_lowercase())
        .collect();
    // (bytes common in every URL, `/ . - _`, only when nothing rarer is shared)
    let gate = strings.first().and_then(|f| {
        let shared: Vec<u8> = f
            .bytes()
            .filter(|b| !b.is_ascii_alphanumeric())
            .filter(|&g| strings.iter().all(|s| s.as_bytes().contains(&g)))
            .collect();
        let common = |b: &u8| matches!(b, b'/' | b'.' | b'-' | b'_');
        shared
            .iter()
            .find(|b| !common(b))
            .or_else(|| shared.first())
            .copied()
    });
    // a parameter name made of letters, digits, `_` and `-` only cannot hold
    // a test string that has another byte
    let special = !strings.is_empty()
        && strings.iter().all(|s| {
            s.bytes()
                .any(|b| !(b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
        });
    Ok(Cond {
        special,
        gate,
        pid: usize::MAX,
        place,
        name: c.name.as_ref().map(|n| {
            let l = n.to_ascii_lowercase();
            match l.strip_suffix('*') {
                Some(p) => (p.to_string(), true),
                None => (l, false),
            }
        }),
        equals: low(&c.equals),
        prefix: low(&c.prefix),
        suffix: low(&c.suffix),
        contains: low(&c.contains),
    })
}

fn compile_path(file: &Path, field: &str, p: &Spanned<String>) -> Result<Vec<Seg>, ConfigError> {
    if !p.value.starts_with('/') {
        return Err(err(
            file,
            p,
            field.into(),
            "a path template starts with `/`",
        ));
    }
    let mut segs = Vec::new();
    for s in p.value.split('/').filter(|s| !s.is_empty()) {
        let l = s.to_ascii_lowercase();
        let seg = match l.as_str() {
            "**" => Seg::Many,
            "*" => Seg::One,
            _ if l.starts_with('{') && l.ends_with('}') => Seg::One,
            _ => match (l.strip_prefix('*'), l.strip_suffix('*')) {
                (Some(rest), _) if !rest.contains('*') => Seg::Suffix(rest.into()),
                (_, Some(rest)) if !rest.contains('*') => Seg::Prefix(rest.into()),
                _ if l.contains('*') => {
                    return Err(err(
                        file,
                        p,
                        field.into(),
                        format!("segment `{s}`: `*` only as a whole segment, a prefix or a suffix"),
                    ))
                }
                _ => Seg::Lit(l),
            },
        };
        segs.push(seg);
    }
    Ok(segs)
}

impl PatchSet {
    /// Compiles rules (from one or more files: `(file, rules)`), skipping `disabled` ids.
    pub fn compile<P: AsRef<Path>>(
        sources: &[(P, Vec<RuleSpec>)],
        disabled: &[String],
    ) -> Result<PatchSet, ConfigError> {
        let mut set = PatchSet::default();
        let mut seen: HashSet<String> = HashSet::new();
        for (file, specs) in sources {
            let file = file.as_ref();
            for (i, r) in specs.iter().enumerate() {
                let f = format!("rules[{i}]");
                if r.id.value.trim().is_empty() {
                    return Err(err(file, &r.id, format!("{f}.id"), "empty rule id"));
                }
                if !seen.insert(r.id.value.clone()) {
                    return Err(err(
                        file,
                        &r.id,
                        format!("{f}.id"),
                        format!("duplicate rule id `{}`", r.id.value),
                    ));
                }
                if r.confidence > 100 {
                    return Err(err(
                        file,
                        &r.id,
                        format!("{f}.confidence"),
                        "confidence is 0-100",
                    ));
                }
                let mut methods = Vec::new();
                for (k, m) in r.methods.iter().enumerate() {
                    if m.value.is_empty() || !m.value.bytes().all(|c| c.is_ascii_alphabetic()) {
                        return Err(err(
                            file,
                            m,
                            format!("{f}.methods[{k}]"),
                            format!("`{}` is not an HTTP method", m.value),
                        ));
                    }
                    methods.push(m.value.to_ascii_uppercase());
                }
                let segs = compile_path(file, &format!("{f}.path"), &r.path)?;
                let mut all: Vec<Cond> = Vec::new();
                for (k, c) in r.when.iter().enumerate() {
                    all.push(compile_cond(file, format!("{f}.when[{k}]"), c)?);
                }
                let mut any: Vec<Cond> = Vec::new();
                for (k, c) in r.when_any.iter().enumerate() {
                    any.push(compile_cond(file, format!("{f}.when_any[{k}]"), c)?);
                }
                // cheapest first: parameter facts are lookups, then the URL, headers, body
                let cost = |c: &Cond| match c.place {
                    Place::Param | Place::ParamName => 0,
                    Place::Path | Place::RawPath | Place::Query => 1,
                    Place::Header => 2,
                    Place::Body | Place::Any => 3,
                };
                all.sort_by_key(cost);
                any.sort_by_key(cost);
                let literal = segs.iter().any(|s| matches!(s, Seg::Lit(_)));
                if all.is_empty() && any.is_empty() && !literal {
                    return Err(err(
                        file,
                        &r.path,
                        format!("{f}.path"),
                        "a rule without conditions needs a literal path segment",
                    ));
                }
                if disabled.iter().any(|d| d == &r.id.value) {
                    continue;
                }
                let anchor = segs
                    .iter()
                    .filter_map(|s| match s {
                        Seg::Lit(l) | Seg::Prefix(l) | Seg::Suffix(l) => Some(l),
                        _ => None,
                    })
                    .max_by_key(|l| l.len())
                    .cloned();
                let uses_body = all.iter().chain(&any).any(|c| {
                    matches!(
                        c.place,
                        Place::Body | Place::Any | Place::Param | Place::ParamName
                    )
                });
                let idx = set.rules.len();
                match segs.first() {
                    Some(Seg::Lit(l)) => match set.by_first.iter_mut().find(|(k, _)| k == l) {
                        Some((_, v)) => v.push(idx),
                        None => set.by_first.push((l.clone(), vec![idx])),
                    },
                    _ => set.global.push(idx),
                }
                for list in [&mut all, &mut any] {
                    for c in list.iter_mut() {
                        if matches!(c.place, Place::Param | Place::ParamName) {
                            c.pid = set.param_conds.len();
                            match (&c.name, c.place) {
                                (Some((n, false)), _) if n.len() < 64 => {
                                    set.name_lens |= 1 << n.len()
                                }
                                (_, Place::ParamName) if c.special => {}
                                _ => set.plain_general = true,
                            }
                            set.param_conds.push(c.clone());
                        }
                    }
                }
                let facts_only = !(all.is_empty() && any.is_empty())
                    && all
                        .iter()
                        .chain(&any)
                        .all(|c| matches!(c.place, Place::Param | Place::ParamName));
                set.rules.push(Rule {
                    id: r.id.value.clone(),
                    cve: r.cve.clone(),
                    description: r.description.clone(),
                    methods,
                    segs,
                    anchor,
                    all,
                    any,
                    confidence: r.confidence,
                    uses_body,
                    facts_only,
                });
            }
        }
        Ok(set)
    }

    /// The starter pack, compiled.
    pub fn builtin() -> Result<PatchSet, ConfigError> {
        let file = Path::new(BUILTIN_NAME);
        PatchSet::compile(&[(file, parse(file, BUILTIN)?)], &[])
    }

    /// Loads the configured rules: the starter pack (if `builtin`) and `files`
    /// (relative to `base`).
    pub fn load(cfg: &crate::config::VirtualPatches, base: &Path) -> Result<PatchSet, ConfigError> {
        let mut sources: Vec<(std::path::PathBuf, Vec<RuleSpec>)> = Vec::new();
        if cfg.builtin {
            let file = Path::new(BUILTIN_NAME);
            sources.push((file.to_path_buf(), parse(file, BUILTIN)?));
        }
        for f in &cfg.files {
            let p = base.join(f);
            let text = std::fs::read_to_string(&p).map_err(|e| {
                ConfigError::semantic(&p, 0, 0, "", format!("cannot read rule file: {e}"))
            })?;
            let rules = parse(&p, &text)?;
            sources.push((p, rules));
        }
        PatchSet::compile(&sources, &cfg.disabled)
    }

    /// Records which parameter conditions a decoded parameter satisfies.
    pub fn observe(&self, name: &str, value: &str, facts: &mut ParamFacts) {
        if self.param_conds.is_empty() {
            return;
        }
        let plain = name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        // most parameters: a plain name no condition can concern
        if plain
            && !self.plain_general
            && (name.len() >= 64 || self.name_lens & (1 << name.len()) == 0)
        {
            return;
        }
        for (pid, c) in self.param_conds.iter().enumerate() {
            // cheapest rejections first: a named condition for another name,
            // a name condition that needs bytes a plain name lacks
            match (&c.name, c.place) {
                (Some((n, false)), _) if n.len() != name.len() => continue,
                (_, Place::ParamName) if plain && c.special => continue,
                _ => {}
            }
            if facts.hits.get(pid).is_some_and(Option::is_some) {
                continue;
            }
            let hit = if c.place == Place::ParamName {
                if plain && c.special {
                    continue;
                }
                test(c, name.as_bytes()).then(|| (format!("param-name:{name}"), name.to_string()))
            } else if c
                .name
                .as_ref()
                .is_some_and(|w| (w.1 || w.0.len() == name.len()) && name_ok(w, name))
                && test(c, value.as_bytes())
            {
                Some((format!("param:{name}"), truncate(value)))
            } else {
                None
            };
            if hit.is_some() {
                if facts.hits.len() != self.param_conds.len() {
                    facts.hits = vec![None; self.param_conds.len()];
                }
                if let Some(slot) = facts.hits.get_mut(pid) {
                    *slot = hit;
                }
            }
        }
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// True when there are no rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The compiled rules.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Evaluates the rules on a request. `phase`: which rules to run (head only,
    /// body phase: rules that read parameters or the body, or all).
    pub fn check(
        &self,
        req: &ReqData<'_>,
        facts: &ParamFacts,
        phase: Phase,
        out: &mut dyn FnMut(PatchHit),
    ) {
        if self.rules.is_empty() {
            return;
        }
        let path: &str = &req.path;
        let first = path.split('/').find(|s| !s.is_empty()).unwrap_or("");
        // path segments, split on the stack the first time a template needs them
        let mut seg_buf: [&str; MAX_SEGS] = [""; MAX_SEGS];
        let mut nseg: Option<usize> = None;
        let indexed: &[usize] = self
            .by_first
            .iter()
            .find(|(k, _)| {
                k.len() == first.len() && k.as_bytes().eq_ignore_ascii_case(first.as_bytes())
            })
            .map(|(_, v)| v.as_slice())
            .unwrap_or(&[]);
        let no_facts = facts.hits.is_empty();
        let mut ev = Eval {
            req,
            facts,
            body: None,
        };
        for &i in indexed.iter().chain(&self.global) {
            let r = &self.rules[i];
            if (phase == Phase::Body && !r.uses_body) || (no_facts && r.facts_only) {
                continue;
            }
            if !r.methods.is_empty() && !r.methods.iter().any(|m| m == req.method) {
                continue;
            }
            if let Some(a) = &r.anchor {
                if !contains_ci(path.as_bytes(), a.as_bytes()) {
                    continue;
                }
            }
            if !matches!(r.segs.as_slice(), [Seg::Many]) {
                let n = *nseg.get_or_insert_with(|| {
                    let mut n = 0;
                    for p in path.split('/').filter(|s| !s.is_empty()) {
                        if n == MAX_SEGS {
                            break;
                        }
                        seg_buf[n] = p;
                        n += 1;
                    }
                    n
                });
                if !path_matches(&r.segs, &seg_buf[..n]) {
                    continue;
                }
            }
            let mut hit: Option<(String, String)> = None;
            let mut ok = true;
            for c in &r.all {
                match ev.eval(c) {
                    Some(h) => {
                        if hit.is_none() {
                            hit = Some(h);
                        }
                    }
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            if !ok {
                continue;
            }
            if !r.any.is_empty() {
                match r.any.iter().find_map(|c| ev.eval(c)) {
                    Some(h) => hit = Some(h),
                    None => continue,
                }
            }
            let (location, fragment) = hit.unwrap_or_else(|| ("path".into(), path.to_string()));
            out(PatchHit {
                rule: r.id.clone(),
                location,
                fragment: truncate(&fragment),
                confidence: r.confidence,
            });
        }
    }
}

/// Most path segments a template is matched against.
const MAX_SEGS: usize = 32;

/// Which rules [`PatchSet::check`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Head phase (no body yet): every rule, with the data available.
    Head,
    /// Body phase: only rules that read parameters or the body.
    Body,
    /// A whole request at once: every rule.
    All,
}

fn truncate(s: &str) -> String {
    let mut e = s.len().min(crate::detect::MAX_FRAGMENT);
    while !s.is_char_boundary(e) {
        e -= 1;
    }
    s[..e].to_string()
}

/// Segment-wise glob match (`**` spans any number of segments), O(template x path),
/// on the stack.
fn path_matches(tpl: &[Seg], parts: &[&str]) -> bool {
    if let [Seg::Many] = tpl {
        return true;
    }
    let n = parts.len().min(MAX_SEGS);
    // dp[j]: the template so far matches parts[..j]
    let mut dp = [false; MAX_SEGS + 1];
    dp[0] = true;
    for seg in tpl {
        let mut next = [false; MAX_SEGS + 1];
        match seg {
            Seg::Many => {
                let mut any = false;
                for j in 0..=n {
                    any |= dp[j];
                    next[j] = any;
                }
            }
            _ => {
                for j in 1..=n {
                    next[j] = dp[j - 1] && seg_matches(seg, parts[j - 1]);
                }
            }
        }
        dp = next;
    }
    dp[n]
}

fn seg_matches(seg: &Seg, part: &str) -> bool {
    let b = part.as_bytes();
    match seg {
        Seg::Lit(l) => b.eq_ignore_ascii_case(l.as_bytes()),
        Seg::Prefix(p) => starts_with_ci(b, p.as_bytes()),
        Seg::Suffix(s) => ends_with_ci(b, s.as_bytes()),
        Seg::One => true,
        Seg::Many => true,
    }
}

fn ends_with_ci(hay: &[u8], suffix: &[u8]) -> bool {
    hay.len() >= suffix.len() && hay[hay.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
}

/// The value test of a condition; returns the matching needle (or the value) on success.
fn test(c: &Cond, v: &[u8]) -> bool {
    let none = c.equals.is_empty() && c.prefix.is_empty() && c.suffix.is_empty();
    if none && c.contains.is_empty() {
        return true;
    }
    if let Some(g) = c.gate {
        if memchr::memchr(g, v).is_none() {
            return false;
        }
    }
    c.equals
        .iter()
        .any(|e| v.eq_ignore_ascii_case(e.as_bytes()))
        || c.prefix.iter().any(|p| starts_with_ci(v, p.as_bytes()))
        || c.suffix.iter().any(|p| ends_with_ci(v, p.as_bytes()))
        || c.contains.iter().any(|p| contains_ci(v, p.as_bytes()))
}

fn lossy(b: &[u8]) -> String {
    truncate(&String::from_utf8_lossy(b))
}

fn name_ok(want: &(String, bool), n: &str) -> bool {
    if want.1 {
        starts_with_ci(n.as_bytes(), want.0.as_bytes())
    } else {
        n.eq_ignore_ascii_case(&want.0)
    }
}

/// Per-request evaluation state: the body's decoded text is computed at most
/// once, and only when a rule reaches a body condition.
struct Eval<'e, 'a> {
    req: &'e ReqData<'a>,
    facts: &'e ParamFacts,
    body: Option<Cow<'a, [u8]>>,
}

impl<'a> Eval<'_, 'a> {
    /// The body as the rules test it: URL-decoded for urlencoded forms.
    fn body_text(&mut self) -> Option<&[u8]> {
        let raw: &'a [u8] = self.req.body?;
        if self.body.is_none() {
            let ct = self.req.header("content-type").unwrap_or_default();
            let text: Cow<'a, [u8]> = if contains_ci(ct, b"x-www-form-urlencoded") {
                if memchr::memchr(b'+', raw).is_some() {
                    let plus: Vec<u8> = raw
                        .iter()
                        .map(|&c| if c == b'+' { b' ' } else { c })
                        .collect();
                    Cow::Owned(decode::url_decode_repeated(&plus).into_owned())
                } else {
                    decode::url_decode_repeated(raw)
                }
            } else {
                Cow::Borrowed(raw)
            };
            self.body = Some(text);
        }
        self.body.as_deref()
    }

    fn eval(&mut self, c: &Cond) -> Option<(String, String)> {
        let req = self.req;
        let path = || test(c, req.path.as_bytes()).then(|| ("path".into(), req.path.to_string()));
        let query =
            || test(c, req.query.as_bytes()).then(|| ("query".into(), req.query.to_string()));
        let header = |n: &str, v: &[u8]| {
            test(c, v).then(|| (format!("header:{}", n.to_ascii_lowercase()), lossy(v)))
        };
        match c.place {
            Place::Path => path(),
            Place::RawPath => test(c, req.raw_path).then(|| ("path".into(), lossy(req.raw_path))),
            Place::Query => query(),
            Place::Body => self.body_eval(c),
            Place::Header => {
                let want = c.name.as_ref()?;
                req.headers
                    .iter()
                    .filter(|(n, _)| name_ok(want, n))
                    .find_map(|(n, v)| header(n, v))
            }
            Place::Any => path()
                .or_else(query)
                .or_else(|| req.headers.iter().find_map(|(n, v)| header(n, v)))
                .or_else(|| self.body_eval(c)),
            Place::Param | Place::ParamName => self.facts.hits.get(c.pid).cloned().flatten(),
        }
    }

    fn body_eval(&mut self, c: &Cond) -> Option<(String, String)> {
        if let Some(g) = c.gate {
            // the gate byte may be percent-encoded in a form body
            let raw = self.req.body?;
            memchr::memchr2(g, b'%', raw)?;
        }
        let text = self.body_text()?;
        test(c, text).then(|| ("body".to_string(), lossy(text)))
    }
}

/// A request as the rules see it.
#[derive(Debug)]
pub struct ReqData<'a> {
    /// Method.
    pub method: &'a str,
    /// Path as received.
    pub raw_path: &'a [u8],
    /// URL-decoded path (repeated decoding, lossy).
    pub path: Cow<'a, str>,
    /// Query as received (without `?`).
    pub raw_query: &'a [u8],
    /// Decoded query string.
    pub query: Cow<'a, str>,
    /// Headers.
    pub headers: &'a [(&'a str, &'a [u8])],
    /// Decoded body, when known.
    pub body: Option<&'a [u8]>,
}

impl<'a> ReqData<'a> {
    /// Splits a request target and decodes path and query.
    pub fn new(
        method: &'a str,
        target: &'a [u8],
        headers: &'a [(&'a str, &'a [u8])],
        body: Option<&'a [u8]>,
    ) -> Self {
        let (raw_path, raw_query) = match memchr::memchr(b'?', target) {
            Some(q) => (&target[..q], &target[q + 1..]),
            None => (target, &target[target.len()..]),
        };
        let dec = |b: &'a [u8]| -> Cow<'a, str> {
            match decode::url_decode_repeated(b) {
                Cow::Borrowed(x) => match std::str::from_utf8(x) {
                    Ok(s) => Cow::Borrowed(s),
                    Err(_) => String::from_utf8_lossy(x),
                },
                Cow::Owned(v) => Cow::Owned(String::from_utf8_lossy(&v).into_owned()),
            }
        };
        ReqData {
            method,
            raw_path,
            path: dec(raw_path),
            raw_query,
            query: if raw_query.is_empty() {
                Cow::Borrowed("")
            } else {
                dec(raw_query)
            },
            headers,
            body,
        }
    }

    fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(t: &str) -> Vec<Seg> {
        let unknown = serde_saphyr::Location::UNKNOWN;
        let p = Spanned::new(t.to_string(), unknown, unknown);
        compile_path(Path::new("t"), "path", &p).unwrap_or_default()
    }

    #[test]
    fn templates() {
        let m = |t: &str, p: &str| {
            let parts: Vec<&str> = p.split('/').filter(|s| !s.is_empty()).collect();
            path_matches(&seg(t), &parts)
        };
        assert!(m("/a/*/c", "/a/b/c"));
        assert!(!m("/a/*/c", "/a/b/d/c"));
        assert!(m(
            "/**/phpunit/**/eval-stdin.php",
            "/x/vendor/phpunit/phpunit/src/Util/PHP/eval-stdin.php"
        ));
        assert!(m("/pages/*.action", "/pages/x.ACTION"));
        assert!(m("/**", "/"));
        assert!(m("/a/**", "/a"));
        assert!(!m("/a/b", "/a"));
    }

    #[test]
    fn errors_have_positions() {
        let f = Path::new("rules.yaml");
        let text = "rules:\n  - id: X\n    when:\n      - { in: param, contains: [a] }\n";
        let specs = parse(f, text).unwrap_or_default();
        let e = PatchSet::compile(&[(f, specs)], &[])
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("rules.yaml:4:15: field `rules[0].when[0].name`: `param` and `header` conditions need a `name`")
        );
        let text = "rules:\n  - id: X\n    pth: /a\n";
        let e = parse(f, text)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.starts_with("rules.yaml:3:"), "{e}");
        let text = "rules:\n  - id: X\n    path: /a\n  - id: X\n    path: /b\n";
        let specs = parse(f, text).unwrap_or_default();
        let e = PatchSet::compile(&[(f, specs)], &[])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("rules.yaml:4:") && e.contains("duplicate rule id"),
            "{e}"
        );
    }
}
