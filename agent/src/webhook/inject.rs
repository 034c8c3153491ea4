//! What one sidecar gets: its own exit directory (in the node's share, with `POD_UID`, or in
//! the pod's own volume, see [`super::podlocal`]), the entrypoint, and a preStop that waits for the agent's `allow` before doing what the sidecar's own preStop
//! did. Each step first looks for what an earlier pass added, so a second pass changes
//! nothing (the API server reinvokes the webhook after other injectors, with its own output).

use std::time::Duration;

use exitorder_contract::{env, mount, share};

use super::podlocal;
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ExecAction, HTTPGetAction, HostPathVolumeSource, Lifecycle,
    LifecycleHandler, ObjectFieldSelector, PodSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The pod volume that holds the node's share.
pub const VOLUME: &str = "exitorder-share";

/// Adds the share's hostPath volume and the host's bin directory (read-only where mounted)
/// once; refuses a pod that already uses one of the names for something else.
pub fn share_volume(spec: &mut PodSpec, share_dir: &str, bin_dir: &str) -> Result<(), String> {
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    for (name, path) in [
        (VOLUME, share_dir),
        (exitorder_contract::podlocal::BIN_VOLUME, bin_dir),
    ] {
        if let Some(v) = volumes.iter().find(|v| v.name == name) {
            match &v.host_path {
                Some(h) if h.path == path => continue,
                _ => {
                    return Err(format!(
                        "volume {name:?} exists and is not exitorder's (hostPath {path})"
                    ))
                }
            }
        }
        volumes.push(Volume {
            name: name.to_owned(),
            host_path: Some(HostPathVolumeSource {
                path: path.to_owned(),
                // The agent creates both; a pod scheduled before it runs still starts (its
                // preStop then gives up at once, which the kubelet ignores).
                type_: Some("DirectoryOrCreate".to_owned()),
            }),
            ..Volume::default()
        });
    }
    Ok(())
}

/// Nothing in an opted-in pod reaches the share but the mount a sidecar is given (its own
/// directory): a container holding the whole share could answer other pods' waits. Where a
/// policy allows hostPath only for the share, this is what keeps it to that (and the guard,
/// [`super::guard`], does it for every pod).
pub fn share_only_as_injected(spec: &PodSpec, share_dir: &str) -> Result<(), String> {
    let share = share_dir.trim_end_matches('/');
    for v in spec.volumes.iter().flatten() {
        let Some(h) = &v.host_path else { continue };
        let path = h.path.trim_end_matches('/');
        let inside = path == share || path.starts_with(&format!("{share}/"));
        if inside && v.name != VOLUME {
            return Err(format!(
                "volume {:?} is a hostPath of the exitorder share ({}); only exitorder's own \
                 volume may reach it",
                v.name, h.path
            ));
        }
    }
    for c in crate::podspec::containers(spec) {
        for m in c
            .volume_mounts
            .iter()
            .flatten()
            .filter(|m| m.name == VOLUME)
        {
            let own_dir = m.mount_path == mount::EXIT_DIR
                && m.sub_path.is_none()
                && m.sub_path_expr.as_deref()
                    == Some(format!("{}/$({})/{}", share::PODS_DIR, env::POD_UID, c.name).as_str());
            if !own_dir {
                return Err(format!(
                    "container {:?} mounts volume {VOLUME:?} at {}: only the container's own \
                     directory may be mounted from the share",
                    c.name, m.mount_path
                ));
            }
        }
    }
    Ok(())
}

/// Where an injected sidecar's exit directory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HandshakeVolume {
    /// In the pod's own `emptyDir`, with the entrypoint copied in by an init container: no
    /// hostPath, so the pod stays admissible under Pod Security `baseline` and `restricted`.
    #[value(name = "emptyDir")]
    EmptyDir,
    /// In the node's share, through a hostPath volume (the Kruise-style layout).
    #[value(name = "hostPath")]
    HostPath,
}

/// The injection for one sidecar.
pub struct Sidecar {
    /// The entrypoint's `--timeout`.
    pub timeout: Duration,
    /// Where its exit directory is.
    pub handshake: HandshakeVolume,
    /// The entrypoint's `--presence`, when the webhook is told one.
    pub presence: Option<Duration>,
    /// Every node has the entrypoint by its second name (see [`Sidecar::entrypoint_v2`]):
    /// off in the host share's layout while the agents roll out from a release before it.
    pub second_name: bool,
}

