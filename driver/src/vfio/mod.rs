//! VFIO backend (to be written): open a PCI function bound to vfio-pci,
//! map BAR0, manage the IOMMU, implement [`crate::hw::HwBackend`].
