//! A real rsyslogd (Debian's, in the foreground with its own configuration in a
//! temporary directory) receiving syslog over UDP, TCP and, when given a certificate,
//! TLS, and writing every message as an `APP-NAME|MSGID|PRI|MSG` line into `out.log`.
//! Used by the sink tests of moat-sinks and by the gateway tests of moat.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, real_part, wait_for_port, ChildGuard};

const HINT: &str = "scripts/ensure-apt rsyslog rsyslog-gnutls";

/// The certificate files of the TLS input (PEM).
#[derive(Debug, Clone, Copy)]
pub struct TlsFiles<'a> {
    /// The CA that signed `cert`.
    pub ca: &'a Path,
    /// The server certificate.
    pub cert: &'a Path,
    /// Its private key.
    pub key: &'a Path,
}

/// The ports rsyslogd listens on (127.0.0.1); `tls` is 0 without a TLS input.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    /// UDP (RFC 5426).
    pub udp: u16,
    /// TCP (RFC 6587).
    pub tcp: u16,
    /// TLS (RFC 5425).
    pub tls: u16,
}

/// A running rsyslogd, killed when dropped.
pub struct Rsyslog {
    _child: ChildGuard,
    /// Its ports.
    pub ports: Ports,
    /// The file it writes the received messages to, one line each.
    pub out: PathBuf,
}

impl Rsyslog {
    /// Writes `dir/rsyslog.conf` and starts rsyslogd on free ports; `None` (after a
    /// notice) when rsyslogd is not installed and the run does not require it.
    pub fn start(dir: &Path, tls: Option<TlsFiles<'_>>) -> Option<Rsyslog> {
        let bin = real_part("rsyslogd", HINT)?;
        let port = || free_port().unwrap_or_else(|e| panic!("no free port: {e}"));
        let ports = Ports {
            udp: port(),
            tcp: port(),
            tls: if tls.is_some() { port() } else { 0 },
        };
        let out = dir.join("out.log");
        let (global, tls_input) = match tls {
            Some(t) => (
                format!(
                    r#" defaultNetstreamDriverCAFile="{}" defaultNetstreamDriverCertFile="{}" defaultNetstreamDriverKeyFile="{}""#,
                    t.ca.display(),
                    t.cert.display(),
                    t.key.display()
                ),
                format!(
                    r#"input(type="imtcp" address="127.0.0.1" port="{}" streamDriver.name="gtls" streamDriver.mode="1" streamDriver.authMode="anon")"#,
                    ports.tls
                ),
            ),
            None => (String::new(), String::new()),
        };
        let conf = format!(
            r#"global(workDirectory="{d}"{global})
module(load="imudp")
module(load="imtcp" maxSessions="16")
input(type="imudp" address="127.0.0.1" port="{udp}")
input(type="imtcp" address="127.0.0.1" port="{tcp}")
{tls_input}
template(name="t" type="string" string="%app-name%|%msgid%|%pri%|%msg%\n")
action(type="omfile" file="{out}" template="t" flushOnTXEnd="on" asyncWriting="off")
"#,
            d = dir.display(),
            udp = ports.udp,
            tcp = ports.tcp,
            out = out.display(),
        );
        std::fs::write(dir.join("rsyslog.conf"), conf)
            .unwrap_or_else(|e| panic!("cannot write rsyslog.conf: {e}"));
        Some(Self::spawn(&bin, dir, ports, out))
    }

    /// Starts rsyslogd again with the configuration [`Rsyslog::start`] wrote in `dir`
    /// (same ports, same output file): a receiver that restarted.
    pub fn restart(dir: &Path, ports: Ports, out: PathBuf) -> Option<Rsyslog> {
        let bin = real_part("rsyslogd", HINT)?;
        Some(Self::spawn(&bin, dir, ports, out))
    }

    fn spawn(bin: &Path, dir: &Path, ports: Ports, out: PathBuf) -> Rsyslog {
        let child = Command::new(bin)
            .arg("-n")
            .arg("-f")
            .arg(dir.join("rsyslog.conf"))
            .arg("-i")
            .arg(dir.join("rsyslog.pid"))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let child = ChildGuard(child);
        for port in [ports.tcp, ports.tls] {
            assert!(
                port == 0 || wait_for_port(port, Duration::from_secs(10)),
                "rsyslogd did not listen on port {port}"
            );
        }
        Rsyslog {
            _child: child,
            ports,
            out,
        }
    }

    /// The lines received so far.
    pub fn received(&self) -> Vec<String> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Waits up to `timeout` until `done` holds for the lines received; returns them.
    /// Panics with what was received when it never does.
    pub fn wait_until(
        &self,
        timeout: Duration,
        mut done: impl FnMut(&[String]) -> bool,
    ) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let lines = self.received();
            if done(&lines) {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "rsyslog did not receive what was expected within {timeout:?}: {lines:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
