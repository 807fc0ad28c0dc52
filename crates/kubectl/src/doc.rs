//! Text output: aligned tables, and documents of headed sections, lines and tables, as
//! `kubectl gpufabric` and the demo print them.

/// Rows under a header, printed with each column as wide as its widest cell.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these column names.
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text: columns two spaces apart, the last one not padded, and `(none)`
    /// under a header without rows.
    pub fn render(&self) -> String {
        let all: Vec<&Vec<String>> = std::iter::once(&self.header).chain(&self.rows).collect();
        let cols = all.iter().map(|r| r.len()).max().unwrap_or(0);
        let widths: Vec<usize> = (0..cols)
            .map(|c| {
                all.iter()
                    .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for r in &all {
            let line: Vec<String> = r
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    if i + 1 == r.len() {
                        s.clone()
                    } else {
                        format!("{s:<w$}", w = widths[i])
                    }
                })
                .collect();
            out.push_str(line.join("  ").trim_end());
            out.push('\n');
        }
        if self.rows.is_empty() {
            out.push_str("(none)\n");
        }
        out
    }
}

/// One part of a [`Doc`].
#[derive(Clone, Debug, PartialEq)]
pub enum Block {
    /// A section's title: `==> title`.
    Heading(String),
    /// A line of detail, indented by four spaces.
    Line(String),
    Table(Table),
}

/// Headed sections of lines and tables: what a command prints as text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Doc {
    pub blocks: Vec<Block>,
}

impl Doc {
    pub fn heading(&mut self, s: impl Into<String>) {
        self.blocks.push(Block::Heading(s.into()));
    }

    pub fn line(&mut self, s: impl Into<String>) {
        self.blocks.push(Block::Line(s.into()));
    }

    pub fn table(&mut self, t: Table) {
        self.blocks.push(Block::Table(t));
    }

    pub fn extend(&mut self, other: Doc) {
        self.blocks.extend(other.blocks);
    }

    /// The document as text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for b in &self.blocks {
            match b {
                Block::Heading(s) => out.push_str(&format!("==> {s}\n")),
                Block::Line(s) => out.push_str(&format!("    {s}\n")),
                Block::Table(t) => out.push_str(&t.render()),
            }
        }
        out
    }
}

/// `v` with `decimals` decimals, or `-` when absent.
pub fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map(|v| format!("{v:.decimals$}"))
        .unwrap_or_else(|| "-".into())
}

/// The name a value has on the wire (its serde form), e.g. `Critical` or `allReduceBusBw`.
pub fn wire<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

/// Names joined by commas, or `-` when there are none.
pub fn names(list: &[String]) -> String {
    if list.is_empty() {
        "-".into()
    } else {
        list.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell_and_the_last_is_not_padded() {
        let mut t = Table::new(&["NODE", "VERDICT", "REASON"]);
        t.push(vec!["h100-03".into(), "Failed".into(), "slow".into()]);
        t.push(vec!["a".into(), "Passed".into(), String::new()]);
        assert_eq!(
            t.render(),
            "NODE     VERDICT  REASON\nh100-03  Failed   slow\na        Passed\n"
        );
    }

    #[test]
    fn an_empty_table_says_none_under_its_header() {
        assert_eq!(Table::new(&["A", "B"]).render(), "A  B\n(none)\n");
    }

    #[test]
    fn a_doc_heads_sections_and_indents_lines() {
        let mut d = Doc::default();
        d.heading("findings (0)");
        d.line("none");
        d.table(Table::new(&["X"]));
        assert_eq!(d.render(), "==> findings (0)\n    none\nX\n(none)\n");
    }

    #[test]
    fn values_print_as_on_the_wire_and_absent_numbers_as_a_dash() {
        assert_eq!(wire(&gpufabric_api::Severity::Critical), "Critical");
        assert_eq!(fmt_opt(None, 1), "-");
        assert_eq!(fmt_opt(Some(1.26), 1), "1.3");
        assert_eq!(names(&[]), "-");
        assert_eq!(names(&["a".into(), "b".into()]), "a,b");
    }
}
