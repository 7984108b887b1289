"""`cake evolve` once its request is checked: services, the flow in a thread, the live view, stopping.

Ctrl-C or SIGTERM seals the run at once (nothing of it is written after that,
so the count printed is final), shuts Ray's workers down, records the run
``cancelled`` in the warehouse and in Prefect, and says what was recorded; the
services are then left (the Prefect server stopped by its last user). See
:mod:`tasks.run_control` for the seal.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from rich.live import Live

from cake_cli.config import Settings
from cake_cli.display import LiveProgress, baseline_lines, best_text, console, live_view, say, summary_table
from cake_cli.services import abandon_ray, prefect_server, ray_runtime, shutdown_ray
from tasks.gpus import local_resources

REFRESH_S = 0.5            # live display refresh period
STOP_WAIT_S = 3.0          # after Ctrl-C, how long the flow thread may take to end on its own


_SIGNALS: list[int] = []   # Ctrl-C and SIGTERM received by this process, in order


def terminate(signum: int, frame: Any) -> None:
    """The handler of SIGTERM (and of SIGINT during a run): the same orderly stop as Ctrl-C. Prefect's console is
    quieted first: a flow or task stopped mid-way is not an error to show (it stays in the UI)."""
    # Counted as well as raised: a KeyboardInterrupt raised inside a DuckDB query comes back as
    # duckdb's InterruptException, which a caller may swallow; the count is never lost.
    _SIGNALS.append(signum)
    _quiet_prefect_console(logging.CRITICAL)
    if _in_finalizer(frame):
        # Raised inside a __del__ (a warehouse's reader connections closed at collection time), the interrupt
        # would be printed as "Exception ignored in ..." with a traceback, and dropped. The count stands: the
        # run's watcher and the next check (_raise_if_signalled, run_control's stop request) stop it.
        return
    raise KeyboardInterrupt


def _in_finalizer(frame: Any) -> bool:
    """Whether ``frame`` (where a signal interrupted the main thread) runs inside an object's ``__del__``."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


class _StopOnSignal:
    """Stop a run the moment Ctrl-C or SIGTERM arrives, from a thread of its own.

    Python runs signal handlers in the main thread only, and only between
    bytecodes: while that thread waits in a DuckDB query the flow thread could
    still record, say, the compile of an nvcc that the same Ctrl-C killed. The
    C-level handler writes the signal to a wakeup pipe at once; this thread reads
    it and stops the run before anything else of it is written.
    """

    def __init__(self, run_id: str):
        self.run_id = run_id
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._before: int | None = None
        if threading.current_thread() is threading.main_thread():
            self._before = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="cake-stop-on-signal", daemon=True).start()

    def _watch(self) -> None:
        from tasks.run_control import request_stop

        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return
            if not data:
                return
            if signal.SIGINT in data or signal.SIGTERM in data:
                # Quiet first: the flow thread sees the stop within a poll, and a task it ends
                # would otherwise log its RunCancelled before the main thread gets to quiet it.
                _quiet_prefect_console(logging.CRITICAL)
                request_stop(self.run_id)

    def close(self) -> None:
        if self._before is not None:
            signal.set_wakeup_fd(self._before)
        os.close(self._write)   # the watcher reads end-of-file and ends


def _raise_if_signalled() -> None:
    if _SIGNALS:
        raise KeyboardInterrupt


def _quiet_prefect_console(level: int = logging.WARNING) -> None:
    """Keep Prefect's lines below ``level`` off the terminal (they stay in the UI): the live display owns it."""
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", logging.getLevelName(level))
    for name in ["", "prefect", *logging.root.manager.loggerDict]:
        logger = logging.getLogger(name)
        for h in getattr(logger, "handlers", []):
            if type(h).__name__ == "PrefectConsoleHandler" and h.level < level:
                h.setLevel(level)


def _cancel_flow_run(tag: str) -> None:
    """Mark the run's Prefect flow run cancelled if the flow did not end it itself (best effort)."""
    try:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
        from prefect.states import Cancelled

        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[tag])))
            for run in runs:
                if run.state is None or not run.state.is_final():
                    client.set_flow_run_state(run.id, Cancelled(
                        message="stopped by Ctrl-C or SIGTERM in `cake evolve`"), force=True)
    except Exception:  # noqa: BLE001 - stopping must not fail because the UI could not be told
        pass


def _sql_hint(run_id: str) -> str:
    return (f'cake sql "select generation, outcome, count(*) from attempts '
            f"where run_id = '{run_id}' group by all order by all\"")


def _print_where(settings: Settings, ui_url: str, run_id: str) -> None:
    say(f"warehouse: {settings.warehouse_root}")
    say(f"Prefect UI: {ui_url}  (flow runs tagged cake-run:{run_id})")


