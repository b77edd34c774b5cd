"""The launcher on its own: children here are small Python commands that never import jax."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from loadax_mesh import MeshConfigError, distributed
from loadax_mesh.jobs import launcher
from tests.helpers import run_python

WAIT = 60  # seconds any launcher run in this file may take before the test gives up


def run(*args: str, child: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "loadax_mesh",
        "launch",
        *args,
        "--",
        sys.executable,
        "-c",
        child,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT)


SHOW_ENV = """
import os, sys
e = os.environ
print(e["LOADAX_MESH_PROCESS_ID"], e["LOADAX_MESH_NUM_PROCESSES"],
      e["LOADAX_MESH_DEVICES_PER_PROCESS"], e["LOADAX_MESH_COORDINATOR"], e["XLA_FLAGS"],
      e["JAX_PLATFORMS"])
print("to stderr", file=sys.stderr)
"""


@pytest.mark.multiprocess
def test_children_get_their_settings_and_prefixed_output() -> None:
    done = run("--nprocs", "3", "--devices-per-process", "2", child=SHOW_ENV)
    assert done.returncode == 0, done.stderr
    lines = sorted(done.stdout.splitlines())
    assert len(lines) == 3
    coordinators = set()
    for i, line in enumerate(lines):
        index, pid, num, devices, coordinator, flags, platforms = line.split()
        assert (index, pid, num, devices, platforms) == (f"[{i}]", str(i), "3", "2", "cpu")
        # the count from tests/conftest.py (8) is replaced, not repeated
        assert flags == "--xla_force_host_platform_device_count=2"
        coordinators.add(coordinator)
    assert len(coordinators) == 1 and coordinators.pop().startswith("127.0.0.1:")
    assert sorted(done.stderr.splitlines()) == [f"[{i}] to stderr" for i in range(3)]


GLOO = "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1"


@pytest.mark.multiprocess
@pytest.mark.parametrize("verbose", [False, True])
def test_gloo_connection_messages_only_with_verbose(verbose: bool) -> None:
    child = f"print({GLOO!r}); print('[Gloo] other news'); print('work')"
    done = run("--nprocs", "1", "--devices-per-process", "1", *["--verbose"] * verbose, child=child)
    assert done.returncode == 0, done.stderr
    shown = [f"[0] {GLOO}"] if verbose else []
    assert done.stdout.splitlines() == [*shown, "[0] [Gloo] other news", "[0] work"]


def test_gloo_messages_interleaved_by_its_threads_are_dropped() -> None:
    """Two of gloo's messages, split and interleaved as seen on a loaded machine."""
    from loadax_mesh.jobs.children import _quiet

    seen = [
        GLOO.replace(": 1", ": [Gloo] Rank 3\n"),
        "3 is connected to 3 peer ranks. Expected number of connected peer ranks is : 3\n",
    ]
    assert [_quiet(line) for line in seen] == [None, None]
    assert _quiet(GLOO + "[1] OK model\n") == "[1] OK model\n"
    assert _quiet("[Gloo] other news\n") == "[Gloo] other news\n"


@pytest.mark.multiprocess
def test_gloo_text_inside_a_line_is_cut_out() -> None:
    """Gloo's C++ output can land in the middle of one of the child's lines (seen under load)."""
    child = f"import sys; sys.stdout.write({GLOO!r}); print('work'); print()"
    done = run("--nprocs", "1", "--devices-per-process", "1", child=child)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[0] work", "[0] "]


@pytest.mark.multiprocess
def test_a_failing_child_stops_the_others() -> None:
    child = """
import os, sys, time
i = int(os.environ["LOADAX_MESH_PROCESS_ID"])
print(os.getpid(), flush=True)
if i == 2:
    time.sleep(0.5)
    sys.exit(7)
time.sleep(120)
print("survived", flush=True)
"""
    done = run("--nprocs", "3", "--devices-per-process", "1", child=child)
    assert done.returncode == 7
    assert "process 2 failed (exit code 7); stopped processes [0, 1]" in done.stderr
    assert "survived" not in done.stdout
    for line in done.stdout.splitlines():
        pid = int(line.split()[1])
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.multiprocess
def test_a_child_killed_by_a_signal_is_named() -> None:
    child = """
import os, signal, time
if os.environ["LOADAX_MESH_PROCESS_ID"] == "0":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)
"""
    done = run("--nprocs", "2", "--devices-per-process", "1", child=child)
    assert done.returncode == 128 + signal.SIGKILL
    assert "process 0 failed (signal 9); stopped processes [1]" in done.stderr


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_timeout_stops_the_job() -> None:
    done = run(
        "--nprocs",
        "2",
        "--devices-per-process",
        "1",
        "--timeout",
        "1",
        child="import time; time.sleep(120)",
    )
    assert done.returncode == 124
    assert "timed out after 1 s (--timeout); stopped processes [0, 1]" in done.stderr


