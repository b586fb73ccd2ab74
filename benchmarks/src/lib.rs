//! What the benchmarks share: where the workspace is, the font their plots use, and the kernel
//! benchmark's results.

pub mod kernel;

use std::path::{Path, PathBuf};

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Makes DejaVu Sans plotters' "sans-serif" (plotters draws no text without a font).
pub fn register_font() -> anyhow::Result<()> {
    let font = std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")?;
    plotters::style::register_font(
        "sans-serif",
        plotters::style::FontStyle::Normal,
        Box::leak(font.into_boxed_slice()),
    )
    .map_err(|_| anyhow::anyhow!("the DejaVu font does not load"))
}

/// "6.1" for "6.1.0-41-amd64".
pub fn kernel_series(release: &str) -> String {
    release
        .split(['.', '-', '+'])
        .take(2)
        .collect::<Vec<_>>()
        .join(".")
}

pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// A report's command line, `BIN [--out DIR] INPUT.json...`: DIR (benchmarks/results unless
/// given) and the inputs.
pub fn report_args(bin: &str) -> anyhow::Result<(PathBuf, Vec<String>)> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let out = match args.iter().position(|arg| arg == "--out") {
        Some(at) => {
            anyhow::ensure!(at + 1 < args.len(), "--out needs a directory");
            let out = args.remove(at + 1);
            args.remove(at);
            out.into()
        }
        None => workspace().join("benchmarks/results"),
    };
    anyhow::ensure!(!args.is_empty(), "usage: {bin} [--out DIR] INPUT.json...");
    Ok((out, args))
}

/// A report's input: the JSON file at `path`, as `T`.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &str) -> anyhow::Result<T> {
    use anyhow::Context;
    let text = std::fs::read_to_string(path).with_context(|| path.to_owned())?;
    serde_json::from_str(&text).with_context(|| path.to_owned())
}
