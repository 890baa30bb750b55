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
use common::threads::{Owned, owner_thread, rpc_thread};
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

/// Scale-out (issue 28): two nodes of four Rpcs each on four threads,
/// thread i owning Rpc i of both nodes (its own queue set on each NIC, its
/// own UDP port and flow rule), every Rpc a client of its counterpart on
/// the other node, over links that lose, duplicate and reorder frames.
/// Every request completes exactly once: no failure, every response
/// right, and the servers ran exactly as many handlers as requests were
/// made. Not timed; a loaded 2-core machine only makes it slower.
#[test]
fn four_rpcs_per_node_on_four_threads_with_loss() {
    const THREADS: usize = 4;
    const OPS: usize = 1000;
    let fabric = Fabric::new(FabricConfig {
        seed: 9,
        deterministic: false,
        ..Default::default()
    });
    let nics: Vec<SimNic> = (1..=2u8)
        .map(|i| {
            SimNic::new(
                &fabric,
                NicConfig {
                    mac: [2, 0, 0, 0, 0x21, i],
                    ..Default::default()
                },
            )
        })
        .collect();
    for n in &nics {
        fabric.set_link_faults(
            n.port(),
            mlx5_sim::LinkFaults {
                loss: 0.005,
                duplicate: 0.002,
                reorder: 0.002,
                ..Default::default()
            },
        );
    }
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
    let uris: Vec<String> = (0..2)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    // A generous failure timeout: on a loaded machine the SM threads may
    // be descheduled for long, and nothing here may fail a peer.
    let nexuses: Vec<_> = uris
        .iter()
        .map(|u| {
            app::register::<Mlx5Transport<SimBackend>>(Nexus::builder(u))
                .failure_timeout_ms(30_000)
                .build()
                .expect("nexus")
        })
        .collect();
    let ready = Arc::new(Barrier::new(THREADS));
    let done = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            let (ready, done) = (ready.clone(), done.clone());
            let (devs, nexuses, uris) = (devs.clone(), nexuses.clone(), uris.clone());
            std::thread::spawn(move || {
                let mut owned = Vec::new();
                for node in 0..2 {
                    let dev = &devs[node];
                    let cfg = Mlx5Config::new(
                        Ipv4Addr::new(10, 31, 0, node as u8 + 1),
                        QueueConfig {
                            udp_port: 42_000 + (node * 100 + i) as u16,
                            ..Default::default()
                        },
                    );
                    let t = Mlx5Transport::new(dev, cfg).map_err(|e| e.to_string())?;
                    let a = Allocator::new(
                        dev.dma_mapper(),
                        AllocatorConfig {
                            initial_bytes: 8 << 20,
                            region: region(),
                            ..Default::default()
                        },
                    )
                    .map_err(|e| e.to_string())?;
                    let rpc = erpc::Rpc::builder(&nexuses[node], t, a)
                        .id(i as u8)
                        .config(erpc::RpcConfig {
                            failure_timeout_ms: 30_000,
                            ..Default::default()
                        })
                        .session_handler(app::sm_handler)
                        .build()
                        .map_err(|e| e.to_string())?;
                    owned.push(Owned {
                        rpc,
                        ctx: app::Ctx::new(0x5000 + (node * 16 + i) as u64),
                        peers: vec![(uris[1 - node].clone(), i as u8)],
                    });
                }
                owner_thread(owned, OPS, 8, ready, done, 2 * THREADS)
            })
        })
        .collect();
    let (mut handled, mut retransmissions) = (0, 0);
    for h in handles {
        for (completed, h, r) in h.join().expect("thread panicked").expect("rpc thread") {
            assert_eq!(completed, OPS as u64);
            handled += h;
            retransmissions += r;
        }
    }
    assert_eq!(
        handled,
        (2 * THREADS * OPS) as u64,
        "each request ran exactly once"
    );
    assert!(
        retransmissions > 0,
        "the links lost frames: loss recovery had work"
    );
    // The traffic crossed the lossy fabric.
    let sent: u64 = nics.iter().map(|n| n.stats().tx_frames).sum();
    assert!(sent > (4 * THREADS * OPS) as u64, "{sent}");
}
