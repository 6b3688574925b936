"""What a running job listens to besides its work: SIGINT/SIGTERM (stop and save), SIGUSR1 (dump its tasks),
and the metrics endpoint with tail --control's POST /commit; and how an error ends a run (:func:`ended_by`)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from replicator import __version__
from replicator.errors import EXIT_UNAVAILABLE, ConfigError, McdcError
from replicator.settings.config import Settings
from replicator.settings.uri import redact

if TYPE_CHECKING:
    from pymongo.errors import PyMongoError

    from replicator.observe.metrics import Metrics


def check_control(settings: Settings) -> None:
    if settings.metrics_port is None:
        raise ConfigError("--control answers POST /commit on the metrics port: give --metrics-port too")
    if settings.metrics_host not in ("127.0.0.1", "::1", "localhost"):
        raise ConfigError(
            f"--control answers POST /commit on loopback only: --metrics-host {settings.metrics_host} is not"
        )


def commit_hook(metrics: Any, stop: asyncio.Event, asked: list[bool]) -> Any:
    """POST /commit: when canCommit holds, stop the tail (it saves its checkpoint) and cut over after."""
    from replicator.observe.migration import can_commit

    def commit(block_writes: bool) -> str | None:
        if asked:
            return "a cutover is under way already"
        facts = metrics.facts()
        if not can_commit(facts):
            return "canCommit is false: see GET /progress (the snapshot, the lag, or the verifier is not there yet)"
        asked.append(block_writes)
        metrics.set_state("committing")
        stop.set()
        return None

    return commit


def stop_on_signals() -> asyncio.Event:
    """SIGINT/SIGTERM set the returned event: the run flushes, saves the checkpoint and returns. A second
    signal cancels the run at once (the checkpoint is still consistent)."""
    stop = asyncio.Event()
    task = asyncio.current_task()

    def on_signal() -> None:
        if stop.is_set() and task is not None:
            task.cancel()
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    return stop


def dump_tasks() -> None:
    """SIGUSR1: what each of the run's tasks is waiting on, on stderr (a run that seems stuck): every
    coroutine and async generator down its chain of awaits, to the future it waits for."""
    tasks = asyncio.all_tasks()
    lines = [f"mcdc: {len(tasks)} tasks"]
    for task in sorted(tasks, key=lambda t: t.get_name()):
        lines.append(f"task {task.get_name()}:")
        lines += [f"  {line}" for line in awaits(task.get_coro())]
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


def awaits(start: object) -> list[str]:
    """Where ``start`` (a coroutine) is suspended, frame by frame down what it awaits. Python's own
    Task.print_stack shows the first frame only; an ``async for`` over an async generator is followed into
    the generator (found among the objects its pending ``__anext__`` refers to)."""
    import gc
    import inspect

    lines: list[str] = []
    obj: object = start
    for _ in range(64):
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "ag_frame", None) or getattr(obj, "gi_frame", None)
        if frame is None:
            if type(obj).__name__ == "FutureIter":  # ``await future``: the future itself says more
                obj = next((o for o in gc.get_referents(obj) if isinstance(o, asyncio.Future)), obj)
            lines.append(f"waits for {obj!r}"[:300])
            break
        lines.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_qualname}")
        following = (
            getattr(obj, "cr_await", None) or getattr(obj, "ag_await", None) or getattr(obj, "gi_yieldfrom", None)
        )
        if type(following).__name__ in ("async_generator_asend", "async_generator_athrow"):
            following = next((o for o in gc.get_referents(following) if inspect.isasyncgen(o)), following)
        if following is None:
            break
        obj = following
    return lines


@contextlib.asynccontextmanager
async def served_metrics(settings: Settings) -> AsyncIterator[Metrics | None]:
    """The run's metrics, served on --metrics-port while it lasts; None without the flag."""
    if settings.metrics_port is None:
        yield None
        return
    from replicator.observe.metrics import Metrics, serve

    metrics = Metrics()
    metrics.set_info(version=__version__, source=redact(settings.source), target=redact(settings.target))
    metrics.max_read_rate = settings.max_read_rate
    try:
        server = await serve(metrics, settings.metrics_port, settings.metrics_host)
    except OSError as exc:
        raise ConfigError(
            f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port}: {exc.strerror}"
        ) from None
    try:
        yield metrics
    finally:
        server.close()
        await server.wait_closed()


def ended_by(exc: McdcError | PyMongoError) -> tuple[int, str]:
    """The exit code and the one line of an error a run ended with (a McdcError or a server's error):

    * a sink's error over a write the target's user may not make: the refusal, exit 2;
    * any other McdcError: its message (credentials removed) and its exit code;
    * a server refusal (permissions, ...): which side refused what, exit 2; a connection lost for good (an
      outage): exit 75."""
    from pymongo.errors import ConnectionFailure

    from replicator.source.connection import explain_failure, explain_refusal, server_message
    from replicator.source.retry import is_retryable

    refused = explain_refusal(exc)
    if isinstance(exc, McdcError):
        return (2, refused) if refused is not None else (exc.exit_code, redact(str(exc)))
    if refused is None and not is_retryable(exc):
        refused = explain_failure(exc)  # which side refused what, at least
    if refused is not None:
        return 2, refused
    return (
        EXIT_UNAVAILABLE if isinstance(exc, ConnectionFailure) else 2
    ), f"MongoDB: {server_message(exc)} (--verbose shows where)"
