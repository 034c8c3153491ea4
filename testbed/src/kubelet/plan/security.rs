//! A container's security settings, as the kubelet gives them to the runtime.

use k8s_openapi::api::core::v1::SecurityContext;

use super::{PlanError, Seccomp, Security};

pub(super) fn seccomp<E: Fn(&str, String) -> PlanError>(
    t: Option<&str>,
    field: &str,
    err: &E,
) -> Result<Option<Seccomp>, PlanError> {
    match t {
        None => Ok(None),
        Some("RuntimeDefault") => Ok(Some(Seccomp::RuntimeDefault)),
        Some("Unconfined") => Ok(Some(Seccomp::Unconfined)),
        Some(other) => Err(err(
            field,
            format!("{other:?}: RuntimeDefault or Unconfined"),
        )),
    }
}

pub(super) fn security<E: Fn(&str, String) -> PlanError>(
    sc: Option<&SecurityContext>,
    field: &str,
    err: &E,
) -> Result<Security, PlanError> {
    let Some(sc) = sc else {
        return Ok(Security::default());
    };
    if let Some(pm) = sc.proc_mount.as_deref() {
        if pm != "Default" {
            return Err(err(
                &format!("{field}.procMount"),
                format!("{pm:?}: only Default is supported"),
            ));
        }
    }
    let caps = sc.capabilities.clone().unwrap_or_default();
    let privileged = sc.privileged.unwrap_or(false);
    let no_new_privs = sc.allow_privilege_escalation == Some(false);
    if privileged && no_new_privs {
        return Err(err(
            &format!("{field}.allowPrivilegeEscalation"),
            "cannot be false for a privileged container".into(),
        ));
    }
    Ok(Security {
        run_as_user: sc.run_as_user,
        run_as_group: sc.run_as_group,
        run_as_non_root: sc.run_as_non_root.unwrap_or(false),
        privileged,
        add_capabilities: caps.add.unwrap_or_default(),
        drop_capabilities: caps.drop.unwrap_or_default(),
        read_only_root: sc.read_only_root_filesystem.unwrap_or(false),
        no_new_privs,
        seccomp: seccomp(
            sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
            &format!("{field}.seccompProfile.type"),
            err,
        )?,
    })
}
