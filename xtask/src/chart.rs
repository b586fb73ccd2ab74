//! The chart's checks, which `cargo xtask kube-test` runs before it installs the chart: helm lint
//! --strict and kubeconform -strict (schemas from the test API server and the CRDs) over every
//! combination of the chart's options, two releases in one namespace that share no object and
//! select none of each other's pods, and the alerts through promtool's rule tests.

use std::{collections::BTreeSet, path::Path, process::Command};

use anyhow::{Context, bail, ensure};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{
    debian,
    kube::{ApiServer, NAMESPACE, tool},
    run,
};

/// Each option of the chart as the helm arguments that turn it on, by name.
fn options() -> Vec<(&'static str, Vec<String>)> {
    let set = |values: &[&str]| {
        values
            .iter()
            .flat_map(|value| ["--set".to_owned(), (*value).to_owned()])
            .collect()
    };
    let extras = crate::workspace().join("tests/chart/extras.yaml");
    vec![
        ("serviceMonitor", set(&["serviceMonitor.enabled=true"])),
        ("prometheusRule", set(&["prometheusRule.enabled=true"])),
        ("dashboard", set(&["dashboard.enabled=true"])),
        ("bpfStats", set(&["agent.bpfStats=true"])),
        ("pod network", set(&["hostNetwork=false"])),
        (
            "an existing service account",
            set(&[
                "serviceAccount.create=false",
                "serviceAccount.name=existing",
            ]),
        ),
        (
            "extension points",
            vec!["--values".to_owned(), extras.display().to_string()],
        ),
    ]
}

pub fn check(server: &ApiServer, chart: &Path, examples: &Path) -> anyhow::Result<()> {
    let dir = server.dir.join("chart");
    let _ = std::fs::remove_dir_all(&dir);
    let rendered = dir.join("rendered");
    std::fs::create_dir_all(&rendered)?;
    let schemas = dir.join("schemas");
    write_schemas(&server.get("/openapi/v2")?, &chart.join("crds"), &schemas)?;
    let options = options();
    for combination in 0..1u32 << options.len() {
        let chosen: Vec<&(&str, Vec<String>)> = options
            .iter()
            .enumerate()
            .filter(|(index, _)| combination & (1 << index) != 0)
            .map(|(_, option)| option)
            .collect();
        let args: Vec<&str> = chosen
            .iter()
            .flat_map(|(_, args)| args.iter().map(String::as_str))
            .collect();
        let on: Vec<&str> = chosen.iter().map(|(name, _)| *name).collect();
        run(Command::new(tool("helm")?)
            .args(["lint", "--strict", "--namespace", NAMESPACE])
            .arg(chart)
            .args(&args))
        .with_context(|| format!("helm lint with {on:?}"))?;
        let text = template("palisade", chart, &args)
            .with_context(|| format!("helm template with {on:?}"))?;
        std::fs::write(rendered.join(format!("{combination:02}.yaml")), text)?;
    }
    let location = format!(
        "{}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
        schemas.display()
    );
    let summary = run(Command::new(tool("kubeconform")?)
        // Prometheus Operator's CRDs are not installed here.
        .args([
            "-strict",
            "-summary",
            "-skip",
            "ServiceMonitor,PrometheusRule",
            "-schema-location",
            &location,
        ])
        .arg(&rendered)
        .arg(examples))?;
    print!(
        "chart: {} combinations of options lint and render; kubeconform: {summary}",
        1u32 << options.len()
    );
    releases_do_not_collide(chart, &options)?;
    alerts(chart, &dir)
}

fn template(release: &str, chart: &Path, args: &[&str]) -> anyhow::Result<String> {
    run(Command::new(tool("helm")?)
        .args(["template", release])
        .arg(chart)
        .args(["--namespace", NAMESPACE])
        .args(args))
}

/// The objects `text` (YAML documents) holds.
fn objects(text: &str) -> anyhow::Result<Vec<Value>> {
    let mut objects = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let object = Value::deserialize(document)?;
        if !object.is_null() {
            objects.push(object);
        }
    }
    Ok(objects)
}

