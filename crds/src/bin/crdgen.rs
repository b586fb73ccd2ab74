//! Prints the CustomResourceDefinitions of every kind (committed in the Helm chart; a
//! test fails when the committed file is stale).

fn main() {
    print!("{}", palisade_crds::crds_yaml());
}