impl Sidecar {
    pub fn inject(&self, c: &mut Container, warnings: &mut Vec<String>) -> Result<(), String> {
        self.own_directory(c)?;
        if let Some(presence) = self.presence {
            presence_env(c, presence);
        }
        self.pre_stop(c, Hook::Wait, warnings);
        Ok(())
    }

    /// What a container the sidecars serve gets: its own exit directory and a preStop that
    /// says there, without waiting, that the kubelet is stopping it, then does what its own
    /// preStop did (`exitorder-entrypoint mark`). A pod kill runs every container's preStop
    /// at once and a restart only the restarted one's, so these marks are how the agent
    /// tells a sidecar's restart from the pod's kill without the kubelet's Events (see
    /// `kubelet::evidence`). Costs the container one exec before its TERM.
    pub fn mark(&self, c: &mut Container, warnings: &mut Vec<String>) -> Result<(), String> {
        self.own_directory(c)?;
        self.pre_stop(c, Hook::Mark, warnings);
        Ok(())
    }

    /// What an app of a pod that waits for its endpoints gets (`exitorder.io/wait-for-endpoints`):
    /// its own exit directory and a preStop that waits for the agent's `allow`, which comes
    /// once the pod's endpoints are withdrawn and `settle` has passed, then does what its own
    /// preStop did. The wait says on the node that the kubelet stops the container, as a
    /// mark does; with no agent to answer, the entrypoint sleeps `settle` itself.
    pub fn hold_for_endpoints(
        &self,
        c: &mut Container,
        settle: Duration,
        warnings: &mut Vec<String>,
    ) -> Result<(), String> {
        self.own_directory(c)?;
        if let Some(presence) = self.presence {
            presence_env(c, presence);
        }
        if self.handshake == HandshakeVolume::HostPath && !self.second_name {
            warnings.push(format!(
                "container {:?}: the agents are rolling out, and a node still running an \
                 earlier release's agent and entrypoint lets this container go without waiting \
                 for the pod's endpoints",
                c.name
            ));
        }
        self.pre_stop(c, Hook::Endpoints(settle), warnings);
        Ok(())
    }

    fn own_directory(&self, c: &mut Container) -> Result<(), String> {
        match self.handshake {
            HandshakeVolume::HostPath => {
                pod_uid_env(c)?;
                mounts(c)
            }
            HandshakeVolume::EmptyDir => super::podlocal::mounts(c),
        }
    }

    /// `exitorder-entrypoint wait --timeout T` (or `mark`), then what the container's preStop
    /// did.
    fn pre_stop(&self, c: &mut Container, hook_kind: Hook, warnings: &mut Vec<String>) {
        let name = c.name.clone();
        let lifecycle = c.lifecycle.get_or_insert_with(Lifecycle::default);
        let hook = lifecycle.pre_stop.take().unwrap_or_default();
        let mut argv = match hook_kind {
            Hook::Wait => vec![
                mount::ENTRYPOINT.to_owned(),
                "wait".to_owned(),
                "--timeout".to_owned(),
                format!("{}s", self.timeout.as_secs()),
            ],
            Hook::Mark => vec![self.entrypoint_v2().to_owned(), "mark".to_owned()],
            // `--settle=` in one argument: an entrypoint of a release that does not know it
            // skips it rather than fail the app's own hook.
            Hook::Endpoints(settle) => vec![
                self.entrypoint_v2().to_owned(),
                "wait".to_owned(),
                "--timeout".to_owned(),
                format!("{}s", self.timeout.as_secs()),
                format!("--settle={}ms", settle.as_millis()),
            ],
        };
        let then = match then(&hook, c.ports.as_deref().unwrap_or_default()) {
            Then::Wrapped => {
                lifecycle.pre_stop = Some(hook);
                return;
            }
            Then::Keep(why) => {
                let consequence = match hook_kind {
                    Hook::Wait => "this sidecar's exit is not ordered",
                    Hook::Endpoints(_) => {
                        "this container's exit does not wait for the pod's endpoints"
                    }
                    Hook::Mark => {
                        "the agent cannot see on the node when the kubelet stops it (a \
                         restart of a sidecar waiting for it is held until its deadline unless \
                         the kubelet's Event says so)"
                    }
                };
                warnings.push(format!(
                    "container {name:?}: its preStop {why}; it is kept as it is, and {consequence}"
                ));
                lifecycle.pre_stop = Some(hook);
                return;
            }
            Then::Args(args) => args,
        };
        argv.extend(then);
        lifecycle.pre_stop = Some(LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(argv),
            }),
            ..LifecycleHandler::default()
        });
    }
}

