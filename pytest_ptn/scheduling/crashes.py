"""A backend that kills its process fails the test it was running, never the run.

Conformance runs go to pytest-xdist workers (one worker when no ``-n`` is given), and xdist replaces a
worker that dies. This module turns such a death into a true verdict: the test the worker was running fails
with the signal, the step it was in (lowering, loading, running a call) and a command that reproduces it.
Workers share a run folder with the controller: before each backend step a worker writes what it is about to
do ("last words") there, faulthandler dumps the dying worker's stack there, and the controller reads both
when the worker is gone. It also records the (backend, scenario, step) that crashed, so a later test of that
case that reaches the same step fails at once, naming the first crash, instead of killing one worker per test.
A step that hangs ends its worker the same way (pytest_ptn.scheduling.hangs), and is reported as hung.

Nothing here imports torch: the controller never does.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

from pytest_ptn import mechanisms
from pytest_ptn.instruments.process_end import ProcessEnd
from pytest_ptn.scheduling import hangs

FAULT_LINES = 25
"""Lines of a dying worker's faulthandler dump a crash report keeps: the innermost frames come first."""
HANG_LINES = 80
"""Lines of a hung worker's dump a report keeps: every thread's stack, the innermost frames of each first."""

CRASHED_STEPS = "crashed-steps.json"
PROPERTIES = "properties.json"


class CrashedEarlier(Exception):
    """A step of this case killed a worker earlier in the run (a crash or a hang); the message names it,
    ``mechanism`` is that crash's or hang's."""

    def __init__(self, message: str, mechanism: mechanisms.Mechanism):
        super().__init__(message)
        self.mechanism = mechanism


@dataclass
class Activity:
    """What a worker is doing inside a case, written down before it does it; outside any case (no
    ``scenario``): a call into the backend itself (``calling availability()``)."""

    backend: str
    scenario: str
    step: str

    def describe(self) -> str:
        return (
            f"{self.step} {self.scenario} on {self.backend}"
            if self.scenario
            else f"{self.step} of {self.backend}"
        )

    @property
    def stage(self) -> mechanisms.Step:
        """The step a mechanism names: lowering, or running (loading a method is part of running)."""
        return mechanisms.Step.LOWERING if self.step == mechanisms.Step.LOWERING else mechanisms.Step.RUNNING

    @property
    def backend_call(self) -> bool:
        """A call into the backend outside any case: the backend cannot run at all when it dies in one."""
        return not self.scenario


class WorkerLog:
    """A worker's side of the run folder: its last words, written before each step, each of which restarts
    the watchdog's clock (none: no time limit)."""

    def __init__(self, folder: Path, worker_id: str, watchdog: hangs.Watchdog | None = None):
        self.folder = folder
        self.last_words = folder / f"{worker_id}.last"
        self.watchdog = watchdog

    def say(self, **words: Any) -> None:
        self.last_words.write_text(json.dumps(words))

    def enter(self, step: Activity, known: bool = True, limited: bool = True) -> None:
        """Note the step; fail it at once if it crashed a worker earlier in this run (for a ``known``
        scenario: an ad-hoc program's name does not tell two programs apart). ``limited``: False where the
        step runs in a child process that has a limit of its own, and this worker only waits for it."""
        earlier = read_crashed_steps(self.folder).get(_step_key(step)) if known else None
        if earlier is not None:
            verdict, detail = earlier["verdict"], earlier["detail"]
            said = f"{step.describe()} {verdict} earlier in this run, not retried: {detail}"
            people = f"{verdict} while {step.step}"
            mechanism = (
                mechanisms.hung(step.stage, people)
                if verdict == "hung"
                else mechanisms.crashed(step.stage, ProcessEnd(**earlier["end"]), people)
            )
            raise CrashedEarlier(said, mechanism)
        self.say(step=step.__dict__, attached=self.attached)
        if self.watchdog is not None and limited:
            self.watchdog.progress()
        elif self.watchdog is not None:
            self.watchdog.idle()

    def idle(self) -> None:
        """The test is over: no step runs until the next one."""
        if self.watchdog is not None:
            self.watchdog.idle()

    attached = ""
    """Text a crash report shows after the step (the fuzz test's current program)."""


