//! PNG line charts of experiment results, drawn with `plotters`.
//!
//! Owns the chart description every scenario fills in ([`Chart`], [`Series`]) and its
//! rendering: axes linear or logarithmic (base 10), one colour per series from a fixed palette,
//! measurements solid with filled markers, bounds and reference lines dashed with hollow
//! markers, a legend in the corner of the plot that hides the fewest data. Text is DejaVu Sans
//! (`assets/DejaVuSans.ttf`, embedded), so no system font is looked up; plotters draws into an
//! RGB buffer that the `png` crate encodes. It must not know about scenarios or nodes.
//!
//! Input is validated before anything is written: a chart without series, a series without a
//! finite point, or a non-positive value on a log axis is a [`ChartError`] and leaves no file.
//! Non-finite points (NaN, ±∞) are skipped.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::combinators::{BindKeyPoints, LogCoord, WithKeyPoints};
use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;

/// One line of a chart, drawn in the order of its points.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Dashed instead of solid (e.g. for a bound next to a measurement).
    pub dashed: bool,
}

impl Series {
    /// A measured series: solid line, filled markers.
    pub fn solid(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
            dashed: false,
        }
    }

    /// A bound or reference line: dashed, hollow markers.
    pub fn dashed(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
            dashed: true,
        }
    }
}

