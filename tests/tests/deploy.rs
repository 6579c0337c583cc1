//! The Kubernetes manifests (`deploy/kubernetes/`) and the monitoring files
//! (`docs/monitoring/`) hold together: no cluster or `kubeconform` runs
//! here, so this checks what a cluster would only find at apply or run
//! time: the fields a Deployment needs, that the ConfigMap and Secret it
//! refers to exist with the keys it reads, that its runner's config parses
//! and validates with the runners' own config types, that probes and the
//! scrape annotation point at the admin port the config listens on, and
//! that every metric the alerts and dashboard use exists.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use yaml_rust2::{Yaml, YamlLoader};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn docs_in(dir: &str) -> Vec<(String, Yaml)> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join(dir))
        .expect("manifest dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        let name = f.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        for doc in YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{name}: not YAML: {e}")) {
            out.push((name.clone(), doc));
        }
    }
    out
}

fn s<'a>(y: &'a Yaml, path: &str) -> Option<&'a str> {
    at(y, path).as_str()
}

/// `a.b.c` into nested mappings (BadValue if missing).
fn at<'a>(y: &'a Yaml, path: &str) -> &'a Yaml {
    path.split('.').fold(y, |y, k| &y[k])
}

fn list(y: &Yaml) -> &[Yaml] {
    y.as_vec().map_or(&[], Vec::as_slice)
}

/// The `env:NAME` secrets a config reads.
fn env_refs(config: &str) -> BTreeSet<String> {
    let re = regex::Regex::new(r#""env:([A-Za-z_][A-Za-z0-9_]*)""#).expect("regex");
    re.captures_iter(config).map(|c| c[1].to_string()).collect()
}

#[test]
fn the_kubernetes_manifests_are_complete_and_their_configs_valid() {
    let docs = docs_in("deploy/kubernetes");
    let mut config_maps: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut secrets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, d) in &docs {
        let kind = s(d, "kind").unwrap_or_else(|| panic!("{file}: no kind"));
        let name = s(d, "metadata.name")
            .unwrap_or_else(|| panic!("{file}: no metadata.name"))
            .to_string();
        assert!(s(d, "apiVersion").is_some(), "{file}: no apiVersion");
        match kind {
            "ConfigMap" => {
                let data = at(d, "data")
                    .as_hash()
                    .unwrap_or_else(|| panic!("{file}: ConfigMap without data"));
                let data = data
                    .iter()
                    .map(|(k, v)| (k.as_str().unwrap_or("").to_string(), v.as_str().unwrap_or("").to_string()))
                    .collect();
                config_maps.insert(name, data);
            }
            "Secret" => {
                let keys = ["stringData", "data"]
                    .iter()
                    .filter_map(|k| at(d, k).as_hash())
                    .flat_map(|h| h.keys().filter_map(|k| k.as_str().map(str::to_string)))
                    .collect();
                secrets.insert(name, keys);
            }
            _ => {}
        }
    }
    let deployments: Vec<&(String, Yaml)> = docs.iter().filter(|(_, d)| s(d, "kind") == Some("Deployment")).collect();
    let mut runners = BTreeSet::new();
    for (file, d) in deployments {
        assert_eq!(s(d, "apiVersion"), Some("apps/v1"), "{file}");
        let selector = at(d, "spec.selector.matchLabels")
            .as_hash()
            .unwrap_or_else(|| panic!("{file}: no selector"));
        let labels = at(d, "spec.template.metadata.labels");
        assert!(!selector.is_empty(), "{file}: an empty selector");
        for (k, v) in selector {
            assert_eq!(&labels[k.as_str().unwrap_or("")], v, "{file}: the template lacks selector label {k:?}");
        }
        let pod = at(d, "spec.template.spec");
        let containers = list(&pod["containers"]);
        assert!(!containers.is_empty(), "{file}: no containers");
        for c in containers {
            assert!(c["image"].as_str().is_some(), "{file}: a container without an image");
            let command: Vec<&str> = list(&c["command"]).iter().filter_map(Yaml::as_str).collect();
            let runner = *command.first().unwrap_or_else(|| panic!("{file}: no command"));
            assert!(matches!(runner, "source-runner" | "sink-runner"), "{file}: runs {runner}");
            runners.insert(runner);
            let config_path = command
                .iter()
                .position(|a| *a == "--config")
                .and_then(|i| command.get(i + 1))
                .unwrap_or_else(|| panic!("{file}: no --config"));
            let (dir, file_name) = config_path.rsplit_once('/').expect("an absolute config path");
            // The config file comes from a mounted ConfigMap item.
            let mount = list(&c["volumeMounts"])
                .iter()
                .find(|m| m["mountPath"].as_str() == Some(dir))
                .unwrap_or_else(|| panic!("{file}: nothing mounted at {dir}"));
            let volume = list(&pod["volumes"])
                .iter()
                .find(|v| v["name"] == mount["name"])
                .unwrap_or_else(|| panic!("{file}: no volume {:?}", mount["name"]));
            let cm = s(volume, "configMap.name").unwrap_or_else(|| panic!("{file}: the config volume is no ConfigMap"));
            let item = list(at(volume, "configMap.items"))
                .iter()
                .find(|i| i["path"].as_str() == Some(file_name))
                .unwrap_or_else(|| panic!("{file}: no ConfigMap item for {file_name}"));
            let key = item["key"].as_str().unwrap_or("");
            let config = config_maps
                .get(cm)
                .and_then(|data| data.get(key))
                .unwrap_or_else(|| panic!("{file}: ConfigMap {cm} has no key {key}"));
            // The runner's own parser and validation.
            let listen = if runner == "source-runner" {
                let c = tributary_operations::config::parse::<source_runner::config::SourceRunnerConfig>(config, key)
                    .unwrap_or_else(|e| panic!("{file}: {key}: {e}"));
                c.admin.listen.clone()
            } else {
                let c = tributary_operations::config::parse::<sink_runner::config::SinkRunnerConfig>(config, key)
                    .unwrap_or_else(|e| panic!("{file}: {key}: {e}"));
                c.admin.listen.clone()
            };
            let port: i64 = listen.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).expect("admin port");
            assert!(listen.starts_with("0.0.0.0:"), "{file}: probes cannot reach an admin server on {listen}");
            assert!(config.contains("token = "), "{file}: an admin server beyond loopback needs a token");
            // Probes and the scrape annotation reach that admin server.
            let admin = list(&c["ports"])
                .iter()
                .find(|p| p["name"].as_str() == Some("admin"))
                .unwrap_or_else(|| panic!("{file}: no port named admin"));
            assert_eq!(admin["containerPort"].as_i64(), Some(port), "{file}: the admin port is not {listen}'s");
            assert_eq!(s(c, "livenessProbe.httpGet.path"), Some("/health"), "{file}");
            assert_eq!(s(c, "readinessProbe.httpGet.path"), Some("/ready"), "{file}");
            for probe in ["livenessProbe", "readinessProbe"] {
                assert_eq!(s(c, &format!("{probe}.httpGet.port")), Some("admin"), "{file}: {probe}");
            }
            let annotations = at(d, "spec.template.metadata.annotations");
            assert_eq!(annotations["prometheus.io/scrape"].as_str(), Some("true"), "{file}");
            assert_eq!(annotations["prometheus.io/port"].as_str(), Some(port.to_string().as_str()), "{file}");
            // Every secret the config reads is in the Secret it takes its
            // environment from.
            let from: BTreeSet<String> = list(&c["envFrom"])
                .iter()
                .filter_map(|e| s(e, "secretRef.name"))
                .flat_map(|n| secrets.get(n).unwrap_or_else(|| panic!("{file}: no Secret {n}")).clone())
                .collect();
            for name in env_refs(config) {
                assert!(from.contains(&name), "{file}: {key} reads env:{name}, which no Secret gives");
            }
        }
    }
    assert_eq!(runners.len(), 2, "a Deployment for each runner");
}

