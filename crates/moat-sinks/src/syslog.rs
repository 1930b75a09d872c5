//! Syslog: RFC 5424 messages over UDP (RFC 5426), TCP with octet counting
//! (RFC 6587 3.4.1) or TLS (RFC 5425).
//!
//! A message is `<PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID - MSG`: PRI
//! from the configured facility and the record's severity (block: warning,
//! monitor/redact/bypass: notice, otherwise info), MSGID the record kind
//! (`access`, `security`, `tls`, `tcp`), no structured data, and the record's
//! JSON (in the sink's `format`) as MSG.
//!
//! Stream transports send a whole batch with one write. Syslog has no
//! acknowledgements, so a receiver that dies after the kernel accepted the bytes
//! loses them unnoticed; the sink checks the connection for a close before each
//! batch and reconnects, which catches a receiver that was restarted in between.

use std::io::Write as _;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UdpSocket;

use crate::config::{SyslogConfig, SyslogTransport};
use crate::net::{Conn, Endpoint};
use crate::outbox::{Message, SendError, Transport};

/// Appends one RFC 5424 message (without framing) to `out`, its MSG cut to keep
/// the whole message within `max` bytes.
pub fn write_message(
    out: &mut Vec<u8>,
    facility: u8,
    hostname: &str,
    app_name: &str,
    procid: u32,
    msg: &Message,
    max: usize,
) {
    let start = out.len();
    let pri = u32::from(facility) * 8 + msg.severity as u32;
    let ts = moat_events::text::format_ts(msg.ts_ms);
    // Writing to a Vec cannot fail.
    let _ = write!(
        out,
        "<{pri}>1 {ts} {hostname} {app_name} {procid} {} - ",
        msg.kind.name()
    );
    let room = max.saturating_sub(out.len() - start);
    out.extend_from_slice(&msg.body[..msg.body.len().min(room)]);
}

/// The machine's host name (RFC 5424 HOSTNAME), `-` when unknown.
pub fn local_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty() && h.bytes().all(|c| (33..=126).contains(&c)))
        .unwrap_or_else(|| "-".into())
}

pub(crate) struct SyslogSink {
    transport: SyslogTransport,
    endpoint: Endpoint,
    facility: u8,
    hostname: String,
    app_name: String,
    procid: u32,
    max: usize,
    udp: Option<UdpSocket>,
    conn: Option<Conn>,
    buf: Vec<u8>,
    frame: Vec<u8>,
}

impl SyslogSink {
    pub(crate) fn new(cfg: &SyslogConfig, endpoint: Endpoint, facility: u8) -> Self {
        SyslogSink {
            transport: cfg.transport,
            endpoint,
            facility,
            hostname: cfg.hostname.clone().unwrap_or_else(local_hostname),
            app_name: cfg.app_name.clone(),
            procid: std::process::id(),
            max: usize::try_from(cfg.max_message_bytes).unwrap_or(usize::MAX),
            udp: None,
            conn: None,
            buf: Vec::new(),
            frame: Vec::new(),
        }
    }

    fn message(&mut self, m: &Message) {
        self.frame.clear();
        write_message(
            &mut self.frame,
            self.facility,
            &self.hostname,
            &self.app_name,
            self.procid,
            m,
            self.max,
        );
    }

    async fn send_udp(&mut self, batch: &mut Vec<Message>) -> Result<(), SendError> {
        let retry = |e: std::io::Error| SendError::Retry(e.to_string());
        if self.udp.is_none() {
            let bind = if self.endpoint.address.starts_with('[') {
                "[::]:0"
            } else {
                "0.0.0.0:0"
            };
            let s = UdpSocket::bind(bind).await.map_err(retry)?;
            s.connect(&self.endpoint.address).await.map_err(retry)?;
            self.udp = Some(s);
        }
        let mut sent = 0;
        let mut result = Ok(());
        for m in batch.iter() {
            self.message(m);
            let Some(sock) = &self.udp else { break };
            if let Err(e) = sock.send(&self.frame).await {
                // An ICMP "port unreachable" from an earlier datagram surfaces here.
                self.udp = None;
                result = Err(retry(e));
                break;
            }
            sent += 1;
        }
        batch.drain(..sent);
        result
    }

    async fn send_stream(&mut self, batch: &mut Vec<Message>) -> Result<(), SendError> {
        let retry = |e: std::io::Error| SendError::Retry(e.to_string());
        if let Some(c) = &mut self.conn {
            // A closed connection reads EOF at once; an open one has nothing to read.
            let mut probe = [0u8; 64];
            match tokio::time::timeout(Duration::ZERO, c.read(&mut probe)).await {
                Err(_) => {}
                Ok(_) => self.conn = None,
            }
        }
        if self.conn.is_none() {
            self.conn = Some(self.endpoint.connect().await.map_err(retry)?);
        }
        self.buf.clear();
        for m in batch.iter() {
            self.message(m);
            let _ = write!(self.buf, "{} ", self.frame.len());
            self.buf.extend_from_slice(&self.frame);
        }
        let Some(c) = &mut self.conn else {
            return Err(SendError::Retry("not connected".into()));
        };
        let res = async {
            c.write_all(&self.buf).await?;
            c.flush().await
        }
        .await;
        if let Err(e) = res {
            self.conn = None;
            return Err(retry(e));
        }
        batch.clear();
        Ok(())
    }
}

impl Transport for SyslogSink {
    async fn send(&mut self, batch: &mut Vec<Message>) -> Result<(), SendError> {
        match self.transport {
            SyslogTransport::Udp => self.send_udp(batch).await,
            SyslogTransport::Tcp | SyslogTransport::Tls => self.send_stream(batch).await,
        }
    }

    async fn close(&mut self) {
        if let Some(mut c) = self.conn.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), c.shutdown()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RecordKind;
    use crate::outbox::Severity;

    #[test]
    fn rfc5424_header_and_truncation() {
        let m = Message {
            kind: RecordKind::Security,
            ts_ms: 1_700_000_000_123,
            severity: Severity::Warning,
            key: None,
            body: b"{\"a\":1}".to_vec(),
        };
        let mut out = Vec::new();
        write_message(&mut out, 16, "gw1", "moat", 42, &m, 1000);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "<132>1 2023-11-14T22:13:20.123Z gw1 moat 42 security - {\"a\":1}"
        );
        let mut out = Vec::new();
        write_message(&mut out, 16, "gw1", "moat", 42, &m, 60);
        assert_eq!(out.len(), 60);
    }
}
