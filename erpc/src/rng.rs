//! The seeded PRNG of deterministic simulation, unique session tokens in
//! simulation, and fault injection: the network model's one generator
//! ([`netsim::Rng`], xoshiro256++ from the value-stable `rand_xoshiro`), so
//! that eRPC, its simulated network and the device-model fabric draw from
//! one algorithm and a seed replays exactly. Not for cryptography.

pub use netsim::Rng;
