//! A flight record as an SVG timeline, time in seconds relative to the record's trigger:
//! - memory: each memory signal's available bytes, its hard and soft thresholds;
//! - pods: the working sets of the largest pods;
//! - pressure: PSI memory some/full avg10, reclaim stalls and kswapd wake-ups (marks);
//!
//! and on every panel the markers: OOM kills (red), evictions (blue), a threshold turning met
//! (orange). The title carries the trigger and the verdict (why the agent did or did not act).
//! Pure: a record in, SVG text out (plotters' SVG backend, text as SVG `<text>`, no fonts).
use std::collections::BTreeMap;

use plotters::{
    coord::Shift,
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

use super::{EventKind, FlightRecord, event_label};

const WIDTH: u32 = 1100;
const HEIGHT: u32 = 940;
const MI: f64 = (1u64 << 20) as f64;
/// Pods drawn: the largest by peak working set over the record.
const PODS_DRAWN: usize = 5;

const OOM: RGBColor = RGBColor(0xd6, 0x27, 0x28);
const EVICT: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const CROSSED: RGBColor = RGBColor(0xff, 0x7f, 0x0e);
const PALETTE: [RGBColor; 6] = [
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0x7f, 0x7f, 0x7f),
];

/// The record as an SVG document.
pub fn render(record: &FlightRecord, node: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        let (head, body) = root.split_vertically(70);
        head.draw(&Text::new(
            format!(
                "{node}: {} (record {})",
                event_label(&record.trigger.kind),
                record.id
            ),
            (12, 10),
            ("sans-serif", 18).into_font(),
        ))?;
        head.draw(&Text::new(
            format!(
                "{}{}",
                if record.dry_run { "[dry run] " } else { "" },
                record.verdict()
            ),
            (12, 40),
            ("sans-serif", 14).into_font(),
        ))?;
        let panels = body.split_evenly((3, 1));
        let span = span(record);
        memory_panel(&panels[0], record, span)?;
        pods_panel(&panels[1], record, span)?;
        pressure_panel(&panels[2], record, span)?;
        root.present()?;
    }
    Ok(out)
}

/// Seconds from the trigger, over the record's samples and events (at least the window).
fn span(r: &FlightRecord) -> (f64, f64) {
    let t = |ms: u64| rel(ms, r.trigger.at_ms);
    let times = r
        .samples
        .iter()
        .map(|s| t(s.at_ms))
        .chain(r.events.iter().map(|e| t(e.at_ms)));
    let (lo, hi) = times.fold((0.0f64, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    (lo.min(-1.0) - 0.5, hi.max(1.0) + 0.5)
}

fn rel(at_ms: u64, trigger_ms: u64) -> f64 {
    (at_ms as f64 - trigger_ms as f64) / 1e3
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

fn chart<'a, 'b>(
    area: &'a Area<'b>,
    caption: &str,
    y_desc: &str,
    span: (f64, f64),
    y_max: f64,
) -> anyhow::Result<Chart<'a, 'b>> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15).into_font())
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(60)
        .build_cartesian_2d(span.0..span.1, 0.0..y_max.max(1.0) * 1.1)?;
    chart
        .configure_mesh()
        .x_desc("seconds from the trigger")
        .y_desc(y_desc)
        .light_line_style(WHITE)
        .draw()?;
    Ok(chart)
}

/// The vertical markers of the record's OOM kills, evictions and threshold crossings; labelled
/// on the memory panel.
fn markers(chart: &mut Chart, r: &FlightRecord, y_max: f64, labelled: bool) -> anyhow::Result<()> {
    let top = y_max.max(1.0) * 1.1;
    let mut labels = 0;
    for e in &r.events {
        let (color, label) = match &e.kind {
            EventKind::OomKill { .. } => (OOM, "OOM kill"),
            EventKind::Eviction { .. } => (EVICT, "eviction"),
            EventKind::Threshold { met: true, .. } => (CROSSED, "threshold met"),
            _ => continue,
        };
        let x = rel(e.at_ms, r.trigger.at_ms);
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(x, 0.0), (x, top)],
            color.stroke_width(2),
        )))?;
        if labelled {
            let y = top * (0.95 - 0.08 * f64::from(labels % 4));
            labels += 1;
            // Right of the marker in the left half of the span, left of it in the right half.
            let (lo, hi) = (chart.x_range().start, chart.x_range().end);
            let h = if x > (lo + hi) / 2.0 {
                HPos::Right
            } else {
                HPos::Left
            };
            chart.draw_series(std::iter::once(Text::new(
                format!("{label}: {}", event_label(&e.kind)),
                (x, y),
                ("sans-serif", 11)
                    .into_font()
                    .color(&color)
                    .pos(Pos::new(h, VPos::Top)),
            )))?;
        }
    }
    Ok(())
}

