//! Kafka sink on rskafka, a pure-Rust client (why not librdkafka: README.md, "Kafka client").
//!
//! Each record goes to its kind's topic, to the partition Kafka's Java client
//! would pick for its key (murmur2 of the key, so consumers and Kafka Streams
//! agree on co-partitioning); records without a key (TLS handshakes) go round
//! robin. A batch is split per partition, keeping record order, and each part
//! is one produce request with `acks=all` and the configured compression.
//!
//! Delivery is at least once: rskafka has no idempotent producer (no
//! producer id / sequence numbers), so a produce request whose answer was lost
//! is sent again and its records may appear twice. Order per key is kept: one
//! request per partition at a time, and a failed part is retried before anything
//! after it. Topics must exist (the sink does not create them).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record as KafkaRecord;
use rskafka::BackoffConfig;

use crate::config::{KafkaCompression, KafkaConfig, KafkaTopics, RecordKind};
use crate::outbox::{Message, SendError, Transport};

/// Kafka's murmur2 (the Java client's `Utils.murmur2`), seed `0x9747b28c`.
pub fn murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = 0x9747_b28c ^ (data.len() as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition the Java client's default partitioner picks for a key.
pub fn partition_for_key(key: &[u8], partitions: usize) -> usize {
    ((murmur2(key) & 0x7fff_ffff) as usize) % partitions.max(1)
}

pub(crate) struct KafkaSink {
    brokers: Vec<String>,
    topics: KafkaTopics,
    compression: Compression,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// rskafka's own retries end before the sink's attempt timeout does, so an
    /// attempt reports which partitions it delivered instead of being cut off.
    deadline: Duration,
    client: Option<Client>,
    /// The partition clients of each topic, by partition number.
    partitions: HashMap<String, Vec<PartitionClient>>,
    /// Partition count of each kind's topic, by [`RecordKind::index`] (0: not loaded yet).
    counts: [usize; 4],
    round_robin: usize,
}

impl KafkaSink {
    pub(crate) fn new(
        cfg: &KafkaConfig,
        tls: Option<Arc<rustls::ClientConfig>>,
        timeout: Duration,
    ) -> Self {
        KafkaSink {
            brokers: cfg.brokers.clone(),
            topics: cfg.topics.clone(),
            compression: match cfg.compression {
                KafkaCompression::None => Compression::NoCompression,
                KafkaCompression::Gzip => Compression::Gzip,
                KafkaCompression::Snappy => Compression::Snappy,
            },
            tls,
            deadline: timeout / 2,
            client: None,
            partitions: HashMap::new(),
            counts: [0; 4],
            round_robin: 0,
        }
    }

    fn backoff(&self) -> BackoffConfig {
        BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
            base: 2.0,
            deadline: Some(self.deadline),
        }
    }

    async fn client(&mut self) -> Result<&Client, SendError> {
        if self.client.is_none() {
            let mut b = ClientBuilder::new(self.brokers.clone())
                .client_id("moat")
                .backoff_config(self.backoff());
            if let Some(tls) = &self.tls {
                b = b.tls_config(tls.clone());
            }
            let c = b
                .build()
                .await
                .map_err(|e| SendError::Retry(format!("connect to {:?}: {e}", self.brokers)))?;
            self.client = Some(c);
        }
        self.client
            .as_ref()
            .ok_or_else(|| SendError::Retry("no client".into()))
    }

    /// The partition count of a kind's topic (its partition clients are loaded once).
    async fn partition_count(&mut self, kind: RecordKind) -> Result<usize, SendError> {
        let n = self.counts[kind.index()];
        if n > 0 {
            return Ok(n);
        }
        let topic = self.topics.get(kind).to_string();
        if !self.partitions.contains_key(&topic) {
            self.load_topic(&topic).await?;
        }
        let n = self.partitions.get(&topic).map_or(0, Vec::len);
        self.counts[kind.index()] = n;
        Ok(n.max(1))
    }

    /// Loads the partition clients of `topic`.
    async fn load_topic(&mut self, topic: &str) -> Result<(), SendError> {
        let client = self.client().await?;
        let list = client
            .list_topics()
            .await
            .map_err(|e| SendError::Retry(format!("metadata: {e}")))?;
        let Some(t) = list.into_iter().find(|t| t.name == topic) else {
            return Err(SendError::Retry(format!("topic `{topic}` does not exist")));
        };
        let mut ids: Vec<i32> = t.partitions.into_iter().collect();
        ids.sort_unstable();
        let mut clients = Vec::with_capacity(ids.len());
        for p in ids {
            let pc = client
                .partition_client(topic, p, UnknownTopicHandling::Retry)
                .await
                .map_err(|e| SendError::Retry(format!("{topic}/{p}: {e}")))?;
            clients.push(pc);
        }
        if clients.is_empty() {
            return Err(SendError::Retry(format!(
                "topic `{topic}` has no partition"
            )));
        }
        self.partitions.insert(topic.to_string(), clients);
        Ok(())
    }
}

