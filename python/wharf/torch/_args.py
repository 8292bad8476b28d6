"""Checks of the datasets' arguments, made where a dataset is made."""
import operator
from collections.abc import Mapping


# Seeds, epochs and byte counts travel to C++ as unsigned 64-bit integers.
U64_MAX = (1 << 64) - 1


def _check_int(name: str, value, minimum: int, optional: bool = False,
               maximum: int = U64_MAX) -> None:
    """An int argument in [minimum, maximum] (None too when optional): checked where the
    dataset is made, not at its first iteration (in a DataLoader worker)."""
    if value is None and optional:
        return
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)  # ints, numpy's integers
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(value).__name__}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")


def _callable_or_none(name: str, fn):
    """`fn`, refused at once (not at the first sample, inside a worker) unless callable."""
    if fn is not None and not callable(fn):
        raise TypeError(f"{name} must be a callable or None, got {type(fn).__name__} {fn!r:.80}")
    return fn


def _check_state(state) -> None:
    """load_state_dict's argument: a mapping (a state_dict() result), refused by name else."""
    if not isinstance(state, Mapping):
        raise TypeError(f"load_state_dict: state must be a dict (a state_dict() result), got "
                        f"{type(state).__name__}")
