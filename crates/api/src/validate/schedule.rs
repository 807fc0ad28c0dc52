//! Schedules and time zones as the operator runs them, and the schedules that never fire.

use crate::test::CRON_MESSAGE;
use chrono::{Datelike, NaiveDate};
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

/// Why a schedule or its time zone cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("{} (got {:?})", CRON_MESSAGE, .0)]
    NotFiveFields(String),
    #[error("{} (got {:?}: {})", CRON_MESSAGE, .schedule, .reason)]
    Unparsable { schedule: String, reason: String },
    #[error(
        "schedule {0:?} never fires: none of its months has that day of the month (e.g. 31 February or 31 April); pick a day those months have"
    )]
    NeverFires(String),
    #[error(
        "timeZone {0:?} is not a known IANA time zone (for example \"UTC\" or \"Europe/Berlin\")"
    )]
    UnknownTimeZone(String),
}

/// Parses a schedule the way the operator runs it: 5 fields (no seconds, no year) or a
/// macro such as `@daily`; refuses one that never fires.
pub fn parse_schedule(schedule: &str) -> Result<Cron, ScheduleError> {
    let trimmed = schedule.trim();
    if !trimmed.starts_with('@') && trimmed.split_whitespace().count() != 5 {
        return Err(ScheduleError::NotFiveFields(schedule.to_string()));
    }
    let cron = CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(trimmed)
        .map_err(|e| ScheduleError::Unparsable {
            schedule: schedule.to_string(),
            reason: e.to_string(),
        })?;
    if fires_on_some_day(&cron) {
        Ok(cron)
    } else {
        Err(ScheduleError::NeverFires(schedule.to_string()))
    }
}

/// Years searched for a matching day: 28 years repeat every (date, weekday) pair of the
/// Gregorian calendar between century years, leap days included.
const SCHEDULE_YEARS: std::ops::RangeInclusive<i32> = 2024..=2051;

/// Whether some day of [`SCHEDULE_YEARS`] matches the day-of-month, month and day-of-week
/// fields, with croner's own rule (either day field when both are restricted). Every hour
/// and minute field that parses names at least one time of day, so a matching day fires.
fn fires_on_some_day(cron: &Cron) -> bool {
    let p = &cron.pattern;
    let Some(mut day) = NaiveDate::from_ymd_opt(*SCHEDULE_YEARS.start(), 1, 1) else {
        return true;
    };
    while SCHEDULE_YEARS.contains(&day.year()) {
        if p.month_match(day.month()).unwrap_or(false)
            && p.day_match(day.year(), day.month(), day.day())
                .unwrap_or(false)
        {
            return true;
        }
        match day.succ_opt() {
            Some(next) => day = next,
            None => return true,
        }
    }
    false
}

/// Parses a time zone name (IANA, e.g. "Europe/Berlin"); absent means UTC.
pub fn parse_time_zone(tz: Option<&str>) -> Result<chrono_tz::Tz, ScheduleError> {
    match tz {
        None => Ok(chrono_tz::UTC),
        Some(name) => name
            .parse::<chrono_tz::Tz>()
            .map_err(|_| ScheduleError::UnknownTimeZone(name.to_string())),
    }
}
