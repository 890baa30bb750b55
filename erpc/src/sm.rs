//! Session-management links: how SM packets travel between Nexuses. An
//! application picks one on [`NexusBuilder::sm_link`](crate::NexusBuilder::sm_link)
//! and needs nothing else here; the default is [`UdpSmLink`] (kernel UDP,
//! the C++ eRPC's choice).
//!
//! Implement [`SmLink`] to carry them some other way (the simulator's
//! in-memory hub, `erpc_sim::SimSmHub`, is one): the Nexus starts the link
//! with its [`SmRouter`], the link hands every arriving packet to
//! [`SmRouter::deliver`] with its [`SmSource`], and sends what the router
//! and the Rpcs give it.

pub use crate::nexus::{
    Resolver, SmLink, SmRouter, SmRouterStats, SmSource, UdpSmLink, UdpSmStats, system_resolver,
};
pub use crate::sm_types::SM_PKT_BYTES;