/// What the entrypoint does in a preStop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hook {
    /// Waits for the agent's `allow`: a sidecar.
    Wait,
    /// Says the container is being stopped, and goes on at once: a container sidecars serve.
    Mark,
    /// Waits for the agent's `allow` until the pod's endpoints are withdrawn, then this
    /// settle time: an app of a pod that waits for its endpoints.
    Endpoints(Duration),
}

impl Sidecar {
    /// The entrypoint for a hook a release before `mark` does not know: the node's by its
    /// second name (`exitorder-entrypoint-v2`), since a rollback of the agents rewrites only
    /// the first, with an entrypoint that would fail the hook or skip what it asks before the
    /// container's own ran. The pod's own copy (emptyDir) is the one its init container
    /// installed, whatever the node runs.
    fn entrypoint_v2(&self) -> &'static str {
        match self.handshake {
            HandshakeVolume::HostPath if self.second_name => mount::ENTRYPOINT_V2,
            HandshakeVolume::HostPath | HandshakeVolume::EmptyDir => mount::ENTRYPOINT,
        }
    }
}

enum Then {
    /// An earlier pass wrapped it.
    Wrapped,
    /// It cannot be wrapped, for this reason.
    Keep(String),
    /// What follows `wait --timeout T` or `mark`.
    Args(Vec<String>),
}

/// Whether a preStop already runs the entrypoint (an earlier pass wrapped it): what makes a
/// sidecar's exit wait for the agent.
pub fn waits_for_agent(hook: &LifecycleHandler) -> bool {
    hook.exec
        .as_ref()
        .and_then(|e| e.command.as_ref())
        .and_then(|c| c.first())
        .is_some_and(|first| mount::ENTRYPOINTS.contains(&first.as_str()))
}

fn then(hook: &LifecycleHandler, ports: &[k8s_openapi::api::core::v1::ContainerPort]) -> Then {
    if waits_for_agent(hook) {
        return Then::Wrapped;
    }
    if let Some(exec) = &hook.exec {
        let command = exec.command.clone().unwrap_or_default();
        if command.is_empty() {
            return Then::Args(Vec::new());
        }
        return Then::Args(std::iter::once("--".to_owned()).chain(command).collect());
    }
    if let Some(get) = &hook.http_get {
        return match http_url(get, ports) {
            Ok(url) => Then::Args(vec!["--http-get".to_owned(), url]),
            Err(why) => Then::Keep(why),
        };
    }
    if let Some(sleep) = &hook.sleep {
        return Then::Args(vec![
            "--sleep".to_owned(),
            format!("{}s", sleep.seconds.max(0)),
        ]);
    }
    if hook.tcp_socket.is_some() {
        return Then::Keep("is a tcpSocket handler, which has no exec form".to_owned());
    }
    Then::Args(Vec::new())
}

