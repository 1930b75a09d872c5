//! The `telemetry:` section of moat.yaml: the distributed event sinks.
//!
//! ```yaml
//! telemetry:
//!   sinks:
//!     - name: siem
//!       format: ecs
//!       records: [security, tls]
//!       kafka: { brokers: ["kafka-1:9092"], key: client_ip, compression: snappy }
//!     - name: syslog
//!       syslog: { transport: tcp, address: "127.0.0.1:6514" }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use moat_config::ConfigError;
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

/// Largest `buffer.max_records`.
pub const MAX_BUFFER_RECORDS: usize = 1 << 20;
/// Largest `buffer.max_bytes`.
pub const MAX_BUFFER_BYTES: u64 = 1 << 30;
/// Largest `buffer.batch_max`.
pub const MAX_BATCH: usize = 65536;
/// Most sinks in one configuration.
pub const MAX_SINKS: usize = 16;

/// The `telemetry:` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// Distributed event sinks; each receives every record the event writer drains.
    pub sinks: Vec<SinkConfig>,
    /// OpenTelemetry traces (off by default).
    pub tracing: TracingConfig,
}

/// Which mapping a sink writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// moat's own records, as in the JSON-lines sink and the store.
    #[default]
    Moat,
    /// Elastic Common Schema.
    Ecs,
    /// Open Cybersecurity Schema Framework (HTTP Activity, Detection Finding, Network Activity).
    Ocsf,
}

/// Kind of record, to select what a sink receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordKind {
    /// One per finished request.
    Access,
    /// One per engine event.
    Security,
    /// One per audited TLS handshake.
    Tls,
    /// One per closed tcp-listener connection.
    Tcp,
}

impl RecordKind {
    /// Every kind, in the order of [`RecordKind::index`].
    pub const ALL: [RecordKind; 4] = [
        RecordKind::Access,
        RecordKind::Security,
        RecordKind::Tls,
        RecordKind::Tcp,
    ];

    /// Position in [`RecordKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The record's `type` name.
    pub fn name(self) -> &'static str {
        match self {
            RecordKind::Access => "access",
            RecordKind::Security => "security",
            RecordKind::Tls => "tls",
            RecordKind::Tcp => "tcp",
        }
    }

    /// The kind of a record.
    pub fn of(r: &moat_events::Record) -> RecordKind {
        match r {
            moat_events::Record::Access(_) => RecordKind::Access,
            moat_events::Record::Security(_) => RecordKind::Security,
            moat_events::Record::Tls(_) => RecordKind::Tls,
            moat_events::Record::Tcp(_) => RecordKind::Tcp,
        }
    }
}

fn all_kinds() -> Vec<RecordKind> {
    RecordKind::ALL.to_vec()
}

/// One `telemetry.sinks[]` entry: common settings and exactly one destination.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkConfig {
    /// Unique name, the `sink` label of the sink's metrics.
    pub name: Spanned<String>,
    /// `moat` (default), `ecs` or `ocsf`.
    #[serde(default)]
    pub format: Format,
    /// Record kinds sent (default: all).
    #[serde(default = "all_kinds")]
    pub records: Vec<RecordKind>,
    /// In-memory buffer, batching and retries.
    #[serde(default)]
    pub buffer: BufferConfig,
    /// Apache Kafka.
    #[serde(default)]
    pub kafka: Option<KafkaConfig>,
    /// Syslog (RFC 5424).
    #[serde(default)]
    pub syslog: Option<SyslogConfig>,
    /// Batched JSON over HTTP POST.
    #[serde(default)]
    pub http: Option<HttpConfig>,
}

