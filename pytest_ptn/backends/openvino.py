"""The OpenVINO delegate (``OpenvinoPartitioner`` on the CPU device), a vendor backend that runs on a plain
x86 CPU, loaded with ``executorch.runtime`` (the pip wheel registers ``OpenvinoBackend``).

Each method's constants are compiled into that method's own OpenVINO blob, so colliding names never meet;
what it gets wrong on multi-method programs is recorded in ``conformance/expectations/openvino.toml``.
On a CPU with bf16 arithmetic (AVX512_BF16, AMX) OpenVINO computes float32 graphs in bf16 by default, and the
delegate passes no property that would ask for f32: availability says so, and those results are failures of
f32 programs, not noise to tolerate.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from pytest_ptn.backend import Availability, package_version
from pytest_ptn.backends.pte import PteBackend

NEEDS = {"openvino": "openvino", "nncf": "nncf"}
"""module -> distribution: the delegate imports nncf's quantizer even to partition."""


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
        precision = cpu_inference_precision()
        if precision != "f32":
            note = (
                f"OpenVINO's CPU plugin computes float32 programs in {precision} here (its default "
                "INFERENCE_PRECISION_HINT on this CPU; the delegate cannot ask for f32): f32 results deviate"
            )
            return Availability(True, note, versions)
        return Availability(True, versions=versions)

    def partitioners(self, method: str) -> list[Any]:
        from executorch.backends.openvino.partitioner import OpenvinoPartitioner
        from executorch.exir.backend.backend_details import CompileSpec

        return [OpenvinoPartitioner([CompileSpec("device", b"CPU")])]


def cpu_inference_precision() -> str:
    """The precision OpenVINO's CPU plugin computes a float32 graph in by default (``f32``, ``bf16``)."""
    import openvino

    return str(openvino.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").to_string())
