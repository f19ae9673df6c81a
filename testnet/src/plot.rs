//! Dependency-lean PNG line charts for experiment results.
//!
//! Pure Rust: lines are rasterised here (Bresenham, 2 px wide, optionally dashed), text uses a
//! built-in 5×7 bitmap font (printable ASCII), and the image is encoded with the `png` crate.
//! No system fonts, no network. Axes may be linear or logarithmic (base 10); ticks are "nice"
//! numbers (1, 2, 5 × 10^k on linear axes, decades on log axes).
//!
//! Input is validated before anything is written: a chart without series, a series without a
//! finite point, or a non-positive value on a log axis is a [`PlotError`] and leaves no file.
//! Non-finite points (NaN, ±∞) are skipped.

use std::path::Path;

/// One line of a chart, drawn in the order of its points.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Dashed instead of solid (e.g. for a bound next to a measurement).
    pub dashed: bool,
}

/// A line chart; series get the colours of a fixed palette in order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub log_x: bool,
    pub log_y: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("writing the chart: {0}")]
    Io(#[from] std::io::Error),
    #[error("encoding the chart as PNG: {0}")]
    Encoding(#[from] png::EncodingError),
    #[error("the chart has no series")]
    NoSeries,
    #[error("series {series:?} has no finite point")]
    EmptySeries { series: String },
    #[error("series {series:?} has {axis} = {value} on a logarithmic {axis} axis (must be > 0)")]
    NonPositiveOnLogAxis {
        series: String,
        axis: char,
        value: f64,
    },
    #[error("image size {width}x{height} leaves no room for the plot or exceeds {MAX_SIDE} px")]
    InvalidSize { width: u32, height: u32 },
}

/// Largest accepted image side, which bounds the pixel buffer.
const MAX_SIDE: u32 = 16_384;

/// Renders `chart` into a `width` × `height` RGB PNG at `path`.
pub fn write_png(chart: &Chart, path: &Path, width: u32, height: u32) -> Result<(), PlotError> {
    let (canvas, _) = render(chart, width, height)?;
    let mut bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut bytes, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header()?;
        writer.write_image_data(&canvas.buf)?;
        writer.finish()?;
    }
    std::fs::write(path, bytes)?;
    Ok(())
}

type Rgb = [u8; 3];

const WHITE: Rgb = [255, 255, 255];
const BLACK: Rgb = [0, 0, 0];
const GRID: Rgb = [222, 222, 222];
const MINOR_GRID: Rgb = [242, 242, 242];
const LEGEND_BORDER: Rgb = [160, 160, 160];

/// Series colours (Tableau 10), reused cyclically past the tenth series.
const PALETTE: [Rgb; 10] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [127, 127, 127],
    [188, 189, 34],
    [23, 190, 207],
];

fn colour(i: usize) -> Rgb {
    PALETTE[i % PALETTE.len()]
}

