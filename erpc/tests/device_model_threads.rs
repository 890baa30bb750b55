//! Real threads over the device model: the fabric in threaded mode (wall
//! clock, doorbells from any thread, delivery inside the sender's doorbell),
//! two software ConnectX NICs brought up by the driver, three Rpcs on their
//! own threads (two sharing one NIC through separate queue sets), session
//! management over kernel UDP, worker threads for background handlers.

mod common;

use std::net::{Ipv4Addr, UdpSocket};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Barrier};

use common::app;
use common::devmodel::region;
use common::threads::rpc_thread;
use erpc::Nexus;
use mempool::{Allocator, AllocatorConfig};
use mlx5::{Device, DeviceConfig, QueueConfig};
use mlx5_sim::{Fabric, FabricConfig, NicConfig, SimBackend, SimNic};
use transport::mlx5::{Mlx5Config, Mlx5Transport};

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn three_rpcs_on_real_threads_over_the_device_model() {
    let fabric = Fabric::new(FabricConfig {
        seed: 5,
        deterministic: false,
        ..Default::default()
    });
    let nics: Vec<SimNic> = (1..=2u8)
        .map(|i| {
            SimNic::new(
                &fabric,
                NicConfig {
                    mac: [2, 0, 0, 0, 0x20, i],
                    ..Default::default()
                },
            )
        })
        .collect();
    let devs: Vec<Device<SimBackend>> = nics
        .iter()
        .map(|n| {
            Device::open(
                n.backend(),
                DeviceConfig {
                    region: region(),
                    ..Default::default()
                },
            )
            .expect("bring-up")
        })
        .collect();
    let (pa, pb) = (free_port(), free_port());
    let (ua, ub) = (format!("127.0.0.1:{pa}"), format!("127.0.0.1:{pb}"));
    let build = |uri: &str| {
        app::register::<Mlx5Transport<SimBackend>>(Nexus::builder(uri))
            .workers(2)
            .build()
            .expect("nexus")
    };
    let (na, nb) = (build(&ua), build(&ub));
    // (nexus, rpc id, peers, NIC, UDP port)
    let rpcs = [
        (
            na.clone(),
            0u8,
            vec![(ua.clone(), 1u8), (ub.clone(), 0u8)],
            0usize,
            41_000u16,
        ),
        (
            na.clone(),
            1u8,
            vec![(ua.clone(), 0u8), (ub.clone(), 0u8)],
            0,
            41_001,
        ),
        (
            nb.clone(),
            0u8,
            vec![(ua.clone(), 0u8), (ua.clone(), 1u8)],
            1,
            41_002,
        ),
    ];
    let n = rpcs.len();
    let ready = Arc::new(Barrier::new(n));
    let done = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = rpcs
        .into_iter()
        .map(|(nexus, id, peers, nic, port)| {
            let (ready, done, dev) = (ready.clone(), done.clone(), devs[nic].clone());
            std::thread::spawn(move || {
                rpc_thread(nexus, id, peers, ready, done, n, move || {
                    let cfg = Mlx5Config::new(
                        Ipv4Addr::new(10, 30, 0, nic as u8 + 1),
                        QueueConfig {
                            udp_port: port,
                            ..Default::default()
                        },
                    );
                    let t = Mlx5Transport::new(&dev, cfg).map_err(|e| e.to_string())?;
                    let a = Allocator::new(
                        dev.dma_mapper(),
                        AllocatorConfig {
                            initial_bytes: 8 << 20,
                            region: region(),
                            ..Default::default()
                        },
                    )
                    .map_err(|e| e.to_string())?;
                    Ok((t, a))
                })
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread panicked").expect("rpc thread");
    }
    // The traffic crossed the fabric (and looped back inside NIC 0).
    let delivered: u64 = nics.iter().map(|n| n.stats().rx_delivered).sum();
    assert!(delivered > 3 * common::threads::OPS as u64, "{delivered}");
    assert_eq!(
        nics.iter()
            .map(|n| n.drops(mlx5_sim::DropReason::OutOfBuffer))
            .sum::<u64>(),
        0
    );
}
