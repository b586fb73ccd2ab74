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