/// Validates the chart, lays it out and draws it.
fn render(chart: &Chart, width: u32, height: u32) -> Result<(Canvas, Frame), PlotError> {
    let invalid_size = PlotError::InvalidSize { width, height };
    if width > MAX_SIDE || height > MAX_SIDE || width < 64 || height < 48 {
        return Err(invalid_size);
    }
    if chart.series.is_empty() {
        return Err(PlotError::NoSeries);
    }
    let finite: Vec<Vec<(f64, f64)>> = chart
        .series
        .iter()
        .map(|s| {
            s.points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect()
        })
        .collect();
    let (mut x_min, mut x_max) = (f64::INFINITY, f64::NEG_INFINITY);
    let (mut y_min, mut y_max) = (f64::INFINITY, f64::NEG_INFINITY);
    for (s, pts) in chart.series.iter().zip(&finite) {
        if pts.is_empty() {
            return Err(PlotError::EmptySeries {
                series: s.name.clone(),
            });
        }
        for &(x, y) in pts {
            for (log, axis, value) in [(chart.log_x, 'x', x), (chart.log_y, 'y', y)] {
                if log && value <= 0.0 {
                    return Err(PlotError::NonPositiveOnLogAxis {
                        series: s.name.clone(),
                        axis,
                        value,
                    });
                }
            }
            x_min = x_min.min(x);
            x_max = x_max.max(x);
            y_min = y_min.min(y);
            y_max = y_max.max(y);
        }
    }
    let x_axis = Axis::new(x_min, x_max, chart.log_x);
    let y_axis = Axis::new(y_min, y_max, chart.log_y);

    // Layout, in pixels; `s` scales text and decorations with the image.
    let (w, h) = (i64::from(width), i64::from(height));
    let s = (w.min(h) / 300).clamp(1, 4);
    let pad = 5 * s;
    let tick_len = 3 * s;
    let glyph_h = GLYPH_ROWS * s;
    // The largest title scale (up to one above the text's) that fits; else the smallest.
    let title_scale = (1..=s + 1)
        .rev()
        .find(|&k| text_width(&chart.title, k) <= w - 2 * pad)
        .unwrap_or(1);
    let y_label_w = y_axis
        .major
        .iter()
        .map(|(_, l)| text_width(l, s))
        .max()
        .unwrap_or(0);
    let last_x_label_w = x_axis.major.last().map_or(0, |(_, l)| text_width(l, s));
    let top =
        pad + if chart.title.is_empty() {
            0
        } else {
            GLYPH_ROWS * title_scale + pad
        } + s;
    let left =
        pad + if chart.y_label.is_empty() {
            0
        } else {
            glyph_h + pad
        } + y_label_w
            + 2 * s
            + tick_len;
    let bottom = h
        - (pad
            + if chart.x_label.is_empty() {
                0
            } else {
                glyph_h + pad
            }
            + glyph_h
            + 2 * s
            + tick_len);
    let right = w - (pad + (last_x_label_w / 2).max(2 * s));
    if right - left < 40 || bottom - top < 30 {
        return Err(invalid_size);
    }
    let frame = Frame {
        left: left as f64,
        top: top as f64,
        right: right as f64,
        bottom: bottom as f64,
        x: x_axis,
        y: y_axis,
    };

    let mut c = Canvas::new(width, height);
    // Grid, frame, ticks and tick labels.
    for &v in &frame.x.minor {
        let px = frame.px_x(v).round() as i64;
        c.rect(px, top, 1, bottom - top, MINOR_GRID);
    }
    for &v in &frame.y.minor {
        let py = frame.px_y(v).round() as i64;
        c.rect(left, py, right - left, 1, MINOR_GRID);
    }
    for (v, _) in &frame.x.major {
        let px = frame.px_x(*v).round() as i64;
        c.rect(px, top, 1, bottom - top, GRID);
    }
    for (v, _) in &frame.y.major {
        let py = frame.px_y(*v).round() as i64;
        c.rect(left, py, right - left, 1, GRID);
    }
    c.rect(left, top, right - left + 1, 1, BLACK);
    c.rect(left, bottom, right - left + 1, 1, BLACK);
    c.rect(left, top, 1, bottom - top + 1, BLACK);
    c.rect(right, top, 1, bottom - top + 1, BLACK);
    for &v in &frame.x.minor {
        let px = frame.px_x(v).round() as i64;
        c.rect(px, bottom + 1, 1, tick_len / 2, BLACK);
    }
    for &v in &frame.y.minor {
        let py = frame.px_y(v).round() as i64;
        c.rect(left - tick_len / 2, py, tick_len / 2, 1, BLACK);
    }
    let mut next_free = i64::MIN; // x labels: skip one that would touch the previous one
    for (v, label) in &frame.x.major {
        let px = frame.px_x(*v).round() as i64;
        c.rect(px, bottom + 1, 1, tick_len, BLACK);
        let lw = text_width(label, s);
        let lx = px - lw / 2;
        if lx >= next_free {
            c.text(lx, bottom + tick_len + 2 * s, label, s, BLACK);
            next_free = lx + lw + 3 * s;
        }
    }
    let mut next_free = i64::MAX; // y labels, bottom to top
    for (v, label) in &frame.y.major {
        let py = frame.px_y(*v).round() as i64;
        c.rect(left - tick_len, py, tick_len, 1, BLACK);
        let ly = py - glyph_h / 2;
        if ly + glyph_h <= next_free {
            let lx = left - tick_len - 2 * s - text_width(label, s);
            c.text(lx, ly, label, s, BLACK);
            next_free = ly - 2 * s;
        }
    }
    // Axis labels and title.
    let plot_mid_x = (left + right) / 2;
    if !chart.x_label.is_empty() {
        let lx = plot_mid_x - text_width(&chart.x_label, s) / 2;
        c.text(lx, h - pad - glyph_h, &chart.x_label, s, BLACK);
    }
    if !chart.y_label.is_empty() {
        let base = (top + bottom) / 2 + text_width(&chart.y_label, s) / 2;
        c.text_up(pad, base, &chart.y_label, s, BLACK);
    }
    if !chart.title.is_empty() {
        let tx = (w - text_width(&chart.title, title_scale)) / 2;
        c.text(tx.max(pad), pad, &chart.title, title_scale, BLACK);
    }

    // Series, clipped to the plot area.
    let pixels: Vec<Vec<(f64, f64)>> = finite
        .iter()
        .map(|pts| pts.iter().map(|&p| frame.px(p)).collect())
        .collect();
    let dash = (5.0 * s as f64, 3.0 * s as f64);
    c.clip = [left, top, right + 1, bottom + 1];
    for (i, (series, pts)) in chart.series.iter().zip(&pixels).enumerate() {
        let mut phase = 0.0;
        for seg in pts.windows(2) {
            c.line(
                seg[0],
                seg[1],
                colour(i),
                series.dashed.then_some(dash),
                &mut phase,
            );
        }
    }
    for (i, (series, pts)) in chart.series.iter().zip(&pixels).enumerate() {
        for &p in pts {
            c.marker(p, s, colour(i), series.dashed);
        }
    }
    c.clip = [0, 0, w, h];

    // Legend, in the plot corner that hides the fewest data.
    let row_h = glyph_h + 3 * s;
    let sample_len = 14 * s;
    let names_w = chart
        .series
        .iter()
        .map(|x| text_width(&x.name, s))
        .max()
        .unwrap_or(0);
    let box_w = (3 * s + sample_len + 3 * s + names_w + 3 * s).min(right - left - 4 * s);
    let box_h = 2 * s + row_h * chart.series.len() as i64;
    let inset = 3 * s;
    let corners = [
        (left + inset, top + inset),
        (right - inset - box_w, top + inset),
        (right - inset - box_w, bottom - inset - box_h),
        (left + inset, bottom - inset - box_h),
    ];
    let hidden = |&(bx, by): &(i64, i64)| {
        let inside = |(x, y): (f64, f64)| {
            x >= (bx - s) as f64
                && x <= (bx + box_w + s) as f64
                && y >= (by - s) as f64
                && y <= (by + box_h + s) as f64
        };
        let mut n = 0usize;
        for pts in &pixels {
            n += pts.iter().filter(|&&p| inside(p)).count() * 4;
            for seg in pts.windows(2) {
                n += (1..16)
                    .map(|k| lerp(seg[0], seg[1], k as f64 / 16.0))
                    .filter(|&p| inside(p))
                    .count();
            }
        }
        n
    };
    let (bx, by) = corners
        .iter()
        .copied()
        .min_by_key(|c| hidden(c))
        .unwrap_or(corners[0]);
    c.rect(bx, by, box_w, box_h, WHITE);
    c.rect(bx, by, box_w, 1, LEGEND_BORDER);
    c.rect(bx, by + box_h - 1, box_w, 1, LEGEND_BORDER);
    c.rect(bx, by, 1, box_h, LEGEND_BORDER);
    c.rect(bx + box_w - 1, by, 1, box_h, LEGEND_BORDER);
    c.clip = [bx + 1, by + 1, bx + box_w - 1, by + box_h - 1];
    for (i, series) in chart.series.iter().enumerate() {
        let row_top = by + 2 * s + row_h * i as i64;
        let yc = (row_top + glyph_h / 2) as f64;
        let x0 = (bx + 3 * s) as f64;
        let x1 = x0 + sample_len as f64;
        c.line(
            (x0, yc),
            (x1, yc),
            colour(i),
            series.dashed.then_some(dash),
            &mut 0.0,
        );
        c.marker(((x0 + x1) / 2.0, yc), s, colour(i), series.dashed);
        c.text(bx + 6 * s + sample_len, row_top, &series.name, s, BLACK);
    }
    c.clip = [0, 0, w, h];
    Ok((c, frame))
}

