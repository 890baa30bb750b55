//! Unique session tokens and keep-alive incarnations: xoshiro256++ from
//! the value-stable `rand_xoshiro`, seeded through SplitMix64, the same
//! algorithm and seeding as the simulator's generator (`netsim::Rng`), so
//! that a Nexus seeded by a simulation draws the same tokens in every
//! build and a seed replays exactly. Only the three calls eRPC needs; the
//! network model, with its distributions, stays out of this crate. Not
//! for cryptography.

use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{Rng as _, SeedableRng};

/// Deterministic random numbers (xoshiro256++).
#[derive(Debug, Clone)]
pub(crate) struct Rng(Xoshiro256PlusPlus);

impl Rng {
    /// A generator from a seed.
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(Xoshiro256PlusPlus::seed_from_u64(seed))
    }

    /// A generator seeded from the OS's per-process hash randomness (no
    /// clock read): unique tokens outside simulation, never for a run that
    /// must replay.
    pub(crate) fn from_entropy() -> Rng {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x5eed);
        Rng::new(h.finish())
    }

    /// Next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    /// A simulation seeds both generators; the replay promise rests on
    /// their streams being one.
    #[test]
    fn the_stream_is_the_simulators() {
        for seed in [0, 1, 42, u64::MAX] {
            let mut ours = Rng::new(seed);
            let mut sim = netsim::Rng::new(seed);
            for _ in 0..64 {
                assert_eq!(ours.next_u64(), sim.next_u64(), "seed {seed}");
            }
        }
    }
}
