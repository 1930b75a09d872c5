//! The bot challenge: a proof-of-work page, and the signed cookie that clears a client.
//!
//! Stateless on the server: the challenge carries its own issue time and an HMAC over
//! it and the client's binding (IP or User-Agent); the solution is a counter `n` such
//! that SHA-256(`challenge:n`) starts with `difficulty` zero bits; the clearance cookie
//! carries its key id, its expiry and an HMAC over them and the binding. Keys rotate by
//! id: the first key signs, every key verifies.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::hmac;

use crate::config::{Binding, ChallengeConfig};

/// The cookie that carries a clearance.
pub const COOKIE: &str = "moat_clearance";

/// The query parameter that carries a solution.
pub const SOLUTION_PARAM: &str = "__moat_pow";

/// How long a challenge may take to solve.
pub const CHALLENGE_TTL_SECS: u64 = 300;

/// Longest solution or cookie value looked at (anything longer is refused unread).
const MAX_TOKEN: usize = 256;

/// The challenge's keys and settings.
pub struct Challenger {
    keys: Vec<(String, hmac::Key)>,
    difficulty: u8,
    ttl_secs: u64,
    /// What cookies are bound to.
    pub bind: Binding,
}

impl std::fmt::Debug for Challenger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Challenger")
            .field(
                "keys",
                &self.keys.iter().map(|(id, _)| id).collect::<Vec<_>>(),
            )
            .field("difficulty", &self.difficulty)
            .finish()
    }
}

/// Why a solution was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Not of the expected form.
    Malformed,
    /// Not signed by a known key, or for another client.
    BadSignature,
    /// Issued too long ago.
    Expired,
    /// The hash has too few leading zero bits.
    NotSolved,
}

impl Challenger {
    /// The challenger of a configuration (a random key when it names none).
    pub fn new(cfg: &ChallengeConfig) -> Self {
        let keys = if cfg.keys.is_empty() {
            let secret: [u8; 32] = rand::random();
            vec![("r".to_string(), hmac::Key::new(hmac::HMAC_SHA256, &secret))]
        } else {
            cfg.keys
                .iter()
                .map(|k| {
                    (
                        k.id.clone(),
                        hmac::Key::new(hmac::HMAC_SHA256, k.secret.as_bytes()),
                    )
                })
                .collect()
        };
        Challenger {
            keys,
            difficulty: cfg.difficulty,
            ttl_secs: cfg.ttl.as_secs().max(1),
            bind: cfg.bind,
        }
    }

    /// A challenger for a new configuration that keeps this one's keys (a random key
    /// must survive reloads, or every client would be challenged again after each).
    pub fn clone_with(&self, cfg: &ChallengeConfig) -> Challenger {
        Challenger {
            keys: self.keys.clone(),
            ..Challenger::new(cfg)
        }
    }

    fn sign(key: &hmac::Key, parts: &[&[u8]]) -> hmac::Tag {
        let mut ctx = hmac::Context::with_key(key);
        for p in parts {
            // Length-prefixed: no two part lists sign the same bytes.
            ctx.update(&(p.len() as u32).to_be_bytes());
            ctx.update(p);
        }
        ctx.sign()
    }

    fn verify(key: &hmac::Key, parts: &[&[u8]], tag: &[u8]) -> bool {
        let mut msg = Vec::with_capacity(64);
        for p in parts {
            msg.extend_from_slice(&(p.len() as u32).to_be_bytes());
            msg.extend_from_slice(p);
        }
        hmac::verify(key, &msg, tag).is_ok()
    }

