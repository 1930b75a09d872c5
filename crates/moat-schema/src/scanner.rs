//! Sensitive-data scanners: tag a string schema node with what the value is
//! (an email, a card number, ...) without keeping the value.
//!
//! As in libddwaf, a scanner has an optional key matcher (a case-insensitive
//! regex with `\b` word boundaries, so `user_email` does not match
//! `\bemail\b`) and an optional value matcher; both must match, a missing one
//! counts as a match, and a key matcher never matches an empty or absent key.
//! Scanners are tried in order and the first match gives the tags.
//!
//! Value matchers add checksums where the format has one: Luhn for card
//! numbers and Canadian SINs, ISO 7064 mod 97 plus the country's length for
//! IBANs, area/group/serial rules for US SSNs, a decodable JSON header with
//! `alg` for JWTs, and a full address parse for IPs.

use std::collections::BTreeMap;

use base64::Engine;
use regex::{Regex, RegexSet};

/// Tags of a matched scanner, e.g. `{"category":"pii","type":"email"}`.
pub type Tags = BTreeMap<String, String>;

type Check = fn(&str) -> Option<usize>;

/// One scanner.
pub struct Scanner {
    id: String,
    key: Option<Regex>,
    key_src: Option<String>,
    prefilter: Option<fn(&str) -> bool>,
    value: Option<Regex>,
    check: Option<Check>,
    /// Tag sets; `check` chooses one (card brands), otherwise the first applies.
    tags: Vec<Tags>,
}

impl std::fmt::Debug for Scanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scanner").field("id", &self.id).finish()
    }
}

