//! The agent's presence in the directories it serves, on the fake runtime: every directory
//! it watches is marked as served; a restart leaves waits and marks for the next agent; an
//! uninstall lets every wait go and marks every directory left.

use std::path::Path;
use std::time::{Duration, Instant};

use exitorder::cri::ContainerState;
use exitorder::decide::priority::ANNOTATION;
use exitorder_e2e::rig::*;

fn two_level_pod(rig: &Rig) -> String {
    rig.cri()
        .add_pod(APP_UID, &[(ANNOTATION, r#"{"proxy":1}"#)]);
    let app = rig.cri().add_container(APP_UID, "app", 0, 60);
    rig.cri().add_container(APP_UID, "proxy", 0, 60);
    app
}

fn presence(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("agent")).unwrap_or_default()
}

async fn presence_says(dir: &Path, state: &str, within: Duration) -> bool {
    let end = Instant::now() + within;
    let line = format!("state={state}\n");
    while Instant::now() < end {
        if presence(dir).contains(&line) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_directory_served_is_marked_before_any_request() {
    let mut rig = Rig::new();
    two_level_pod(&rig);
    rig.start_agent();
    let dir = rig.dir(APP_UID, "proxy");
    std::fs::create_dir_all(&dir).expect("mkdir");
    assert!(
        presence_says(&dir, "serving", Duration::from_secs(5)).await,
        "{:?}",
        presence(&dir)
    );
    assert_eq!(presence(&dir), "version=1\nstate=serving\nendpoints=1\n");
    // Removed by the container: marked again when it asks.
    std::fs::remove_file(dir.join("agent")).expect("rm");
    let f = rig.request_exit(APP_UID, "proxy");
    assert!(presence_says(&dir, "serving", Duration::from_secs(5)).await);
    stays_waiting(&f, Duration::from_millis(100)).await;
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_leaves_waits_and_marks_for_the_next_agent() {
    let mut rig = Rig::new();
    let app = two_level_pod(&rig);
    rig.start_agent();
    let f = rig.request_exit(APP_UID, "proxy");
    let dir = rig.dir(APP_UID, "proxy");
    assert!(presence_says(&dir, "serving", Duration::from_secs(5)).await);
    stays_waiting(&f, Duration::from_millis(100)).await;
    rig.stop_agent().await;
    assert_eq!(content(&f).trim(), "wait", "a restart answers nothing");
    assert!(
        presence(&dir).contains("state=serving\n"),
        "{:?}",
        presence(&dir)
    );
    rig.start_agent();
    stays_waiting(&f, Duration::from_millis(100)).await;
    rig.cri().set_state(&app, ContainerState::ContainerExited);
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uninstall_lets_every_wait_go_and_marks_every_directory_left() {
    let mut rig = Rig::new();
    two_level_pod(&rig);
    rig.start_agent();
    let f = rig.request_exit(APP_UID, "proxy");
    let idle = rig.dir(APP_UID, "app");
    std::fs::create_dir_all(&idle).expect("mkdir");
    let dir = rig.dir(APP_UID, "proxy");
    assert!(presence_says(&dir, "serving", Duration::from_secs(5)).await);
    assert!(presence_says(&idle, "serving", Duration::from_secs(5)).await);
    stays_waiting(&f, Duration::from_millis(100)).await;
    rig.uninstall_agent().await;
    // Its app still runs: only the uninstall let it go.
    assert_eq!(content(&f).trim(), "allow");
    assert_eq!(presence(&dir), "version=1\nstate=uninstalled\n");
    assert_eq!(presence(&idle), "version=1\nstate=uninstalled\n");
    // Installed again: served again.
    rig.start_agent();
    assert!(presence_says(&idle, "serving", Duration::from_secs(5)).await);
    rig.stop_agent().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_withdrawn_unanswered_is_counted_and_an_answered_one_is_not() {
    let mut rig = Rig::new();
    let app = two_level_pod(&rig);
    rig.start_agent();
    // Answered, then removed by its entrypoint: no withdrawal.
    let f = rig.request_exit(APP_UID, "app");
    assert!(allowed_within(&f, Duration::from_secs(2)).await);
    std::fs::remove_file(&f).expect("rm");
    // Held, then given up on (the entrypoint's own timeout, or its presence wait).
    let f = rig.request_exit(APP_UID, "proxy");
    stays_waiting(&f, Duration::from_millis(100)).await;
    assert_eq!(rig.stats.pending(), 1);
    std::fs::remove_file(&f).expect("rm");
    let end = Instant::now() + Duration::from_secs(5);
    while rig.stats.waits_withdrawn() == 0 && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(rig.stats.waits_withdrawn(), 1);
    assert_eq!(rig.stats.pending(), 0);
    rig.cri().set_state(&app, ContainerState::ContainerExited);
    rig.stop_agent().await;
    assert_eq!(rig.stats.waits_withdrawn(), 1);
}
