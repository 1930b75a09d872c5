//! Direction and context of a finding in an HTTP body: how confident a rule
//! is ([`classify`]), in which field of the body a secret sits
//! ([`BodyContext::field_at`]) and whether that field is the place where the
//! credential belongs ([`BodyContext::exemption`]).
//!
//! The scanner works on raw text, so fields are derived from the match
//! position, locally and without a second parse of the body: in a form body
//! the `name=` segment around the secret, in a JSON body the key right before
//! the string holding it, in a multipart body the `name="..."` of the part
//! holding it. The model is documented in docs/secrets.md, "Direction and
//! context".

use std::ops::Range;

use memchr::memmem;

use crate::rules::Rule;

/// How much a rule's match says about the secret's issuer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confidence {
    /// The rule names an issuer (a provider prefix such as `AKIA`, `ghp_`,
    /// `-----BEGIN ... PRIVATE KEY`): a match is that provider's secret.
    Specific,
    /// The rule matches a credential-like name or an open token format, not an
    /// issuer (`generic-api-key`, `generic-secret-assignment`, `jwt`): a match
    /// cannot tell a credential being used from one being leaked.
    Generic,
}

impl Confidence {
    /// `specific` or `generic`, as written in events.
    pub fn as_str(self) -> &'static str {
        match self {
            Confidence::Specific => "specific",
            Confidence::Generic => "generic",
        }
    }
}

/// A rule's confidence and the metadata that decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classification {
    /// The confidence.
    pub confidence: Confidence,
    /// Why, in words (written in events).
    pub why: String,
}

/// Words that name a kind of credential rather than an issuer. A keyword
/// made only of these (split at non-alphanumeric bytes) triggers its rule on
/// a generic name.
const CREDENTIAL_WORDS: &[&str] = &[
    "access",
    "api",
    "apikey",
    "auth",
    "bearer",
    "client",
    "credential",
    "credentials",
    "creds",
    "key",
    "keys",
    "pass",
    "passw",
    "passwd",
    "password",
    "pwd",
    "secret",
    "secrets",
    "session",
    "token",
    "tokens",
];

/// Keywords shorter than this cannot name an issuer (`ey`, `sk`, `s.`).
const MIN_ISSUER_KEYWORD: usize = 3;

fn is_credential_vocabulary(keyword: &str) -> bool {
    let mut words = keyword
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .peekable();
    words.peek().is_some() && words.all(|w| CREDENTIAL_WORDS.contains(&w))
}

/// Classifies a rule from its gitleaks metadata. A rule is
/// [`Confidence::Generic`] when
///
/// 1. its id or one of its tags contains `generic` (gitleaks' own convention,
///    the one its generic post-filter uses), or
/// 2. one of its keywords is credential vocabulary only (`key`, `token`,
///    `secret`, `password`, `api`, `auth`, ...): the rule can fire on a
///    generic name, whoever issued the value, or
/// 3. one of its keywords is shorter than 3 bytes (`ey`, `sk`, `s.`): the
///    rule can fire on a marker too short to name an issuer.
///
/// Every other rule with keywords is [`Confidence::Specific`]; a rule without
/// keywords (it always runs: a user's own rule) is specific too.
pub fn classify(rule: &Rule) -> Classification {
    let id = rule.id.to_ascii_lowercase();
    if id.contains("generic") {
        return Classification {
            confidence: Confidence::Generic,
            why: "rule id names it generic".into(),
        };
    }
    if rule
        .tags
        .iter()
        .any(|t| t.to_ascii_lowercase().contains("generic"))
    {
        return Classification {
            confidence: Confidence::Generic,
            why: "rule tagged generic".into(),
        };
    }
    if let Some(k) = rule.keywords.iter().find(|k| is_credential_vocabulary(k)) {
        return Classification {
            confidence: Confidence::Generic,
            why: format!("keyword `{k}` names a kind of credential, not an issuer"),
        };
    }
    if let Some(k) = rule
        .keywords
        .iter()
        .find(|k| !k.is_empty() && k.len() < MIN_ISSUER_KEYWORD)
    {
        return Classification {
            confidence: Confidence::Generic,
            why: format!("keyword `{k}` is too short to name an issuer"),
        };
    }
    Classification {
        confidence: Confidence::Specific,
        why: match rule.keywords.first() {
            Some(k) => format!("keyword `{k}` names an issuer"),
            None => "rule without keywords (always runs)".into(),
        },
    }
}

