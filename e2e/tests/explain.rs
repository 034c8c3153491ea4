//! `exitorder explain` as users run it: the built binary on the README's examples, from a
//! file and from stdin, as text and as JSON, and its exit status.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn explain(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(exitorder_e2e::support::agent_bin())
        .arg("explain")
        .args(args)
        .current_dir(exitorder_e2e::repo())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("exitorder runs");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write stdin");
    }
    drop(child.stdin.take());
    child.wait_with_output().expect("exitorder ends")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn every_example_is_explained() {
    let examples = [
        (
            "two-level",
            "priority   1  proxy (from the pod's annotation): waits for app",
        ),
        ("three-level", "waits for"),
        ("injected", "Webhook: injects, handshake in emptyDir"),
        (
            "linkerd",
            "priority   1  linkerd-proxy (preset linkerd-proxy): waits for app",
        ),
        (
            "istio-native",
            "the kubelet stops native sidecars after every main container",
        ),
        (
            "await-sidecars",
            "move /spec/containers/1 -> /spec/containers/0",
        ),
        (
            "job",
            "priority   1  proxy: POST http://127.0.0.1:4191/cgi-bin/shutdown",
        ),
        ("restricted", "Pod Security: meets restricted"),
    ];
    for (name, line) in examples {
        let path = format!("deploy/examples/{name}.yaml");
        let out = explain(&[&path], None);
        let stdout = text(&out);
        assert!(out.status.success(), "{name}: {out:?}");
        assert!(stdout.contains("On deletion"), "{name}:\n{stdout}");
        assert!(stdout.contains(line), "{name}: no {line:?} in\n{stdout}");
    }
}

#[test]
fn json_from_stdin() {
    let manifest =
        std::fs::read_to_string(exitorder_e2e::repo().join("deploy/examples/linkerd.yaml"))
            .expect("example");
    let out = explain(&["-", "-o", "json"], Some(&manifest));
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let pod = &v[0];
    assert_eq!(pod["injection"]["result"], "injected");
    let proxy = pod["exit"]["members"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == "linkerd-proxy"))
        .expect("the proxy");
    assert_eq!(proxy["priority"], 1);
    assert_eq!(proxy["priorityFrom"], "preset");
    assert_eq!(proxy["waitsFor"][0], "app");
    assert_eq!(proxy["waitsInPrestop"], true);
}

#[test]
fn a_refused_pod_exits_2_and_bad_input_exits_1() {
    let refused = r#"
apiVersion: v1
kind: Pod
metadata:
  name: p
  annotations:
    exitorder.io/inject: "true"
    exitorder.io/container-exit-priority: '{"proxy": 2, "logs": 1}'
spec:
  initContainers: [{name: logs, image: l, restartPolicy: Always}]
  containers: [{name: app, image: a}, {name: proxy, image: p}]
"#;
    let out = explain(&["-"], Some(refused));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        text(&out).contains("Webhook: REFUSES the pod"),
        "{}",
        text(&out)
    );
    assert!(text(&out).contains("[contradicting-priorities]"));
    let out = explain(&["-"], Some("a: ["));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not valid YAML"),
        "{out:?}"
    );
    let out = explain(&["no/such/file.yaml"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no/such/file.yaml"),
        "{out:?}"
    );
}