/// Every `tributary_*` metric the monitoring files use exists.
#[test]
fn the_alerts_and_the_dashboard_use_metrics_that_exist() {
    use tributary_operations::telemetry::names;
    let known = [
        names::EVENTS.to_string() + "_total",
        names::BYTES.to_string() + "_total",
        names::FAILED_RECORDS.to_string() + "_total",
        names::LAG_SECONDS.to_string(),
        names::SNAPSHOT_ROWS.to_string(),
        names::SNAPSHOT_ROWS_ESTIMATED.to_string(),
        names::BATCH_SECONDS.to_string() + "_bucket",
        names::PAUSED.to_string(),
        names::CONSUMER_GROUP_JOINED.to_string(),
        names::BUILD_INFO.to_string(),
        names::CONSUMER_LAG_RECORDS.to_string(),
        names::SOURCE_RETAINED_BYTES.to_string(),
        names::VERIFY_ROWS.to_string() + "_total",
        names::VERIFY_RANGES_DIFFERING.to_string() + "_total",
        names::VERIFY_ROWS_DIFFERING.to_string(),
        names::VERIFY_LAST_SECONDS.to_string(),
        names::VERIFY_LAST_POSITION.to_string(),
    ];
    let metric = regex::Regex::new(r"tributary_[a-z_]+").expect("regex");
    let alerts = docs_in("docs/monitoring");
    let rules: Vec<&Yaml> = alerts
        .iter()
        .flat_map(|(_, d)| list(&d["groups"]))
        .flat_map(|g| list(&g["rules"]))
        .collect();
    assert!(rules.len() >= 4, "alert rules: {}", rules.len());
    let mut used = Vec::new();
    for r in &rules {
        let (alert, expr) = (r["alert"].as_str(), r["expr"].as_str());
        assert!(alert.is_some() && expr.is_some(), "a rule without alert or expr: {r:?}");
        used.extend(metric.find_iter(expr.unwrap_or("")).map(|m| m.as_str().to_string()));
    }
    let dashboard = std::fs::read_to_string(repo().join("docs/monitoring/grafana-dashboard.json")).expect("dashboard");
    let json: serde_json::Value = serde_json::from_str(&dashboard).expect("dashboard JSON");
    let panels = json["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    for p in panels {
        for t in p["targets"].as_array().expect("targets") {
            used.extend(
                metric
                    .find_iter(t["expr"].as_str().unwrap_or(""))
                    .map(|m| m.as_str().to_string()),
            );
        }
    }
    assert!(used.iter().any(|m| m == "tributary_lag_seconds"));
    for m in used {
        assert!(known.contains(&m), "{m} is no metric of the runners (known: {known:?})");
    }
}
