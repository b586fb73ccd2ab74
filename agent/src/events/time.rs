//! Event times in RFC 3339 with nanoseconds, written without allocating: every event has one.

use std::time::SystemTime;

use serde::Serialize;

/// A time in RFC 3339 with nanoseconds, in UTC ("2026-11-25T15:28:10.000000001Z"), as
/// `humantime::format_rfc3339_nanos` writes it; its text kept in place (every event has one).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Timestamp([u8; 30]);

impl Timestamp {
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("digits and ASCII signs")
    }
}

impl std::fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// `time` as a `Timestamp`.
pub(super) fn rfc3339_nanos(time: SystemTime) -> Timestamp {
    Rfc3339::default().format(time)
}

/// Writes times as `rfc3339_nanos` does, without the formatting machinery (every event has one),
/// and works out the date of a second once: the events of a batch mostly fall in a few seconds.
#[derive(Default)]
pub(super) struct Rfc3339 {
    /// The last second written, and its text up to the fraction ("2026-11-25T15:28:10").
    second: Option<(u64, [u8; 19])>,
}

/// Writes `value` as the `width` digits of `text` that end before `end`.
fn digits(text: &mut [u8], end: usize, mut value: u64, width: usize) {
    for at in (end - width..end).rev() {
        text[at] = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

impl Rfc3339 {
    pub(super) fn format(&mut self, time: SystemTime) -> Timestamp {
        let since_epoch = time
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let seconds = since_epoch.as_secs();
        let date_time = match self.second {
            Some((second, text)) if second == seconds => text,
            _ => {
                let text = date_time(seconds);
                self.second = Some((seconds, text));
                text
            }
        };
        let mut text = *b"0000-00-00T00:00:00.000000000Z";
        text[..19].copy_from_slice(&date_time);
        digits(&mut text, 29, u64::from(since_epoch.subsec_nanos()), 9);
        Timestamp(text)
    }
}

/// "YYYY-MM-DDTHH:MM:SS" of `seconds` since the epoch.
fn date_time(seconds: u64) -> [u8; 19] {
    // Days to a civil date (Howard Hinnant's `civil_from_days`; days since 0000-03-01).
    let days = seconds / 86_400 + 719_468;
    let era = days / 146_097;
    let day_of_era = days % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    let time_of_day = seconds % 86_400;
    let mut text = *b"0000-00-00T00:00:00";
    digits(&mut text, 4, year, 4);
    digits(&mut text, 7, month, 2);
    digits(&mut text, 10, day, 2);
    digits(&mut text, 13, time_of_day / 3_600, 2);
    digits(&mut text, 16, time_of_day / 60 % 60, 2);
    digits(&mut text, 19, time_of_day % 60, 2);
    text
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn times_are_written_as_humantime_writes_them() {
        // One formatter for all, as for a batch: a second it wrote before, and a new one.
        let mut batch = Rfc3339::default();
        for nanos in [
            0,
            1,
            951_782_400_000_000_000,   // 2000-02-29
            1_709_164_799_999_999_999, // 2024-02-28, the last nanosecond
            1_709_164_800_000_000_000,
            1_764_084_490_123_456_789,
            1_764_084_490_999_999_999,
            1_764_084_490_123_456_789,
            4_102_444_800_000_000_000,  // 2100-01-01
            18_446_744_073_709_551_615, // 2554-07-21, the last time a u64 holds
        ] {
            let time = SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos);
            let expected = humantime::format_rfc3339_nanos(time).to_string();
            assert_eq!(rfc3339_nanos(time).as_str(), expected);
            assert_eq!(batch.format(time).as_str(), expected);
        }
    }
}
