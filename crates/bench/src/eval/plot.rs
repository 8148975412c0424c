//! The figures of `pmnet eval`, drawn as SVG with plotters: panels of lines (one per system)
//! or grouped bars, axes with their units, a legend, and the papers' values marked.

use std::ops::Range;

use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Serialize;

/// One figure of an experiment: its panels side by side, two to a row.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figure {
    pub panels: Vec<Panel>,
}

/// One chart.
#[derive(Debug, Clone, Serialize)]
pub struct Panel {
    pub title: String,
    /// The x axis's quantity and unit, e.g. "payload (bytes)".
    pub x_label: String,
    pub y_label: String,
    pub kind: PanelKind,
    pub series: Vec<Series>,
    /// The papers' values, drawn in grey.
    pub marks: Vec<Mark>,
    /// Whether every point gets a dot (off for dense curves such as CDFs).
    pub dots: bool,
    pub legend: Legend,
}

/// Where the legend goes: upper left (room is left above the data for it) or lower right.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Legend {
    UpperLeft,
    LowerRight,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PanelKind {
    /// Points joined by lines, x numeric.
    Lines,
    /// Grouped bars: a series' point `(i, y)` is its bar in category `i`.
    Bars { categories: Vec<String> },
}

/// One system's points.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A reference value (the paper's) or a target. Each is drawn in a style of its own (a marker
/// shape and colour, a dash) with its own legend entry; targets of the same label share one.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mark {
    /// A horizontal line at `y` across the panel.
    Level { label: String, y: f64 },
    /// A marker at `(x, y)`.
    Point { label: String, x: f64, y: f64 },
    /// A target over one category of a bar panel (`x`, its index): a short line at `y` across
    /// that category's bars only, so each category shows its own.
    Target { label: String, x: f64, y: f64 },
}

impl Mark {
    fn y(&self) -> f64 {
        match self {
            Mark::Level { y, .. } | Mark::Point { y, .. } | Mark::Target { y, .. } => *y,
        }
    }
}

impl Panel {
    pub fn lines(title: &str, x_label: &str, y_label: &str) -> Panel {
        Panel {
            title: title.to_owned(),
            x_label: x_label.to_owned(),
            y_label: y_label.to_owned(),
            kind: PanelKind::Lines,
            series: Vec::new(),
            marks: Vec::new(),
            dots: true,
            legend: Legend::UpperLeft,
        }
    }

    /// No dot per point, the legend in the lower right: for CDFs.
    pub fn dense(mut self) -> Panel {
        self.dots = false;
        self.legend = Legend::LowerRight;
        self
    }

    pub fn bars(title: &str, y_label: &str, categories: Vec<String>) -> Panel {
        Panel {
            kind: PanelKind::Bars { categories },
            ..Panel::lines(title, "", y_label)
        }
    }

    /// Add a series (dropped when it has no points).
    pub fn series(mut self, name: &str, points: Vec<(f64, f64)>) -> Panel {
        let points: Vec<(f64, f64)> = points
            .into_iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        if !points.is_empty() {
            self.series.push(Series {
                name: name.to_owned(),
                points,
            });
        }
        self
    }

    pub fn mark(mut self, mark: Mark) -> Panel {
        self.marks.push(mark);
        self
    }

    fn has_data(&self) -> bool {
        self.series.iter().any(|series| !series.points.is_empty())
    }
}

const PANEL_WIDTH: u32 = 560;
const PANEL_HEIGHT: u32 = 400;

/// Colours of the series in order (colour-blind-safe, Okabe–Ito).
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(240, 228, 66),
];
/// Colours of the marks in order: dark, apart from the series' (Paul Tol's muted darks).
const MARK_PALETTE: [RGBColor; 5] = [
    RGBColor(90, 90, 90),
    RGBColor(136, 34, 85),
    RGBColor(17, 119, 51),
    RGBColor(51, 34, 136),
    RGBColor(0, 0, 0),
];

/// Bars whose largest value is this many times their smallest get a logarithmic axis, so the
/// small ones stay readable.
const LOG_AXIS_RATIO: f64 = 10.0;