/// Where a `buffer:` section takes the fields it leaves out from: an event sink's
/// buffer ([`SinkDefaults`]) and the trace exporter's ([`TracingDefaults`]) differ in
/// size, batch and linger, and a section that sets one field keeps the others of its own
/// kind.
pub trait BufferDefaults: std::fmt::Debug + Clone + PartialEq + Send + Sync + 'static {
    /// Default `max_records`.
    const MAX_RECORDS: usize;
    /// Default `batch_max`.
    const BATCH_MAX: usize;
    /// Default `linger`.
    const LINGER: Duration;
}

/// An event sink's buffer defaults: 100000 records, batches of 1000, no linger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkDefaults;

impl BufferDefaults for SinkDefaults {
    const MAX_RECORDS: usize = 100_000;
    const BATCH_MAX: usize = 1000;
    const LINGER: Duration = Duration::ZERO;
}

/// The trace exporter's buffer defaults: 20000 spans, batches of 512, a 1s linger
/// (OpenTelemetry's batch span processor has 2048 / 512 / 5s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TracingDefaults;

impl BufferDefaults for TracingDefaults {
    const MAX_RECORDS: usize = 20_000;
    const BATCH_MAX: usize = 512;
    const LINGER: Duration = Duration::from_secs(1);
}

/// `buffer:` of a sink (`D`: where fields left out come from).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, bound = "")]
pub struct BufferConfig<D: BufferDefaults = SinkDefaults> {
    /// Records held while the destination is slow or down; more are dropped and counted
    /// (default 100000).
    pub max_records: usize,
    /// Bytes (encoded) held at most (default 64MiB).
    #[serde(with = "moat_config::byte_size")]
    pub max_bytes: u64,
    /// Records per delivery (default 1000).
    pub batch_max: usize,
    /// Longest a record waits for its batch to fill (default 0: delivered as soon as
    /// the sink is free; tracing: 1s). A batch goes when it holds `batch_max` records or
    /// its oldest has waited this long, so a low rate of records costs one delivery per
    /// `linger`, not one per record (OpenTelemetry's batch span processor does the same
    /// with its schedule delay).
    #[serde(with = "moat_config::duration")]
    pub linger: Duration,
    /// First wait after a failed delivery; doubled on each failure (default 100ms).
    #[serde(with = "moat_config::duration")]
    pub retry_backoff: Duration,
    /// Longest wait between retries (default 5s).
    #[serde(with = "moat_config::duration")]
    pub retry_backoff_max: Duration,
    /// Longest time one delivery attempt may take, connection included (default 10s).
    #[serde(with = "moat_config::duration")]
    pub timeout: Duration,
    /// On shutdown, time left to deliver what is buffered (default 5s).
    #[serde(with = "moat_config::duration")]
    pub shutdown_timeout: Duration,
    #[serde(skip)]
    pub(crate) defaults: std::marker::PhantomData<fn() -> D>,
}

impl<D: BufferDefaults> Default for BufferConfig<D> {
    fn default() -> Self {
        BufferConfig {
            max_records: D::MAX_RECORDS,
            max_bytes: 64 << 20,
            batch_max: D::BATCH_MAX,
            linger: D::LINGER,
            retry_backoff: Duration::from_millis(100),
            retry_backoff_max: Duration::from_secs(5),
            timeout: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(5),
            defaults: std::marker::PhantomData,
        }
    }
}

/// What a Kafka record is keyed by (records with one key land in one partition, in order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KafkaKey {
    /// The request id (access and security records of a request stay together).
    #[default]
    RequestId,
    /// The client IP (a client's records stay in order).
    ClientIp,
}

/// Kafka batch compression.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KafkaCompression {
    /// None.
    None,
    /// gzip.
    Gzip,
    /// Snappy (cheap on CPU, the default).
    #[default]
    Snappy,
}

/// `kafka:` of a sink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    /// Topic per record kind (defaults `moat-access`, `moat-security`, `moat-tls`, `moat-tcp`).
    #[serde(default)]
    pub topics: KafkaTopics,
    /// `request_id` (default) or `client_ip`.
    #[serde(default)]
    pub key: KafkaKey,
    /// `none`, `gzip` or `snappy` (default).
    #[serde(default)]
    pub compression: KafkaCompression,
    /// TLS to the brokers; plaintext when absent.
    #[serde(default)]
    pub tls: Option<ClientTlsConfig>,
}