def _stop_run(settings: Settings, run_id: str, tag: str, worker: threading.Thread,
              progress: LiveProgress, timed: bool, release_ray: Callable[[bool], None]) -> None:
    """Ctrl-C or SIGTERM during a run: seal it, mark it cancelled, say what it recorded.

    The run is sealed at once (a write in progress completes, none starts), so
    the count printed is final; the run is marked ``cancelled`` in the
    warehouse and in Prefect meanwhile. The flow thread gets what is left of
    ``STOP_WAIT_S`` to end on its own (its worker pools see the stop within a
    poll and kill their actors; a second Ctrl-C skips the wait); it can no
    longer write anything. Then Ray is released: ``release_ray(False)``
    disconnects once the flow thread has ended, ``release_ray(True)`` kills
    Ray's processes under a flow thread still alive (disconnecting under it
    would end the process from inside Ray).
    """
    from concurrent.futures import ThreadPoolExecutor

    from tasks.run_control import record_cancelled, seal

    deadline, signals = time.monotonic() + STOP_WAIT_S, len(_SIGNALS)
    _quiet_prefect_console(logging.CRITICAL)   # a task stopped mid-way is not an error to show
    say(f"stopping run {run_id} (Ctrl-C again to stop at once) ...")
    seal(run_id)
    with ThreadPoolExecutor(3) as pool:
        status = pool.submit(record_cancelled, settings.warehouse_root, run_id)
        pool.submit(_cancel_flow_run, tag)
        counted = pool.submit(_final_count, progress)
    try:
        while worker.is_alive() and time.monotonic() < deadline and len(_SIGNALS) <= max(signals, 1):
            worker.join(0.1)
    except KeyboardInterrupt:
        pass   # the second Ctrl-C: stop now
    release_ray(worker.is_alive())
    if status.exception() is not None:   # the attempts are in; say so and go on stopping
        say(f"the run's status could not be recorded as cancelled: {status.exception()}")
    measured = progress.by_outcome().get("measured", 0)
    sure = "" if counted.result() else " (the last count; the warehouse did not answer again)"
    say(f"stopped. recorded {progress.total()} attempts of run {run_id} "
        f"({measured} measured) in {settings.warehouse_root}{sure}; they stay there")
    if progress.total():
        console.print(summary_table(progress, timed))
    say(f"look at them: {_sql_hint(run_id)}")
    # Nothing of the stopped flow may reach the terminal: no log record, and no report of a
    # log batch the server, stopped next, can no longer take.
    logging.disable(logging.CRITICAL)
    logging.raiseExceptions = False


def _releaser(started: bool) -> Callable[[bool], None]:
    """How a stopped run lets go of Ray: nothing when it joined one it did not start; else disconnect (the flow
    thread has ended) or kill the local Ray's processes under a flow thread still alive."""
    def release(flow_alive: bool) -> None:
        if started:
            (abandon_ray if flow_alive else shutdown_ray)()
    return release


def _final_count(progress: LiveProgress, tries: int = 5) -> bool:
    """Count the sealed run's attempts afresh; False if the warehouse never answered (the last count stands)."""
    for _ in range(tries):
        if progress.refresh().note is None:
            return True
        time.sleep(0.2)
    return False


def exit_now(code: int) -> None:
    """Exit at once, skipping the exit hooks: Prefect's would wait on calls of an abandoned flow thread."""
    for stream in (sys.stdout, sys.stderr, console.file):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


class Stopped(Exception):
    """The run was stopped (Ctrl-C, SIGTERM) and has said so; the services are being left."""


def run_evolution(settings: Settings, problem: str, run_id: str, kwargs: dict[str, Any], start_line: str,
                  generations: int, gpu_models: list[str], local_gpus: list[str]) -> None:
    """Start the services, run the evolution flow (``kwargs``: its parameters) in a thread under a live view,
    report the result. ``gpu_models``: what the run asks for; ``local_gpus``: this machine's GPUs a local Ray
    offers, each declared with its model (``tasks.gpus.local_resources``).

    Raises
    ------
    Stopped
        After a Ctrl-C or SIGTERM, once the run is sealed and has said what it recorded.
    """
    timed, tag = bool(gpu_models), f"cake-run:{run_id}"
    from warehouse.expectations import warm_up

    warm_up()      # the batches' validator, built while the services start
    with prefect_server(settings) as pf, ray_runtime(settings, num_gpus=len(local_gpus),
                                                     resources=local_resources(local_gpus)) as rt:
        _quiet_prefect_console()
        from flows.evolve import evolve_flow
        import prefect

        if pf.note:
            say(pf.note)
        _print_where(settings, pf.ui_url, run_id)
        say(start_line)

        outcome: dict[str, Any] = {}

        def work() -> None:
            try:
                with prefect.tags(tag):
                    outcome["value"] = evolve_flow(**kwargs)
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                outcome["error"] = e

        worker = threading.Thread(target=work, name="cake-evolve", daemon=True)
        progress = LiveProgress(settings.warehouse_root, run_id)
        started = time.monotonic()
        interactive = threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is not signal.SIG_IGN   # `nohup cake ...` keeps ignoring it
        before = signal.signal(signal.SIGINT, terminate) if interactive else None
        _SIGNALS.clear()
        watch = _StopOnSignal(run_id)
        try:
            with Live(live_view(progress, problem, generations, timed, started),
                      console=console, refresh_per_second=4, transient=True) as live:
                worker.start()
                while worker.is_alive():
                    worker.join(REFRESH_S)
                    _raise_if_signalled()
                    live.update(live_view(progress.refresh(), problem, generations, timed,
                                          started))
                    _raise_if_signalled()
        except KeyboardInterrupt:
            _stop_run(settings, run_id, tag, worker, progress, timed,
                      _releaser(rt is not None and rt.started))
            raise Stopped() from None
        finally:
            watch.close()
            if before is not None:
                signal.signal(signal.SIGINT, before)

        progress.refresh()
        if progress.total():
            console.print(summary_table(progress, timed))
        say(f"best: {best_text(progress, timed)}")
        for line in baseline_lines(progress):
            say(line)
        summary = outcome.get("value")
        if isinstance(summary, dict) and summary.get("stop_reason"):
            say(f"stopped: {summary['stop_reason'].replace('_', ' ')} after {summary.get('attempts')} attempts")
        for f in summary.get("confirm_failed", []) if isinstance(summary, dict) else []:
            say(f"confirm failed: {f['attempt_id']} on {f['shape']}: {f['message']} (not a winner)")
        _print_where(settings, pf.ui_url, run_id)
        say(f"ask: {_sql_hint(run_id)}")
        if "error" in outcome:
            raise outcome["error"]
