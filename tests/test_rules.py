"""On hand-built tensors: the packaging planner (pytest_ptn.reference.planner, P1-P9) and the sharing cache
(pytest_ptn.instruments.content, S1-S3, S6)."""

from __future__ import annotations

import concurrent.futures
import gc
import struct
import time
import weakref

import pytest
import torch

from pytest_ptn.instruments import content
from pytest_ptn.instruments.content import ContentKey, SharingCache, digest, same_content
from pytest_ptn.reference.planner import (
    STATE,
    ConstantUse,
    FinalNameCollisionError,
    PackagePlan,
    PackagingError,
    ReservedNamespaceError,
    StateConflictError,
    plan_package,
)


def c(*values: float, dtype: torch.dtype = torch.float32) -> ConstantUse:
    return ConstantUse(torch.tensor(values, dtype=dtype))


def m(*values: float, dtype: torch.dtype = torch.float32) -> ConstantUse:
    return ConstantUse(torch.tensor(values, dtype=dtype), mutable=True)


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def stored_bytes(plan: PackagePlan) -> int:
    return sum(nbytes(t) for t in plan.entries.values())


def read(plan: PackagePlan, final: str) -> torch.Tensor:
    return plan.entries[plan.aliases.get(final, final)]


def assert_same_plan(a: PackagePlan, b: PackagePlan) -> None:
    assert a.bindings == b.bindings
    assert a.aliases == b.aliases
    assert a.state_keys == b.state_keys
    assert list(a.entries) == list(b.entries)
    for name, t in a.entries.items():
        u = b.entries[name]
        assert (t.dtype, t.shape, digest(t)) == (u.dtype, u.shape, digest(u)), name


def float_from_bits(*bits: int) -> torch.Tensor:
    return torch.tensor(list(bits), dtype=torch.int32).view(torch.float32)


# --- P1 method namespace ---------------------------------------------------------------------------------


def test_single_method_constants_are_namespaced() -> None:
    plan = plan_package({"forward": {"w": c(1, 2), "_lifted_tensor_constant0": c(3)}})
    assert plan.bindings == {
        "forward": {"w": "forward/w", "_lifted_tensor_constant0": "forward/_lifted_tensor_constant0"}
    }
    assert set(plan.entries) == {"forward/w", "forward/_lifted_tensor_constant0"}
    assert plan.aliases == {}
    assert plan.state_keys == frozenset()


def test_colliding_names_get_one_entry_per_method() -> None:
    plan = plan_package({"prefill": {"lifted_tensor_0": c(1, 2)}, "decode": {"lifted_tensor_0": c(10, 20)}})
    assert plan.bindings == {
        "prefill": {"lifted_tensor_0": "prefill/lifted_tensor_0"},
        "decode": {"lifted_tensor_0": "decode/lifted_tensor_0"},
    }
    assert read(plan, "prefill/lifted_tensor_0").tolist() == [1, 2]
    assert read(plan, "decode/lifted_tensor_0").tolist() == [10, 20]


# --- P2 shared state -------------------------------------------------------------------------------------


def test_key_mutated_by_any_method_is_one_state_entry_bound_by_every_user() -> None:
    plan = plan_package(
        {
            "prefill": {"kv": m(0, 0, 0, 0), "w": c(1)},
            "decode": {"kv": c(0, 0, 0, 0), "w": c(2)},  # decode only reads kv: still state/kv
            "other": {"w": c(3)},
        }
    )
    assert plan.state_keys == frozenset({"state/kv"})
    assert plan.bindings["prefill"]["kv"] == plan.bindings["decode"]["kv"] == "state/kv"
    assert "kv" not in plan.bindings["other"]
    assert plan.entries["state/kv"].tolist() == [0, 0, 0, 0]
    assert [k for k in plan.entries if k.endswith("kv")] == ["state/kv"]
    assert {plan.bindings[name]["w"] for name in plan.bindings} == {"prefill/w", "decode/w", "other/w"}


def test_private_mutable_buffers_are_separate_state_entries() -> None:
    plan = plan_package({"a": {"a_state": m(0, 0)}, "b": {"b_state": m(0, 0)}})
    assert plan.state_keys == frozenset({"state/a_state", "state/b_state"})
    assert set(plan.entries) == {"state/a_state", "state/b_state"}
    assert plan.aliases == {}


# --- P4 content dedupe -----------------------------------------------------------------------------------