/// A line chart; series get the colours of [`PALETTE`] in order.
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
pub enum ChartError {
    #[error("writing the chart: {0}")]
    Io(#[from] std::io::Error),
    #[error("encoding the chart as PNG: {0}")]
    Encoding(#[from] png::EncodingError),
    #[error("drawing the chart: {0}")]
    Draw(String),
    #[error("the embedded chart font could not be loaded")]
    Font,
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

impl<E: std::error::Error + Send + Sync> From<DrawingAreaErrorKind<E>> for ChartError {
    fn from(e: DrawingAreaErrorKind<E>) -> Self {
        ChartError::Draw(e.to_string())
    }
}

/// Largest accepted image side, which bounds the pixel buffer.
const MAX_SIDE: u32 = 16_384;
/// Smallest accepted image, below which axes and legend no longer fit.
const MIN_SIZE: (u32, u32) = (320, 240);

/// Series with more points than this are drawn without markers.
const MAX_MARKED_POINTS: usize = 200;

/// Series colours (Tableau 10), reused cyclically past the tenth series.
pub const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// The family name the embedded font is registered under.
const FONT: &str = "sans-serif";

/// Registers the embedded DejaVu Sans with plotters (once per process).
fn load_font() -> Result<(), ChartError> {
    static LOADED: OnceLock<bool> = OnceLock::new();
    let ok = *LOADED.get_or_init(|| {
        plotters::style::register_font(
            FONT,
            FontStyle::Normal,
            include_bytes!("../assets/DejaVuSans.ttf"),
        )
        .is_ok()
    });
    ok.then_some(()).ok_or(ChartError::Font)
}

impl Chart {
    /// Renders the chart into a `width` × `height` RGB PNG at `path`.
    pub fn write_png(&self, path: &Path, width: u32, height: u32) -> Result<(), ChartError> {
        let rgb = self.render(width, height)?;
        let mut bytes = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut bytes, width, height);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            let mut writer = enc.write_header()?;
            writer.write_image_data(&rgb)?;
            writer.finish()?;
        }
        std::fs::write(path, bytes)?;
        Ok(())
    }

    /// The finite points of every series, after validating the chart.
    fn finite_points(&self) -> Result<Vec<Vec<(f64, f64)>>, ChartError> {
        if self.series.is_empty() {
            return Err(ChartError::NoSeries);
        }
        let mut all = Vec::with_capacity(self.series.len());
        for s in &self.series {
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            if pts.is_empty() {
                return Err(ChartError::EmptySeries {
                    series: s.name.clone(),
                });
            }
            for &(x, y) in &pts {
                for (log, axis, value) in [(self.log_x, 'x', x), (self.log_y, 'y', y)] {
                    if log && value <= 0.0 {
                        return Err(ChartError::NonPositiveOnLogAxis {
                            series: s.name.clone(),
                            axis,
                            value,
                        });
                    }
                }
            }
            all.push(pts);
        }
        Ok(all)
    }

    /// The chart as an RGB buffer (`width · height · 3` bytes).
    fn render(&self, width: u32, height: u32) -> Result<Vec<u8>, ChartError> {
        if width > MAX_SIDE || height > MAX_SIDE || width < MIN_SIZE.0 || height < MIN_SIZE.1 {
            return Err(ChartError::InvalidSize { width, height });
        }
        let points = self.finite_points()?;
        load_font()?;
        let xs = || points.iter().flatten().map(|p| p.0);
        let ys = || points.iter().flatten().map(|p| p.1);
        let x = AxisRange::covering(xs(), self.log_x);
        let y = AxisRange::covering(ys(), self.log_y);
        // Text grows with the image: 1 at 960×600.
        let scale = f64::from(width.min(height)) / 600.0;
        let px = |v: f64| (v * scale).round().max(1.0) as u32;
        let mut buf = vec![255u8; width as usize * height as usize * 3];
        {
            let root = BitMapBackend::with_buffer(&mut buf, (width, height)).into_drawing_area();
            root.fill(&WHITE)?;
            let mut builder = ChartBuilder::on(&root);
            builder
                .caption(&self.title, (FONT, px(22.0)))
                .margin(px(14.0))
                .x_label_area_size(px(52.0))
                .y_label_area_size(px(76.0));
            let fonts = Fonts {
                label: px(17.0),
                tick: px(15.0),
                legend: px(15.0),
            };
            match (self.log_x, self.log_y) {
                (false, false) => self.draw(
                    builder.build_cartesian_2d(x.lin(), y.lin())?,
                    &points,
                    fonts,
                )?,
                (true, false) => self.draw(
                    builder.build_cartesian_2d(x.log(), y.lin())?,
                    &points,
                    fonts,
                )?,
                (false, true) => self.draw(
                    builder.build_cartesian_2d(x.lin(), y.log())?,
                    &points,
                    fonts,
                )?,
                (true, true) => self.draw(
                    builder.build_cartesian_2d(x.log(), y.log())?,
                    &points,
                    fonts,
                )?,
            }
            root.present()?;
        }
        Ok(buf)
    }

    /// Mesh, series and legend on a built coordinate system.
    fn draw<'a, X, Y>(
        &self,
        mut chart: ChartContext<'a, BitMapBackend<'a>, Cartesian2d<X, Y>>,
        points: &[Vec<(f64, f64)>],
        fonts: Fonts,
    ) -> Result<(), ChartError>
    where
        X: Ranged<ValueType = f64> + ValueFormatter<f64>,
        Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
    {
        chart
            .configure_mesh()
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .axis_desc_style((FONT, fonts.label))
            .label_style((FONT, fonts.tick))
            .x_label_formatter(&|v| format_tick(*v))
            .y_label_formatter(&|v| format_tick(*v))
            .light_line_style(RGBColor(242, 242, 242))
            .bold_line_style(RGBColor(222, 222, 222))
            .draw()?;
        let marker = (fonts.tick / 4).max(3) as i32;
        for (i, (series, pts)) in self.series.iter().zip(points).enumerate() {
            let line = colour(i).stroke_width(2);
            let dash = (fonts.tick / 2).max(4) as i32;
            let anno = if series.dashed {
                chart.draw_series(DashedLineSeries::new(
                    pts.iter().copied(),
                    dash,
                    dash * 2 / 3,
                    line,
                ))?
            } else {
                chart.draw_series(LineSeries::new(pts.iter().copied(), line))?
            };
            let dashed = series.dashed;
            anno.label(series.name.as_str()).legend(move |(lx, ly)| {
                let sample = vec![(lx, ly), (lx + 3 * dash, ly)];
                if dashed {
                    DashedPathElement::new(sample, dash, dash * 2 / 3, line).into_dyn()
                } else {
                    PathElement::new(sample, line).into_dyn()
                }
            });
            let style = if series.dashed {
                colour(i).stroke_width(2)
            } else {
                colour(i).filled()
            };
            // Markers show where the measurements are; on a dense series (a step log) they
            // would only thicken the line into a band.
            if pts.len() <= MAX_MARKED_POINTS {
                chart.draw_series(pts.iter().map(|&p| Circle::new(p, marker, style)))?;
            }
        }
        chart
            .configure_series_labels()
            .position(self.legend_corner(points))
            .margin(fonts.legend / 2)
            .legend_area_size(fonts.legend * 2)
            .label_font((FONT, fonts.legend))
            .background_style(WHITE)
            .border_style(RGBColor(160, 160, 160))
            .draw()?;
        Ok(())
    }

