//! The sidecars people run, as one table of data: each known by the container names its
//! injector gives it (and, where the webhook sees the spec, by its image), with the exit
//! priority it gets when a pod names none, the local endpoint that ends it when its Job is
//! done, and the one that says it is ready (for start order). A pod's own annotation or env
//! always wins; the README's presets table says where each entry comes from.

/// A pod annotation that must hold a value for an endpoint to be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enabler {
    /// `key: value` on the pod (the kubelet copies pod annotations to the runtime, so the
    /// agent can tell without the API server).
    Annotation {
        key: &'static str,
        value: &'static str,
    },
    /// A flag the sidecar must run with; known only where the spec is (the webhook,
    /// `exitorder explain`). The agent tries the endpoint and, refused, stops the sidecar
    /// through the runtime.
    Arg(&'static str),
}

/// A local HTTP endpoint of a sidecar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub url: &'static str,
    /// What turns it on; `None`: served by default.
    pub enabled_by: Option<Enabler>,
}

/// One known sidecar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    /// The container names its injector or chart gives it.
    pub names: &'static [&'static str],
    /// Its image repositories, matched on the end of the repository's path (a mirror keeps
    /// the path): `linkerd/proxy` matches `cr.l5d.io/linkerd/proxy:stable-2.14.10`. Only
    /// images that run as nothing but this sidecar: a log shipper's or vault's image is also
    /// a pod's main workload, so those are known by name alone.
    pub images: &'static [&'static str],
    /// Its exit priority when the pod names none.
    pub priority: u8,
    /// A mesh data plane: the pod's other sidecars may send through it.
    pub mesh: bool,
    /// What makes it exit cleanly (POST), for Job shutdown; without one it is stopped
    /// through the runtime (SIGTERM, then SIGKILL after the grace period).
    pub shutdown: Option<Endpoint>,
    /// Where it says it is ready (GET), for start order when it declares no readinessProbe.
    pub ready: Option<Endpoint>,
    /// Whether [`ready`](Self::ready) is used even over the container's own readinessProbe:
    /// one whose probe waits for the app would never be ready before the app starts.
    pub ready_over_probe: bool,
}

impl Endpoint {
    /// Whether the sidecar serves it: its pod annotation holds, and its flag is among the
    /// container's `args` (command and args), when they are known (`None`: not known, as in
    /// the runtime; then it is taken as served).
    pub fn served(
        &self,
        annotations: &std::collections::BTreeMap<String, String>,
        args: Option<&[&str]>,
    ) -> bool {
        match self.enabled_by {
            None => true,
            Some(Enabler::Annotation { key, value }) => {
                annotations.get(key).is_some_and(|v| v == value)
            }
            // Go's flag package: `--flag`, `--flag=true`; `--flag=false` (or 0) turns it off.
            Some(Enabler::Arg(flag)) => args.is_none_or(|args| {
                args.iter().any(|a| match a.strip_prefix(flag) {
                    Some("") => true,
                    Some(rest) => rest.strip_prefix('=').is_some_and(|v| {
                        !matches!(v, "false" | "0" | "f" | "F" | "FALSE" | "False")
                    }),
                    None => false,
                })
            }),
        }
    }
}

impl Preset {
    /// The name the table lists it under.
    pub fn name(&self) -> &'static str {
        self.names.first().copied().unwrap_or("")
    }
}

/// Every preset is a sidecar of priority 1: after the main containers, with the other
/// sidecars (the contract's value for linkerd-proxy and istio-proxy, which pods that name
/// only their other sidecars rely on). A pod whose log shipper sends through its proxy
/// orders the two in its annotation; `exitorder explain` says so.
const SIDECAR: u8 = 1;