/// The syntax of a body, from its `Content-Type` (and a sniff for JSON sent
/// as text, as analytics beacons do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// `application/x-www-form-urlencoded`.
    Form,
    /// JSON (`application/json`, `*+json`, or a text body starting with `{`/`[`).
    Json,
    /// `multipart/form-data` with a boundary.
    Multipart,
    /// Anything else: no fields.
    Text,
}

impl BodyKind {
    /// `form`, `json`, `multipart` or `text`, as written in events.
    pub fn as_str(self) -> &'static str {
        match self {
            BodyKind::Form => "form",
            BodyKind::Json => "json",
            BodyKind::Multipart => "multipart",
            BodyKind::Text => "text",
        }
    }
}

/// Where a request or response is going, for the designated places.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// A request body, on its way to the upstream.
    Request,
    /// A response body, on its way to the client.
    Response,
}

/// The largest field name considered (longer names are never designated).
const MAX_NAME: usize = 64;
/// How far back from a secret a JSON string's opening quote is looked for.
const MAX_JSON_STRING_BACK: usize = 1024;
/// How far back a JSON key is looked for (whitespace plus the key).
const MAX_JSON_KEY_BACK: usize = 192;

/// A field name, decoded into a fixed buffer (no allocation).
#[derive(Clone, Copy)]
pub struct FieldName {
    buf: [u8; MAX_NAME],
    len: usize,
}

impl FieldName {
    fn from_raw(raw: &[u8], percent: bool) -> Option<FieldName> {
        let mut n = FieldName {
            buf: [0; MAX_NAME],
            len: 0,
        };
        let mut i = 0;
        while i < raw.len() {
            let mut b = raw[i];
            if percent && b == b'%' && i + 2 < raw.len() {
                if let (Some(h), Some(l)) = (hex(raw[i + 1]), hex(raw[i + 2])) {
                    b = h << 4 | l;
                    i += 2;
                }
            } else if percent && b == b'+' {
                b = b' ';
            }
            if n.len == MAX_NAME {
                return None;
            }
            n.buf[n.len] = b;
            n.len += 1;
            i += 1;
        }
        Some(n)
    }

    /// The name as sent (decoded), e.g. `user[password]`.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The name as text, for events.
    pub fn display(&self) -> String {
        String::from_utf8_lossy(self.as_bytes()).into_owned()
    }

    /// The innermost component: `user[password]` and `user.password` give
    /// `password`.
    fn leaf(&self) -> &[u8] {
        let mut s = self.as_bytes();
        while let Some(rest) = s.strip_suffix(b"]") {
            s = rest;
        }
        if let Some(p) = s.iter().rposition(|&b| b == b'[' || b == b'.') {
            s = &s[p + 1..];
        }
        s
    }

    /// The leaf's words, lowercased and joined without separators
    /// (`newPassword`, `new_password` and `new-password` give `newpassword`),
    /// and the last word.
    fn normalized(&self) -> (Joined, Range<usize>) {
        let leaf = self.leaf();
        let mut j = Joined {
            buf: [0; MAX_NAME],
            len: 0,
        };
        let mut last = 0..0;
        let mut word_start = 0;
        let mut prev_lower = false;
        for &b in leaf {
            if !b.is_ascii_alphanumeric() {
                prev_lower = false;
                if j.len > word_start {
                    last = word_start..j.len;
                }
                word_start = j.len;
                continue;
            }
            if b.is_ascii_uppercase() && prev_lower {
                if j.len > word_start {
                    last = word_start..j.len;
                }
                word_start = j.len;
            }
            prev_lower = b.is_ascii_lowercase() || b.is_ascii_digit();
            j.buf[j.len] = b.to_ascii_lowercase();
            j.len += 1;
        }
        if j.len > word_start {
            last = word_start..j.len;
        }
        (j, last)
    }
}

impl std::fmt::Debug for FieldName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_bytes()))
    }
}