/// The URL the entrypoint GETs for an httpGet preStop: the pod's own loopback, as the hook
/// reaches the container itself. What the entrypoint cannot send is refused here.
fn http_url(
    get: &HTTPGetAction,
    ports: &[k8s_openapi::api::core::v1::ContainerPort],
) -> Result<String, String> {
    if get
        .scheme
        .as_deref()
        .is_some_and(|s| !s.eq_ignore_ascii_case("HTTP"))
    {
        return Err("is an httpGet over HTTPS, which the entrypoint does not speak".to_owned());
    }
    if get.http_headers.as_ref().is_some_and(|h| !h.is_empty()) {
        return Err("is an httpGet with headers, which the entrypoint does not send".to_owned());
    }
    if let Some(host) = get.host.as_deref().filter(|h| !h.is_empty()) {
        if !matches!(host, "127.0.0.1" | "localhost" | "::1") {
            return Err(format!(
                "is an httpGet to host {host:?}; the entrypoint only reaches the pod's loopback"
            ));
        }
    }
    // Port 0 is no port, named or not: the entrypoint refuses a URL with it.
    let port = match &get.port {
        IntOrString::Int(p) => u16::try_from(*p).ok(),
        IntOrString::String(name) => ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
    .filter(|p| *p > 0)
    .ok_or_else(|| {
        format!(
            "is an httpGet to port {:?}, which the container does not name",
            get.port
        )
    })?;
    // The entrypoint takes printable ASCII only, and no URL longer than this.
    const MAX_URL: usize = 2048;
    let path = get.path.as_deref().unwrap_or("/");
    let target = request_target(path);
    let url = format!("http://127.0.0.1:{port}{target}");
    if url.len() > MAX_URL {
        return Err(format!(
            "is an httpGet to a URL longer than the entrypoint sends ({MAX_URL} bytes)"
        ));
    }
    Ok(url)
}

/// The request target the kubelet sends for an httpGet handler's `path`: it parses the path
/// as a URL (Go's `url.Parse`), dropping a `#fragment` and keeping the query as written, and
/// sends the path part as written when it holds only what a URL path may, escaped otherwise;
/// a path that does not parse (a control character, a bad `%` escape) is sent escaped whole,
/// `?` included. The query's spaces and non-ASCII bytes, which the kubelet would send raw
/// (and no server would take), are escaped too: the entrypoint sends printable ASCII only.
fn request_target(path: &str) -> String {
    // RFC 3986 unreserved, and the sub-delimiters Go leaves alone in a path.
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"-_.~$&+,/:;=@".contains(&b);
    let escape = |bytes: &[u8], keep: &dyn Fn(u8) -> bool| {
        let mut out = String::with_capacity(bytes.len());
        for &b in bytes {
            if keep(b) {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        out
    };
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    let bad_escape = |s: &str| {
        let b = s.as_bytes();
        b.iter().enumerate().any(|(i, c)| {
            *c == b'%'
                && !b
                    .get(i.saturating_add(1)..i.saturating_add(3))
                    .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
        })
    };
    let (before_fragment, fragment) = path.split_once('#').unwrap_or((&path, ""));
    let (raw_path, query) = match before_fragment.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (before_fragment, None),
    };
    if path.bytes().any(|b| b < 0x20 || b == 0x7f) || bad_escape(raw_path) || bad_escape(fragment) {
        return escape(path.as_bytes(), &plain);
    }
    let as_written = |b: u8| plain(b) || b"!'()*[]%".contains(&b);
    let mut target = if raw_path.bytes().all(as_written) {
        raw_path.to_owned()
    } else {
        escape(&unescape(raw_path), &plain)
    };
    if let Some(q) = query {
        target.push('?');
        target.push_str(&escape(q.as_bytes(), &|b: u8| b.is_ascii_graphic()));
    }
    target
}

/// `%XX` decoded; the caller has checked every `%` starts one.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0usize;
    while let Some(&c) = b.get(i) {
        let hex = b
            .get(i.saturating_add(1)..i.saturating_add(3))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (c, hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i = i.saturating_add(3);
            }
            (c, _) => {
                out.push(c);
                i = i.saturating_add(1);
            }
        }
    }
    out
}

/// Start order (`exitorder.io/await-sidecars`): each sidecar named gets a postStart hook that
/// returns once it is ready; the ones returned are to move before the main containers, in
/// their order (the kubelet starts containers one by one and waits for each postStart, so
/// the app starts after its sidecars are ready). A sidecar without a readiness endpoint the
/// entrypoint can reach stays where it is, with a warning.
pub fn start_first(
    containers: &mut [Container],
    sidecars: &[&str],
    warnings: &mut Vec<String>,
) -> Vec<String> {
    let mut first = Vec::new();
    for c in containers
        .iter_mut()
        .filter(|c| sidecars.contains(&c.name.as_str()))
    {
        match await_hook(c) {
            Ok(()) => first.push(c.name.clone()),
            Err(why) => warnings.push(format!(
                "container {:?} is not started before the main containers: {why}",
                c.name
            )),
        }
    }
    first
}

/// Gives `c` the postStart `exitorder-entrypoint await --http-get URL`.
fn await_hook(c: &mut Container) -> Result<(), String> {
    let url = ready_url(c)?;
    let argv = vec![
        mount::ENTRYPOINT.to_owned(),
        "await".to_owned(),
        "--http-get".to_owned(),
        url,
    ];
    let lifecycle = c.lifecycle.get_or_insert_with(Lifecycle::default);
    match lifecycle.post_start.as_ref().and_then(|h| h.exec.as_ref()) {
        Some(e) if e.command.as_ref() == Some(&argv) => Ok(()),
        _ if lifecycle.post_start.is_some() => Err("it has a postStart hook of its own".to_owned()),
        _ => {
            lifecycle.post_start = Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(argv),
                }),
                ..LifecycleHandler::default()
            });
            Ok(())
        }
    }
}