/// The known sidecars. Sources and defaults are in the README's presets table.
pub const PRESETS: &[Preset] = &[
    Preset {
        names: &["linkerd-proxy"],
        images: &["linkerd/proxy"],
        priority: SIDECAR,
        mesh: true,
        // Off since linkerd 2.16 (linkerd2 #12705) unless the pod turns it on.
        shutdown: Some(Endpoint {
            url: "http://127.0.0.1:4191/shutdown",
            enabled_by: Some(Enabler::Annotation {
                key: "config.linkerd.io/proxy-admin-shutdown",
                value: "enabled",
            }),
        }),
        ready: served("http://127.0.0.1:4191/ready"),
        ready_over_probe: false,
    },
    Preset {
        names: &["istio-proxy"],
        images: &["istio/proxyv2", "istio-release/proxyv2"],
        priority: SIDECAR,
        mesh: true,
        shutdown: served("http://127.0.0.1:15020/quitquitquit"),
        ready: served("http://127.0.0.1:15021/healthz/ready"),
        ready_over_probe: false,
    },
    Preset {
        // Kuma's control plane ends a Job's sidecar itself; Envoy's admin is a Unix socket
        // since 2.14, so there is no local HTTP exit.
        names: &["kuma-sidecar"],
        images: &["kumahq/kuma-dp"],
        priority: SIDECAR,
        mesh: true,
        shutdown: None,
        ready: served("http://127.0.0.1:9902/ready"),
        ready_over_probe: false,
    },
    Preset {
        // consul-k8s's port (the bare binary's default is 20300). It answers at once and
        // exits after its own shutdown grace period.
        names: &["consul-dataplane"],
        images: &["hashicorp/consul-dataplane"],
        priority: SIDECAR,
        mesh: true,
        shutdown: served("http://127.0.0.1:20600/graceful_shutdown"),
        ready: None,
        ready_over_probe: false,
    },
    Preset {
        names: &["daprd"],
        images: &["dapr/daprd", "daprio/daprd"],
        priority: SIDECAR,
        mesh: false,
        shutdown: served("http://127.0.0.1:3500/v1.0/shutdown"),
        // The injector's probe (`:3501/v1.0/healthz`) waits for the app's channel, which a
        // start held for daprd never opens; the outbound check does not.
        ready: served("http://127.0.0.1:3500/v1.0/healthz/outbound"),
        ready_over_probe: true,
    },
    Preset {
        names: &["cloud-sql-proxy"],
        images: &[
            "cloud-sql-connectors/cloud-sql-proxy",
            "cloudsql-docker/gce-proxy",
        ],
        priority: SIDECAR,
        mesh: false,
        shutdown: Some(Endpoint {
            url: "http://127.0.0.1:9091/quitquitquit",
            enabled_by: Some(Enabler::Arg("--quitquitquit")),
        }),
        ready: Some(Endpoint {
            url: "http://127.0.0.1:9090/readiness",
            enabled_by: Some(Enabler::Arg("--health-check")),
        }),
        ready_over_probe: false,
    },
    Preset {
        // `hashicorp/vault` is the server's image too: by name only.
        names: &["vault-agent"],
        images: &[],
        priority: SIDECAR,
        mesh: false,
        shutdown: Some(Endpoint {
            url: "http://127.0.0.1:8200/agent/v1/quit",
            enabled_by: Some(Enabler::Annotation {
                key: "vault.hashicorp.com/agent-enable-quit",
                value: "true",
            }),
        }),
        ready: None,
        ready_over_probe: false,
    },
    Preset {
        // Its HTTP server (and health endpoint) is off unless its config turns it on. Its
        // image is a DaemonSet's or an aggregator's main workload too: by name only.
        names: &["fluent-bit"],
        images: &[],
        priority: SIDECAR,
        mesh: false,
        shutdown: None,
        ready: None,
        ready_over_probe: false,
    },
    Preset {
        // Its API (and /health) is off unless its config turns it on; by name only.
        names: &["vector"],
        images: &[],
        priority: SIDECAR,
        mesh: false,
        shutdown: None,
        ready: None,
        ready_over_probe: false,
    },
    Preset {
        // The operator's sidecar and the Helm chart's container; health_check is an
        // extension, often bound to the pod IP, so no loopback URL is assumed; by name only.
        names: &["otel-collector", "otc-container", "opentelemetry-collector"],
        images: &[],
        priority: SIDECAR,
        mesh: false,
        shutdown: None,
        ready: None,
        ready_over_probe: false,
    },
];

/// An endpoint served by default.
const fn served(url: &'static str) -> Option<Endpoint> {
    Some(Endpoint {
        url,
        enabled_by: None,
    })
}

/// The preset a container is known by from its name alone: all the agent sees of a
/// container in the runtime.
pub fn by_name(container: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.names.contains(&container))
}

/// The preset an image is, by its repository (tag and digest aside, Docker Hub's implicit
/// registry and `library/` aside).
pub fn by_image(image: &str) -> Option<&'static Preset> {
    let repo = repository(image);
    PRESETS.iter().find(|p| {
        p.images.iter().any(|want| {
            repo == *want
                || repo
                    .strip_suffix(want)
                    .is_some_and(|head| head.ends_with('/'))
        })
    })
}

/// The preset of a container whose spec is known: by name, else by image.
pub fn of(container: &str, image: Option<&str>) -> Option<&'static Preset> {
    by_name(container).or_else(|| image.and_then(by_image))
}

/// An image reference's repository: `docker.io/istio/proxyv2:1.24@sha256:..` ->
/// `istio/proxyv2`.
pub fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    // A tag follows the last `:` after the last `/` (one before it is a registry's port).
    let last_slash = image.rfind('/').map_or(0, |i| i.saturating_add(1));
    let image = match image.get(last_slash..).and_then(|tail| tail.rfind(':')) {
        Some(colon) => image
            .get(..last_slash.saturating_add(colon))
            .unwrap_or(image),
        None => image,
    };
    let image = ["docker.io/", "index.docker.io/", "registry-1.docker.io/"]
        .iter()
        .find_map(|r| image.strip_prefix(r))
        .unwrap_or(image);
    image.strip_prefix("library/").unwrap_or(image)
}