struct Joined {
    buf: [u8; MAX_NAME],
    len: usize,
}

impl Joined {
    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The field holding a secret.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// Its name.
    pub name: FieldName,
    /// Where its value starts in the body.
    pub value_start: usize,
    /// Where its value ends (form and multipart; `None` for JSON, whose
    /// closing quote is only checked at a secret's end).
    pub value_end: Option<usize>,
    /// A multipart part with a `filename`: a file upload, content rather than
    /// a credential field.
    pub file: bool,
}

/// What a field name says it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NameClass {
    /// password, passwd, pwd, pass, passphrase, passcode, new_password, ...
    Password,
    /// client_secret (OAuth client authentication in the body).
    ClientSecret,
    /// authorization: `Bearer <token>`, `Basic <...>`.
    Authorization,
    /// api_key, apikey, key, token, access_token, ...: the API's own parameter.
    KeyParameter,
    /// Anything else.
    Other,
}

const PASSWORD_WORDS: &[&[u8]] = &[
    b"password",
    b"passwd",
    b"pwd",
    b"pass",
    b"passphrase",
    b"passcode",
];

/// Joined names of API key and token parameters.
const KEY_PARAMETERS: &[&[u8]] = &[
    b"key",
    b"token",
    b"apikey",
    b"apitoken",
    b"xapikey",
    b"accesstoken",
    b"authtoken",
    b"authkey",
    b"idtoken",
    b"refreshtoken",
    b"sessiontoken",
    b"bearertoken",
    b"oauthtoken",
    b"apptoken",
    b"appkey",
    b"applicationkey",
    b"subscriptionkey",
    b"usertoken",
    b"userkey",
    b"clienttoken",
];

/// Fields of an OAuth 2.0 token request that carry credentials (RFC 6749,
/// 7521, 7523, 7636, 8628, 8693).
const OAUTH_CREDENTIALS: &[&[u8]] = &[
    b"clientsecret",
    b"clientassertion",
    b"refreshtoken",
    b"code",
    b"assertion",
    b"codeverifier",
    b"password",
    b"subjecttoken",
    b"actortoken",
    b"devicecode",
];

fn name_class(name: &FieldName) -> NameClass {
    let (joined, last) = name.normalized();
    let j = joined.as_bytes();
    let last_word = &j[last];
    if j == b"clientsecret" {
        return NameClass::ClientSecret;
    }
    if j == b"authorization" || j == b"proxyauthorization" {
        return NameClass::Authorization;
    }
    if PASSWORD_WORDS.contains(&last_word)
        || [&b"password"[..], b"passwd", b"passphrase"]
            .iter()
            .any(|w| memmem::find(j, w).is_some())
    {
        return NameClass::Password;
    }
    if KEY_PARAMETERS.contains(&j) {
        return NameClass::KeyParameter;
    }
    NameClass::Other
}

/// Why a finding is not counted: the credential is in its designated place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exemption {
    /// Why, in words (written in events).
    pub reason: String,
}

/// A body being inspected, with what is needed to place a finding: its
/// syntax, the request path and a cursor that keeps field lookups linear
/// over the findings of one body (they come sorted by position).
pub struct BodyContext<'a> {
    data: &'a [u8],
    kind: BodyKind,
    boundary: Option<&'a [u8]>,
    path: &'a str,
    direction: Direction,
    /// The last field segment found (form: `&`-separated; multipart: a part).
    segment: Option<Segment>,
    oauth: Option<bool>,
}

impl<'a> BodyContext<'a> {
    /// A context for `data` sent with `content_type` on a request to `path`.
    pub fn new(
        data: &'a [u8],
        content_type: Option<&'a str>,
        path: &'a str,
        direction: Direction,
    ) -> Self {
        let (kind, boundary) = body_kind(content_type, data);
        BodyContext {
            data,
            kind,
            boundary,
            path,
            direction,
            segment: None,
            oauth: None,
        }
    }

    /// The body's bytes.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The body's syntax.
    pub fn kind(&self) -> BodyKind {
        self.kind
    }

