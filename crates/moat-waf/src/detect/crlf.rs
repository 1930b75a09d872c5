//! CRLF / header injection and SMTP / IMAP command injection.

use super::{Attack, Hit};
use crate::util::starts_with_ci;

const INJECTED_HEADERS: &[&str] = &[
    "set-cookie",
    "location",
    "content-type",
    "content-length",
    "content-disposition",
    "refresh",
    "access-control-allow-origin",
    "x-xss-protection",
    "host",
    "bcc",
    "cc",
    "http/1.",
    "<script",
    "<html",
];

const SMTP_IMAP: &[&str] = &[
    "RCPT TO:",
    "MAIL FROM:",
    "HELO ",
    "EHLO ",
    "DATA",
    "QUIT",
    "RSET",
    "VRFY ",
    "EXPN ",
];
const IMAP_CMDS: &[&str] = &[
    "CAPABILITY",
    "FETCH",
    "LOGIN",
    "LOGOUT",
    "SELECT",
    "EXAMINE",
    "LIST",
    "STORE",
    "APPEND",
    "AUTHENTICATE",
    "DELETE",
    "RENAME",
    "COPY",
    "UID",
];

/// SMTP / IMAP command injection: a line break followed by a protocol command line.
pub fn mail(s: &str) -> Option<Hit> {
    let mut lines = s.split(['\r', '\n']);
    lines.next()?;
    for (n, line) in lines.enumerate() {
        if n > 64 {
            break;
        }
        let l = line.trim_end();
        if l.is_empty() {
            continue;
        }
        let smtp = SMTP_IMAP.iter().any(|c| {
            if c.ends_with(' ') || c.ends_with(':') {
                l.starts_with(c)
            } else {
                l == *c
            }
        });
        let imap = {
            let mut it = l.splitn(3, ' ');
            let tag = it.next().unwrap_or("");
            let cmd = it.next().unwrap_or("");
            !tag.is_empty()
                && tag.len() <= 8
                && tag.bytes().all(|c| c.is_ascii_alphanumeric())
                && IMAP_CMDS.contains(&cmd)
        };
        if smtp || imap {
            let p = s.find(l).unwrap_or(0);
            return Some(Hit::new(Attack::Crlf, 80, s, p, p + l.len()));
        }
    }
    None
}

/// CRLF / header injection: a line break (or a Unicode character whose low
/// byte is CR/LF) followed by a header line.
pub fn crlf(s: &str) -> Option<Hit> {
    for (i, ch) in s.char_indices() {
        let brk =
            matches!(ch, '\r' | '\n') || matches!(ch as u32, 0x560A | 0x560D | 0x010A | 0x010D);
        if !brk {
            continue;
        }
        let rest = s[i + ch.len_utf8()..]
            .trim_start_matches(['\r', '\n', ' ', '\t', '\u{560A}', '\u{560D}']);
        for h in INJECTED_HEADERS {
            if starts_with_ci(rest.as_bytes(), h.as_bytes()) {
                let after = rest.as_bytes().get(h.len()).copied();
                if h.starts_with('<')
                    || h.starts_with("http/")
                    || matches!(after, Some(b':') | Some(b' '))
                {
                    // cross-check the ':' within a short distance for header names
                    if h.starts_with('<')
                        || h.starts_with("http/")
                        || rest[h.len()..].trim_start().starts_with(':')
                    {
                        return Some(Hit::new(Attack::Crlf, 85, s, i, i + 40));
                    }
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crlf_cases() {
        assert!(crlf("x\r\nSet-Cookie: a=b").is_some());
        assert!(crlf("\u{560D}\u{560A}Set-cookie:crlf=injection").is_some());
        assert!(crlf("line one\nline two: fine").is_none());
    }
}
