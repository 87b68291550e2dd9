"""Opening a GPU through the cuda executor's own driver handle (bessemer._cuda: dlopen of
libcuda.so.1, no CUDA needed to build or import), with the executor's errors turned into
one-line DeviceErrors; and the device report `bessemer inspect --device` prints.

The device is chosen by `--device N` (an ordinal among the GPUs CUDA_VISIBLE_DEVICES
leaves visible, as in every CUDA program). BESSEMER_LIBCUDA names another driver library
(the tests' fake driver).
"""

from __future__ import annotations

from bessemer.errors import DeviceError, EngineLoadError


def native():
    try:
        from bessemer import _cuda
    except ImportError as e:
        raise EngineLoadError(f"the Bessemer cuda executor is not built ({e}); run `make install`") from None
    return _cuda


def translate(e: Exception) -> Exception:
    """The executor's exceptions as the user-facing ones (others unchanged)."""
    _cuda = native()
    if isinstance(e, (_cuda.DriverUnavailable, _cuda.DeviceMismatch)):
        return DeviceError(str(e))
    if isinstance(e, _cuda.CudaError):
        return DeviceError(f"CUDA error: {e}")
    if isinstance(e, ValueError):
        return EngineLoadError(f"{e}")
    return e


def open_device(ordinal: int = 0, arch: str | None = None):
    """The GPU `ordinal` (checked to run cubins built for `arch`, e.g. "sm_90a")."""
    _cuda = native()
    try:
        device = _cuda.Device(_cuda.Driver.open(), ordinal)
        if arch is not None:
            device.require_arch(arch)
        return device
    except Exception as e:  # noqa: BLE001 - re-raised as the user-facing type
        raise translate(e) from None


def device_report(ordinal: int | None = None) -> dict:
    """Driver and per-GPU facts (all GPUs, or one). Raises DeviceError when there is none."""
    _cuda = native()
    try:
        driver = _cuda.Driver.open()
        ordinals = range(driver.device_count) if ordinal is None else [ordinal]
        devices = [_cuda.Device(driver, i).info() for i in ordinals]
    except Exception as e:  # noqa: BLE001
        raise translate(e) from None
    return {"driver_library": driver.library, "driver_version": driver.version,
            "abi_version": f"{_cuda.DRIVER_ABI_VERSION // 1000}.{_cuda.DRIVER_ABI_VERSION % 1000 // 10}",
            "devices": devices}


def format_device_report(report: dict) -> str:
    gib = 2.0 ** 30
    lines = [f"driver        {report['driver_library']}: CUDA {report['driver_version']} "
             f"(runtime asks for the CUDA {report['abi_version']} ABI)"]
    for d in report["devices"]:
        used = d["total_bytes"] - d["free_bytes"]
        lines += [
            f"gpu {d['ordinal']}         {d['name']} (compute capability {d['compute_capability']}, "
            f"{d['multiprocessors']} SMs, PCI {d['pci_bus_id']})",
            f"  memory      {d['total_bytes'] / gib:.2f} GiB total, {d['free_bytes'] / gib:.2f} GiB free, "
            f"{used / gib:.2f} GiB in use; bus {d['memory_bus_bits']} bits, L2 {d['l2_bytes'] / 2**20:.0f} MiB",
            f"  shared mem  {d['shared_per_block_optin'] // 1024} KiB per block (opt-in)",
        ]
    return "\n".join(lines)