    /// The field whose value holds the byte at `pos`, when the body has fields
    /// and `pos` is inside a value.
    pub fn field_at(&mut self, pos: usize) -> Option<Field> {
        if pos >= self.data.len() {
            return None;
        }
        match self.kind {
            BodyKind::Form => self.form_field(pos),
            BodyKind::Json => json_field(self.data, pos),
            BodyKind::Multipart => self.multipart_field(pos),
            BodyKind::Text => None,
        }
    }

    /// The field of the segment holding `pos`: the cached one when `pos` is
    /// in it, else the segment `bounds` finds, parsed once by `parse`.
    fn segment_field(
        &mut self,
        pos: usize,
        bounds: impl FnOnce(&[u8], usize, usize) -> Option<(usize, usize)>,
        parse: impl FnOnce(&[u8], usize, usize) -> Option<Field>,
    ) -> Option<Field> {
        let seg = match self.segment {
            Some(seg) if seg.start <= pos && pos < seg.end => seg,
            _ => {
                // Findings come in position order: the previous segment's end
                // bounds the backward search, so placing all the findings of
                // a body is one pass over it.
                let floor = match self.segment {
                    Some(seg) if seg.end <= pos => seg.end,
                    _ => 0,
                };
                let (start, end) = bounds(self.data, floor, pos)?;
                let seg = Segment {
                    start,
                    end,
                    field: parse(self.data, start, end),
                };
                self.segment = Some(seg);
                seg
            }
        };
        seg.field.filter(|f| f.value_start <= pos)
    }

    fn form_field(&mut self, pos: usize) -> Option<Field> {
        self.segment_field(
            pos,
            |data, floor, pos| {
                let start =
                    memchr::memrchr(b'&', &data[floor..pos]).map_or(floor, |i| floor + i + 1);
                let end = memchr::memchr(b'&', &data[pos..]).map_or(data.len(), |i| pos + i);
                Some((start, end))
            },
            |data, start, end| {
                let eq = start + memchr::memchr(b'=', &data[start..end])?;
                Some(Field {
                    name: FieldName::from_raw(&data[start..eq], true)?,
                    value_start: eq + 1,
                    value_end: Some(end),
                    file: false,
                })
            },
        )
    }

    fn multipart_field(&mut self, pos: usize) -> Option<Field> {
        let boundary = self.boundary?;
        self.segment_field(
            pos,
            |data, floor, pos| {
                let start = floor + memmem::rfind(&data[floor..pos], boundary)?;
                let end = memmem::find(&data[pos..], boundary).map_or(data.len(), |i| pos + i);
                Some((start, end))
            },
            multipart_part,
        )
    }
    /// Whether the body is an OAuth 2.0 token request: a `grant_type` field,
    /// sent to a path whose last segment names a token endpoint.
    fn oauth_request(&mut self) -> bool {
        if let Some(o) = self.oauth {
            return o;
        }
        let path_ok = contains_ignore_case(last_segment(self.path), "token");
        let o = path_ok
            && match self.kind {
                BodyKind::Form => {
                    self.data.starts_with(b"grant_type=")
                        || memmem::find(self.data, b"&grant_type=").is_some()
                }
                BodyKind::Json => memmem::find(self.data, b"\"grant_type\"").is_some(),
                BodyKind::Multipart => memmem::find(self.data, b"name=\"grant_type\"").is_some(),
                BodyKind::Text => false,
            };
        self.oauth = Some(o);
        o
    }