@pytest.mark.multiprocess
def test_a_given_busy_port_is_a_clear_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run(
            "--nprocs", "2", "--devices-per-process", "1", "--port", str(port), child="print('ran')"
        )
    assert done.returncode == 2 and "ran" not in done.stdout
    assert f"port={port} is in use on 127.0.0.1" in done.stderr


@pytest.mark.multiprocess
def test_a_given_free_port_is_used() -> None:
    port = launcher.free_port()
    done = run(
        "--nprocs",
        "1",
        "--devices-per-process",
        "1",
        "--port",
        str(port),
        child="import os; print(os.environ['LOADAX_MESH_COORDINATOR'])",
    )
    assert done.returncode == 0 and done.stdout == f"[0] 127.0.0.1:{port}\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nprocs", "0", "--devices-per-process", "1"], "--nprocs: '0'"),
        (["--nprocs", "2", "--devices-per-process", "x"], "--devices-per-process: 'x'"),
        (["--nprocs", "2", "--devices-per-process", "1", "--port", "70000"], "--port: '70000'"),
        (["--nprocs", "2", "--devices-per-process", "1", "--timeout", "-3"], "--timeout: '-3'"),
        (["--nprocs", "2", "--devices-per-process", "1", "--"], "no command given"),
        (["--devices-per-process", "1", "--", "true"], "--nprocs"),
    ],
)
def test_bad_arguments(args: list[str], message: str, capsys: Any) -> None:
    assert launcher.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("loadax-mesh launch: error: ") and err.count("\n") == 1, err
    assert message in err


def test_help_exits_zero(capsys: Any) -> None:
    assert launcher.main(["--help"]) == 0
    assert "--devices-per-process" in capsys.readouterr().out


def test_a_command_that_cannot_start(capsys: Any) -> None:
    args = ["--nprocs", "1", "--devices-per-process", "1", "--", "/nonexistent/loadax-cmd"]
    assert launcher.main(args) == 2
    assert "could not be started" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"command": "python x.py"}, "command"),
        ({"command": []}, "command"),
        ({"nprocs": 0}, "nprocs"),
        ({"nprocs": True}, "nprocs"),
        ({"devices_per_process": 2.0}, "devices_per_process"),
        ({"port": 0}, "port"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": float("inf")}, "timeout"),
    ],
)
def test_launch_validates_its_arguments(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"command": ["true"], "nprocs": 1, "devices_per_process": 1}
    args.update(kwargs)
    with pytest.raises(MeshConfigError, match=f"{field}="):
        launcher.launch(**args)


def _start_two_sleepers(tmp_path: Path, **popen: Any) -> tuple[subprocess.Popen[str], list[int]]:
    """A launcher of two children that record their pids and sleep; returns it and the pids."""
    pids = tmp_path / "pids"
    child = f"""
import os, time
with open({str(pids)!r}, "a") as f:
    f.write(f"{{os.getpid()}}\\n")
time.sleep(120)
"""
    cmd = [sys.executable, "-m", "loadax_mesh", "launch", "--nprocs", "2"]
    cmd += ["--devices-per-process", "1", "--", sys.executable, "-c", child]
    launcher = subprocess.Popen(cmd, text=True, **popen)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and (not pids.exists() or len(pids.read_text().split()) < 2):
        time.sleep(0.05)
    children = [int(p) for p in pids.read_text().split()] if pids.exists() else []
    if len(children) != 2:
        launcher.kill()
    assert len(children) == 2
    return launcher, children


@pytest.mark.multiprocess
@pytest.mark.skipif(sys.platform != "linux", reason="parent-death signal is Linux-only")
def test_children_die_with_a_killed_launcher(tmp_path: Path) -> None:
    launcher, children = _start_two_sleepers(
        tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    launcher.kill()
    launcher.wait(timeout=WAIT)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and any(_alive(p) for p in children):
        time.sleep(0.05)
    assert not any(_alive(p) for p in children)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by init) counts as dead
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"