/// `kafka.topics:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaTopics {
    /// Topic of access records.
    pub access: String,
    /// Topic of security records.
    pub security: String,
    /// Topic of TLS handshake records.
    pub tls: String,
    /// Topic of tcp-connection records.
    pub tcp: String,
}

impl Default for KafkaTopics {
    fn default() -> Self {
        KafkaTopics {
            access: "moat-access".into(),
            security: "moat-security".into(),
            tls: "moat-tls".into(),
            tcp: "moat-tcp".into(),
        }
    }
}

impl KafkaTopics {
    /// The topic of a record kind.
    pub fn get(&self, k: RecordKind) -> &str {
        match k {
            RecordKind::Access => &self.access,
            RecordKind::Security => &self.security,
            RecordKind::Tls => &self.tls,
            RecordKind::Tcp => &self.tcp,
        }
    }
}

/// Client-side TLS (Kafka, syslog over TLS, HTTPS).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientTlsConfig {
    /// PEM file of the CA certificates to trust; the Mozilla roots when absent.
    pub ca_file: Option<PathBuf>,
    /// Name the server certificate must hold; the host of the address when absent.
    pub server_name: Option<String>,
}

/// Syslog transport.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyslogTransport {
    /// RFC 5426: one datagram per message.
    Udp,
    /// RFC 6587 octet counting.
    #[default]
    Tcp,
    /// RFC 5425: octet counting over TLS.
    Tls,
}

/// `syslog:` of a sink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyslogConfig {
    /// `udp`, `tcp` (default) or `tls`.
    #[serde(default)]
    pub transport: SyslogTransport,
    /// Receiver, `host:port`.
    pub address: String,
    /// Facility name (`local0` default, `auth`, `authpriv`, `daemon`, `user`, `local0`..`local7`).
    #[serde(default = "default_facility")]
    pub facility: String,
    /// APP-NAME field (default `moat`).
    #[serde(default = "default_app_name")]
    pub app_name: String,
    /// HOSTNAME field; the machine's host name when absent.
    #[serde(default)]
    pub hostname: Option<String>,
    /// Largest message; a longer one is truncated (default 8KiB, rsyslog's default
    /// `maxMessageSize`; UDP: at most 65000).
    #[serde(default = "default_max_message", with = "moat_config::byte_size")]
    pub max_message_bytes: u64,
    /// TLS settings (`transport: tls`).
    #[serde(default)]
    pub tls: Option<ClientTlsConfig>,
}

fn default_facility() -> String {
    "local0".into()
}

fn default_app_name() -> String {
    "moat".into()
}

fn default_max_message() -> u64 {
    8 << 10
}

/// How an HTTP sink lays out a batch in the request body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HttpBody {
    /// One JSON object per line (Splunk HEC `/services/collector/raw`, Vector, Fluent Bit).
    #[default]
    Ndjson,
    /// One JSON array of the objects.
    JsonArray,
    /// Elasticsearch / OpenSearch `_bulk`: a `{"create":{}}` line before each object.
    ElasticBulk,
    /// Grafana Loki push API: one stream per record kind, labels `app` and `type`.
    Loki,
}

/// `http:` of a sink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// `http://` or `https://` URL the batches are POSTed to.
    pub url: String,
    /// `ndjson` (default), `json_array`, `elastic_bulk` or `loki`.
    #[serde(default)]
    pub body: HttpBody,
    /// Extra request headers (`Authorization: Splunk ${HEC_TOKEN}`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// TLS settings for an `https://` URL.
    #[serde(default)]
    pub tls: Option<ClientTlsConfig>,
}