fn lerp(a: (f64, f64), b: (f64, f64), t: f64) -> (f64, f64) {
    (a.0 + (b.0 - a.0) * t, a.1 + (b.1 - a.1) * t)
}

/// The plot area and how data map onto it.
struct Frame {
    left: f64,
    top: f64,
    right: f64,
    bottom: f64,
    x: Axis,
    y: Axis,
}

impl Frame {
    fn px_x(&self, x: f64) -> f64 {
        self.left + self.x.frac(x) * (self.right - self.left)
    }

    fn px_y(&self, y: f64) -> f64 {
        self.bottom - self.y.frac(y) * (self.bottom - self.top)
    }

    fn px(&self, (x, y): (f64, f64)) -> (f64, f64) {
        (self.px_x(x), self.px_y(y))
    }
}

/// One axis: its range in transformed space (`log10` of the data on a log axis) and its ticks
/// in data space, labelled (major) or not (minor).
#[derive(Debug)]
struct Axis {
    log: bool,
    lo: f64,
    hi: f64,
    major: Vec<(f64, String)>,
    minor: Vec<f64>,
}

impl Axis {
    /// An axis covering `[min, max]` (finite, and > 0 on a log axis).
    fn new(min: f64, max: f64, log: bool) -> Axis {
        if log {
            Axis::log(min, max)
        } else {
            let (lo, hi, step) = nice_range(min, max, 5);
            let n = ((hi - lo) / step).round() as i64;
            let first = (lo / step).round() as i64;
            let major = (0..=n)
                .map(|k| {
                    let v = (first + k) as f64 * step;
                    (v, format_tick(v))
                })
                .collect();
            Axis {
                log: false,
                lo,
                hi,
                major,
                minor: Vec::new(),
            }
        }
    }

