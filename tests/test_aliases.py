"""One tensor reachable by several FQNs (a submodule on several paths) is one constant: no false S1 or P4."""

from __future__ import annotations

import pytest

from pytest_ptn.plugin import suite_path
from pytest_ptn.programs.build import Program
from pytest_ptn.programs.catalogue import BY_NAME
from pytest_ptn.programs.exported import aliases


def test_second_fqns_are_aliases_of_the_one_the_graph_reads() -> None:
    for ep in Program(BY_NAME["aliased_submodule"].spec).export().values():  # read through `rope`
        assert aliases(ep) == {"shared.w": "rope.w", "shared.freqs": "rope.freqs"}


def test_a_tied_weight_is_named_by_the_fqn_the_method_reads() -> None:
    """Voxtral's text_decoder: the embedding's FQN comes first but only the output layer's is read (and so the
    only one AOTI allocates): the read one stands for the tensor."""
    import torch
    from torch import nn

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(4, 3)
            self.out = nn.Linear(3, 4, bias=False)
            self.out.weight = self.emb.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(x)

    ep = torch.export.export(Tied(), (torch.randn(2, 3),))
    assert aliases(ep) == {"emb.weight": "out.weight"}


def test_unallocated_second_names_are_no_s1(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess(
        str(suite_path()),
        "--ptn-backend=broken_backends:UsedNamesOnly",
        "-k",
        "aliased_submodule",
        "-m",
        "S1 or S5 or P4",
        "-p",
        "no:cacheprovider",
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) == 3 and not outcomes.get("failed"), outcomes


def test_a_real_split_of_an_aliased_tensor_is_still_s1(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess(
        str(suite_path()),
        "--ptn-backend=broken_backends:NoSharing",
        "-k",
        "aliased_submodule",
        "-m",
        "S1",
        "-p",
        "no:cacheprovider",
    )
    assert result.parseoutcomes().get("failed", 0) == 1
