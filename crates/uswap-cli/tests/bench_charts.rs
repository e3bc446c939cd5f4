//! `--svg DIR` on the benchmarks writes charts: well-formed SVG documents
//! that carry their series' names.

use std::process::Command;

const USWAP: &str = env!("CARGO_BIN_EXE_uswap");

/// Runs the command and fails the test, with its stderr, if it fails.
fn succeeds(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn chart(dir: &std::path::Path, name: &str) -> String {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        text.trim_start().starts_with("<svg"),
        "{name} is not an SVG document"
    );
    assert!(text.trim_end().ends_with("</svg>"), "{name} is cut short");
    text
}

#[test]
fn bench_codecs_draws_the_by_n_charts() {
    let dir = std::env::temp_dir().join(format!("uswap-charts-{}", std::process::id()));
    succeeds(
        Command::new(USWAP)
            .args([
                "bench", "codecs", "--codecs", "lz4", "--folios", "4k", "--rounds", "1", "--svg",
            ])
            .arg(&dir),
    );
    let latency = chart(&dir, "byn-latency.svg");
    assert!(latency.contains("compress") && latency.contains("decompress"));
    assert!(chart(&dir, "byn-ratio.svg").contains("ratio"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_faults_draws_a_latency_chart_per_mode() {
    let dir = std::env::temp_dir().join(format!("uswap-fault-charts-{}", std::process::id()));
    succeeds(
        Command::new(USWAP)
            .args([
                "bench",
                "faults",
                "--faults",
                "200",
                "--folios",
                "64k",
                "--slot-free",
                "async",
                "--size",
                "64M",
                "--memory-high",
                "16M",
                "--svg",
            ])
            .arg(&dir),
    );
    for mode in ["pressure", "no-pressure"] {
        let text = chart(&dir, &format!("faults-{mode}.svg"));
        assert!(text.contains("64K async move"), "{mode}: no series label");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_usemem_draws_a_bar_per_configuration() {
    let dir = std::env::temp_dir().join(format!("uswap-usemem-charts-{}", std::process::id()));
    let json = dir.join("usemem.json");
    std::fs::create_dir_all(&dir).unwrap();
    succeeds(
        Command::new(USWAP)
            .args([
                "bench",
                "usemem",
                "16M",
                "-n",
                "2",
                "--memory-high",
                "8M",
                "--engines",
                "auto,0",
                "--layout",
                "page,folio",
                "--modes",
                "threads",
                "--rounds",
                "1",
                "--json",
            ])
            .arg(&json)
            .arg("--svg")
            .arg(&dir),
    );
    let text = chart(&dir, "usemem.svg");
    for label in [
        "threads engines auto (",
        "threads engines 0 page",
        "threads engines 0 folio",
    ] {
        assert!(text.contains(label), "no bar for {label}");
    }
    let rows: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for row in rows {
        assert!(row["mb_per_s"][0].as_f64().unwrap() > 0.0, "{row}");
        let auto = row["engines"].as_str().unwrap().starts_with("auto");
        assert_eq!(row["vs_best_fixed"].is_number(), auto, "{row}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
