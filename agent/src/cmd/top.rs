//! `palisade top`: live decisions per rule and what deciding costs in the kernel, read from a
//! running agent's `/metrics`.

use std::{
    collections::BTreeMap,
    io::Write,
    net::SocketAddr,
    time::{Duration, Instant},
};

use anyhow::Context;

use crate::http::client::Client;

#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// The agent's metrics address.
    #[arg(long, value_name = "ADDRESS", default_value = "127.0.0.1:9464")]
    pub address: SocketAddr,
    /// Time between refreshes.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Rules shown, the busiest first.
    #[arg(long, value_name = "COUNT", default_value_t = 20)]
    pub rows: usize,
    /// Print one screen and exit.
    #[arg(long)]
    pub once: bool,
}

/// Shows the agent's decisions every `interval`: redrawn in place on a `terminal`, otherwise
/// (a pipe, a file) one screen after another, separated by a blank line, with no control codes.
pub async fn run(args: TopArgs, out: &mut impl Write, terminal: bool) -> anyhow::Result<()> {
    let client = Client::new(&format!("http://{}/metrics", args.address))?;
    let mut previous: Option<(Instant, View)> = None;
    loop {
        let answer = client
            .get()
            .await
            .with_context(|| format!("reading {}", client.url()))?;
        anyhow::ensure!(
            answer.status.is_success(),
            "{}: {}",
            client.url(),
            answer.status
        );
        let view = View::parse(&String::from_utf8_lossy(&answer.body))?;
        let now = Instant::now();
        let since = previous
            .as_ref()
            .map(|(then, before)| (now.duration_since(*then), before));
        let screen = view.render(since, args.rows);
        let text = if args.once {
            screen
        } else {
            frame(&screen, terminal, previous.is_none())
        };
        match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            // The reader is gone (`palisade top | head`): nothing left to do.
            Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            written => written?,
        }
        if args.once {
            return Ok(());
        }
        previous = Some((now, view));
        tokio::time::sleep(args.interval).await;
    }
}

/// One refresh's output: on a terminal, cleared first; elsewhere, after a blank line (but the
/// `first`).
fn frame(screen: &str, terminal: bool, first: bool) -> String {
    if terminal {
        format!("\x1b[H\x1b[2J{screen}")
    } else if first {
        screen.to_owned()
    } else {
        format!("\n{screen}")
    }
}

/// (policy, rule, hook, action)
type RuleKey = (String, String, String, String);

/// The metrics `top` shows, from one scrape.
#[derive(Debug, Default)]
struct View {
    /// Decisions and throttled events.
    rules: BTreeMap<RuleKey, (f64, f64)>,
    /// (rule class, hook) -> (decisions, seconds)
    evaluations: BTreeMap<(String, String), (f64, f64)>,
    /// hook -> (runs, seconds)
    runs: BTreeMap<String, (f64, f64)>,
    totals: BTreeMap<String, f64>,
}

