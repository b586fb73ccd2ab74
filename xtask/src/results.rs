//! Reading libtest's console output: which tests passed, failed, or never reported; and the
//! measurements tests left.

use std::{collections::BTreeMap, path::Path};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Failed,
    Ignored,
}

/// `test NAME ... ok|FAILED|ignored` lines, by test name. What a test's child processes print
/// lands between `test NAME ... ` and its result, so a result alone on a later line (before the
/// next test) counts too.
pub fn parse(console: &str) -> BTreeMap<String, Outcome> {
    let mut outcomes = BTreeMap::new();
    let mut running = None;
    for line in console
        .lines()
        .map(|line| line.trim_end_matches('\r').trim())
    {
        let (name, result) = match line
            .strip_prefix("test ")
            .and_then(|rest| rest.split_once(" ... "))
        {
            Some((name, result)) => (name, result),
            None => match running {
                Some(name) => (name, line),
                None => continue,
            },
        };
        running = None;
        let outcome = match result.trim() {
            "ok" => Outcome::Passed,
            "FAILED" => Outcome::Failed,
            result if result.starts_with("ignored") => Outcome::Ignored,
            _ => {
                running = Some(name);
                continue;
            }
        };
        outcomes.insert(name.to_owned(), outcome);
    }
    outcomes
}

/// Names from `--list` output (`NAME: test`).
pub fn listed(list: &str) -> Vec<String> {
    list.lines()
        .filter_map(|line| line.strip_suffix(": test"))
        .map(str::to_owned)
        .collect()
}

/// Counts against the expected list: anything expected that did not pass is a failure, and
/// so is a test that did not run (ignored, missing, or cut off by a crash).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub passed: Vec<String>,
    pub failed: Vec<String>,
    pub not_run: Vec<String>,
}

impl Summary {
    pub fn new(expected: &[String], outcomes: &BTreeMap<String, Outcome>) -> Self {
        let mut summary = Summary::default();
        for name in expected {
            match outcomes.get(name) {
                Some(Outcome::Passed) => summary.passed.push(name.clone()),
                Some(Outcome::Failed) => summary.failed.push(name.clone()),
                Some(Outcome::Ignored) | None => summary.not_run.push(name.clone()),
            }
        }
        summary
    }

    pub fn failures(&self) -> usize {
        self.failed.len() + self.not_run.len()
    }
}

/// Writes each `PREFIX NAME JSON` line of `console` to `dir/LABEL-NAME.json` (for benchmarks).
pub fn save_measurements(
    console: &str,
    prefix: &str,
    dir: &Path,
    label: &str,
) -> anyhow::Result<()> {
    for line in console.lines() {
        let Some((name, json)) = line
            .trim()
            .strip_prefix(prefix)
            .and_then(|rest| rest.trim().split_once(' '))
        else {
            continue;
        };
        let file = dir.join(format!("{label}-{name}.json"));
        std::fs::write(&file, json)?;
        println!("measurement saved: {}", file.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tests_that_did_not_run_count_as_failures() {
        let console = "running 6 tests\r\ntest a ... ok\r\ntest b ... FAILED\n[  3.1] some kernel line\ntest c ... ignored, needs x\ntest e ... mount: busy\n[  4.2] some kernel line\nok\ntest f ... \nchild output\n";
        let expected = listed(
            "a: test\nb: test\nc: test\nd: test\ne: test\nf: test\n\n6 tests, 0 benchmarks\n",
        );
        let summary = Summary::new(&expected, &parse(console));
        assert_eq!(summary.passed, ["a", "e"]);
        assert_eq!(summary.failed, ["b"]);
        assert_eq!(summary.not_run, ["c", "d", "f"]);
        assert_eq!(summary.failures(), 4);
    }
}
