//! `-o table|json|yaml`: every command builds a view (plain data, serializable), printed as
//! text or as JSON or YAML of the same view.

use crate::doc::Doc;
use serde::Serialize;

/// What `-o` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Aligned tables, for people.
    #[default]
    Table,
    /// The view as one JSON document, for scripts.
    Json,
    /// The view as one YAML document.
    Yaml,
}

/// What a command shows: data that serializes as it is for `-o json` and `-o yaml`, and a
/// text form for people.
pub trait View: Serialize {
    fn doc(&self) -> Doc;
}

/// Why a view could not be written.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("writing JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("writing YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
}

/// `view` in `format`, ending with a newline.
pub fn render<V: View>(view: &V, format: Format) -> Result<String, RenderError> {
    Ok(match format {
        Format::Table => view.doc().render(),
        Format::Json => format!("{}\n", serde_json::to_string_pretty(view)?),
        Format::Yaml => serde_yaml::to_string(view)?,
    })
}
