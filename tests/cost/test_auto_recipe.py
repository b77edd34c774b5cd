"""From Python: the auto preset's mesh is choose_mesh's winner, whose `train` is the recipe it
won with; `str(ranking)` is the ranking as the command line prints it (no jax)."""

from __future__ import annotations

from loadax_mesh import MeshConfig, TrainSpec, choose_mesh
from loadax_mesh.cli.main import main
from loadax_mesh.view.estimate import ranking_text


def test_the_auto_preset_and_choose_mesh_give_the_same_winner() -> None:
    where = {"hardware": "tpu-v5p-16", "model": "tiny", "global_batch": 16}
    config = MeshConfig.from_preset("auto", **where)
    ranking = choose_mesh("tpu-v5p-16", "tiny", TrainSpec(global_batch=16))
    assert ranking[0].config == config
    assert ranking[0].train.global_batch == 16 and ranking[0].estimate.fits
    # options: the recipe fields pin the search, the rest are the TrainSpec it prices
    options = {"remat": "dots", "opt_state_dtype": "bfloat16"}
    config = MeshConfig.from_preset("auto", **where, **options)
    train = TrainSpec(global_batch=16, **options)
    pinned = choose_mesh("tpu-v5p-16", "tiny", train, recipes=[{"remat": "dots"}])
    assert pinned[0].config == config
    assert (pinned[0].train.remat, pinned[0].train.opt_state_dtype) == ("dots", "bfloat16")


def test_a_ranking_prints_as_the_command_line_prints_it(capsys) -> None:
    ranking = choose_mesh("tpu-v5p-16", "tiny", TrainSpec(global_batch=16))
    text = str(ranking)
    assert text == ranking_text(ranking) and text.startswith("ranking    ")
    assert main(["plan", "tpu-v5p-16", "--strategy", "auto", "--model", "tiny",
                 "--global-batch", "16"]) == 0  # fmt: skip
    assert capsys.readouterr().out.startswith(text + "\n\n")
    assert repr(ranking) == repr(list(ranking))  # still a list of choices
