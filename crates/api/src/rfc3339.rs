//! Times written as RFC 3339 in UTC with whole seconds (`2026-11-23T17:44:17Z`): the one
//! writer every record, annotation and request uses.

use k8s_openapi::jiff::Timestamp;

/// `t` as RFC 3339 in UTC, whole seconds, `Z` for the zone.
pub fn rfc3339(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Now, as [`rfc3339`] writes it.
pub fn now() -> String {
    rfc3339(Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).expect("in range")
    }

    #[test]
    fn a_time_reads_as_utc_calendar_time_in_whole_seconds() {
        assert_eq!(rfc3339(Timestamp::UNIX_EPOCH), "1970-01-01T00:00:00Z");
        // A leap day, the last second of a year, and the leap day of a century year.
        assert_eq!(rfc3339(at(1_709_210_096)), "2024-02-29T12:34:56Z");
        assert_eq!(rfc3339(at(1_798_761_599)), "2026-12-31T23:59:59Z");
        assert_eq!(rfc3339(at(951_782_400)), "2000-02-29T00:00:00Z");
        let fraction = Timestamp::new(1_700_000_000, 999_999_999).expect("in range");
        assert_eq!(
            rfc3339(fraction),
            "2023-11-14T22:13:20Z",
            "cut, not rounded"
        );
    }

    #[test]
    fn what_it_writes_reads_back_as_the_same_second() {
        let t = at(1_795_000_123);
        let back: Timestamp = rfc3339(t).parse().expect("RFC 3339");
        assert_eq!(back, t);
    }
}