    /// The corner of the plot whose legend box would cover the fewest points and line
    /// samples (upper left on a tie, then upper right, lower right, lower left).
    fn legend_corner(&self, points: &[Vec<(f64, f64)>]) -> SeriesLabelPosition {
        let x = AxisRange::covering(points.iter().flatten().map(|p| p.0), self.log_x);
        let y = AxisRange::covering(points.iter().flatten().map(|p| p.1), self.log_y);
        // The legend's share of the plot: about 45 % of the width, one row per series.
        let (w, h) = (0.45, (0.04 + 0.065 * self.series.len() as f64).min(0.9));
        let corners = [
            (SeriesLabelPosition::UpperLeft, 0.0, 1.0 - h),
            (SeriesLabelPosition::UpperRight, 1.0 - w, 1.0 - h),
            (SeriesLabelPosition::LowerRight, 1.0 - w, 0.0),
            (SeriesLabelPosition::LowerLeft, 0.0, 0.0),
        ];
        let mut samples = Vec::new();
        for pts in points {
            let f: Vec<(f64, f64)> = pts.iter().map(|&(a, b)| (x.frac(a), y.frac(b))).collect();
            samples.extend(f.iter().flat_map(|&p| [p; 4]));
            for seg in f.windows(2) {
                samples.extend((1..16).map(|k| {
                    let t = f64::from(k) / 16.0;
                    (
                        seg[0].0 + (seg[1].0 - seg[0].0) * t,
                        seg[0].1 + (seg[1].1 - seg[0].1) * t,
                    )
                }));
            }
        }
        let hidden = |&(_, x0, y0): &(SeriesLabelPosition, f64, f64)| {
            samples
                .iter()
                .filter(|(a, b)| (x0..=x0 + w).contains(a) && (y0..=y0 + h).contains(b))
                .count()
        };
        corners
            .iter()
            .min_by_key(|c| hidden(c))
            .map_or(SeriesLabelPosition::UpperLeft, |c| c.0.clone())
    }
}

/// Font sizes in pixels.
#[derive(Debug, Clone, Copy)]
struct Fonts {
    label: u32,
    tick: u32,
    legend: u32,
}

/// An axis range covering some data: `lo..hi` in data space, padded so that no point sits on
/// the frame (4 % of the span, in `log10` space on a log axis; a linear axis of non-negative
/// data does not dip below 0).
#[derive(Debug, Clone, Copy, PartialEq)]
struct AxisRange {
    lo: f64,
    hi: f64,
    log: bool,
}

impl AxisRange {
    /// Covers the finite values of `values` (positive ones on a log axis).
    fn covering(values: impl Iterator<Item = f64>, log: bool) -> AxisRange {
        let t = |v: f64| if log { v.log10() } else { v };
        let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
            min = min.min(t(v));
            max = max.max(t(v));
        }
        if !min.is_finite() {
            (min, max) = (0.0, 1.0);
        }
        if max - min < 1e-12 * max.abs().max(1.0) {
            let d = if log || min == 0.0 {
                0.5
            } else {
                min.abs() * 0.5
            };
            (min, max) = (min - d, max + d);
        }
        let pad = 0.04 * (max - min);
        let (mut lo, hi) = (min - pad, max + pad);
        if !log && min >= 0.0 && lo < 0.0 {
            lo = 0.0;
        }
        if log {
            AxisRange {
                lo: 10f64.powf(lo),
                hi: 10f64.powf(hi),
                log,
            }
        } else {
            AxisRange { lo, hi, log }
        }
    }

    fn lin(self) -> RangedCoordf64 {
        (self.lo..self.hi).into()
    }

    /// A log axis with the ticks of [`log_ticks`] (plotters' own pick leaves most of a
    /// decade unlabelled).
    fn log(self) -> WithKeyPoints<LogCoord<f64>> {
        let (major, minor) = log_ticks(self.lo, self.hi);
        (self.lo..self.hi)
            .log_scale()
            .with_key_points(major)
            .with_light_points(minor)
    }

    /// Position of data value `v` along the axis, 0 at `lo` and 1 at `hi`.
    fn frac(&self, v: f64) -> f64 {
        let t = |v: f64| if self.log { v.log10() } else { v };
        (t(v) - t(self.lo)) / (t(self.hi) - t(self.lo))
    }
}

