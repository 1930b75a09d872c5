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

mod prefilter;
use prefilter::{Bits, Prefilter, PrefilterBuilder};

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
    /// Prefilter bit: set when one of the test strings occurs in the place
    /// (`None`: no test string, or a parameter condition).
    bit: Option<u32>,
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
    /// Prefilter bit of the longest literal segment (the decoded path must contain it).
    anchor: Option<u32>,
    all: Vec<Cond>,
    any: Vec<Cond>,
    /// Finding confidence.
    pub confidence: u8,
    uses_body: bool,
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
    /// Exact (lowercase) names of the named `param` conditions.
    param_names: Vec<String>,
    /// One automaton per place over every rule's required literals.
    pre: Prefilter,
    /// Rules evaluated on every request: no path anchor, no `when` condition with
    /// a literal or on parameters, a `when_any` condition without either.
    always: Vec<u32>,
    /// Per prefilter bit: the rules it makes candidates.
    bit_rules: Vec<Vec<u32>>,
    /// Per parameter condition: the rules its match makes candidates.
    pid_rules: Vec<Vec<u32>>,
    /// Places (`SCANNED_*`) whose bits make rules candidates (head and whole request).
    trigger_places: u8,
    /// The same for the rules of the body phase.
    trigger_places_body: u8,
    /// Evaluate every rule without the prefilter (the tests' reference).
    prefilter_off: bool,
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
    Ok(moat_config::from_str_verbatim::<RuleFile>(file, text)?.rules)
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
        bit: None,
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
        let mut pb = PrefilterBuilder::default();
        let mut nbits: u32 = 0;
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
                    .map(|l| {
                        let bit = nbits;
                        nbits += 1;
                        pb.path.add(l, bit);
                        bit
                    });
                for c in all.iter_mut().chain(any.iter_mut()) {
                    if matches!(c.place, Place::Param | Place::ParamName) {
                        continue;
                    }
                    let strings = c.equals.iter().chain(&c.prefix).chain(&c.suffix);
                    let strings: Vec<&String> = strings.chain(&c.contains).collect();
                    if strings.is_empty() {
                        continue;
                    }
                    let bit = nbits;
                    nbits += 1;
                    c.bit = Some(bit);
                    for s in strings {
                        pb.add(c, s, bit);
                    }
                }
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
                                    set.name_lens |= 1 << n.len();
                                    if !set.param_names.contains(n) {
                                        set.param_names.push(n.clone());
                                    }
                                }
                                (_, Place::ParamName) if c.special => {}
                                _ => set.plain_general = true,
                            }
                            set.param_conds.push(c.clone());
                        }
                    }
                }
                // what makes the rule a candidate: its path anchor, else its
                // cheapest `when` condition with a literal (or a parameter
                // condition), else every `when_any` condition (each needs one);
                // none of these: evaluated on every request
                let trigger = |c: &Cond| match c.place {
                    Place::Param | Place::ParamName => Some(Trigger::Param(c.pid)),
                    p => c.bit.map(|b| Trigger::Bit(b, p)),
                };
                let triggers: Vec<Trigger> = if let Some(b) = anchor {
                    vec![Trigger::Bit(b, Place::Path)]
                } else if let Some(t) = all.iter().find_map(trigger) {
                    vec![t]
                } else if !any.is_empty() && any.iter().all(|c| trigger(c).is_some()) {
                    any.iter().filter_map(trigger).collect()
                } else {
                    Vec::new()
                };
                let idx32 = u32::try_from(idx).unwrap_or(u32::MAX);
                if triggers.is_empty() {
                    set.always.push(idx32);
                }
                for t in triggers {
                    let (table, i) = match t {
                        Trigger::Param(pid) => (&mut set.pid_rules, pid),
                        Trigger::Bit(b, place) => {
                            let flags = place_flags(place);
                            set.trigger_places |= flags;
                            if uses_body {
                                set.trigger_places_body |= flags;
                            }
                            (&mut set.bit_rules, b as usize)
                        }
                    };
                    if table.len() <= i {
                        table.resize(i + 1, Vec::new());
                    }
                    if let Some(v) = table.get_mut(i) {
                        v.push(idx32);
                    }
                }
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
                });
            }
        }
        set.pre = pb.build().map_err(|e| {
            let file = sources
                .first()
                .map(|(f, _)| f.as_ref())
                .unwrap_or(Path::new(""));
            ConfigError::semantic(file, 0, 0, "rules", e)
        })?;
        Ok(set)
    }

    /// Rules the request-level prefilter cannot skip: neither a test string in
    /// a condition on the path, query, headers or body, nor a literal path
    /// segment (parameter conditions are decided by the parameter facts).
    pub fn unfiltered(&self) -> usize {
        self.always.len()
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
    #[inline]
    pub fn observe(&self, name: &str, value: &str, facts: &mut ParamFacts) {
        if self.param_conds.is_empty() {
            return;
        }
        // the common case, inline: a short plain name no condition names
        if !self.plain_general
            && name.len() < 64
            && self.name_lens & (1 << name.len()) == 0
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return;
        }
        self.observe_slow(name, value, facts);
    }

    fn observe_slow(&self, name: &str, value: &str, facts: &mut ParamFacts) {
        // most parameters: a plain name (letters, digits, `_`, `-`) no
        // condition names; only a condition naming exactly this parameter can
        // hold for it (unless `plain_general`)
        let named = name.len() < 64
            && self.name_lens & (1 << name.len()) != 0
            && self
                .param_names
                .iter()
                .any(|n| n.len() == name.len() && n.eq_ignore_ascii_case(name));
        let plain = name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if plain && !named && !self.plain_general {
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
        let mut ev = Eval {
            req,
            facts,
            body: None,
            pre: &self.pre,
            seen: Bits::default(),
            scanned: 0,
        };
        // candidates: rules whose trigger literal occurs (one automaton pass per
        // place), whose parameter condition matched, and the unfiltered ones
        let mut cand = Bits::default();
        if self.prefilter_off {
            for i in 0..self.rules.len() {
                cand.set(u32::try_from(i).unwrap_or(u32::MAX));
            }
        } else {
            let places = if phase == Phase::Body {
                self.trigger_places_body
            } else {
                self.trigger_places
            };
            for (flag, p) in [
                (SCANNED_PATH, Place::Path),
                (SCANNED_RAW_PATH, Place::RawPath),
                (SCANNED_QUERY, Place::Query),
                (SCANNED_HEADERS, Place::Header),
                (SCANNED_BODY, Place::Body),
            ] {
                if places & flag != 0 {
                    ev.scan(p);
                }
            }
            let mut any = false;
            ev.seen.for_each(|b| {
                for &r in self
                    .bit_rules
                    .get(b as usize)
                    .map(Vec::as_slice)
                    .unwrap_or(&[])
                {
                    cand.set(r);
                    any = true;
                }
            });
            for (pid, hit) in facts.hits.iter().enumerate() {
                if hit.is_some() {
                    for &r in self.pid_rules.get(pid).map(Vec::as_slice).unwrap_or(&[]) {
                        cand.set(r);
                        any = true;
                    }
                }
            }
            for &r in &self.always {
                cand.set(r);
                any = true;
            }
            if !any {
                return;
            }
        }
        let path: &str = req.path();
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
        for &i in indexed.iter().chain(&self.global) {
            if !cand.get(u32::try_from(i).unwrap_or(u32::MAX)) {
                continue;
            }
            let r = &self.rules[i];
            if phase == Phase::Body && !r.uses_body {
                continue;
            }
            if !r.methods.is_empty() && !r.methods.iter().any(|m| m == req.method) {
                continue;
            }
            if !self.prefilter_off && !ev.possible(r) {
                continue;
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

/// What makes a rule a candidate for evaluation.
#[derive(Debug, Clone, Copy)]
enum Trigger {
    /// A prefilter bit of a place.
    Bit(u32, Place),
    /// A parameter condition matched (index in `param_conds`).
    Param(usize),
}

/// The `SCANNED_*` flags of the places a condition on `p` reads.
fn place_flags(p: Place) -> u8 {
    match p {
        Place::Path => SCANNED_PATH,
        Place::RawPath => SCANNED_RAW_PATH,
        Place::Query => SCANNED_QUERY,
        Place::Header => SCANNED_HEADERS,
        Place::Body => SCANNED_BODY,
        Place::Any => SCANNED_PATH | SCANNED_QUERY | SCANNED_HEADERS | SCANNED_BODY,
        Place::Param | Place::ParamName => 0,
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
    /// The set's prefilter automata.
    pre: &'e Prefilter,
    /// Prefilter bits of the conditions whose literals occur in their place.
    seen: Bits,
    /// Places already scanned (`SCANNED_*`).
    scanned: u8,
}

const SCANNED_PATH: u8 = 1;
const SCANNED_RAW_PATH: u8 = 2;
const SCANNED_QUERY: u8 = 4;
const SCANNED_HEADERS: u8 = 8;
const SCANNED_BODY: u8 = 16;

impl<'a> Eval<'_, 'a> {
    /// False when the prefilter rules `r` out: its path anchor, a `when`
    /// condition or every `when_any` condition has none of its test strings
    /// in its place (or, for parameter conditions, no matching parameter).
    fn possible(&mut self, r: &Rule) -> bool {
        if let Some(b) = r.anchor {
            if !self.has(Place::Path, b) {
                return false;
            }
        }
        for c in &r.all {
            if !self.cond_possible(c) {
                return false;
            }
        }
        if r.any.is_empty() {
            return true;
        }
        for c in &r.any {
            if self.cond_possible(c) {
                return true;
            }
        }
        false
    }

    fn cond_possible(&mut self, c: &Cond) -> bool {
        match (c.place, c.bit) {
            (Place::Param | Place::ParamName, _) => {
                self.facts.hits.get(c.pid).is_some_and(Option::is_some)
            }
            (_, None) => true,
            (p, Some(b)) => self.has(p, b),
        }
    }

    /// True when bit `b` of a condition on `place` is set, scanning the
    /// place's values (each place at most once per request) first.
    fn has(&mut self, place: Place, b: u32) -> bool {
        let places: &[Place] = match place {
            Place::Any => &[Place::Path, Place::Query, Place::Header, Place::Body],
            Place::Path => &[Place::Path],
            Place::RawPath => &[Place::RawPath],
            Place::Query => &[Place::Query],
            Place::Header => &[Place::Header],
            Place::Body => &[Place::Body],
            Place::Param | Place::ParamName => &[],
        };
        for &p in places {
            if self.seen.get(b) {
                return true;
            }
            self.scan(p);
        }
        self.seen.get(b)
    }

    /// Runs the prefilter automaton of `place` over the request once.
    fn scan(&mut self, place: Place) {
        let flag = match place {
            Place::Path => SCANNED_PATH,
            Place::RawPath => SCANNED_RAW_PATH,
            Place::Query => SCANNED_QUERY,
            Place::Header => SCANNED_HEADERS,
            Place::Body => SCANNED_BODY,
            Place::Any | Place::Param | Place::ParamName => return,
        };
        if self.scanned & flag != 0 {
            return;
        }
        self.scanned |= flag;
        let pre = self.pre;
        let req = self.req;
        match place {
            // a path without an escape decodes to itself (invalid UTF-8 aside,
            // which changes no ASCII needle's occurrences): its needles are
            // searched in the bytes as received, without decoding it, and with
            // raw-path needles too, one pass sets the bits of both places
            Place::Path | Place::RawPath
                if pre.path_raw.is_some() && req.path_needs_no_decoding(pre) =>
            {
                self.scanned |= SCANNED_PATH | SCANNED_RAW_PATH;
                if let Some(s) = &pre.path_raw {
                    s.scan(req.raw_path, &mut self.seen);
                }
            }
            Place::Path => {
                if let Some(s) = &pre.path {
                    if req.path_needs_no_decoding(pre) {
                        s.scan(req.raw_path, &mut self.seen);
                    } else {
                        s.scan(req.path().as_bytes(), &mut self.seen);
                    }
                }
            }
            Place::RawPath => {
                if let Some(s) = &pre.raw_path {
                    s.scan(req.raw_path, &mut self.seen);
                }
            }
            Place::Query => {
                // the query is decoded only when its raw form holds a gate byte
                // or an escape (that may hide one)
                if let Some(s) = &pre.query {
                    if s.gated(req.raw_query, Some(b'%')) {
                        s.scan(req.query().as_bytes(), &mut self.seen);
                    }
                }
            }
            Place::Header => pre.scan_headers(req.headers, &mut self.seen),
            Place::Body => {
                if let Some(s) = &pre.body {
                    if self.body_text().is_some() {
                        if let Some(t) = self.body.as_deref() {
                            s.scan(t, &mut self.seen);
                        }
                    }
                }
            }
            Place::Any | Place::Param | Place::ParamName => {}
        }
    }

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
        let path =
            || test(c, req.path().as_bytes()).then(|| ("path".into(), req.path().to_string()));
        let query =
            || test(c, req.query().as_bytes()).then(|| ("query".into(), req.query().to_string()));
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

/// Repeated URL decoding (no `+`), lossy UTF-8.
fn decode_lossy(b: &[u8]) -> Cow<'_, str> {
    // most paths and queries have no escape: no decoder call (short values: a
    // byte loop beats the SIMD search's set-up)
    if !b.contains(&b'%') {
        return crate::util::lossy(b);
    }
    match decode::url_decode_repeated(b) {
        Cow::Borrowed(x) => crate::util::lossy(x),
        Cow::Owned(v) => Cow::Owned(crate::util::lossy_owned(v)),
    }
}

/// A request as the rules see it.
#[derive(Debug)]
pub struct ReqData<'a> {
    /// Method.
    pub method: &'a str,
    /// Path as received.
    pub raw_path: &'a [u8],
    /// URL-decoded path (repeated decoding, lossy), computed on first use
    /// ([`ReqData::path`]): most requests make no rule a candidate.
    path: std::cell::OnceCell<Cow<'a, str>>,
    /// Query as received (without `?`).
    pub raw_query: &'a [u8],
    /// Decoded query string, computed on first use ([`ReqData::query`]).
    query: std::cell::OnceCell<Cow<'a, str>>,
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
        ReqData {
            method,
            raw_path,
            path: std::cell::OnceCell::new(),
            raw_query,
            query: std::cell::OnceCell::new(),
            headers,
            body,
        }
    }

    /// The decoded path (repeated URL decoding, lossy).
    pub fn path(&self) -> &str {
        self.path.get_or_init(|| decode_lossy(self.raw_path))
    }

    /// True when the prefilter may search the path's needles in the path as
    /// received: it has no escape and every path needle is ASCII.
    fn path_needs_no_decoding(&self, pre: &Prefilter) -> bool {
        pre.path_ascii && !self.raw_path.contains(&b'%')
    }

    /// The decoded query string (repeated URL decoding, lossy).
    pub fn query(&self) -> &str {
        self.query.get_or_init(|| decode_lossy(self.raw_query))
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

    /// The prefilter only skips work: on every example of the starter pack, and
    /// on every example's target combined with every other example's method,
    /// headers and body (in head, body and whole-request phases), the rules hit
    /// with the prefilter are exactly those hit without it.
    #[test]
    fn prefilter_changes_nothing() {
        let file = Path::new(BUILTIN_NAME);
        let specs = parse(file, BUILTIN).unwrap_or_default();
        let on = PatchSet::compile(&[(file, specs.clone())], &[]).unwrap_or_default();
        assert!(on.len() >= 20);
        assert_eq!(on.unfiltered(), 0);
        let mut off = on.clone();
        off.prefilter_off = true;
        let examples: Vec<&Example> = specs
            .iter()
            .flat_map(|r| r.examples.block.iter().chain(&r.examples.pass))
            .collect();
        let mut checked = 0;
        let mut hits = 0;
        for t in &examples {
            for h in &examples {
                let headers: Vec<(&str, &[u8])> = h
                    .headers
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_bytes()))
                    .collect();
                // as written, upper case, and with an invalid UTF-8 byte in the
                // path (decoded lossily; the prefilter reads the raw bytes)
                let mut invalid = t.target.clone().into_bytes();
                invalid.insert(1, 0xff);
                let targets = [
                    t.target.clone().into_bytes(),
                    t.target.to_ascii_uppercase().into_bytes(),
                    invalid,
                ];
                for target in &targets {
                    let req = ReqData::new(&h.method, target, &headers, Some(h.body.as_bytes()));
                    let head = ReqData::new(&h.method, target, &headers, None);
                    let facts = |set: &PatchSet| {
                        let mut f = ParamFacts::default();
                        let form = h.headers.values().any(|v| v.contains("urlencoded"));
                        let body = if form { h.body.as_bytes() } else { b"" };
                        for part in req
                            .raw_query
                            .split(|&b| b == b'&')
                            .chain(body.split(|&b| b == b'&'))
                        {
                            let mut kv = part.splitn(2, |&b| b == b'=');
                            let k = decode::url_decode_once(kv.next().unwrap_or_default(), true);
                            let v = decode::url_decode_once(kv.next().unwrap_or_default(), true);
                            set.observe(
                                &String::from_utf8_lossy(&k),
                                &String::from_utf8_lossy(&v),
                                &mut f,
                            );
                        }
                        f
                    };
                    for (data, phase) in [
                        (&head, Phase::Head),
                        (&req, Phase::Body),
                        (&req, Phase::All),
                    ] {
                        let run = |set: &PatchSet| {
                            let mut v = Vec::new();
                            set.check(data, &facts(set), phase, &mut |h| v.push(h));
                            v
                        };
                        let a = run(&on);
                        assert_eq!(
                            a,
                            run(&off),
                            "{} {} {:?} {phase:?}",
                            h.method,
                            String::from_utf8_lossy(target),
                            h.headers
                        );
                        hits += a.len();
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 1000 && hits > 50, "{checked} {hits}");
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
