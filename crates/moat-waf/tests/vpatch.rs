//! Virtual patches: every rule of the starter pack blocks its malicious
//! examples and lets its benign ones through (replayed through the whole
//! engine, head and body phases as the proxy calls them); rule files load
//! through moat-config with positioned errors; exclusions by rule id.

use std::path::Path;

use moat_waf::vpatch::{self, PatchSet};
use moat_waf::{Attack, BodyView, RequestView, VirtualPatches, WafConfig, WafEngine, WafExclusion};

struct Req {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn from_example(e: &vpatch::Example) -> Req {
    Req {
        method: e.method.clone(),
        target: e.target.clone(),
        headers: e
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        body: e.body.as_bytes().to_vec(),
    }
}

/// Rule ids of virtual-patch findings: whole request, and head phase + body phase.
fn rules_hit(engine: &WafEngine, r: &Req) -> (Vec<String>, Vec<String>) {
    let headers: Vec<(&str, &[u8])> = r
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_bytes()))
        .collect();
    let view = RequestView {
        method: &r.method,
        target: r.target.as_bytes(),
        headers: headers.into(),
    };
    let body = BodyView {
        data: &r.body,
        truncated: false,
    };
    let ids = |f: &moat_waf::Findings| -> Vec<String> {
        f.findings
            .iter()
            .filter(|x| x.attack == Attack::VirtualPatch)
            .filter_map(|x| x.rule.clone())
            .collect()
    };
    let whole = ids(&engine.inspect("r", &view, Some(body)));
    let mut phased = ids(&engine.inspect_headers("r", &view));
    if !r.body.is_empty() {
        phased.extend(ids(&engine.inspect_body_only("r", &view, body)));
    }
    (whole, phased)
}

fn engine(cfg: &WafConfig) -> std::sync::Arc<WafEngine> {
    match WafEngine::build(cfg) {
        Ok(e) => e,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn starter_pack_examples() {
    let file = Path::new(vpatch::BUILTIN_NAME);
    let specs = match vpatch::parse(file, vpatch::BUILTIN) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    assert!(specs.len() >= 15, "starter pack has {} rules", specs.len());
    let e = engine(&WafConfig::default());
    assert_eq!(e.patches().len(), specs.len());
    for spec in &specs {
        let id = &spec.id.value;
        assert!(
            !spec.examples.block.is_empty() && !spec.examples.pass.is_empty(),
            "{id}: needs a block and a pass example"
        );
        for ex in &spec.examples.block {
            let (whole, phased) = rules_hit(&e, &from_example(ex));
            assert!(
                whole.contains(id),
                "{id} did not block {}: {whole:?}",
                ex.target
            );
            assert!(
                phased.contains(id),
                "{id} (phases) did not block {}: {phased:?}",
                ex.target
            );
        }
        for ex in &spec.examples.pass {
            let (whole, phased) = rules_hit(&e, &from_example(ex));
            assert!(
                whole.is_empty(),
                "{id}: pass example {} hit {whole:?}",
                ex.target
            );
            assert!(
                phased.is_empty(),
                "{id}: pass example {} hit {phased:?}",
                ex.target
            );
            // and the whole engine lets it through
            let r = from_example(ex);
            let headers: Vec<(&str, &[u8])> = r
                .headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_bytes()))
                .collect();
            let view = RequestView {
                method: &r.method,
                target: r.target.as_bytes(),
                headers: headers.into(),
            };
            let f = e.inspect(
                "r",
                &view,
                Some(BodyView {
                    data: &r.body,
                    truncated: false,
                }),
            );
            assert!(
                !e.would_block(&f),
                "{id}: pass example {} blocked: {f:?}",
                ex.target
            );
        }
    }
}

#[test]
fn rule_files_load_with_positions_and_can_be_disabled() {
    let dir = std::env::temp_dir().join(format!("moat-vpatch-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let good = "rules:\n  - id: ACME-1\n    cve: [CVE-2099-0001]\n    methods: [POST]\n    path: /acme/{tenant}/import\n    when:\n      - { in: param, name: format, equals: [pickle] }\n";
    let _ = std::fs::write(dir.join("acme.yaml"), good);
    let cfg = WafConfig {
        virtual_patches: VirtualPatches {
            builtin: false,
            files: vec!["acme.yaml".into()],
            disabled: vec![],
        },
        ..Default::default()
    };
    let e = match WafEngine::build_with_base(&cfg, &dir) {
        Ok(e) => e,
        Err(err) => panic!("{err}"),
    };
    assert_eq!(e.patches().len(), 1);
    let hit = Req {
        method: "POST".into(),
        target: "/acme/t1/import?format=pickle".into(),
        headers: vec![],
        body: vec![],
    };
    assert_eq!(rules_hit(&e, &hit).0, vec!["ACME-1".to_string()]);
    let get = Req {
        method: "GET".into(),
        ..hit
    };
    assert!(rules_hit(&e, &get).0.is_empty());

    let bad = "rules:\n  - id: ACME-2\n    path: /a\n    methods: [\"PO ST\"]\n";
    let _ = std::fs::write(dir.join("bad.yaml"), bad);
    let cfg = WafConfig {
        virtual_patches: VirtualPatches {
            builtin: false,
            files: vec!["bad.yaml".into()],
            disabled: vec![],
        },
        ..Default::default()
    };
    let err = WafEngine::build_with_base(&cfg, &dir)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("bad.yaml:4:") && err.contains("rules[0].methods[0]"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);

    // disabling a built-in rule
    let cfg = WafConfig {
        virtual_patches: VirtualPatches {
            disabled: vec!["CVE-2021-21972".into()],
            ..Default::default()
        },
        ..Default::default()
    };
    let e = engine(&cfg);
    let r = Req {
        method: "POST".into(),
        target: "/ui/vropspluginui/rest/services/uploadova".into(),
        headers: vec![],
        body: vec![],
    };
    assert!(rules_hit(&e, &r).0.is_empty());
    assert!(PatchSet::builtin().is_ok_and(|p| p.len() == e.patches().len() + 1));
}

#[test]
fn exclusion_by_rule_id() {
    let cfg = WafConfig {
        exclusions: vec![WafExclusion {
            detector: Some("virtual-patch".into()),
            rule: Some("CVE-2021-21972".into()),
            ..Default::default()
        }],
        ..Default::default()
    };
    let e = engine(&cfg);
    let r = Req {
        method: "POST".into(),
        target: "/ui/vropspluginui/rest/services/uploadova".into(),
        headers: vec![],
        body: vec![],
    };
    assert!(rules_hit(&e, &r).0.is_empty());
    let r = Req {
        method: "POST".into(),
        target: "/vendor/phpunit/phpunit/src/Util/PHP/eval-stdin.php".into(),
        headers: vec![],
        body: vec![],
    };
    assert_eq!(rules_hit(&e, &r).0, vec!["CVE-2017-9841".to_string()]);
}