/// Labelled (major) and unlabelled (minor) ticks of a log axis over `[lo, hi]` (data space,
/// both > 0): decades when the range spans three or more (at most seven labelled, minor ticks
/// at 2…9 × 10^k while that is not too dense), else 1-2-5 × 10^k with the other integer
/// multiples as minor ticks, else every integer multiple of a power of ten; a range narrower
/// than that gets plain linear ticks.
fn log_ticks(lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
    let (llo, lhi) = (lo.log10(), hi.log10());
    let within = |v: f64| (llo - 1e-9..=lhi + 1e-9).contains(&v.log10());
    let multiples = |ms: &[f64]| -> Vec<f64> {
        let mut v: Vec<f64> = (llo.floor() as i32..=lhi.ceil() as i32)
            .flat_map(|d| ms.iter().map(move |m| m * 10f64.powi(d)))
            .filter(|&v| within(v))
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let decades = multiples(&[1.0]);
    let one_two_five = multiples(&[1.0, 2.0, 5.0]);
    let all = multiples(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    if decades.len() >= 3 {
        let stride = decades.len().div_ceil(7);
        let major: Vec<f64> = decades.iter().copied().step_by(stride).collect();
        let minor = if lhi - llo <= 6.0 {
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
        // Less than a factor of ~3: plain linear ticks (1-2-5 steps, about four) read best.
        let raw = (hi - lo) / 4.0;
        let mag = 10f64.powf(raw.log10().floor());
        let step = match raw / mag {
            n if n < 1.5 => 1.0,
            n if n < 3.0 => 2.0,
            n if n < 7.0 => 5.0,
            _ => 10.0,
        } * mag;
        let ticks = ((lo / step).ceil() as i64..=(hi / step).floor() as i64)
            .map(|k| k as f64 * step)
            .filter(|&v| v > 0.0)
            .collect();
        (ticks, Vec::new())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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

    fn count(buf: &[u8], c: RGBColor) -> usize {
        buf.chunks_exact(3)
            .filter(|p| *p == [c.0, c.1, c.2])
            .count()
    }

    fn dark(buf: &[u8]) -> usize {
        buf.chunks_exact(3)
            .filter(|p| p.iter().all(|&v| v < 80))
            .count()
    }

    fn broadcast_like() -> Chart {
        let ns = [4.0, 16.0, 64.0, 256.0, 1000.0];
        Chart {
            title: "T_bcast vs N (c = 1 MiB, 100%)".into(),
            x_label: "N (workers)".into(),
            y_label: "T_bcast (s)".into(),
            series: vec![
                Series::solid("chain", ns.map(|n| (n, 5.0 + n / 30.0)).to_vec()),
                Series::solid("star", ns.map(|n| (n, 1.7 * n)).to_vec()),
                Series::dashed("chain bound", ns.map(|n| (n, 4.0 + n / 30.0)).to_vec()),
                Series::dashed("star bound", ns.map(|n| (n, 2.5 * n)).to_vec()),
            ],
            log_x: true,
            log_y: true,
        }
    }

    #[test]
    fn a_chart_decodes_to_the_requested_size_with_text_and_every_series_colour() {
        let dir = tempfile::tempdir().unwrap();
        let mut linear = broadcast_like();
        linear.log_x = false;
        linear.log_y = false;
        let mut half_log = broadcast_like();
        half_log.log_y = false;
        for (chart, (w, h)) in [
            (broadcast_like(), (960, 600)),
            (linear, (400, 300)),
            (half_log, (640, 480)),
        ] {
            let path = dir.path().join(format!("c{w}.png"));
            chart.write_png(&path, w, h).unwrap();
            let (dw, dh, buf) = decode(&path);
            assert_eq!((dw, dh), (w, h));
            assert_eq!(buf.len(), (w * h * 3) as usize);
            assert!(
                count(&buf, WHITE) > buf.len() / 3 / 2,
                "mostly white background"
            );
            // Title, labels, ticks and legend text in black (anti-aliased: dark pixels).
            assert!(dark(&buf) > 500, "{} dark pixels", dark(&buf));
            for i in 0..chart.series.len() {
                // Far more than the legend sample and markers alone.
                let n = count(&buf, colour(i));
                assert!(n > 150, "series {i} has {n} pixels of its colour");
            }
        }
    }

    #[test]
    fn invalid_input_is_a_typed_error_and_writes_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.png");
        let check = |chart: &Chart, w: u32, h: u32| {
            let err = chart.write_png(&path, w, h).unwrap_err();
            assert!(!path.exists(), "{err}");
            err
        };
        assert!(matches!(
            check(&Chart::default(), 400, 300),
            ChartError::NoSeries
        ));

        let mut chart = broadcast_like();
        chart.series[1].points.clear();
        let err = check(&chart, 400, 300);
        assert!(matches!(&err, ChartError::EmptySeries { series } if series == "star"));

        let mut chart = broadcast_like();
        chart.series[2].points = vec![(f64::NAN, 1.0), (2.0, f64::INFINITY)];
        let err = check(&chart, 400, 300);
        assert!(matches!(&err, ChartError::EmptySeries { series } if series == "chain bound"));

        let mut chart = broadcast_like();
        chart.series[0].points.push((0.0, 3.0));
        let err = check(&chart, 400, 300);
        assert!(
            matches!(&err, ChartError::NonPositiveOnLogAxis { axis: 'x', value, .. } if *value == 0.0),
            "{err}"
        );
        chart.log_x = false;
        chart.series[3].points[2].1 = -1.0;
        let err = check(&chart, 400, 300);
        assert!(matches!(
            &err,
            ChartError::NonPositiveOnLogAxis { axis: 'y', .. }
        ));
        chart.log_y = false;
        chart.write_png(&path, 400, 300).unwrap(); // the same data on linear axes is fine
        std::fs::remove_file(&path).unwrap();

        for (w, h) in [(0, 300), (400, 10), (20_000, 300)] {
            let err = check(&broadcast_like(), w, h);
            assert!(matches!(err, ChartError::InvalidSize { .. }), "{w}x{h}");
        }
        let missing_dir = dir.path().join("no/such/dir/c.png");
        let err = broadcast_like()
            .write_png(&missing_dir, 400, 300)
            .unwrap_err();
        assert!(matches!(err, ChartError::Io(_)));
    }

    #[test]
    fn non_finite_points_are_skipped_and_ranges_cover_the_rest() {
        let chart = Chart {
            series: vec![Series::solid(
                "s",
                vec![
                    (1.0, 1.0),
                    (f64::NAN, 2.0),
                    (2.0, f64::NEG_INFINITY),
                    (3.0, 3.0),
                ],
            )],
            ..Chart::default()
        };
        let pts = chart.finite_points().unwrap();
        assert_eq!(pts, [vec![(1.0, 1.0), (3.0, 3.0)]]);
        chart.render(400, 300).unwrap();

        let x = AxisRange::covering([1.0, 3.0].into_iter(), false);
        assert!(x.lo < 1.0 && x.hi > 3.0 && x.hi < 3.2, "{x:?}");
        // Non-negative data keeps a linear axis at or above 0 (bubble ratios, rates).
        let y = AxisRange::covering([0.0, 0.5].into_iter(), false);
        assert_eq!(y.lo, 0.0);
        // A single value still gets a range; log axes pad by decades.
        let one = AxisRange::covering([7.0].into_iter(), false);
        assert!(one.lo < 7.0 && one.hi > 7.0);
        let log = AxisRange::covering([10.0, 1000.0].into_iter(), true);
        assert!(log.lo < 10.0 && log.lo > 5.0 && log.hi > 1000.0 && log.hi < 2000.0);
        assert!((log.frac(100.0) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn the_legend_goes_where_it_hides_the_fewest_data() {
        // A line rising to the upper right leaves the upper left free…
        let rising = Chart {
            series: vec![Series::solid("s", vec![(0.0, 0.0), (1.0, 1.0)])],
            ..Chart::default()
        };
        let pts = rising.finite_points().unwrap();
        assert!(matches!(
            rising.legend_corner(&pts),
            SeriesLabelPosition::UpperLeft
        ));
        // …a falling one the upper right.
        let falling = Chart {
            series: vec![Series::solid("s", vec![(0.0, 1.0), (1.0, 0.0)])],
            ..Chart::default()
        };
        let pts = falling.finite_points().unwrap();
        assert!(matches!(
            falling.legend_corner(&pts),
            SeriesLabelPosition::UpperRight
        ));
    }

    #[test]
    fn log_axes_get_decades_or_one_two_five_ticks() {
        let (major, minor) = log_ticks(1e-3, 20.0);
        assert_eq!(major, [0.001, 0.01, 0.1, 1.0, 10.0]);
        assert!(minor.contains(&2.0) && minor.contains(&0.005));
        // About one decade (the broadcast sweep's N = 4…32): 1-2-5 ticks.
        let (major, _) = log_ticks(3.8, 33.0);
        assert_eq!(major, [5.0, 10.0, 20.0]);
        // A narrow range falls back to linear ticks.
        let (major, _) = log_ticks(1.1, 1.3);
        assert!(major.len() >= 2, "{major:?}");
        // Many decades: thinned to at most seven labels, no minor ticks.
        let (major, minor) = log_ticks(1e-20, 1e20);
        assert!((3..=7).contains(&major.len()) && minor.is_empty());
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
}
