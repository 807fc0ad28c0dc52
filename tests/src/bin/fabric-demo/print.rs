//! How the demo prints: step and detail lines, aligned tables, and values formatted for
//! them.

pub(crate) fn step(msg: impl AsRef<str>) {
    println!("==> {}", msg.as_ref());
}

pub(crate) fn info(msg: impl AsRef<str>) {
    println!("    {}", msg.as_ref());
}

pub(crate) fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map(|v| format!("{v:.decimals$}"))
        .unwrap_or_else(|| "-".into())
}

/// The name a value has on the wire (its serde form), e.g. `critical` or `allReduceBusBw`.
pub(crate) fn wire<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

pub(crate) fn print_table(rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
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
        println!("{}", line.join("  ").trim_end());
    }
    if rows.len() <= 1 {
        println!("(none)");
    }
}
