//! The human rendering of an [`Explanation`].

use std::fmt::Write;

use super::{Explanation, Injection, Member, Shutdown};
use crate::decide::priority::Source;

/// The explanation as text for a terminal, ending in a newline. Names and reasons come from
/// the manifest: control characters are escaped, so none reaches the terminal.
pub fn render(e: &Explanation) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = write_all(&mut out, e);
    let mut clean = String::with_capacity(out.len());
    for c in out.chars() {
        if c.is_control() && c != '\n' {
            clean.extend(c.escape_default());
        } else {
            clean.push(c);
        }
    }
    clean
}

fn write_all(o: &mut String, e: &Explanation) -> std::fmt::Result {
    writeln!(o, "{}", e.object)?;
    writeln!(o)?;
    match &e.injection {
        Injection::NotRequested => writeln!(
            o,
            "Webhook: nothing injected (the pod does not ask: exitorder.io/inject: \"true\")"
        )?,
        Injection::Denied { reason } => writeln!(o, "Webhook: REFUSES the pod: {reason}")?,
        Injection::Injected { handshake, changes } => {
            writeln!(
                o,
                "Webhook: injects, handshake in {handshake}, {} change(s):",
                changes.len()
            )?;
            for c in changes {
                writeln!(o, "  {c}")?;
            }
        }
    }
    writeln!(o)?;
    if e.exit.ordered {
        writeln!(o, "On deletion (exits in this order):")?;
    } else {
        writeln!(
            o,
            "On deletion: not ordered (the pod did not opt in); priorities would be:"
        )?;
    }
    let mut members: Vec<&Member> = e.exit.members.iter().collect();
    members.sort_by_key(|m| m.priority);
    for m in members {
        let waits = if m.waits_for.is_empty() {
            "exits at once".to_owned()
        } else {
            format!("waits for {}", m.waits_for.join(", "))
        };
        let prestop = if m.priority > 0 && !m.waits_in_prestop {
            ", no waiting preStop"
        } else {
            ""
        };
        writeln!(
            o,
            "  priority {:>3}  {}{} ({}){}: {waits}",
            m.priority,
            m.name,
            if m.native { " [native sidecar]" } else { "" },
            source(m),
            prestop,
        )?;
    }
    if !e.exit.native_stop_order.is_empty() {
        writeln!(
            o,
            "  the kubelet stops native sidecars after every main container, in this order: {}",
            e.exit.native_stop_order.join(", ")
        )?;
    }
    match e.exit.restart_evidence {
        Some("others_silent") => writeln!(
            o,
            "  a sidecar restarted alone (a failed probe, a changed spec) is told from the pod's \
             kill by the others' silence on the node, and let go within seconds (by the \
             kubelet's Event only right after another container's restart, and never by \
             silence while the agent's pod watch is catching up, while an exec in a container \
             it waits for runs or after one failed, when its limit counters rose meanwhile, or \
             while other pods' containers on the node exit or mark more often than the 4 s \
             window)"
        )?,
        Some(_) => writeln!(
            o,
            "  a sidecar restarted alone is told from the pod's kill only by the kubelet's Event \
             (held to the deadline without it)"
        )?,
        None => {}
    }
    if let Some(w) = &e.exit.endpoints {
        writeln!(
            o,
            "  endpoints first: {} wait(s) until no EndpointSlice lists the pod as ready, then \
             {} ms for its consumers to reprogram; at most {} ms, and never past the deadline; \
             with no API server, no agent, or a kill of the kubelet's own (which withdraws \
             nothing), the {} ms alone; a pod no Service selects waits nothing",
            if w.apps.is_empty() {
                "no container".to_owned()
            } else {
                w.apps.join(", ")
            },
            w.settle_ms,
            w.max_wait_ms,
            w.settle_ms
        )?;
    }
    writeln!(
        o,
        "  grace period {} s: waiting sidecars are released by {} s after the deletion at the \
         latest ({} s kept for them to drain)",
        e.grace.grace_period_seconds, e.grace.release_by_seconds, e.grace.reserve_seconds
    )?;
    let kills: Vec<String> = e
        .grace
        .kills
        .iter()
        .map(|k| {
            format!(
                "{} {} s (released by {} s)",
                k.kill, k.grace_period_seconds, k.release_by_seconds
            )
        })
        .collect();
    writeln!(
        o,
        "  the kubelet's own kills, ordered the same way: {}",
        kills.join(", ")
    )?;
    writeln!(o)?;
    match e.job.shutdown {
        Shutdown::On => {
            writeln!(
                o,
                "When the work is done (restartPolicy {}): sidecars shut down, lowest priority \
                 first:",
                e.job.restart_policy.as_deref().unwrap_or("?")
            )?;
            for s in &e.job.steps {
                writeln!(
                    o,
                    "  priority {:>3}  {}: {}",
                    s.priority, s.container, s.how
                )?;
            }
            if e.job.steps.is_empty() {
                writeln!(o, "  (no sidecars)")?;
            }
        }
        Shutdown::OptedOut => writeln!(
            o,
            "When the work is done: sidecars left running \
             (exitorder.io/terminate-sidecars-on-completion: \"false\")"
        )?,
        Shutdown::Off => writeln!(
            o,
            "When the work is done: nothing (not a completing pod, or not opted in)"
        )?,
    }
    writeln!(o)?;
    writeln!(o, "Pod Security: meets {}", e.pod_security.profile.as_str())?;
    for v in &e.pod_security.restricted_refuses {
        writeln!(o, "  restricted refuses: {v}")?;
    }
    if !e.warnings.is_empty() {
        writeln!(o)?;
        writeln!(o, "Warnings:")?;
        for w in &e.warnings {
            writeln!(o, "  [{}] {}", w.code, w.message)?;
        }
    }
    Ok(())
}

fn source(m: &Member) -> String {
    let preset = m.preset.as_deref().unwrap_or("?");
    match m.priority_from {
        Source::Annotation => "from the pod's annotation".to_owned(),
        Source::Env => match &m.preset {
            Some(_) => format!("from its env; preset {preset}"),
            None => "from its env".to_owned(),
        },
        Source::NativeSidecar => "a native sidecar".to_owned(),
        Source::Preset => format!("preset {preset}"),
        Source::Default => "main container".to_owned(),
    }
}
