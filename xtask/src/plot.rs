//! `cargo xtask plot`: SVG charts of the committed benchmark results, drawn with plotters' SVG backend.
//!
//! One chart per result file that has rows by size (`bench/results/{allreduce,all-to-all,p2p}-*.json`): bus
//! bandwidth, device time per op and host enqueue time per op against the message size, one line per contestant
//! (raw NCCL, pg, PyTorch; all-to-all's two splits as two marker shapes). The chart goes next to its JSON
//! (`allreduce-h200x2.json` -> `allreduce-h200x2.svg`). `--timeline` draws a trace-event file (a
//! `cargo xtask experiments --trace` timeline) as a picture of its tracks instead.

use std::path::PathBuf;

use pg_lab::results::{SizeRow, SizedResult};
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;

const HELP: &str = "\
cargo xtask plot [--results DIR] [--only NAME]
cargo xtask plot --timeline TRACE.json --out PICTURE.svg [--pid N] [--from-ms T] [--to-ms T]

Draws SVG charts of the benchmark results in DIR (default bench/results): for each result file with rows by
message size (all_reduce, all-to-all, p2p), bus bandwidth, device time per op and host enqueue time per op
against the size, raw NCCL, pg and PyTorch, written next to the file as NAME.svg. A result without rows (a
benchmark not applicable at its world size) is skipped with a note.
  --only NAME          draw only NAME.json (e.g. allreduce-h200x2)

--timeline draws a Chrome trace-event file (from `cargo xtask experiments --trace` or `faults --trace`): one row
per track of process N (default 0) that has slices in the window, each slice a bar.
  --pid N              the process (rank) to draw
  --from-ms, --to-ms   the window, in ms of trace time (default: the whole trace)
";

/// The contestants, as the result files name them, with the chart's label and colour.
const CONTESTANTS: [(&str, &str, RGBColor); 3] = [
    ("raw", "raw NCCL", RGBColor(31, 119, 180)),
    ("pg", "pg", RGBColor(214, 39, 40)),
    ("torch", "PyTorch", RGBColor(44, 160, 44)),
];

/// A figure of a contestant's [`pg_lab::results::Measure`].
type Figure = fn(&pg_lab::results::Measure) -> Option<f64>;

/// One panel: what it shows, the figure it draws, and whether its axis is logarithmic.
const PANELS: [(&str, Figure, bool); 3] = [
    ("bus bandwidth, GB/s", |m| m.busbw_gbps, false),
    ("device time per op, us", |m| m.time_us, true),
    ("host enqueue per op, us", |m| m.host_enqueue_us, true),
];

/// One line of a panel: its label, colour, whether it is the second split, and its points (log2 bytes, value).
struct Line {
    label: String,
    color: RGBColor,
    second: bool,
    points: Vec<(f64, f64)>,
}

/// `cargo xtask plot`.
pub fn run(args: &[String]) -> Result<(), String> {
    let mut dir = crate::tidy::project_root().join("bench/results");
    let mut only = None;
    let (mut timeline, mut out, mut pid, mut window) = (None, None, 0u64, (None, None));
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or_else(|| format!("{name} needs a value"));
        let ms = |v: String| v.parse::<f64>().map_err(|_| format!("{v}: not a number of ms"));
        match arg.as_str() {
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(());
            }
            "--results" => dir = PathBuf::from(value("--results")?),
            "--only" => only = Some(value("--only")?),
            "--timeline" => timeline = Some(PathBuf::from(value("--timeline")?)),
            "--out" => out = Some(PathBuf::from(value("--out")?)),
            "--pid" => pid = value("--pid")?.parse().map_err(|_| "--pid: not a number".to_owned())?,
            "--from-ms" => window.0 = Some(ms(value("--from-ms")?)?),
            "--to-ms" => window.1 = Some(ms(value("--to-ms")?)?),
            other => return Err(format!("unexpected argument '{other}'\n\n{HELP}")),
        }
    }
    if let Some(trace) = timeline {
        let out = out.ok_or_else(|| format!("--timeline needs --out PICTURE.svg\n\n{HELP}"))?;
        let text = std::fs::read_to_string(&trace).map_err(|e| format!("cannot read {}: {e}", trace.display()))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", trace.display()))?;
        let svg = crate::plot_timeline::render(&json, pid, window)?;
        std::fs::write(&out, svg).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
        println!("wrote {}", out.display());
        return Ok(());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter(|p| only.as_deref().is_none_or(|name| p.file_stem().is_some_and(|s| s == name)))
        .collect();
    files.sort();
    let mut drawn = 0;
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let Some(result) = SizedResult::parse(&name, &text)? else { continue };
        match chart(&name, &result)? {
            Some(svg) => {
                let out = path.with_extension("svg");
                std::fs::write(&out, svg).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
                println!("wrote {}", out.display());
                drawn += 1;
            }
            None => println!("skipped {}: {}", path.display(), result.not_applicable().unwrap_or("no rows by size")),
        }
    }
    match (drawn, only) {
        (0, Some(name)) => Err(format!("no chart drawn for {name} in {}", dir.display())),
        _ => Ok(()),
    }
}