/// Whether the broker refused the records themselves (retrying cannot help).
fn refused_for_good(e: &rskafka::client::error::Error) -> bool {
    use rskafka::client::error::{Error, ProtocolError};
    matches!(
        e,
        Error::ServerError {
            protocol_error: ProtocolError::MessageTooLarge
                | ProtocolError::RecordListTooLarge
                | ProtocolError::InvalidRecord
                | ProtocolError::CorruptMessage,
            ..
        }
    )
}

impl Transport for KafkaSink {
    async fn send(&mut self, batch: &mut Vec<Message>) -> Result<(), SendError> {
        // (record kind, partition) -> indices of the batch, in batch order.
        let mut parts: Vec<(RecordKind, usize, Vec<usize>)> = Vec::new();
        for (i, m) in batch.iter().enumerate() {
            let n = self.partition_count(m.kind).await?;
            let p = match &m.key {
                Some(k) => partition_for_key(k.as_bytes(), n),
                None => {
                    self.round_robin = self.round_robin.wrapping_add(1);
                    self.round_robin % n
                }
            };
            match parts.iter_mut().find(|(k, q, _)| *k == m.kind && *q == p) {
                Some((_, _, idx)) => idx.push(i),
                None => parts.push((m.kind, p, vec![i])),
            }
        }
        // Delivered records leave the batch; what is left is retried, or refused.
        let mut done = vec![false; batch.len()];
        let mut failure = None;
        let mut refused = None;
        for (kind, p, idx) in &parts {
            let topic = self.topics.get(*kind);
            let Some(pc) = self.partitions.get(topic).and_then(|v| v.get(*p)) else {
                continue;
            };
            let records = idx
                .iter()
                .map(|&i| {
                    let m = &batch[i];
                    KafkaRecord {
                        key: m.key.as_ref().map(|k| k.as_bytes().to_vec()),
                        value: Some(m.body.clone()),
                        headers: Default::default(),
                        timestamp: rskafka::chrono::DateTime::from_timestamp_millis(m.ts_ms as i64)
                            .unwrap_or_default(),
                    }
                })
                .collect();
            match pc.produce(records, self.compression).await {
                Ok(_) => idx.iter().for_each(|&i| done[i] = true),
                // Left in the batch: the driver counts what is left after a refusal.
                Err(e) if refused_for_good(&e) => {
                    refused = Some((idx.len(), format!("{topic}/{p}: {e}")));
                }
                Err(e) => failure = Some(format!("produce to {topic}/{p}: {e}")),
            }
        }
        let mut i = 0;
        batch.retain(|_| {
            i += 1;
            !done[i - 1]
        });
        match (failure, refused) {
            // Refused records are refused again on the retry, then counted.
            (Some(e), _) => Err(SendError::Retry(e)),
            (None, Some((n, e))) => Err(SendError::Reject(format!("{n} records: {e}"))),
            (None, None) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_the_java_client() {
        // Values from Kafka's UtilsTest.testMurmur2.
        assert_eq!(murmur2(b"21"), -973932308);
        assert_eq!(murmur2(b"foobar"), -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string"), -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string"), -1486304829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
            -58897971
        );
        assert_eq!(murmur2(b"abc"), 479470107);
        assert!(partition_for_key(b"abc", 3) < 3);
    }
}