    /// Whether the secret at `secret` (byte range in the body) is a credential
    /// in its designated place, and why.
    pub fn exemption(&mut self, field: &Field, secret: Range<usize>) -> Option<Exemption> {
        if field.file {
            return None;
        }
        let class = name_class(&field.name);
        let name = field.name.display();
        let whole = field.value_start == secret.start
            && self.value_ends_at(field, secret.end)
            && !self.data[secret.clone()]
                .iter()
                .any(|b| b.is_ascii_whitespace());
        match self.direction {
            Direction::Response => {
                let issuing = self.issuing_path();
                (class == NameClass::KeyParameter && whole && issuing).then(|| Exemption {
                    reason: format!(
                        "credential issued in field {name} of the response to {} (a login or token endpoint)",
                        self.path
                    ),
                })
            }
            Direction::Request => {
                let (joined, _) = field.name.normalized();
                if OAUTH_CREDENTIALS.contains(&joined.as_bytes()) && self.oauth_request() {
                    return Some(Exemption {
                        reason: format!(
                            "credential in field {name} of an OAuth token request to {}",
                            self.path
                        ),
                    });
                }
                match class {
                    NameClass::Password => Some(Exemption {
                        reason: format!(
                            "credential in designated field {name} of {} ({} body, {})",
                            self.form_kind_article(),
                            self.kind.as_str(),
                            self.path
                        ),
                    }),
                    NameClass::ClientSecret => Some(Exemption {
                        reason: format!(
                            "client credential in designated field {name} ({} body, {})",
                            self.kind.as_str(),
                            self.path
                        ),
                    }),
                    NameClass::Authorization => {
                        (whole || self.scheme_then_secret(field, &secret)).then(|| Exemption {
                            reason: format!(
                                "bearer credential in field {name}, where an Authorization header's value goes"
                            ),
                        })
                    }
                    NameClass::KeyParameter => whole.then(|| Exemption {
                        reason: format!(
                            "API key as the API's own parameter {name} (the whole value)"
                        ),
                    }),
                    NameClass::Other => None,
                }
            }
        }
    }

    /// Whether the field's value ends at `end`.
    fn value_ends_at(&self, field: &Field, end: usize) -> bool {
        match field.value_end {
            Some(e) => e == end,
            None => {
                self.kind == BodyKind::Json
                    && self.data.get(end) == Some(&b'"')
                    && escaped(self.data, end) == Some(false)
            }
        }
    }

    /// `Bearer <secret>`, `Basic <secret>`: a scheme word, spaces (`+` or
    /// `%20` in a form), then the secret to the end of the value.
    fn scheme_then_secret(&self, field: &Field, secret: &Range<usize>) -> bool {
        if !self.value_ends_at(field, secret.end) || secret.start <= field.value_start {
            return false;
        }
        let head = &self.data[field.value_start..secret.start];
        let scheme_len = head
            .iter()
            .position(|b| !b.is_ascii_alphanumeric() && *b != b'-')
            .unwrap_or(head.len());
        let (scheme, sep) = head.split_at(scheme_len);
        scheme.len() >= 4
            && !sep.is_empty()
            && (sep.iter().all(|&b| b == b' ' || b == b'+') || sep == b"%20")
    }

    fn issuing_path(&self) -> bool {
        contains_ignore_case(last_segment(self.path), "token")
            || matches!(form_kind(self.path), FormKind::Login | FormKind::SignUp)
    }

    fn form_kind_article(&self) -> &'static str {
        match form_kind(self.path) {
            FormKind::Login => "a login form",
            FormKind::SignUp => "a sign-up form",
            FormKind::PasswordChange => "a password change form",
            FormKind::Other => "a form",
        }
    }
}

/// A form segment or multipart part, with its field parsed once.
#[derive(Debug, Clone, Copy)]
struct Segment {
    start: usize,
    end: usize,
    field: Option<Field>,
}