/// Two releases in one namespace, every option on that creates objects: no object (kind,
/// namespace, name) in common, and no selector of one matches the other's pods.
fn releases_do_not_collide(chart: &Path, options: &[(&str, Vec<String>)]) -> anyhow::Result<()> {
    let args: Vec<&str> = options
        .iter()
        .filter(|(name, _)| *name != "an existing service account")
        .flat_map(|(_, args)| args.iter().map(String::as_str))
        .collect();
    let releases = ["first", "second"]
        .map(|release| template(release, chart, &args).and_then(|text| objects(&text)));
    let [first, second] = releases;
    let (first, second) = (first?, second?);
    let names = |objects: &[Value]| -> BTreeSet<String> {
        objects
            .iter()
            .map(|object| {
                let metadata = &object["metadata"];
                format!(
                    "{} {}/{}",
                    object["kind"].as_str().unwrap_or_default(),
                    metadata["namespace"].as_str().unwrap_or_default(),
                    metadata["name"].as_str().unwrap_or_default()
                )
            })
            .collect()
    };
    let shared: Vec<String> = names(&first)
        .intersection(&names(&second))
        .cloned()
        .collect();
    ensure!(shared.is_empty(), "two releases both make {shared:?}");
    for (objects, others) in [(&first, &second), (&second, &first)] {
        let pods: Vec<&Value> = others
            .iter()
            .filter(|object| object["kind"] == "DaemonSet")
            .map(|object| &object["spec"]["template"]["metadata"]["labels"])
            .collect();
        ensure!(!pods.is_empty(), "a release without a DaemonSet");
        for object in objects.iter() {
            let selector = match object["kind"].as_str() {
                Some("DaemonSet") => &object["spec"]["selector"]["matchLabels"],
                Some("Service") => &object["spec"]["selector"],
                _ => continue,
            };
            let Some(selector) = selector.as_object() else {
                bail!("{} has no selector", object["metadata"]["name"]);
            };
            for labels in &pods {
                ensure!(
                    selector.iter().any(|(key, value)| &labels[key] != value),
                    "{} {} selects the other release's pods",
                    object["kind"],
                    object["metadata"]["name"]
                );
            }
        }
    }
    println!(
        "chart: two releases in one namespace make {} and {} objects, none shared",
        first.len(),
        second.len()
    );
    Ok(())
}

/// The PrometheusRule's groups, checked and unit-tested by promtool (Debian's prometheus
/// package) with tests/chart/alerts.test.yaml.
fn alerts(chart: &Path, dir: &Path) -> anyhow::Result<()> {
    let text = template(
        "palisade",
        chart,
        &[
            "--set",
            "prometheusRule.enabled=true",
            "--show-only",
            "templates/prometheusrule.yaml",
        ],
    )?;
    let rule = objects(&text)?
        .pop()
        .context("the chart made no PrometheusRule")?;
    std::fs::write(
        dir.join("rules.yaml"),
        serde_yaml::to_string(&rule["spec"])?,
    )?;
    let tests = dir.join("alerts.test.yaml");
    std::fs::copy(
        crate::workspace().join("tests/chart/alerts.test.yaml"),
        &tests,
    )?;
    let promtool = debian::unpacked("prometheus")?.join("usr/bin/promtool");
    run(Command::new(&promtool)
        .args(["check", "rules"])
        .arg(dir.join("rules.yaml")))?;
    let out = run(Command::new(&promtool).args(["test", "rules"]).arg(&tests))?;
    print!("chart: promtool test rules: {out}");
    Ok(())
}