    /// The cookie value clearing `binding` from `now` (Unix seconds).
    pub fn cookie(&self, binding: &[u8], now: u64) -> String {
        let (id, key) = &self.keys[0];
        let exp = now.saturating_add(self.ttl_secs).to_string();
        let tag = Self::sign(key, &[b"cookie", id.as_bytes(), exp.as_bytes(), binding]);
        format!("{id}.{exp}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    /// Seconds a cookie lives.
    pub fn ttl_secs(&self) -> u64 {
        self.ttl_secs
    }

    /// True when `value` is a cookie this challenger issued for `binding`, unexpired.
    pub fn cookie_valid(&self, value: &str, binding: &[u8], now: u64) -> bool {
        if value.len() > MAX_TOKEN {
            return false;
        }
        let mut it = value.split('.');
        let (Some(id), Some(exp), Some(tag), None) = (it.next(), it.next(), it.next(), it.next())
        else {
            return false;
        };
        let Ok(exp_n) = exp.parse::<u64>() else {
            return false;
        };
        if exp_n <= now {
            return false;
        }
        let Ok(tag) = URL_SAFE_NO_PAD.decode(tag) else {
            return false;
        };
        self.keys.iter().filter(|(k, _)| k == id).any(|(_, key)| {
            Self::verify(
                key,
                &[b"cookie", id.as_bytes(), exp.as_bytes(), binding],
                &tag,
            )
        })
    }

    /// A new challenge for `binding` at `now` (Unix seconds).
    pub fn challenge(&self, binding: &[u8], now: u64) -> String {
        let (_, key) = &self.keys[0];
        let nonce: [u8; 12] = rand::random();
        let nonce = URL_SAFE_NO_PAD.encode(nonce);
        let ts = now.to_string();
        let tag = Self::sign(
            key,
            &[b"challenge", ts.as_bytes(), nonce.as_bytes(), binding],
        );
        format!(
            "{ts}.{nonce}.{}",
            URL_SAFE_NO_PAD.encode(&tag.as_ref()[..16])
        )
    }

    /// Checks a solution `challenge.n` for `binding` at `now`.
    pub fn check_solution(&self, solution: &str, binding: &[u8], now: u64) -> Result<(), Rejected> {
        if solution.len() > MAX_TOKEN {
            return Err(Rejected::Malformed);
        }
        let (challenge, n) = solution.rsplit_once('.').ok_or(Rejected::Malformed)?;
        if n.is_empty() || n.len() > 20 || !n.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Rejected::Malformed);
        }
        let mut it = challenge.split('.');
        let (Some(ts), Some(nonce), Some(tag), None) = (it.next(), it.next(), it.next(), it.next())
        else {
            return Err(Rejected::Malformed);
        };
        let issued: u64 = ts.parse().map_err(|_| Rejected::Malformed)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| Rejected::Malformed)?;
        let signed = self.keys.iter().any(|(_, key)| {
            let full = Self::sign(
                key,
                &[b"challenge", ts.as_bytes(), nonce.as_bytes(), binding],
            );
            tag.len() == 16 && ring_eq(&full.as_ref()[..16], &tag)
        });
        if !signed {
            return Err(Rejected::BadSignature);
        }
        if now > issued.saturating_add(CHALLENGE_TTL_SECS) || issued > now.saturating_add(60) {
            return Err(Rejected::Expired);
        }
        let digest = ring::digest::digest(&ring::digest::SHA256, solution.as_bytes());
        if leading_zero_bits(digest.as_ref()) < u32::from(self.difficulty) {
            return Err(Rejected::NotSolved);
        }
        Ok(())
    }

    /// Solves a challenge (for tests and tools; a browser runs the page's script).
    pub fn solve(challenge: &str, difficulty: u8) -> String {
        (0u64..)
            .map(|n| format!("{challenge}.{n}"))
            .find(|s| {
                let d = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
                leading_zero_bits(d.as_ref()) >= u32::from(difficulty)
            })
            .unwrap_or_default()
    }

    /// The challenge page for `challenge`: it finds the counter and reloads the page's
    /// URL with the solution. No external script, style or font.
    pub fn page(&self, challenge: &str) -> String {
        PAGE.replace("{{CHALLENGE}}", challenge)
            .replace("{{DIFFICULTY}}", &self.difficulty.to_string())
            .replace("{{PARAM}}", SOLUTION_PARAM)
    }
}

