"""Eight CPU devices in one process: XLA reads this flag when jax is first imported. And the
quick lane's guard (tests/quick_lane.py): a test not marked slow that starts a TPU or GPU
compile-only client fails."""

import os

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _guarded(item: pytest.Item):
    import contextlib

    if item.get_closest_marker("slow") is not None:
        return contextlib.nullcontext()
    from tests.quick_lane import guarded

    return guarded(item.nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _guarded(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _guarded(item):
        return (yield)
