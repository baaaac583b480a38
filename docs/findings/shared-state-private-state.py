"""A private mutable buffer starts from another buffer's initial value (executorch 1.5.1, torch 2.13.0).

Method `forward` holds a parameter `weight` and a buffer `state` with the same bytes; method `m6` holds a
buffer `cache`. Lowered as the `pte-shared-state` backend of pytest-ptn lowers (InitializedMutableBufferPass,
MemoryPlanningPass(share_mutable_buffers=True), emit_mutable_buffer_names=True), `forward`'s `state` starts
from `m6`'s `cache` ([5, 6, 7, 8]), not from its own [1, 2, 3, 4]. Nothing is shared between the methods in
eager. Each method's calls run through executorch.runtime beside eager, under both load schedules (each
method loaded at its first call, every method loaded up front); every wrong value is printed and the exit
status is 1 while there is one.

Needs torch and executorch only. Flags, one at a time, for the experiments on the page beside this file:
--no-names (emit_mutable_buffer_names=False), --no-init (no InitializedMutableBufferPass), --no-share
(MemoryPlanningPass(share_mutable_buffers=False)); and the control, --distinct: `state` no longer holds the
bytes of `weight`.
"""

import sys
import tempfile
from pathlib import Path

import torch
from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
from executorch.exir.passes import MemoryPlanningPass
from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass
from executorch.runtime import Runtime
from torch import nn

STATE = [1.0, 2.0, 3.0, 4.25] if "--distinct" in sys.argv else [1.0, 2.0, 3.0, 4.0]
"""`state`'s initial value: the bytes of `weight`, or with --distinct one element off (the control)."""


class Forward(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.tensor([1.0, 2.0, 3.0, 4.0]), requires_grad=False)
        self.register_buffer("state", torch.tensor(STATE))

    def forward(self, x):
        self.state.add_(x)
        return self.state.clone(), self.weight + x


class M6(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.tensor([5.0, 6.0, 7.0, 8.0]))

    def forward(self, x):
        self.cache.add_(x)
        return (self.cache.clone(),)


def build():
    return {"forward": Forward(), "m6": M6()}


CALLS = [("m6", torch.full((4,), 0.5)), ("forward", torch.full((4,), 0.5))]


def lower(folder, names, init, share):
    programs = {n: torch.export.export(m, (torch.zeros(4),), strict=False) for n, m in build().items()}
    edge = to_edge_transform_and_lower(
        programs, transform_passes=[InitializedMutableBufferPass([""])] if init else []
    )
    config = ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=share),
        emit_mutable_buffer_names=names,
    )
    (folder / "program.pte").write_bytes(edge.to_executorch(config).buffer)


def run(folder, up_front):
    print("every method loaded up front:" if up_front else "each method loaded at its first call:")
    program = Runtime.get().load_program(folder / "program.pte")
    methods, eager, wrong = {}, build(), 0
    with torch.no_grad():
        for i, (name, x) in enumerate(CALLS):
            try:
                for method in eager if up_front else [name]:
                    if method not in methods:
                        methods[method] = program.load_method(method)
                have = list(methods[name].execute([x.clone()]))
            except RuntimeError as e:
                print(f"  call #{i} {name}(): {e}")
                return wrong + 1
            want = eager[name](x.clone())
            for j, (h, w) in enumerate(zip(have, want, strict=True)):
                if not torch.equal(h, w):
                    print(f"  call #{i} {name}() output {j} = {h.tolist()}, eager {w.tolist()}")
                    wrong += 1
    return wrong


def main():
    names, init, share = (f"--no-{flag}" not in sys.argv for flag in ("names", "init", "share"))
    print(f"emit_mutable_buffer_names={names}, InitializedMutableBufferPass: {init}, ", end="")
    print(f"share_mutable_buffers={share}")
    if not init:
        print("(without the pass a mutated buffer starts uninitialised by design: zeros, not this bug)")
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        lower(folder, names, init, share)
        wrong = run(folder, up_front=False) + run(folder, up_front=True)
    print(f"{wrong} differences from eager: the bug is there" if wrong else "all match eager: fixed")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