/// Facility number of a syslog facility name.
pub fn facility_code(name: &str) -> Option<u8> {
    Some(match name {
        "kern" => 0,
        "user" => 1,
        "daemon" => 3,
        "auth" => 4,
        "syslog" => 5,
        "authpriv" => 10,
        "local0" => 16,
        "local1" => 17,
        "local2" => 18,
        "local3" => 19,
        "local4" => 20,
        "local5" => 21,
        "local6" => 22,
        "local7" => 23,
        _ => return None,
    })
}

/// Splits `host:port` (`[v6]:port` too); `None` when it is not one.
pub fn split_host_port(s: &str) -> Option<(&str, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return None;
    }
    Some((host, port.parse().ok()?))
}

impl TelemetryConfig {
    /// Checks every limit. `file` is the config file the section came from;
    /// errors point at the sink's `name` line and name the field.
    pub fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        if self.sinks.len() > MAX_SINKS {
            return Err(ConfigError::semantic(
                file,
                0,
                0,
                "telemetry.sinks",
                format!("at most {MAX_SINKS} sinks, got {}", self.sinks.len()),
            ));
        }
        self.tracing.validate(&|field, msg| {
            ConfigError::semantic(file, 0, 0, format!("telemetry.tracing.{field}"), msg)
        })?;
        let mut names = std::collections::HashSet::new();
        for (i, s) in self.sinks.iter().enumerate() {
            let at = |field: &str, msg: String| {
                ConfigError::semantic(
                    file,
                    s.name.referenced.line() as u32,
                    s.name.referenced.column() as u32,
                    format!("telemetry.sinks[{i}].{field}"),
                    msg,
                )
            };
            s.validate_one(&at)?;
            if !names.insert(s.name.value.as_str()) {
                return Err(at(
                    "name",
                    format!("duplicate sink name `{}`", s.name.value),
                ));
            }
        }
        Ok(())
    }
}

impl SinkConfig {
    fn validate_one(&self, at: &dyn Fn(&str, String) -> ConfigError) -> Result<(), ConfigError> {
        let name = &self.name.value;
        if name == "tracing" {
            return Err(at(
                "name",
                "`tracing` is the span exporter's name in metrics".into(),
            ));
        }
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(at(
                "name",
                format!("`{name}`: 1 to 64 characters among a-z A-Z 0-9 - _"),
            ));
        }
        let dests = [
            self.kafka.is_some(),
            self.syslog.is_some(),
            self.http.is_some(),
        ];
        if dests.iter().filter(|d| **d).count() != 1 {
            return Err(at(
                "kafka",
                "a sink has exactly one of `kafka`, `syslog` or `http`".into(),
            ));
        }
        if self.records.is_empty() {
            return Err(at("records", "names no record kind".into()));
        }
        self.buffer
            .validate(&|f, m| at(&format!("buffer.{f}"), m))?;
        if let Some(k) = &self.kafka {
            if k.brokers.is_empty() {
                return Err(at("kafka.brokers", "names no broker".into()));
            }
            if let Some(bad) = k.brokers.iter().find(|b| split_host_port(b).is_none()) {
                return Err(at(
                    "kafka.brokers",
                    format!("`{bad}` is not a host:port address"),
                ));
            }
            for kind in RecordKind::ALL {
                let t = k.topics.get(kind);
                // Kafka's own rule for topic names.
                if t.is_empty()
                    || t.len() > 249
                    || !t
                        .bytes()
                        .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c))
                {
                    return Err(at(
                        &format!("kafka.topics.{}", kind.name()),
                        format!("`{t}` is not a Kafka topic name (1-249 of a-z A-Z 0-9 . _ -)"),
                    ));
                }
            }
        }
        if let Some(s) = &self.syslog {
            if split_host_port(&s.address).is_none() {
                return Err(at(
                    "syslog.address",
                    format!("`{}` is not a host:port address", s.address),
                ));
            }
            if facility_code(&s.facility).is_none() {
                return Err(at(
                    "syslog.facility",
                    format!("unknown facility `{}`", s.facility),
                ));
            }
            // RFC 5424 6.2.5: APP-NAME is 1*48 PRINTUSASCII; HOSTNAME 1*255.
            let printable = |v: &str, max: usize| {
                !v.is_empty() && v.len() <= max && v.bytes().all(|c| (33..=126).contains(&c))
            };
            if !printable(&s.app_name, 48) {
                return Err(at(
                    "syslog.app_name",
                    "1 to 48 printable ASCII characters, no space".into(),
                ));
            }
            if s.hostname.as_deref().is_some_and(|h| !printable(h, 255)) {
                return Err(at(
                    "syslog.hostname",
                    "1 to 255 printable ASCII characters, no space".into(),
                ));
            }
            let max = if s.transport == SyslogTransport::Udp {
                65000
            } else {
                16 << 20
            };
            if s.max_message_bytes < 480 || s.max_message_bytes > max {
                return Err(at(
                    "syslog.max_message_bytes",
                    format!("must be between 480 and {max}, got {}", s.max_message_bytes),
                ));
            }
            if s.tls.is_some() && s.transport != SyslogTransport::Tls {
                return Err(at("syslog.tls", "only with `transport: tls`".into()));
            }
        }
        if let Some(h) = &self.http {
            validate_http(h, &|f, m| at(&format!("http.{f}"), m))?;
        }
        Ok(())
    }
}

