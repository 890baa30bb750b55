//! The unit tests of `erpc-vfio`'s logic, on a fake sysfs/procfs tree.

use std::fs;

use super::*;
use mlx5::vfio::sysfs::FakeSysfs;

fn bdf(s: &str) -> PciAddress {
    s.parse().unwrap()
}

struct Fixture {
    fake: FakeSysfs,
    env: Env,
}

/// A machine like the QEMU guest: e1000e alone (no driver), edu alone,
/// virtio-net with the default route, and a bridge group holding a
/// second edu and a virtio-rng on virtio-pci.
fn machine() -> Fixture {
    let fake = FakeSysfs::new().unwrap();
    fake.add_device(bdf("0000:00:02.0"), 0x8086, 0x10d3, 0x020000, Some(2))
        .unwrap();
    fake.add_device(bdf("0000:00:03.0"), 0x1234, 0x11e8, 0x00ff00, Some(3))
        .unwrap();
    fake.add_device(bdf("0000:00:04.0"), 0x1af4, 0x1000, 0x020000, Some(4))
        .unwrap();
    fake.add_device(bdf("0000:00:05.0"), 0x1b36, 0x0001, 0x060400, Some(5))
        .unwrap();
    fake.add_device(bdf("0000:01:01.0"), 0x1234, 0x11e8, 0x00ff00, Some(5))
        .unwrap();
    fake.add_device(bdf("0000:01:02.0"), 0x1af4, 0x1005, 0x00ff00, Some(5))
        .unwrap();
    fake.add_device(bdf("0000:03:00.0"), 0x15b3, 0x1017, 0x020000, Some(7))
        .unwrap();
    fake.bind(bdf("0000:00:04.0"), "virtio-pci").unwrap();
    fake.bind(bdf("0000:01:02.0"), "virtio-pci").unwrap();
    fake.add_driver("vfio-pci").unwrap();
    fake.add_iommu_unit("dmar0").unwrap();
    fake.add_interface(bdf("0000:00:04.0"), "eth0", true)
        .unwrap();
    let proc_root = fake.root().join("proc");
    fs::create_dir_all(proc_root.join("net")).unwrap();
    fs::create_dir_all(proc_root.join("self")).unwrap();
    fs::write(
        proc_root.join("net/route"),
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
         eth0\t00000000\t0202000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
         eth0\t0002000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n",
    )
    .unwrap();
    fs::write(
        proc_root.join("net/ipv6_route"),
        "00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
         00000000000000000000000000000000 ffffffff 00000001 00000000 00200200 lo\n",
    )
    .unwrap();
    fs::write(
        proc_root.join("meminfo"),
        "HugePages_Total:      16\nHugePages_Free:       12\nHugePages_Rsvd:        1\nHugepagesize:       2048 kB\n",
    )
    .unwrap();
    fs::write(
        proc_root.join("cmdline"),
        "console=ttyS0 intel_iommu=on quiet\n",
    )
    .unwrap();
    fs::write(
        proc_root.join("self/status"),
        "Name:\tx\nUid:\t1000\t0\t0\t0\n",
    )
    .unwrap();
    let env = Env {
        sysfs: fake.sysfs(),
        proc_root,
        dev_vfio: fake.root().join("dev-vfio"),
        state_dir: fake.root().join("run"),
    };
    fs::create_dir_all(&env.dev_vfio).unwrap();
    Fixture { fake, env }
}

#[test]
fn list_shows_ids_drivers_groups_and_mlx5() {
    let m = machine();
    let rows = list(&m.env).unwrap();
    assert_eq!(rows.len(), 7);
    let nic = rows.iter().find(|r| r.bdf == bdf("0000:03:00.0")).unwrap();
    assert_eq!(nic.mlx5, Some("ConnectX-5"));
    assert_eq!(nic.iommu_group, Some(7));
    let virtio = rows.iter().find(|r| r.bdf == bdf("0000:00:04.0")).unwrap();
    assert_eq!(virtio.driver.as_deref(), Some("virtio-pci"));
    assert_eq!(virtio.class_name, "Ethernet controller");
    assert!(rows.iter().filter(|r| r.mlx5.is_some()).count() == 1);
    let table = render_list(&rows);
    assert!(table.contains("0000:03:00.0  15b3:1017"), "{table}");
    assert!(table.contains("mlx5: ConnectX-5"), "{table}");
    let json = serde_json::to_value(&rows).unwrap();
    assert_eq!(json[0]["bdf"], "0000:00:02.0");
}

