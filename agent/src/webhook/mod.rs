//! The admission webhook (`exitorder webhook`): pods that opt in with one annotation get the
//! share, the mounts, `POD_UID` and a preStop that waits for the agent, on every sidecar.
//!
//! Parts:
//! - [`mutate`](mod@mutate): the mutation, a pure function of the pod;
//! - [`inject`]: what one sidecar gets;
//! - [`presets`]: what a sidecar known by its image only gets;
//! - [`pss`]: the Pod Security profiles a pod meets;
//! - [`review`]: AdmissionReview JSON in and out;
//! - [`tls`]: the serving certificate, reloaded when it changes;
//! - [`rollout`]: the agents' DaemonSet's rollout, and the presence wait it gives sidecars;
//! - [`server`]: the HTTPS endpoint;
//! - [`guard`]: the share's guard for every pod;
//! - [`podlocal`]: the pod-local handshake's volumes, init container and mounts.

pub mod guard;
pub mod inject;
pub mod mutate;
pub mod podlocal;
pub mod presets;
pub mod pss;
pub mod review;
pub mod rollout;
pub mod server;
pub mod tls;

pub use mutate::{mutate, Admission, HandshakeVolume, Settings, DEFAULT_INSTALL_IMAGE};
pub use server::{Webhook, WebhookConfig, WebhookError};
pub use tls::CertFiles;
