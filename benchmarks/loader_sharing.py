"""Loader sharing benchmark: M methods sharing one large weight, loaded with and without sharing.

The program: ``--methods`` methods, each ``(x @ shared.weight) * scale + bias``; ``shared.weight``
(``--weight`` bytes, float32) is one tensor under one name in every method, ``scale`` and ``bias`` are small
private buffers with the same names and different values in every method (the S2 case). It is exported,
lowered once with the reference backend (outputs checked against eager, sharing topology checked), then
loaded in fresh processes:

- ``reference, sharing``: ``ReferenceLoaded`` with the reference ``SharingCache`` (what the backend does);
- ``reference, no sharing``: the same loader with a cache whose ``share()`` always materializes.

With ``pytest_ptn/backends/aoti/`` usable (a C++ compiler; ~15 s per method to compile, cached on disk under
``$PTN_AOTI_CACHE``, default ``<tmp>/ptn-bench-aoti``), the same for its ``ContentSharedLoaded`` and, for
reference, its ``UpstreamLoaded`` (the ExecuTorch CUDA delegate's by-name policy).

Load = read the artifact + bind every method's constants (no method is run in the timed part). Peak constant
memory is the loader's own ``constant_memory().peak_bytes``; peak RSS is VmHWM minus VmRSS before loading.
Timings: best of ``--repeat``; memory: worst.

    python benchmarks/loader_sharing.py [--quick] [--weight 256MiB] [--methods 4] [--no-aoti]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# This folder holds a packaging.py: put it after site-packages, or `import packaging` (inductor,
# executorch) would find this script instead of the PyPI package.
_HERE = Path(__file__).resolve().parent
sys.path = [p for p in sys.path if Path(p or ".").resolve() != _HERE] + [str(_HERE)]

from _common import emit, fmt_bytes, machine, parse_size, peak_rss, reset_peak, rss, run_child, table  # noqa: E402

REFERENCE = ("reference, sharing", "reference, no sharing")
AOTI = ("aoti, sharing", "aoti, no sharing", "aoti-upstream (by name)")


def never_shares() -> Any:
    """A SharingCache that never hits: every bind materializes its constant (no digest, no lookup)."""
    import torch

    from pytest_ptn.instruments import content

    class NeverShares(content.SharingCache):
        def share(self, host: torch.Tensor, materialize: Any = torch.clone, key: Any = None) -> torch.Tensor:
            t = materialize(host)
            self.materialized_bytes += t.untyped_storage().nbytes()
            return t

    return NeverShares()


def build_programs(weight_bytes: int, methods: int) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """Method modules sharing one root, their exports and an example input."""
    import torch
    from torch import nn

    cols = 1024 if weight_bytes < 64 << 20 else 8192
    rows = max(1, weight_bytes // 4 // cols)
    gen = torch.Generator().manual_seed(0)

    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.rand(rows, cols, generator=gen), requires_grad=False)

    class Method(nn.Module):
        def __init__(self, shared: Shared, j: int) -> None:
            super().__init__()
            self.shared = shared
            self.register_buffer("scale", torch.full((cols,), 1.0 + j))
            self.register_buffer("bias", torch.rand(cols, generator=gen))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x @ self.shared.weight) * self.scale + self.bias

    shared = Shared()
    modules = {f"m{j}": Method(shared, j).eval() for j in range(methods)}
    x = torch.rand(1, rows, generator=gen)
    programs = {m: torch.export.export(mod, (x,), strict=False) for m, mod in modules.items()}
    return modules, programs, x


def check(loaded: Any, modules: dict[str, Any], x: Any, shared: bool) -> None:
    """Outputs equal eager; the weight is one allocation with sharing, M without; private data never
    shared."""
    import torch

    for m, mod in modules.items():
        with torch.no_grad():
            want = mod(x)
        (got,) = loaded.run(m, [x.clone()])
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-3), f"{m}: output differs from eager"
    weights = {loaded.storage(m, "shared.weight") for m in modules}
    assert len(weights) == (1 if shared else len(modules)), f"weight storages: {weights}"
    assert len({loaded.storage(m, "bias") for m in modules}) == len(modules), "private bias shared"


def child(variant: str, path: str, entries: dict[str, str]) -> None:
    import threading

    import torch  # noqa: F401  (imported before the baseline)

    from pytest_ptn.instruments import content

    if variant.startswith("reference"):
        from pytest_ptn.reference.loader import ReferenceLoaded
        from pytest_ptn.reference.package import read_package

        cache = never_shares() if "no" in variant else content.SharingCache()
        base = reset_peak()
        t0 = time.perf_counter()
        pkg = read_package(Path(path))
        t1 = time.perf_counter()
        loaded: Any = ReferenceLoaded(pkg, {}, cache)
        methods = list(pkg.bindings)
    else:
        from pytest_ptn.backends.aoti.backend import (
            AotiLowered,
            ContentSharedLoaded,
            FqnCache,
            UpstreamLoaded,
        )
        from pytest_ptn.backends.aoti.cache import CompiledMethod

        lowered = AotiLowered(
            Path(path), {m: CompiledMethod.read(Path(d)) for m, d in entries.items()}, frozenset(), "cpu"
        )
        methods = list(entries)
        base = reset_peak()
        t0 = t1 = time.perf_counter()
        if variant.startswith("aoti-upstream"):
            loaded = UpstreamLoaded(lowered, threading.Lock(), FqnCache())
        else:
            cache = never_shares() if "no" in variant else content.SharingCache()
            loaded = ContentSharedLoaded(lowered, threading.Lock(), cache)
    for m in methods:
        loaded.load_method(m)
    t2 = time.perf_counter()
    emit(
        {
            "load": t2 - t0,
            "read": t1 - t0,
            "bind": t2 - t1,
            "constant_peak": loaded.constant_memory().peak_bytes,
            "rss_peak": peak_rss() - base,
            "rss_held": rss() - base,
        }
    )


def lower_aoti(programs: dict[str, Any], workdir: Path) -> tuple[Any, Any, float] | str:
    """The aoti backend, its lowering and the lowering time, or why the aoti backend is not usable."""
    try:
        from pytest_ptn.backends.aoti.backend import AotiBackend
    except Exception as exc:  # another engineer's work in progress: any failure means "not usable"
        return f"pytest_ptn.backends.aoti.backend does not import ({type(exc).__name__}: {exc})"
    avail = AotiBackend.availability()
    if not avail.available:
        return f"aoti unavailable: {avail.reason}"
    os.environ.setdefault("PTN_AOTI_CACHE", str(Path(tempfile.gettempdir()) / "ptn-bench-aoti"))
    try:
        t0 = time.perf_counter()
        lowered = AotiBackend().lower(programs, workdir)
        seconds = time.perf_counter() - t0
    except Exception as exc:
        return f"aoti lowering failed ({type(exc).__name__}: {str(exc)[:200]})"
    return AotiBackend(), lowered, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="16 MiB weight, no aoti (< 1 minute)")
    ap.add_argument(
        "--weight", default=None, help="bytes of the shared weight (default 256MiB; --quick 16MiB)"
    )
    ap.add_argument("--methods", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-aoti", action="store_true", help="skip the aoti rows (implied by --quick)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--entries", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.path, json.loads(args.entries))
        return

    import torch

    from pytest_ptn.backends.reference import ReferenceBackend
    from pytest_ptn.reference.package import read_package

    weight = parse_size(args.weight or ("16MiB" if args.quick else "256MiB"))
    t0 = time.perf_counter()
    modules, programs, x = build_programs(weight, args.methods)
    export_s = time.perf_counter() - t0
    notes = [f"export {export_s:.1f} s"]
    with tempfile.TemporaryDirectory(prefix="ptn-bench-") as tmp:
        workdir = Path(tmp)
        backend = ReferenceBackend()
        t0 = time.perf_counter()
        lowered = backend.lower(programs, workdir)
        notes.append(f"reference lowering {time.perf_counter() - t0:.1f} s")
        pkg = read_package(lowered.path)
        unique = sum(t.nbytes for t in pkg.tensors.values())
        largest = max(t.nbytes for t in pkg.tensors.values())
        del pkg
        check(backend.load(lowered), modules, x, shared=True)
        from pytest_ptn.reference.loader import ReferenceLoaded

        check(ReferenceLoaded(read_package(lowered.path), lowered.graphs, never_shares()), modules, x, False)

        jobs: list[tuple[str, str, dict[str, str]]] = [(v, str(lowered.path), {}) for v in REFERENCE]
        skipped = ""
        if args.quick or args.no_aoti:
            skipped = "aoti rows skipped (--quick / --no-aoti)"
        else:
            aoti = lower_aoti(programs, workdir)
            if isinstance(aoti, str):
                skipped = f"aoti rows skipped: {aoti}"
            else:
                aoti_backend, aoti_lowered, seconds = aoti
                notes.append(f"aoti lowering {seconds:.1f} s (compiles cached in $PTN_AOTI_CACHE)")
                check(aoti_backend.load(aoti_lowered), modules, x, shared=True)
                entries = {m: str(c.dir) for m, c in aoti_lowered.methods.items()}
                del aoti_backend, aoti_lowered
                jobs += [(v, str(workdir), entries) for v in AOTI]
        del programs, modules
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v, _, _ in jobs}
        for _ in range(args.repeat):
            for variant, path, entries in jobs:
                argv = [__file__, "--child", variant, "--path", path, "--entries", json.dumps(entries)]
                runs[variant].append(run_child(argv))
                print(f"  {variant}: {runs[variant][-1]['load']:.2f} s", file=sys.stderr, flush=True)

    best = {v: min(r, key=lambda x: x["load"]) for v, r in runs.items()}
    worst = {
        v: {k: max(x[k] for x in r) for k in ("constant_peak", "rss_peak", "rss_held")}
        for v, r in runs.items()
    }

    def row(v: str) -> list[str]:
        b, w = best[v], worst[v]
        return [
            v,
            f"{b['load']:.3f}",
            f"{b['read']:.3f}",
            f"{b['bind']:.3f}",
            fmt_bytes(w["constant_peak"]),
            f"{w['constant_peak'] / unique:.3f}",
            "PASS" if w["constant_peak"] <= 1.05 * unique else "FAIL",
            fmt_bytes(w["rss_peak"]),
            f"{w['rss_peak'] / unique:.2f}",
            fmt_bytes(w["rss_held"]),
        ]

    def ratio(a: str, b: str) -> list[str]:
        return [
            f"ratio {a} / {b.split(', ')[-1]}",
            f"{best[a]['load'] / best[b]['load']:.2f}",
            f"{best[a]['read'] / best[b]['read']:.2f}" if best[b]["read"] else "",
            f"{best[a]['bind'] / best[b]['bind']:.2f}",
            f"{worst[a]['constant_peak'] / worst[b]['constant_peak']:.2f}",
            "",
            "",
            f"{worst[a]['rss_peak'] / worst[b]['rss_peak']:.2f}",
            "",
            "",
        ]

    rows = [row(v) for v in best]
    rows.append(ratio("reference, sharing", "reference, no sharing"))
    if "aoti, sharing" in best:
        rows.append(ratio("aoti, sharing", "aoti, no sharing"))
    print(
        f"loader sharing: {args.methods} methods x one shared {fmt_bytes(weight)} float32 weight + 2 private "
        f"buffers each; unique constant bytes {fmt_bytes(unique)} (largest {fmt_bytes(largest)}); "
        f"{', '.join(notes)}; best load / worst memory of {args.repeat}; outputs and topology checked\n"
        f"machine: {machine()}\n"
    )
    headers = [
        "loader",
        "load s",
        "read s",
        "bind s",
        "peak constant",
        "peak const / unique",
        "goal <= 1.05",
        "peak RSS delta",
        "RSS peak / unique",
        "RSS held after",
    ]
    print(table(headers, rows))
    if skipped:
        print(f"\n{skipped}")
    print(f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