/// The field of the multipart part at `start..end` (from its boundary to
/// the next): the headers end at the first blank line, the content ends
/// before the CRLF that precedes the next delimiter (`\r\n--boundary`); the
/// last part may run to the end of the body.
fn multipart_part(data: &[u8], start: usize, end: usize) -> Option<Field> {
    let part = &data[start..end];
    let (head_len, sep) = match memmem::find(part, b"\r\n\r\n") {
        Some(i) => (i, 4),
        None => (memmem::find(part, b"\n\n")?, 2),
    };
    let head = &part[..head_len];
    let name = header_param(head, b"name")?;
    let mut value_end = end;
    if end < data.len() {
        if data[..value_end].ends_with(b"--") {
            value_end -= 2;
        }
        if data[..value_end].ends_with(b"\r\n") {
            value_end -= 2;
        } else if data[..value_end].ends_with(b"\n") {
            value_end -= 1;
        }
    }
    let value_start = start + head_len + sep;
    Some(Field {
        name: FieldName::from_raw(name, false)?,
        value_start,
        value_end: Some(value_end.max(value_start)),
        file: header_param(head, b"filename").is_some(),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FormKind {
    Login,
    SignUp,
    PasswordChange,
    Other,
}

/// `seg` equals `word` ignoring ASCII case and non-alphanumeric bytes
/// (`sign-in`, `Sign_In` and `signin` are all `signin`).
fn segment_is(seg: &str, word: &str) -> bool {
    let mut a = seg.bytes().filter(u8::is_ascii_alphanumeric);
    let mut b = word.bytes();
    loop {
        match (a.next(), b.next()) {
            (None, None) => return true,
            (Some(x), Some(y)) if x.eq_ignore_ascii_case(&y) => {}
            _ => return false,
        }
    }
}

/// What a path's segments say the endpoint is (the last matching segment wins).
fn form_kind(path: &str) -> FormKind {
    const LOGIN: &[&str] = &[
        "login",
        "signin",
        "logon",
        "session",
        "sessions",
        "authenticate",
        "auth",
    ];
    const SIGN_UP: &[&str] = &[
        "signup",
        "register",
        "registration",
        "join",
        "users",
        "accounts",
    ];
    const PASSWORD: &[&str] = &["password", "passwords", "changepassword", "resetpassword"];
    let mut kind = FormKind::Other;
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        if LOGIN.iter().any(|w| segment_is(seg, w)) {
            kind = FormKind::Login;
        } else if SIGN_UP.iter().any(|w| segment_is(seg, w)) {
            kind = FormKind::SignUp;
        } else if PASSWORD.iter().any(|w| segment_is(seg, w)) {
            kind = FormKind::PasswordChange;
        }
    }
    kind
}

fn last_segment(path: &str) -> &str {
    let path = path.split(['?', '#']).next().unwrap_or("");
    moat_core::last_path_segment(path)
}

/// `name="value"` (or unquoted) in a multipart part's headers, not matching
/// inside a longer parameter name (`filename` for `name`).
fn header_param<'d>(head: &'d [u8], param: &[u8]) -> Option<&'d [u8]> {
    let mut from = 0;
    while let Some(i) = find_ignore_case(&head[from..], param) {
        let at = from + i;
        let after = at + param.len();
        from = after;
        let before_ok = at == 0 || matches!(head[at - 1], b';' | b' ' | b'\t');
        if !before_ok || head.get(after) != Some(&b'=') {
            continue;
        }
        let v = &head[after + 1..];
        return Some(match v.strip_prefix(b"\"") {
            Some(q) => &q[..memchr::memchr(b'"', q).unwrap_or(q.len())],
            None => {
                let end = v
                    .iter()
                    .position(|&b| matches!(b, b';' | b'\r' | b'\n' | b' '))
                    .unwrap_or(v.len());
                &v[..end]
            }
        });
    }
    None
}

fn contains_ignore_case(hay: &str, needle: &str) -> bool {
    find_ignore_case(hay.as_bytes(), needle.as_bytes()).is_some()
}

fn find_ignore_case(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    (0..=hay.len() - needle.len()).find(|&i| hay[i..i + needle.len()].eq_ignore_ascii_case(needle))
}

fn body_kind<'a>(content_type: Option<&'a str>, data: &[u8]) -> (BodyKind, Option<&'a [u8]>) {
    let ct = content_type.unwrap_or("").trim();
    let mime = ct.split(';').next().unwrap_or("").trim();
    if mime.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        return (BodyKind::Form, None);
    }
    if mime.eq_ignore_ascii_case("multipart/form-data") {
        let boundary = ct.split(';').skip(1).find_map(|p| {
            let (k, v) = p.split_once('=')?;
            k.trim()
                .eq_ignore_ascii_case("boundary")
                .then(|| v.trim().trim_matches('"').as_bytes())
                .filter(|b| !b.is_empty())
        });
        return match boundary {
            Some(b) => (BodyKind::Multipart, Some(b)),
            None => (BodyKind::Text, None),
        };
    }
    let m = mime.as_bytes();
    let json = mime.eq_ignore_ascii_case("application/json")
        || mime.eq_ignore_ascii_case("text/json")
        || (m.len() >= 5 && m[m.len() - 5..].eq_ignore_ascii_case(b"+json"));
    if json {
        return (BodyKind::Json, None);
    }
    let first = data.iter().find(|b| !b.is_ascii_whitespace());
    if matches!(first, Some(b'{') | Some(b'[')) {
        return (BodyKind::Json, None);
    }
    (BodyKind::Text, None)
}