/// The chart of one result file as SVG text; `None` when it has no rows by size.
pub fn chart(name: &str, result: &SizedResult) -> Result<Option<String>, String> {
    let rows = result.rows();
    if rows.is_empty() || result.not_applicable().is_some() {
        return Ok(None);
    }
    let splits: Vec<String> = {
        let mut splits: Vec<String> = rows.iter().filter_map(|r| r.split().map(str::to_owned)).collect();
        splits.dedup();
        splits.sort();
        splits.dedup();
        splits
    };
    let panels: Vec<(&str, bool, Vec<Line>)> = PANELS
        .iter()
        .map(|(title, figure, log)| (*title, *log, lines(&rows, &splits, *figure)))
        .filter(|(_, _, lines)| lines.iter().any(|l| !l.points.is_empty()))
        .collect();
    if panels.is_empty() {
        return Ok(None);
    }
    let op = result.op();
    let world = result.world_size();
    let version = |name: &str| result.rust_versions().and_then(|v| v.get(name)).map(String::as_str);
    let device = version("device").unwrap_or("GPU");
    let nccl = version("nccl").unwrap_or("?");
    let mut title = format!("{op}, world {world} on {device} (NCCL {nccl}; {name}.json)");
    if panels.iter().all(|(title, _, _)| !title.starts_with("bus")) {
        title.push_str(": bus bandwidth 0 at this world size");
    }
    let mut svg = String::new();
    {
        let width = 420 * u32::try_from(panels.len()).unwrap_or(3);
        let root = SVGBackend::with_string(&mut svg, (width, 380)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        let root = root.titled(&title, ("sans-serif", 17)).map_err(draw_error)?;
        let areas = root.split_evenly((1, panels.len()));
        for (index, ((panel_title, log, lines), area)) in panels.iter().zip(&areas).enumerate() {
            panel(area, panel_title, *log, lines, index == 0)?;
        }
        root.present().map_err(draw_error)?;
    }
    Ok(Some(svg))
}

/// The lines of one panel: per contestant (and split), the rows' `figure` by log2 of the size.
fn lines(rows: &[&dyn SizeRow], splits: &[String], figure: Figure) -> Vec<Line> {
    let mut out = Vec::new();
    let split_list: Vec<Option<&str>> =
        if splits.is_empty() { vec![None] } else { splits.iter().map(|s| Some(s.as_str())).collect() };
    for (key, label, color) in CONTESTANTS {
        for (n, split) in split_list.iter().enumerate() {
            let points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|row| split.is_none() || row.split() == *split)
                .filter_map(|row| {
                    let bytes = row.bytes() as f64;
                    let value = figure(row.contestant(key)?)?;
                    (bytes > 0.0 && value > 0.0).then_some((bytes.log2(), value))
                })
                .collect();
            let label = match split {
                Some(split) => format!("{label} ({split})"),
                None => label.to_owned(),
            };
            out.push(Line { label, color, second: n > 0, points });
        }
    }
    out
}

fn draw_error<E: std::fmt::Debug>(e: E) -> String {
    format!("drawing the chart: {e:?}")
}

/// A size on the log2 axis, as `8 B`, `64 KiB`, `1 GiB`.
fn size_label(log2: &f64) -> String {
    if log2.fract() != 0.0 || *log2 < 0.0 {
        return String::new();
    }
    let bytes = 2f64.powf(*log2);
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value} {}", units[unit])
}

/// Draws one panel into `area`.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    log: bool,
    lines: &[Line],
    legend: bool,
) -> Result<(), String> {
    let points = lines.iter().flat_map(|l| l.points.iter());
    let (x_min, x_max) = points.clone().fold((f64::MAX, f64::MIN), |(lo, hi), (x, _)| (lo.min(*x), hi.max(*x)));
    let (y_min, y_max) = points.fold((f64::MAX, f64::MIN), |(lo, hi), (_, y)| (lo.min(*y), hi.max(*y)));
    let x_range = (x_min.floor() - 0.5)..(x_max.ceil() + 0.5);
    let mut builder = ChartBuilder::on(area);
    builder.caption(title, ("sans-serif", 15)).margin(8).x_label_area_size(34).y_label_area_size(52);
    if log {
        let y_range = (y_min / 1.5)..(y_max * 1.5);
        let mut chart = builder.build_cartesian_2d(x_range, y_range.log_scale()).map_err(draw_error)?;
        chart
            .configure_mesh()
            .x_desc("message size")
            .x_labels(6)
            .x_label_formatter(&size_label)
            .y_label_formatter(&|v| format!("{v}"))
            .max_light_lines(2)
            .draw()
            .map_err(draw_error)?;
        series(&mut chart, lines, legend)
    } else {
        let y_range = 0.0..(y_max * 1.1);
        let mut chart = builder.build_cartesian_2d(x_range, y_range).map_err(draw_error)?;
        chart
            .configure_mesh()
            .x_desc("message size")
            .x_labels(6)
            .x_label_formatter(&size_label)
            .max_light_lines(2)
            .draw()
            .map_err(draw_error)?;
        series(&mut chart, lines, legend)
    }
}

