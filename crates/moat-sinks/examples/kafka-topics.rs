//! Creates the Kafka topics moat's sink writes to (it does not create them itself), for
//! benchmarks and trials: `cargo run -p moat-sinks --example kafka-topics -- BROKER [PARTITIONS]`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use rskafka::client::ClientBuilder;

fn main() {
    let mut args = std::env::args().skip(1);
    let broker = args
        .next()
        .expect("usage: kafka-topics BROKER [PARTITIONS]");
    let partitions: i32 = args.next().map_or(3, |p| p.parse().expect("PARTITIONS"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = ClientBuilder::new(vec![broker]).build().await.unwrap();
        let ctl = client.controller_client().unwrap();
        for topic in ["moat-access", "moat-security", "moat-tls", "moat-tcp"] {
            match ctl.create_topic(topic, partitions, 1, 10_000).await {
                Ok(()) => println!("created {topic} ({partitions} partitions)"),
                Err(e) => println!("{topic}: {e}"),
            }
        }
    });
}
