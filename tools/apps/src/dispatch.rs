//! The worker-dispatch benchmark.
