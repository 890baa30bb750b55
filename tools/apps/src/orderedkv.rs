//! The ordered key-value store.