/// The figure as an SVG document; a panel without data says so in its place.
pub fn render(figure: &Figure) -> Result<String, String> {
    let count = figure.panels.len().max(1);
    let columns = count.min(2);
    let rows = count.div_ceil(columns);
    let size = (PANEL_WIDTH * columns as u32, PANEL_HEIGHT * rows as u32);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        // Two panels to a row; an odd last one takes its row's whole width (no empty quadrant).
        let mut areas = Vec::new();
        for (row, area) in root.split_evenly((rows, 1)).into_iter().enumerate() {
            let in_row = (count - row * columns).min(columns);
            areas.extend(area.split_evenly((1, in_row)));
        }
        for (area, panel) in areas.iter().zip(&figure.panels) {
            if panel.has_data() {
                draw_panel(area, panel)?;
            } else {
                draw_message(area, &panel.title, "no data: see the report")?;
            }
        }
        if figure.panels.is_empty() {
            draw_message(&root, "", "no data: see the report")?;
        }
        root.present().map_err(draw_error)?;
    }
    Ok(svg)
}

/// An SVG that says why an experiment has no figure.
pub fn render_message(title: &str, message: &str) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (PANEL_WIDTH, PANEL_HEIGHT / 2)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        draw_message(&root, title, message)?;
        root.present().map_err(draw_error)?;
    }
    Ok(svg)
}

fn draw_error<E: std::fmt::Debug>(error: E) -> String {
    format!("drawing the figure: {error:?}")
}

