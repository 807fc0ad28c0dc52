//! Parsers of command-line values: sizes, seconds, data types, collectives, 0/1 switches.

use gpufabric_api::suite::{Collective, DataType};

/// Parses a byte size with an optional binary suffix: `8`, `1K`, `16M`, `1G` (also `KiB`,
/// `MB` and lower case; every suffix is a power of 1024, as in nccl-tests).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    if digits.is_empty() {
        return Err(format!(
            "{text:?} is not a size; write a number with an optional K, M or G suffix, like 16M"
        ));
    }
    let n: u64 = digits
        .parse()
        .map_err(|e| format!("{text:?} is not a size: {e}"))?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        other => {
            return Err(format!(
                "{text:?}: unknown size suffix {other:?}; use K, M or G (powers of 1024)"
            ));
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// Parses a positive number of seconds (fractions allowed).
pub fn parse_seconds(text: &str) -> Result<std::time::Duration, String> {
    let s: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(s.is_finite() && s > 0.0) {
        return Err(format!("{text:?}: the timeout must be more than 0 seconds"));
    }
    Ok(std::time::Duration::from_secs_f64(s))
}

/// Parses a data type by its nccl-tests name (`float`, `half`, ...) or API name
/// (`float32`, `float16`, ...), in any case.
pub fn parse_data_type(text: &str) -> Result<DataType, String> {
    const ALL: [DataType; 10] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
    ];
    let key = text.trim().to_ascii_lowercase();
    let api_name = |d: DataType| format!("{d:?}").to_ascii_lowercase();
    ALL.into_iter()
        .find(|d| d.nccl_tests_name() == key || api_name(*d) == key)
        .ok_or_else(|| {
            format!(
                "unknown data type {text:?}; one of {}",
                ALL.map(DataType::nccl_tests_name).join(", ")
            )
        })
}

/// The reduction operation: only `sum` is measured.
pub fn parse_op(text: &str) -> Result<String, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "sum" => Ok("sum".into()),
        "prod" | "min" | "max" | "avg" | "all" => Err(format!(
            "-o {text}: the sweep reduces with sum only; drop -o or pass -o sum"
        )),
        _ => Err(format!(
            "unknown operation {text:?}; nccl-tests' operations are sum, prod, min, max, avg, all, and the sweep measures sum"
        )),
    }
}

/// A 0 or 1 switch, as nccl-tests takes them.
pub fn parse_switch(text: &str) -> Result<bool, String> {
    match text.trim() {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(format!("{text:?}: expected 0 or 1")),
    }
}

/// nccl-tests' `-z`: only non-blocking collectives are measured.
pub fn parse_blocking(text: &str) -> Result<u8, String> {
    match parse_switch(text)? {
        false => Ok(0),
        true => Err(
            "-z 1 (blocking collectives) is not supported: the sweep enqueues every iteration without waiting, as nccl-tests does by default".into(),
        ),
    }
}

/// Parses a collective by its API name or nccl-tests name, in any case.
pub fn parse_collective(text: &str) -> Result<Collective, String> {
    let key: String = text
        .trim()
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .collect::<String>()
        .to_ascii_lowercase();
    Collective::ALL
        .into_iter()
        .find(|c| c.api_name().to_ascii_lowercase() == key)
        .ok_or_else(|| {
            format!(
                "unknown collective {text:?}; one of {}",
                Collective::ALL
                    .iter()
                    .map(|c| c.api_name())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2gib"), Ok(2 << 30));
        assert_eq!(parse_size("64KB"), Ok(64 << 10));
        assert!(parse_size("M").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999T").is_err());
    }

    #[test]
    fn collectives_parse_by_either_name() {
        assert_eq!(parse_collective("allReduce"), Ok(Collective::AllReduce));
        assert_eq!(parse_collective("all_reduce"), Ok(Collective::AllReduce));
        assert_eq!(parse_collective("alltoall"), Ok(Collective::AllToAll));
        assert_eq!(parse_collective("sendrecv"), Ok(Collective::SendRecv));
        assert!(parse_collective("allscatter").is_err());
    }

    #[test]
    fn nccl_tests_flags_parse_as_nccl_tests_spells_them() {
        assert_eq!(parse_data_type("float"), Ok(DataType::Float32));
        assert_eq!(parse_data_type("half"), Ok(DataType::Float16));
        assert_eq!(parse_data_type("bfloat16"), Ok(DataType::Bfloat16));
        assert_eq!(parse_data_type("Float64"), Ok(DataType::Float64));
        assert!(parse_data_type("fp8").is_err());
        assert_eq!(parse_op("sum"), Ok("sum".into()));
        assert!(parse_op("max").is_err_and(|e| e.contains("sum only")));
        assert_eq!(parse_switch("0"), Ok(false));
        assert!(parse_switch("2").is_err());
        assert_eq!(parse_blocking("0"), Ok(0));
        assert!(parse_blocking("1").is_err_and(|e| e.contains("not supported")));
    }

    #[test]
    fn timeouts_must_be_positive() {
        assert_eq!(
            parse_seconds("0.5"),
            Ok(std::time::Duration::from_millis(500))
        );
        assert!(parse_seconds("0").is_err());
        assert!(parse_seconds("soon").is_err());
    }
}
