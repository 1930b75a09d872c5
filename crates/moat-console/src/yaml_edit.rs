//! Adds a WAF exclusion to a config file's text, keeping everything else as written
//! (comments, order, `${...}` references: re-serializing the parsed config would lose
//! them and write substituted secrets out), and the diff of the change.
//!
//! Handles the block style of the `waf:` section (`waf:` alone on its line, its keys
//! indented below); a flow-style section (`waf: { ... }`) is refused with a message:
//! the user pastes the snippet by hand.

use moat_waf::config::WafExclusion;
use moat_waf::triage::render_item;

/// Largest config file edited (a config is a few KB; this bounds the diff's work).
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

fn is_content(line: &str) -> bool {
    let t = line.trim();
    !t.is_empty() && !t.starts_with('#')
}

/// `text` with `e` appended to `waf.exclusions` (created when missing, and `waf:` too).
pub fn insert_exclusion(text: &str, e: &WafExclusion) -> Result<String, String> {
    if text.len() > MAX_CONFIG_BYTES {
        return Err(format!(
            "the config file is larger than {MAX_CONFIG_BYTES} bytes"
        ));
    }
    if text.contains('\t') || text.contains('\r') {
        return Err("the config file has tabs or CR line ends: add the snippet by hand".into());
    }
    let lines: Vec<&str> = text.lines().collect();
    let waf = lines
        .iter()
        .position(|l| l.starts_with("waf:") && indent_of(l) == 0);
    let Some(waf) = waf else {
        // No section: WAF events come from a `waf:` section, but a config may have
        // been changed since; add one.
        let mut out = text.to_string();
        if !out.ends_with('\n') && !out.is_empty() {
            out.push('\n');
        }
        out.push_str("waf:\n  exclusions:\n");
        out.push_str(&render_item(e, 4));
        return Ok(out);
    };
    let rest = lines[waf]["waf:".len()..].trim();
    if !rest.is_empty() && !rest.starts_with('#') {
        return Err(
            "the `waf:` section is written in flow style (`waf: { ... }`): add the snippet by hand"
                .into(),
        );
    }
    // The section: the lines after `waf:` up to the next top-level key.
    let end = (waf + 1..lines.len())
        .find(|&i| is_content(lines[i]) && indent_of(lines[i]) == 0)
        .unwrap_or(lines.len());
    let child = (waf + 1..end)
        .find(|&i| is_content(lines[i]))
        .map(|i| indent_of(lines[i]))
        .unwrap_or(2);
    let key = (waf + 1..end).find(|&i| {
        indent_of(lines[i]) == child && lines[i].trim_start().starts_with("exclusions:")
    });
    let (at, item) = match key {
        None => {
            // Insert after the section's last content line.
            let last = (waf..end)
                .rev()
                .find(|&i| is_content(lines[i]))
                .unwrap_or(waf);
            let block = format!(
                "{}exclusions:\n{}",
                " ".repeat(child),
                render_item(e, child + 2)
            );
            (last + 1, block)
        }
        Some(k) => {
            let value = lines[k].trim_start()["exclusions:".len()..].trim();
            if !value.is_empty() && !value.starts_with('#') {
                return Err(
                    "`waf.exclusions` is written in flow style (`[...]`): add the snippet by hand"
                        .into(),
                );
            }
            // The list: deeper lines, or `- ` items at the key's own indent.
            let mut last = k;
            let mut dash = None;
            for (i, line) in lines.iter().enumerate().take(end).skip(k + 1) {
                if !is_content(line) {
                    continue;
                }
                let ind = indent_of(line);
                let item = line.trim_start().starts_with('-');
                if ind > child || (ind == child && item) {
                    if item && dash.is_none() {
                        dash = Some(ind);
                    }
                    last = i;
                } else {
                    break;
                }
            }
            (last + 1, render_item(e, dash.unwrap_or(child + 2)))
        }
    };
    let mut out = String::with_capacity(text.len() + item.len());
    for l in &lines[..at] {
        out.push_str(l);
        out.push('\n');
    }
    out.push_str(&item);
    for l in &lines[at..] {
        out.push_str(l);
        out.push('\n');
    }
    Ok(out)
}

/// The unified diff from `old` to `new`, labelled with the file name.
pub fn diff(old: &str, new: &str, name: &str) -> String {
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(name, name)
        .to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ex() -> WafExclusion {
        WafExclusion {
            route: Some("api".into()),
            path_prefix: Some("/search".into()),
            location: Some("query:q".into()),
            field: Some("q".into()),
            detector: Some("sqli".into()),
            rule: None,
        }
    }

    #[test]
    fn appends_to_an_existing_list() {
        let t = "a: 1\nwaf:\n  enabled: true\n  exclusions:\n    - detector: xss # keep\n      route: x\nlimits: {}\n";
        let out = insert_exclusion(t, &ex()).unwrap();
        assert_eq!(
            out,
            "a: 1\nwaf:\n  enabled: true\n  exclusions:\n    - detector: xss # keep\n      route: x\n    - route: \"api\"\n      path_prefix: \"/search\"\n      location: \"query:q\"\n      field: \"q\"\n      detector: \"sqli\"\nlimits: {}\n"
        );
    }

    #[test]
    fn list_items_at_the_key_indent() {
        let t = "waf:\n  exclusions:\n  - detector: xss\n  mode: block\n";
        let out = insert_exclusion(t, &ex()).unwrap();
        assert!(out.starts_with("waf:\n  exclusions:\n  - detector: xss\n  - route: \"api\"\n"));
        assert!(out.ends_with("  mode: block\n"));
    }

    #[test]
    fn creates_the_key_and_the_section() {
        let t = "waf:\n  enabled: true\n\n# next\nevents: {}\n";
        let out = insert_exclusion(t, &ex()).unwrap();
        assert!(out.starts_with("waf:\n  enabled: true\n  exclusions:\n    - route: \"api\"\n"));
        assert!(out.ends_with("\n# next\nevents: {}\n"));
        let out = insert_exclusion("a: 1", &ex()).unwrap();
        assert!(out.starts_with("a: 1\nwaf:\n  exclusions:\n    - route"));
    }

    #[test]
    fn refuses_what_it_cannot_edit_safely() {
        assert!(insert_exclusion("waf: { enabled: true }\n", &ex()).is_err());
        assert!(insert_exclusion("waf:\n  exclusions: []\n", &ex()).is_err());
        assert!(insert_exclusion("waf:\n\tenabled: true\n", &ex()).is_err());
        let huge = "#".repeat(MAX_CONFIG_BYTES + 1);
        assert!(insert_exclusion(&huge, &ex()).is_err());
    }

    #[test]
    fn hostile_values_stay_quoted() {
        let mut e = ex();
        e.path_prefix = Some("/x\"\n  injected: true".into());
        let out = insert_exclusion("waf:\n  enabled: true\n", &e).unwrap();
        assert!(out.contains("path_prefix: \"/x\\\"\\n  injected: true\"\n"));
    }

    #[test]
    fn diff_shows_the_added_lines() {
        let d = diff("a\nb\n", "a\nb\nc\n", "moat.yaml");
        assert!(d.contains("+c"));
        assert!(d.contains("moat.yaml"));
    }
}