/// Whether the byte at `i` is preceded by an odd number of backslashes
/// (`None`: too many to tell cheaply).
fn escaped(data: &[u8], i: usize) -> Option<bool> {
    let mut n = 0;
    let mut j = i;
    while j > 0 && data[j - 1] == b'\\' {
        n += 1;
        j -= 1;
        if n > 16 {
            return None;
        }
    }
    Some(n % 2 == 1)
}

/// The unescaped `"` at or before `i`, looking back at most `limit` bytes.
fn quote_before(data: &[u8], i: usize, limit: usize) -> Option<usize> {
    let floor = i.saturating_sub(limit);
    let mut end = i + 1;
    loop {
        let q = floor + memchr::memrchr(b'"', &data[floor..end])?;
        if !escaped(data, q)? {
            return Some(q);
        }
        end = q;
    }
}

/// The key of the JSON member whose string value holds `pos`: the string's
/// opening quote, `:`, then `"key"`, read backwards from `pos` within a few
/// kilobytes. `None` for array elements, non-string values and text that is
/// not JSON there.
fn json_field(data: &[u8], pos: usize) -> Option<Field> {
    if pos == 0 {
        return None;
    }
    let open = quote_before(data, pos - 1, MAX_JSON_STRING_BACK)?;
    let mut i = open;
    let floor = open.saturating_sub(MAX_JSON_KEY_BACK);
    while i > floor && data[i - 1].is_ascii_whitespace() {
        i -= 1;
    }
    if i == floor || data[i - 1] != b':' {
        return None;
    }
    i -= 1;
    while i > floor && data[i - 1].is_ascii_whitespace() {
        i -= 1;
    }
    if i == floor || data[i - 1] != b'"' || escaped(data, i - 1)? {
        return None;
    }
    let key_end = i - 1;
    if key_end == 0 {
        return None;
    }
    let key_open = quote_before(data, key_end - 1, MAX_NAME + 1)?;
    let value_start = open + 1;
    Some(Field {
        name: FieldName::from_raw(&data[key_open + 1..key_end], false)?,
        value_start,
        // Found by `BodyContext::value_ends_at` when needed: the closing quote
        // of a JSON string is only looked for right at a secret's end.
        value_end: None,
        file: false,
    })
}

/// Parameter and header prefixes after which an AWS access key id is the public
/// half of a Signature Version 4 credential scope (`AKIA.../20230703/region/
/// service/aws4_request`): presigned URLs and SigV4 `Authorization` headers
/// carry it by design, the secret key never travels, and the signature is
/// scoped and expiring. Lowercase; compared ignoring ASCII case.
const SIGV4_SCOPE_PREFIXES: &[&[u8]] = &[
    b"x-amz-credential=",
    b"x-amz-credential%3d",
    b"aws4-hmac-sha256 credential=",
];