@pytest.mark.multiprocess
def test_sigterm_to_the_launcher_stops_the_children(tmp_path: Path) -> None:
    launcher, children = _start_two_sleepers(
        tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=WAIT)
    assert launcher.returncode == 130
    assert "interrupted; stopped processes [0, 1]" in err
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_distributed_re_exports_the_launcher() -> None:
    assert distributed.launch is launcher.launch and distributed.main is launcher.main
    with pytest.raises(AttributeError, match="no attribute 'spawn'"):
        distributed.spawn  # noqa: B018


def test_the_launcher_imports_no_jax() -> None:
    code = (
        "import sys\nfrom loadax_mesh.jobs import launcher\n"
        "from loadax_mesh.distributed import main\n"
        "assert main is launcher.main\nprint(sorted(m for m in sys.modules if m.startswith('jax')))"
    )
    assert run_python(code, timeout=WAIT) == "[]\n"


@pytest.mark.multiprocess
def test_python_m_distributed_runs_the_launcher() -> None:
    cmd = [sys.executable, "-m", "loadax_mesh", "launch", "--nprocs", "2"]
    cmd += ["--devices-per-process", "1", "--", sys.executable, "-c", "print('hi')"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[0] hi", "[1] hi"]


# -- the child side: the environment contract ----------------------------------------------


def test_launcher_env_round_trip() -> None:
    env = distributed.child_env(
        {"XLA_FLAGS": "--xla_dump_to=/tmp/x"},
        index=1,
        nprocs=2,
        devices_per_process=4,
        coordinator="127.0.0.1:1234",
        init_timeout=30,
    )
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=4"
    assert distributed.launcher_env(env) == distributed.LauncherEnv("127.0.0.1:1234", 2, 1, 4, 30)
    assert distributed.launcher_env({}) is None


@pytest.mark.parametrize(
    ("change", "name"),
    [
        ({"LOADAX_MESH_COORDINATOR": "localhost"}, "LOADAX_MESH_COORDINATOR"),
        ({"LOADAX_MESH_PROCESS_ID": "2"}, "LOADAX_MESH_PROCESS_ID"),
        ({"LOADAX_MESH_NUM_PROCESSES": "two"}, "LOADAX_MESH_NUM_PROCESSES"),
        ({"LOADAX_MESH_DEVICES_PER_PROCESS": "0"}, "LOADAX_MESH_DEVICES_PER_PROCESS"),
    ],
)
def test_launcher_env_errors_name_the_variable(change: dict[str, str], name: str) -> None:
    env = distributed.child_env(
        {}, index=1, nprocs=2, devices_per_process=4, coordinator="127.0.0.1:1234", init_timeout=30
    )
    env.update(change)
    with pytest.raises(MeshConfigError, match=f"environment {name}="):
        distributed.launcher_env(env)


def test_with_device_count_replaces_every_earlier_count() -> None:
    count = "--xla_force_host_platform_device_count"
    flags = f"--a=1 {count}=8 --b {count}=3"
    assert distributed.with_device_count(flags, 2) == (
        "--a=1 --b --xla_force_host_platform_device_count=2"
    )


def test_initialize_refuses_arguments_the_launcher_sets(monkeypatch: Any) -> None:
    env = distributed.child_env(
        {}, index=0, nprocs=1, devices_per_process=1, coordinator="127.0.0.1:1", init_timeout=5
    )
    for name in (
        "LOADAX_MESH_COORDINATOR",
        "LOADAX_MESH_NUM_PROCESSES",
        "LOADAX_MESH_PROCESS_ID",
        "LOADAX_MESH_DEVICES_PER_PROCESS",
    ):
        monkeypatch.setenv(name, env[name])
    assert distributed.launched()
    with pytest.raises(MeshConfigError, match=r"process_id=\.\.\.") as err:
        distributed.initialize(process_id=3)
    assert "loadax-mesh launch" in str(err.value)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_initialize_needs_to_run_before_jax_uses_its_devices() -> None:
    child = (
        "import jax; jax.devices()\nfrom loadax_mesh import distributed\ndistributed.initialize()\n"
    )
    done = run("--nprocs", "1", "--devices-per-process", "1", child=child)
    assert done.returncode == 1
    assert "must run before jax uses its devices" in done.stderr


# -- starting children without forking the launcher -----------------------------------------


@pytest.mark.multiprocess
def test_launching_after_jax_started_forks_nothing(capfd: Any) -> None:
    """A `preexec_fn` would make subprocess fork the (threaded) launcher, and jax, once its
    backend runs, warns about every fork with a RuntimeWarning; the children start without."""
    import jax

    jax.devices()  # jax's fork warning is armed once a backend is up
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        code = launcher.launch(
            [sys.executable, "-c", "print('hi')"], nprocs=2, devices_per_process=1, timeout=WAIT
        )
    assert code == 0
    assert sorted(capfd.readouterr().out.splitlines()) == ["[0] hi", "[1] hi"]
    forks = [w for w in seen if "fork" in str(w.message)]
    assert not forks, [str(w.message) for w in forks]


# -- restarts: the job again on the processes left ----------------------------------------------

RESTARTING = """
import os, signal, sys, time
e = os.environ
run, i, n = e["LOADAX_RESTART"], int(e["LOADAX_MESH_PROCESS_ID"]), e["LOADAX_MESH_NUM_PROCESSES"]
print("run", run, "of", n, flush=True)
if run == "0" and i == 3:
    time.sleep(0.5)
    {how}
if run == "0":
    time.sleep(120)
"""


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "what"),
    [("os.kill(os.getpid(), signal.SIGKILL)", "signal 9"), ("sys.exit(5)", "exit code 5")],
)
def test_a_lost_process_restarts_the_job_on_the_rest(how: str, what: str) -> None:
    child = RESTARTING.format(how=how)
    done = run("--nprocs", "4", "--devices-per-process", "2", "--max-restarts", "2", child=child)
    assert done.returncode == 0, done.stderr
    assert f"process 3 failed ({what}); stopped processes [0, 1, 2]" in done.stderr
    assert "restart 1 of 2: the job again on 3 processes (LOADAX_RESTART=1)" in done.stderr
    first = [f"[{i}] run 0 of 4" for i in range(4)]
    assert sorted(done.stdout.splitlines()) == sorted(
        first + [f"[{i}] run 1 of 3" for i in range(3)]
    )


