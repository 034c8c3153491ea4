//! An exit file's content, which any container holding its own share directory can write:
//! the agent's reading of it (`ExitState::parse`) and the entrypoint's (`wait::is_allow`).
//!
//! Oracle: no panic; what the agent shows of an unexpected content is the trimmed, lossy
//! text of at most the first 64 bytes; `wait` (the request) and nothing at all read as
//! waiting; and the agent and the entrypoint agree on whether a content is `allow`: an exit
//! the entrypoint takes as allowed and the agent does not (or the other way round) would
//! hold a sidecar to its deadline, or let the agent forget a wait that is still on.
#![no_main]

use exitorder::handshake::share::ExitState;
use exitorder_contract::handshake::{ALLOW, WAIT};
use exitorder_entrypoint::wait::{self, MAX_ANSWER};
use libfuzzer_sys::fuzz_target;

/// What the agent reads of an exit file at most (its own cap is private).
const MAX_EXIT_BYTES: usize = 64;

fuzz_target!(|data: &[u8]| {
    let state = ExitState::parse(data);
    let agent_sees = &data[..data.len().min(MAX_EXIT_BYTES)];
    let entrypoint_sees = &data[..data.len().min(MAX_ANSWER)];

    assert_eq!(
        state == ExitState::Allowed,
        wait::is_allow(entrypoint_sees),
        "agent {state:?}, entrypoint allow: {}, for {data:?}",
        wait::is_allow(entrypoint_sees)
    );
    let lossy = String::from_utf8_lossy(agent_sees);
    match &state {
        ExitState::Waiting => {
            let text = lossy.trim_ascii();
            assert!(text.is_empty() || text == WAIT, "{data:?} read as waiting");
        }
        ExitState::Allowed => assert_eq!(lossy.trim_ascii(), ALLOW),
        ExitState::Unexpected(text) => {
            assert!(
                !text.is_empty() && text != WAIT && text != ALLOW,
                "{text:?}"
            );
            assert!(
                lossy.contains(text.as_str()),
                "{text:?} is not from {lossy:?}"
            );
            // Each byte read is at most one character (one U+FFFD when it is not UTF-8).
            assert!(text.chars().count() <= MAX_EXIT_BYTES, "{text:?}");
        }
        ExitState::Absent => panic!("a file that was read is never absent"),
    }
    // The request the entrypoint writes, and the answer the agent writes, whatever follows
    // them past what is read.
    let mut request = b"wait\n".to_vec();
    request.extend_from_slice(data);
    if request.len() <= MAX_EXIT_BYTES && data.iter().all(u8::is_ascii_whitespace) {
        assert_eq!(ExitState::parse(&request), ExitState::Waiting);
    }
});