/// Whether a secret preceded by `before` is the access key id of a SigV4
/// credential scope: right after `X-Amz-Credential=` (or `%3D`) or `AWS4-HMAC-SHA256 Credential=`.
pub fn in_signed_url_scope(before: &[u8]) -> bool {
    SIGV4_SCOPE_PREFIXES.iter().any(|p| {
        before.len() >= p.len() && before[before.len() - p.len()..].eq_ignore_ascii_case(p)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> FieldName {
        FieldName::from_raw(s.as_bytes(), true).unwrap()
    }

    #[test]
    fn names_are_classified_by_their_leaf_words() {
        for n in [
            "password",
            "new_password",
            "currentPassword",
            "user[password]",
            "user%5Bpassword%5D",
            "pwd",
            "passwd",
            "pass",
            "password_confirmation",
        ] {
            assert_eq!(name_class(&name(n)), NameClass::Password, "{n}");
        }
        for n in [
            "api_key",
            "apiKey",
            "key",
            "token",
            "access_token",
            "X-API-Key",
        ] {
            assert_eq!(name_class(&name(n)), NameClass::KeyParameter, "{n}");
        }
        assert_eq!(name_class(&name("client_secret")), NameClass::ClientSecret);
        assert_eq!(name_class(&name("Authorization")), NameClass::Authorization);
        for n in [
            "comment",
            "aws_secret",
            "bypass",
            "aws_access_key_id",
            "keyboard",
        ] {
            assert_eq!(name_class(&name(n)), NameClass::Other, "{n}");
        }
    }

    #[test]
    fn form_fields_are_found_from_the_position() {
        let d = b"a=1&comment=my+key+AKIAXXXX&api_key=SECRET";
        let mut c = BodyContext::new(
            d,
            Some("application/x-www-form-urlencoded"),
            "/x",
            Direction::Request,
        );
        let p = d.windows(4).position(|w| w == b"AKIA").unwrap();
        let f = c.field_at(p).unwrap();
        assert_eq!(f.name.as_bytes(), b"comment");
        let p = d.windows(6).position(|w| w == b"SECRET").unwrap();
        let f = c.field_at(p).unwrap();
        assert_eq!(f.name.as_bytes(), b"api_key");
        assert_eq!((f.value_start, f.value_end), (p, Some(d.len())));
        // Earlier positions after a later lookup still work.
        assert_eq!(c.field_at(2).unwrap().name.as_bytes(), b"a");
        assert!(c.field_at(0).is_none());
    }

    #[test]
    fn json_keys_are_the_nearest_preceding_key() {
        let d = br#"{"user": {"password" : "hunter2", "list": ["x"]}, "c": "say \"k\": \"v\""}"#;
        let mut c = BodyContext::new(d, Some("application/json"), "/x", Direction::Request);
        let p = d.windows(7).position(|w| w == b"hunter2").unwrap();
        let f = c.field_at(p).unwrap();
        assert_eq!(f.name.as_bytes(), b"password");
        assert_eq!(f.value_start, p);
        assert!(c.value_ends_at(&f, p + 7) && !c.value_ends_at(&f, p + 6));
        let p = d.windows(3).position(|w| w == b"\"x\"").unwrap() + 1;
        assert!(c.field_at(p).is_none());
        // Inside a string that looks like a member: the real key is `c`.
        let p = d.windows(1).rposition(|w| w == b"v").unwrap();
        assert_eq!(c.field_at(p).unwrap().name.as_bytes(), b"c");
    }

    #[test]
    fn multipart_fields_and_files() {
        let d = b"--XyZ\r\nContent-Disposition: form-data; name=\"password\"\r\n\r\nhunter2\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"id_rsa\"\r\nContent-Type: text/plain\r\n\r\nKEYDATA\r\n--XyZ--\r\n";
        let mut c = BodyContext::new(
            d,
            Some("multipart/form-data; boundary=XyZ"),
            "/x",
            Direction::Request,
        );
        let p = d.windows(7).position(|w| w == b"hunter2").unwrap();
        let f = c.field_at(p).unwrap();
        assert_eq!(f.name.as_bytes(), b"password");
        assert_eq!(
            (f.value_start, f.value_end, f.file),
            (p, Some(p + 7), false)
        );
        let p = d.windows(7).position(|w| w == b"KEYDATA").unwrap();
        let f = c.field_at(p).unwrap();
        assert_eq!(f.name.as_bytes(), b"file");
        assert_eq!((f.value_end, f.file), (Some(p + 7), true));
    }

    #[test]
    fn hostile_bodies_do_not_panic() {
        for d in [
            &b"\"\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\":\"x"[..],
            b"\":\"",
            b"=&=&",
            b"%",
            b"%4",
            b"--b\r\n\r\n",
            b"\"",
        ] {
            for ct in [
                "application/é+json",
                "é",
                "application/vnd.api+json",
                "application/json",
                "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=b",
                "text/plain",
            ] {
                let mut c = BodyContext::new(d, Some(ct), "/oauth/token", Direction::Request);
                for p in 0..=d.len() {
                    if let Some(f) = c.field_at(p) {
                        let _ = c.exemption(&f, p..d.len());
                    }
                }
            }
        }
    }
}