fn draw_message<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    message: &str,
) -> Result<(), String> {
    let style = TextStyle::from(("sans-serif", 16).into_font()).color(&BLACK);
    area.draw_text(title, &style, (20, 20))
        .map_err(draw_error)?;
    // Long messages wrap at about 70 characters.
    let mut line = String::new();
    let mut y = 50;
    for word in message.split_whitespace() {
        if line.len() + word.len() > 70 {
            area.draw_text(&line, &style, (20, y)).map_err(draw_error)?;
            line.clear();
            y += 22;
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    area.draw_text(&line, &style, (20, y)).map_err(draw_error)?;
    Ok(())
}

/// The range covering `values` with some room (`top_room` of the span above), starting at
/// zero when all are positive.
fn axis_range(values: impl Iterator<Item = f64>, from_zero: bool, top_room: f64) -> Range<f64> {
    let (mut low, mut high) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !low.is_finite() || !high.is_finite() {
        return 0.0..1.0;
    }
    if from_zero && low >= 0.0 {
        low = 0.0;
    }
    if high <= low {
        high = low + low.abs().max(1.0);
    }
    let room = (high - low) * 0.08;
    let low = if from_zero && low == 0.0 {
        0.0
    } else {
        low - room
    };
    low..(high + (high - low) * top_room.max(0.08))
}

/// Whether `panel`'s y axis is logarithmic: bars, all positive, the largest at least
/// [`LOG_AXIS_RATIO`] times the smallest.
fn log_axis(panel: &Panel) -> bool {
    if !matches!(panel.kind, PanelKind::Bars { .. }) {
        return false;
    }
    let values = || {
        panel
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
    };
    let low = values().fold(f64::INFINITY, f64::min);
    let high = values().fold(f64::NEG_INFINITY, f64::max);
    low > 0.0 && high.is_finite() && high / low >= LOG_AXIS_RATIO
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
) -> Result<(), String> {
    let points = || panel.series.iter().flat_map(|series| series.points.iter());
    // Room above the data for the legend's lines.
    let legend_lines = panel.series.len() + panel.marks.len();
    let top_room = match panel.legend {
        Legend::UpperLeft => 0.1 + 0.1 * legend_lines as f64,
        Legend::LowerRight => 0.08,
    };
    let x_range = match &panel.kind {
        PanelKind::Lines => {
            let mark_xs = panel.marks.iter().filter_map(|mark| match mark {
                Mark::Point { x, .. } | Mark::Target { x, .. } => Some(*x),
                Mark::Level { .. } => None,
            });
            axis_range(points().map(|p| p.0).chain(mark_xs), false, 0.08)
        }
        PanelKind::Bars { categories } => -0.5..(categories.len() as f64 - 0.5),
    };
    let ys = || points().map(|p| p.1).chain(panel.marks.iter().map(Mark::y));
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(&panel.title, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(62);
    if log_axis(panel) {
        let low = ys().filter(|y| *y > 0.0).fold(f64::INFINITY, f64::min);
        let high = ys().fold(f64::NEG_INFINITY, f64::max);
        // Decades of room above for the legend, as the linear axis leaves a share.
        let decades = (high / low).log10().max(1.0);
        let top = high * 10f64.powf(decades * top_room.max(0.08));
        let floor = low / 2.0;
        let chart = builder
            .build_cartesian_2d(x_range, (floor..top).log_scale())
            .map_err(draw_error)?;
        fill_chart(
            chart,
            panel,
            floor,
            &format!("{} (log scale)", panel.y_label),
        )
    } else {
        let y_range = axis_range(ys(), true, top_room);
        let floor = y_range.start.max(0.0).min(y_range.end);
        let chart = builder
            .build_cartesian_2d(x_range, y_range)
            .map_err(draw_error)?;
        fill_chart(chart, panel, floor, &panel.y_label)
    }
}

/// Draw `panel` on its chart: the mesh, the series (bars from `floor` up), the marks, the
/// legend.
fn fill_chart<'a, DB: DrawingBackend + 'a, Y>(
    mut chart: ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>,
    panel: &Panel,
    floor: f64,
    y_label: &str,
) -> Result<(), String>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let categories = match &panel.kind {
        PanelKind::Bars { categories } => categories.clone(),
        PanelKind::Lines => Vec::new(),
    };
    let category_label = |x: &f64| {
        let index = x.round();
        if (x - index).abs() < 0.01 && index >= 0.0 {
            categories.get(index as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(panel.x_label.as_str())
        .y_desc(y_label)
        .y_label_formatter(&|y| short_number(*y))
        .light_line_style(WHITE.mix(0.0));
    if categories.is_empty() {
        mesh.x_label_formatter(&|x| short_number(*x));
    } else {
        mesh.x_labels(categories.len() * 2 + 1)
            .x_label_formatter(&category_label);
    }
    mesh.draw().map_err(draw_error)?;

    let groups = panel.series.len().max(1) as f64;
    for (index, series) in panel.series.iter().enumerate() {
        let colour = PALETTE[index % PALETTE.len()];
        match &panel.kind {
            PanelKind::Lines => {
                chart
                    .draw_series(LineSeries::new(
                        series.points.iter().copied(),
                        colour.stroke_width(2),
                    ))
                    .map_err(draw_error)?
                    .label(series.name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
                    });
                if panel.dots {
                    chart
                        .draw_series(
                            series
                                .points
                                .iter()
                                .map(|point| Circle::new(*point, 3, colour.filled())),
                        )
                        .map_err(draw_error)?;
                }
            }
            PanelKind::Bars { .. } => {
                let width = 0.8 / groups;
                chart
                    .draw_series(
                        series
                            .points
                            .iter()
                            .filter(|(_, y)| *y > floor)
                            .map(|(x, y)| {
                                let left = x - 0.4 + width * index as f64;
                                Rectangle::new(
                                    [(left, floor), (left + width * 0.92, *y)],
                                    colour.filled(),
                                )
                            }),
                    )
                    .map_err(draw_error)?
                    .label(series.name.as_str())
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 14, y + 5)], colour.filled())
                    });
            }
        }
    }
    let mut chart = draw_marks(chart, panel)?;
    chart
        .configure_series_labels()
        .position(match panel.legend {
            Legend::UpperLeft => SeriesLabelPosition::UpperLeft,
            Legend::LowerRight => SeriesLabelPosition::LowerRight,
        })
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(draw_error)?;
    Ok(())
}