def test_byte_identical_immutable_tensors_are_stored_once() -> None:
    weight = torch.arange(8, dtype=torch.float32)
    methods = {
        "b": {"scale_b": ConstantUse(weight.clone()), "own": c(5)},
        "a": {"scale_a": ConstantUse(weight.clone()), "kv": m(9, 9)},
        "c": {"scale_c": ConstantUse(weight.clone())},
    }
    plan = plan_package(methods)
    assert plan.aliases == {"b/scale_b": "a/scale_a", "c/scale_c": "a/scale_a"}  # the first final name owns
    assert set(plan.entries) == {"a/scale_a", "b/own", "state/kv"}
    for method, uses in methods.items():
        for key, use in uses.items():
            assert read(plan, plan.bindings[method][key]).equal(use.tensor)
    unique = nbytes(weight) + nbytes(methods["b"]["own"].tensor)
    state = nbytes(plan.entries["state/kv"])
    assert stored_bytes(plan) == unique + state


def test_dedupe_owner_does_not_depend_on_method_order() -> None:
    w = torch.ones(4)
    forward = plan_package({"x": {"k": ConstantUse(w.clone())}, "y": {"k": ConstantUse(w.clone())}})
    backward = plan_package({"y": {"k": ConstantUse(w.clone())}, "x": {"k": ConstantUse(w.clone())}})
    assert forward.aliases == backward.aliases == {"y/k": "x/k"}
    assert set(forward.entries) == set(backward.entries) == {"x/k"}


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (torch.zeros(4, dtype=torch.float32), torch.zeros(4, dtype=torch.int32)),
        (torch.arange(4.0), torch.arange(4.0).reshape(2, 2)),
        (torch.zeros(2, dtype=torch.float16), torch.zeros(1, dtype=torch.float32)),
    ],
    ids=["dtype", "shape", "dtype-and-shape"],
)
def test_equal_bytes_with_other_dtype_or_shape_are_not_deduped(a: torch.Tensor, b: torch.Tensor) -> None:
    assert bytes(a.numpy().tobytes()) == bytes(b.numpy().tobytes())
    plan = plan_package({"p": {"k": ConstantUse(a)}, "q": {"k": ConstantUse(b)}})
    assert plan.aliases == {}
    assert set(plan.entries) == {"p/k", "q/k"}
    assert not same_content(a, b)


def test_dedupe_is_byte_level_signed_zero() -> None:
    plan = plan_package({"p": {"z": c(0.0)}, "q": {"z": c(-0.0)}})
    assert plan.aliases == {}
    assert torch.equal(plan.entries["p/z"], plan.entries["q/z"])  # equal as values, yet stored apart
    assert struct.pack("<f", plan.entries["q/z"].item()) == struct.pack("<f", -0.0)


def test_dedupe_is_byte_level_nan_payload() -> None:
    quiet, payload = 0x7FC00000, 0x7FC00001
    plan = plan_package(
        {
            "p": {"n": ConstantUse(float_from_bits(quiet, 0))},
            "q": {"n": ConstantUse(float_from_bits(quiet, 0))},  # NaN != NaN as values, same bytes: one entry
            "r": {"n": ConstantUse(float_from_bits(payload, 0))},  # another NaN payload: its own entry
        }
    )
    assert plan.aliases == {"q/n": "p/n"}
    assert set(plan.entries) == {"p/n", "r/n"}
    assert plan.entries["r/n"].view(torch.int32)[0].item() == payload


# --- P5 state is never deduped ---------------------------------------------------------------------------


def test_state_equal_in_bytes_to_constants_is_never_aliased() -> None:
    plan = plan_package(
        {
            "count": {"counter": m(0, 0, 0, 0)},
            "read": {"zeros": c(0, 0, 0, 0), "counter": c(0, 0, 0, 0), "zeros2": c(0, 0, 0, 0)},
        }
    )
    assert plan.state_keys == frozenset({"state/counter"})
    assert "state/counter" in plan.entries
    assert plan.aliases == {"read/zeros2": "read/zeros"}
    assert not any(a in plan.state_keys or o in plan.state_keys for a, o in plan.aliases.items())


def test_two_equal_state_entries_are_not_aliased_to_each_other() -> None:
    plan = plan_package({"a": {"s1": m(0, 0)}, "b": {"s2": m(0, 0)}})
    assert plan.aliases == {}
    assert set(plan.entries) == {"state/s1", "state/s2"}


