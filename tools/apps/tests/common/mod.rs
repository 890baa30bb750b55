//! What the applications' simulation tests share.

/// Runs `f` for each default seed, or for `ERPC_SEED` alone when it is
/// set; a failing seed prints the one-line command that replays it.
pub fn with_seeds(file: &str, test: &str, defaults: &[u64], f: impl Fn(u64)) {
    let seeds: Vec<u64> = match std::env::var("ERPC_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(s) => vec![s],
        None => defaults.to_vec(),
    };
    for seed in seeds {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(seed)));
        if let Err(e) = r {
            eprintln!(
                "\n*** {test} failed with seed {seed}\n*** replay: ERPC_SEED={seed} cargo test -p erpc-apps --test {file} -- {test} --exact\n"
            );
            std::panic::resume_unwind(e);
        }
    }
}
