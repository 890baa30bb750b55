//! What the applications' simulation tests share.

/// [`erpc_sim::with_seeds`] for this crate's tests.
pub fn with_seeds(file: &str, test: &str, defaults: &[u64], f: impl Fn(u64)) {
    erpc_sim::with_seeds("erpc-apps", file, test, defaults, f)
}
