//! The CRDs in a real API server: installed from the committed YAML, established, and bad
//! policies refused at admission with the API server's own error (schema enums, CEL rules).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client,
    api::{DynamicObject, Patch, PatchParams, PostParams},
    core::{ApiResource, Status},
    runtime::{conditions, wait::await_condition},
};
use palisade_crds::{CRDS_FILE, PalisadeClusterPolicy, PalisadePolicy};
use palisade_kube_tests::{admin, namespace};

/// Creates `document` (YAML) as is: the typed API could not even express some mistakes.
async fn create(client: &Client, document: &str, dry_run: bool) -> Result<(), Status> {
    let object: DynamicObject = serde_yaml::from_str(document).expect("YAML");
    let resource = match object.types.as_ref().map(|types| types.kind.as_str()) {
        Some("PalisadeClusterPolicy") => ApiResource::erase::<PalisadeClusterPolicy>(&()),
        _ => ApiResource::erase::<PalisadePolicy>(&()),
    };
    let api: Api<DynamicObject> = match &object.metadata.namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let params = PostParams {
        dry_run,
        ..PostParams::default()
    };
    match api.create(&params, &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(response)) => Err(*response),
        Err(err) => panic!("creating a policy: {err}"),
    }
}

fn policy(spec: &str) -> String {
    format!(
        "apiVersion: palisade.dev/v1alpha1\nkind: PalisadePolicy\nmetadata:\n  name: candidate\n  namespace: admission\nspec:\n{spec}"
    )
}

#[tokio::test]
async fn the_crds_install_and_establish() {
    let client = admin().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(CRDS_FILE);
    let text = std::fs::read_to_string(file).expect("the committed CRDs");
    for document in serde_yaml::Deserializer::from_str(&text) {
        let crd: CustomResourceDefinition =
            <CustomResourceDefinition as serde::Deserialize>::deserialize(document).expect("a CRD");
        let name = crd.metadata.name.clone().expect("a name");
        // Server-side apply over what the chart installed: the same content, so no conflict.
        crds.patch(
            &name,
            &PatchParams::apply("palisade-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .expect("applying a CRD");
        let established = await_condition(crds.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(std::time::Duration::from_secs(30), established)
            .await
            .expect("established within 30 s")
            .expect("watching the CRD");
    }
}

#[tokio::test]
async fn bad_policies_are_refused_with_the_api_servers_error() {
    let client = admin().await;
    namespace(&client, "admission", &[]).await;
    let target = "  target:\n    selector: {matchLabels: {app: web}}\n";
    let cases = [
        (
            "a misspelled rule",
            policy(&format!(
                "{target}  mode: EnhanceProtect\n  enhanceProtect:\n    hardeningRules: [disalow-mount]\n"
            )),
            "spec.enhanceProtect.hardeningRules[0]: Unsupported value: \"disalow-mount\"",
        ),
        (
            "a rule in the wrong list",
            policy(&format!(
                "{target}  mode: EnhanceProtect\n  enhanceProtect:\n    vulMitigationRules: [disable-shell]\n"
            )),
            "spec.enhanceProtect.vulMitigationRules[0]: Unsupported value: \"disable-shell\"",
        ),
        (
            "an invalid mode",
            policy(&format!("{target}  mode: Enforce\n")),
            "spec.mode: Unsupported value: \"Enforce\"",
        ),
        (
            "enhanceProtect with another mode",
            policy(&format!(
                "{target}  mode: RuntimeDefault\n  enhanceProtect:\n    hardeningRules: [disallow-mount]\n"
            )),
            "enhanceProtect is only allowed with modes EnhanceProtect and DefenseInDepth",
        ),
        (
            "an audit rule that is not listed",
            policy(&format!(
                "{target}  mode: EnhanceProtect\n  enhanceProtect:\n    hardeningRules: [disallow-mount]\n    auditRules: [disallow-umount]\n"
            )),
            "every auditRules entry must also be listed in hardeningRules, attackProtectionRules or vulMitigationRules",
        ),
        (
            "a rule listed twice",
            policy(&format!(
                "{target}  mode: EnhanceProtect\n  enhanceProtect:\n    hardeningRules: [disallow-mount, disallow-mount]\n"
            )),
            "spec.enhanceProtect.hardeningRules[1]: Duplicate value: \"disallow-mount\"",
        ),
        (
            "a cgroup path in Kubernetes",
            policy("  target:\n    cgroupPath: /app\n  mode: RuntimeDefault\n"),
            "spec.target.cgroupPath is for local policy files",
        ),
        (
            "names without a kind",
            policy("  target:\n    names: [web]\n  mode: RuntimeDefault\n"),
            "names need the kind of workload they name",
        ),
        (
            "no target",
            policy("  mode: RuntimeDefault\n"),
            "spec.target is required",
        ),
        (
            "a namespace selector on a namespaced policy",
            policy(&format!(
                "{target}    namespaceSelector: {{matchLabels: {{env: prod}}}}\n  mode: RuntimeDefault\n"
            )),
            "spec.target.namespaceSelector is for PalisadeClusterPolicy",
        ),
        (
            "an unknown workload kind",
            policy("  target:\n    kind: CronJob\n    names: [nightly]\n  mode: RuntimeDefault\n"),
            "spec.target.kind: Unsupported value: \"CronJob\"",
        ),
        (
            "a module digest that is no SHA-256",
            policy(&format!(
                "{target}  mode: RuntimeDefault\n  ruleModules:\n    - {{name: m, module: m.wasm, sha256: abc}}\n"
            )),
            "spec.ruleModules[0].sha256: Invalid value: \"abc\"",
        ),
    ];
    for (what, document, expected) in cases {
        let error = create(&client, &document, false)
            .await
            .expect_err(&format!("{what} must be refused"));
        assert_eq!(error.code, 422, "{what}: {error:?}");
        assert!(
            error.message.contains(expected),
            "{what}: expected \"{expected}\" in the API server's message: {}",
            error.message
        );
    }
}

#[tokio::test]
async fn varmor_attack_protection_items_are_accepted() {
    let client = admin().await;
    namespace(&client, "admission", &[]).await;
    let document = policy(
        "  target:\n    selector: {matchLabels: {app: web}}\n  mode: EnhanceProtect\n  enhanceProtect:\n    attackProtectionRules:\n      - disable-curl\n      - rules: [disable-shell, mitigate-sa-leak]\n        targets: []\n    auditRules: [mitigate-sa-leak]\n",
    );
    if let Err(error) = create(&client, &document, true).await {
        panic!("refused: {}", error.message);
    }
}

#[tokio::test]
async fn the_examples_are_accepted() {
    let client = admin().await;
    namespace(&client, "shop", &[]).await;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kubernetes");
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let document = std::fs::read_to_string(&path).unwrap();
        if let Err(error) = create(&client, &document, true).await {
            panic!("{} refused: {}", path.display(), error.message);
        }
    }
}
