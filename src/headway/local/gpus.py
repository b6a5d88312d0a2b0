"""Which GPUs the daemon hands out: NVML where present, or N logical GPUs for machines without any."""

from __future__ import annotations

from dataclasses import dataclass


class GpuSpecError(ValueError):
    """A --gpus value that is not auto, a count, or a list of indices."""


@dataclass(frozen=True, slots=True)
class GpuInventory:
    ids: tuple[int, ...]
    names: tuple[str, ...]  # one per id ("logical" when not from NVML)
    source: str  # "nvml", "logical" or "list"
    note: str = ""
    uuids: tuple[str, ...] = ()  # NVML's UUID of each device by index (for "nvml"; see devicelock.py)


def nvml_gpus() -> tuple[list[str], str]:
    """Names of the GPUs NVML sees, and a note when NVML is unavailable (no driver, no package)."""
    devices, note = nvml_devices()
    return [name for name, _ in devices], note


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def nvml_devices() -> tuple[list[tuple[str, str]], str]:
    """(name, UUID) of each GPU NVML sees, by index, and a note when NVML is unavailable. The UUID keys
    the machine-wide lock of the device, so two daemons never hand it out at once."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return [], f"NVML unavailable ({e})"
    try:
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name, uuid = pynvml.nvmlDeviceGetName(handle), pynvml.nvmlDeviceGetUUID(handle)
            found.append((_text(name), _text(uuid)))
        return found, ""
    finally:
        pynvml.nvmlShutdown()


def device_uuids() -> tuple[str, ...]:
    """NVML's UUID of each device by index (none without NVML): `--gpus 4` or `--gpus 0,1` on a machine
    with GPUs hands out real devices, which are locked as such."""
    return tuple(u for _, u in nvml_devices()[0])


MAX_GPUS = 1024  # the largest servers hold 16; a bigger count is a typo (a million logged 6.8 MB)


def resolve_gpus(spec: str) -> GpuInventory:
    """`auto` (NVML), `N` (N logical GPUs 0..N-1) or `0,1,3` (exactly those indices)."""
    spec = spec.strip()
    if spec == "auto":
        devices, note = nvml_devices()
        names, uuids = tuple(n for n, _ in devices), tuple(u for _, u in devices)
        return GpuInventory(tuple(range(len(names))), names, "nvml", note, uuids)
    if spec.isascii() and spec.isdigit():  # not "²", which isdigit() takes and int() refuses
        n = int(spec)
        if n > MAX_GPUS:
            raise GpuSpecError(f"--gpus {spec}: more than {MAX_GPUS:,} GPUs on one server is no server")
        return GpuInventory(tuple(range(n)), ("logical",) * n, "logical")
    try:
        if not spec.isascii():
            raise ValueError(spec)
        ids = tuple(int(p) for p in spec.split(",") if p.strip() != "")
    except ValueError:
        raise GpuSpecError(
            f"--gpus {spec!r}: expected auto, a count such as 4, or indices such as 0,1,3 "
            "(one index alone: 3,)"
        ) from None
    if ids and (len(ids) > MAX_GPUS or max(ids) >= 1_000_000):
        raise GpuSpecError(f"--gpus {spec[:40]!r}: at most {MAX_GPUS:,} GPUs, with indices under 1,000,000")
    if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
        raise GpuSpecError(f"--gpus {spec!r}: indices must be distinct and >= 0")
    return GpuInventory(tuple(sorted(ids)), ("listed",) * len(ids), "list")
