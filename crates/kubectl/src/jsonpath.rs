//! `-o jsonpath=TEMPLATE` as kubectl reads it: text, `{.field[*].sub}` expressions (several
//! results joined by a space), `{"\n"}` literals and `{range EXPR}...{end}`.

use jsonpath_rust::JsonPath;
use serde_json::Value;

/// A parsed template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    source: String,
    parts: Vec<Part>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    /// Printed as it is.
    Text(String),
    /// A path, `$` + what kubectl writes (`.tests[*].name`).
    Path(String),
    /// Each result of the path, the parts inside with it as the root.
    Range(String, Vec<Part>),
}

/// Why a template is refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("jsonpath {template:?}: {why} (e.g. -o jsonpath='{{.tests[*].name}}')")]
pub struct TemplateError {
    template: String,
    why: String,
}

impl std::fmt::Display for Template {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.source)
    }
}

impl std::str::FromStr for Template {
    type Err = TemplateError;

    fn from_str(s: &str) -> Result<Template, TemplateError> {
        let err = |why: String| TemplateError {
            template: s.to_string(),
            why,
        };
        let mut stack: Vec<(String, Vec<Part>)> = vec![(String::new(), Vec::new())];
        let mut rest = s;
        while !rest.is_empty() {
            let Some(open) = rest.find('{') else {
                push_text(&mut stack, rest);
                break;
            };
            push_text(&mut stack, &rest[..open]);
            let Some(close) = rest[open..].find('}') else {
                return Err(err("a `{` without its `}`".into()));
            };
            let expr = rest[open + 1..open + close].trim();
            rest = &rest[open + close + 1..];
            let top = &mut stack.last_mut().ok_or_else(|| err("unbalanced".into()))?.1;
            if let Some(lit) = expr.strip_prefix('"').and_then(|e| e.strip_suffix('"')) {
                top.push(Part::Text(unescape(lit)));
            } else if let Some(path) = expr.strip_prefix("range ") {
                let path = path_of(path.trim()).map_err(err)?;
                stack.push((path, Vec::new()));
            } else if expr == "end" {
                if stack.len() < 2 {
                    return Err(err("an `{end}` without its `{range}`".into()));
                }
                let (path, body) = stack.pop().ok_or_else(|| err("unbalanced".into()))?;
                if let Some((_, parts)) = stack.last_mut() {
                    parts.push(Part::Range(path, body));
                }
            } else {
                top.push(Part::Path(path_of(expr).map_err(err)?));
            }
        }
        if stack.len() != 1 {
            return Err(err("a `{range}` without its `{end}`".into()));
        }
        let parts = stack.pop().map(|(_, p)| p).unwrap_or_default();
        Ok(Template {
            source: s.to_string(),
            parts,
        })
    }
}

fn push_text(stack: &mut [(String, Vec<Part>)], text: &str) {
    if let (false, Some((_, parts))) = (text.is_empty(), stack.last_mut()) {
        parts.push(Part::Text(text.to_string()));
    }
}

fn unescape(s: &str) -> String {
    s.replace("\\n", "\n")
        .replace("\\t", "\t")
        .replace("\\\"", "\"")
}

/// kubectl's `.a[*].b` (or `@.a`, `$.a`) as the `$.a[*].b` jsonpath-rust reads; checked now
/// so a typo is a usage error before any request.
fn path_of(expr: &str) -> Result<String, String> {
    let rel = expr.strip_prefix('@').unwrap_or(expr);
    let path = if rel.starts_with('$') {
        rel.to_string()
    } else if rel.starts_with('.') || rel.starts_with('[') {
        format!("${rel}")
    } else if rel.is_empty() {
        "$".to_string()
    } else {
        return Err(format!("{expr:?} is not a path: start it with `.`"));
    };
    Value::Null
        .query(&path)
        .map(|_| path.clone())
        .map_err(|e| format!("{expr:?}: {e}"))
}

impl Template {
    /// The template over `root`; a path that finds nothing prints nothing, as in kubectl.
    pub fn render(&self, root: &Value) -> String {
        let mut out = String::new();
        render_parts(&self.parts, root, &mut out);
        out
    }
}

fn render_parts(parts: &[Part], at: &Value, out: &mut String) {
    for p in parts {
        match p {
            Part::Text(t) => out.push_str(t),
            Part::Path(path) => {
                let found: Vec<String> = query(at, path).into_iter().map(text).collect();
                out.push_str(&found.join(" "));
            }
            Part::Range(path, body) => {
                for item in query(at, path) {
                    render_parts(body, item, out);
                }
            }
        }
    }
}

fn query<'a>(at: &'a Value, path: &str) -> Vec<&'a Value> {
    // Checked when parsed; a path that cannot run finds nothing.
    at.query(path).unwrap_or_default()
}

/// A value as kubectl prints it: a string bare, anything else as JSON.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(template: &str, v: &Value) -> String {
        template.parse::<Template>().expect("parses").render(v)
    }

    #[test]
    fn a_path_prints_its_results_joined_by_a_space_and_strings_bare() {
        let v = json!({"tests": [{"name": "a", "n": 1}, {"name": "b", "n": 2}]});
        assert_eq!(render("{.tests[*].name}", &v), "a b");
        assert_eq!(render("n={.tests[1].n}", &v), "n=2");
        assert_eq!(render("{.tests[0]}", &v), r#"{"n":1,"name":"a"}"#);
        assert_eq!(render("{.missing}", &v), "");
    }

    #[test]
    fn range_prints_its_body_per_result_with_literals() {
        let v = json!({"tests": [{"name": "a", "n": 1}, {"name": "b", "n": 2}]});
        assert_eq!(
            render(r#"{range .tests[*]}{.name}{"\t"}{.n}{"\n"}{end}"#, &v),
            "a\t1\nb\t2\n"
        );
    }

    #[test]
    fn a_broken_template_is_refused_with_what_is_wrong() {
        for (bad, why) in [
            ("{.a", "without its `}`"),
            ("{range .a[*]}{.b}", "without its `{end}`"),
            ("{end}", "without its `{range}`"),
            ("{name}", "is not a path"),
            ("{.a[}", ".a["),
        ] {
            let e = bad.parse::<Template>().expect_err(bad).to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
