//! Lifecycle handlers and probes: exec, httpGet (named ports looked up), tcpSocket, sleep.

use k8s_openapi::api::core::v1::{
    HTTPGetAction, LifecycleHandler, Probe as K8sProbe, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{Handler, PlanError, Probe};

fn port<E: Fn(&str, String) -> PlanError>(
    p: &IntOrString,
    field: &str,
    ports: &[(Option<String>, i32)],
    err: &E,
) -> Result<u16, PlanError> {
    let n = match p {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => match name.parse::<i32>() {
            Ok(n) => n,
            Err(_) => ports
                .iter()
                .find(|(n, _)| n.as_deref() == Some(name.as_str()))
                .map(|(_, p)| *p)
                .ok_or_else(|| err(field, format!("no container port named {name:?}")))?,
        },
    };
    u16::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| err(field, format!("{n} is not a port number")))
}

fn http_get<E: Fn(&str, String) -> PlanError>(
    h: &HTTPGetAction,
    field: &str,
    ports: &[(Option<String>, i32)],
    err: &E,
) -> Result<Handler, PlanError> {
    if let Some(s) = h.scheme.as_deref() {
        if s != "HTTP" {
            return Err(err(
                &format!("{field}.httpGet.scheme"),
                format!("{s:?}: only HTTP is supported"),
            ));
        }
    }
    let path = h.path.clone().unwrap_or_default();
    Ok(Handler::HttpGet {
        host: h.host.clone().filter(|h| !h.is_empty()),
        port: port(&h.port, &format!("{field}.httpGet.port"), ports, err)?,
        path: if path.starts_with('/') {
            path
        } else {
            format!("/{path}")
        },
        headers: h
            .http_headers
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|h| (h.name, h.value))
            .collect(),
    })
}

fn tcp<E: Fn(&str, String) -> PlanError>(
    t: &TCPSocketAction,
    field: &str,
    ports: &[(Option<String>, i32)],
    err: &E,
) -> Result<Handler, PlanError> {
    Ok(Handler::TcpSocket {
        host: t.host.clone().filter(|h| !h.is_empty()),
        port: port(&t.port, &format!("{field}.tcpSocket.port"), ports, err)?,
    })
}

pub(super) fn lifecycle_handler<E: Fn(&str, String) -> PlanError>(
    h: &LifecycleHandler,
    field: &str,
    ports: &[(Option<String>, i32)],
    err: &E,
) -> Result<Handler, PlanError> {
    match (&h.exec, &h.http_get, &h.sleep) {
        (Some(e), None, None) => exec(e.command.as_ref(), field, err),
        (None, Some(g), None) => http_get(g, field, ports, err),
        (None, None, Some(s)) if s.seconds >= 0 => Ok(Handler::Sleep(s.seconds)),
        (None, None, Some(_)) => Err(err(
            &format!("{field}.sleep.seconds"),
            "must not be negative".into(),
        )),
        _ => Err(err(
            field,
            "exactly one of exec, httpGet or sleep is needed".into(),
        )),
    }
}

fn exec<E: Fn(&str, String) -> PlanError>(
    cmd: Option<&Vec<String>>,
    field: &str,
    err: &E,
) -> Result<Handler, PlanError> {
    match cmd {
        Some(c) if !c.is_empty() => Ok(Handler::Exec(c.clone())),
        _ => Err(err(
            &format!("{field}.exec.command"),
            "an exec handler needs a command".into(),
        )),
    }
}

pub(super) fn probe<E: Fn(&str, String) -> PlanError>(
    p: &K8sProbe,
    field: &str,
    ports: &[(Option<String>, i32)],
    err: &E,
) -> Result<Probe, PlanError> {
    let handler = match (&p.exec, &p.http_get, &p.tcp_socket) {
        (Some(e), None, None) => exec(e.command.as_ref(), field, err)?,
        (None, Some(g), None) => http_get(g, field, ports, err)?,
        (None, None, Some(t)) => tcp(t, field, ports, err)?,
        _ => {
            return Err(err(
                field,
                "exactly one of exec, httpGet or tcpSocket is needed".into(),
            ))
        }
    };
    let at_least = |v: Option<i32>, default: i32, min: i32, name: &str| -> Result<i64, PlanError> {
        let v = v.unwrap_or(default);
        if v < min {
            return Err(err(
                &format!("{field}.{name}"),
                format!("{v} is below {min}"),
            ));
        }
        Ok(i64::from(v))
    };
    let thresholds = |v: Option<i32>, default: i32, name: &str| -> Result<u32, PlanError> {
        u32::try_from(at_least(v, default, 1, name)?)
            .map_err(|_| err(&format!("{field}.{name}"), "too large".into()))
    };
    Ok(Probe {
        handler,
        initial_delay_seconds: at_least(p.initial_delay_seconds, 0, 0, "initialDelaySeconds")?,
        period_seconds: at_least(p.period_seconds, 10, 1, "periodSeconds")?,
        timeout_seconds: at_least(p.timeout_seconds, 1, 1, "timeoutSeconds")?,
        success_threshold: thresholds(p.success_threshold, 1, "successThreshold")?,
        failure_threshold: thresholds(p.failure_threshold, 3, "failureThreshold")?,
        termination_grace_seconds: p.termination_grace_period_seconds,
    })
}
