//! The page chrome: head, navigation, the logout form.

use maud::{html, Markup, DOCTYPE};

/// The pages of the navigation bar: path, label.
const NAV: [(&str, &str); 6] = [
    ("/console", "Overview"),
    ("/console/events", "Events"),
    ("/console/apis", "API inventory"),
    ("/console/policy", "Access control"),
    ("/console/tls", "TLS"),
    ("/console/config", "Config"),
];

/// A full page: `active` is the path of its navigation entry.
pub fn page(title: &str, active: &str, csrf: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · moat console" }
                link rel="stylesheet" href="/console/assets/console.css";
                script src="/console/assets/console.js" defer {}
            }
            body {
                header {
                    span.brand { "moat" }
                    nav {
                        @for (path, label) in NAV {
                            a href=(path) class=[(path == active).then_some("active")] { (label) }
                        }
                    }
                    form.logout method="post" action="/console/logout" {
                        input type="hidden" name="csrf" value=(csrf);
                        button type="submit" { "Log out" }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

/// The login page (no navigation).
pub fn login(error: Option<&str>, needs_token: bool) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "Log in · moat console" }
                link rel="stylesheet" href="/console/assets/console.css";
            }
            body.login {
                main {
                    h1 { "moat console" }
                    @if let Some(e) = error { p.error { (e) } }
                    form method="post" action="/console/login" {
                        @if needs_token {
                            label { "Admin token" input type="password" name="token" autocomplete="current-password" autofocus; }
                        } @else {
                            p.note { "No admin token is configured (admin.token): anyone who reaches this address may log in." }
                        }
                        button type="submit" id="login" { "Log in" }
                    }
                }
            }
        }
    }
}

/// A message box (errors and notices on a page).
pub fn notice(class: &str, text: &str) -> Markup {
    html! { p class=(class) { (text) } }
}

/// Formats unix milliseconds as `YYYY-MM-DD HH:MM:SS` UTC.
pub fn time(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(time(0), "1970-01-01 00:00:00");
        assert_eq!(time(1_767_225_600_000), "2026-01-01 00:00:00");
        assert_eq!(time(951_782_400_000 + 3_661_000), "2000-02-29 01:01:01");
    }

    #[test]
    fn pages_escape_what_they_render() {
        let p = page("<script>x</script>", "/console", "\"><b>", html! {}).into_string();
        assert!(!p.contains("<script>x"));
        assert!(p.contains("&lt;script&gt;x"));
        assert!(!p.contains("\"><b>"));
    }
}