impl View {
    fn parse(text: &str) -> anyhow::Result<Self> {
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|line| Ok(line.to_owned())))
            .context("the agent's metrics do not parse")?;
        let mut view = View::default();
        for sample in scrape.samples {
            let value = match sample.value {
                prometheus_parse::Value::Counter(value)
                | prometheus_parse::Value::Gauge(value)
                | prometheus_parse::Value::Untyped(value) => value,
                _ => continue,
            };
            let label = |name: &str| sample.labels.get(name).unwrap_or_default().to_owned();
            let rule = || {
                (
                    label("policy"),
                    label("rule"),
                    label("hook"),
                    label("action"),
                )
            };
            match sample.metric.as_str() {
                "palisade_rule_decisions_total" => view.rules.entry(rule()).or_default().0 = value,
                "palisade_rule_events_throttled_total" => {
                    view.rules.entry(rule()).or_default().1 = value
                }
                "palisade_rule_evaluations_total" => {
                    let key = (label("rule_class"), label("hook"));
                    view.evaluations.entry(key).or_default().0 = value
                }
                "palisade_rule_evaluation_seconds_total" => {
                    let key = (label("rule_class"), label("hook"));
                    view.evaluations.entry(key).or_default().1 = value
                }
                "palisade_hook_runs_total" => view.runs.entry(label("hook")).or_default().0 = value,
                "palisade_hook_run_seconds_total" => {
                    view.runs.entry(label("hook")).or_default().1 = value
                }
                name => {
                    view.totals.insert(name.to_owned(), value);
                }
            }
        }
        Ok(view)
    }

    fn total(&self, name: &str) -> f64 {
        self.totals.get(name).copied().unwrap_or(0.0)
    }

    /// The screen; with the previous scrape and the time since, rates too.
    fn render(&self, since: Option<(Duration, &View)>, rows: usize) -> String {
        let mut screen = format!(
            "palisade top   targets {}   policies {}   events {} (throttled {}, dropped {})   agent CPU {:.1} s, RSS {:.1} MiB\n\n",
            self.total("palisade_targets"),
            self.total("palisade_policies"),
            self.total("palisade_events_total"),
            self.total("palisade_events_throttled_total"),
            self.total("palisade_events_dropped_total"),
            self.total("process_cpu_seconds_total"),
            self.total("process_resident_memory_bytes") / (1024.0 * 1024.0),
        );
        let rate = |key: &RuleKey, decisions: f64| -> Option<f64> {
            let (elapsed, before) = since?;
            let earlier = before.rules.get(key).map_or(0.0, |(count, _)| *count);
            Some((decisions - earlier) / elapsed.as_secs_f64().max(f64::EPSILON))
        };
        let mut busiest: Vec<(&RuleKey, f64, f64, Option<f64>)> = self
            .rules
            .iter()
            .map(|(key, (decisions, throttled))| {
                (key, *decisions, *throttled, rate(key, *decisions))
            })
            .collect();
        busiest.sort_by(|a, b| {
            b.3.unwrap_or(0.0)
                .total_cmp(&a.3.unwrap_or(0.0))
                .then(b.1.total_cmp(&a.1))
        });
        screen += &table(
            &[
                "POLICY",
                "RULE",
                "HOOK",
                "ACTION",
                "DECISIONS",
                "PER SEC",
                "THROTTLED",
            ],
            busiest
                .iter()
                .take(rows)
                .map(
                    |((policy, rule, hook, action), decisions, throttled, rate)| {
                        vec![
                            policy.clone(),
                            rule.clone(),
                            hook.clone(),
                            action.clone(),
                            decisions.to_string(),
                            rate.map_or("-".to_owned(), |rate| format!("{rate:.1}")),
                            throttled.to_string(),
                        ]
                    },
                )
                .collect(),
        );
        screen.push('\n');
        if self.evaluations.is_empty() && self.runs.is_empty() {
            screen += "kernel cost: not measured (start the agent with --bpf-stats)\n";
            return screen;
        }
        let average_ns = |(count, seconds): (f64, f64)| {
            if count > 0.0 {
                format!("{:.0}", seconds * 1e9 / count)
            } else {
                "-".to_owned()
            }
        };
        let mut hooks: Vec<(String, String)> = self.evaluations.keys().cloned().collect();
        hooks.extend(
            self.runs
                .keys()
                .filter(|hook| !hooks.iter().any(|(_, known)| known == *hook))
                .map(|hook| ("-".to_owned(), hook.clone()))
                .collect::<Vec<_>>(),
        );
        screen += &table(
            &[
                "RULE CLASS",
                "HOOK",
                "TARGET DECISIONS",
                "AVG NS",
                "PROGRAM RUNS",
                "AVG NS",
            ],
            hooks
                .into_iter()
                .map(|(class, hook)| {
                    let evaluated = self.evaluations.get(&(class.clone(), hook.clone()));
                    let runs = self.runs.get(&hook);
                    vec![
                        class,
                        hook,
                        evaluated.map_or("-".to_owned(), |(count, _)| count.to_string()),
                        evaluated.map_or("-".to_owned(), |cost| average_ns(*cost)),
                        runs.map_or("-".to_owned(), |(count, _)| count.to_string()),
                        runs.map_or("-".to_owned(), |cost| average_ns(*cost)),
                    ]
                })
                .collect(),
        );
        screen
    }
}

