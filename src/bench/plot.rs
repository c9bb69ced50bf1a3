//! `--plot`: the latency distribution and the throughput over time of the latency run, as SVG.

use std::path::Path;

use super::engine::percentile;
use super::Traces;

/// Draws the latency distribution and the throughput over time of the latency run.
pub(super) fn plot(path: &Path, traces: &Traces) -> anyhow::Result<()> {
    use plotters::prelude::*;
    anyhow::ensure!(
        !traces.latencies.is_empty(),
        "--plot draws the latency run, which did not run (see --only)"
    );
    let root = SVGBackend::new(path, (1000, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(500);
    // The latency distribution: a histogram in 0.5 ms buckets up to the p99.9.
    let top = percentile(&traces.latencies, 0.999).max(1.0);
    let bucket = 0.5f64;
    let n_buckets = (top / bucket).ceil() as usize + 1;
    let mut counts = vec![0u32; n_buckets];
    for &l in &traces.latencies {
        counts[((l / bucket) as usize).min(n_buckets - 1)] += 1;
    }
    let peak = counts.iter().copied().max().unwrap_or(1);
    let mut chart = ChartBuilder::on(&left)
        .caption("completion → claimable latency", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(48)
        .build_cartesian_2d(0f64..(n_buckets as f64 * bucket), 0u32..peak + peak / 10 + 1)?;
    chart.configure_mesh().x_desc("ms").y_desc("items").draw()?;
    chart.draw_series(counts.iter().enumerate().map(|(i, &c)| {
        let x = i as f64 * bucket;
        Rectangle::new([(x, 0), (x + bucket, c)], BLUE.mix(0.6).filled())
    }))?;
    // The throughput: children delivered per second, in 100 ms steps.
    let per_s: Vec<(f64, f64)> = traces
        .throughput
        .iter()
        .enumerate()
        .map(|(i, &c)| (i as f64 / 10.0, f64::from(c) * 10.0))
        .collect();
    let max_y = per_s.iter().map(|p| p.1).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&right)
        .caption("children delivered per second", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..(per_s.len() as f64 / 10.0).max(0.1), 0f64..max_y * 1.1)?;
    chart.configure_mesh().x_desc("s").y_desc("children/s").draw()?;
    chart.draw_series(LineSeries::new(per_s, &RED))?;
    root.present()?;
    Ok(())
}