/// The shutdown URLs the agent uses for presets, by container name: each preset's, unless it
/// needs a pod annotation the pod does not carry (linkerd's `/shutdown` answers 404 then).
pub fn shutdown_urls(
    annotations: &std::collections::BTreeMap<String, String>,
) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
    PRESETS.iter().flat_map(move |p| {
        let url = p.shutdown.filter(|e| e.served(annotations, None));
        p.names.iter().filter_map(move |n| url.map(|e| (*n, e.url)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn repositories_of_image_references() {
        for (image, repo) in [
            (
                "cr.l5d.io/linkerd/proxy:stable-2.14.10",
                "cr.l5d.io/linkerd/proxy",
            ),
            ("docker.io/istio/proxyv2:1.24.0", "istio/proxyv2"),
            ("istio/proxyv2", "istio/proxyv2"),
            ("docker.io/library/busybox:1.36", "busybox"),
            (
                "registry.local:5000/mirror/daprio/daprd@sha256:0123",
                "registry.local:5000/mirror/daprio/daprd",
            ),
            ("registry.local:5000/vector", "registry.local:5000/vector"),
            ("", ""),
        ] {
            assert_eq!(repository(image), repo, "{image}");
        }
    }

    #[test]
    fn presets_by_name_and_by_image() {
        assert_eq!(
            by_name("linkerd-proxy").map(Preset::name),
            Some("linkerd-proxy")
        );
        assert_eq!(
            by_name("otc-container").map(Preset::name),
            Some("otel-collector")
        );
        assert_eq!(by_name("proxy"), None);
        for (image, name) in [
            ("cr.l5d.io/linkerd/proxy:stable-2.14.10", "linkerd-proxy"),
            ("gcr.io/istio-release/proxyv2:1.24.0", "istio-proxy"),
            ("mirror.example/daprio/daprd:1.14.4", "daprd"),
            (
                "gcr.io/cloud-sql-connectors/cloud-sql-proxy:2.14.0",
                "cloud-sql-proxy",
            ),
            ("docker.io/kumahq/kuma-dp:2.9.0", "kuma-sidecar"),
        ] {
            assert_eq!(by_image(image).map(Preset::name), Some(name), "{image}");
        }
        // Images that are main workloads too are no sidecar by image.
        for image in [
            "hashicorp/vault:1.17",
            "cr.fluentbit.io/fluent/fluent-bit:3.1",
            "timberio/vector:0.40.0-debian",
            "otel/opentelemetry-collector-contrib:0.110.0",
        ] {
            assert_eq!(by_image(image), None, "{image}");
        }
        // The end of a path segment, not of a string.
        assert_eq!(by_image("example.com/notistio/proxyv2x"), None);
        assert_eq!(by_image("example.com/myistio/proxyv2"), None);
        // The name first: a container named as one preset runs as that one.
        assert_eq!(
            of("istio-proxy", Some("cr.l5d.io/linkerd/proxy")).map(Preset::name),
            Some("istio-proxy")
        );
        assert_eq!(
            of("mesh", Some("kumahq/kuma-dp:2.9")).map(Preset::name),
            Some("kuma-sidecar")
        );
        assert_eq!(of("mesh", None), None);
    }

    #[test]
    fn every_preset_is_a_sidecar_with_loopback_endpoints() {
        for p in PRESETS {
            assert!(!p.names.is_empty(), "{p:?}");
            assert_eq!(p.priority, 1, "{}", p.name());
            for url in p.shutdown.into_iter().chain(p.ready).map(|e| e.url) {
                assert!(url.starts_with("http://127.0.0.1:"), "{url}");
            }
        }
        let names: Vec<&str> = PRESETS
            .iter()
            .flat_map(|p| p.names.iter().copied())
            .collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "a name in two presets");
    }

    #[test]
    fn linkerds_shutdown_only_where_the_pod_enables_it() {
        let mut ann = BTreeMap::new();
        let urls: BTreeMap<_, _> = shutdown_urls(&ann).collect();
        assert!(!urls.contains_key("linkerd-proxy"));
        assert_eq!(
            urls.get("istio-proxy"),
            Some(&"http://127.0.0.1:15020/quitquitquit")
        );
        ann.insert(
            "config.linkerd.io/proxy-admin-shutdown".to_owned(),
            "enabled".to_owned(),
        );
        let urls: BTreeMap<_, _> = shutdown_urls(&ann).collect();
        assert_eq!(
            urls.get("linkerd-proxy"),
            Some(&"http://127.0.0.1:4191/shutdown")
        );
        ann.insert(
            "config.linkerd.io/proxy-admin-shutdown".to_owned(),
            "disabled".to_owned(),
        );
        assert!(!shutdown_urls(&ann).any(|(n, _)| n == "linkerd-proxy"));
    }

    #[test]
    fn a_flag_enables_only_as_itself() {
        let sql = by_name("cloud-sql-proxy").and_then(|p| p.shutdown).unwrap();
        let none = BTreeMap::new();
        assert!(sql.served(&none, None), "args unknown: tried");
        assert!(sql.served(&none, Some(&["--quitquitquit", "proj:region:db"])));
        assert!(sql.served(&none, Some(&["--quitquitquit=true"])));
        assert!(!sql.served(&none, Some(&["--quitquitquitx", "proj:region:db"])));
        assert!(!sql.served(&none, Some(&["--quitquitquit=false"])));
        assert!(!sql.served(&none, Some(&["--quitquitquit=0"])));
        assert!(!sql.served(&none, Some(&[])));
    }
}
