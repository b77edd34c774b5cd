"""The quick lane's promise, checked: a test not marked `slow` starts no compile-only client.

`pytest -m "not slow"` is meant to compile nothing for a TPU or GPU (README, "Tests"). A test
that starts libtpu's TPU client or XLA's CUDA client (every compile-only device comes from one
of them, through `jax.experimental.topologies.get_topology_desc`) or a TPU or CUDA backend
fails, and says to mark it slow. tests/conftest.py runs `guarded` around each phase of every
test without the `slow` marker. Child processes a test starts are not watched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

# The functions of jax._src.xla_bridge that start a compile-only client, by the client.
CLIENT_STARTS = {
    "make_pjrt_tpu_topology": "libtpu's TPU compile-only client",
    "make_pjrt_topology": "a compile-only client (XLA's CUDA client for GPU strings)",
}
ACCELERATOR_BACKENDS = ("tpu", "cuda", "rocm", "gpu")


class QuickLaneError(AssertionError):
    """A test outside the slow marker started a TPU or GPU client."""


def _message(test: str, what: str) -> str:
    return (
        f"{test} started {what} but is not marked slow; the quick lane (-m 'not slow') "
        "compiles nothing: mark it @pytest.mark.slow (and compile, if it compiles)"
    )


@contextlib.contextmanager
def guarded(test: str) -> Iterator[list[str]]:
    """While inside, the client starts of `CLIENT_STARTS` raise `QuickLaneError` (before
    anything starts); on leaving, a TPU or GPU backend jax holds that it did not hold on
    entering raises it too. Yields the list of what was refused (a test may swallow the
    error: the caller fails it anyway)."""
    from jax._src import xla_bridge

    refused: list[str] = []
    saved: dict[str, Callable[..., Any]] = {}

    def refusing(name: str) -> Callable[..., Any]:
        def start(*args: Any, **kwargs: Any) -> Any:
            what = CLIENT_STARTS[name]
            refused.append(what)
            raise QuickLaneError(_message(test, what))

        return start

    before = set(xla_bridge._backends)
    for name in CLIENT_STARTS:
        saved[name] = getattr(xla_bridge, name)
        setattr(xla_bridge, name, refusing(name))
    try:
        yield refused
    finally:
        for name, fn in saved.items():
            setattr(xla_bridge, name, fn)
    started = set(xla_bridge._backends) - before
    if any(b in ACCELERATOR_BACKENDS for b in started):
        refused.append(f"jax's {sorted(started)} backend")
    if refused:
        raise QuickLaneError(_message(test, refused[0]))
