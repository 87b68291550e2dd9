"""The peak memory bandwidth and tensor-core rate of the GPU the check runs on: every
percentage in results.json and the summary table is a fraction of these, named beside it
("% of H100 SXM HBM 3.35 TB/s").

Known devices come from NVIDIA's datasheets (dense rates, no sparsity); any other device gets
peaks computed from what its driver reports:

    HBM bytes/s  = memory clock (Hz) x 2 (double data rate) x bus width (bits) / 8
    bf16 FLOP/s  = SMs x SM clock (Hz) x 4096   (a Hopper SM's dense bf16 FLOP per clock:
                   989.4 TFLOP/s = 132 SMs x 1.83 GHz x 4096)
    fp8 FLOP/s   = 2 x bf16

H100 SXM's HBM3 at 2619 MHz on 5120 bits gives the datasheet's 3.35 TB/s by the same formula.
"""

from __future__ import annotations

import shutil
import subprocess

# (what the device name contains, the name reported beside a percentage, HBM bytes/s,
# dense bf16 FLOP/s, dense fp8 FLOP/s); the first match wins: "H100 PCIe" before "H100"
DATASHEET = (
    (("H200",), "H200", 4.8e12, 989e12, 1979e12),
    (("H100", "PCIe"), "H100 PCIe", 2.0e12, 756e12, 1513e12),
    (("H100",), "H100 SXM", 3.35e12, 989e12, 1979e12),  # "NVIDIA H100 80GB HBM3"
)
BF16_FLOP_PER_SM_CLOCK = 4096  # Hopper, dense


def computed_peaks(memory_clock_mhz: float, bus_width_bits: int, sm_count: int, sm_clock_mhz: float) -> dict:
    """Peaks from the driver's attributes (the module docstring's formulas)."""
    hbm = memory_clock_mhz * 1e6 * 2 * bus_width_bits / 8
    bf16 = sm_count * sm_clock_mhz * 1e6 * BF16_FLOP_PER_SM_CLOCK
    return {"hbm_bytes_s": hbm, "bf16_flop_s": bf16, "fp8_flop_s": 2 * bf16,
            "source": (f"computed: {memory_clock_mhz:.0f} MHz x 2 x {bus_width_bits} bits / 8; "
                       f"{sm_count} SMs x {sm_clock_mhz:.0f} MHz x {BF16_FLOP_PER_SM_CLOCK} FLOP (bf16), x2 (fp8)")}


def device_peaks(name: str, attributes: dict | None = None) -> dict:
    """{"device", "hbm_bytes_s", "bf16_flop_s", "fp8_flop_s", "source", "label"} for a device
    name (torch / the driver); `attributes` (memory_clock_mhz, bus_width_bits, sm_count,
    sm_clock_mhz) is needed only for a device the datasheet table does not hold."""
    for parts, short, hbm, bf16, fp8 in DATASHEET:
        if all(p.lower() in name.lower() for p in parts):
            peaks = {"device": short, "hbm_bytes_s": hbm, "bf16_flop_s": bf16, "fp8_flop_s": fp8,
                     "source": "datasheet"}
            break
    else:
        missing = [k for k in ("memory_clock_mhz", "bus_width_bits", "sm_count", "sm_clock_mhz")
                   if not (attributes or {}).get(k)]
        if missing:
            raise ValueError(f"{name!r} is not in gpu_peaks.DATASHEET and the driver did not report "
                             f"{', '.join(missing)}: add the device to DATASHEET")
        peaks = dict(computed_peaks(**attributes), device=name)
    peaks["label"] = f"{peaks['device']} HBM {peaks['hbm_bytes_s'] / 1e12:.2f} TB/s"
    return peaks


def driver_clocks() -> dict:
    """The maximum SM and memory clocks (MHz) nvidia-smi reports for GPU 0; {} without it."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {}
    run = subprocess.run([smi, "--id=0", "--query-gpu=clocks.max.sm,clocks.max.memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True)
    try:
        sm, memory = (float(v) for v in run.stdout.strip().split(","))
    except ValueError:
        return {}
    return {"sm_clock_mhz": sm, "memory_clock_mhz": memory}
