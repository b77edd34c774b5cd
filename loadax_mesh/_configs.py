"""Where the shipped `configs/` folder lives: the source tree, or inside the installed wheel."""

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def config_path(*parts: str) -> Path:
    """Path of a file under `configs/` (source checkout or editable install first, then wheel)."""
    for root in (_HERE.parent / "configs", _HERE / "configs"):
        if root.is_dir():
            return root.joinpath(*parts)
    raise FileNotFoundError(f"loadax_mesh: no configs/ folder next to {_HERE}")
