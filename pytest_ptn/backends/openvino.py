"""The OpenVINO delegate (``OpenvinoPartitioner`` on the CPU device), a vendor backend that runs on a plain
x86 CPU, loaded with ``executorch.runtime`` (the pip wheel registers ``OpenvinoBackend``) from the .pte's
path, as users load it: with openvino 2026 that load is a use-after-free, which crash isolation reports.

Each method's constants are compiled into that method's own OpenVINO blob, so colliding names never meet;
what it gets wrong on multi-method programs is recorded in ``conformance/expectations/openvino.toml``
(openvino 2025.4.1, the pinned release) and ``openvino-2026.toml``.
On a CPU with bf16 arithmetic (AVX512_BF16, AMX) OpenVINO computes float32 graphs in bf16 by default, and the
delegate passes no property that would ask for f32: the backend declares it (Backend.float32_computed_in), so
its float32 results are compared with bf16's steps and each difference is labelled with it, and the run
header says so: a verdict is the same on a CPU with bf16 arithmetic and on one without.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

from pytest_ptn.backend import Availability, ReducedPrecision, package_version
from pytest_ptn.backends.pte import PteBackend

NEEDS = {"openvino": "openvino", "nncf": "nncf"}
"""module -> distribution: the delegate imports nncf's quantizer even to partition."""

DTYPES = {"bf16": "bfloat16", "f16": "float16"}
"""OpenVINO's name of a reduced inference precision -> torch's."""

BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""The /proc/cpuinfo flags of the bf16 arithmetic that makes the CPU plugin choose bf16."""
CPUINFO = Path("/proc/cpuinfo")


class OpenvinoBackend(PteBackend):
    name = "openvino"

    @classmethod
    def availability(cls) -> Availability:
        missing = [
            d for m, d in {"executorch": "executorch", **NEEDS}.items() if importlib.util.find_spec(m) is None
        ]
        if missing:
            return Availability(
                False, f"{', '.join(missing)} not installed (pip install 'pytest-ptn[executorch,openvino]')"
            )
        versions = {d: package_version(d) or "?" for d in ("executorch", "torch", *NEEDS.values())}
        reduced = computed_in()
        if reduced is not None:
            note = f"{reduced.why}; the delegate cannot ask for f32, so float32 results deviate"
            return Availability(True, note, versions)
        return Availability(True, versions=versions)

    def float32_computed_in(self) -> ReducedPrecision | None:
        return computed_in()

    def partitioners(self, method: str) -> list[Any]:
        from executorch.backends.openvino.partitioner import OpenvinoPartitioner
        from executorch.exir.backend.backend_details import CompileSpec

        return [OpenvinoPartitioner([CompileSpec("device", b"CPU")])]


def computed_in() -> ReducedPrecision | None:
    """The reduced precision OpenVINO's CPU plugin computes float32 graphs in here, with why; None for f32."""
    precision = cpu_inference_precision()
    if precision not in DTYPES:
        return None
    isa = ", ".join(f.upper() for f in bf16_flags())
    setting = f"INFERENCE_PRECISION_HINT={precision}" + (f", {isa}" if isa else "")
    return ReducedPrecision(
        DTYPES[precision], f"OpenVINO CPU computes float32 programs in {precision} ({setting})"
    )


@functools.cache
def cpu_inference_precision() -> str:
    """The precision OpenVINO's CPU plugin computes a float32 graph in by default (``f32``, ``bf16``)."""
    import openvino

    return str(openvino.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").to_string())


def bf16_flags() -> list[str]:
    """Which of BF16_FLAGS this CPU has (none where /proc/cpuinfo cannot be read)."""
    try:
        flags = set(CPUINFO.read_text(errors="replace").split())
    except OSError:
        return []
    return [f for f in BF16_FLAGS if f in flags]