# --- P6 reserved namespace -------------------------------------------------------------------------------


def test_method_named_state_is_rejected() -> None:
    with pytest.raises(ReservedNamespaceError, match="'state'") as info:
        plan_package({"decode": {"w": c(1)}, STATE: {"w": c(2)}})
    assert info.value.methods == ("state",)
    assert info.value.keys == ("w",)


def test_method_inside_the_state_namespace_cannot_shadow_state() -> None:
    """A method under ``state/`` would bind ``state/x/k``, the final name of method m's mutable ``x/k``."""
    with pytest.raises(ReservedNamespaceError) as info:
        plan_package({"state/x": {"k": c(1, 1)}, "m": {"x/k": m(0, 0)}})
    assert "'state/x'" in str(info.value) and info.value.methods == ("state/x",)


# --- P7 state conflict -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second", "what"),
    [
        (m(0, 0), m(0, 0, dtype=torch.float64), "dtype"),
        (m(0, 0), m(0, 0, 0), "shape"),
        (m(0, 0), m(1, 0), "initial bytes"),
        (m(0, 0), c(1, 0), "initial bytes"),  # read-only in the second method: still state, still a conflict
        (m(0.0), m(-0.0), "initial bytes"),
    ],
    ids=["dtype", "shape", "bytes", "bytes-read-only", "signed-zero"],
)
def test_conflicting_mutable_key_is_rejected(first: ConstantUse, second: ConstantUse, what: str) -> None:
    with pytest.raises(StateConflictError) as info:
        plan_package({"prefill": {"cache": first}, "decode": {"cache": second}})
    message = str(info.value)
    assert "'cache'" in message and "'prefill'" in message and "'decode'" in message and what in message
    assert info.value.methods == ("prefill", "decode")
    assert info.value.keys == ("cache",)


def test_agreeing_mutable_key_is_accepted() -> None:
    plan = plan_package({"prefill": {"cache": m(0, 0)}, "decode": {"cache": m(0, 0)}})
    assert set(plan.entries) == {"state/cache"}


# --- P8 final-name collision -----------------------------------------------------------------------------


@pytest.mark.parametrize("same_bytes", [False, True], ids=["other-bytes", "same-bytes"])
def test_final_name_collision_is_rejected_naming_both_pairs(same_bytes: bool) -> None:
    methods = {"a": {"b/c": c(1)}, "a/b": {"c": c(1 if same_bytes else 2)}}
    with pytest.raises(FinalNameCollisionError) as info:
        plan_package(methods)
    message = str(info.value)
    for name in ("'a'", "'b/c'", "'a/b'", "'c'", "'a/b/c'"):
        assert name in message
    assert info.value.methods == ("a", "a/b")
    assert info.value.keys == ("b/c", "c")


def test_slash_in_keys_without_collision_is_fine() -> None:
    plan = plan_package({"enc": {"attn/scale": c(1)}, "dec": {"attn/scale": c(2)}})
    assert plan.bindings == {"enc": {"attn/scale": "enc/attn/scale"}, "dec": {"attn/scale": "dec/attn/scale"}}


# --- the error hierarchy, P9 -----------------------------------------------------------------------------


@pytest.mark.parametrize("error", [ReservedNamespaceError, StateConflictError, FinalNameCollisionError])
def test_rejections_share_one_base(error: type[Exception]) -> None:
    assert issubclass(error, PackagingError)
    assert issubclass(error, ValueError)


def test_planning_twice_gives_equal_plans() -> None:
    def methods() -> dict[str, dict[str, ConstantUse]]:
        w = torch.linspace(0, 1, 12).reshape(3, 4)
        return {
            "prefill": {"w": ConstantUse(w.clone()), "kv": m(0, 0, 0), "_tensor_constant0": c(1, 2, 3)},
            "decode": {"w": ConstantUse(w.clone()), "kv": c(0, 0, 0), "_tensor_constant0": c(3, 2, 1)},
        }

    assert_same_plan(plan_package(methods()), plan_package(methods()))


