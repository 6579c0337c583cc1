//! The sink benchmark, the same for every destination: the ignored test
//! `bench_apply_rates_per_batch_size` of each `tests/tests/<sink>_sink.rs`
//! runs [`apply_rates_per_batch_size`] over its [`BenchDestination`].
//! `bench/run` reads the Markdown table it prints (`parse_sink_table`):
//! the lines keep their shape.

use async_trait::async_trait;
use tributary_connectors::Sink;
use tributary_schemas::{ChangeEvent, Op};

use crate::items::{batch, event, items, key_row, row};

/// A destination of the sink benchmark: a fresh one for each batch size.
#[async_trait]
pub trait BenchDestination: Sized + Send + Sync {
    /// What the destination is charged or limited by, per batch (the
    /// table's unit column: "commits", "MERGE statements", ...).
    const UNIT: &'static str;

    /// The sink under test.
    type Sink: Sink;

    /// A fresh destination for the test `name`, and a sink writing into it.
    async fn create(name: &str) -> (Self, Self::Sink);

    /// How many rows the copy holds.
    async fn rows(&self) -> usize;

    /// What `sink` cost for `batches` batches, in [`Self::UNIT`].
    fn units(&self, sink: &Self::Sink, batches: u64) -> u64;

    /// Removes the destination.
    async fn cleanup(self);
}

/// Applies the benchmark's changes ([`bench_changes`]) into a fresh `D` at
/// each batch size ([`bench_batch_sizes`]), checks the copy, and prints
/// one table row per size after the header.
pub async fn apply_rates_per_batch_size<D: BenchDestination>() {
    bench_header(D::UNIT);
    for size in bench_batch_sizes() {
        let (destination, mut sink) = D::create("bench").await;
        let (events, expected) = bench_changes();
        let total = events.len();
        let took = apply_in_batches(&mut sink, events, size).await;
        assert_eq!(destination.rows().await, expected, "the copy holds what the changes leave");
        bench_row(size, total, took, destination.units(&sink, total.div_ceil(size) as u64));
        destination.cleanup().await;
    }
}

/// The sink benchmarks' workload (`BENCH_ROWS` changes, default 20,000):
/// half snapshot reads of `items`, half updates and deletes (one in five)
/// of them; and the rows the copy holds afterwards.
fn bench_changes() -> (Vec<ChangeEvent>, usize) {
    let rows: usize = std::env::var("BENCH_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let s = items();
    let half = (rows / 2) as i32;
    let mut events = Vec::with_capacity(rows);
    for i in 0..half {
        events.push(event(&s, Op::Read, None, Some(row(i, &format!("product {i}"), i, "19.99")), 10, 0));
    }
    for (n, i) in (0..half).enumerate() {
        let ev = if i % 5 == 0 {
            event(&s, Op::Delete, Some(key_row(i)), None, 11, n as u64)
        } else {
            event(&s, Op::Update, None, Some(row(i, "changed", i + 1, "20.00")), 11, n as u64)
        };
        events.push(ev);
    }
    (events, (half - (half + 4) / 5) as usize)
}

/// The benchmarks' batch sizes (`BENCH_BATCHES`, default 100,1000,5000).
fn bench_batch_sizes() -> Vec<usize> {
    std::env::var("BENCH_BATCHES")
        .unwrap_or_else(|_| "100,1000,5000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// Applies `events` to `sink` in batches of `size` on topic `bench`;
/// returns the seconds it took.
async fn apply_in_batches(sink: &mut dyn Sink, events: Vec<ChangeEvent>, size: usize) -> f64 {
    let started = std::time::Instant::now();
    let mut offset = 0i64;
    for chunk in events.chunks(size) {
        sink.apply(&batch("bench", offset, chunk.to_vec())).await.expect("apply");
        offset += chunk.len() as i64;
    }
    started.elapsed().as_secs_f64()
}

/// The Markdown header of a sink benchmark's table; `unit` names what the
/// destination is charged or limited by (commits, MERGE statements, ...).
fn bench_header(unit: &str) {
    println!("| batch size | changes | seconds | changes/s | {unit} | {unit} per 1M changes |");
    println!("|---:|---:|---:|---:|---:|---:|");
}

/// One row of a sink benchmark's table: `changes` applied in batches of
/// `size` in `seconds`, costing `units`.
fn bench_row(size: usize, changes: usize, seconds: f64, units: u64) {
    println!(
        "| {size} | {changes} | {seconds:.1} | {:.0} | {units} | {:.0} |",
        changes as f64 / seconds,
        units as f64 * 1_000_000.0 / changes as f64
    );
}
