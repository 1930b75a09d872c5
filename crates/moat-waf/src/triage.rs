//! False-positive triage: what a block decision carries so an operator can
//! write an exclusion for it, and the exclusion snippet rendered from it.
//!
//! Every WAF event's details hold `detector`, `rule` (virtual patches),
//! `location`, `field` and `fragment`; [`ExclusionRequest`] gathers them with
//! the route and path of the request, [`exclusion_for`] turns them into a
//! [`WafExclusion`] as narrow as the decision allows, and [`render_snippet`]
//! prints it as YAML to paste under `waf.exclusions`.

use crate::config::WafExclusion;
use crate::extract::Finding;

/// The field name of a location: `comment` for `form:comment`, `/a/b` for
/// `json:/a/b`, `user-agent` for `header:user-agent`; `None` for `path` and `body`.
pub fn field_of(location: &str) -> Option<&str> {
    let (_, name) = location.split_once(':')?;
    // `header:referer:ARG` -> the argument name
    let name = match location.strip_prefix("header:") {
        Some(rest) => rest.split_once(':').map(|(_, a)| a).unwrap_or(rest),
        None => name,
    };
    Some(name)
}

/// Event details of a finding: everything an exclusion needs.
pub fn event_details(f: &Finding) -> serde_json::Value {
    let mut v = serde_json::json!({
        "detector": f.attack.name(),
        "location": f.location,
        "fragment": f.fragment,
        "confidence": f.confidence,
    });
    if let Some(obj) = v.as_object_mut() {
        if let Some(field) = field_of(&f.location) {
            obj.insert("field".into(), field.into());
        }
        if let Some(rule) = &f.rule {
            obj.insert("rule".into(), rule.clone().into());
        }
    }
    v
}

/// What is known about a blocked request when writing an exclusion.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExclusionRequest {
    /// Route the request matched.
    pub route: Option<String>,
    /// Request path (query excluded).
    pub path: Option<String>,
    /// Detector name (`xss`, `virtual-patch`, ...).
    pub detector: String,
    /// Virtual-patch rule id.
    pub rule: Option<String>,
    /// Finding location (`form:comment`).
    pub location: Option<String>,
}

/// How wide the exclusion is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    /// Route, exact path, location and detector (the default: narrowest).
    #[default]
    Narrow,
    /// Route, location and detector on every path of the route.
    Route,
}

/// The exclusion that lets this decision's request through, and nothing wider.
pub fn exclusion_for(req: &ExclusionRequest, scope: Scope) -> WafExclusion {
    let location = req.location.clone().filter(|l| !l.is_empty());
    // `location` matches as a prefix (`form:body` would also match `form:body2`);
    // the exact field name pins it to this one field
    let field = location.as_deref().and_then(field_of).map(str::to_string);
    WafExclusion {
        route: req.route.clone().filter(|r| !r.is_empty()),
        path_prefix: match scope {
            Scope::Narrow => req.path.clone().filter(|p| !p.is_empty() && p != "/"),
            Scope::Route => None,
        },
        location,
        field,
        detector: Some(req.detector.clone()),
        rule: req.rule.clone(),
    }
}

fn yaml_str(s: &str) -> String {
    // JSON strings are valid YAML flow scalars and escape everything needed
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Renders an exclusion as a YAML list item for `waf.exclusions`, with a
/// comment naming the decision it comes from.
pub fn render_snippet(e: &WafExclusion, comment: Option<&str>) -> String {
    let mut out = String::new();
    if let Some(c) = comment {
        for line in c.lines() {
            out.push_str("# ");
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str("waf:\n  exclusions:\n");
    out.push_str(&render_item(e, 4));
    out
}

/// Renders an exclusion as one block-style YAML list item (`- key: "value"` lines),
/// its dash `indent` spaces in: what goes under `exclusions:` in a config file.
pub fn render_item(e: &WafExclusion, indent: usize) -> String {
    let mut out = String::new();
    let mut first = true;
    let mut key = |k: &str, v: &Option<String>| {
        if let Some(v) = v {
            out.extend(std::iter::repeat_n(' ', indent));
            out.push_str(if first { "- " } else { "  " });
            first = false;
            out.push_str(k);
            out.push_str(": ");
            out.push_str(&yaml_str(v));
            out.push('\n');
        }
    };
    key("route", &e.route);
    key("path_prefix", &e.path_prefix);
    key("location", &e.location);
    key("field", &e.field);
    key("detector", &e.detector);
    key("rule", &e.rule);
    if first {
        out.extend(std::iter::repeat_n(' ', indent));
        out.push_str("- {}\n");
    }
    out
}

/// Reads the exclusion facts from a stored event record (the JSON `moat events
/// --json` prints: route, path and the event with its details).
pub fn request_from_record(rec: &serde_json::Value) -> Option<ExclusionRequest> {
    let ev = rec.get("event").unwrap_or(rec);
    let details = ev.get("details");
    let s = |v: Option<&serde_json::Value>| v.and_then(|x| x.as_str()).map(str::to_string);
    let detector = s(details.and_then(|d| d.get("detector"))).or_else(|| s(ev.get("rule")))?;
    Some(ExclusionRequest {
        route: s(rec.get("route")),
        path: s(rec.get("path")).map(|p| p.split('?').next().unwrap_or("").to_string()),
        detector,
        rule: s(details.and_then(|d| d.get("rule"))),
        location: s(ev.get("location")).or_else(|| s(details.and_then(|d| d.get("location")))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields() {
        assert_eq!(field_of("form:comment"), Some("comment"));
        assert_eq!(field_of("json:/a/b"), Some("/a/b"));
        assert_eq!(field_of("header:referer:q"), Some("q"));
        assert_eq!(field_of("header:user-agent"), Some("user-agent"));
        assert_eq!(field_of("path"), None);
        assert_eq!(field_of("path:2"), Some("2"));
    }

    #[test]
    fn snippet_is_yaml() {
        let e = exclusion_for(
            &ExclusionRequest {
                route: Some("cms".into()),
                path: Some("/admin/save".into()),
                detector: "xss".into(),
                rule: None,
                location: Some("form:body\"x".into()),
            },
            Scope::Narrow,
        );
        let y = render_snippet(&e, Some("event 1"));
        assert_eq!(
            y,
            "# event 1\nwaf:\n  exclusions:\n    - route: \"cms\"\n      path_prefix: \"/admin/save\"\n      location: \"form:body\\\"x\"\n      field: \"body\\\"x\"\n      detector: \"xss\"\n"
        );
    }
}
