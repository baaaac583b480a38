"""check_program and program_hazards: a user's program, in any form, checked through a backend as the
package's face (pytest_ptn.check) describes; the judging itself is check.judge's."""

from __future__ import annotations

import dataclasses
import reprlib
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_ptn.backend import (
    Backend,
    BackendError,
    availability_of,
    resolve_backend,
    runtime_availability,
)
from pytest_ptn.check.findings import Findings
from pytest_ptn.check.hazards import Hazards, hazards_of
from pytest_ptn.check.judge import judged
from pytest_ptn.programs.source import Inputs, ProgramFormError, Source, UserProgram


def usable_backend(backend: str | Backend) -> Backend:
    """``backend`` ready to use, or BackendError saying why it cannot run on this machine."""
    if isinstance(backend, str):
        spec, cls = backend, resolve_backend(backend)
    else:
        spec, cls = backend.name, type(backend)
    availability = runtime_availability(cls, availability_of(spec, cls))
    if not availability.available:
        raise BackendError(f"backend {spec!r} cannot run here: {availability.reason}")
    return cls() if isinstance(backend, str) else backend


def check_program(
    program: Source,
    methods: Mapping[str, Inputs],
    calls: Sequence[tuple[str, Inputs]] | None = None,
    backend: str | Backend = "reference",
    workdir: Path | None = None,
) -> Findings:
    """Lower ``program``'s ``methods`` (name -> example inputs) through ``backend`` and check it; [] if clean,
    and ``.hazards`` says what the check could bite on.

    ``program`` is an ``nn.Module`` with those methods, or a mapping of method name -> ``nn.Module`` (its
    forward), callable, ``ExportedProgram`` or constant value (a constant method, which needs no inputs);
    findings name its tensors by its own FQNs. A method's inputs are a tuple (positional), a mapping
    (keywords) or ``(args, kwargs)``, or flat in the exported program's order as a runtime takes them.
    ``calls`` is the call sequence (method, inputs), numbered as given (calls of constant methods are not
    run); by default each method once with its example inputs. A backend that cannot run here, or keeps
    no state between calls for a program that writes some, raises BackendError; a program in none of those
    forms, or a call its method cannot take (inputs of another structure, shape or dtype than the method
    was exported for, as the runtime refuses them), ProgramFormError: a usage error of the program, never
    a finding about the backend."""
    import torch

    usable = usable_backend(backend)
    user = UserProgram(program, methods)
    given = _given_calls(user, calls)
    positions = [i for i, (name, _) in enumerate(given) if name not in user.constants]
    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        sequence = user.calls(given)
        _refuse_calls(user, sequence, positions)
        _refuse_state(usable, user)
        findings = judged(usable, user, sequence, workdir or Path(tmp))
    numbered = [f if f.call is None else dataclasses.replace(f, call=positions[f.call]) for f in findings]
    return Findings(numbered, _hazards(user, sequence))


def program_hazards(
    program: Source, methods: Mapping[str, Inputs], calls: Sequence[tuple[str, Inputs]] | None = None
) -> Hazards:
    """What ``program`` (in any form check_program takes) holds that the rules are about, and the rules
    it leaves with no case to check, without lowering it: its methods are exported and read."""
    import torch

    user = UserProgram(program, methods)
    with torch.no_grad():
        sequence = user.calls(_given_calls(user, calls))
        return _hazards(user, sequence)


CALL_FORM = '(method name, inputs), as in calls=[("prefill", (tokens,)), ("decode", (token,))]'
"""What each of ``calls`` is, for the usage error of a call in another form."""


def _given_calls(
    program: UserProgram, calls: Sequence[tuple[str, Inputs]] | None
) -> list[tuple[str, Inputs]]:
    """The calls as given, or each method once with its example inputs. ProgramFormError for a call that is
    no (method name, inputs) pair: a bare name would unpack as its letters, or fail deep inside."""
    if calls is None:
        return list(program.inputs.items())
    if isinstance(calls, str):
        raise ProgramFormError(f"calls is the string {calls!r}: a sequence of calls, each {CALL_FORM}")
    given = list(calls)
    for i, call in enumerate(given):
        if not (isinstance(call, tuple | list) and len(call) == 2 and isinstance(call[0], str)):
            raise ProgramFormError(f"call #{i} is {reprlib.repr(call)}: each call is {CALL_FORM}")
    return given


def _hazards(program: UserProgram, sequence: list) -> Hazards:
    return hazards_of(program.inspected(), [name for name, _ in sequence], list(program.constants))


def _refuse_calls(program: UserProgram, sequence: list, positions: list[int]) -> None:
    """ProgramFormError for a call the exported method cannot take (``positions``: each call's number as
    given, constant methods' calls counted)."""
    from pytest_ptn.reference.inputs import call_refusal, input_metas

    inspected = program.inspected()
    for i, (name, args) in zip(positions, sequence, strict=True):
        refusal = call_refusal(name, input_metas(inspected[name]), args)
        if refusal is not None:
            raise ProgramFormError(
                f"call #{i} cannot be made: {refusal} (export the method for the inputs you call it with)"
            )


def _refuse_state(backend: Backend, program: UserProgram) -> None:
    """BackendError where the program writes state and the backend keeps none between calls: nothing it
    could find would be about the program (a lowering it refuses is no E2 finding)."""
    from pytest_ptn.programs.exported import mutable_keys

    stateless = backend.keeps_no_state()
    written = sorted(mutable_keys(program.inspected())) if stateless else []
    if written:
        raise BackendError(
            f"backend {backend.name!r} cannot check this program: it writes {', '.join(written)}, and "
            f"{stateless}"
        )
