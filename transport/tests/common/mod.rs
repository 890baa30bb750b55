//! Shared test machinery.
#![allow(dead_code)]

pub mod netns;
pub mod pcap;