class CountingDigest:
    """``content.digest`` wrapped: which tensors (by storage address) it hashed, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.hashed: list[int] = []
        self._digest = digest
        monkeypatch.setattr(content, "digest", self)

    def __call__(self, t: torch.Tensor) -> str:
        self.hashed.append(t.data_ptr())
        return self._digest(t)


def test_a_tensor_bound_by_every_method_is_hashed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    shared, state = torch.rand(64), torch.zeros(4)
    methods = {
        name: {"w": ConstantUse(shared), "kv": ConstantUse(state, mutable=True), "own": c(i)}
        for i, name in enumerate(("prefill", "decode", "verify", "score"))
    }
    counted = CountingDigest(monkeypatch)
    plan = plan_package(methods)
    assert counted.hashed.count(shared.data_ptr()) == 1
    assert counted.hashed.count(state.data_ptr()) == 1  # the P7 comparison across four methods
    assert sorted(plan.aliases) == ["prefill/w", "score/w", "verify/w"]


def test_views_of_one_storage_are_told_apart() -> None:
    """The memo's key is the tensor's bytes' address *and* layout: views of one buffer are other content."""
    base = torch.arange(8.0)
    z = torch.tensor([1 + 2j, 3 - 4j])
    plan = plan_package(
        {
            "a": {"lo": ConstantUse(base[:4]), "hi": ConstantUse(base[4:]), "z": ConstantUse(z)},
            "b": {
                "lo": ConstantUse(base[:4]),
                "even": ConstantUse(base[::2]),
                "zc": ConstantUse(z.conj()),
                "zn": ConstantUse(z._neg_view()),
            },
        }
    )
    assert plan.aliases == {"b/lo": "a/lo"}
    assert sorted(plan.entries) == ["a/hi", "a/lo", "a/z", "b/even", "b/zc", "b/zn"]


# --- SharingCache ----------------------------------------------------------------------------------------


class Counting:
    """A materialize callback that counts its calls and the bytes it copies."""

    def __init__(self) -> None:
        self.calls: list[torch.Tensor] = []

    def __call__(self, host: torch.Tensor) -> torch.Tensor:
        self.calls.append(host)
        return host.clone()


def test_identical_content_is_shared_and_materialized_once() -> None:
    cache, materialize = SharingCache(), Counting()
    first = cache.share(torch.arange(16.0), materialize)
    second = cache.share(torch.arange(16.0), materialize)
    assert second is first
    assert len(materialize.calls) == 1
    assert len(cache) == 1
    assert cache.materialized_bytes == 64


def test_same_metadata_different_bytes_is_not_shared() -> None:
    cache, materialize = SharingCache(), Counting()
    a = cache.share(torch.zeros(4, 4), materialize)
    b = cache.share(torch.ones(4, 4), materialize)
    assert a is not b
    assert (a.dtype, a.shape, a.stride()) == (b.dtype, b.shape, b.stride())
    assert a.equal(torch.zeros(4, 4)) and b.equal(torch.ones(4, 4))
    assert len(materialize.calls) == 2 and len(cache) == 2


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            torch.arange(6.0).reshape(2, 3),
            torch.arange(6.0).reshape(2, 3).t(),
        ),  # same storage bytes, transposed
        (torch.arange(6.0).reshape(2, 3), torch.arange(6.0).reshape(3, 2)),
        (torch.zeros(4, dtype=torch.float32), torch.zeros(4, dtype=torch.int32)),
    ],
    ids=["transposed-view", "shape", "dtype"],
)
def test_same_bytes_other_layout_is_not_shared(a: torch.Tensor, b: torch.Tensor) -> None:
    cache = SharingCache()
    assert cache.share(a) is not cache.share(b)
    assert len(cache) == 2
    assert ContentKey.of(a) != ContentKey.of(b)


def test_equal_values_in_another_layout_are_not_shared() -> None:
    contiguous = torch.arange(6.0).reshape(3, 2)
    strided = contiguous.t().contiguous().t()
    assert contiguous.equal(strided) and contiguous.shape == strided.shape
    assert contiguous.stride() != strided.stride()
    cache = SharingCache()
    assert cache.share(contiguous) is not cache.share(strided)


def test_total_collision_is_still_checked() -> None:
    """S3: the cache has no names; a later method whose every name is 'cached' is decided by content alone."""
    cache, materialize = SharingCache(), Counting()
    prefill = {
        "weight": torch.full((4, 4), 1.0),
        "bias": torch.arange(4.0),
        "_tensor_constant0": torch.ones(16),
    }
    decode = {
        "weight": torch.full((4, 4), 2.0),
        "bias": torch.arange(4.0),
        "_tensor_constant0": torch.zeros(16),
    }
    loaded = {("prefill", k): cache.share(t, materialize) for k, t in prefill.items()}
    loaded |= {("decode", k): cache.share(t, materialize) for k, t in decode.items()}
    assert loaded["decode", "bias"] is loaded["prefill", "bias"]
    assert loaded["decode", "weight"] is not loaded["prefill", "weight"]
    assert loaded["decode", "_tensor_constant0"] is not loaded["prefill", "_tensor_constant0"]
    for (method, key), t in loaded.items():
        assert t.equal((prefill if method == "prefill" else decode)[key])
    assert len(materialize.calls) == 5