/// Draws `lines` (a line and a marker per point) on `chart`, with the legend if `legend`.
fn series<'a, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>,
    lines: &[Line],
    legend: bool,
) -> Result<(), String>
where
    Y: Ranged<ValueType = f64>,
{
    for line in lines.iter().filter(|l| !l.points.is_empty()) {
        let color = line.color;
        // The second split is drawn lighter, with triangles.
        let style = match line.second {
            false => ShapeStyle::from(&color).stroke_width(2),
            true => ShapeStyle::from(&color.mix(0.45)).stroke_width(2),
        };
        let drawn = chart.draw_series(LineSeries::new(line.points.clone(), style)).map_err(draw_error)?;
        drawn.label(&line.label).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
        match line.second {
            false => {
                chart.draw_series(line.points.iter().map(|p| Circle::new(*p, 3, color.filled()))).map_err(draw_error)?
            }
            true => chart
                .draw_series(line.points.iter().map(|p| TriangleMarker::new(*p, 5, color.stroke_width(1))))
                .map_err(draw_error)?,
        };
    }
    if legend {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .label_font(("sans-serif", 12))
            .draw()
            .map_err(draw_error)?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The contents of the SVG's text elements.
    pub(crate) fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.trim().to_owned()))
            .collect()
    }

    fn committed(name: &str) -> SizedResult {
        let path = crate::tidy::project_root().join(format!("bench/results/{name}.json"));
        SizedResult::parse(name, &std::fs::read_to_string(path).unwrap()).unwrap().expect("a result with rows by size")
    }

    #[test]
    fn each_committed_chart_is_what_plot_draws_from_its_json() {
        let results = crate::tidy::project_root().join("bench/results");
        for name in ["allreduce-h200x1", "allreduce-h200x2", "all-to-all-h200x1"] {
            let svg = chart(name, &committed(name)).unwrap().expect("a chart");
            let on_disk = std::fs::read_to_string(results.join(format!("{name}.svg")))
                .unwrap_or_else(|e| panic!("{name}.svg is not committed ({e}): run cargo xtask plot"));
            assert!(svg == on_disk, "{name}.svg differs from what cargo xtask plot draws now: run it again");
        }
    }

    #[test]
    fn a_chart_has_a_line_per_contestant_and_its_labels() {
        let svg = chart("allreduce-h200x2", &committed("allreduce-h200x2")).unwrap().unwrap();
        assert!(svg.starts_with("<svg"));
        let texts = texts(&svg);
        for text in ["raw NCCL", "pg", "PyTorch", "bus bandwidth, GB/s", "device time per op, us", "1 GiB", "1 MiB"] {
            assert!(texts.iter().any(|t| t == text), "{text} missing from {texts:?}");
        }
        // Each contestant: a line in each of the three panels, and its legend sample.
        for color in ["#1F77B4", "#D62728", "#2CA02C"] {
            let lines = svg.split("<polyline").filter(|p| p.split('>').next().is_some_and(|p| p.contains(color)));
            assert_eq!(lines.count(), 3 + 1, "{color}");
        }
    }

    #[test]
    fn a_result_without_rows_is_skipped_and_zero_bandwidth_drops_its_panel() {
        assert!(chart("p2p-h200x1", &committed("p2p-h200x1")).unwrap().is_none());
        let svg = chart("allreduce-h200x1", &committed("allreduce-h200x1")).unwrap().unwrap();
        assert!(!texts(&svg).iter().any(|t| t == "bus bandwidth, GB/s"));
        assert!(texts(&svg).iter().any(|t| t.ends_with("bus bandwidth 0 at this world size")));
        let splits = texts(&chart("all-to-all-h200x1", &committed("all-to-all-h200x1")).unwrap().unwrap());
        assert!(splits.iter().any(|t| t == "pg (skewed)") && splits.iter().any(|t| t == "pg (equal)"), "{splits:?}");
    }
}