/// Where `c` says it is ready: its readinessProbe's httpGet, else its mesh preset.
fn ready_url(c: &Container) -> Result<String, String> {
    let preset = crate::presets::of(&c.name, c.image.as_deref());
    // Readiness endpoints are turned on by the sidecar's flags, not by pod annotations: with
    // none given, one that needs an annotation counts as off (the start is not held for it).
    let args = super::presets::args_of(c);
    let preset_url = preset
        .and_then(|p| p.ready)
        .filter(|e| e.served(&std::collections::BTreeMap::new(), Some(&args)))
        .map(|e| e.url.to_owned());
    if let Some(url) = preset_url
        .clone()
        .filter(|_| preset.is_some_and(|p| p.ready_over_probe))
    {
        return Ok(url);
    }
    if let Some(get) = c.readiness_probe.as_ref().and_then(|p| p.http_get.as_ref()) {
        return http_url(get, c.ports.as_deref().unwrap_or_default())
            .map_err(|why| format!("its readinessProbe {why}"));
    }
    preset_url.ok_or_else(|| {
        "it has no httpGet readinessProbe and no preset with a readiness endpoint".to_owned()
    })
}

/// `POD_UID` from the downward API: what the mount's `subPathExpr` expands.
/// The entrypoint's presence wait, as `EXITORDER_PRESENCE` in the sidecar's env rather than a
/// flag: in the hostPath layout the sidecar runs the entrypoint its node's agent installed,
/// which on a node the upgrade has not reached yet knows no `--presence` and would refuse it
/// (skipping the wait and the sidecar's own preStop); it ignores an env it does not know. A
/// value the pod sets itself is kept.
fn presence_env(c: &mut Container, presence: Duration) {
    let envs = c.env.get_or_insert_with(Vec::new);
    if envs.iter().any(|e| e.name == ENV_PRESENCE) {
        return;
    }
    envs.push(EnvVar {
        name: ENV_PRESENCE.to_owned(),
        value: Some(format!("{}ms", presence.as_millis())),
        ..EnvVar::default()
    });
}

/// The entrypoint's env for its presence wait (`entrypoint/src/cli/mod.rs`).
pub const ENV_PRESENCE: &str = "EXITORDER_PRESENCE";