/// Left-aligned columns, as wide as their widest cell.
fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|title| title.len()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:width$}"))
            .collect();
        padded.join("  ").trim_end().to_owned() + "\n"
    };
    let mut text = line(header.to_vec());
    for row in &rows {
        text += &line(row.iter().map(String::as_str).collect());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = r#"# TYPE palisade_rule_decisions_total counter
palisade_rule_decisions_total{policy="app",rule="no-shadow",hook="file_open",action="deny"} 12
palisade_rule_decisions_total{policy="app",rule="no-curl",hook="bprm_check_security",action="deny"} 3
# TYPE palisade_rule_events_throttled_total counter
palisade_rule_events_throttled_total{policy="app",rule="no-shadow",hook="file_open",action="deny"} 2
palisade_rule_events_throttled_total{policy="app",rule="no-curl",hook="bprm_check_security",action="deny"} 0
# TYPE palisade_targets gauge
palisade_targets 1
"#;

    #[test]
    fn a_terminal_is_redrawn_and_a_pipe_gets_screens_one_after_another() {
        assert_eq!(frame("screen\n", true, true), "\x1b[H\x1b[2Jscreen\n");
        assert_eq!(frame("screen\n", true, false), "\x1b[H\x1b[2Jscreen\n");
        assert_eq!(frame("screen\n", false, true), "screen\n");
        assert_eq!(frame("screen\n", false, false), "\nscreen\n");
    }

    #[test]
    fn rules_are_listed_busiest_first_with_their_rate() {
        let before = View::parse(SCRAPE).unwrap();
        let now = View::parse(&SCRAPE.replace("} 12", "} 32")).unwrap();
        let screen = now.render(Some((Duration::from_secs(2), &before)), 10);
        let rows: Vec<&str> = screen.lines().filter(|line| line.contains("app")).collect();
        assert_eq!(rows.len(), 2, "{screen}");
        let fields: Vec<&str> = rows[0].split_whitespace().collect();
        assert_eq!(
            fields,
            ["app", "no-shadow", "file_open", "deny", "32", "10.0", "2"]
        );
        assert!(rows[1].contains("no-curl"), "{screen}");
        assert!(screen.contains("targets 1"), "{screen}");
        assert!(screen.contains("not measured"), "{screen}");
    }

    #[test]
    fn kernel_cost_is_the_average_per_decision_and_per_run() {
        let view = View::parse(
            "palisade_rule_evaluations_total{rule_class=\"files\",hook=\"file_open\"} 4\n\
             palisade_rule_evaluation_seconds_total{rule_class=\"files\",hook=\"file_open\"} 0.000002\n\
             palisade_hook_runs_total{hook=\"file_open\"} 10\n\
             palisade_hook_run_seconds_total{hook=\"file_open\"} 0.000001\n\
             palisade_hook_runs_total{hook=\"kernfs_init_security\"} 2\n\
             palisade_hook_run_seconds_total{hook=\"kernfs_init_security\"} 0.0000002\n",
        )
        .unwrap();
        let screen = view.render(None, 10);
        let row = |hook: &str| -> Vec<String> {
            screen
                .lines()
                .find(|line| line.contains(hook))
                .unwrap()
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(
            row("file_open"),
            ["files", "file_open", "4", "500", "10", "100"]
        );
        assert_eq!(
            row("kernfs_init_security"),
            ["-", "kernfs_init_security", "-", "-", "2", "100"]
        );
    }
}