/// The marks: each label its own colour and style (a marker shape for points, a dash for
/// lines) and one legend entry; targets over several categories with one label share both.
fn draw_marks<'a, DB: DrawingBackend + 'a, Y>(
    mut chart: ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>,
    panel: &Panel,
) -> Result<ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>, String>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let mut labels: Vec<&str> = Vec::new();
    for mark in &panel.marks {
        let label = match mark {
            Mark::Level { label, .. } | Mark::Point { label, .. } | Mark::Target { label, .. } => {
                label.as_str()
            }
        };
        let first = !labels.contains(&label);
        if first {
            labels.push(label);
        }
        let style_index = labels.iter().position(|seen| *seen == label).unwrap_or(0);
        let colour = MARK_PALETTE[style_index % MARK_PALETTE.len()];
        let (x_range, y) = (chart.x_range(), mark.y());
        let drawn = match mark {
            Mark::Level { .. } => chart
                .draw_series(DashedLineSeries::new(
                    [(x_range.start, y), (x_range.end, y)],
                    8,
                    4,
                    colour.stroke_width(2),
                ))
                .map_err(draw_error)?,
            Mark::Target { x, .. } => chart
                .draw_series(DashedLineSeries::new(
                    [(x - 0.45, y), (x + 0.45, y)],
                    6,
                    3,
                    colour.stroke_width(3),
                ))
                .map_err(draw_error)?,
            Mark::Point { x, .. } => {
                let at = (*x, y);
                let style = colour.stroke_width(2);
                match style_index % 4 {
                    0 => chart.draw_series([Cross::new(at, 6, style)]),
                    1 => chart.draw_series([TriangleMarker::new(at, 7, style)]),
                    2 => chart.draw_series([Circle::new(at, 6, style)]),
                    _ => chart.draw_series([EmptyElement::at(at)
                        + PathElement::new(
                            vec![(-6, 0), (0, -6), (6, 0), (0, 6), (-6, 0)],
                            style,
                        )]),
                }
                .map_err(draw_error)?
            }
        };
        if !first {
            continue;
        }
        let point_shape = match mark {
            Mark::Point { .. } => Some(style_index % 4),
            _ => None,
        };
        drawn.label(label).legend(move |(x, y)| {
            // The legend draws each shape as one path.
            let points = match point_shape {
                Some(0) => vec![
                    (x + 4, y - 5),
                    (x + 14, y + 5),
                    (x + 9, y),
                    (x + 14, y - 5),
                    (x + 4, y + 5),
                ],
                Some(1) => vec![
                    (x + 9, y - 6),
                    (x + 15, y + 5),
                    (x + 3, y + 5),
                    (x + 9, y - 6),
                ],
                Some(2) => vec![
                    (x + 4, y - 2),
                    (x + 7, y - 5),
                    (x + 11, y - 5),
                    (x + 14, y - 2),
                    (x + 14, y + 2),
                    (x + 11, y + 5),
                    (x + 7, y + 5),
                    (x + 4, y + 2),
                    (x + 4, y - 2),
                ],
                Some(_) => vec![
                    (x + 4, y),
                    (x + 9, y - 5),
                    (x + 14, y),
                    (x + 9, y + 5),
                    (x + 4, y),
                ],
                None => vec![(x, y), (x + 18, y)],
            };
            PathElement::new(points, colour.stroke_width(2))
        });
    }
    Ok(chart)
}

