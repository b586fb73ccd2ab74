//! The two text formats of `/metrics`: OpenMetrics, which the registry writes and Prometheus asks
//! for, and Prometheus' classic text format (0.0.4), the default for every other scraper, as
//! Prometheus' own client libraries do.

/// The format a scrape gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Classic,
    OpenMetrics,
}

impl Format {
    /// The format the `Accept` header prefers: OpenMetrics when its quality is the highest of
    /// the media ranges the agent can answer (and not 0), the classic format otherwise.
    pub fn accepted(accept: Option<&str>) -> Self {
        let (mut openmetrics, mut classic) = (0.0f32, 0.0f32);
        for range in accept.unwrap_or_default().split(',') {
            let mut parameters = range.split(';').map(str::trim);
            let media_type = parameters.next().unwrap_or_default().to_ascii_lowercase();
            let quality = parameters
                .filter_map(|parameter| parameter.split_once('='))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("q"))
                .map_or(1.0, |(_, value)| value.trim().parse().unwrap_or(0.0));
            match media_type.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(quality),
                "text/plain" | "text/*" | "*/*" => classic = classic.max(quality),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= classic {
            Format::OpenMetrics
        } else {
            Format::Classic
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Classic => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// `openmetrics` (as the registry writes it: no `_created` samples) in the classic format. What
/// differs: a counter's family is named like its samples (`_total`), an info metric is a gauge
/// named `_info`, an unknown one is `untyped`, and there are no `# UNIT` lines or `# EOF`.
pub fn classic(openmetrics: &str) -> String {
    // (family, its classic name) of the families the types rename.
    let renamed: Vec<(&str, String)> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .filter_map(|(family, kind)| match kind {
            "counter" => Some((family, format!("{family}_total"))),
            "info" => Some((family, format!("{family}_info"))),
            _ => None,
        })
        .collect();
    let classic_name = |family: &str| {
        renamed
            .iter()
            .find(|(renamed, _)| *renamed == family)
            .map_or_else(|| family.to_owned(), |(_, name)| name.clone())
    };
    let mut text = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        let converted = if let Some(rest) = line.strip_prefix("# HELP ") {
            let (family, help) = rest.split_once(' ').unwrap_or((rest, ""));
            format!("# HELP {} {help}", classic_name(family))
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (family, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let kind = match kind {
                "info" => "gauge",
                "unknown" => "untyped",
                kind => kind,
            };
            format!("# TYPE {} {kind}", classic_name(family))
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        } else {
            line.to_owned()
        };
        text.push_str(&converted);
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_only_when_asked_for() {
        for (accept, format) in [
            (None, Format::Classic),
            (Some("*/*"), Format::Classic),
            (Some("text/plain;version=0.0.4"), Format::Classic),
            // What Prometheus 2.x sends.
            (
                Some(
                    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                ),
                Format::OpenMetrics,
            ),
            (
                Some("application/openmetrics-text; Q=0, text/plain"),
                Format::Classic,
            ),
            // Prometheus configured to prefer the classic format.
            (
                Some(
                    "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5",
                ),
                Format::Classic,
            ),
            (Some("application/openmetrics-text"), Format::OpenMetrics),
        ] {
            assert_eq!(Format::accepted(accept), format, "{accept:?}");
        }
    }

    #[test]
    fn families_are_named_like_their_samples() {
        let openmetrics = "# HELP a_events Events.\n# TYPE a_events counter\na_events_total 7\n# HELP a_build Build.\n# TYPE a_build info\na_build_info{version=\"1\"} 1\n# HELP a_apply_seconds Apply.\n# TYPE a_apply_seconds histogram\n# UNIT a_apply_seconds seconds\na_apply_seconds_sum 0.5\na_apply_seconds_count 1\na_apply_seconds_bucket{le=\"+Inf\"} 1\n# TYPE a_other unknown\na_other 1\n# EOF\n";
        assert_eq!(
            classic(openmetrics),
            "# HELP a_events_total Events.\n# TYPE a_events_total counter\na_events_total 7\n# HELP a_build_info Build.\n# TYPE a_build_info gauge\na_build_info{version=\"1\"} 1\n# HELP a_apply_seconds Apply.\n# TYPE a_apply_seconds histogram\na_apply_seconds_sum 0.5\na_apply_seconds_count 1\na_apply_seconds_bucket{le=\"+Inf\"} 1\n# TYPE a_other untyped\na_other 1\n"
        );
    }
}
