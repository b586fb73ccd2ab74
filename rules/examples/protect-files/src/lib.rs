//! Example rule module: the files in `paths` may not be read or changed; every attempt is rated
//! `high`, tagged `protected-file`, and annotated with who tried. Processes named in `kill` are
//! killed on their first attempt; attempts by processes named in `quiet` are not reported.
//!
//! ```yaml
//! ruleModules:
//!   - name: protect-files
//!     module: protect-files.wasm
//!     sha256: ...
//!     config:
//!       paths: [/srv/secrets/**]
//!       kill: [cat]
//!       quiet: [backup-agent]
//! ```

use palisade_rule_sdk::{Action, Context, Entry, Event, Permission, Rule, Severity, Verdict};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    paths: Vec<String>,
    #[serde(default)]
    kill: Vec<String>,
    #[serde(default)]
    quiet: Vec<String>,
}

pub struct ProtectFiles;

impl Rule for ProtectFiles {
    type Config = Config;

    fn compile(config: Config, _: &Context) -> Result<Vec<Entry>, String> {
        if config.paths.is_empty() {
            return Err("`paths` lists no file to protect".to_owned());
        }
        Ok(vec![Entry::files(
            "protected-files",
            config.paths,
            &[Permission::Read, Permission::Write],
            Action::Deny,
        )])
    }

    fn decide(config: &Config, event: &Event) -> Verdict {
        if config.quiet.iter().any(|quiet| quiet == event.comm) {
            return Verdict::drop();
        }
        // "comm (uid N) on path", allocated once and appended piece by piece: `format!` would
        // grow it as it goes and run the formatting machinery for every piece (and `concat`,
        // generic over separators, costs twice these appends).
        let mut uid = itoa::Buffer::new();
        let pieces = [
            event.comm,
            " (uid ",
            uid.format(event.uid),
            ") on ",
            event.path,
        ];
        let mut attempt = String::with_capacity(pieces.iter().map(|piece| piece.len()).sum());
        for piece in pieces {
            attempt.push_str(piece);
        }
        let verdict = Verdict::keep()
            .severity(Severity::High)
            .tag("protected-file")
            .annotate("attempt", attempt);
        if config.kill.iter().any(|kill| kill == event.comm) {
            verdict.kill()
        } else {
            verdict
        }
    }
}

palisade_rule_sdk::rule!(ProtectFiles);

palisade_rule_sdk::fixture_test!(ProtectFiles);
