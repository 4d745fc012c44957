//! A PNG of a report's latency histograms: one panel per run, one column per
//! stream and log2 bucket, counts on a log scale so that a handful of
//! multi-second stalls stays visible beside thousands of fast requests.

use std::path::Path;

use super::canvas::Canvas;
use super::report::Report;
use crate::stats::bucket_label;

const WIDTH: usize = 1200;
const PANEL_HEIGHT: i64 = 260;
const MARGIN_LEFT: i64 = 70;
const MARGIN_RIGHT: i64 = 20;
const TOP: i64 = 50;
const BLACK: [u8; 3] = [20, 20, 20];
const GREY: [u8; 3] = [200, 200, 200];
const COLOURS: [[u8; 3]; 6] = [
    [31, 119, 180],
    [214, 39, 40],
    [44, 160, 44],
    [255, 127, 14],
    [148, 103, 189],
    [140, 86, 75],
];

pub fn render(report: &Report) -> Canvas {
    let buckets: Vec<&Vec<u64>> = report
        .runs
        .iter()
        .flat_map(|r| r.streams.iter().map(|s| &s.histogram_log2_us))
        .collect();
    let first = buckets
        .iter()
        .filter_map(|b| b.iter().position(|c| *c > 0))
        .min()
        .unwrap_or(0);
    let last = buckets
        .iter()
        .filter_map(|b| b.iter().rposition(|c| *c > 0))
        .max()
        .unwrap_or(0)
        .max(first);
    let max_count = buckets
        .iter()
        .flat_map(|b| b.iter())
        .copied()
        .max()
        .unwrap_or(1)
        .max(1);
    let decades = (max_count as f64).log10().ceil().max(1.0);
    let height = TOP as usize + report.runs.len() * PANEL_HEIGHT as usize + 20;
    let mut canvas = Canvas::new(WIDTH, height, [255, 255, 255]);
    let title = format!(
        "{} ({}, {} s, seed {}): latency, log2 buckets, count on a log scale",
        report.scenario, report.mode, report.seconds, report.seed
    );
    canvas.text(MARGIN_LEFT, 15, &title, 2, BLACK);
    let plot_width = WIDTH as i64 - MARGIN_LEFT - MARGIN_RIGHT;
    let slot = plot_width / (last - first + 1) as i64;
    for (index, run) in report.runs.iter().enumerate() {
        let top = TOP + index as i64 * PANEL_HEIGHT;
        let bottom = top + PANEL_HEIGHT - 60;
        let plot_height = bottom - (top + 30);
        canvas.text(
            MARGIN_LEFT,
            top + 5,
            &format!("{}: {}", run.label, run.config.target),
            2,
            BLACK,
        );
        for decade in 0..=decades as i64 {
            let y = bottom - (decade as f64 / decades * plot_height as f64) as i64;
            canvas.fill(MARGIN_LEFT, y, plot_width, 1, GREY);
            canvas.text(8, y - 3, &format!("1e{decade}"), 1, BLACK);
        }
        let streams = run.streams.len().max(1) as i64;
        let column = ((slot - 4) / streams).max(1);
        for (s, stream) in run.streams.iter().enumerate() {
            let colour = COLOURS[s % COLOURS.len()];
            for (i, count) in stream.histogram_log2_us.iter().enumerate() {
                if *count == 0 || i < first || i > last {
                    continue;
                }
                let h =
                    ((*count as f64 + 1.0).log10() / decades * plot_height as f64).max(1.0) as i64;
                let x = MARGIN_LEFT + (i - first) as i64 * slot + 2 + s as i64 * column;
                canvas.fill(x, bottom - h, column, h, colour);
            }
            let legend = format!(
                "{} (p99 {:.1} ms)",
                stream.name,
                stream.latency_us.p99 / 1000.0
            );
            let lx = WIDTH as i64 - MARGIN_RIGHT - 260;
            canvas.fill(lx, top + 30 + s as i64 * 14, 10, 10, colour);
            canvas.text(lx + 14, top + 31 + s as i64 * 14, &legend, 1, BLACK);
        }
        canvas.fill(MARGIN_LEFT, bottom, plot_width, 1, BLACK);
        for i in first..=last {
            let label = bucket_label(i);
            let x = MARGIN_LEFT
                + (i - first) as i64 * slot
                + (slot - Canvas::text_width(&label, 1)) / 2;
            canvas.text(x, bottom + 6, &label, 1, BLACK);
        }
    }
    canvas
}

pub fn write(report: &Report, path: &Path) -> std::io::Result<()> {
    std::fs::write(path, render(report).encode())
}

/// What a step plot's vertical axis shows.
#[derive(Clone, Copy)]
pub enum YScale {
    /// A share, 0 to 1.
    Share,
    /// A latency in microseconds, on a log scale from 10 us to 10 s.
    LatencyUs,
}