fn memory_panel(area: &Area, r: &FlightRecord, span: (f64, f64)) -> anyhow::Result<()> {
    let at = r.trigger.at_ms;
    let mut series: BTreeMap<&str, [Vec<(f64, f64)>; 3]> = BTreeMap::new();
    let mut y_max = 0.0f64;
    for s in &r.samples {
        let x = rel(s.at_ms, at);
        for p in &s.signals {
            let e = series.entry(p.signal.as_str()).or_default();
            let mut push = |i: usize, v: i64| {
                let y = v as f64 / MI;
                y_max = y_max.max(y);
                e[i].push((x, y.max(0.0)));
            };
            push(0, p.available);
            if let Some(t) = p.hard {
                push(1, t);
            }
            if let Some(t) = p.soft {
                push(2, t);
            }
        }
    }
    let mut chart = chart(area, "memory available vs thresholds", "MiB", span, y_max)?;
    for (i, (signal, [available, hard, soft])) in series.into_iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(available, color.stroke_width(2)))?
            .label(format!("{signal} available"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        if !hard.is_empty() {
            chart
                .draw_series(LineSeries::new(hard, OOM.stroke_width(1)))?
                .label(format!("{signal} hard threshold"))
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], OOM));
        }
        if !soft.is_empty() {
            chart
                .draw_series(LineSeries::new(soft, CROSSED.stroke_width(1)))?
                .label(format!("{signal} soft threshold"))
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], CROSSED));
        }
    }
    markers(&mut chart, r, y_max, true)?;
    legend(&mut chart)
}

fn pods_panel(area: &Area, r: &FlightRecord, span: (f64, f64)) -> anyhow::Result<()> {
    let at = r.trigger.at_ms;
    let mut series: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for s in &r.samples {
        for p in &s.top_pods {
            series
                .entry(p.pod.as_str())
                .or_default()
                .push((rel(s.at_ms, at), p.working_set as f64 / MI));
        }
    }
    let peak = |v: &Vec<(f64, f64)>| v.iter().map(|(_, y)| *y).fold(0.0f64, f64::max);
    let mut pods: Vec<(&str, Vec<(f64, f64)>)> = series.into_iter().collect();
    pods.sort_by(|a, b| peak(&b.1).total_cmp(&peak(&a.1)));
    pods.truncate(PODS_DRAWN);
    let y_max = pods.iter().map(|(_, v)| peak(v)).fold(0.0f64, f64::max);
    let mut chart = chart(area, "top pods' working sets", "MiB", span, y_max)?;
    for (i, (pod, points)) in pods.into_iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(format!("pod {pod}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    }
    markers(&mut chart, r, y_max, false)?;
    legend(&mut chart)
}

fn pressure_panel(area: &Area, r: &FlightRecord, span: (f64, f64)) -> anyhow::Result<()> {
    let at = r.trigger.at_ms;
    let psi = |full: bool| -> Vec<(f64, f64)> {
        r.samples
            .iter()
            .filter_map(|s| {
                let p = s.psi?;
                Some((
                    rel(s.at_ms, at),
                    if full { p.full_avg10 } else { p.some_avg10 },
                ))
            })
            .collect()
    };
    let (some, full) = (psi(false), psi(true));
    let y_max = some
        .iter()
        .chain(&full)
        .map(|(_, y)| *y)
        .fold(10.0f64, f64::max);
    let mut chart = chart(
        area,
        "pressure: PSI memory avg10, reclaim stalls, kswapd wake-ups",
        "PSI %",
        span,
        y_max,
    )?;
    chart
        .draw_series(LineSeries::new(some, PALETTE[0].stroke_width(2)))?
        .label("PSI some avg10")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], PALETTE[0]));
    chart
        .draw_series(LineSeries::new(full, PALETTE[1].stroke_width(2)))?
        .label("PSI full avg10")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], PALETTE[1]));
    let marks = |pick: fn(&EventKind) -> bool, y: f64| -> Vec<(f64, f64)> {
        r.events
            .iter()
            .filter(|e| pick(&e.kind))
            .map(|e| (rel(e.at_ms, at), y))
            .collect()
    };
    let stalls = marks(|k| matches!(k, EventKind::ReclaimStall { .. }), y_max * 0.9);
    let kswapd = marks(|k| matches!(k, EventKind::KswapdWake { .. }), y_max * 0.8);
    chart
        .draw_series(
            stalls
                .into_iter()
                .map(|p| TriangleMarker::new(p, 5, OOM.filled())),
        )?
        .label("reclaim stall")
        .legend(|(x, y)| TriangleMarker::new((x + 8, y), 5, OOM.filled()));
    chart
        .draw_series(
            kswapd
                .into_iter()
                .map(|p| Cross::new(p, 4, EVICT.stroke_width(2))),
        )?
        .label("kswapd wake-up")
        .legend(|(x, y)| Cross::new((x + 8, y), 4, EVICT.stroke_width(2)));
    markers(&mut chart, r, y_max, false)?;
    legend(&mut chart)
}

fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 11).into_font())
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests;