/// kubeconform's schema files from the API server's OpenAPI v2 document and from the CRDs in
/// `crds`: one standalone JSON schema per kind, `kind-group-version.json` (the group's first
/// label), objects closed to unknown fields (-strict).
fn write_schemas(openapi: &str, crds: &Path, out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    let document: Value = serde_json::from_str(openapi)?;
    let definitions = document["definitions"]
        .as_object()
        .context("no definitions in /openapi/v2")?;
    for (name, definition) in definitions {
        let Some(kinds) = definition["x-kubernetes-group-version-kind"].as_array() else {
            continue;
        };
        for gvk in kinds {
            let schema = standalone(definition, definitions, &mut vec![name.clone()]);
            write_schema(
                out,
                gvk["kind"].as_str(),
                gvk["group"].as_str(),
                gvk["version"].as_str(),
                &schema,
            )?;
        }
    }
    for entry in std::fs::read_dir(crds)? {
        let text = std::fs::read_to_string(entry?.path())?;
        for document in text
            .split("\n---")
            .filter(|document| !document.trim().is_empty() && document.trim() != "---")
        {
            let crd: Value = serde_yaml::from_str(document)?;
            let spec = &crd["spec"];
            for version in spec["versions"].as_array().into_iter().flatten() {
                let mut schema = version["schema"]["openAPIV3Schema"].clone();
                let properties = schema["properties"]
                    .as_object_mut()
                    .context("a CRD schema has properties")?;
                for field in ["apiVersion", "kind"] {
                    properties.entry(field).or_insert(json!({"type": "string"}));
                }
                properties
                    .entry("metadata")
                    .or_insert(json!({"type": "object"}));
                write_schema(
                    out,
                    spec["names"]["kind"].as_str(),
                    spec["group"].as_str(),
                    version["name"].as_str(),
                    // A CRD's schema has no references: this only applies `strict`.
                    &standalone(&schema, &serde_json::Map::new(), &mut Vec::new()),
                )?;
            }
        }
    }
    Ok(())
}

fn write_schema(
    out: &Path,
    kind: Option<&str>,
    group: Option<&str>,
    version: Option<&str>,
    schema: &Value,
) -> anyhow::Result<()> {
    let (Some(kind), Some(group), Some(version)) = (kind, group, version) else {
        bail!("a kind without group, version or name");
    };
    let group = group.split('.').next().unwrap_or_default();
    let name = if group.is_empty() {
        format!("{}-{version}.json", kind.to_lowercase())
    } else {
        format!("{}-{group}-{version}.json", kind.to_lowercase())
    };
    std::fs::write(out.join(name), serde_json::to_string(schema)?)?;
    Ok(())
}

/// `schema` with every `$ref` replaced by its definition (a recursive one by an open schema),
/// and `strict` applied to every node.
fn standalone(
    schema: &Value,
    definitions: &serde_json::Map<String, Value>,
    stack: &mut Vec<String>,
) -> Value {
    match schema {
        Value::Object(map) => {
            if let Some(reference) = map.get("$ref").and_then(Value::as_str) {
                let name = reference.trim_start_matches("#/definitions/").to_owned();
                if stack.contains(&name) {
                    return json!({});
                }
                let Some(definition) = definitions.get(&name) else {
                    return json!({});
                };
                stack.push(name);
                let resolved = standalone(definition, definitions, stack);
                stack.pop();
                return resolved;
            }
            let mut out = serde_json::Map::new();
            for (key, value) in map {
                out.insert(key.clone(), standalone(value, definitions, stack));
            }
            Value::Object(strict(out))
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|item| standalone(item, definitions, stack))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// One schema node, closed to other fields when it has properties, int-or-string spelt in JSON
/// Schema (`standalone` applies it to every node).
fn strict(mut map: serde_json::Map<String, Value>) -> serde_json::Map<String, Value> {
    let int_or_string = map.get("format").and_then(Value::as_str) == Some("int-or-string")
        || map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if int_or_string {
        map.remove("type");
        map.remove("format");
        map.insert(
            "oneOf".into(),
            json!([{"type": "string"}, {"type": "integer"}]),
        );
    }
    let open = map.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if map.contains_key("properties") && !open && !map.contains_key("additionalProperties") {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    map
}
