"""Holding back what C++ libraries (libtpu, the CUDA plugin) write straight to file descriptor 2."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_stderr(*, replay_on_error: bool = True) -> Iterator[None]:
    """Hold back what C++ code writes to file descriptor 2 (libtpu's start-up warnings); with
    `replay_on_error` it is written out after all if the block raises."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            if replay_on_error:
                held.seek(0)
                sys.stderr.write(held.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
