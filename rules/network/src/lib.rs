//! The metadata-service and API-server family of the built-in rules, as a rule module: the same
//! names as in a policy's `attackProtectionRules`, compiled to the same kernel entries.
//!
//! Config: `{"rules": ["block-access-to-metadata-service", "block-access-to-kube-apiserver"]}`.
//! The API server's addresses come from the context the agent compiles in.

use palisade_rule_sdk::{Context, Entry, NamedRules, Rule};

/// Cloud metadata services: AWS, GCP, Azure, OpenStack; AWS over IPv6; Volcengine; Alibaba
/// Cloud; Oracle Cloud.
const METADATA_SERVICES: [&str; 5] = [
    "169.254.169.254",
    "fd00:ec2::254",
    "100.96.0.96",
    "100.100.100.200",
    "192.0.0.192",
];

/// The addresses a rule makes unreachable.
fn addresses(rule: &str, context: &Context) -> Result<Vec<String>, String> {
    match rule {
        "block-access-to-metadata-service" | "disallow-metadata-service" => Ok(METADATA_SERVICES
            .iter()
            .map(|address| (*address).to_owned())
            .collect()),
        "block-access-to-kube-apiserver" if context.kube_apiserver.is_empty() => {
            Err("the API server's address is unknown (not running in a cluster)".to_owned())
        }
        "block-access-to-kube-apiserver" => Ok(context.kube_apiserver.clone()),
        other => Err(format!("\"{other}\" is not a network rule")),
    }
}

struct Network;

impl Rule for Network {
    type Config = NamedRules;

    fn compile(config: NamedRules, context: &Context) -> Result<Vec<Entry>, String> {
        config.entries(|name, action| {
            let addresses = addresses(name, context)?;
            Ok(Entry::network(name, addresses, Vec::new(), &[], action))
        })
    }
}

palisade_rule_sdk::rule!(Network);

palisade_rule_sdk::fixture_test!(Network);
