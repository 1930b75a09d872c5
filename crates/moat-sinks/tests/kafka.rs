//! The Kafka sink against a real Apache Kafka 4 broker in KRaft mode (fetched from Maven
//! Central by scripts/ensure-kafka, run with the machine's Java on free loopback ports).
//! One test, one broker: records arrive in order per key; the broker is killed mid-stream
//! and restarted: pushes never wait, the sink's buffer stays bounded, drops are counted and
//! delivery resumes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use moat_testkit::{free_port, real_part, tools_dir, wait_for_port, ChildGuard};
use rskafka::client::partition::UnknownTopicHandling;
use rskafka::client::ClientBuilder;

struct Broker {
    java: PathBuf,
    libs: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl Broker {
    fn setup(dir: &Path) -> Option<Broker> {
        let java = real_part("java", "install a Java 17+ runtime")?;
        let libs = tools_dir().join("kafka/libs");
        if !libs.join(".complete").exists() {
            assert!(
                !moat_testkit::required(),
                "Kafka is required but {} is missing: run scripts/ensure-kafka",
                libs.display()
            );
            eprintln!("notice: test skipped: Kafka not fetched (scripts/ensure-kafka)");
            return None;
        }
        let (port, controller) = (free_port().unwrap(), free_port().unwrap());
        let props = format!(
            "process.roles=broker,controller\nnode.id=1\n\
             controller.quorum.voters=1@127.0.0.1:{controller}\n\
             listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
             controller.listener.names=CONTROLLER\ninter.broker.listener.name=PLAINTEXT\n\
             listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n\
             log.dirs={}\noffsets.topic.replication.factor=1\n\
             transaction.state.log.replication.factor=1\ntransaction.state.log.min.isr=1\n\
             auto.create.topics.enable=false\ngroup.initial.rebalance.delay.ms=0\n",
            dir.join("data").display()
        );
        std::fs::write(dir.join("server.properties"), props).unwrap();
        let b = Broker {
            java,
            libs,
            dir: dir.to_path_buf(),
            port,
        };
        let out = b
            .java_cmd("kafka.tools.StorageTool")
            .args(["format", "-t", "bW9hdC1zaW5rcy10ZXN0", "-c"])
            .arg(dir.join("server.properties"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kafka storage format failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(b)
    }

    fn java_cmd(&self, class: &str) -> Command {
        let mut c = Command::new(&self.java);
        // A small heap and the quick JIT tier: the broker starts in seconds and stays small.
        c.args([
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-cp",
        ])
        .arg(format!("{}/*", self.libs.display()))
        .arg(class);
        c
    }

    fn start(&self) -> ChildGuard {
        let log = std::fs::File::create(self.dir.join("broker.log")).unwrap();
        let child = self
            .java_cmd("kafka.Kafka")
            .arg(self.dir.join("server.properties"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let guard = ChildGuard(child);
        assert!(
            wait_for_port(self.port, Duration::from_secs(60)),
            "the broker did not listen: {}",
            std::fs::read_to_string(self.dir.join("broker.log")).unwrap_or_default()
        );
        guard
    }

    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// Every record of `topic` (all partitions): (partition, key, value).
async fn consume(
    broker: &str,
    topic: &str,
    partitions: i32,
) -> Vec<(i32, String, serde_json::Value)> {
    let client = ClientBuilder::new(vec![broker.to_string()])
        .build()
        .await
        .unwrap();
    let mut out = Vec::new();
    for p in 0..partitions {
        let pc = client
            .partition_client(topic, p, UnknownTopicHandling::Retry)
            .await
            .unwrap();
        let mut offset = 0;
        loop {
            let (records, high) = pc.fetch_records(offset, 1..10_000_000, 200).await.unwrap();
            for r in &records {
                out.push((
                    p,
                    String::from_utf8(r.record.key.clone().unwrap_or_default()).unwrap(),
                    serde_json::from_slice(r.record.value.as_deref().unwrap()).unwrap(),
                ));
                offset = r.offset + 1;
            }
            if offset >= high {
                break;
            }
        }
    }
    out
}

#[test]
fn kafka_order_per_key_outage_and_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let Some(broker) = Broker::setup(dir.path()) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut running = Some(broker.start());
    let addr = broker.address();
    rt.block_on(async {
        let client = ClientBuilder::new(vec![addr.clone()])
            .build()
            .await
            .unwrap();
        let ctl = client.controller_client().unwrap();
        for topic in ["moat-access", "moat-security", "moat-tls", "moat-tcp"] {
            ctl.create_topic(topic, 3, 1, 10_000).await.unwrap();
        }
    });

    let yaml = format!(
        "sinks:\n  - name: kafka\n    buffer: {{ max_records: 2000, batch_max: 500, retry_backoff: 50ms, retry_backoff_max: 500ms, timeout: 4s }}\n    kafka: {{ brokers: [\"{addr}\"], key: client_ip, compression: gzip }}\n"
    );
    let (queue, writer, metrics) = common::start(&yaml, dir.path());
    let stats = metrics.get("kafka").unwrap();

    // 1. In order per key: five clients, interleaved.
    for i in 0..300 {
        assert!(queue.push(common::access(
            &format!("p1-{i:04}"),
            &format!("10.0.0.{}", i % 5)
        )));
    }
    queue.push(common::security("p1-sec", "10.0.0.9"));
    queue.push(common::tls());
    common::wait_for(Duration::from_secs(30), || {
        (stats.delivered.load(Ordering::Relaxed) >= 302).then_some(())
    })
    .expect("the first 302 records were not delivered");
    let got = rt.block_on(consume(&addr, "moat-access", 3));
    assert_eq!(got.len(), 300);
    let mut per_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (p, key, v) in &got {
        // The Java client's partitioner would put this key on the same partition.
        assert_eq!(
            *p as usize,
            moat_sinks::kafka::partition_for_key(key.as_bytes(), 3)
        );
        assert_eq!(v["client_ip"], key.as_str());
        per_key
            .entry(key.clone())
            .or_default()
            .push(v["request_id"].as_str().unwrap().to_string());
    }
    assert_eq!(per_key.len(), 5);
    for ids in per_key.values() {
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, &sorted, "out of order within a key");
        assert_eq!(ids.len(), 60);
    }
    let sec = rt.block_on(consume(&addr, "moat-security", 3));
    assert_eq!(sec.len(), 1);
    assert_eq!(sec[0].2["event"]["rule"], "sqli");
    let tls = rt.block_on(consume(&addr, "moat-tls", 3));
    assert_eq!(
        tls[0].2["handshake"]["ciphersuite_name"],
        "TLS13_AES_128_GCM_SHA256"
    );

    // 2. The broker dies mid-stream.
    drop(running.take());
    let mut slowest = Duration::ZERO;
    let mut max_depth = 0;
    for i in 0..6000 {
        let t = Instant::now();
        queue.push(common::access(
            &format!("p2-{i:05}"),
            &format!("10.0.1.{}", i % 7),
        ));
        slowest = slowest.max(t.elapsed());
        if i % 100 == 0 {
            std::thread::sleep(Duration::from_millis(5));
            max_depth = max_depth.max(stats.depth.load(Ordering::Relaxed));
        }
    }
    // Give the writer time to offer everything to the sink.
    std::thread::sleep(Duration::from_millis(300));
    max_depth = max_depth.max(stats.depth.load(Ordering::Relaxed));
    let dropped = stats.dropped.load(Ordering::Relaxed);
    assert!(
        slowest < Duration::from_millis(50),
        "a push waited {slowest:?}"
    );
    assert!(max_depth <= 2000, "buffer grew to {max_depth}");
    // Memory: the buffer's encoded bytes stay within what 2000 records take.
    let bytes = stats.bytes.load(Ordering::Relaxed);
    assert!(bytes <= 2000 * 1024, "buffer holds {bytes} bytes");
    // 6000 pushed, at most 2000 buffered and one batch of 500 in flight: the rest dropped.
    assert!(dropped >= 6000 - 2000 - 500, "dropped {dropped}");
    assert!(
        queue.depth() < 1000,
        "the event writer was held up: {} queued",
        queue.depth()
    );
    // The failure surfaces once rskafka's own retries give up (half the 4 s timeout).
    common::wait_for(Duration::from_secs(10), || {
        (stats.send_errors.load(Ordering::Relaxed) > 0).then_some(())
    })
    .expect("no failed delivery counted while the broker was down");
    assert!(stats.down.load(Ordering::Relaxed));
    assert_eq!(queue.dropped(), 0, "the event queue itself never fills");

    // 3. The broker returns: the buffered records and new ones are delivered.
    running = Some(broker.start());
    let wait_delivered = |target: u64, what: &str| {
        common::wait_for(Duration::from_secs(40), || {
            (stats.delivered.load(Ordering::Relaxed) >= target).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "{what}: {} of {target} delivered",
                stats.delivered.load(Ordering::Relaxed)
            )
        })
    };
    // What the buffer held goes first...
    let backlog = 302 + (6000 - dropped);
    wait_delivered(
        backlog,
        "the backlog was not delivered after the broker returned",
    );
    // ...then records pushed from now on flow as before.
    for i in 0..100 {
        queue.push(common::access(&format!("p3-{i:04}"), "10.0.2.1"));
    }
    wait_delivered(backlog + 100, "new records were not delivered");
    assert_eq!(stats.dropped.load(Ordering::Relaxed), dropped);
    writer.shutdown();
    let got = rt.block_on(consume(&addr, "moat-access", 3));
    let p3: Vec<&str> = got
        .iter()
        .filter_map(|(_, _, v)| v["request_id"].as_str())
        .filter(|id| id.starts_with("p3-"))
        .collect();
    assert_eq!(p3.len(), 100);
    let mut sorted = p3.clone();
    sorted.sort();
    assert_eq!(p3, sorted);
    // At least once: every buffered outage record is there (a retried request may add copies).
    let p2 = got
        .iter()
        .filter(|(_, _, v)| {
            v["request_id"]
                .as_str()
                .is_some_and(|id| id.starts_with("p2-"))
        })
        .count() as u64;
    assert!(
        p2 >= 6000 - dropped,
        "{p2} of {} outage records",
        6000 - dropped
    );
    assert!(!stats.down.load(Ordering::Relaxed));
    drop(running);
}
