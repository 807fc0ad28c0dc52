//! Conversions between the API's timestamps (jiff) and the schedule math's (chrono).

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// An API timestamp as chrono UTC.
pub fn to_chrono(t: &Time) -> DateTime<Utc> {
    DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32)
        .unwrap_or(DateTime::UNIX_EPOCH)
}

/// A chrono UTC time as an API timestamp (whole seconds, as the API server stores them).
pub fn to_time(t: DateTime<Utc>) -> Time {
    Time(Timestamp::from_second(t.timestamp()).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// Now, as an API timestamp.
pub fn now() -> Time {
    to_time(Utc::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn round_trips_whole_seconds() {
        let t = Utc
            .with_ymd_and_hms(2026, 3, 29, 1, 2, 3)
            .single()
            .expect("valid");
        assert_eq!(to_chrono(&to_time(t)), t);
    }
}
