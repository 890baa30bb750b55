//! What a typed call can end with besides its response.

use std::sync::Arc;

use erpc::{EnqueueErrorKind, MsgBufError, RpcError, SessionEnd};

use crate::codec::CodecError;

/// Why a typed call did not return a response. Every error of the core
/// arrives as [`CallError::Rpc`] with the core's [`RpcError`], typed: the
/// peer failed ([`SessionEnd::PeerFailed`](erpc::SessionEnd::PeerFailed)), the session was reset or
/// destroyed, the connect failed or timed out, the host name does not
/// resolve, the server failed the request with a status
/// ([`RpcError::Server`]: no handler, no memory, a panicking background
/// handler), and so on. The layer adds its own: the per-call timeout, and
/// the codec's errors on either side.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The core completed the request with an error.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// The call's timeout passed first. `sent` says whether the request
    /// had been handed to the core: if so it may still run at the server
    /// (once at most: eRPC never sends a request twice as a new request),
    /// and its response, if any, is discarded; if not it never runs.
    #[error("the call timed out ({})", if *sent { "the request was sent and may still run once" } else { "the request was never sent" })]
    TimedOut {
        /// The request had been handed to the core.
        sent: bool,
    },
    /// The response did not decode as the method's response type.
    #[error("the response does not decode as the method's response type: {0}")]
    Decode(CodecError),
    /// The server could not decode the request as the method's request
    /// type (client and server disagree on the method's types). The
    /// handler did not run.
    #[error("the server could not decode the request as the method's request type")]
    BadRequest,
    /// The request could not be encoded.
    #[error("the request could not be encoded: {0}")]
    Encode(CodecError),
    /// The core refused the request: no such session, a server session,
    /// or a session being disconnected.
    #[error("the request was refused: {0}")]
    Enqueue(EnqueueErrorKind),
    /// No message-buffer memory for the request or its response.
    #[error("no message buffer for the call: {0}")]
    Alloc(Arc<MsgBufError>),
}

impl CallError {
    /// True if the session of the call is gone (the peer failed, the
    /// session was reset, destroyed or reclaimed, or never connected):
    /// calls queued behind it fail the same way, and a new session is
    /// needed.
    pub fn session_gone(&self) -> bool {
        matches!(
            self,
            CallError::Rpc(
                RpcError::SessionEnded {
                    why: SessionEnd::PeerFailed
                        | SessionEnd::Reset
                        | SessionEnd::ConnectFailed(_)
                        | SessionEnd::ConnectTimedOut
                        | SessionEnd::HostNotFound
                        | SessionEnd::ReqNumsExhausted
                        | SessionEnd::ServerReclaimed,
                    ..
                } | RpcError::SessionDestroyed { .. }
            ) | CallError::Enqueue(_)
        )
    }
}

impl From<MsgBufError> for CallError {
    fn from(e: MsgBufError) -> CallError {
        CallError::Alloc(Arc::new(e))
    }
}