fn tags(pairs: &[(&str, &str)]) -> Tags {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Scanner {
    /// A scanner from regexes: `key` is matched case-insensitively against the
    /// key, `value` against the whole string value.
    pub fn new(
        id: &str,
        key: Option<&str>,
        value: Option<&str>,
        tag_pairs: &[(&str, &str)],
    ) -> Result<Scanner, regex::Error> {
        let key_src = key.map(|k| format!("(?i){k}"));
        Ok(Scanner {
            id: id.to_string(),
            key: key_src.as_deref().map(Regex::new).transpose()?,
            key_src,
            prefilter: None,
            value: value.map(Regex::new).transpose()?,
            check: None,
            tags: vec![tags(tag_pairs)],
        })
    }

    fn with_check(mut self, check: Check, tag_sets: Vec<Tags>) -> Scanner {
        self.check = Some(check);
        self.tags = tag_sets;
        self
    }

    /// A cheap test every value must pass before the value regex runs.
    fn with_prefilter(mut self, f: fn(&str) -> bool) -> Scanner {
        self.prefilter = Some(f);
        self
    }

    /// The scanner id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The tags when `key`/`value` match.
    pub fn eval(&self, key: Option<&str>, value: &str) -> Option<&Tags> {
        if let Some(k) = &self.key {
            match key {
                Some(key) if !key.is_empty() && k.is_match(key) => {}
                _ => return None,
            }
        }
        self.eval_value(value)
    }

    /// The tags when `value` matches (the key was checked by the caller).
    fn eval_value(&self, value: &str) -> Option<&Tags> {
        if let Some(p) = self.prefilter {
            if !p(value) {
                return None;
            }
        }
        if let Some(v) = &self.value {
            if !v.is_match(value) {
                return None;
            }
        }
        let idx = match self.check {
            Some(c) => c(value)?,
            None => 0,
        };
        self.tags.get(idx)
    }
}

/// An ordered list of scanners.
///
/// The key matchers are also compiled into one [`RegexSet`], so a key is read
/// once for all key-gated scanners.
#[derive(Debug, Default)]
pub struct Scanners {
    list: Vec<Scanner>,
    /// Key regexes of the scanners that have one.
    key_set: Option<RegexSet>,
    /// Per scanner: its index in `key_set`.
    key_index: Vec<Option<usize>>,
}

/// Card brands, in the order of the tag sets of the card scanner.
const CARD_BRANDS: [&str; 7] = [
    "visa",
    "mastercard",
    "amex",
    "discover",
    "jcb",
    "diners",
    "maestro",
];

impl Scanners {
    /// No scanners (schemas without tags).
    pub fn none() -> Scanners {
        Scanners::from_list(Vec::new())
    }

    /// These scanners, tried in order.
    pub fn from_list(list: Vec<Scanner>) -> Scanners {
        let mut patterns = Vec::new();
        let key_index = list
            .iter()
            .map(|s| {
                s.key_src.as_ref().map(|k| {
                    patterns.push(k.clone());
                    patterns.len() - 1
                })
            })
            .collect();
        // Each pattern compiled on its own already; if the set is refused (size
        // limit), keys are matched one regex at a time.
        let key_set = RegexSet::new(&patterns).ok();
        Scanners {
            list,
            key_set,
            key_index,
        }
    }

    /// The built-in scanners (credentials, payment, PII), see the module docs and docs/discovery.md.
    pub fn builtin() -> Scanners {
        // The patterns are constants; a failure here is a programming error caught by the tests.
        let s = |id: &str, key: Option<&str>, value: Option<&str>, t: &[(&str, &str)]| {
            Scanner::new(id, key, value, t).unwrap_or_else(|e| panic!("scanner {id}: {e}"))
        };
        fn cred(ty: &str) -> [(&str, &str); 2] {
            [("category", "credentials"), ("type", ty)]
        }
        fn pii(ty: &str) -> [(&str, &str); 2] {
            [("category", "pii"), ("type", ty)]
        }
        const NUM: &str = r"(?:[-_ ]?(?:number|num|no|nr|id))?";
        let list = vec![
            s(
                "bearer_token",
                Some(r"(?-u:\b)authorization(?-u:\b)"),
                Some(r"(?i)^\s*bearer\s+\S+"),
                &cred("bearer_token"),
            ),
            s(
                "basic_auth",
                Some(r"(?-u:\b)authorization(?-u:\b)"),
                Some(r"(?i)^\s*basic\s+[A-Za-z0-9+/=]+\s*$"),
                &cred("basic_auth"),
            ),
            s(
                "digest_auth",
                Some(r"(?-u:\b)authorization(?-u:\b)"),
                Some(r"(?i)^\s*digest\s+\S+"),
                &cred("digest_auth"),
            ),
            s(
                "json_web_token",
                None,
                Some(r"^eyJ[A-Za-z0-9_-]{2,}\.eyJ[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*$"),
                &cred("json_web_token"),
            )
            .with_check(check_jwt, vec![tags(&cred("json_web_token"))])
            .with_prefilter(|v| v.starts_with("eyJ")),
            s(
                "card",
                Some(r"(?-u:\b)(?:card|cc|ccnum|ccnumber|cardnumber|creditcard|credit[- ]card|pan)(?-u:\b)"),
                Some(r"^\d(?:[ -]?\d){11,18}$"),
                &[],
            )
            .with_check(
                check_card,
                CARD_BRANDS
                    .iter()
                    .map(|b| tags(&[("card_type", b), ("category", "payment"), ("type", "card")]))
                    .collect(),
            ),
            s(
                "iban",
                None,
                Some(r"^[A-Za-z]{2}\d{2}(?: ?[A-Za-z0-9]){11,30}$"),
                &[("category", "payment"), ("type", "iban")],
            )
            .with_check(
                check_iban,
                vec![tags(&[("category", "payment"), ("type", "iban")])],
            )
            .with_prefilter(|v| {
                let b = v.as_bytes();
                b.len() >= 15
                    && b[0].is_ascii_alphabetic()
                    && b[1].is_ascii_alphabetic()
                    && b[2].is_ascii_digit()
                    && b[3].is_ascii_digit()
            }),
            s(
                "email",
                Some(r"(?-u:\b)(?:e[-_]?mail(?:[-_]?address)?|mail|sender|recipient|reply[-_]?to)(?-u:\b)"),
                Some(r"^[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}$"),
                &pii("email"),
            ),
            s(
                "us_ssn",
                Some(&format!(r"(?-u:\b)(?:ssn|social[-_ ]?security{NUM})(?-u:\b)")),
                Some(r"^\d{3}-?\d{2}-?\d{4}$"),
                &[],
            )
            .with_check(check_ssn, vec![tags(&pii("us_ssn"))]),
            s(
                "canadian_sin",
                Some(&format!(r"(?-u:\b)(?:sin|social[-_ ]?insurance{NUM})(?-u:\b)")),
                Some(r"^\d{3}[- ]?\d{3}[- ]?\d{3}$"),
                &[],
            )
            .with_check(check_sin, vec![tags(&pii("canadian_sin"))]),
            s(
                "uk_nin",
                Some(&format!(r"(?-u:\b)(?:nin|nino|national[-_ ]?insurance{NUM})(?-u:\b)")),
                Some(r"(?i)^[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]$"),
                &pii("uk_nin"),
            ),
            s(
                "passport_number",
                Some(&format!(r"(?-u:\b)passport{NUM}(?-u:\b)")),
                Some(r"(?i)^[A-Z0-9]{6,9}$"),
                &pii("passport_number"),
            ),
            s(
                "vin",
                Some(r"(?-u:\b)(?:vin|vehicle[-_ ]?identification[-_ ]?number)(?-u:\b)"),
                Some(r"(?i)^[A-HJ-NPR-Z0-9]{17}$"),
                &pii("vin"),
            ),
            s(
                "phone",
                Some(&format!(
                    r"(?-u:\b)(?:phone|tel|telephone|mobile|cell|fax|msisdn){NUM}(?-u:\b)"
                )),
                Some(r"^\+?[0-9 ().-]{7,24}$"),
                &[],
            )
            .with_check(check_phone, vec![tags(&pii("phone"))]),
            s("ip_address", None, None, &[]).with_check(check_ip, vec![tags(&pii("ip_address"))]),
        ];
        Scanners::from_list(list)
    }

    /// Tags of the first scanner matching `key`/`value`.
    pub fn scan(&self, key: Option<&str>, value: &str) -> Option<&Tags> {
        let key = key.filter(|k| !k.is_empty());
        let Some(set) = &self.key_set else {
            return self.list.iter().find_map(|s| s.eval(key, value));
        };
        let matched = key.map(|k| set.matches(k));
        for (s, ki) in self.list.iter().zip(&self.key_index) {
            if let Some(ki) = ki {
                if !matched.as_ref().is_some_and(|m| m.matched(*ki)) {
                    continue;
                }
            }
            if let Some(t) = s.eval_value(value) {
                return Some(t);
            }
        }
        None
    }

    /// Number of scanners.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// True when there are no scanners.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

fn digits(s: &str) -> Vec<u8> {
    s.bytes()
        .filter(u8::is_ascii_digit)
        .map(|b| b - b'0')
        .collect()
}

/// The Luhn checksum holds.
pub fn luhn(digits: &[u8]) -> bool {
    if digits.is_empty() {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            let d = d as u32;
            if i % 2 == 1 {
                let x = d * 2;
                if x > 9 {
                    x - 9
                } else {
                    x
                }
            } else {
                d
            }
        })
        .sum();
    matches!(sum % 10, 0)
}

/// Brand index into [`CARD_BRANDS`] of a Luhn-valid card number.
fn check_card(value: &str) -> Option<usize> {
    let d = digits(value);
    if !luhn(&d) {
        return None;
    }
    let n = d.len();
    let prefix = |k: usize| -> u32 { d.iter().take(k).fold(0, |a, &x| a * 10 + x as u32) };
    let (p1, p2, p3, p4) = (prefix(1), prefix(2), prefix(3), prefix(4));
    let brand = if p1 == 4 && matches!(n, 13 | 16 | 19) {
        "visa"
    } else if ((51..=55).contains(&p2) || (2221..=2720).contains(&p4)) && n == 16 {
        "mastercard"
    } else if (p2 == 34 || p2 == 37) && n == 15 {
        "amex"
    } else if (p4 == 6011 || (644..=649).contains(&p3) || p2 == 65) && (16..=19).contains(&n) {
        "discover"
    } else if (3528..=3589).contains(&p4) && (16..=19).contains(&n) {
        "jcb"
    } else if ((300..=305).contains(&p3) || p2 == 36 || p2 == 38 || p2 == 39)
        && (14..=19).contains(&n)
    {
        "diners"
    } else if (p2 == 50 || (56..=69).contains(&p2)) && (12..=19).contains(&n) {
        "maestro"
    } else {
        return None;
    };
    CARD_BRANDS.iter().position(|b| *b == brand)
}

/// IBAN length per country (ISO 13616 registry, the most used countries).
const IBAN_LENGTHS: &[(&str, usize)] = &[
    ("AD", 24),
    ("AE", 23),
    ("AT", 20),
    ("BE", 16),
    ("BG", 22),
    ("BH", 22),
    ("BR", 29),
    ("CH", 21),
    ("CY", 28),
    ("CZ", 24),
    ("DE", 22),
    ("DK", 18),
    ("EE", 20),
    ("ES", 24),
    ("FI", 18),
    ("FO", 18),
    ("FR", 27),
    ("GB", 22),
    ("GI", 23),
    ("GL", 18),
    ("GR", 27),
    ("HR", 21),
    ("HU", 28),
    ("IE", 22),
    ("IL", 23),
    ("IS", 26),
    ("IT", 27),
    ("JO", 30),
    ("KW", 30),
    ("KZ", 20),
    ("LB", 28),
    ("LI", 21),
    ("LT", 20),
    ("LU", 20),
    ("LV", 21),
    ("MC", 27),
    ("ME", 22),
    ("MK", 19),
    ("MT", 31),
    ("MU", 30),
    ("NL", 18),
    ("NO", 15),
    ("PK", 24),
    ("PL", 28),
    ("PS", 29),
    ("PT", 25),
    ("QA", 29),
    ("RO", 24),
    ("RS", 22),
    ("SA", 24),
    ("SE", 24),
    ("SI", 19),
    ("SK", 24),
    ("SM", 27),
    ("TN", 24),
    ("TR", 26),
    ("UA", 29),
    ("VA", 22),
    ("XK", 20),
];

fn check_iban(value: &str) -> Option<usize> {
    let compact: Vec<u8> = value
        .bytes()
        .filter(|b| *b != b' ')
        .map(|b| b.to_ascii_uppercase())
        .collect();
    let country = std::str::from_utf8(compact.get(..2)?).ok()?;
    let expected = IBAN_LENGTHS.iter().find(|(c, _)| *c == country)?.1;
    if compact.len() != expected {
        return None;
    }
    // Move the first four characters to the end, letters -> 10..35, mod 97 == 1.
    let mut rem: u32 = 0;
    for &b in compact[4..].iter().chain(compact[..4].iter()) {
        let v = match b {
            b'0'..=b'9' => (b - b'0') as u32,
            b'A'..=b'Z' => (b - b'A') as u32 + 10,
            _ => return None,
        };
        rem = if v >= 10 {
            (rem * 100 + v) % 97
        } else {
            (rem * 10 + v) % 97
        };
    }
    (rem == 1).then_some(0)
}

fn check_ssn(value: &str) -> Option<usize> {
    let d = digits(value);
    if d.len() != 9 {
        return None;
    }
    let area = d[0] as u32 * 100 + d[1] as u32 * 10 + d[2] as u32;
    let group = d[3] as u32 * 10 + d[4] as u32;
    let serial = d[5..].iter().fold(0u32, |a, &x| a * 10 + x as u32);
    (area != 0 && area != 666 && area < 900 && group != 0 && serial != 0).then_some(0)
}

fn check_sin(value: &str) -> Option<usize> {
    let d = digits(value);
    (d.len() == 9 && luhn(&d)).then_some(0)
}

fn check_phone(value: &str) -> Option<usize> {
    let n = value.bytes().filter(u8::is_ascii_digit).count();
    (7..=15).contains(&n).then_some(0)
}

fn check_ip(value: &str) -> Option<usize> {
    let first = *value.as_bytes().first()?;
    if !(first.is_ascii_hexdigit() || first == b':') || value.len() > 45 {
        return None;
    }
    value.parse::<std::net::IpAddr>().ok().map(|_| 0)
}

fn check_jwt(value: &str) -> Option<usize> {
    let header = value.split('.').next()?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header.trim_end_matches('='))
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    v.get("alg").is_some().then_some(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ty(key: &str, value: &str) -> Option<String> {
        let sc = Scanners::builtin();
        sc.scan(Some(key), value).map(|t| {
            let mut s = t["type"].clone();
            if let Some(b) = t.get("card_type") {
                s = format!("{s}:{b}");
            }
            s
        })
    }

    #[test]
    fn luhn_known_values() {
        assert!(luhn(&digits("4111111111111111")));
        assert!(luhn(&digits("79927398713")));
        assert!(!luhn(&digits("4111111111111112")));
        assert!(!luhn(&digits("79927398710")));
        assert!(!luhn(&[]));
    }

    #[test]
    fn cards_by_brand_and_checksum() {
        assert_eq!(ty("card", "4111111111111111").as_deref(), Some("card:visa"));
        assert_eq!(
            ty("card", "4111 1111 1111 1111").as_deref(),
            Some("card:visa")
        );
        assert_eq!(
            ty("cc", "5555555555554444").as_deref(),
            Some("card:mastercard")
        );
        assert_eq!(
            ty("pan", "2223003122003222").as_deref(),
            Some("card:mastercard")
        );
        assert_eq!(ty("card", "378282246310005").as_deref(), Some("card:amex"));
        assert_eq!(
            ty("card", "6011111111111117").as_deref(),
            Some("card:discover")
        );
        assert_eq!(ty("card", "3530111333300000").as_deref(), Some("card:jcb"));
        assert_eq!(ty("card", "30569309025904").as_deref(), Some("card:diners"));
        // Luhn failure, wrong key, separators at the word boundary rule.
        assert_eq!(ty("card", "4111111111111112"), None);
        assert_eq!(ty("card_number", "4111111111111111"), None);
        assert_eq!(ty("order", "4111111111111111"), None);
        assert_eq!(ty("card", "1234"), None);
    }

    #[test]
    fn email_needs_key_and_shape() {
        assert_eq!(
            ty("email", "jane.doe@example.com").as_deref(),
            Some("email")
        );
        assert_eq!(ty("E-Mail", "a@b.io").as_deref(), Some("email"));
        assert_eq!(ty("user_email", "jane.doe@example.com"), None);
        assert_eq!(ty("email", "not an email"), None);
        assert_eq!(ty("email", "jane@localhost"), None);
    }

    #[test]
    fn iban_checksum_and_length() {
        assert_eq!(ty("x", "DE89370400440532013000").as_deref(), Some("iban"));
        assert_eq!(
            ty("x", "GB82 WEST 1234 5698 7654 32").as_deref(),
            Some("iban")
        );
        assert_eq!(ty("x", "DE89370400440532013001"), None, "bad checksum");
        assert_eq!(ty("x", "DE8937040044053201300"), None, "bad length");
        assert_eq!(ty("x", "ZZ89370400440532013000"), None, "unknown country");
    }

    #[test]
    fn national_ids() {
        assert_eq!(ty("ssn", "123-45-6789").as_deref(), Some("us_ssn"));
        assert_eq!(
            ty("social_security_number", "123456789").as_deref(),
            Some("us_ssn")
        );
        assert_eq!(ty("ssn", "666-45-6789"), None);
        assert_eq!(ty("ssn", "123-00-6789"), None);
        assert_eq!(ty("ssn", "900-45-6789"), None);
        assert_eq!(ty("id", "123-45-6789"), None);
        assert_eq!(ty("sin", "046 454 286").as_deref(), Some("canadian_sin"));
        assert_eq!(ty("sin", "046 454 287"), None);
        assert_eq!(ty("nino", "AB 12 34 56 C").as_deref(), Some("uk_nin"));
        assert_eq!(ty("nino", "DA 12 34 56 C"), None);
        assert_eq!(
            ty("passport_number", "X1234567").as_deref(),
            Some("passport_number")
        );
        assert_eq!(ty("vin", "1HGCM82633A004352").as_deref(), Some("vin"));
        assert_eq!(
            ty("vin", "1HGCM82633A00435I"),
            None,
            "I is not a VIN letter"
        );
    }

    #[test]
    fn phone_numbers() {
        assert_eq!(ty("phone", "+1 (415) 555-0100").as_deref(), Some("phone"));
        assert_eq!(
            ty("mobile_number", "07700 900123").as_deref(),
            Some("phone")
        );
        assert_eq!(ty("phone", "12345"), None, "too few digits");
        assert_eq!(ty("phone", "call me"), None);
        assert_eq!(ty("count", "+1 (415) 555-0100"), None);
    }

    #[test]
    fn credentials_and_jwt() {
        assert_eq!(
            ty("authorization", "Bearer eyJhbGciOi.abcdEFGH").as_deref(),
            Some("bearer_token")
        );
        assert_eq!(
            ty("Authorization", "Basic dXNlcjpwYXNz").as_deref(),
            Some("basic_auth")
        );
        assert_eq!(
            ty("authorization", "Digest username=\"a\", realm=\"r\"").as_deref(),
            Some("digest_auth")
        );
        assert_eq!(ty("x-auth", "Bearer abc"), None);
        // {"alg":"HS256","typ":"JWT"}.{"sub":"1234567890"}.sig
        let jwt = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
        assert_eq!(ty("token", jwt).as_deref(), Some("json_web_token"));
        assert_eq!(ty("anything", jwt).as_deref(), Some("json_web_token"));
        assert_eq!(ty("token", "eyJub3Rqc29u.eyJzdWIiOiIxIn0.x"), None);
        // Root values have no key: value-only scanners still apply.
        assert!(Scanners::builtin().scan(None, jwt).is_some());
        assert!(Scanners::builtin().scan(None, "jane@example.com").is_none());
    }

    #[test]
    fn key_set_agrees_with_single_scanners() {
        let sc = Scanners::builtin();
        assert!(sc.key_set.is_some());
        let keys = [
            None,
            Some(""),
            Some("email"),
            Some("card"),
            Some("authorization"),
            Some("ssn"),
            Some("phone_number"),
            Some("vin"),
            Some("other"),
        ];
        let values = [
            "a@b.io",
            "4111111111111111",
            "Bearer x",
            "123-45-6789",
            "+1 415 555 0100",
            "1HGCM82633A004352",
            "10.0.0.1",
            "DE89370400440532013000",
            "plain",
        ];
        for k in keys {
            for v in values {
                let single = sc.list.iter().find_map(|s| s.eval(k, v));
                assert_eq!(sc.scan(k, v), single, "{k:?} {v}");
            }
        }
    }

    #[test]
    fn ip_addresses() {
        assert_eq!(ty("client", "203.0.113.9").as_deref(), Some("ip_address"));
        assert_eq!(
            ty("x-forwarded-for", "2001:db8::1").as_deref(),
            Some("ip_address")
        );
        assert_eq!(ty("version", "1.2.3"), None);
        assert_eq!(ty("v", "999.1.1.1"), None);
        assert_eq!(ty("v", "cafe"), None);
    }
}