/// `1200` → "1.2k", `0.25` → "0.25": tick labels that stay short.
pub fn short_number(value: f64) -> String {
    let magnitude = value.abs();
    let (scaled, suffix) = if magnitude >= 1e6 {
        (value / 1e6, "M")
    } else if magnitude >= 1e4 {
        (value / 1e3, "k")
    } else {
        (value, "")
    };
    let text = if scaled.fract().abs() < 1e-9 || scaled.abs() >= 100.0 {
        format!("{scaled:.0}")
    } else if scaled.abs() >= 10.0 {
        format!("{scaled:.1}")
    } else {
        format!("{scaled:.2}")
    };
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    };
    format!("{text}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Figure {
        Figure {
            panels: vec![
                Panel::lines("p50 latency", "payload (bytes)", "latency (µs)")
                    .series("baseline", vec![(50.0, 60.0), (1024.0, 75.0)])
                    .series("pmnet", vec![(50.0, 25.0), (1024.0, 33.0)])
                    .mark(Mark::Point {
                        label: "paper".into(),
                        x: 50.0,
                        y: 21.5,
                    }),
                Panel::bars(
                    "breakdown",
                    "ns per write",
                    vec!["checksum".into(), "copy".into()],
                )
                .series("conventional", vec![(0.0, 120.0), (1.0, 300.0)])
                .mark(Mark::Level {
                    label: "target".into(),
                    y: 100.0,
                }),
                Panel::lines("empty", "x", "y").series("nothing", vec![(f64::NAN, 1.0)]),
            ],
        }
    }

    #[test]
    fn a_figure_is_one_svg_with_every_series_named() {
        let svg = render(&sample()).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        assert!(svg.trim_end().ends_with("</svg>"));
        for name in [
            "baseline",
            "pmnet",
            "paper",
            "conventional",
            "target",
            "no data",
        ] {
            assert!(svg.contains(name), "{name} missing");
        }
        assert!(svg.contains("payload (bytes)") && svg.contains("latency (µs)"));
    }

    #[test]
    fn bars_ten_times_apart_get_a_log_axis_and_others_do_not() {
        let bars = |values: &[f64]| {
            Panel::bars("b", "ops/s", vec!["a".into(), "b".into()]).series(
                "s",
                values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (i as f64, *v))
                    .collect(),
            )
        };
        assert!(log_axis(&bars(&[800.0, 80_000.0])));
        assert!(!log_axis(&bars(&[800.0, 7_000.0])));
        assert!(
            !log_axis(&bars(&[0.0, 80_000.0])),
            "a zero bar keeps a linear axis"
        );
        let lines = Panel::lines("l", "x", "y").series("s", vec![(1.0, 1.0), (2.0, 1000.0)]);
        assert!(!log_axis(&lines));
        let svg = render(&Figure {
            panels: vec![bars(&[800.0, 80_000.0])],
        })
        .unwrap();
        assert!(svg.contains("ops/s (log scale)"));
    }

    #[test]
    fn each_reference_has_its_own_legend_entry_and_a_targets_categories_share_one() {
        let panel = Panel::bars("f", "factor", vec!["a".into(), "b".into(), "c".into()])
            .series("measured", vec![(0.0, 3.0), (1.0, 12.0), (2.0, 9.0)])
            .mark(Mark::Target {
                label: "target".into(),
                x: 0.0,
                y: 5.0,
            })
            .mark(Mark::Target {
                label: "target".into(),
                x: 1.0,
                y: 10.0,
            })
            .mark(Mark::Target {
                label: "target".into(),
                x: 2.0,
                y: 10.0,
            })
            .mark(Mark::Point {
                label: "paper A".into(),
                x: 0.0,
                y: 4.0,
            })
            .mark(Mark::Point {
                label: "paper B".into(),
                x: 1.0,
                y: 11.0,
            });
        let svg = render(&Figure {
            panels: vec![panel],
        })
        .unwrap();
        // Texts are on lines of their own in plotters' SVG.
        let text = |label: &str| svg.lines().filter(|line| *line == label).count();
        assert_eq!(text("target"), 1, "one legend entry");
        assert_eq!(text("paper A"), 1);
        assert_eq!(text("paper B"), 1);
    }

    #[test]
    fn a_message_is_an_svg_too() {
        let svg = render_message("cache", "not run: needs root & <etcd>").unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("not run"));
        assert!(!svg.contains("<etcd>"), "text is escaped");
    }

    #[test]
    fn numbers_stay_short() {
        assert_eq!(short_number(1200.0), "1200");
        assert_eq!(short_number(12_000.0), "12k");
        assert_eq!(short_number(2_500_000.0), "2.5M");
        assert_eq!(short_number(0.25), "0.25");
        assert_eq!(short_number(12.5), "12.5");
    }
}
