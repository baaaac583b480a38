"""Variants of the reference backend that die on some generated programs and not on others, as openvino 2026
dies at the first call of a stateful program: the fuzz must go on past a listed crash or hang
(tests/test_fuzz_apart.py)."""

from __future__ import annotations

import os
import signal
import time

from pytest_ptn.backend import Lowered
from pytest_ptn.backends.reference import ReferenceBackend
from pytest_ptn.reference.loader import ReferenceLoaded, ReferenceLowered

METHODS_TO_CRASH = 3
METHODS_TO_HANG = 4
"""A program of at least this many methods kills (hangs) its loader; generated programs have two to four."""


class SegfaultsOnThreeMethods(ReferenceBackend):
    name = "dying"

    def load(self, lowered: Lowered) -> ReferenceLoaded:
        assert isinstance(lowered, ReferenceLowered)
        if len(lowered.graphs) >= METHODS_TO_CRASH:
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().load(lowered)


class HangsOnFourMethods(ReferenceBackend):
    name = "dying"

    def load(self, lowered: Lowered) -> ReferenceLoaded:
        assert isinstance(lowered, ReferenceLowered)
        while len(lowered.graphs) >= METHODS_TO_HANG:
            time.sleep(1)
        return super().load(lowered)
