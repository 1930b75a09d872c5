//! Criterion benches for the WAF hot path.
use criterion::{criterion_group, criterion_main, Criterion};

fn benches(_c: &mut Criterion) {}

criterion_group!(b, benches);
criterion_main!(b);