/// Constant-time equality of two tags.
fn ring_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn leading_zero_bits(d: &[u8]) -> u32 {
    let mut n = 0;
    for b in d {
        if *b == 0 {
            n += 8;
        } else {
            return n + b.leading_zeros();
        }
    }
    n
}

/// The page. SHA-256 is written out in the script because `crypto.subtle` exists only
/// in secure contexts (a plain-HTTP site would never pass).
const PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><meta name="robots" content="noindex">
<title>Checking your browser</title>
<style>body{font-family:sans-serif;max-width:32em;margin:4em auto;color:#333}</style>
</head><body>
<h1>Checking your browser&hellip;</h1>
<p id="s">This takes a moment. It needs JavaScript.</p>
<script>
(function(){
var C="{{CHALLENGE}}",D={{DIFFICULTY}},P="{{PARAM}}";
var K=[0x428a2f98,0x71374491,0xb5c0fbcf,0xe9b5dba5,0x3956c25b,0x59f111f1,0x923f82a4,0xab1c5ed5,0xd807aa98,0x12835b01,0x243185be,0x550c7dc3,0x72be5d74,0x80deb1fe,0x9bdc06a7,0xc19bf174,0xe49b69c1,0xefbe4786,0x0fc19dc6,0x240ca1cc,0x2de92c6f,0x4a7484aa,0x5cb0a9dc,0x76f988da,0x983e5152,0xa831c66d,0xb00327c8,0xbf597fc7,0xc6e00bf3,0xd5a79147,0x06ca6351,0x14292967,0x27b70a85,0x2e1b2138,0x4d2c6dfc,0x53380d13,0x650a7354,0x766a0abb,0x81c2c92e,0x92722c85,0xa2bfe8a1,0xa81a664b,0xc24b8b70,0xc76c51a3,0xd192e819,0xd6990624,0xf40e3585,0x106aa070,0x19a4c116,0x1e376c08,0x2748774c,0x34b0bcb5,0x391c0cb3,0x4ed8aa4a,0x5b9cca4f,0x682e6ff3,0x748f82ee,0x78a5636f,0x84c87814,0x8cc70208,0x90befffa,0xa4506ceb,0xbef9a3f7,0xc67178f2];
function sha(s){var b=[],i,j;for(i=0;i<s.length;i++)b.push(s.charCodeAt(i)&255);var l=b.length*8;b.push(128);while(b.length%64!=56)b.push(0);for(i=7;i>=0;i--)b.push(i>3?0:(l>>>(i*8))&255);
var h=[0x6a09e667,0xbb67ae85,0x3c6ef372,0xa54ff53a,0x510e527f,0x9b05688c,0x1f83d9ab,0x5be0cd19],w=new Array(64);
for(i=0;i<b.length;i+=64){for(j=0;j<16;j++)w[j]=(b[i+4*j]<<24)|(b[i+4*j+1]<<16)|(b[i+4*j+2]<<8)|b[i+4*j+3];
for(j=16;j<64;j++){var x=w[j-15],y=w[j-2];var s0=((x>>>7)|(x<<25))^((x>>>18)|(x<<14))^(x>>>3),s1=((y>>>17)|(y<<15))^((y>>>19)|(y<<13))^(y>>>10);w[j]=(w[j-16]+s0+w[j-7]+s1)|0;}
var a=h[0],c=h[1],d=h[2],e=h[3],f=h[4],g=h[5],k=h[6],m=h[7];
for(j=0;j<64;j++){var S1=((f>>>6)|(f<<26))^((f>>>11)|(f<<21))^((f>>>25)|(f<<7)),ch=(f&g)^(~f&k),t1=(m+S1+ch+K[j]+w[j])|0,S0=((a>>>2)|(a<<30))^((a>>>13)|(a<<19))^((a>>>22)|(a<<10)),mj=(a&c)^(a&d)^(c&d),t2=(S0+mj)|0;m=k;k=g;g=f;f=(e+t1)|0;e=d;d=c;c=a;a=(t1+t2)|0;}
h[0]=(h[0]+a)|0;h[1]=(h[1]+c)|0;h[2]=(h[2]+d)|0;h[3]=(h[3]+e)|0;h[4]=(h[4]+f)|0;h[5]=(h[5]+g)|0;h[6]=(h[6]+k)|0;h[7]=(h[7]+m)|0;}return h;}
function zeros(h){var n=0;for(var i=0;i<8;i++){if(h[i]===0){n+=32;continue;}return n+Math.clz32(h[i]);}return n;}
var n=0;function run(){var end=Date.now()+50;while(Date.now()<end){if(zeros(sha(C+"."+n))>=D){var u=new URL(location.href);u.searchParams.set(P,C+"."+n);location.replace(u.toString());return;}n++;}setTimeout(run,0);}
run();
})();
</script>
<noscript><p>Please enable JavaScript to continue.</p></noscript>
</body></html>
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ChallengeKey;

    fn cfg(keys: &[(&str, &str)]) -> ChallengeConfig {
        ChallengeConfig {
            routes: vec![],
            difficulty: 8,
            ttl: std::time::Duration::from_secs(60),
            bind: Binding::Ip,
            keys: keys
                .iter()
                .map(|(id, s)| ChallengeKey {
                    id: id.to_string(),
                    secret: s.to_string(),
                })
                .collect(),
            exempt: Default::default(),
        }
    }

    const K1: &str = "0123456789abcdef0123456789abcdef-one";
    const K2: &str = "0123456789abcdef0123456789abcdef-two";

    #[test]
    fn solutions_and_cookies() {
        let c = Challenger::new(&cfg(&[("k1", K1)]));
        let ch = c.challenge(b"ip-a", 1000);
        let sol = Challenger::solve(&ch, 8);
        assert_eq!(c.check_solution(&sol, b"ip-a", 1001), Ok(()));
        assert_eq!(
            c.check_solution(&sol, b"ip-b", 1001),
            Err(Rejected::BadSignature)
        );
        assert_eq!(
            c.check_solution(&sol, b"ip-a", 1000 + 301),
            Err(Rejected::Expired)
        );
        let unsolved = format!("{ch}.x");
        assert_eq!(
            c.check_solution(&unsolved, b"ip-a", 1001),
            Err(Rejected::Malformed)
        );
        let wrong = (0..)
            .map(|n| format!("{ch}.{n}"))
            .find(|s| c.check_solution(s, b"ip-a", 1001).is_err())
            .unwrap();
        assert_eq!(
            c.check_solution(&wrong, b"ip-a", 1001),
            Err(Rejected::NotSolved)
        );

        let cookie = c.cookie(b"ip-a", 1000);
        assert!(c.cookie_valid(&cookie, b"ip-a", 1059));
        assert!(!c.cookie_valid(&cookie, b"ip-a", 1060), "expired");
        assert!(!c.cookie_valid(&cookie, b"ip-b", 1001), "other client");
        // A forged expiry breaks the signature.
        let forged = cookie.replacen("1060", "9999", 1);
        assert!(!c.cookie_valid(&forged, b"ip-a", 1001));
        for junk in [
            "",
            "k1",
            "k1.1.",
            "k1.99999999999999999999999.AA",
            &"a".repeat(10_000),
        ] {
            assert!(!c.cookie_valid(junk, b"ip-a", 1001), "{junk}");
        }
    }

    #[test]
    fn keys_rotate() {
        let old = Challenger::new(&cfg(&[("k1", K1)]));
        let cookie = old.cookie(b"ua", 1000);
        // The new key signs, the old one still verifies.
        let both = Challenger::new(&cfg(&[("k2", K2), ("k1", K1)]));
        assert!(both.cookie_valid(&cookie, b"ua", 1001));
        assert!(both.cookie(b"ua", 1000).starts_with("k2."));
        // Once the old key is dropped its cookies are refused.
        let new = Challenger::new(&cfg(&[("k2", K2)]));
        assert!(!new.cookie_valid(&cookie, b"ua", 1001));
    }
}
