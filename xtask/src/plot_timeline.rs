//! `cargo xtask plot --timeline`: one process of a Chrome trace-event file drawn as an SVG picture with plotters,
//! a row per track (host threads, streams, communicators, in the trace's own order), each slice a bar coloured by
//! what it is (its `kind` argument, or else its category), each flow (a wait for an event) a grey line from where
//! it starts to where it ends.

use std::collections::{BTreeMap, HashMap};

use plotters::prelude::*;
use serde_json::Value;

/// Bar colours, given out to slice kinds in order of first appearance.
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// One bar: its row, start and end in ms, and what it is.
struct Bar {
    row: usize,
    start: f64,
    end: f64,
    kind: String,
}

/// What a slice is, for its colour: the `kind` argument of a stream slice, or else its category.
fn kind_of(slice: &Value) -> String {
    match (slice["args"]["kind"].as_str(), slice["cat"].as_str()) {
        (Some(kind), _) => kind.to_owned(),
        (None, Some("host")) => "host thread blocked".to_owned(),
        (None, Some("comm")) => "communicator op, issue to end".to_owned(),
        (None, Some(cat)) => cat.to_owned(),
        (None, None) => "?".to_owned(),
    }
}

/// The picture of process `pid` of `trace`, within `window` (ms; `None`: the trace's extent), as SVG text.
pub fn render(trace: &Value, pid: u64, window: (Option<f64>, Option<f64>)) -> Result<String, String> {
    let events = trace.get("traceEvents").and_then(Value::as_array).ok_or("not a trace: no traceEvents list")?;
    let of_pid = |e: &&Value| e.get("pid").and_then(Value::as_u64) == Some(pid);
    let ms = |e: &Value, field: &str| e.get(field).and_then(Value::as_f64).map(|us| us / 1000.0);
    let slices: Vec<&Value> = events.iter().filter(of_pid).filter(|e| e["ph"] == "X").collect();
    let (lo, hi) = slices
        .iter()
        .filter_map(|e| Some((ms(e, "ts")?, ms(e, "ts")? + ms(e, "dur").unwrap_or(0.0))))
        .fold((f64::MAX, f64::MIN), |(lo, hi), (s, e)| (lo.min(s), hi.max(e)));
    let (from, to) = (window.0.unwrap_or(lo), window.1.unwrap_or(hi));
    if slices.is_empty() || from >= to {
        return Err(format!("process {pid} has no slices in the window {from} .. {to} ms"));
    }
    let inside = |start: f64, end: f64| end >= from && start <= to;
    // Rows: the tracks with a slice in the window, in the trace's sort order.
    let sort: HashMap<u64, i64> = events
        .iter()
        .filter(of_pid)
        .filter(|e| e["name"] == "thread_sort_index")
        .filter_map(|e| Some((e["tid"].as_u64()?, e["args"]["sort_index"].as_i64()?)))
        .collect();
    let names: HashMap<u64, String> = events
        .iter()
        .filter(of_pid)
        .filter(|e| e["name"] == "thread_name")
        .filter_map(|e| Some((e["tid"].as_u64()?, e["args"]["name"].as_str()?.to_owned())))
        .collect();
    let mut tids: Vec<u64> = slices
        .iter()
        .filter(|e| ms(e, "ts").zip(ms(e, "dur")).is_some_and(|(s, d)| inside(s, s + d)))
        .filter_map(|e| e["tid"].as_u64())
        .collect();
    tids.sort_by_key(|tid| (sort.get(tid).copied().unwrap_or(i64::MAX), *tid));
    tids.dedup();
    let row: HashMap<u64, usize> = tids.iter().enumerate().map(|(i, tid)| (*tid, i)).collect();
    let bars: Vec<Bar> = slices
        .iter()
        .filter_map(|e| {
            let (start, end) = (ms(e, "ts")?, ms(e, "ts")? + ms(e, "dur")?);
            let row = *row.get(&e["tid"].as_u64()?)?;
            inside(start, end).then(|| Bar { row, start: start.max(from), end: end.min(to), kind: kind_of(e) })
        })
        .collect();
    // Flows whose two ends are on drawn rows.
    let mut ends: BTreeMap<u64, [Option<(f64, usize)>; 2]> = BTreeMap::new();
    for e in events.iter().filter(of_pid).filter(|e| e["ph"] == "s" || e["ph"] == "f") {
        let (Some(id), Some(at), Some(r)) =
            (e["id"].as_u64(), ms(e, "ts"), e["tid"].as_u64().and_then(|t| row.get(&t)))
        else {
            continue;
        };
        ends.entry(id).or_default()[usize::from(e["ph"] == "f")] = Some((at, *r));
    }
    let mut colors: Vec<(String, RGBColor)> = Vec::new();
    for bar in &bars {
        if !colors.iter().any(|(n, _)| *n == bar.kind) {
            let color = PALETTE[colors.len() % PALETTE.len()];
            colors.push((bar.kind.clone(), color));
        }
    }
    let process = events
        .iter()
        .filter(of_pid)
        .find(|e| e["name"] == "process_name")
        .and_then(|e| e["args"]["name"].as_str())
        .unwrap_or("process")
        .to_owned();

    let rows = tids.len();
    let mut svg = String::new();
    {
        let height = 70 + 30 * u32::try_from(rows.max(colors.len())).unwrap_or(1);
        let root = SVGBackend::with_string(&mut svg, (1000, height)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        let (main, legend) = root.split_horizontally(800);
        let mut chart = ChartBuilder::on(&main)
            .caption(format!("{process}, {from:.3} to {to:.3} ms (virtual time)"), ("sans-serif", 15))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(240)
            .build_cartesian_2d(from..to, 0f64..rows as f64)
            .map_err(draw_error)?;
        chart.configure_mesh().disable_y_mesh().y_labels(0).x_desc("ms").draw().map_err(draw_error)?;
        // Rows from the top: row 0 is drawn highest.
        let y = |row: usize, offset: f64| (rows - row) as f64 - offset;
        for (kind, color) in &colors {
            let style = color.filled();
            chart
                .draw_series(
                    bars.iter()
                        .filter(|b| b.kind == *kind)
                        .map(|b| Rectangle::new([(b.start, y(b.row, 0.15)), (b.end, y(b.row, 0.7))], style)),
                )
                .map_err(draw_error)?;
        }
        let grey = RGBColor(90, 90, 90);
        chart
            .draw_series(ends.values().filter_map(|[s, f]| {
                let ((x0, r0), (x1, r1)) = ((*s)?, (*f)?);
                Some(PathElement::new(vec![(x0, y(r0, 0.7)), (x1, y(r1, 0.15))], grey.stroke_width(1)))
            }))
            .map_err(draw_error)?;
        let font = ("sans-serif", 12).into_font().color(&BLACK);
        for (i, tid) in tids.iter().enumerate() {
            let name = names.get(tid).cloned().unwrap_or_else(|| format!("track {tid}"));
            let (_, py) = chart.backend_coord(&(from, y(i, 0.42)));
            main.draw(&Text::new(name, (12, py - 6), font.clone())).map_err(draw_error)?;
        }
        for (i, (kind, color)) in colors.iter().enumerate() {
            let top = 40 + 22 * i32::try_from(i).unwrap_or(0);
            legend.draw(&Rectangle::new([(8, top), (20, top + 12)], color.filled())).map_err(draw_error)?;
            legend.draw(&Text::new(kind.clone(), (26, top), font.clone())).map_err(draw_error)?;
        }
        let top = 40 + 22 * i32::try_from(colors.len()).unwrap_or(0);
        legend.draw(&PathElement::new(vec![(8, top + 6), (20, top + 6)], grey.stroke_width(1))).map_err(draw_error)?;
        legend.draw(&Text::new("wait for an event recorded here", (26, top), font)).map_err(draw_error)?;
        root.present().map_err(draw_error)?;
    }
    Ok(svg)
}

fn draw_error<E: std::fmt::Debug>(e: E) -> String {
    format!("drawing the timeline: {e:?}")
}

#[cfg(test)]
mod tests {
    use pg_core::json::Object;
    use pg_core::trace_event::{TraceEvents, Track};
    use serde_json::json;

    use super::*;

    #[test]
    fn each_track_is_a_row_and_each_slice_a_bar() {
        let mut trace = TraceEvents::new();
        let (current, comm) = (Track::new(0, 1), Track::new(0, 2));
        trace.process(0, "rank 0", 0);
        trace.thread(current, "stream 0 (default)", 1);
        trace.thread(comm, "stream 1", 2);
        trace.slice(current, "sleep", "stream", 0, 2_000_000, Object::new());
        trace.slice(comm, "wait_event", "stream", 100_000, 2_000_000, Object::new());
        trace.slice(comm, "all_reduce", "stream", 2_000_000, 3_000_000, Object::new());
        trace.flow("event", "stream", (current, 0), (comm, 100_000));
        let svg = render(&pg_conformance::traces::to_serde(&trace.into_json()), 0, (None, None)).unwrap();
        let texts = crate::plot::tests::texts(&svg);
        for text in ["stream 0 (default)", "stream 1", "stream"] {
            assert!(texts.iter().any(|t| t == text), "{text} missing from {texts:?}");
        }
        assert_eq!(svg.matches("<rect").count(), 1 + 3 + 1, "background, bars, the legend's one kind");
        let grey = svg.split("<polyline").filter(|p| p.split('>').next().is_some_and(|p| p.contains("#5A5A5A")));
        assert_eq!(grey.count(), 2, "the flow and its legend");
        assert!(render(&json!({"traceEvents": []}), 0, (None, None)).is_err());
        assert!(render(&json!({}), 0, (None, None)).is_err());
    }
}
