//! The metadata-service and API-server family of the built-in rules, as a rule module: the same
//! names as in a policy's `attackProtectionRules`, compiled to the same kernel entries (an entry
//! for the addresses and one for the sockets, of the same name: one rule).
//!
//! Config: `{"rules": ["block-access-to-metadata-service", "block-access-to-kube-apiserver"]}`.
//! The API server's addresses come from the context the agent compiles in.

use palisade_rule_sdk::{Context, Entry, NamedRules, Rule, SocketRule};

/// Cloud metadata services: AWS, GCP, Azure, OpenStack; AWS over IPv6; Volcengine; Alibaba
/// Cloud; Oracle Cloud.
const METADATA_SERVICES: [&str; 5] = [
    "169.254.169.254",
    "fd00:ec2::254",
    "100.96.0.96",
    "100.100.100.200",
    "192.0.0.192",
];

fn strings(addresses: &[&str]) -> Vec<String> {
    addresses
        .iter()
        .map(|address| (*address).to_owned())
        .collect()
}

/// The addresses a rule makes unreachable.
fn addresses(rule: &str, context: &Context) -> Result<Vec<String>, String> {
    match rule {
        "block-access-to-metadata-service" | "disallow-metadata-service" => {
            Ok(strings(&METADATA_SERVICES))
        }
        "block-access-to-aws-metadata-service" => {
            Ok(strings(&["169.254.169.254", "fd00:ec2::254"]))
        }
        "block-access-to-volc-metadata-service" => Ok(strings(&["100.96.0.96"])),
        "block-access-to-alibaba-metadata-service" => Ok(strings(&["100.100.100.200"])),
        "block-access-to-oci-metadata-service" => Ok(strings(&["192.0.0.192"])),
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
        let destinations = config.entries(|name, action| {
            let addresses = addresses(name, context)?;
            Ok(Entry::network(name, addresses, Vec::new(), &[], action))
        })?;
        // The same rules refuse the sockets that reach any address unseen: packet sockets and
        // raw IP sockets (a header of their own).
        let sockets = config.entries(|name, action| {
            let socket = |family: &str, types: &[&str]| SocketRule {
                family: family.to_owned(),
                types: types.iter().map(|kind| (*kind).to_owned()).collect(),
            };
            let unseen = vec![
                socket("packet", &[]),
                socket("inet", &["raw"]),
                socket("inet6", &["raw"]),
            ];
            Ok(Entry::sockets(name, unseen, action))
        })?;
        Ok(destinations.into_iter().chain(sockets).collect())
    }
}

palisade_rule_sdk::rule!(Network);

palisade_rule_sdk::fixture_test!(Network);
