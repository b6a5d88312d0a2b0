"""The local queue on a real GPU server: `--gpus auto` takes NVML's GPUs, and a job's CUDA sees exactly
the GPU the daemon gave it, and can take memory on it.

CI has no GPU, so these skip there (with the reason); on a machine with an NVIDIA driver they run the
real daemon, real jobs and the CUDA driver API (libcuda through ctypes: no framework needed)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import pytest

from headway.local.client import ClientError
from headway.local.gpus import nvml_gpus
from test_local_support import DaemonProc, cli, start_daemon, wait_until

__all__ = ["start_daemon"]

pytestmark = pytest.mark.gpu

# Run inside the job: what CUDA sees under the job's CUDA_VISIBLE_DEVICES, then 256 MiB taken on it.
PROBE = r"""
import ctypes, json, os, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
def ok(rc, what):
    if rc != 0:
        sys.exit(f"{what} failed with CUresult {rc}")
ok(cuda.cuInit(0), "cuInit")
n = ctypes.c_int()
ok(cuda.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
uuids = []
for i in range(n.value):
    dev = ctypes.c_int()
    ok(cuda.cuDeviceGet(ctypes.byref(dev), i), "cuDeviceGet")
    raw = (ctypes.c_ubyte * 16)()
    ok(cuda.cuDeviceGetUuid(raw, dev), "cuDeviceGetUuid")
    h = bytes(raw).hex()
    uuids.append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
dev = ctypes.c_int()
ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
ptr = ctypes.c_uint64()
ok(cuda.cuMemAlloc_v2(ctypes.byref(ptr), 256 << 20), "cuMemAlloc")
ok(cuda.cuMemsetD8_v2(ptr, 7, 256 << 20), "cuMemsetD8")
ok(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
time.sleep(float(sys.argv[1]))
print(json.dumps({"visible": os.environ["CUDA_VISIBLE_DEVICES"], "uuids": uuids}))
"""


def _nvml_uuids() -> list[str]:
    """NVML's GPUs by index (the daemon's numbering), or skip where there are none."""
    names, note = nvml_gpus()
    if not names:
        pytest.skip(f"no NVIDIA GPU here ({note or 'NVML lists none'})")
    import pynvml

    pynvml.nvmlInit()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            out.append(u.decode() if isinstance(u, bytes) else str(u))
        return out
    finally:
        pynvml.nvmlShutdown()


def _history(d: DaemonProc) -> dict[int, dict[str, object]]:
    return {j["id"]: j for j in d.ask({"op": "history", "limit": 10_000})["jobs"]}


def _probe(d: DaemonProc, job: int) -> dict[str, object]:
    out = cli("logs", str(job), state_dir=d.state_dir)
    assert out.returncode == 0, out.stderr
    got: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def test_auto_takes_nvmls_gpus_and_each_jobs_cuda_sees_only_the_gpu_it_was_given(
    start_daemon: Callable[..., DaemonProc],
) -> None:
    uuids = _nvml_uuids()
    d = start_daemon(gpus="auto")
    pong = d.ask({"op": "ping"})
    assert pong["gpu_ids"] == list(range(len(uuids)))
    assert pong["gpu_names"] == nvml_gpus()[0] and all("logical" not in n for n in pong["gpu_names"])
    jobs = [
        d.submit([sys.executable, "-c", PROBE, "0.5"], gpus=1, name=f"probe{i}") for i in range(len(uuids))
    ]
    wait_until(lambda: set(jobs) <= set(_history(d)), 120, "the probe jobs to end")
    h = _history(d)
    seen = set()
    for job in jobs:
        assert h[job]["state"] == "COMPLETED", cli("logs", str(job), "--stderr", state_dir=d.state_dir).stdout
        (gpu,) = h[job]["gpu_ids"]  # type: ignore[misc]
        probe = _probe(d, job)
        assert probe["visible"] == str(gpu)
        assert probe["uuids"] == [uuids[gpu]]  # CUDA numbers the GPUs as NVML does (PCI bus order)
        seen.add(gpu)
    assert seen == set(range(len(uuids)))  # one job per GPU, all GPUs used


def test_jobs_never_share_a_real_gpu_and_a_job_larger_than_the_server_is_refused(
    start_daemon: Callable[..., DaemonProc],
) -> None:
    uuids = _nvml_uuids()
    d = start_daemon(gpus="auto")
    with pytest.raises(ClientError, match=f"asks for {len(uuids) + 1} GPUs; this server has {len(uuids)}"):
        d.submit([sys.executable, "-c", PROBE, "0"], gpus=len(uuids) + 1)
    jobs = [
        d.submit([sys.executable, "-c", PROBE, "1.5"], gpus=1, name=f"hold{i}") for i in range(len(uuids) + 1)
    ]
    wait_until(lambda: set(jobs) <= set(_history(d)), 120, "the jobs to end")
    h = _history(d)
    spans = []
    for job in jobs:
        assert h[job]["state"] == "COMPLETED"
        (gpu,) = h[job]["gpu_ids"]  # type: ignore[misc]
        assert _probe(d, job)["uuids"] == [uuids[gpu]]
        spans.append((str(h[job]["start_time"]), str(h[job]["end_time"]), gpu))  # ISO times: ordered as text
    for i, (s1, e1, g1) in enumerate(spans):
        for s2, e2, g2 in spans[i + 1 :]:
            if g1 == g2:
                assert e1 <= s2 or e2 <= s1, "two jobs held the same GPU at once"