/// The `telemetry.tracing:` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// Whether spans are recorded and exported (default false).
    pub enabled: bool,
    /// OTLP/HTTP traces endpoint (default `http://127.0.0.1:4318/v1/traces`).
    pub endpoint: String,
    /// Share of new traces sampled, 0.0..=1.0 (default 0.01). A request whose
    /// `traceparent` carries a sampling decision follows it.
    pub sample_ratio: f64,
    /// `service.name` of the spans (default `moat`).
    pub service_name: String,
    /// Extra request headers (an authentication token for the collector).
    pub headers: BTreeMap<String, String>,
    /// TLS settings for an `https://` endpoint.
    pub tls: Option<ClientTlsConfig>,
    /// In-memory buffer, batching and retries, as for event sinks (with the
    /// exporter's own defaults for the fields left out).
    pub buffer: BufferConfig<TracingDefaults>,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            enabled: false,
            endpoint: "http://127.0.0.1:4318/v1/traces".into(),
            sample_ratio: 0.01,
            service_name: "moat".into(),
            headers: BTreeMap::new(),
            tls: None,
            buffer: BufferConfig::default(),
        }
    }
}

impl TracingConfig {
    /// The HTTP sink settings of the exporter.
    pub(crate) fn http(&self) -> HttpConfig {
        HttpConfig {
            url: self.endpoint.clone(),
            body: HttpBody::Ndjson,
            headers: self.headers.clone(),
            tls: self.tls.clone(),
        }
    }

    /// Checks the section; `at(field, message)` locates an error.
    pub(crate) fn validate(
        &self,
        at: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(at(
                "sample_ratio",
                format!("must be between 0 and 1, got {}", self.sample_ratio),
            ));
        }
        if self.service_name.is_empty() || self.service_name.len() > 255 {
            return Err(at("service_name", "1 to 255 characters".into()));
        }
        self.buffer
            .validate(&|f, m| at(&format!("buffer.{f}"), m))?;
        validate_http(&self.http(), &|f, m| {
            at(if f == "url" { "endpoint" } else { f }, m)
        })
    }
}