impl YScale {
    /// Where `value` sits, from 0 (bottom) to 1 (top).
    fn position(self, value: f64) -> f64 {
        match self {
            YScale::Share => value.clamp(0.0, 1.0),
            YScale::LatencyUs => ((value.max(1.0).log10() - 1.0) / 6.0).clamp(0.0, 1.0),
        }
    }

    fn ticks(self) -> Vec<(f64, String)> {
        match self {
            YScale::Share => (0..=10)
                .map(|tenth| {
                    let share = tenth as f64 / 10.0;
                    (share, format!("{share:.1}"))
                })
                .collect(),
            YScale::LatencyUs => ["10us", "100us", "1ms", "10ms", "100ms", "1s", "10s"]
                .iter()
                .enumerate()
                .map(|(i, label)| (10f64.powi(i as i32 + 1), label.to_string()))
                .collect(),
        }
    }
}

/// A tick on the x axis at `x`, its label centred under it.
fn x_tick(canvas: &mut Canvas, x: i64, bottom: i64, label: &str) {
    canvas.fill(x, bottom, 1, 4, BLACK);
    canvas.text(
        x - Canvas::text_width(label, 1) / 2,
        bottom + 8,
        label,
        1,
        BLACK,
    );
}

/// A line per policy of one copy's share of reads (0 to 1) over time, with
/// the window of a fault shaded. Each line: (name, step in s, shares).
pub fn share_plot(title: &str, shaded_s: (f64, f64), lines: &[(String, f64, Vec<f64>)]) -> Canvas {
    step_plot(
        title,
        YScale::Share,
        shaded_s,
        lines,
        "time (s), shaded: the copy is slowed",
    )
}

/// Lines of values over time, each (name, step in s, values), with a
/// window shaded and `caption` under the time axis. With a latency scale,
/// a step with no value (0) continues the line at its last level.
pub fn step_plot(
    title: &str,
    scale: YScale,
    shaded_s: (f64, f64),
    lines: &[(String, f64, Vec<f64>)],
    caption: &str,
) -> Canvas {
    const HEIGHT: i64 = 420;
    let mut canvas = Canvas::new(WIDTH, HEIGHT as usize, [255, 255, 255]);
    canvas.text(MARGIN_LEFT, 15, title, 2, BLACK);
    let (top, bottom) = (TOP + 10, HEIGHT - 50);
    let plot_width = WIDTH as i64 - MARGIN_LEFT - MARGIN_RIGHT;
    let plot_height = bottom - top;
    let end_s = lines
        .iter()
        .map(|(_, step, values)| step * values.len() as f64)
        .fold(1.0, f64::max);
    let x_of = |s: f64| MARGIN_LEFT + (s / end_s * plot_width as f64) as i64;
    let y_of = |value: f64| bottom - (scale.position(value) * plot_height as f64) as i64;
    let (from, until) = shaded_s;
    canvas.fill(
        x_of(from),
        top,
        x_of(until) - x_of(from),
        plot_height,
        [235, 235, 235],
    );
    for (value, label) in scale.ticks() {
        canvas.fill(MARGIN_LEFT, y_of(value), plot_width, 1, GREY);
        canvas.text(12, y_of(value) - 3, &label, 1, BLACK);
    }
    let every_s = (end_s / 20.0).ceil().max(1.0) as i64;
    for second in (0..=end_s as i64).step_by(every_s as usize) {
        x_tick(
            &mut canvas,
            x_of(second as f64),
            bottom,
            &format!("{second}s"),
        );
    }
    canvas.fill(MARGIN_LEFT, bottom, plot_width, 1, BLACK);
    for (index, (name, step, values)) in lines.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        let mut last: Option<(i64, i64)> = None;
        for (i, value) in values.iter().enumerate() {
            let y = match (scale, last) {
                (YScale::LatencyUs, Some((_, y0))) if *value <= 0.0 => y0,
                (YScale::LatencyUs, None) if *value <= 0.0 => continue,
                _ => y_of(*value),
            };
            let point = (x_of((i as f64 + 0.5) * step), y);
            if let Some((x0, y0)) = last {
                // A step: across at the old level, then up or down.
                canvas.fill(x0, y0 - 1, point.0 - x0 + 1, 3, colour);
                let (low, high) = (y0.min(point.1), y0.max(point.1));
                canvas.fill(point.0 - 1, low - 1, 3, high - low + 3, colour);
            }
            last = Some(point);
        }
        let lx = WIDTH as i64 - MARGIN_RIGHT - 200;
        canvas.fill(lx, top + 10 + index as i64 * 14, 10, 10, colour);
        canvas.text(lx + 14, top + 11 + index as i64 * 14, name, 1, BLACK);
    }
    canvas.text(MARGIN_LEFT, HEIGHT - 20, caption, 1, BLACK);
    canvas
}

