//! A rule module that does what its configuration says, however badly: `{"compile": "loop"}`
//! never returns from `compile`; `{"decide": "memory"}` allocates without bound in `decide`;
//! `{"decide": "leak"}` keeps 1 MiB more each time `decide` is called. The
//! agent's sandbox tests use it. With nothing to misbehave on, it denies reading `deny` (if
//! given) and keeps every event, annotated with the event's JSON under "json" (it asks for it).

use palisade_rule_sdk::{Action, Context, Entry, Event, Permission, Rule, Verdict};

#[derive(serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum Misbehaviour {
    /// Never returns.
    Loop,
    /// Allocates until something stops it.
    Memory,
    /// Keeps 1 MiB more on every call, never freed: stopped only after many calls.
    Leak,
    /// Recurses until the stack is gone.
    Recursion,
    /// Panics (a trap).
    Trap,
    /// `compile` returns a rule no policy may hold (an unknown capability).
    Invalid,
}

#[derive(serde::Deserialize)]
struct Config {
    compile: Option<Misbehaviour>,
    decide: Option<Misbehaviour>,
    deny: Option<String>,
}

/// Recurses for ever: what the test wants.
#[allow(unconditional_recursion)]
fn recurse(depth: u64) -> u64 {
    // black_box keeps the optimiser from turning the recursion into a loop.
    std::hint::black_box(recurse(std::hint::black_box(depth) + 1)) + 1
}

/// Does the misbehaviour; returns only for `Leak` and `Invalid`.
fn misbehave(misbehaviour: &Misbehaviour) {
    match misbehaviour {
        Misbehaviour::Loop => loop {
            std::hint::black_box(());
        },
        Misbehaviour::Memory => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1; 1 << 20]);
                std::hint::black_box(&hoard);
            }
        }
        Misbehaviour::Leak => {
            static KEPT: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());
            KEPT.lock().unwrap().push(vec![1; 1 << 20]);
        }
        Misbehaviour::Recursion => {
            recurse(0);
        }
        Misbehaviour::Trap => panic!("asked to trap"),
        Misbehaviour::Invalid => {}
    }
}

struct Misbehaving;

impl Rule for Misbehaving {
    type Config = Config;

    fn compile(config: Config, _: &Context) -> Result<Vec<Entry>, String> {
        if let Some(misbehaviour) = &config.compile {
            misbehave(misbehaviour);
            let invalid = vec!["cap_nonsense".to_owned()];
            return Ok(vec![Entry::capabilities("invalid", invalid, Action::Deny)]);
        }
        Ok(config
            .deny
            .into_iter()
            .map(|path| Entry::files("deny", vec![path], &[Permission::Read], Action::Deny))
            .collect())
    }

    const READS_JSON: bool = true;

    fn decide(config: &Config, event: &Event) -> Verdict {
        if let Some(misbehaviour) = &config.decide {
            misbehave(misbehaviour);
        }
        Verdict::keep().annotate("json", event.json.to_owned())
    }
}

palisade_rule_sdk::rule!(Misbehaving);
