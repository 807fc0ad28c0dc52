//! Schedule math, as CronJob does it: which schedule time is due now (only the most recent
//! missed one; missed runs are never stacked), whether it is past `startingDeadlineSeconds`,
//! and when the next one comes.

use chrono::{DateTime, Duration, Utc};
use chrono_tz::Tz;
use croner::Cron;
pub use gpufabric_api::validate::ScheduleError;
use gpufabric_api::validate::{parse_schedule, parse_time_zone};

/// CronJob's limit: more missed times than this since the last run earn a warning (the
/// most recent one still runs).
pub const TOO_MANY_MISSED: u32 = 100;

/// A parsed schedule in its time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    tz: Tz,
}

/// What the schedule says at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleAt {
    /// The schedule time to start a run for now, if any.
    pub due: Option<DateTime<Utc>>,
    /// Schedule times that passed since the last run, `due` included (counted up to
    /// `TOO_MANY_MISSED + 1`).
    pub missed: u32,
    /// More than [`TOO_MANY_MISSED`] times were missed (CronJob warns and runs the latest).
    pub too_many_missed: bool,
    /// A time that was due but is past `startingDeadlineSeconds`: skipped.
    pub too_late: Option<DateTime<Utc>>,
    /// The first schedule time after `now`: when to look again.
    pub next: Option<DateTime<Utc>>,
}

impl Schedule {
    /// Parses `schedule` (5 fields or a macro) in `time_zone` (IANA name; absent is UTC).
    pub fn parse(schedule: &str, time_zone: Option<&str>) -> Result<Schedule, ScheduleError> {
        let cron = parse_schedule(schedule)?;
        let tz = parse_time_zone(time_zone)?;
        Ok(Schedule { cron, tz })
    }

