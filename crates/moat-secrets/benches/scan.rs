//! Secret scanning speed with gitleaks' full ruleset (222 rules) and moat's default.
//!
//! Run: `cargo bench -p moat-secrets --bench scan`. Besides criterion's timings it
//! prints the ruleset compile time and the heap held by the compiled rules
//! (counting global allocator), and writes the payloads to
//! `$TMPDIR/moat-secrets-bench/` so gitleaks itself can be timed on them.
//! `MOAT_SECRETS_SIMD=avx2` or `=portable` caps the keyword finder's code path
//! (the path used is printed), to measure the paths of CPUs without AVX-512.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A counting global allocator.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use moat_secrets::Scanner;

struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// gitleaks' own rule set from the shared corpora beside the checkout, read at run time
/// so that the benches build on a clone without `../shared` (they skip, with a notice).
fn gitleaks_toml() -> Option<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/datasets/gitleaks/gitleaks.toml"
    );
    match std::fs::read_to_string(path) {
        Ok(text) => Some(text),
        Err(e) => {
            eprintln!("skipped: the gitleaks rule set benches need {path} ({e})");
            None
        }
    }
}

/// Deterministic xorshift for reproducible payloads.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

const WORDS: &[&str] = &[
    "the",
    "order",
    "was",
    "shipped",
    "to",
    "customer",
    "after",
    "payment",
    "cleared",
    "and",
    "warehouse",
    "confirmed",
    "stock",
    "levels",
    "for",
    "each",
    "item",
    "in",
    "request",
    "delivery",
    "window",
    "is",
    "three",
    "days",
    "please",
    "contact",
    "support",
    "if",
    "you",
    "have",
    "questions",
    "about",
    "invoice",
    "total",
    "amount",
    "due",
    "next",
    "month",
    "account",
    "manager",
    "will",
    "review",
    "the",
    "report",
    "weekly",
    "summary",
    "shows",
    "growth",
    "in",
    "active",
    "users",
    "across",
    "regions",
];
const NAMES: &[&str] = &[
    "Alice Martin",
    "Bob Chen",
    "Carla Diaz",
    "Deepak Rao",
    "Emma Novak",
    "Farid Haddad",
];
const CITIES: &[&str] = &["Lyon", "Osaka", "Denver", "Porto", "Nairobi", "Tallinn"];

fn sentence(r: &mut Rng, n: usize) -> String {
    (0..n).map(|_| r.pick(WORDS)).collect::<Vec<_>>().join(" ")
}

/// ~`size` bytes of a JSON API response (orders with customers and notes).
fn json_payload(r: &mut Rng, size: usize) -> String {
    let mut s = String::from("{\"orders\":[\n");
    let mut i = 0;
    while s.len() < size - 300 {
        s.push_str(&format!(
            "  {{\"id\": {}, \"customer\": \"{}\", \"city\": \"{}\", \"total\": {}.{:02}, \"currency\": \"EUR\", \"created_at\": \"2025-0{}-1{}T10:2{}:00Z\", \"note\": \"{}\"}},\n",
            10000 + i,
            r.pick(NAMES),
            r.pick(CITIES),
            r.next() % 900,
            r.next() % 100,
            1 + r.next() % 9,
            r.next() % 10,
            r.next() % 10,
            sentence(r, 12)
        ));
        i += 1;
    }
    s.push_str("  {\"id\": 0}\n]}\n");
    s
}

/// ~`size` bytes of application source code and configuration.
fn code_payload(r: &mut Rng, size: usize) -> String {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < size {
        s.push_str(&format!(
            "// {}\nfn handle_order_{i}(order: &Order, store: &Store) -> Result<Receipt, Error> {{\n    let items = store.lookup(order.id)?;\n    let total: u64 = items.iter().map(|x| x.price * x.quantity).sum();\n    if total > LIMIT_{i} {{ return Err(Error::Limit(total)); }}\n    log::info!(\"order {{}} total {{}}\", order.id, total);\n    Ok(Receipt::new(order.id, total))\n}}\n\n",
            sentence(r, 8)
        ));
        i += 1;
    }
    s
}

/// ~`size` bytes of access-log style text.
fn log_payload(r: &mut Rng, size: usize) -> String {
    let mut s = String::new();
    while s.len() < size {
        s.push_str(&format!(
            "10.0.{}.{} - - [21/Nov/2025:10:{:02}:{:02} +0000] \"GET /shop/orders/{}?page={} HTTP/1.1\" 200 {} \"-\" \"Mozilla/5.0 (X11; Linux x86_64)\"\n",
            r.next() % 255,
            r.next() % 255,
            r.next() % 60,
            r.next() % 60,
            r.next() % 100000,
            r.next() % 20,
            r.next() % 50000
        ));
    }
    s
}

fn payloads(with_secrets: bool) -> Vec<String> {
    let mut r = Rng(0x9e3779b97f4a7c15);
    let mut a = json_payload(&mut r, 20_000);
    let mut b = code_payload(&mut r, 20_000);
    let mut c = log_payload(&mut r, 10_000);
    if with_secrets {
        let mid = a.len() / 2;
        let at = a[mid..].find('\n').map(|p| mid + p + 1).unwrap_or(mid);
        a.insert_str(
            at,
            "  {\"id\": 1, \"github_token\": \"ghp_R7x2Kq9LmZ4vT8nB3cW6yH1jF5dS0aPe2gUo\"},\n",
        );
        b.insert_str(
            b.len() / 3,
            "\nconst AWS_KEY: &str = \"AKIAZ7Q4T2MXW6VBN3RK\";\n",
        );
        c.push_str("2025-11-21 token=xoxb-2837465019-8364519027-Qm7Zt2Lx9Rv4Kp8Wn3Hs6Jd1\n");
    }
    vec![a, b, c]
}