ALWAYS_FAILS = """
import os, sys, time
if os.environ["LOADAX_MESH_PROCESS_ID"] == "0":
    print("run", os.environ["LOADAX_RESTART"], flush=True)
    time.sleep(0.3)
    sys.exit(3)
time.sleep(120)
"""


@pytest.mark.multiprocess
@pytest.mark.slow
def test_restarts_end_when_none_are_left() -> None:
    done = run(
        "--nprocs", "3", "--devices-per-process", "1", "--max-restarts", "1", child=ALWAYS_FAILS
    )
    assert done.returncode == 3
    assert done.stdout.splitlines() == ["[0] run 0", "[0] run 1"]
    assert "restart 1 of 1: the job again on 2 processes" in done.stderr
    assert done.stderr.rstrip().endswith("not restarting: all 1 restarts made (--max-restarts)")


@pytest.mark.multiprocess
def test_restarts_end_below_the_minimum_of_processes() -> None:
    args = ["--nprocs", "2", "--devices-per-process", "1", "--max-restarts", "3"]
    done = run(*args, "--min-nprocs", "2", child=ALWAYS_FAILS)
    assert done.returncode == 3
    assert done.stdout.splitlines() == ["[0] run 0"]
    assert "not restarting: 1 process left, fewer than --min-nprocs 2" in done.stderr


def test_restart_arguments_are_checked(capsys: Any) -> None:
    args = ["--nprocs", "2", "--devices-per-process", "1", "--max-restarts", "-1", "--", "true"]
    assert launcher.main(args) == 2
    assert "--max-restarts: '-1'" in capsys.readouterr().err
    for kwargs, field in (({"min_nprocs": 3}, "min_nprocs"), ({"max_restarts": 1.0}, "max")):
        with pytest.raises(MeshConfigError, match=f"{field}"):
            launcher.launch(["true"], nprocs=2, devices_per_process=1, **kwargs)  # type: ignore[arg-type]


def test_restart_count_reads_the_environment() -> None:
    assert distributed.restart_count({}) == 0
    assert distributed.restart_count({"LOADAX_RESTART": "2"}) == 2
    with pytest.raises(MeshConfigError, match="LOADAX_RESTART='x'"):
        distributed.restart_count({"LOADAX_RESTART": "x"})
