"""The peaks every percentage of the GPU check is of (gpu_peaks.py): the datasheet entry for
the device names torch and the driver give, and the formula from the driver's attributes for
any other device (checked against the H100 SXM's datasheet figures it must reproduce)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_peaks import computed_peaks, device_peaks  # noqa: E402


@pytest.mark.parametrize("name,device,hbm,bf16,fp8", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 3.35e12, 989e12, 1979e12),
    ("NVIDIA H100 PCIe", "H100 PCIe", 2.0e12, 756e12, 1513e12),
    ("NVIDIA H200", "H200", 4.8e12, 989e12, 1979e12),
    ("NVIDIA H200 NVL", "H200", 4.8e12, 989e12, 1979e12),
])
def test_datasheet_peaks_by_device_name(name, device, hbm, bf16, fp8):
    peaks = device_peaks(name)
    assert (peaks["device"], peaks["hbm_bytes_s"], peaks["bf16_flop_s"], peaks["fp8_flop_s"]) == (device, hbm, bf16, fp8)
    assert peaks["source"] == "datasheet"
    assert peaks["label"] == f"{device} HBM {hbm / 1e12:.2f} TB/s"


def test_an_unknown_device_gets_peaks_from_its_clocks_bus_and_sms():
    # an H100 SXM's own attributes (HBM3 2619 MHz, 5120 bits; 132 SMs at 1830 MHz) through the
    # formula give its datasheet figures within 0.1%
    attrs = dict(memory_clock_mhz=2619, bus_width_bits=5120, sm_count=132, sm_clock_mhz=1830)
    peaks = device_peaks("Some Future GPU", attrs)
    assert peaks["device"] == "Some Future GPU" and peaks["source"].startswith("computed: 2619 MHz x 2 x 5120 bits")
    assert peaks["hbm_bytes_s"] == 2619e6 * 2 * 5120 / 8
    assert abs(peaks["hbm_bytes_s"] / 3.35e12 - 1) < 1e-3 and abs(peaks["bf16_flop_s"] / 989e12 - 1) < 1e-3
    assert peaks["fp8_flop_s"] == 2 * peaks["bf16_flop_s"] == 2 * 132 * 1830e6 * 4096
    assert peaks["label"] == "Some Future GPU HBM 3.35 TB/s"
    assert computed_peaks(**attrs)["hbm_bytes_s"] == peaks["hbm_bytes_s"]


def test_an_unknown_device_without_clocks_is_a_clear_error():
    with pytest.raises(ValueError, match="did not report memory_clock_mhz, sm_clock_mhz: add the device"):
        device_peaks("Fake GPU 0 (compute 9.0)", {"bus_width_bits": 6144, "sm_count": 132})