impl<D: BufferDefaults> BufferConfig<D> {
    /// Checks every limit; `at(field, message)` locates an error.
    pub fn validate(&self, at: &dyn Fn(&str, String) -> ConfigError) -> Result<(), ConfigError> {
        let b = self;
        if b.max_records == 0 || b.max_records > MAX_BUFFER_RECORDS {
            return Err(at(
                "max_records",
                format!(
                    "must be between 1 and {MAX_BUFFER_RECORDS}, got {}",
                    b.max_records
                ),
            ));
        }
        if b.max_bytes < 4096 || b.max_bytes > MAX_BUFFER_BYTES {
            return Err(at(
                "max_bytes",
                format!("must be between 4KiB and 1GiB, got {}", b.max_bytes),
            ));
        }
        if b.batch_max == 0 || b.batch_max > MAX_BATCH {
            return Err(at(
                "batch_max",
                format!("must be between 1 and {MAX_BATCH}, got {}", b.batch_max),
            ));
        }
        let ms = Duration::from_millis;
        for (field, d, lo, hi) in [
            ("linger", b.linger, ms(0), ms(60_000)),
            ("retry_backoff", b.retry_backoff, ms(1), ms(60_000)),
            (
                "retry_backoff_max",
                b.retry_backoff_max,
                b.retry_backoff,
                ms(600_000),
            ),
            ("timeout", b.timeout, ms(10), ms(300_000)),
            ("shutdown_timeout", b.shutdown_timeout, ms(0), ms(300_000)),
        ] {
            if d < lo || d > hi {
                return Err(at(
                    field,
                    format!(
                        "must be between {} and {}, got {}",
                        humantime::format_duration(lo),
                        humantime::format_duration(hi),
                        humantime::format_duration(d)
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Checks an HTTP destination; `at(field, message)` locates an error.
pub(crate) fn validate_http(
    h: &HttpConfig,
    at: &dyn Fn(&str, String) -> ConfigError,
) -> Result<(), ConfigError> {
    let uri: Result<hyper::Uri, _> = h.url.parse();
    let ok = uri.as_ref().is_ok_and(|u| {
        matches!(u.scheme_str(), Some("http") | Some("https")) && u.host().is_some()
    });
    if !ok {
        return Err(at(
            "url",
            format!("`{}` is not an http:// or https:// URL", h.url),
        ));
    }
    for (k, v) in &h.headers {
        if hyper::header::HeaderName::from_bytes(k.as_bytes()).is_err()
            || hyper::header::HeaderValue::from_str(v).is_err()
        {
            return Err(at(
                &format!("headers.{k}"),
                "not a valid header name and value".into(),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<TelemetryConfig, ConfigError> {
        let file = Path::new("moat.yaml");
        let c: TelemetryConfig = moat_config::from_str(file, text)?;
        c.validate(file)?;
        Ok(c)
    }

    /// A `buffer:` section that sets one field keeps the other defaults of its own
    /// kind: the exporter's for `tracing.buffer`, the sinks' for a sink's.
    #[test]
    fn buffer_sections_keep_their_own_defaults() {
        let c = parse(
            "tracing:\n  enabled: true\n  buffer: { batch_max: 100 }\nsinks:\n  - name: a\n    buffer: { batch_max: 100 }\n    syslog: { address: \"h:1\" }\n",
        )
        .unwrap();
        let t = &c.tracing.buffer;
        assert_eq!(
            (t.batch_max, t.max_records, t.linger),
            (100, 20_000, Duration::from_secs(1))
        );
        let b = &c.sinks[0].buffer;
        assert_eq!(
            (b.batch_max, b.max_records, b.linger),
            (100, 100_000, Duration::ZERO)
        );
        // and without a section, each kind's defaults
        let c = parse("tracing:\n  enabled: true\n").unwrap();
        assert_eq!(c.tracing.buffer, BufferConfig::<TracingDefaults>::default());
        assert_eq!(c.tracing.buffer.linger, Duration::from_secs(1));
    }

    #[test]
    fn defaults_and_round_trip() {
        let c = parse(
            "sinks:\n  - name: k\n    kafka: { brokers: [\"127.0.0.1:9092\"] }\n  - name: s\n    format: ocsf\n    records: [security]\n    syslog: { address: \"[::1]:514\", transport: udp }\n",
        )
        .unwrap();
        let k = c.sinks[0].kafka.as_ref().unwrap();
        assert_eq!(k.key, KafkaKey::RequestId);
        assert_eq!(k.compression, KafkaCompression::Snappy);
        assert_eq!(k.topics.get(RecordKind::Tls), "moat-tls");
        assert_eq!(c.sinks[0].records.len(), 4);
        assert_eq!(c.sinks[1].format, Format::Ocsf);
        assert_eq!(split_host_port("[::1]:514"), Some(("::1", 514)));
    }

    #[test]
    fn the_documented_config_is_valid() {
        let doc = include_str!("../../../docs/sinks.md");
        let block = doc
            .split("```yaml\n")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .unwrap();
        // The example reads the HEC token from the environment.
        std::env::set_var("HEC_TOKEN", "t");
        let file = Path::new("moat.yaml");
        #[derive(Deserialize)]
        struct Top {
            telemetry: TelemetryConfig,
        }
        let top: Top = moat_config::from_str(file, block).unwrap();
        top.telemetry.validate(file).unwrap();
        assert_eq!(top.telemetry.sinks.len(), 3);
        assert!(top.telemetry.tracing.enabled);
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let e = parse("sinks:\n  - name: a\n    syslog: { address: \"x:1\" }\n  - name: b\n    buffer: { max_records: 0 }\n    http: { url: \"http://h/\" }\n").unwrap_err();
        assert_eq!(
            (e.line, e.field.as_str()),
            (4, "telemetry.sinks[1].buffer.max_records")
        );
        let e = parse("sinks:\n  - name: a\n    kafka: { brokers: [\"h:1\"] }\n    syslog: { address: \"x:1\" }\n").unwrap_err();
        assert!(e.message.contains("exactly one"), "{e}");
        let e = parse("sinks:\n  - name: a\n    http: { url: \"ftp://h/\" }\n").unwrap_err();
        assert_eq!(e.field, "telemetry.sinks[0].http.url");
        let e = parse("sinks:\n  - name: a\n    kafka: { brokers: [\"h\"] }\n").unwrap_err();
        assert_eq!(e.field, "telemetry.sinks[0].kafka.brokers");
        let e = parse(
            "sinks:\n  - name: a\n    kafka: { brokers: [\"h:1\"], topics: { tls: \"a b\" } }\n",
        )
        .unwrap_err();
        assert_eq!(e.field, "telemetry.sinks[0].kafka.topics.tls");
        let e = parse("sinks:\n  - name: a\n    syslog: { address: \"h:1\", facility: nope }\n")
            .unwrap_err();
        assert_eq!(e.field, "telemetry.sinks[0].syslog.facility");
        let e = parse("sinks:\n  - name: a\n    syslog: { address: \"h:1\" }\n  - name: a\n    syslog: { address: \"h:1\" }\n").unwrap_err();
        assert!(e.message.contains("duplicate"), "{e}");
        let e =
            parse("sinks:\n  - name: a\n    syslog: { address: \"h:1\", bogus: 1 }\n").unwrap_err();
        assert!(e.message.contains("unknown field `bogus`"), "{e}");
        assert_eq!(e.line, 3);
        let e = parse("sinks:\n  - name: a\n    buffer: { retry_backoff: 2s, retry_backoff_max: 1s }\n    syslog: { address: \"h:1\" }\n").unwrap_err();
        assert_eq!(e.field, "telemetry.sinks[0].buffer.retry_backoff_max");
        let e = parse("tracing:\n  enabled: true\n  buffer: { linger: 61s }\n").unwrap_err();
        assert_eq!(e.field, "telemetry.tracing.buffer.linger");
        assert!(e.message.contains("between 0s and 1m"), "{e}");
    }
}
