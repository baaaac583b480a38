"""What a multi-method program really contains, read from its exported programs and told in the catalogue's
tags (see pytest_ptn.programs.catalogue), so a program from outside the catalogue meets every rule that
applies to it."""

from __future__ import annotations

from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from pytest_ptn.instruments.content import digest
from pytest_ptn.programs.exported import constants_of, mutable_keys

Content = tuple[str, str]
"""(dtype and shape, sha256 of the bytes) of a tensor."""


def derived_tags(programs: dict[str, ExportedProgram]) -> frozenset[str]:
    """The catalogue tags ``programs`` (method -> functionalized program, in load order) earn:

    - ``collision``: one immutable key names different tensors in two methods;
    - ``shared_weight``: one immutable key names the same tensor in two methods;
    - ``dedupe``: equal immutable tensors in two methods, whatever their keys;
    - ``total_collision``: a later method whose every immutable key an earlier method has, one of them with
      other bytes;
    - ``shared_state`` / ``private_state``: a mutated buffer bound by several methods / by one;
    - ``state_bytes``: a mutated buffer that starts equal in bytes to an immutable tensor;
    - ``buffers``: some method reads a buffer, so initial values matter.

    Every program from outside the catalogue is ``valid``: it must lower.
    """
    mutable = mutable_keys(programs)
    contents: dict[str, dict[str, Content]] = {}  # method -> key -> content of the immutable constants
    state: dict[str, set[Content]] = {}  # mutated key -> its initial contents, one per binding method
    for method, ep in programs.items():
        for key, use in constants_of(ep).items():
            content = (f"{use.tensor.dtype}{tuple(use.tensor.shape)}", digest(use.tensor))
            if key in mutable:
                state.setdefault(key, set()).add(content)
            else:
                contents.setdefault(method, {})[key] = content
    by_key: dict[str, list[Content]] = {}
    by_content: dict[Content, set[str]] = {}
    for method, keys in contents.items():
        for key, content in keys.items():
            by_key.setdefault(key, []).append(content)
            by_content.setdefault(content, set()).add(method)
    tags = {"valid"}
    if any(len(set(found)) > 1 for found in by_key.values()):
        tags.add("collision")
    if any(len(found) > len(set(found)) for found in by_key.values()):
        tags.add("shared_weight")
    if any(len(methods) > 1 for methods in by_content.values()):
        tags.add("dedupe")
    if _total_collision(list(programs), contents):
        tags.add("total_collision")
    binders = {key: [m for m, ep in programs.items() if key in constants_of(ep)] for key in mutable}
    if any(len(methods) > 1 for methods in binders.values()):
        tags.add("shared_state")
    if any(len(methods) == 1 for methods in binders.values()):
        tags.add("private_state")
    if any(initial & set(by_content) for initial in state.values()):
        tags.add("state_bytes")
    if any(s.kind == InputKind.BUFFER for ep in programs.values() for s in ep.graph_signature.input_specs):
        tags.add("buffers")
    return frozenset(tags)


def _total_collision(order: list[str], contents: dict[str, dict[str, Content]]) -> bool:
    seen: dict[str, set[Content]] = {}
    for method in order:
        keys = contents.get(method, {})
        if keys and all(k in seen for k in keys) and any(c not in seen[k] for k, c in keys.items()):
            return True
        for key, content in keys.items():
            seen.setdefault(key, set()).add(content)
    return False