_worker: WorkerLog | None = None
_fault: IO[str] | None = None


def start_worker(folder: Path, worker_id: str, limit: float = 0.0) -> None:
    """This process is a worker: last words and faulthandler's dump go to the run folder, and a step that
    makes no progress for ``limit`` seconds (0: no limit) ends it. It leads a process group of its own, so
    that what its steps start (instruments.isolation's fresh process, a backend's compiler) ends with it:
    faulthandler's watchdog ends the worker alone, and the controller ends its group (``end_group``)."""
    global _worker, _fault
    with contextlib.suppress(OSError):  # already a session leader: the group is its own
        os.setpgrp()
    _fault = (folder / f"{worker_id}.fault").open("w")
    faulthandler.enable(file=_fault, all_threads=False)
    _worker = WorkerLog(folder, worker_id, hangs.Watchdog(limit, _fault))


def stop_worker() -> None:
    global _worker, _fault
    if _worker is not None:
        _worker.idle()
    if _fault is not None:
        faulthandler.disable()
        _fault.close()
    _worker = _fault = None


def note_test(nodeid: str) -> None:
    """A new test starts: last words name it until a backend step says more."""
    if _worker is not None:
        _worker.idle()
        _worker.attached = ""
        _worker.say(test=nodeid)


def note_test_done() -> None:
    """The test is over, its teardown too: the worker may now wait for work as long as it takes."""
    if _worker is not None:
        _worker.idle()


def attach(text: str) -> None:
    """Show ``text`` in the report if this worker dies in a later step of the current test."""
    if _worker is not None:
        _worker.attached = text


def enter(backend: str, scenario: str, step: str, known: bool = True, limited: bool = True) -> None:
    """Called before each backend step of a case (a no-op outside an isolated worker); ``limited``: False
    for a step run in a child process with a time limit of its own."""
    if _worker is not None:
        _worker.enter(Activity(backend, scenario, step), known, limited)


@contextlib.contextmanager
def calling(backend: str, call: str) -> Iterator[None]:
    """A call into the backend outside any case (``__init__``, ``availability()``, ``load_runtime()``): a step
    under the watchdog, after which no clock runs (a no-op outside an isolated worker)."""
    if _worker is None:
        yield
        return
    _worker.enter(Activity(backend, "", f"calling {call}"), known=False)
    try:
        yield
    finally:
        _worker.idle()


def last_step(folder: Path, worker_id: str) -> Activity | None:
    """The step a worker last said it was entering, if any."""
    try:
        said = json.loads(_read(folder / f"{worker_id}.last") or "{}")
    except ValueError:
        return None
    step = said.get("step") if isinstance(said, dict) else None
    return Activity(**step) if isinstance(step, dict) else None


def _step_key(step: Activity) -> str:
    return f"{step.backend}::{step.scenario}::{step.step}"