def test_materialized_bytes_count_unique_content_only() -> None:
    cache = SharingCache()
    for _ in range(3):
        cache.share(torch.ones(8, dtype=torch.float32))  # 32 bytes, once
        cache.share(torch.ones(8, dtype=torch.float16))  # 16 bytes, once
        cache.share(torch.arange(100.0)[10:14])  # a view: only its 16 bytes are materialized
    assert cache.materialized_bytes == 32 + 16 + 16
    assert len(cache) == 3


def test_a_hit_does_not_materialize() -> None:
    cache = SharingCache()
    cache.share(torch.ones(3))

    def refuse(host: torch.Tensor) -> torch.Tensor:
        raise AssertionError("a cache hit must not allocate")

    cache.share(torch.ones(3), refuse)
    assert cache.materialized_bytes == 12


def test_signed_zero_and_nan_payloads_are_compared_as_bytes() -> None:
    cache = SharingCache()
    assert cache.share(torch.tensor([0.0])) is not cache.share(torch.tensor([-0.0]))
    nan = cache.share(float_from_bits(0x7FC00000))
    assert cache.share(float_from_bits(0x7FC00000)) is nan
    assert cache.share(float_from_bits(0x7FC00001)) is not nan


def test_a_host_tensor_is_hashed_once_until_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every alias of a package owner is one host tensor: keyed once, and again after an in-place write."""
    host = torch.arange(16.0)
    counted = CountingDigest(monkeypatch)
    cache = SharingCache()
    first = cache.share(host)
    assert cache.share(host) is first and cache.share(host[:]) is first  # a view is another tensor
    assert len(counted.hashed) == 2
    host.add_(1)  # bumps the version counter
    second = cache.share(host)
    assert second is not first and second.equal(torch.arange(1.0, 17.0))
    assert len(counted.hashed) == 3


def test_the_key_memo_keeps_no_host_alive() -> None:
    cache = SharingCache()
    host = torch.ones(4)
    cache.share(host)
    ref = weakref.ref(host)
    del host
    gc.collect()
    assert ref() is None
    assert cache.share(torch.zeros(4)) is not cache.share(torch.ones(4))  # no stale key under a recycled id


def test_threads_sharing_one_content_materialize_it_once() -> None:
    """S7: a slow materialize (an upload) widens the window a check-then-insert cache would race through."""
    cache, calls = SharingCache(), []

    def slow(host: torch.Tensor) -> torch.Tensor:
        calls.append(host)
        time.sleep(0.05)
        return host.clone()

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        shared = list(pool.map(lambda _: cache.share(torch.arange(64.0), slow), range(4)))
    assert len(calls) == 1
    assert all(t is shared[0] for t in shared)


def test_a_given_key_is_used_as_is() -> None:
    """A loader that recorded the digest next to the bytes passes the key: the bytes are not hashed again."""
    cache = SharingCache()
    host = torch.ones(4)
    first = cache.share(host, key=ContentKey.of(host))
    assert cache.share(torch.ones(4)) is first
    assert cache.share(torch.zeros(4), key=ContentKey.of(host)) is first  # trusted: the caller vouches


# --- digest ----------------------------------------------------------------------------------------------


def test_digest_refuses_a_non_cpu_tensor() -> None:
    with pytest.raises(ValueError, match="S6"):
        digest(torch.empty(4, device="meta"))


def test_digest_is_of_logical_bytes() -> None:
    t = torch.arange(6.0).reshape(2, 3)
    assert digest(t.t()) == digest(t.t().contiguous())
    assert digest(t) != digest(t.t().contiguous())
    assert digest(torch.empty(0)) == digest(torch.empty(0, 3))  # no bytes: metadata tells them apart
    assert not same_content(torch.empty(0), torch.empty(0, 3))


def test_digest_of_a_conjugate_view_hashes_its_values() -> None:
    z = torch.tensor([1 + 2j, 3 - 4j])
    assert digest(z.conj()) == digest(z.conj().resolve_conj())