#[test]
fn bind_plan_is_the_documented_sysfs_sequence() {
    let m = machine();
    let plan = plan_bind(&m.env, bdf("0000:00:02.0"), false).unwrap();
    let root = m.fake.root().display().to_string();
    assert_eq!(
        plan.shell().replace(&root, ""),
        "echo vfio-pci > /bus/pci/devices/0000:00:02.0/driver_override\n\
         echo 0000:00:02.0 > /bus/pci/drivers_probe\n"
    );
    assert_eq!(plan.record.as_ref().unwrap().previous_driver, None);
    // A function on a driver is unbound from it in between.
    let plan = plan_bind(&m.env, bdf("0000:00:04.0"), true).unwrap();
    assert_eq!(
        plan.shell().replace(&root, ""),
        "echo vfio-pci > /bus/pci/devices/0000:00:04.0/driver_override\n\
         echo 0000:00:04.0 > /bus/pci/devices/0000:00:04.0/driver/unbind\n\
         echo 0000:00:04.0 > /bus/pci/drivers_probe\n"
    );
    assert_eq!(
        plan.record.as_ref().unwrap().previous_driver.as_deref(),
        Some("virtio-pci")
    );
}

#[test]
fn bind_refuses_a_group_shared_with_kernel_drivers() {
    let m = machine();
    let err = plan_bind(&m.env, bdf("0000:01:01.0"), true).unwrap_err();
    let ToolError::SharedGroup { group, others, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(*group, 5);
    assert_eq!(
        others,
        &vec![(bdf("0000:01:02.0"), "virtio-pci".to_string())]
    );
    let text = err.to_string();
    assert!(
        text.contains("0000:01:02.0 (bound to virtio-pci)"),
        "{text}"
    );
    assert!(text.contains("own IOMMU group"), "{text}");
    // Once the other member is on vfio-pci the bind goes ahead.
    m.fake.bind(bdf("0000:01:02.0"), "vfio-pci").unwrap();
    assert!(plan_bind(&m.env, bdf("0000:01:01.0"), false).is_ok());
}

#[test]
fn bind_refuses_the_default_route_unless_forced() {
    let m = machine();
    let err = plan_bind(&m.env, bdf("0000:00:04.0"), false).unwrap_err();
    assert!(
        matches!(&err, ToolError::DefaultRoute { iface, .. } if iface == "eth0"),
        "{err:?}"
    );
    assert!(err.to_string().contains("--force"), "{err}");
    assert!(plan_bind(&m.env, bdf("0000:00:04.0"), true).is_ok());
    // Through a bridge on top of it, too.
    fs::write(
        m.env.proc_root.join("net/route"),
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
         br0\t00000000\t0202000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n",
    )
    .unwrap();
    m.fake.add_virtual_interface("br0", &["eth0"]).unwrap();
    assert!(matches!(
        plan_bind(&m.env, bdf("0000:00:04.0"), false),
        Err(ToolError::DefaultRoute { .. })
    ));
}

#[test]
fn bind_refuses_without_iommu_or_vfio_pci() {
    let m = machine();
    m.fake
        .add_device(bdf("0000:00:1f.0"), 0x8086, 0x2918, 0x060100, None)
        .unwrap();
    let err = plan_bind(&m.env, bdf("0000:00:1f.0"), false).unwrap_err();
    assert!(err.to_string().contains("intel_iommu=on iommu=pt"), "{err}");
    let err = plan_bind(&m.env, bdf("0000:09:00.0"), false).unwrap_err();
    assert!(matches!(err, ToolError::NoSuchDevice { .. }));
    fs::remove_dir_all(m.env.sysfs.driver_dir("vfio-pci")).unwrap();
    let err = plan_bind(&m.env, bdf("0000:00:02.0"), false).unwrap_err();
    assert!(err.to_string().contains("modprobe vfio-pci"), "{err}");
}

#[test]
fn apply_records_then_writes_and_unbind_restores() {
    let m = machine();
    let virtio = bdf("0000:00:04.0");
    let plan = plan_bind(&m.env, virtio, true).unwrap();
    apply(&plan).unwrap();
    let dev = m.env.sysfs.device_dir(virtio);
    assert_eq!(
        fs::read_to_string(dev.join("driver_override")).unwrap(),
        "vfio-pci\n"
    );
    assert_eq!(
        fs::read_to_string(m.env.sysfs.drivers_probe_path()).unwrap(),
        "0000:00:04.0\n"
    );
    let rec = read_record(&m.env, virtio).unwrap();
    assert_eq!(rec.previous_driver.as_deref(), Some("virtio-pci"));
    // The fake kernel: the probe put it on vfio-pci.
    m.fake.bind(virtio, "vfio-pci").unwrap();
    let plan = plan_bind(&m.env, virtio, true).unwrap();
    assert!(plan.already_done);
    let un = plan_unbind(&m.env, virtio).unwrap();
    assert_eq!(un.expect_driver.as_deref(), Some("virtio-pci"));
    let root = m.fake.root().display().to_string();
    assert_eq!(
        un.shell().replace(&root, ""),
        "echo 0000:00:04.0 > /bus/pci/devices/0000:00:04.0/driver/unbind\n\
         echo '' > /bus/pci/devices/0000:00:04.0/driver_override\n\
         echo 0000:00:04.0 > /bus/pci/drivers_probe\n"
    );
    apply(&un).unwrap();
    assert_eq!(
        fs::read_to_string(dev.join("driver_override")).unwrap(),
        "\n"
    );
    assert!(read_record(&m.env, virtio).is_none(), "record removed");
}

#[test]
fn unbind_of_a_driverless_function_does_not_probe() {
    let m = machine();
    let e1000e = bdf("0000:00:02.0");
    apply(&plan_bind(&m.env, e1000e, false).unwrap()).unwrap();
    m.fake.bind(e1000e, "vfio-pci").unwrap();
    let un = plan_unbind(&m.env, e1000e).unwrap();
    assert_eq!(un.writes.len(), 2);
    assert_eq!(un.expect_driver, None);
    let err = plan_unbind(&m.env, bdf("0000:00:03.0")).unwrap_err();
    assert!(
        err.to_string()
            .contains("bound to no driver, not to vfio-pci"),
        "{err}"
    );
}

#[test]
fn status_reports_group_viability_hugepages_and_route() {
    let m = machine();
    let s = status(&m.env, bdf("0000:01:01.0")).unwrap();
    let g = s.group.as_ref().unwrap();
    assert_eq!(g.number, 5);
    assert_eq!(g.members.len(), 3);
    assert!(!g.viable);
    assert!(!g.dev_node_exists);
    assert!(s.iommu.enabled);
    assert_eq!(s.iommu.units, ["dmar0"]);
    assert_eq!(s.iommu.cmdline, ["intel_iommu=on"]);
    assert!(s.vfio_pci_loaded);
    assert_eq!(
        s.hugepages,
        Hugepages {
            page_kib: 2048,
            total: 16,
            free: 12,
            reserved: 1
        }
    );
    assert!(!s.ready);
    assert!(
        s.next_steps
            .iter()
            .any(|n| n.contains("0000:01:02.0 is on virtio-pci"))
    );
    let text = render_status(&s);
    assert!(text.contains("NOT viable"), "{text}");
    assert!(text.contains("<- blocks VFIO"), "{text}");
    let s = status(&m.env, bdf("0000:00:04.0")).unwrap();
    assert_eq!(s.default_route.as_deref(), Some("eth0"));
    // A bound function with its node is ready; the node's mode shows.
    m.fake.bind(bdf("0000:00:03.0"), "vfio-pci").unwrap();
    fs::write(m.env.dev_vfio.join("3"), "").unwrap();
    let s = status(&m.env, bdf("0000:00:03.0")).unwrap();
    assert!(s.ready, "{s:?}");
    assert!(s.group.unwrap().dev_node_mode.is_some());
}

#[test]
fn status_advice_never_leads_into_a_bind_refusal() {
    let m = machine();
    // Every non-ready function's advice, followed literally, is accepted
    // by `plan_bind`: a plain `bind` is suggested only where it works.
    for f in [
        "0000:00:02.0",
        "0000:00:04.0",
        "0000:01:01.0",
        "0000:03:00.0",
    ] {
        let s = status(&m.env, bdf(f)).unwrap();
        assert!(!s.ready, "{f}");
        let plain = format!("bind it: `sudo erpc-vfio bind {f}`");
        let suggests_plain = s.next_steps.first() == Some(&plain);
        assert_eq!(
            suggests_plain,
            plan_bind(&m.env, bdf(f), false).is_ok(),
            "{f}: {:?}",
            s.next_steps
        );
    }
    // The default-route NIC: the refusal and its way out, no plain bind.
    let s = status(&m.env, bdf("0000:00:04.0")).unwrap();
    let steps = s.next_steps.join("\n");
    assert!(steps.contains("default route (interface eth0)"), "{steps}");
    assert!(
        steps.contains("`sudo erpc-vfio bind --force 0000:00:04.0`"),
        "{steps}"
    );
    // A shared group: bind the other member first, then this one.
    let s = status(&m.env, bdf("0000:01:01.0")).unwrap();
    assert!(s.next_steps[0].contains("`sudo erpc-vfio bind 0000:01:02.0`"));
    assert!(
        s.next_steps[1].starts_with("then bind it"),
        "{:?}",
        s.next_steps
    );
    // Hugepages: the one number erpc-bench uses, and the command for
    // this machine (16 total, 11 available).
    let want = crate::memory::default_bench_pages();
    assert!(
        steps.contains(&format!("need {want} free 2 MiB pages, 11 are free")),
        "{steps}"
    );
    assert!(
        steps.contains(&format!("`echo {} | sudo tee", 16 + want - 11)),
        "{steps}"
    );
    // Without vfio-pci: load it first.
    fs::remove_dir_all(m.fake.root().join("bus/pci/drivers/vfio-pci")).unwrap();
    let s = status(&m.env, bdf("0000:00:02.0")).unwrap();
    assert!(
        s.next_steps[0].contains("modprobe vfio-pci"),
        "{:?}",
        s.next_steps
    );
    assert!(
        s.next_steps[1].starts_with("then bind it"),
        "{:?}",
        s.next_steps
    );
}

#[test]
fn default_routes_ignore_lo_rejects_and_non_default_entries() {
    let m = machine();
    assert_eq!(default_route_interfaces(&m.env.proc_root), ["eth0"]);
    fs::write(
        m.env.proc_root.join("net/ipv6_route"),
        "00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
         fe800000000000000000000000000001 00000400 00000001 00000000 00000003 ens1\n",
    )
    .unwrap();
    assert_eq!(default_route_interfaces(&m.env.proc_root), ["ens1", "eth0"]);
}

#[test]
fn reads_the_effective_uid() {
    let m = machine();
    assert_eq!(effective_uid(&m.env.proc_root), Some(0));
    fs::write(
        m.env.proc_root.join("self/status"),
        "Uid:\t0\t1000\t1000\t1000\n",
    )
    .unwrap();
    assert_eq!(effective_uid(&m.env.proc_root), Some(1000));
}
