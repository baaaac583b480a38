"""What Arm's TOSA flows cost per method here: lowering (all methods of a program together, quantized first on
``arm_tosa_int``) and each call on the TOSA reference model (pytest_ptn.backends.tosa_reference).

For every flow, in a fresh process: each stateless scenario the flow runs (the quantization-friendly ones on
the INT flow, the float32 ones on the FP flow) is lowered as one conformance case lowers it, then loaded and
its call sequence run and compared with eager. Each figure is the best of ``--repeat``; ``delegated`` counts
the methods whose graph calls the TOSA delegate (the rest of a method runs as edge operators in PyTorch).

    python benchmarks/arm_tosa.py [--quick] [--repeat 3]      # needs the arm extra; ~2 min
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]

from _common import emit, machine, run_child, table  # noqa: E402

FLOWS = ("arm_tosa_fp", "arm_tosa_int")
QUICK = {"arm_tosa_fp": ["shared_weight", "colliding_literals"], "arm_tosa_int": ["quantized_linears"]}


def scenarios(flow: str, quick: bool) -> list[str]:
    from pytest_ptn.backend import Capability, resolve_backend
    from pytest_ptn.plugin import quantization_mismatch
    from pytest_ptn.programs import catalogue

    if quick:
        return QUICK[flow]
    backend = resolve_backend(f"ext:{flow}")()
    return [
        s.name
        for s in catalogue.SCENARIOS
        if s.valid
        and not s.spec.written()
        and "reduced_precision" not in s.tags
        and not s.needs
        and quantization_mismatch(backend, s.tags) is None
        and (Capability.QUANTIZE in backend.capabilities or s.spec.dtype == "float32")
    ]


def measure(flow: str, quick: bool, repeat: int) -> dict[str, object]:
    import torch

    from pytest_ptn.backend import resolve_backend
    from pytest_ptn.harness import Case
    from pytest_ptn.programs.catalogue import BY_NAME
    from pytest_ptn.schedule import LoadSchedule

    backend = resolve_backend(f"ext:{flow}")()
    names = scenarios(flow, quick)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            case = Case(backend, BY_NAME[name], lambda step: Path(tempfile.mkdtemp(dir=tmp)))
            calls = case.eager()
            lower = run = float("inf")
            for _ in range(repeat):
                programs = case.program.export()
                start = time.perf_counter()
                lowered = backend.lower(programs, Path(tempfile.mkdtemp(dir=tmp)))
                lower = min(lower, time.perf_counter() - start)
                loaded = backend.load(lowered)
                for method in programs:
                    loaded.load_method(method)
                start = time.perf_counter()
                ran = case.run_calls(loaded, calls, LoadSchedule.UP_FRONT)
                run = min(run, time.perf_counter() - start)
                mismatches = case.mismatches(calls, ran)
            program = lowered.program  # type: ignore[attr-defined]
            delegate = torch.ops.higher_order.executorch_call_delegate
            delegated = sum(
                any(n.target is delegate for n in program.exported_program(m).graph_module.graph.nodes)
                for m in programs
            )
            rows.append(
                {
                    "scenario": name,
                    "methods": len(programs),
                    "delegated": delegated,
                    "lower_s": lower,
                    "calls": len(calls),
                    "run_ms_per_call": 1000 * run / len(calls),
                    "matches_eager": not mismatches,
                }
            )
    return {"flow": flow, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", metavar="FLOW", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        emit(measure(args.child, args.quick, args.repeat))
        return
    rows = []
    for flow in FLOWS:
        quick = ["--quick"] if args.quick else []
        result = run_child([__file__, "--child", flow, "--repeat", str(args.repeat), *quick])
        for r in result["rows"]:  # type: ignore[attr-defined]
            rows.append(
                [
                    f"ext:{flow}",
                    r["scenario"],
                    f"{r['delegated']}/{r['methods']}",
                    f"{r['lower_s']:.2f}",
                    f"{r['lower_s'] / r['methods']:.2f}",
                    f"{r['run_ms_per_call']:.1f}",
                    "yes" if r["matches_eager"] else "no",
                ]
            )
    print(machine())
    headers = ["flow", "scenario", "delegated", "lower s", "lower s/method", "ms/call", "matches eager"]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
