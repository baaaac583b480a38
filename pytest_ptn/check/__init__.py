"""Run the rules on your own multi-method program, outside the catalogue.

    from pytest_ptn.check import check_program

    findings = check_program(model, {"prefill": (tokens,), "decode": (token,)}, backend="native")
    assert not findings, "\\n".join(map(str, findings))

The program is exported and run the way users lower for inference (pytest_ptn.programs.source: eval mode,
under ``torch.no_grad()`` whatever the caller's grad mode), freshly for the lowering, and an untouched copy
runs eagerly for the expected values. Findings (``pytest_ptn.check.findings.Finding``) name the rule and
step: E2 (lowering or loading failed), E1 (a call differs from eager and from what the backend computes for
its method alone, with the numbers and, where one faulty binding accounts for it, whose data it read), and
where the backend can show them E3-E5 (state view), P1-P5 (package view), S1-S3, S5 and S7 (storage view).
A difference from eager that the method shows alone too (pytest_ptn.check.alone) is the backend's
arithmetic: an A1 finding (a SHOULD) with max abs, max rel and SNR, never an E one. For a backend with a
witness (a runtime of .pte files: executorch.runtime on the same .pte), each E1 finding says whose it is
(``Finding.whose``, pytest_ptn.check.witness): the lowering's or upstream's, or the runtime's own.

A program the rules reject, methods built separately that start a same-named mutated buffer from different
values (P7), is checked as the conformance suite checks its P7 scenario: a backend with a package must reject
it at lowering (else P7), and a rejection must name the key and both methods (X1); a backend without a package
is not held to P7. Nothing else is checked on it: eager has no one value for that buffer.

The findings come as a list (``Findings``) that also carries ``hazards`` (pytest_ptn.check.hazards): what the
program holds that the rules are about (names minted in several methods with different bytes, tensors
shared by identity, state shared across methods, methods loaded lazily at their first call, constant
methods) and, for each family it lacks, the rules that therefore had no case of it to check, so a clean result
says what it covered. ``program_hazards`` gives the same without lowering anything.

Programs as optimum-executorch exports them go in as they are: methods of keyword inputs (inputs given as a
mapping, or as ``ep.example_inputs``), example inputs computed with autograd on, constant methods such as
``get_max_seq_len`` (values in the program mapping: reported, not lowered).
"""

from pytest_ptn.check.findings import Difference, Finding, Findings, Stage
from pytest_ptn.check.hazards import Hazards
from pytest_ptn.check.program import check_program, program_hazards

__all__ = ["Difference", "Finding", "Findings", "Hazards", "Stage", "check_program", "program_hazards"]
