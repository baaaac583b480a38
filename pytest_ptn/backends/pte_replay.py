"""A ``.pte`` repro bundle's extra script: the calls replayed through ``executorch.runtime`` alone, one a
line, which a C++ runtime engineer translates without reading pytest-ptn; only "equal" is pytest-ptn's
(``pytest_ptn.instruments.comparison.equal``, the bound the suite compared with)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pytest_ptn.backend import WIDE_RUN

if TYPE_CHECKING:
    from pytest_ptn.backend import EagerCall

SCRIPT = "runtime_calls.py"


def runtime_script(
    input_mutations: Mapping[str, Mapping[int, int]],
    calls_file: str,
    files: dict[str, str],
    calls: Sequence[EagerCall],
) -> str:
    """The calls unrolled one a line, each method loaded on first use as the harness loads it;
    ``input_mutations``: method -> output index -> the user input that output writes back."""
    data = f", data_path=HERE / {files['data_path']!r}" if "data_path" in files else ""
    lines = []
    for i, call in enumerate(calls):
        mutations = input_mutations[call.method]
        outputs = iter(range(len(call.outputs)))
        expected = [
            f"{i}/inputs_after/{mutations[o]}" if o in mutations else f"{i}/outputs/{next(outputs)}"
            for o in range(len(call.outputs) + len(mutations))
        ]
        if call.method not in {c.method for c in calls[:i]}:
            lines.append(f"methods[{call.method!r}] = program.load_method({call.method!r})")
        inputs = ", ".join(f'calls["{i}/inputs/{j}"].clone()' for j in range(len(call.inputs)))
        lines.append(f"outputs = methods[{call.method!r}].execute([{inputs}])")
        lines.append(f"differences += compare({i}, {call.method!r}, outputs, {expected!r})")
    body = "\n".join(lines)
    return f'''"""The bundle's calls replayed through executorch.runtime alone, one call a line: what a C++
runtime engineer translates (Runtime::get(), Program::load_method, Method::execute). A method that mutates
an input returns it as an extra output, compared with the input eager left behind (`inputs_after`).
"Equal" is the suite's bound (pytest_ptn.instruments.comparison): a bf16 or fp16 program's float64 eager
run is stored under `{WIDE_RUN}/`.
"""

from pathlib import Path

from executorch.runtime import Runtime
from pytest_ptn.instruments.comparison import equal
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
calls = load_file(HERE / {calls_file!r})
program = Runtime.get().load_program(HERE / {files["path"]!r}{data})
methods = {{}}
differences = 0


def compare(call, method, outputs, expected):
    """Print each output that differs from the eager tensor stored under its key; return how many."""
    if len(outputs) != len(expected):
        print(f"call #{{call}} {{method}}(): {{len(outputs)}} outputs, eager gives {{len(expected)}}")
        return 1
    found = 0
    for have, key in zip(outputs, expected):
        want = calls[key]
        if not equal(have, want, calls.get("{WIDE_RUN}/" + key)):
            shown = [have.reshape(-1)[:8].tolist(), want.reshape(-1)[:8].tolist()]
            print(f"call #{{call}} {{method}}(): {{key}} is {{shown[0]}}, eager {{shown[1]}}")
            found += 1
    return found


{body}
raise SystemExit(1 if differences else 0)
'''