    /// The first schedule time strictly after `t`, or None when the schedule never fires
    /// again (e.g. `0 0 30 2 *`).
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.tz);
        self.cron
            .find_next_occurrence(&local, false)
            .ok()
            .map(|d| d.with_timezone(&Utc))
    }

    /// The latest schedule time at or before `t`.
    pub fn latest_at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.tz);
        self.cron
            .find_previous_occurrence(&local, true)
            .ok()
            .map(|d| d.with_timezone(&Utc))
    }

    /// CronJob's decision at `now` for a test created at `created` whose last run was for
    /// `last_schedule` (None: never ran), with an optional `startingDeadlineSeconds`.
    pub fn decide(
        &self,
        last_schedule: Option<DateTime<Utc>>,
        created: DateTime<Utc>,
        starting_deadline_seconds: Option<i64>,
        now: DateTime<Utc>,
    ) -> ScheduleAt {
        let mut earliest = last_schedule.unwrap_or(created);
        if let Some(deadline) = starting_deadline_seconds {
            let window_start = now - Duration::seconds(deadline.max(0));
            if window_start > earliest {
                earliest = window_start;
            }
        }
        let next = self.next_after(now);
        let none = ScheduleAt {
            due: None,
            missed: 0,
            too_many_missed: false,
            too_late: None,
            next,
        };
        let Some(first) = self.next_after(earliest) else {
            return none;
        };
        if first > now {
            return none;
        }
        let latest = self
            .latest_at_or_before(now)
            .filter(|t| *t >= first)
            .unwrap_or(first);
        let mut missed = 1;
        let mut t = first;
        while missed <= TOO_MANY_MISSED {
            match self.next_after(t) {
                Some(n) if n <= now => {
                    missed += 1;
                    t = n;
                }
                _ => break,
            }
        }
        let too_late =
            starting_deadline_seconds.is_some_and(|d| latest + Duration::seconds(d.max(0)) < now);
        ScheduleAt {
            due: (!too_late).then_some(latest),
            missed,
            too_many_missed: missed > TOO_MANY_MISSED,
            too_late: too_late.then_some(latest),
            next,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s)
            .single()
            .expect("valid time")
    }

    fn sched(s: &str, tz: Option<&str>) -> Schedule {
        Schedule::parse(s, tz).expect("valid schedule")
    }

    #[test]
    fn nothing_is_due_before_the_first_time_after_creation() {
        let s = sched("0 2 * * *", None);
        let d = s.decide(
            None,
            utc(2026, 1, 1, 3, 0, 0),
            None,
            utc(2026, 1, 1, 12, 0, 0),
        );
        assert_eq!(d.due, None);
        assert_eq!(d.next, Some(utc(2026, 1, 2, 2, 0, 0)));
    }

    #[test]
    fn due_at_the_schedule_time() {
        let s = sched("0 2 * * *", None);
        let d = s.decide(
            None,
            utc(2026, 1, 1, 3, 0, 0),
            None,
            utc(2026, 1, 2, 2, 0, 0),
        );
        assert_eq!(d.due, Some(utc(2026, 1, 2, 2, 0, 0)));
        assert_eq!(d.missed, 1);
        assert_eq!(d.next, Some(utc(2026, 1, 3, 2, 0, 0)));
    }

    #[test]
    fn a_time_already_run_is_not_due_again() {
        let s = sched("0 2 * * *", None);
        let last = utc(2026, 1, 2, 2, 0, 0);
        let d = s.decide(
            Some(last),
            utc(2026, 1, 1, 0, 0, 0),
            None,
            utc(2026, 1, 2, 2, 30, 0),
        );
        assert_eq!(d.due, None);
    }

    #[test]
    fn missed_runs_are_not_stacked_only_the_most_recent_runs() {
        let s = sched("0 * * * *", None);
        let last = utc(2026, 1, 1, 0, 0, 0);
        let d = s.decide(Some(last), last, None, utc(2026, 1, 1, 5, 30, 0));
        assert_eq!(d.due, Some(utc(2026, 1, 1, 5, 0, 0)));
        assert_eq!(d.missed, 5);
        assert!(!d.too_many_missed);
    }

    #[test]
    fn too_many_missed_times_warn_but_the_latest_still_runs() {
        let s = sched("* * * * *", None);
        let last = utc(2026, 1, 1, 0, 0, 0);
        let d = s.decide(Some(last), last, None, utc(2026, 1, 2, 0, 0, 30));
        assert!(d.too_many_missed);
        assert_eq!(d.due, Some(utc(2026, 1, 2, 0, 0, 0)));
    }

    #[test]
    fn starting_deadline_limits_how_far_back_missed_times_count() {
        let s = sched("* * * * *", None);
        let last = utc(2026, 1, 1, 0, 0, 0);
        // 200 missed minutes, but only the last 5 minutes count with a 300 s deadline.
        let d = s.decide(Some(last), last, Some(300), utc(2026, 1, 1, 3, 20, 30));
        assert!(!d.too_many_missed);
        assert_eq!(d.due, Some(utc(2026, 1, 1, 3, 20, 0)));
        assert!(d.missed <= 5);
    }

    #[test]
    fn a_time_past_its_starting_deadline_is_skipped() {
        let s = sched("0 2 * * *", None);
        let last = utc(2026, 1, 1, 2, 0, 0);
        // The operator was down from 01:00 to 02:10; the deadline is 5 minutes.
        let d = s.decide(Some(last), last, Some(300), utc(2026, 1, 2, 2, 10, 0));
        assert_eq!(d.due, None);
        assert_eq!(d.next, Some(utc(2026, 1, 3, 2, 0, 0)));
        // Within the deadline it runs, late.
        let d = s.decide(Some(last), last, Some(900), utc(2026, 1, 2, 2, 10, 0));
        assert_eq!(d.due, Some(utc(2026, 1, 2, 2, 0, 0)));
    }

    #[test]
    fn time_zone_shifts_the_schedule() {
        let s = sched("0 2 * * *", Some("Asia/Tokyo"));
        // 02:00 in Tokyo is 17:00 UTC the day before.
        assert_eq!(
            s.next_after(utc(2026, 1, 1, 0, 0, 0)),
            Some(utc(2026, 1, 1, 17, 0, 0))
        );
        let s = sched("0 2 * * *", Some("America/New_York"));
        assert_eq!(
            s.next_after(utc(2026, 1, 1, 0, 0, 0)),
            Some(utc(2026, 1, 1, 7, 0, 0))
        );
        // Summer time: 02:00 EDT is 06:00 UTC.
        assert_eq!(
            s.next_after(utc(2026, 7, 1, 0, 0, 0)),
            Some(utc(2026, 7, 1, 6, 0, 0))
        );
    }

    #[test]
    fn a_time_inside_the_spring_forward_gap_runs_once_right_after_it() {
        // Europe/Berlin: 2026-03-29 02:00 CET jumps to 03:00 CEST; 02:30 does not exist.
        let s = sched("30 2 * * *", Some("Europe/Berlin"));
        let before = utc(2026, 3, 28, 12, 0, 0);
        let first = s.next_after(before).expect("fires");
        // 03:00 CEST = 01:00 UTC on the 29th.
        assert_eq!(first, utc(2026, 3, 29, 1, 0, 0));
        // Next is 02:30 CEST on the 30th = 00:30 UTC.
        assert_eq!(s.next_after(first), Some(utc(2026, 3, 30, 0, 30, 0)));
    }

    #[test]
    fn a_time_inside_the_fall_back_overlap_runs_once() {
        // Europe/Berlin: 2026-10-25 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
        let s = sched("30 2 * * *", Some("Europe/Berlin"));
        let first = s.next_after(utc(2026, 10, 24, 12, 0, 0)).expect("fires");
        assert_eq!(first, utc(2026, 10, 25, 0, 30, 0)); // 02:30 CEST
        let second = s.next_after(first).expect("fires");
        assert_eq!(second, utc(2026, 10, 26, 1, 30, 0)); // 02:30 CET the next day
    }

    #[test]
    fn macros_work() {
        let s = sched("@hourly", None);
        assert_eq!(
            s.next_after(utc(2026, 1, 1, 0, 10, 0)),
            Some(utc(2026, 1, 1, 1, 0, 0))
        );
        let s = sched("@daily", None);
        assert_eq!(
            s.next_after(utc(2026, 1, 1, 0, 10, 0)),
            Some(utc(2026, 1, 2, 0, 0, 0))
        );
    }

    #[test]
    fn invalid_schedule_or_zone_is_an_error_not_a_panic() {
        assert!(Schedule::parse("61 * * * *", None).is_err());
        assert!(Schedule::parse("* * * *", None).is_err());
        assert!(Schedule::parse("0 2 * * *", Some("Mars/Olympus")).is_err());
    }

    #[test]
    fn a_schedule_that_never_fires_is_refused_before_it_is_searched() {
        // croner would search 3000 years for 30 February on every reconcile.
        let err = Schedule::parse("0 0 30 2 *", None).expect_err("never fires");
        assert!(err.to_string().contains("never fires"), "{err}");
    }
}
