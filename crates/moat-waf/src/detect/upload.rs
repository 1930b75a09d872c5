//! Dangerous uploads: script file names and contents, script-then-image extensions.

use super::{Attack, Hit};
use crate::util::find_ci;

const SCRIPT_EXT: &[&str] = &[
    "php", "php3", "php4", "php5", "php7", "php8", "phtml", "pht", "phar", "phps", "jsp", "jspx",
    "jspf", "asp", "aspx", "ashx", "asmx", "asa", "cer", "cfm", "cgi", "pl", "sh", "war", "shtml",
    "htaccess", "exe", "bat", "cmd", "ps1", "vbs", "hta", "py",
];

/// Upload of a server-side script: by file name (`shell.php`, `a.php.jpg`,
/// `.htaccess`, NUL tricks) or by content (`<?php`, `<%@`).
pub fn upload(filename: &str, content: Option<&[u8]>) -> Option<Hit> {
    let f = filename.trim().trim_matches('"').to_ascii_lowercase();
    let base = f.rsplit(['/', '\\']).next().unwrap_or(&f);
    let base = base.split('\0').next().unwrap_or(base);
    let parts: Vec<&str> = base.split('.').collect();
    if base == ".htaccess" || base == ".user.ini" || base == "web.config" {
        return Some(Hit::new(Attack::Upload, 85, filename, 0, filename.len()));
    }
    if parts.len() >= 2 {
        for (i, ext) in parts.iter().enumerate().skip(1) {
            let e = ext.trim_end_matches([' ', ':', ';', '$']);
            let e = e.split(';').next().unwrap_or(e);
            if SCRIPT_EXT.contains(&e)
                && !(matches!(
                    e,
                    "py" | "sh" | "exe" | "bat" | "cmd" | "ps1" | "pl" | "cgi"
                ) && i + 1 < parts.len())
            {
                return Some(Hit::new(Attack::Upload, 85, filename, 0, filename.len()));
            }
        }
    }
    if let Some(c) = content {
        let head = &c[..c.len().min(64 << 10)];
        for m in [
            &b"<?php"[..],
            b"<?=",
            b"<%@",
            b"<jsp:",
            b"<% ",
            b"<%\n",
            b"<%\r",
            b"eval(base64_decode",
            b"<?\n",
        ] {
            if let Some(p) = find_ci(head, m) {
                let text = String::from_utf8_lossy(&head[p..head.len().min(p + 40)]).into_owned();
                return Some(Hit {
                    attack: Attack::Upload,
                    confidence: 85,
                    fragment: text,
                });
            }
        }
    }
    None
}

/// A script extension followed by another extension in the last path segment
/// (`/uploads/shell.php.jpg`: Apache multi-extension handler abuse).
pub fn double_extension(segment: &str) -> Option<Hit> {
    const SCRIPT: [&str; 10] = [
        "php", "php3", "php4", "php5", "phtml", "jsp", "asp", "aspx", "cgi", "pl",
    ];
    // the inner extensions: every dot-separated part but the stem and the last
    let mut parts = segment.split('.');
    parts.next()?;
    let mut inner: Option<&str> = None;
    for part in parts {
        if let Some(ext) = inner {
            if SCRIPT.iter().any(|s| s.eq_ignore_ascii_case(ext)) {
                return Some(Hit::new(Attack::Upload, 70, segment, 0, segment.len()));
            }
        }
        inner = Some(part);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_cases() {
        assert!(upload("shell.php", None).is_some());
        assert!(upload("a.php.jpg", None).is_some());
        assert!(upload("photo.jpg", Some(b"\xff\xd8")).is_none());
        assert!(double_extension("apache.php.jpeg").is_some());
        assert!(double_extension("a.b.PHP5.c.jpg").is_some());
        for benign in [
            "apache.jpeg",
            "php.jpeg",
            "a.jpeg.php",
            "",
            ".",
            "..",
            "a..php",
        ] {
            assert!(double_extension(benign).is_none(), "{benign}");
        }
        assert!(double_extension("a.php..").is_some());
    }
}
