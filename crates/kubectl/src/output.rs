//! `-o table|wide|json|yaml|name|jsonpath=TEMPLATE`, as kubectl reads it: every command
//! builds a view (plain data, serializable), printed as text, as JSON or YAML of the same
//! view, as the objects it names or through a jsonpath template; `report` also writes one
//! HTML page (`-o html`, `-o FILE.html`).

use crate::doc::Doc;
use crate::jsonpath::Template;
use serde::Serialize;

/// What `-o` asks for.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Format {
    /// Aligned tables, for people.
    #[default]
    Table,
    /// The tables with more columns, where a view has more to show.
    Wide,
    /// The view as one JSON document, for scripts.
    Json,
    /// The view as one YAML document.
    Yaml,
    /// The objects the view shows, `kind.group/name` a line, as `kubectl get -o name`.
    Name,
    /// The JSON of the view through a kubectl jsonpath template.
    JsonPath(Template),
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

/// The outputs `-o` takes, for its help and its errors.
pub const OUTPUTS: &str = "table|wide|json|yaml|name|jsonpath=TEMPLATE|html|FILE.html";

impl std::str::FromStr for Output {
    type Err = String;

    fn from_str(s: &str) -> Result<Output, String> {
        let format = match s {
            "table" => Format::Table,
            "wide" => Format::Wide,
            "json" => Format::Json,
            "yaml" => Format::Yaml,
            "name" => Format::Name,
            "html" => return Ok(Output::Html(None)),
            f if f.len() > ".html".len() && f.to_ascii_lowercase().ends_with(".html") => {
                return Ok(Output::Html(Some(f.into())));
            }
            t if t.starts_with("jsonpath=") => Format::JsonPath(
                t["jsonpath=".len()..]
                    .parse()
                    .map_err(|e: crate::jsonpath::TemplateError| e.to_string())?,
            ),
            other => {
                return Err(format!(
                    "{other:?} is not an output: table, wide, json, yaml, name, jsonpath=TEMPLATE, html (report only) or a file name ending in .html (report only)"
                ));
            }
        };
        Ok(Output::Format(format))
    }
}

/// What a command shows: data that serializes as it is for `-o json`, `-o yaml` and `-o
/// jsonpath=`, a text form for people, and the objects it is about.
pub trait View: Serialize {
    fn doc(&self) -> Doc;
    /// `-o wide`: the tables with more columns; the same tables where there is no more.
    fn wide(&self) -> Doc {
        self.doc()
    }
    /// `-o name`: the objects shown, `kind.group/name` (`node/NAME` for core kinds); none
    /// when the view is about no object.
    fn names(&self) -> Vec<String>;
}

/// `-o name` of a FabricTest.
pub fn test_name(name: &str) -> String {
    format!("fabrictest.gpufabric.io/{name}")
}

/// `-o name` of a FabricTestRun.
pub fn run_name(name: &str) -> String {
    format!("fabrictestrun.gpufabric.io/{name}")
}

/// Why a view could not be written.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("writing JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("writing YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
}

/// `view` in `format`, ending with a newline (a jsonpath template prints exactly what it
/// says, as kubectl's does).
pub fn render<V: View>(view: &V, format: &Format) -> Result<String, RenderError> {
    Ok(match format {
        Format::Table => view.doc().render(),
        Format::Wide => view.wide().render(),
        Format::Json => format!("{}\n", serde_json::to_string_pretty(view)?),
        Format::Yaml => serde_yaml::to_string(view)?,
        Format::Name => view.names().iter().map(|n| format!("{n}\n")).collect(),
        Format::JsonPath(t) => t.render(&serde_json::to_value(view)?),
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
        assert_eq!(parse("wide"), Ok(Output::Format(Format::Wide)));
        assert_eq!(parse("name"), Ok(Output::Format(Format::Name)));
        assert!(matches!(
            parse("jsonpath={.tests[*].name}"),
            Ok(Output::Format(Format::JsonPath(_)))
        ));
        assert_eq!(parse("html"), Ok(Output::Html(None)));
        assert_eq!(
            parse("out/report.HTML"),
            Ok(Output::Html(Some("out/report.HTML".into())))
        );
        for bad in ["xml", ".html", "report.htm", "", "jsonpath={.a", "jsonpath"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    /// Every `-o` of every view a command prints: what a script or a person reads there.
    #[test]
    fn each_output_prints_what_kubectl_prints_there() {
        use crate::findings::Findings;
        use crate::fixtures;
        use crate::request;
        use crate::status::Status;
        use crate::version::Version;
        let format = |o: &str| match o.parse::<Output>() {
            Ok(Output::Format(f)) => f,
            other => panic!("{o}: {other:?}"),
        };
        let status = Status::of(&[fixtures::test()]);
        let findings = Findings::of(&[fixtures::run()]);
        let released = request::release(
            &fixtures::node("h200-02", Some(fixtures::RECORD)),
            "new cable",
        )
        .expect("a quarantined node is released");
        let version = Version::current();
        let cases: &[(String, &str, &str)] = &[
            (
                render(&status, &format("name")).expect("name"),
                "name",
                "fabrictest.gpufabric.io/nightly\n",
            ),
            (
                render(&status, &format("jsonpath={.tests[*].name}")).expect("jp"),
                "jsonpath",
                "nightly",
            ),
            (
                render(
                    &status,
                    &format(r#"jsonpath={range .tests[*]}{.name}={.lastRun.passed}{"\n"}{end}"#),
                )
                .expect("jp"),
                "jsonpath range",
                "nightly=12\n",
            ),
            (
                render(&findings, &format("name")).expect("name"),
                "name",
                "fabrictestrun.gpufabric.io/nightly-manual-1\n",
            ),
            (
                render(&released, &format("name")).expect("name"),
                "name",
                "node/h200-02\n",
            ),
            (
                render(&version, &format("jsonpath={.clientVersion.gitVersion}")).expect("jp"),
                "jsonpath",
                &format!("v{}", env!("CARGO_PKG_VERSION")),
            ),
        ];
        for (got, what, want) in cases {
            assert_eq!(got, want, "{what}");
        }
        // wide: the table's columns and more, row for row.
        let table = render(&status, &Format::Table).expect("table");
        let wide = render(&status, &Format::Wide).expect("wide");
        let header = |t: &str| t.lines().next().unwrap_or_default().to_string();
        assert!(
            header(&wide).starts_with(header(&table).trim_end()),
            "{wide}"
        );
        for col in ["ACTIVE RUN", "TRIGGER", "ERRORED", "FINDINGS", "COMPLETED"] {
            assert!(header(&wide).contains(col), "{col} in {wide}");
        }
        let wide = render(&findings, &Format::Wide).expect("wide");
        assert!(
            header(&wide).contains("MEASURED") && header(&wide).contains("EXPECTED"),
            "{wide}"
        );
        assert!(wide.contains("nightly-manual-1  nightly"), "{wide}");
        assert!(wide.contains("95"), "{wide}");
        // A view without more to show prints its table.
        assert_eq!(
            render(&version, &Format::Wide).expect("wide"),
            render(&version, &Format::Table).expect("table")
        );
        assert!(
            render(&version, &Format::Table)
                .expect("table")
                .contains("Client Version: v")
        );
    }
}
