//! Scanner and exploit-tool User-Agents.

use std::sync::LazyLock;

use aho_corasick::AhoCorasick;

use super::matcher::{first_match, matcher};
use super::{Attack, Hit};

static SCANNER_AC: LazyLock<Option<AhoCorasick>> =
    LazyLock::new(|| matcher(SCANNERS.iter().copied()));

const SCANNERS: &[&str] = &[
    "sqlmap",
    "nikto",
    "nmap",
    "masscan",
    "nuclei",
    "acunetix",
    "wpscan",
    "dirbuster",
    "gobuster",
    "ffuf",
    "zgrab",
    "w3af",
    "netsparker",
    "appscan",
    "openvas",
    "havij",
    "hydra",
    "jorgee",
    "fimap",
    "zmeu",
    "nessus",
    "arachni",
    "whatweb",
    "feroxbuster",
    "commix",
    "xsstrike",
    "dirsearch",
    "wfuzz",
    "burpcollaborator",
    "skipfish",
    "vega/",
    "paros",
    "webinspect",
    "qualys",
    "struts-pwn",
    "log4j-scan",
    "interactsh",
    "morfeus",
    "fuzz faster",
    "go-http-client/1.1 nuclei",
];

/// Scanner and exploit-tool User-Agents (monitor-level confidence).
pub fn scanner(ua: &str) -> Option<Hit> {
    first_match(&SCANNER_AC, SCANNERS, ua.as_bytes())
        .map(|(_, p, e)| Hit::new(Attack::Scanner, 40, ua, p, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scanner_cases() {
        assert!(scanner("sqlmap/1.5").is_some());
        assert!(scanner("Mozilla/5.0").is_none());
    }
}