    fn log(min: f64, max: f64) -> Axis {
        let (mut lmin, mut lmax) = (min.log10(), max.log10());
        if lmax - lmin < 1e-9 {
            lmin -= 0.5;
            lmax += 0.5;
        }
        let pad = 0.04 * (lmax - lmin);
        let (lo, hi) = (lmin - pad, lmax + pad);
        let within = |v: f64| (lo - 1e-9..=hi + 1e-9).contains(&v.log10());
        let multiples = |ms: &[f64]| -> Vec<f64> {
            let mut v: Vec<f64> = (lo.floor() as i32..=hi.ceil() as i32)
                .flat_map(|d| ms.iter().map(move |m| m * 10f64.powi(d)))
                .filter(|&v| within(v))
                .collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let decades = multiples(&[1.0]);
        let one_two_five = multiples(&[1.0, 2.0, 5.0]);
        let all = multiples(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
        let (major, minor): (Vec<f64>, Vec<f64>) = if decades.len() >= 3 {
            let stride = decades.len().div_ceil(7);
            let major: Vec<f64> = decades.iter().copied().step_by(stride).collect();
            let minor = if hi - lo <= 6.0 {
                all.into_iter().filter(|v| !major.contains(v)).collect()
            } else {
                Vec::new()
            };
            (major, minor)
        } else if one_two_five.len() >= 3 {
            let minor = all
                .into_iter()
                .filter(|v| !one_two_five.contains(v))
                .collect();
            (one_two_five, minor)
        } else if all.len() >= 3 {
            (all, Vec::new())
        } else {
            // Less than a factor of ~3: plain linear ticks read best.
            let (a, b) = (10f64.powf(lo), 10f64.powf(hi));
            let (nlo, _, step) = nice_range(a, b, 4);
            let ticks = (0..)
                .map(|k| nlo + k as f64 * step)
                .take_while(|&v| v <= b)
                .filter(|&v| v >= a && v > 0.0)
                .collect();
            (ticks, Vec::new())
        };
        Axis {
            log: true,
            lo,
            hi,
            major: major.into_iter().map(|v| (v, format_tick(v))).collect(),
            minor,
        }
    }

    /// Position of data value `v` along the axis, 0 at `lo` and 1 at `hi`.
    fn frac(&self, v: f64) -> f64 {
        let t = if self.log { v.log10() } else { v };
        (t - self.lo) / (self.hi - self.lo)
    }
}

/// A range covering `[min, max]` whose ends are multiples of a 1/2/5 × 10^k step giving about
/// `target` intervals; returns `(lo, hi, step)`.
fn nice_range(min: f64, max: f64, target: usize) -> (f64, f64, f64) {
    let (mut min, mut max) = (min, max);
    if max - min <= f64::EPSILON * max.abs().max(min.abs()).max(1e-300) {
        let d = if min == 0.0 { 1.0 } else { min.abs() * 0.5 };
        min -= d;
        max += d;
    }
    let raw = (max - min) / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let nice = if norm < 1.5 {
        1.0
    } else if norm < 3.0 {
        2.0
    } else if norm < 7.0 {
        5.0
    } else {
        10.0
    };
    let step = nice * mag;
    (
        (min / step).floor() * step,
        (max / step).ceil() * step,
        step,
    )
}

/// A tick label: plain decimals with up to five significant digits from 0.001 to 99 999,
/// scientific notation (`1e-4`, `2.5e6`) outside that range.
fn format_tick(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v.is_finite() {
            "0".into()
        } else {
            v.to_string()
        };
    }
    let a = v.abs();
    if (1e-3..1e5).contains(&a) {
        let decimals = (4 - a.log10().floor() as i32).clamp(0, 7) as usize;
        let s = format!("{v:.decimals$}");
        let s = if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        };
        if s == "-0" {
            "0".into()
        } else {
            s
        }
    } else {
        let s = format!("{v:.3e}");
        match s.split_once('e') {
            Some((mantissa, exp)) if mantissa.contains('.') => format!(
                "{}e{exp}",
                mantissa.trim_end_matches('0').trim_end_matches('.')
            ),
            _ => s,
        }
    }
}

/// An RGB pixel buffer with a clip rectangle.
struct Canvas {
    w: i64,
    h: i64,
    buf: Vec<u8>,
    /// `[x0, y0, x1, y1)`: pixels outside are not touched.
    clip: [i64; 4],
}

impl Canvas {
    fn new(width: u32, height: u32) -> Canvas {
        let (w, h) = (i64::from(width), i64::from(height));
        Canvas {
            w,
            h,
            buf: vec![255; (width as usize) * (height as usize) * 3],
            clip: [0, 0, w, h],
        }
    }

    fn set(&mut self, x: i64, y: i64, c: Rgb) {
        let [x0, y0, x1, y1] = self.clip;
        if x >= x0.max(0) && x < x1.min(self.w) && y >= y0.max(0) && y < y1.min(self.h) {
            let i = ((y * self.w + x) * 3) as usize;
            self.buf[i..i + 3].copy_from_slice(&c);
        }
    }

    fn rect(&mut self, x: i64, y: i64, w: i64, h: i64, c: Rgb) {
        for yy in y.max(-1)..(y + h).min(self.h + 1) {
            for xx in x.max(-1)..(x + w).min(self.w + 1) {
                self.set(xx, yy, c);
            }
        }
    }