/// Groups of columns on a 0-1 share scale: each group (label, one value per
/// series), the series named in a legend, and a line across at
/// `mark` (a target share) when given.
pub fn share_columns(
    title: &str,
    series: &[&str],
    groups: &[(String, Vec<f64>)],
    mark: Option<f64>,
    caption: &str,
) -> Canvas {
    const HEIGHT: i64 = 420;
    let mut canvas = Canvas::new(WIDTH, HEIGHT as usize, [255, 255, 255]);
    canvas.text(MARGIN_LEFT, 15, title, 2, BLACK);
    let (top, bottom) = (TOP + 10, HEIGHT - 60);
    let plot_width = WIDTH as i64 - MARGIN_LEFT - MARGIN_RIGHT - 220;
    let plot_height = bottom - top;
    let y_of = |value: f64| bottom - (YScale::Share.position(value) * plot_height as f64) as i64;
    for (value, label) in YScale::Share.ticks() {
        canvas.fill(MARGIN_LEFT, y_of(value), plot_width, 1, GREY);
        canvas.text(12, y_of(value) - 3, &label, 1, BLACK);
    }
    let group_width = plot_width / groups.len().max(1) as i64;
    let bar_width = (group_width - 16) / series.len().max(1) as i64;
    for (g, (label, values)) in groups.iter().enumerate() {
        let left = MARGIN_LEFT + g as i64 * group_width + 8;
        for (s, value) in values.iter().enumerate() {
            let y = y_of(*value);
            let x = left + s as i64 * bar_width;
            canvas.fill(x, y, bar_width - 2, bottom - y, COLOURS[s % COLOURS.len()]);
            let text = format!("{value:.2}");
            let tx = x + (bar_width - 2 - Canvas::text_width(&text, 1)) / 2;
            canvas.text(tx, y - 10, &text, 1, BLACK);
        }
        let lx = left + (group_width - 16 - Canvas::text_width(label, 1)) / 2;
        canvas.text(lx, bottom + 10, label, 1, BLACK);
    }
    canvas.fill(MARGIN_LEFT, bottom, plot_width, 1, BLACK);
    if let Some(mark) = mark {
        canvas.fill(MARGIN_LEFT, y_of(mark) - 1, plot_width, 2, BLACK);
    }
    let lx = WIDTH as i64 - MARGIN_RIGHT - 200;
    for (s, name) in series.iter().enumerate() {
        canvas.fill(
            lx,
            top + 10 + s as i64 * 14,
            10,
            10,
            COLOURS[s % COLOURS.len()],
        );
        canvas.text(lx + 14, top + 11 + s as i64 * 14, name, 1, BLACK);
    }
    canvas.text(MARGIN_LEFT, HEIGHT - 20, caption, 1, BLACK);
    canvas
}

/// Points on a 0-1 share scale across and `scale` up, one colour per
/// series (name, points as (x, y)), with `caption` under the x axis.
pub fn scatter_plot(
    title: &str,
    scale: YScale,
    series: &[(String, Vec<(f64, f64)>)],
    caption: &str,
) -> Canvas {
    const HEIGHT: i64 = 420;
    let mut canvas = Canvas::new(WIDTH, HEIGHT as usize, [255, 255, 255]);
    canvas.text(MARGIN_LEFT, 15, title, 2, BLACK);
    let (top, bottom) = (TOP + 10, HEIGHT - 50);
    let plot_width = WIDTH as i64 - MARGIN_LEFT - MARGIN_RIGHT - 220;
    let plot_height = bottom - top;
    let x_of = |share: f64| MARGIN_LEFT + (share.clamp(0.0, 1.0) * plot_width as f64) as i64;
    let y_of = |value: f64| bottom - (scale.position(value) * plot_height as f64) as i64;
    for (value, label) in scale.ticks() {
        canvas.fill(MARGIN_LEFT, y_of(value), plot_width, 1, GREY);
        canvas.text(12, y_of(value) - 3, &label, 1, BLACK);
    }
    for tenth in 0..=10 {
        let share = f64::from(tenth) / 10.0;
        x_tick(&mut canvas, x_of(share), bottom, &format!("{share:.1}"));
    }
    canvas.fill(MARGIN_LEFT, bottom, plot_width, 1, BLACK);
    for (index, (name, points)) in series.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        for (x, y) in points {
            canvas.fill(x_of(*x) - 2, y_of(*y) - 2, 5, 5, colour);
        }
        let lx = WIDTH as i64 - MARGIN_RIGHT - 200;
        canvas.fill(lx, top + 10 + index as i64 * 14, 10, 10, colour);
        canvas.text(lx + 14, top + 11 + index as i64 * 14, name, 1, BLACK);
    }
    canvas.text(MARGIN_LEFT, HEIGHT - 20, caption, 1, BLACK);
    canvas
}
