"""The machine, measured: NVML snapshots (immutable), recordings and their replay. No torch."""