    /// A 2 px wide Bresenham line; `dash` is `(on, off)` in pixels along the line and `phase`
    /// carries the pattern across the segments of a polyline.
    fn line(
        &mut self,
        a: (f64, f64),
        b: (f64, f64),
        c: Rgb,
        dash: Option<(f64, f64)>,
        phase: &mut f64,
    ) {
        // Endpoints far outside the image would only cost time: clamp them (this bends
        // nothing inside the image for the data ranges that reach `render`).
        let lim = |v: f64, n: i64| v.clamp(-4.0 * n as f64, 5.0 * n as f64).round() as i64;
        let (mut x, mut y) = (lim(a.0, self.w), lim(a.1, self.h));
        let (x1, y1) = (lim(b.0, self.w), lim(b.1, self.h));
        let (dx, dy) = ((x1 - x).abs(), -(y1 - y).abs());
        let (sx, sy) = (if x < x1 { 1 } else { -1 }, if y < y1 { 1 } else { -1 });
        let steps = dx.max(-dy).max(1);
        let step_len = ((dx * dx + dy * dy) as f64).sqrt() / steps as f64;
        let x_major = dx >= -dy;
        let mut err = dx + dy;
        loop {
            let on = dash.is_none_or(|(on, off)| phase.rem_euclid(on + off) < on);
            if on {
                for o in 0..2 {
                    if x_major {
                        self.set(x, y + o, c);
                    } else {
                        self.set(x + o, y, c);
                    }
                }
            }
            if x == x1 && y == y1 {
                break;
            }
            *phase += step_len;
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// A data-point marker: a filled square, or a hollow one for dashed series.
    fn marker(&mut self, (x, y): (f64, f64), s: i64, c: Rgb, hollow: bool) {
        let (x, y) = (x.round() as i64, y.round() as i64);
        if hollow {
            let r = s + 1;
            let d = 2 * r + 1;
            self.rect(x - r, y - r, d, 1, c);
            self.rect(x - r, y + r, d, 1, c);
            self.rect(x - r, y - r, 1, d, c);
            self.rect(x + r, y - r, 1, d, c);
        } else {
            self.rect(x - s, y - s, 2 * s + 1, 2 * s + 1, c);
        }
    }

    /// Left-to-right text with its top-left corner at `(x, y)`.
    fn text(&mut self, x: i64, y: i64, text: &str, scale: i64, c: Rgb) {
        for (i, ch) in text.chars().enumerate() {
            let gx = x + i as i64 * GLYPH_ADVANCE * scale;
            for (col, bits) in glyph(ch).iter().enumerate() {
                for row in 0..GLYPH_ROWS {
                    if (bits >> row) & 1 == 1 {
                        self.rect(gx + col as i64 * scale, y + row * scale, scale, scale, c);
                    }
                }
            }
        }
    }

    /// Bottom-to-top text (rotated 90° counter-clockwise) whose glyph tops face left, with
    /// the bottom-left corner of its first glyph at `(x, base)`.
    fn text_up(&mut self, x: i64, base: i64, text: &str, scale: i64, c: Rgb) {
        for (i, ch) in text.chars().enumerate() {
            let gy = base - i as i64 * GLYPH_ADVANCE * scale;
            for (col, bits) in glyph(ch).iter().enumerate() {
                for row in 0..GLYPH_ROWS {
                    if (bits >> row) & 1 == 1 {
                        let py = gy - (col as i64 + 1) * scale;
                        self.rect(x + row * scale, py, scale, scale, c);
                    }
                }
            }
        }
    }
}

const GLYPH_ROWS: i64 = 7;
/// Five columns plus one blank.
const GLYPH_ADVANCE: i64 = 6;

/// Width in pixels of `text` at `scale` (no trailing blank column).
fn text_width(text: &str, scale: i64) -> i64 {
    let n = text.chars().count() as i64;
    (n * GLYPH_ADVANCE - 1).max(0) * scale
}

/// The glyph of `ch`; characters outside printable ASCII show as `?`.
fn glyph(ch: char) -> &'static [u8; 5] {
    let i = match ch {
        ' '..='~' => ch as usize - ' ' as usize,
        _ => '?' as usize - ' ' as usize,
    };
    &FONT[i]
}

/// 5×7 glyphs for ASCII 32..=126, one byte per column (left to right), bit 0 = top row.
#[rustfmt::skip]
const FONT: [[u8; 5]; 95] = [
    [0x00, 0x00, 0x00, 0x00, 0x00], [0x00, 0x00, 0x5F, 0x00, 0x00], // space !
    [0x00, 0x07, 0x00, 0x07, 0x00], [0x14, 0x7F, 0x14, 0x7F, 0x14], // " #
    [0x24, 0x2A, 0x7F, 0x2A, 0x12], [0x23, 0x13, 0x08, 0x64, 0x62], // $ %
    [0x36, 0x49, 0x55, 0x22, 0x50], [0x00, 0x05, 0x03, 0x00, 0x00], // & '
    [0x00, 0x1C, 0x22, 0x41, 0x00], [0x00, 0x41, 0x22, 0x1C, 0x00], // ( )
    [0x14, 0x08, 0x3E, 0x08, 0x14], [0x08, 0x08, 0x3E, 0x08, 0x08], // * +
    [0x00, 0x50, 0x30, 0x00, 0x00], [0x08, 0x08, 0x08, 0x08, 0x08], // , -
    [0x00, 0x60, 0x60, 0x00, 0x00], [0x20, 0x10, 0x08, 0x04, 0x02], // . /
    [0x3E, 0x51, 0x49, 0x45, 0x3E], [0x00, 0x42, 0x7F, 0x40, 0x00], // 0 1
    [0x42, 0x61, 0x51, 0x49, 0x46], [0x21, 0x41, 0x45, 0x4B, 0x31], // 2 3
    [0x18, 0x14, 0x12, 0x7F, 0x10], [0x27, 0x45, 0x45, 0x45, 0x39], // 4 5
    [0x3C, 0x4A, 0x49, 0x49, 0x30], [0x01, 0x71, 0x09, 0x05, 0x03], // 6 7
    [0x36, 0x49, 0x49, 0x49, 0x36], [0x06, 0x49, 0x49, 0x29, 0x1E], // 8 9
    [0x00, 0x36, 0x36, 0x00, 0x00], [0x00, 0x56, 0x36, 0x00, 0x00], // : ;
    [0x08, 0x14, 0x22, 0x41, 0x00], [0x14, 0x14, 0x14, 0x14, 0x14], // < =
    [0x00, 0x41, 0x22, 0x14, 0x08], [0x02, 0x01, 0x51, 0x09, 0x06], // > ?
    [0x32, 0x49, 0x79, 0x41, 0x3E], [0x7E, 0x11, 0x11, 0x11, 0x7E], // @ A
    [0x7F, 0x49, 0x49, 0x49, 0x36], [0x3E, 0x41, 0x41, 0x41, 0x22], // B C
    [0x7F, 0x41, 0x41, 0x22, 0x1C], [0x7F, 0x49, 0x49, 0x49, 0x41], // D E
    [0x7F, 0x09, 0x09, 0x09, 0x01], [0x3E, 0x41, 0x49, 0x49, 0x7A], // F G
    [0x7F, 0x08, 0x08, 0x08, 0x7F], [0x00, 0x41, 0x7F, 0x41, 0x00], // H I
    [0x20, 0x40, 0x41, 0x3F, 0x01], [0x7F, 0x08, 0x14, 0x22, 0x41], // J K
    [0x7F, 0x40, 0x40, 0x40, 0x40], [0x7F, 0x02, 0x0C, 0x02, 0x7F], // L M
    [0x7F, 0x04, 0x08, 0x10, 0x7F], [0x3E, 0x41, 0x41, 0x41, 0x3E], // N O
    [0x7F, 0x09, 0x09, 0x09, 0x06], [0x3E, 0x41, 0x51, 0x21, 0x5E], // P Q
    [0x7F, 0x09, 0x19, 0x29, 0x46], [0x46, 0x49, 0x49, 0x49, 0x31], // R S
    [0x01, 0x01, 0x7F, 0x01, 0x01], [0x3F, 0x40, 0x40, 0x40, 0x3F], // T U
    [0x1F, 0x20, 0x40, 0x20, 0x1F], [0x3F, 0x40, 0x38, 0x40, 0x3F], // V W
    [0x63, 0x14, 0x08, 0x14, 0x63], [0x07, 0x08, 0x70, 0x08, 0x07], // X Y
    [0x61, 0x51, 0x49, 0x45, 0x43], [0x00, 0x7F, 0x41, 0x41, 0x00], // Z [
    [0x02, 0x04, 0x08, 0x10, 0x20], [0x00, 0x41, 0x41, 0x7F, 0x00], // \ ]
    [0x04, 0x02, 0x01, 0x02, 0x04], [0x40, 0x40, 0x40, 0x40, 0x40], // ^ _
    [0x00, 0x01, 0x02, 0x04, 0x00], [0x20, 0x54, 0x54, 0x54, 0x78], // ` a
    [0x7F, 0x48, 0x44, 0x44, 0x38], [0x38, 0x44, 0x44, 0x44, 0x20], // b c
    [0x38, 0x44, 0x44, 0x48, 0x7F], [0x38, 0x54, 0x54, 0x54, 0x18], // d e
    [0x08, 0x7E, 0x09, 0x01, 0x02], [0x0C, 0x52, 0x52, 0x52, 0x3E], // f g
    [0x7F, 0x08, 0x04, 0x04, 0x78], [0x00, 0x44, 0x7D, 0x40, 0x00], // h i
    [0x20, 0x40, 0x44, 0x3D, 0x00], [0x7F, 0x10, 0x28, 0x44, 0x00], // j k
    [0x00, 0x41, 0x7F, 0x40, 0x00], [0x7C, 0x04, 0x18, 0x04, 0x78], // l m
    [0x7C, 0x08, 0x04, 0x04, 0x78], [0x38, 0x44, 0x44, 0x44, 0x38], // n o
    [0x7C, 0x14, 0x14, 0x14, 0x08], [0x08, 0x14, 0x14, 0x18, 0x7C], // p q
    [0x7C, 0x08, 0x04, 0x04, 0x08], [0x48, 0x54, 0x54, 0x54, 0x20], // r s
    [0x04, 0x3F, 0x44, 0x40, 0x20], [0x3C, 0x40, 0x40, 0x20, 0x7C], // t u
    [0x1C, 0x20, 0x40, 0x20, 0x1C], [0x3C, 0x40, 0x30, 0x40, 0x3C], // v w
    [0x44, 0x28, 0x10, 0x28, 0x44], [0x0C, 0x50, 0x50, 0x50, 0x3C], // x y
    [0x44, 0x64, 0x54, 0x4C, 0x44], [0x00, 0x08, 0x36, 0x41, 0x00], // z {
    [0x00, 0x00, 0x7F, 0x00, 0x00], [0x00, 0x41, 0x36, 0x08, 0x00], // | }
    [0x08, 0x04, 0x08, 0x10, 0x08],                                 // ~
];

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, points: &[(f64, f64)], dashed: bool) -> Series {
        Series {
            name: name.into(),
            points: points.to_vec(),
            dashed,
        }
    }

    fn decode(path: &Path) -> (u32, u32, Vec<u8>) {
        let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!(info.color_type, png::ColorType::Rgb);
        assert_eq!(info.bit_depth, png::BitDepth::Eight);
        buf.truncate(info.buffer_size());
        (info.width, info.height, buf)
    }

    fn count(buf: &[u8], c: Rgb) -> usize {
        buf.chunks_exact(3).filter(|p| *p == c).count()
    }

    fn broadcast_like() -> Chart {
        let ns = [4.0, 16.0, 64.0, 256.0, 1000.0];
        Chart {
            title: "T_bcast vs N (c = 1 MB, 100%)".into(),
            x_label: "N (workers)".into(),
            y_label: "T_bcast (s)".into(),
            series: vec![
                series("chain", &ns.map(|n| (n, 5.0 + n / 30.0)), false),
                series("star", &ns.map(|n| (n, 1.7 * n)), false),
                series("chain bound", &ns.map(|n| (n, 4.0 + n / 30.0)), true),
                series("star bound", &ns.map(|n| (n, 2.5 * n)), true),
            ],
            log_x: true,
            log_y: true,
        }
    }

    #[test]
    fn a_chart_decodes_to_the_requested_size_with_every_series_colour() {
        let dir = tempfile::tempdir().unwrap();
        let mut linear = broadcast_like();
        linear.log_x = false;
        linear.log_y = false;
        for (chart, (w, h)) in [(broadcast_like(), (900, 600)), (linear, (333, 250))] {
            let path = dir.path().join(format!("c{w}.png"));
            write_png(&chart, &path, w, h).unwrap();
            let (dw, dh, buf) = decode(&path);
            assert_eq!((dw, dh), (w, h));
            assert_eq!(buf.len(), (w * h * 3) as usize);
            assert!(
                count(&buf, WHITE) > buf.len() / 3 / 2,
                "mostly white background"
            );
            assert!(count(&buf, BLACK) > 500, "axes and text");
            for i in 0..chart.series.len() {
                // Far more than the legend sample and marker alone.
                let n = count(&buf, colour(i));
                assert!(n > 150, "series {i} has {n} pixels of its colour");
            }
        }
    }

    #[test]
    fn data_points_land_inside_the_frame_in_their_series_colour() {
        let chart = broadcast_like();
        let (canvas, frame) = render(&chart, 900, 600).unwrap();
        for (i, s) in chart.series.iter().enumerate() {
            let mut hits = 0;
            for &p in &s.points {
                let (x, y) = frame.px(p);
                assert!((frame.left..=frame.right).contains(&x), "{p:?}");
                assert!((frame.top..=frame.bottom).contains(&y), "{p:?}");
                // The marker (hollow for dashed series) lies within 3 px of the point.
                let (x, y) = (x.round() as i64, y.round() as i64);
                let near = (-3..=3).flat_map(|dy| (-3..=3).map(move |dx| (x + dx, y + dy)));
                let seen = near.into_iter().any(|(x, y)| {
                    let idx = ((y * canvas.w + x) * 3) as usize;
                    canvas.buf[idx..idx + 3] == colour(i)
                });
                hits += usize::from(seen);
            }
            assert!(hits >= 4, "series {i}: {hits} of 5 points visible");
        }
        assert!(frame.x.log && frame.y.log);
        let labels: Vec<&str> = frame.x.major.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(labels, ["10", "100", "1000"]);
    }

    #[test]
    fn invalid_input_is_a_typed_error_and_writes_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.png");
        let check = |chart: &Chart, w: u32, h: u32| {
            let err = write_png(chart, &path, w, h).unwrap_err();
            assert!(!path.exists(), "{err}");
            err
        };
        let empty = Chart::default();
        assert!(matches!(check(&empty, 400, 300), PlotError::NoSeries));

        let mut chart = broadcast_like();
        chart.series[1].points.clear();
        let err = check(&chart, 400, 300);
        assert!(matches!(&err, PlotError::EmptySeries { series } if series == "star"));

        let mut chart = broadcast_like();
        chart.series[2].points = vec![(f64::NAN, 1.0), (2.0, f64::INFINITY)];
        let err = check(&chart, 400, 300);
        assert!(matches!(&err, PlotError::EmptySeries { series } if series == "chain bound"));

        let mut chart = broadcast_like();
        chart.series[0].points.push((0.0, 3.0));
        let err = check(&chart, 400, 300);
        assert!(
            matches!(&err, PlotError::NonPositiveOnLogAxis { axis: 'x', value, .. } if *value == 0.0),
            "{err}"
        );
        chart.log_x = false;
        chart.series[3].points[2].1 = -1.0;
        let err = check(&chart, 400, 300);
        assert!(matches!(
            &err,
            PlotError::NonPositiveOnLogAxis { axis: 'y', .. }
        ));
        chart.log_y = false;
        write_png(&chart, &path, 400, 300).unwrap(); // the same data on linear axes is fine
        std::fs::remove_file(&path).unwrap();

        for (w, h) in [(0, 300), (400, 10), (20_000, 300)] {
            let err = check(&broadcast_like(), w, h);
            assert!(matches!(err, PlotError::InvalidSize { .. }), "{w}x{h}");
        }
        let missing_dir = dir.path().join("no/such/dir/c.png");
        let err = write_png(&broadcast_like(), &missing_dir, 400, 300).unwrap_err();
        assert!(matches!(err, PlotError::Io(_)));
    }

    #[test]
    fn non_finite_points_are_skipped() {
        let chart = Chart {
            series: vec![series(
                "s",
                &[
                    (1.0, 1.0),
                    (f64::NAN, 2.0),
                    (2.0, f64::NEG_INFINITY),
                    (3.0, 3.0),
                ],
                false,
            )],
            ..Chart::default()
        };
        let (_, frame) = render(&chart, 400, 300).unwrap();
        assert!(frame.x.lo <= 1.0 && frame.x.hi >= 3.0 && frame.x.hi < 10.0);
        assert!(frame.y.lo <= 1.0 && frame.y.hi >= 3.0 && frame.y.hi < 10.0);
    }

    #[test]
    fn tick_labels_are_formatted_sensibly() {
        let cases = [
            (0.0, "0"),
            (-0.0, "0"),
            (0.5, "0.5"),
            (1.0, "1"),
            (-2.0, "-2"),
            (2.5, "2.5"),
            (0.1 + 0.2, "0.3"),
            (1000.0, "1000"),
            (12_000.0, "12000"),
            (1e-3, "0.001"),
            (1e-4, "1e-4"),
            (2.5e6, "2.5e6"),
            (1e5, "1e5"),
            (-3e-7, "-3e-7"),
        ];
        for (v, want) in cases {
            assert_eq!(format_tick(v), want, "{v}");
        }
    }

    #[test]
    fn ticks_are_nice_numbers() {
        let a = Axis::new(0.0, 9.3, false);
        let v: Vec<f64> = a.major.iter().map(|t| t.0).collect();
        assert_eq!(v, [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let a = Axis::new(-0.05, 0.42, false);
        let l: Vec<&str> = a.major.iter().map(|t| t.1.as_str()).collect();
        assert_eq!(l, ["-0.1", "0", "0.1", "0.2", "0.3", "0.4", "0.5"]);
        let a = Axis::new(7.0, 7.0, false); // a single value still gets a range
        assert!(a.lo < 7.0 && a.hi > 7.0 && a.major.len() >= 3);

        let a = Axis::new(1e-3, 20.0, true);
        let l: Vec<&str> = a.major.iter().map(|t| t.1.as_str()).collect();
        assert_eq!(l, ["0.001", "0.01", "0.1", "1", "10"]);
        assert!(a.minor.contains(&2.0) && a.minor.contains(&0.005));
        let a = Axis::new(3.0, 40.0, true); // about one decade: 1-2-5 ticks
        let l: Vec<&str> = a.major.iter().map(|t| t.1.as_str()).collect();
        assert_eq!(l, ["5", "10", "20"]);
        let a = Axis::new(1.1, 1.3, true); // a narrow log range falls back to linear ticks
        assert!(a.major.len() >= 2, "{a:?}");
        let a = Axis::new(1e-20, 1e20, true); // many decades: thinned to at most 7 labels
        assert!((3..=7).contains(&a.major.len()) && a.minor.is_empty());
    }

    #[test]
    fn every_printable_ascii_character_has_a_glyph() {
        for ch in ' '..='~' {
            let g = glyph(ch);
            assert_eq!(ch == ' ', g.iter().all(|c| *c == 0), "{ch:?}");
            assert!(
                g.iter().all(|c| c & 0x80 == 0),
                "{ch:?} uses rows 0..7 only"
            );
        }
        assert_eq!(glyph('é'), glyph('?'));
        assert_eq!(text_width("", 2), 0);
        assert_eq!(text_width("1e-3", 2), (4 * 6 - 1) * 2);
    }
}
