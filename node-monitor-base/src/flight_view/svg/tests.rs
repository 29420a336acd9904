use super::*;

/// `<text>` contents of the SVG.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = t.split_once('>')?.1;
            Some(body.split_once("</text>")?.0.to_owned())
        })
        .collect()
}

/// The picture holds the three panels, each series in its legend, the markers of the kill, the
/// crossing and the reclaim events, and the verdict; it is one well-formed SVG document.
#[test]
fn the_svg_holds_the_series_and_the_markers() {
    let rec = crate::flight_view::tests::climb();
    let svg = render(&rec, "node-a").expect("render");
    assert!(
        svg.trim_start().starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
        "{svg}"
    );
    assert_eq!(svg.matches("<svg").count(), 1);
    let texts = texts(&svg);
    let has = |want: &str| texts.iter().any(|t| t.contains(want));
    for want in [
        "node-a: node-wide OOM kill of hog (4242) of default/hog (record 0)",
        "[dry run] a threshold was met but no pod was evicted",
        "memory available vs thresholds",
        "top pods&apos; working sets",
        "memory.available available",
        "memory.available hard threshold",
        "memory.available soft threshold",
        "pod default/hog",
        "pod default/steady",
        "PSI some avg10",
        "PSI full avg10",
        "reclaim stall",
        "kswapd wake-up",
        "OOM kill: node-wide OOM kill",
        "threshold met: threshold memory.available hard met",
        "seconds from the trigger",
    ] {
        assert!(has(want), "{want:?} not among the texts: {texts:#?}");
    }
    // Lines: available, hard, soft; two pods; PSI some and full; the markers (a kill and a
    // crossing on each of three panels).
    assert!(svg.matches("<polyline").count() >= 3 + 2 + 2 + 6, "{svg}");
    // The kill's marker in red, the reclaim stall's triangle.
    assert!(svg.contains("#D62728") || svg.contains("#d62728"), "{svg}");
    assert!(svg.contains("<polygon"), "{svg}");
    // Tags balance (plotters writes every element closed or self-closed).
    let opened = svg.matches("<text").count();
    assert_eq!(opened, svg.matches("</text>").count());
}

/// A record without PSI, pods or events still renders (an empty panel is drawn with its axes).
#[test]
fn a_sparse_record_renders() {
    let mut rec = crate::flight_view::tests::climb();
    rec.samples.truncate(1);
    for s in &mut rec.samples {
        s.psi = None;
        s.top_pods.clear();
    }
    rec.events.retain(|e| e == &rec.trigger);
    let svg = render(&rec, "node-a").expect("render");
    assert!(svg.contains("OOM kill"), "{svg}");
    rec.samples.clear();
    assert!(render(&rec, "node-a").is_ok());
}
