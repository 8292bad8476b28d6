"""The process's runtime from Python: configure() and the DataLoader worker split.

The settings live in the C++ runtime (base/runtime.h). They are also written to the
environment (WHARF_MEMORY_BUDGET, WHARF_INFLIGHT), so that processes started afterwards
(DataLoader workers started by spawn or forkserver, subprocesses) inherit them as forked
children do.
"""
import os
from typing import Optional, Union

from wharf import _wharf

# The pid of the process that last called configure() with a memory budget: a DataLoader
# worker that configured its own budget (in worker_init_fn) keeps it; one that did not gets
# its share of the node's budget (split_budget_for_worker).
_configured_in: Optional[int] = None
# The pid whose budget was already split, so a worker splits once however many datasets it
# iterates.
_split_in: Optional[int] = None


def configure(memory_budget: Union[None, int, str] = None, inflight: Optional[int] = None,
              log_level: Optional[str] = None) -> None:
    """Sets the process's runtime: `memory_budget`, the most bytes of data wharf holds at once
    in this process (an int, or a SIZE str with an optional K/M/G/T suffix in powers of 1024:
    "256M"); `inflight`, requests in flight per engine (unset: derived from the store's
    measured latency). Applies to new reservations; bytes already held stay held until
    released. `log_level`: "debug" (one stderr line per store request), "info", "warning"
    (the default), "error" or "off"; also WHARF_LOG. Unset arguments keep their value.

    DataLoader workers inherit the settings; unless a worker calls configure() itself (e.g.
    in worker_init_fn), wharf.torch datasets give each worker budget / num_workers."""
    global _configured_in
    # Every argument is checked before any is applied: a bad one changes nothing.
    budget = None
    if memory_budget is not None:
        try:
            budget = _wharf.parse_size(memory_budget)
        except (TypeError, ValueError) as e:
            raise type(e)(f"configure: memory_budget: {e}") from None
        if budget <= 0:
            raise ValueError("configure: memory_budget must be positive")
    if inflight is not None:
        if isinstance(inflight, bool) or not isinstance(inflight, int):
            raise TypeError(f"configure: inflight must be an int, got {inflight!r}")
        if not 1 <= inflight <= 65536:
            raise ValueError(f"configure: inflight must be in [1, 65536], got {inflight}")
    if log_level is not None and (not isinstance(log_level, str) or
                                  log_level.strip().lower() not in
                                  ("debug", "info", "warning", "warn", "error", "off", "none")):
        raise ValueError(f"configure: log_level must be 'debug', 'info', 'warning', 'error' or "
                         f"'off', got {log_level!r}")
    if log_level is not None:
        _wharf._set_log_level(log_level)
        os.environ["WHARF_LOG"] = log_level
    _wharf._configure(budget, inflight)
    if budget is not None:
        os.environ["WHARF_MEMORY_BUDGET"] = str(budget)
        _configured_in = os.getpid()
    if inflight is not None:
        os.environ["WHARF_INFLIGHT"] = str(int(inflight))


def split_budget_for_worker(num_workers: int) -> bool:
    """In a DataLoader worker: sets this process's budget to the node's budget (what the
    parent configured, WHARF_MEMORY_BUDGET, or the default) divided by `num_workers`, so the
    workers of one loader together hold no more than the node's budget. Does nothing when
    this process configured its own budget, or already split. Returns whether it split.
    wharf.torch datasets call it in each worker; call it from worker_init_fn for your own
    datasets."""
    global _split_in
    pid = os.getpid()
    if num_workers <= 1 or _configured_in == pid or _split_in == pid:
        return False
    node = _wharf._runtime_options()["memory_budget"]
    _wharf._configure(max(node // num_workers, 1), None)
    _split_in = pid
    return True


# ---- The metrics endpoint (WHARF_METRICS_ADDR, docs/design/metrics.md) ----
# A process that reports to the one serving /metrics (a DataLoader worker) writes its final
# metrics when it ends. multiprocessing children end with os._exit(), which skips atexit; they
# run multiprocessing's finalizers first. A forked child clears the parent's at start, so the
# finalizer is registered again there by an after-fork hook; a spawned child (which runs no
# after-fork hooks) imports wharf anew and registers it here.
class _MetricsExitHook:
    pass


_metrics_hook = _MetricsExitHook()


def _flush_metrics_at_exit(_hook=None) -> None:
    import multiprocessing.util
    multiprocessing.util.Finalize(None, _wharf._metrics_flush, exitpriority=0)


# The tiers' read counters and temporary directories (docs/design/tier.md): a process's are
# written and removed by exit handlers, which a multiprocessing child (a DataLoader worker)
# skips; its finalizers run, so a forked child registers one (a spawned child exits normally).
class _TierExitHook:
    pass


_tier_hook = _TierExitHook()


def _tier_exit_in_child(_hook=None) -> None:
    import multiprocessing.util
    multiprocessing.util.Finalize(None, _wharf._tier_at_exit, exitpriority=0)


import multiprocessing.util  # noqa: E402 - beside the hook it serves
multiprocessing.util.register_after_fork(_tier_hook, _tier_exit_in_child)

if os.environ.get("WHARF_METRICS_ADDR"):
    import multiprocessing.util
    multiprocessing.util.register_after_fork(_metrics_hook, _flush_metrics_at_exit)
    _flush_metrics_at_exit()
