//! Charts for `--svg DIR`, drawn with plotters: where a distribution or a
//! trend is easier seen than read off a table.

use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

const SIZE: (u32, u32) = (960, 600);

fn err(e: impl std::fmt::Display) -> String {
    format!("drawing a chart: {e}")
}

/// Latency distributions, one line per series: the share of samples
/// (nanoseconds) slower than x, both axes logarithmic, so that p50, p99 and
/// p99.9 are where a line crosses 0.5, 0.01 and 0.001 (drawn as guides).
pub fn latency_tail(path: &Path, title: &str, series: &[(String, Vec<u64>)]) -> Result<(), String> {
    let us = |ns: u64| (ns as f64 / 1000.0).max(0.1);
    let max_us = series
        .iter()
        .filter_map(|(_, s)| s.iter().max().copied())
        .map(us)
        .fold(10.0, f64::max);
    let floor = 1e-4;
    let root = canvas(path)?;
    let mut chart = titled(&root, title)
        .build_cartesian_2d((1.0..max_us * 1.5).log_scale(), (floor..1.0).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("fault latency (us)")
        .y_desc("share of faults slower")
        .draw()
        .map_err(err)?;
    for (q, name) in [(0.5, "p50"), (0.01, "p99"), (0.001, "p99.9")] {
        chart
            .draw_series(LineSeries::new(
                [(1.0, q), (max_us * 1.5, q)],
                BLACK.mix(0.25),
            ))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                name,
                (1.05, q * 1.1),
                ("sans-serif", 12),
            )))
            .map_err(err)?;
    }
    for (k, (label, samples)) in series.iter().enumerate() {
        let mut sorted = samples.clone();
        sorted.sort_unstable();
        let n = sorted.len();
        if n == 0 {
            continue;
        }
        // At most ~400 points: every distinct step matters most in the
        // tail, so points are spaced evenly on the log scale of the share.
        let mut points = Vec::new();
        let mut share = 1.0;
        while share >= floor && share >= 1.0 / n as f64 {
            let at = ((1.0 - share) * n as f64) as usize;
            points.push((us(sorted[at.min(n - 1)]), share));
            share /= 1.03;
        }
        labelled_line(&mut chart, k, label, points)?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present().map_err(err)
}

/// Lines of `y` against `x`, one per series, on a linear scale.
pub fn lines(
    path: &Path,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), String> {
    let all = || series.iter().flat_map(|(_, p)| p.iter().copied());
    let x_max = all().map(|(x, _)| x).fold(1.0, f64::max);
    let y_max = all().map(|(_, y)| y).fold(1e-9, f64::max);
    let root = canvas(path)?;
    let mut chart = titled(&root, title)
        .build_cartesian_2d(0.0..x_max * 1.05, 0.0..y_max * 1.15)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(err)?;
    for (k, (label, points)) in series.iter().enumerate() {
        let color = labelled_line(&mut chart, k, label, points.clone())?;
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(err)?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(err)
}

/// Horizontal bars, one per configuration: its median, with a line from
/// its lowest to its highest run; the label is written on the bar.
pub fn bars(
    path: &Path,
    title: &str,
    x_desc: &str,
    bars: &[(String, [f64; 3])],
) -> Result<(), String> {
    let n = bars.len().max(1);
    let x_max = bars.iter().map(|(_, [_, _, hi])| *hi).fold(1.0, f64::max) * 1.1;
    let height = (SIZE.1).max(90 + 45 * n as u32);
    let root = SVGBackend::new(path, (SIZE.0, height)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = titled(&root, title)
        .build_cartesian_2d(0.0..x_max, 0.0..n as f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .disable_y_mesh()
        .y_labels(0)
        .draw()
        .map_err(err)?;
    for (k, (label, [lo, mid, hi])) in bars.iter().enumerate() {
        // The first bar at the top.
        let y = (n - 1 - k) as f64;
        let color = Palette99::pick(k).mix(0.6);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, y + 0.15), (*mid, y + 0.85)],
                color.filled(),
            )))
            .map_err(err)?;
        chart
            .draw_series(LineSeries::new(
                [(*lo, y + 0.5), (*hi, y + 0.5)],
                BLACK.stroke_width(2),
            ))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("{label}: {mid:.0}"),
                (x_max * 0.01, y + 0.62),
                ("sans-serif", 14),
            )))
            .map_err(err)?;
    }
    root.present().map_err(err)
}

/// A white canvas of the charts' size, drawn to `path`.
fn canvas(path: &Path) -> Result<DrawingArea<SVGBackend<'_>, Shift>, String> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    Ok(root)
}

/// A chart on `root` with a caption and room for the axis labels.
fn titled<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    title: &str,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70);
    builder
}

type Chart<'a, 'b, X, Y> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>;

/// Draws series number `k` as a line in its own colour, named in the
/// legend; returns the colour.
fn labelled_line<X, Y>(
    chart: &mut Chart<'_, '_, X, Y>,
    k: usize,
    label: &str,
    points: Vec<(f64, f64)>,
) -> Result<RGBAColor, String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let color = Palette99::pick(k).to_rgba();
    chart
        .draw_series(LineSeries::new(points, color.stroke_width(2)))
        .map_err(err)?
        .label(label)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    Ok(color)
}

/// The legend, boxed, at `position`.
fn legend<'b, X, Y>(
    chart: &mut Chart<'b, 'b, X, Y>,
    position: SeriesLabelPosition,
) -> Result<(), String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(position)
        .draw()
        .map_err(err)
}

/// Creates `dir` (and its parents) for the charts.
pub fn prepare(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))
}