fn pod_uid_env(c: &mut Container) -> Result<(), String> {
    let envs = c.env.get_or_insert_with(Vec::new);
    if let Some(e) = envs.iter().find(|e| e.name == env::POD_UID) {
        let is_uid = e
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .is_some_and(|f| f.field_path == "metadata.uid");
        return if is_uid {
            Ok(())
        } else {
            Err(format!(
                "container {:?} sets {} to something other than the pod's UID; the exitorder \
                 mount needs it (fieldRef metadata.uid)",
                c.name,
                env::POD_UID
            ))
        };
    }
    envs.push(EnvVar {
        name: env::POD_UID.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "metadata.uid".to_owned(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    });
    Ok(())
}

/// The container's own directory of the share, and the host's bin directory read-only.
fn mounts(c: &mut Container) -> Result<(), String> {
    let own = VolumeMount {
        name: VOLUME.to_owned(),
        mount_path: mount::EXIT_DIR.to_owned(),
        sub_path_expr: Some(format!(
            "{}/$({})/{}",
            share::PODS_DIR,
            env::POD_UID,
            c.name
        )),
        ..VolumeMount::default()
    };
    let name = c.name.clone();
    let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
    for want in [own, podlocal::bin_mount()] {
        match mounts.iter().find(|m| m.mount_path == want.mount_path) {
            Some(m) if m.name == want.name => {}
            Some(m) => {
                return Err(format!(
                    "container {name:?} mounts volume {:?} at {}, where exitorder mounts the share",
                    m.name, m.mount_path
                ))
            }
            None => mounts.push(want),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerPort, HTTPHeader, SleepAction};

    fn get(port: IntOrString) -> HTTPGetAction {
        HTTPGetAction {
            port,
            ..HTTPGetAction::default()
        }
    }

    #[test]
    fn a_named_port_numbered_zero_is_no_port() {
        let ports = [ContainerPort {
            name: Some("admin".into()),
            container_port: 0,
            ..ContainerPort::default()
        }];
        let e = http_url(&get(IntOrString::String("admin".into())), &ports).unwrap_err();
        assert!(e.contains("does not name"), "{e}");
    }

    #[test]
    fn an_http_get_path_is_sent_as_the_kubelet_sends_it() {
        let mut g = get(IntOrString::Int(8080));
        // A control character: Go's url.Parse refuses it, the kubelet sends it escaped whole.
        g.path = Some("drain now\n\u{e9}?a=b".into());
        assert_eq!(
            http_url(&g, &[]).unwrap(),
            "http://127.0.0.1:8080/drain%20now%0A%C3%A9%3Fa=b"
        );
        for (path, sent) in [
            ("/ready", "/ready"),
            ("healthz", "/healthz"),
            ("/a!b(c)*'[x]", "/a!b(c)*'[x]"),
            ("/a%2Fb", "/a%2Fb"),
            ("/drain now", "/drain%20now"),
            ("/q?x=1&y=a b", "/q?x=1&y=a%20b"),
            ("/frag#part", "/frag"),
            ("/{a}|<b>\\^`\"", "/%7Ba%7D%7C%3Cb%3E%5C%5E%60%22"),
            ("/caf\u{e9}", "/caf%C3%A9"),
            ("/100%", "/100%25"),
            ("/a%zz?b", "/a%25zz%3Fb"),
        ] {
            g.path = Some(path.into());
            assert_eq!(
                http_url(&g, &[]).unwrap(),
                format!("http://127.0.0.1:8080{sent}"),
                "{path:?}"
            );
        }
        g.path = Some(format!("/{}", "x".repeat(2048)));
        let e = http_url(&g, &[]).unwrap_err();
        assert!(e.contains("longer"), "{e}");
    }

    #[test]
    fn http_get_urls() {
        let ports = [ContainerPort {
            name: Some("admin".into()),
            container_port: 15000,
            ..ContainerPort::default()
        }];
        let mut g = get(IntOrString::String("admin".into()));
        g.path = Some("drain".into());
        assert_eq!(
            http_url(&g, &ports).unwrap(),
            "http://127.0.0.1:15000/drain"
        );
        let g = get(IntOrString::Int(8080));
        assert_eq!(http_url(&g, &ports).unwrap(), "http://127.0.0.1:8080/");
        for (bad, want) in [
            (get(IntOrString::String("nope".into())), "does not name"),
            (get(IntOrString::Int(0)), "does not name"),
            (
                HTTPGetAction {
                    scheme: Some("HTTPS".into()),
                    ..get(IntOrString::Int(1))
                },
                "HTTPS",
            ),
            (
                HTTPGetAction {
                    host: Some("10.0.0.1".into()),
                    ..get(IntOrString::Int(1))
                },
                "loopback",
            ),
            (
                HTTPGetAction {
                    http_headers: Some(vec![HTTPHeader {
                        name: "a".into(),
                        value: "b".into(),
                    }]),
                    ..get(IntOrString::Int(1))
                },
                "headers",
            ),
        ] {
            let e = http_url(&bad, &ports).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    fn prestop(hook: Option<LifecycleHandler>) -> (Vec<String>, Vec<String>) {
        let mut c = Container {
            name: "proxy".into(),
            lifecycle: Some(Lifecycle {
                pre_stop: hook,
                ..Lifecycle::default()
            }),
            ..Container::default()
        };
        let mut warnings = Vec::new();
        let s = Sidecar {
            timeout: Duration::from_secs(25),
            handshake: super::HandshakeVolume::HostPath,
            presence: None,
            second_name: true,
        };
        s.inject(&mut c, &mut warnings).unwrap();
        let first = c.clone();
        s.inject(&mut c, &mut warnings).unwrap();
        assert_eq!(c, first, "a second pass changes nothing");
        let argv = c
            .lifecycle
            .and_then(|l| l.pre_stop)
            .and_then(|h| h.exec)
            .and_then(|e| e.command)
            .unwrap_or_default();
        (argv, warnings)
    }

    #[test]
    fn a_presence_wait_goes_in_the_env_and_a_pods_own_is_kept() {
        let s = Sidecar {
            timeout: Duration::from_secs(25),
            handshake: super::HandshakeVolume::EmptyDir,
            presence: Some(Duration::ZERO),
            second_name: true,
        };
        let env_of = |c: &Container| {
            c.env
                .iter()
                .flatten()
                .filter(|e| e.name == ENV_PRESENCE)
                .map(|e| e.value.clone().unwrap_or_default())
                .collect::<Vec<_>>()
        };
        let mut c = Container {
            name: "proxy".into(),
            ..Container::default()
        };
        s.inject(&mut c, &mut Vec::new()).unwrap();
        assert_eq!(env_of(&c), ["0ms"]);
        // Nothing in the command line: an entrypoint of an earlier release would refuse it.
        let argv = c
            .lifecycle
            .as_ref()
            .and_then(|l| l.pre_stop.as_ref())
            .and_then(|h| h.exec.as_ref())
            .and_then(|e| e.command.clone())
            .unwrap_or_default();
        assert!(!argv.iter().any(|a| a.contains("presence")), "{argv:?}");
        let mut own = Container {
            name: "proxy".into(),
            env: Some(vec![EnvVar {
                name: ENV_PRESENCE.into(),
                value: Some("3s".into()),
                ..EnvVar::default()
            }]),
            ..Container::default()
        };
        s.inject(&mut own, &mut Vec::new()).unwrap();
        assert_eq!(env_of(&own), ["3s"]);
    }

    #[test]
    fn each_prestop_form_is_wrapped() {
        let head = [mount::ENTRYPOINT, "wait", "--timeout", "25s"];
        let with = |rest: &[&str]| -> Vec<String> {
            head.iter().chain(rest).map(|s| (*s).to_owned()).collect()
        };
        assert_eq!(prestop(None).0, with(&[]));
        let exec = LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(vec!["/bin/drain".into(), "--now".into()]),
            }),
            ..LifecycleHandler::default()
        };
        assert_eq!(prestop(Some(exec)).0, with(&["--", "/bin/drain", "--now"]));
        let sleep = LifecycleHandler {
            sleep: Some(SleepAction { seconds: 3 }),
            ..LifecycleHandler::default()
        };
        assert_eq!(prestop(Some(sleep)).0, with(&["--sleep", "3s"]));
        let http = LifecycleHandler {
            http_get: Some(HTTPGetAction {
                path: Some("/quit".into()),
                ..get(IntOrString::Int(9000))
            }),
            ..LifecycleHandler::default()
        };
        assert_eq!(
            prestop(Some(http)).0,
            with(&["--http-get", "http://127.0.0.1:9000/quit"])
        );
        let https = LifecycleHandler {
            http_get: Some(HTTPGetAction {
                scheme: Some("HTTPS".into()),
                ..get(IntOrString::Int(9000))
            }),
            ..LifecycleHandler::default()
        };
        let (argv, warnings) = prestop(Some(https));
        assert!(argv.is_empty());
        assert!(warnings.iter().all(|w| w.contains("not ordered")) && !warnings.is_empty());
    }

    #[test]
    fn preset_readiness_endpoints() {
        use k8s_openapi::api::core::v1::Probe;
        let c = |name: &str, image: &str, args: &[&str]| Container {
            name: name.into(),
            image: Some(image.into()),
            args: Some(args.iter().map(|a| (*a).to_owned()).collect()),
            ..Container::default()
        };
        // daprd's own probe waits for the app: its outbound check is used instead.
        let mut daprd = c("daprd", "ghcr.io/dapr/daprd:1.14", &[]);
        daprd.readiness_probe = Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/v1.0/healthz".into()),
                ..get(IntOrString::Int(3501))
            }),
            ..Probe::default()
        });
        assert_eq!(
            ready_url(&daprd).as_deref(),
            Ok("http://127.0.0.1:3500/v1.0/healthz/outbound")
        );
        // A flag-enabled endpoint only with its flag.
        let sql = c("cloud-sql-proxy", "x", &["p:r:db"]);
        assert!(ready_url(&sql).is_err());
        let sql = c("cloud-sql-proxy", "x", &["--health-check", "p:r:db"]);
        assert_eq!(
            ready_url(&sql).as_deref(),
            Ok("http://127.0.0.1:9090/readiness")
        );
        // Known by image.
        assert_eq!(
            ready_url(&c("dp", "docker.io/kumahq/kuma-dp:2.9.0", &[])).as_deref(),
            Ok("http://127.0.0.1:9902/ready")
        );
    }

    #[test]
    fn sidecars_start_first_once_ready() {
        use k8s_openapi::api::core::v1::Probe;
        let named = |name: &str| Container {
            name: name.into(),
            ..Container::default()
        };
        let mut probed = named("envoy");
        probed.ports = Some(vec![ContainerPort {
            name: Some("admin".into()),
            container_port: 9901,
            ..ContainerPort::default()
        }]);
        probed.readiness_probe = Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/ready".into()),
                ..get(IntOrString::String("admin".into()))
            }),
            ..Probe::default()
        });
        let mut cs = vec![named("app"), named("logs"), named("linkerd-proxy"), probed];
        let mut warnings = Vec::new();
        let sidecars = ["logs", "linkerd-proxy", "envoy"];
        let first = start_first(&mut cs, &sidecars, &mut warnings);
        assert_eq!(first, ["linkerd-proxy", "envoy"]);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("\"logs\""), "{warnings:?}");
        let hook = |c: &Container| {
            c.lifecycle
                .as_ref()
                .and_then(|l| l.post_start.as_ref())
                .and_then(|h| h.exec.as_ref())
                .and_then(|e| e.command.clone())
                .unwrap_or_default()
        };
        assert_eq!(hook(&cs[2])[3], "http://127.0.0.1:4191/ready");
        assert_eq!(hook(&cs[3])[3], "http://127.0.0.1:9901/ready");
        assert!(hook(&cs[0]).is_empty() && hook(&cs[1]).is_empty());
        let before = cs.clone();
        assert_eq!(start_first(&mut cs, &sidecars, &mut Vec::new()), first);
        assert_eq!(cs, before, "a second pass changes nothing");
    }

    #[test]
    fn only_the_injected_mounts_reach_the_share() {
        let share = "/var/lib/exitorder";
        let mut spec = PodSpec {
            containers: vec![Container {
                name: "proxy".into(),
                ..Container::default()
            }],
            ..PodSpec::default()
        };
        share_volume(&mut spec, share, "/var/lib/exitorder-bin").unwrap();
        Sidecar {
            timeout: Duration::from_secs(1),
            handshake: super::HandshakeVolume::HostPath,
            presence: None,
            second_name: true,
        }
        .inject(&mut spec.containers[0], &mut Vec::new())
        .unwrap();
        assert!(share_only_as_injected(&spec, share).is_ok());
        let mut whole = spec.clone();
        whole.containers.push(Container {
            name: "app".into(),
            volume_mounts: Some(vec![VolumeMount {
                name: VOLUME.into(),
                mount_path: "/x".into(),
                ..VolumeMount::default()
            }]),
            ..Container::default()
        });
        let e = share_only_as_injected(&whole, share).unwrap_err();
        assert!(e.contains("\"app\"") && e.contains("/x"), "{e}");
        // The entrypoint is not in the share: the old read-only mount of its `bin/` is not
        // what the injection gives any more.
        let mut old_bin = spec.clone();
        if let Some(m) = old_bin.containers[0].volume_mounts.as_mut() {
            m[1].name = VOLUME.into();
            m[1].sub_path = Some("bin".into());
        }
        assert!(share_only_as_injected(&old_bin, share).is_err());
        let mut other = spec.clone();
        other.volumes.get_or_insert_with(Vec::new).push(Volume {
            name: "mine".into(),
            host_path: Some(HostPathVolumeSource {
                path: "/var/lib/exitorder/bin/".into(),
                type_: None,
            }),
            ..Volume::default()
        });
        let e = share_only_as_injected(&other, share).unwrap_err();
        assert!(e.contains("\"mine\""), "{e}");
    }

    #[test]
    fn conflicts_are_refused_by_name() {
        let mut c = Container {
            name: "proxy".into(),
            env: Some(vec![EnvVar {
                name: env::POD_UID.into(),
                value: Some("x".into()),
                ..EnvVar::default()
            }]),
            ..Container::default()
        };
        let s = Sidecar {
            timeout: Duration::from_secs(1),
            handshake: super::HandshakeVolume::HostPath,
            presence: None,
            second_name: true,
        };
        let e = s.inject(&mut c, &mut Vec::new()).unwrap_err();
        assert!(e.contains("POD_UID"), "{e}");
        let mut c = Container {
            name: "proxy".into(),
            volume_mounts: Some(vec![VolumeMount {
                name: "other".into(),
                mount_path: mount::EXIT_DIR.into(),
                ..VolumeMount::default()
            }]),
            ..Container::default()
        };
        let e = s.inject(&mut c, &mut Vec::new()).unwrap_err();
        assert!(e.contains("\"other\""), "{e}");
        let mut spec = PodSpec {
            volumes: Some(vec![Volume {
                name: VOLUME.into(),
                ..Volume::default()
            }]),
            ..PodSpec::default()
        };
        assert!(share_volume(&mut spec, "/var/lib/exitorder", "/var/lib/exitorder-bin").is_err());
    }
}
