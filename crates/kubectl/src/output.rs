//! `-o table|json|yaml`: every command builds a view (plain data, serializable), printed as
//! text or as JSON or YAML of the same view; `report` also writes one HTML page (`-o html`,
//! `-o FILE.html`).

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

/// What `-o` asks for, as the command line gives it: one of the [`Format`]s, or the HTML
/// page of a report, to stdout (`html`) or to a file (a name ending in `.html`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    Format(Format),
    /// The HTML report; `None` writes it to stdout.
    Html(Option<std::path::PathBuf>),
}

impl Default for Output {
    fn default() -> Self {
        Output::Format(Format::Table)
    }
}

impl std::str::FromStr for Output {
    type Err = String;

    fn from_str(s: &str) -> Result<Output, String> {
        match s {
            "table" => Ok(Output::Format(Format::Table)),
            "json" => Ok(Output::Format(Format::Json)),
            "yaml" => Ok(Output::Format(Format::Yaml)),
            "html" => Ok(Output::Html(None)),
            f if f.len() > ".html".len() && f.to_ascii_lowercase().ends_with(".html") => {
                Ok(Output::Html(Some(f.into())))
            }
            other => Err(format!(
                "{other:?} is not an output: table, json, yaml, html (report only) or a file name ending in .html (report only)"
            )),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_is_a_format_or_an_html_page_to_stdout_or_a_file() {
        let parse = |s: &str| s.parse::<Output>();
        assert_eq!(parse("json"), Ok(Output::Format(Format::Json)));
        assert_eq!(parse("table"), Ok(Output::Format(Format::Table)));
        assert_eq!(parse("html"), Ok(Output::Html(None)));
        assert_eq!(
            parse("out/report.HTML"),
            Ok(Output::Html(Some("out/report.HTML".into())))
        );
        for bad in ["xml", ".html", "report.htm", ""] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