def read_crashed_steps(folder: Path) -> dict[str, dict[str, Any]]:
    """(backend, scenario, step) key -> the first failure it caused: its ``verdict`` (crashed, hung),
    ``detail`` (how, in which test) and, for a crash, ``end`` (the ProcessEnd's fields)."""
    try:
        data = json.loads((folder / CRASHED_STEPS).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_properties(folder: Path, properties: dict[str, list[tuple[str, str]]]) -> None:
    """Each test's user properties, so the controller can put a crashed test in the matrix."""
    tmp = folder / f".{PROPERTIES}.{os.getpid()}"
    tmp.write_text(json.dumps(properties))
    os.replace(tmp, folder / PROPERTIES)


def read_properties(folder: Path, nodeid: str) -> list[tuple[str, str]]:
    return all_properties(folder).get(nodeid, [])


def all_properties(folder: Path) -> dict[str, list[tuple[str, str]]]:
    """Every collected test's user properties, as the workers wrote them ({} before they collected)."""
    try:
        data = json.loads((folder / PROPERTIES).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(nodeid): [(str(k), str(v)) for k, v in pairs] for nodeid, pairs in data.items()}


def _popen(worker: Any) -> Any:
    """The worker's process (subprocess.Popen), where execnet's popen gateway has one."""
    return getattr(getattr(getattr(worker, "gateway", None), "_io", None), "popen", None)


def end_group(worker: Any) -> None:
    """A worker is down: whatever is left of its process group (a hung child it waited on, now orphaned and
    holding the run's output pipe open) is killed, so that a run leaves no process of its own behind."""
    popen = _popen(worker)
    if popen is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)


def worker_returncode(worker: Any) -> int | None:
    """The dead worker's exit status, where execnet's popen gateway can tell it."""
    popen = _popen(worker)
    if popen is None:
        return None
    try:
        return int(popen.wait(timeout=10))
    except Exception:
        return None


class Death(NamedTuple):
    """How a worker's test failed when the worker died or hung: the failure's text, and its mechanism."""

    text: str
    mechanism: mechanisms.Mechanism


def crash_report(
    folder: Path,
    worker_id: str,
    returncode: int | None,
    nodeid: str,
    repro: str | None,
    versions: dict[str, str],
    limit: float = 0.0,
) -> Death:
    """The failure of a test whose worker died or hung (no progress for ``limit`` seconds: the watchdog's
    dump is in its fault file), its text with the versions its backend reported (a crash is often one
    release's); records the step for later tests of its case."""
    fault = _read(folder / f"{worker_id}.fault")
    hung = hangs.is_timeout_dump(fault)
    end = ProcessEnd.of(returncode, fault)
    how = hangs.no_progress(limit) if hung else str(end)
    try:
        said = json.loads(_read(folder / f"{worker_id}.last") or "{}")
    except ValueError:
        said = {}
    step = said.get("step") if isinstance(said, dict) else None
    where = ""
    stage, verb = mechanisms.Step.RUNNING, "running"
    if isinstance(step, dict):
        current = Activity(**step)
        where = f" while {current.describe()}"
        stage, verb = current.stage, current.step
        crashed = read_crashed_steps(folder)
        first: dict[str, Any] = {"verdict": "hung", "detail": f"{how} in {nodeid}"}
        if not hung:
            first = {"verdict": "crashed", "detail": f"the worker was {how} in {nodeid}", "end": asdict(end)}
        crashed.setdefault(_step_key(current), first)
        (folder / CRASHED_STEPS).write_text(json.dumps(crashed))
    lines = [f"hung: {how}{where}" if hung else f"crashed: the worker process was {how}{where}"]
    if versions:
        lines.append(f"with {', '.join(f'{d} {v}' for d, v in versions.items())}")
    attached = said.get("attached") if isinstance(said, dict) else None
    if attached:
        lines.append(str(attached))
    if repro and hung:
        lines.append(f"reproduce (in an xdist worker, with this limit): {repro} {hangs.OPTION}={limit:g}")
    elif repro:
        lines.append(f"reproduce (in-process, the crash ends that run): {repro} -n 0")
    dump = [line for line in fault.strip().splitlines() if line.strip()]
    dump = dump[: HANG_LINES if hung else FAULT_LINES]
    if dump:
        lines.append(f"faulthandler{', every thread' if hung else ''} (most recent call first):")
        lines += [f"  {line}" for line in dump]
    said_how = f"hung ({how})" if hung else f"the worker was {how}"
    people = f"{said_how} while {verb}"
    mechanism = mechanisms.hung(stage, people) if hung else mechanisms.crashed(stage, end, people)
    return Death("\n".join(lines), mechanism)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
