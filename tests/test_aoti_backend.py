"""The aoti backends: compile cache, key mapping, both sharing policies, the memory ledger against malloc.

Every compile costs seconds (the first of a cold CI run ~30 s), so the module lowers two programs (five
methods) once into a temporary cache folder and every test loads them again.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pytest_ptn.backends.aoti import backend as aoti
from pytest_ptn.backends.aoti import cache as aoti_cache
from pytest_ptn.backends.aoti.backend import (
    AotiBackend,
    AotiLowered,
    AotiUpstreamBackend,
    FqnCache,
    UpstreamLoaded,
)
from pytest_ptn.backends.aoti.cache import CompiledMethod, ConstantInfo
from pytest_ptn.instruments.content import ContentKey
from pytest_ptn.programs.build import Program
from pytest_ptn.spec import Constant, Method, ProgramSpec, Write

needs_compiler = pytest.mark.skipif(
    not AotiBackend.availability().available, reason=AotiBackend.availability().reason
)

POLICY = Program(
    ProgramSpec(
        methods=(
            # "c" is a tensor attribute: AOTI names it _tensor_constant0 in every method, holding other bytes.
            Method(
                "a",
                (Constant("c", "attribute", shape=(16,), seed=1),),
                reads=("w", "c", "s"),
                writes=(Write("s", "add"),),
            ),
            Method("b", (Constant("c", "attribute", shape=(16,), seed=2),), reads=("w", "c", "s")),
            Method(
                "late",
                (
                    Constant("c", "attribute", shape=(16,), seed=3),
                    Constant("extra", "parameter", shape=(4, 4), seed=4),
                ),
                reads=("w", "c", "extra"),
            ),
        ),
        shared=(
            Constant("w", "parameter", shape=(4, 4), seed=5),
            Constant("s", "buffer", shape=(4,), seed=6),
        ),
        calls=("b", "a", "b", "late", "a", "b"),
    )
)
"""Shared weight ``w``; colliding ``c``; state ``s`` written by ``a`` and read by ``b`` (small enough to be
inlined unless kept); ``late`` has a name no other method has, so the upstream policy loads its blob."""

BIG = Program(
    ProgramSpec(
        methods=(
            Method("prefill", (Constant("pb", "parameter", shape=(16,), seed=7),), reads=("w", "pb")),
            Method("decode", (Constant("db", "parameter", shape=(16,), seed=8),), reads=("w", "db")),
        ),
        shared=(Constant("w", "parameter", shape=(1024, 1024), seed=9),),
    )
)
"""A 4 MiB weight shared by both methods, each with a private name: measurable, and a partial cache hit."""


@pytest.fixture(scope="module")
def lowered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, AotiLowered]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(aoti_cache.CACHE_ENV, str(tmp_path_factory.mktemp("aoti-cache")))
        yield {
            name: AotiBackend().lower(program.export(), tmp_path_factory.mktemp(name))
            for name, program in (("policy", POLICY), ("big", BIG))
        }


def _outputs_match(program: Program, loaded: aoti.AotiLoaded) -> list[bool]:
    return [
        torch.allclose(
            loaded.run(call.method, [t.clone() for t in call.inputs])[0], call.outputs[0], atol=1e-5
        )
        for call in program.eager()
    ]


@needs_compiler
def test_second_lower_hits_the_disk_cache(
    lowered: dict[str, AotiLowered], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_compile(*args: object, **kwargs: object) -> None:
        raise AssertionError("recompiled although the cache holds this program")

    monkeypatch.setenv(aoti_cache.CACHE_ENV, str(lowered["policy"].methods["a"].dir.parents[1]))
    monkeypatch.setattr(torch._inductor, "aot_compile", no_compile)
    again = AotiBackend().lower(POLICY.export(), tmp_path)
    assert {m: c.dir for m, c in again.methods.items()} == {
        m: c.dir for m, c in lowered["policy"].methods.items()
    }


@needs_compiler
def test_keys_map_to_container_constants(lowered: dict[str, AotiLowered]) -> None:
    a = lowered["policy"].methods["a"]
    assert a.keys["c"] == "_tensor_constant0"  # a CONSTANT_TENSOR, renamed by position
    assert a.keys["shared.w"] == "shared.w"
    assert "shared.s" in lowered["policy"].mutable and "shared.s" in lowered["policy"].methods["b"].constants


@needs_compiler
def test_manifest_keys_are_those_of_the_bytes_loaded(lowered: dict[str, AotiLowered]) -> None:
    """The loader keys its cache with the digests the compile recorded, instead of hashing each weight on
    each load: they must be exactly the keys of the host tensors it binds (S2, S3)."""
    for program in lowered.values():
        for compiled in program.methods.values():
            host = compiled.host_tensors()
            assert host.keys() == compiled.constants.keys()
            for fqn, c in compiled.constants.items():
                assert c.content_key() == ContentKey.of(host[fqn]), (compiled.dir, fqn)


def test_an_entry_of_another_format_is_refused(tmp_path: Path) -> None:
    """Cache keys hash the format, so a changed layout never finds an old entry; reading one by hand says
    what it is instead of failing on a missing field."""
    (tmp_path / aoti_cache.MANIFEST).write_text(
        '{"format": "pytest-ptn aoti cache 2", "constants": {}, "keys": {}, "absent": {}}'
    )
    with pytest.raises(
        ValueError, match=re.escape(f"format 'pytest-ptn aoti cache 2', not {aoti_cache.FORMAT!r}")
    ):
        CompiledMethod.read(tmp_path)


@needs_compiler
def test_content_policy_shares_only_equal_constants(lowered: dict[str, AotiLowered]) -> None:
    loaded = AotiBackend().load(lowered["policy"])
    assert all(_outputs_match(POLICY, loaded))
    assert (
        loaded.storage("a", "shared.w")
        == loaded.storage("b", "shared.w")
        == loaded.storage("late", "shared.w")
    )
    assert len({loaded.storage(m, "c") for m in ("a", "b", "late")}) == 3
    assert torch.allclose(loaded.state()["shared.s"], POLICY.eager()[-1].state_after["shared.s"])


@needs_compiler
def test_content_policy_keeps_loaded_copies_apart(lowered: dict[str, AotiLowered]) -> None:
    backend = AotiBackend()
    first, second = backend.load(lowered["policy"]), backend.load(lowered["policy"])
    assert all(_outputs_match(POLICY, first)) and all(_outputs_match(POLICY, second))
    assert first.storage("a", "shared.w") == second.storage("a", "shared.w")
    assert first.storage("a", "shared.s") != second.storage("a", "shared.s")


@needs_compiler
def test_upstream_policy_shares_by_name(lowered: dict[str, AotiLowered]) -> None:
    loaded = AotiUpstreamBackend().load(lowered["policy"])
    for method in ("a", "b", "late"):
        loaded.load_method(method)
    # b: every name cached, nothing compared; late: blob loaded, c compared on metadata only. Both take a's c.
    assert loaded.storage("a", "c") == loaded.storage("b", "c") == loaded.storage("late", "c")
    assert loaded.storage("late", "extra") != loaded.storage("a", "c")
    assert {
        call.method for call, ok in zip(POLICY.eager(), _outputs_match(POLICY, loaded), strict=True) if not ok
    } == {
        "b",
        "late",
    }
    assert loaded.constant_memory().peak_bytes == sum(
        lowered["policy"].methods[m].blob_bytes for m in ("a", "late")
    )


def test_upstream_refuses_a_cached_tensor_smaller_than_the_constant(tmp_path: Path) -> None:
    by_name = FqnCache()
    by_name.tensors["x"] = torch.zeros(2)
    compiled = CompiledMethod(
        tmp_path, {"x": ConstantInfo("x", "torch.float32", (4,), (1,), 0, 16, "0" * 64)}, {}, {}
    )
    lowered = AotiLowered(tmp_path, {"m": compiled}, frozenset(), "cpu")

    class Unrunnable:
        def update_constant_buffer(self, *args: object) -> None:
            raise AssertionError("bound a tensor the container would read past the end of")

    with pytest.raises(RuntimeError, match="out of bounds"):
        UpstreamLoaded(lowered, threading.Lock(), by_name)._bind(compiled, Unrunnable())  # type: ignore[arg-type]


@needs_compiler
def test_conflicting_state_is_rejected_before_compiling(tmp_path: Path) -> None:
    spec = ProgramSpec(
        methods=(
            Method("p", (Constant("k", "buffer", values=(0.0,) * 4),), writes=(Write("k"),), reads=("k",)),
            Method("d", (Constant("k", "buffer", values=(1.0,) * 4),), reads=("k",)),
        )
    )
    with pytest.raises(ValueError, match="'k' differs between methods 'p' and 'd'"):
        AotiBackend().lower(Program(spec).export(), tmp_path)


@needs_compiler
@pytest.mark.parametrize(
    ("backend", "copies"), [(AotiBackend, 1), (AotiUpstreamBackend, 2)], ids=["aoti", "aoti-upstream"]
)
def test_memory_ledger_agrees_with_malloc(
    lowered: dict[str, AotiLowered], backend: type[AotiBackend], copies: int
) -> None:
    """The shared 4 MiB weight costs one copy with the content policy and two with the upstream one (the
    partial hit of decode loads its whole blob); the measured growth says the same as the ledger."""
    loaded = backend().load(lowered["big"])
    for method in ("prefill", "decode"):
        loaded.load_method(method)
    reading = loaded.constant_memory()
    weight = 1024 * 1024 * 4
    unique = weight + 2 * 16 * 4
    assert copies * weight < reading.peak_bytes < copies * weight + 1024
    assert reading.peak_bytes <= unique * 1.05 if copies == 1 else reading.peak_bytes > unique * 1.05
    measured = loaded._probe.peak
    assert measured is not None and abs(measured - reading.peak_bytes) < (1 << 20), reading.probe


@needs_compiler
def test_a_keyword_only_program_compiles_and_runs_flat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """optimum-executorch's methods take keywords only: ``ep.module()`` refuses them positionally, so the
    compile gets them as the program declares them, and the container runs them flat in that order."""
    from test_program_forms import MAX_SEQ, keyword_program, step

    from pytest_ptn.check import check_program

    monkeypatch.setenv(aoti_cache.CACHE_ENV, str(tmp_path / "aoti-cache"))
    ep = keyword_program(torch.ones(3, 4))
    calls = [("forward", step(0, 3)), ("forward", step(3, 1)), ("forward", step(4, MAX_SEQ - 4))]
    assert check_program({"forward": ep}, {"forward": ep.example_inputs}, calls, AotiBackend()) == []


class Bf16Cache(torch.nn.Module):
    """A correct bf16 program (issue 32): prefill writes a bf16 cache through a matmul and tanh, decode reads
    it through a matmul and softmax. AOTInductor keeps the fused chains in float32, closer to float64 than
    eager's bf16 steps are."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter(torch.randn(16, 16, generator=g).to(torch.bfloat16), requires_grad=False)
        self.w2 = torch.nn.Parameter(torch.randn(16, 16, generator=g).to(torch.bfloat16), requires_grad=False)
        self.register_buffer("cache", torch.zeros(16, 16, dtype=torch.bfloat16))

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        self.cache.copy_(torch.tanh(x @ self.w1))
        return self.cache.sum(0)

    def decode(self, q: torch.Tensor) -> torch.Tensor:
        return torch.softmax(q @ self.w2 @ self.cache.T, dim=-1)


@needs_compiler
def test_a_bf16_cache_program_computed_in_float32_has_no_isolation_finding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What AOTInductor's float32 chains change is arithmetic: never an E finding (on the CPU issue 32 was
    measured on, 6edbdea reported E1 on decode); a difference from eager the methods show alone is A1's."""
    from pytest_ptn.check import check_program

    monkeypatch.setenv(aoti_cache.CACHE_ENV, str(tmp_path / "aoti-cache"))
    g = torch.Generator().manual_seed(1)
    x, q = (torch.randn(16, 16, generator=g).to(torch.bfloat16) for _ in range(2))
    findings = check_program(Bf16Cache(), {"prefill": (x,), "decode": (q,)}, backend=AotiBackend())
    assert [f for f in findings if f.rule.startswith("E")] == []
    assert all(f.rule == "A1" and f.difference is not None for f in findings)