fn bench(c: &mut Criterion) {
    let Some(gitleaks_toml) = gitleaks_toml() else {
        return;
    };
    let before = LIVE.load(Ordering::Relaxed);
    let t = Instant::now();
    let gitleaks = Scanner::from_toml(&gitleaks_toml, "gitleaks.toml").expect("gitleaks rules");
    let compile = t.elapsed();
    let held = LIVE.load(Ordering::Relaxed).saturating_sub(before);
    println!(
        "gitleaks.toml: {} rules compiled in {:.1} ms, heap held {:.2} MiB, skipped {}, keyword finder path {}",
        gitleaks.rules().len(),
        compile.as_secs_f64() * 1e3,
        held as f64 / (1 << 20) as f64,
        gitleaks.skipped().len(),
        gitleaks.keyword_path()
    );
    let t = Instant::now();
    let builtin = Scanner::builtin().expect("default rules");
    println!(
        "moat default rules: {} rules compiled in {:.1} ms",
        builtin.rules().len(),
        t.elapsed().as_secs_f64() * 1e3
    );

    let clean = payloads(false);
    let dirty = payloads(true);
    let dir = std::env::temp_dir().join("moat-secrets-bench");
    let _ = std::fs::create_dir_all(dir.join("clean"));
    let _ = std::fs::create_dir_all(dir.join("secrets"));
    for (i, (p, q)) in clean.iter().zip(&dirty).enumerate() {
        let _ = std::fs::write(dir.join("clean").join(format!("payload{i}.txt")), p);
        let _ = std::fs::write(dir.join("secrets").join(format!("payload{i}.txt")), q);
    }
    let found: usize = dirty
        .iter()
        .map(|p| gitleaks.scan(p.as_bytes(), None).len())
        .sum();
    let found_clean: usize = clean
        .iter()
        .map(|p| gitleaks.scan(p.as_bytes(), None).len())
        .sum();
    println!(
        "payload sizes {:?}; findings clean={found_clean} with-secrets={found}",
        clean.iter().map(|p| p.len()).collect::<Vec<_>>()
    );
    // Heap after warm-up scans (lazy DFA caches filled).
    println!(
        "heap after warm-up: {:.2} MiB (peak {:.2} MiB)",
        LIVE.load(Ordering::Relaxed) as f64 / (1 << 20) as f64,
        PEAK.load(Ordering::Relaxed) as f64 / (1 << 20) as f64
    );

    let total: usize = clean.iter().map(|p| p.len()).sum();
    let mut g = c.benchmark_group("gitleaks-rules");
    g.throughput(Throughput::Bytes(total as u64));
    g.bench_function("3 payloads 20+20+10 KB clean", |b| {
        b.iter(|| {
            for p in &clean {
                black_box(gitleaks.scan(black_box(p.as_bytes()), None));
            }
        })
    });
    g.bench_function("3 payloads 20+20+10 KB with 3 secrets", |b| {
        b.iter(|| {
            for p in &dirty {
                black_box(gitleaks.scan(black_box(p.as_bytes()), None));
            }
        })
    });
    let mut decoding = Scanner::from_toml(&gitleaks_toml, "gitleaks.toml").expect("gitleaks rules");
    decoding.set_max_decode_depth(moat_secrets::GITLEAKS_DEFAULT_DECODE_DEPTH);
    g.bench_function("3 payloads 20+20+10 KB clean, decode depth 5", |b| {
        b.iter(|| {
            for p in &clean {
                black_box(decoding.scan(black_box(p.as_bytes()), None));
            }
        })
    });
    g.bench_function(
        "3 payloads 20+20+10 KB with 3 secrets, decode depth 5",
        |b| {
            b.iter(|| {
                for p in &dirty {
                    black_box(decoding.scan(black_box(p.as_bytes()), None));
                }
            })
        },
    );
    let big: String = clean.concat().repeat(20);
    g.throughput(Throughput::Bytes(big.len() as u64));
    g.bench_function("1 MB clean", |b| {
        b.iter(|| black_box(gitleaks.scan(black_box(big.as_bytes()), None)))
    });
    g.bench_function("1 MB clean, decode depth 5", |b| {
        b.iter(|| black_box(decoding.scan(black_box(big.as_bytes()), None)))
    });
    g.finish();

    let mut g = c.benchmark_group("default-rules");
    g.throughput(Throughput::Bytes(total as u64));
    g.bench_function("3 payloads 20+20+10 KB clean", |b| {
        b.iter(|| {
            for p in &clean {
                black_box(builtin.scan(black_box(p.as_bytes()), None));
            }
        })
    });
    g.finish();

    c.bench_function("compile gitleaks.toml", |b| {
        b.iter(|| black_box(Scanner::from_toml(&gitleaks_toml, "gitleaks.toml").is_ok()))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(std::time::Duration::from_secs(1)).measurement_time(std::time::Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
