"""The results tables' protocol: a grid of learning rates and warm-ups per model, resumable, chosen on the validation
loss; the shared results file; chrF; the loss curves of several runs."""

import argparse
import json
import math
import multiprocessing
import shutil
from pathlib import Path

import pytest

from talk_hf.training.evaluation import corpus_chrf
from talk_hf.training.plot import curve, plot_runs, read_metrics
from talk_hf.training.run import record_result
from talk_hf.training.tuning import (
    FinalRunExistsError,
    Grid,
    MissingRunError,
    add_arguments,
    check_arguments,
    choose,
    grid_of,
    grid_rows,
    grid_search,
    point_name,
    read_rows,
    run_and_tabulate,
    run_stages,
    write_tables,
)

LOSSES = {(1e-3, 100): 3.0, (1e-3, 300): 2.5, (2e-3, 100): 2.2, (2e-3, 300): float("nan")}


def fake_train(calls):
    def train(learning_rate, warmup_steps, max_steps, name):
        calls.append((learning_rate, warmup_steps, max_steps, name))
        return {"model": "talk", "valid_loss": LOSSES[learning_rate, warmup_steps], "steps": max_steps}

    return train


GRID = Grid((1e-3, 2e-3), (100, 300), 50)


def test_grid_search_trains_every_point_once_and_chooses_the_lowest_finite_validation_loss(tmp_path):
    calls, path = [], tmp_path / "grid.json"
    rows, chosen = grid_search({"model": "talk"}, GRID, fake_train(calls), path)
    assert [c[:2] for c in calls] == GRID.points() == [(1e-3, 100), (1e-3, 300), (2e-3, 100), (2e-3, 300)]
    assert {c[2] for c in calls} == {50} and calls[1][3] == point_name(1e-3, 300) == "lr0.001-wu300"
    assert (chosen["learning_rate"], chosen["warmup_steps"], chosen["valid_loss"]) == (2e-3, 100, 2.2)
    assert [r["budget"] for r in rows] == [50] * 4 and all(r["device"] for r in rows)
    assert math.isnan(json.loads(path.read_text())[-1]["valid_loss"])  # the diverged run is recorded too

    again = []
    assert grid_search({"model": "talk"}, GRID, fake_train(again), path)[1] == chosen and again == []


def test_an_interrupted_grid_continues_with_the_missing_points_only(tmp_path):
    path = tmp_path / "grid.json"
    record_result(path, {"model": "talk", "learning_rate": 1e-3, "warmup_steps": 100, "budget": 50, "valid_loss": 1.0},
                  ("model", "learning_rate", "warmup_steps", "budget"))
    record_result(path, {"model": "talk", "learning_rate": 2e-3, "warmup_steps": 100, "budget": 99, "valid_loss": 0.1},
                  ("model", "learning_rate", "warmup_steps", "budget"))  # another budget: not this grid's run
    calls = []
    rows, chosen = grid_search({"model": "talk"}, GRID, fake_train(calls), path)
    assert [c[:2] for c in calls] == [(1e-3, 300), (2e-3, 100), (2e-3, 300)]
    assert chosen["valid_loss"] == 1.0 and len(rows) == 4
    assert grid_rows(path, {"model": "marian"}, GRID) == []


def test_every_grid_run_diverged_is_an_error():
    with pytest.raises(ValueError, match="every grid run diverged"):
        choose([{"valid_loss": float("nan")}, {"valid_loss": float("inf")}])


@pytest.mark.parametrize("grid,match", [(((), (100,), 5), "learning_rates"), (((1e-3, 1e-3), (100,), 5), "distinct"),
                                        (((1e-3,), (0,), 5), "warmup_steps"), (((1e-3,), (100,), 0), "max_steps")])
def test_grid_errors(grid, match):
    with pytest.raises(ValueError, match=match):
        Grid(*grid)


def test_a_fixed_setting_trains_the_final_runs_without_a_grid(tmp_path):
    parser = argparse.ArgumentParser()
    add_arguments(parser, [1e-3, 2e-3], [100, 300], grid_steps=50, max_steps=7, eval_every=2, patience=3)
    calls = []

    def train(ident, folder, learning_rate, warmup_steps, **loop):
        calls.append((ident["model"], learning_rate, warmup_steps, loop["max_steps"], loop.get("save_every")))
        return {"valid_loss": 1.5, "steps": loop["max_steps"]}

    run_stages(parser.parse_args(["--setting", "2e-3", "300"]), tmp_path, [{"model": "a"}, {"model": "b"}], train)
    assert calls == [("a", 2e-3, 300, 7, 2), ("b", 2e-3, 300, 7, 2)]  # final runs only: no grid point trained
    assert not (tmp_path / "grid.json").exists()
    rows = json.loads((tmp_path / "results.json").read_text())
    assert [(r["model"], r["fixed_setting"]) for r in rows] == [("a", True), ("b", True)]
    for bad in (["2e-3", "0.5"], ["0", "300"], ["x", "300"]):
        with pytest.raises(SystemExit):  # argparse's error: the message names --setting
            parser.parse_args(["--setting", *bad])
    with pytest.raises(ValueError, match="--setting trains final runs only"):
        run_stages(parser.parse_args(["--setting", "2e-3", "300", "--stages", "tune"]), tmp_path, [{"model": "a"}],
                   train)
    assert len(calls) == 2


def loss_valley(best_rate, diverge_above=None):
    """Validation losses lowest at `best_rate` (warm-up 100), rising a step per doubling away from it; NaN above
    `diverge_above`."""
    def train(learning_rate, warmup_steps, max_steps, name):
        if diverge_above is not None and learning_rate > diverge_above:
            return {"valid_loss": float("nan")}
        return {"valid_loss": abs(math.log2(learning_rate / best_rate)) + warmup_steps / 1000}

    return train


@pytest.mark.parametrize("best_rate,extensions,trained_rates,chosen_rate", [
    (8e-3, 2, [1e-3, 2e-3, 4e-3, 8e-3], 8e-3),  # the best lies past the edge: two doublings reach it
    (2e-3, 2, [1e-3, 2e-3, 4e-3], 2e-3),  # one doubling past the edge is worse: the best is inside now
    (3e-2, 2, [1e-3, 2e-3, 4e-3, 8e-3], 8e-3),  # both extensions used: the best stays at the last edge
    (1.25e-4, 1, [5e-4, 1e-3, 2e-3], 5e-4),  # below the smallest rate: halved
    (8e-3, 0, [1e-3, 2e-3], 2e-3),  # no extensions: the grid as given
])
def test_a_best_point_at_the_edge_extends_the_learning_rates(tmp_path, best_rate, extensions, trained_rates,
                                                             chosen_rate):
    grid = Grid((1e-3, 2e-3), (100, 300), 50, extensions)
    rows, chosen = grid_search({"model": "talk"}, grid, loss_valley(best_rate), tmp_path / "grid.json")
    assert sorted({r["learning_rate"] for r in rows}) == trained_rates
    assert len(rows) == 2 * len(trained_rates)  # every warm-up at every rate
    assert (chosen["learning_rate"], chosen["warmup_steps"]) == (chosen_rate, 100)


def test_a_diverged_extension_ends_the_search(tmp_path):
    grid = Grid((1e-3, 2e-3), (100, 300), 50, extensions=3)
    rows, chosen = grid_search({"model": "talk"}, grid, loss_valley(1e-1, diverge_above=2e-3), tmp_path / "grid.json")
    assert sorted({r["learning_rate"] for r in rows}) == [1e-3, 2e-3, 4e-3]
    assert chosen["learning_rate"] == 2e-3


def test_shards_share_a_grid_and_its_extensions(tmp_path):
    """Three shards run round after round (as processes started again would) train every point of the grid and of
    its two extensions once, and choose what one process does."""
    grid, path, calls = Grid((1e-3, 2e-3), (100, 300), 50, extensions=2), tmp_path / "grid.json", []

    def train(learning_rate, warmup_steps, max_steps, name):
        calls.append((learning_rate, warmup_steps))
        return loss_valley(8e-3)(learning_rate, warmup_steps, max_steps, name)

    rounds = 0
    while True:
        rounds += 1
        chosen = [grid_search({"model": "talk"}, grid, train, path, shard=(i, 3))[1] for i in range(3)]
        if all(chosen):
            break
        assert rounds < 5
    whole, best = grid_search({"model": "talk"}, grid, loss_valley(8e-3), tmp_path / "whole.json")
    assert sorted(calls) == sorted((r["learning_rate"], r["warmup_steps"]) for r in whole)  # each point once
    assert len(calls) == 8 and rounds == 3  # the grid, then an extension the shard completing it could not finish
    assert {c["learning_rate"] for c in chosen} == {best["learning_rate"]} == {8e-3}


def test_shards_run_the_tune_stage_only(tmp_path):
    parser = argparse.ArgumentParser()
    add_arguments(parser, [1e-3, 2e-3], [100], grid_steps=5, max_steps=7, eval_every=2, patience=3)
    for bad in (["2", "2"], ["-1", "2"]):
        with pytest.raises(SystemExit):  # argparse's error: the message names --grid_shard
            parser.parse_args(["--grid_shard", *bad])
    with pytest.raises(ValueError, match="run the shards with --stages tune"):
        run_stages(parser.parse_args(["--grid_shard", "0", "2"]), tmp_path, [{"model": "a"}], None)
    trained = []

    def train(ident, folder, learning_rate, warmup_steps, **loop):
        trained.append((learning_rate, loop["max_steps"]))
        return {"valid_loss": learning_rate, "steps": loop["max_steps"]}

    run_stages(parser.parse_args(["--grid_shard", "1", "2", "--stages", "tune"]), tmp_path, [{"model": "a"}], train)
    assert trained == [(2e-3, 5)]  # the second point of the grid, and no final run


@pytest.mark.parametrize("flags, message", [
    (["--grid_shard", "0", "2"], "--grid_shard shares the tune stage between processes"),
    (["--setting", "2e-3", "300", "--stages", "tune"], "--setting trains final runs only"),
])
def test_stages_that_do_not_fit_the_options_are_usage_errors_before_any_work(flags, message, tmp_path, capsys):
    """check_arguments, which the runners call before preparing any data, refuses them (exit 2, the message)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser, [1e-3, 2e-3], [100], grid_steps=5, max_steps=7, eval_every=2, patience=3)
    parser.add_argument("--max_tokens", type=int, default=64)
    parser.add_argument("--output_dir", default=str(tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        check_arguments(parser, parser.parse_args(flags))
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_a_grid_continued_with_another_batch_size_or_seed_is_refused(tmp_path):
    """The points of one grid are compared: each is recorded with the options that change its validation loss, and
    a run with other values refuses to add points to it, naming the option."""
    parser = argparse.ArgumentParser()
    add_arguments(parser, [1e-3, 2e-3], [100], grid_steps=5, max_steps=7, eval_every=2, patience=3, extensions=0)
    parser.add_argument("--max_tokens", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=1)
    trained = []

    def train(ident, folder, learning_rate, warmup_steps, **loop):
        trained.append(learning_rate)
        return {"valid_loss": learning_rate, "steps": loop["max_steps"]}

    run_stages(parser.parse_args(["--stages", "tune", "--grid_shard", "0", "2"]), tmp_path, [{"model": "a"}], train)
    assert trained == [1e-3] and read_rows(tmp_path / "grid.json")[0]["seed"] == 1
    for flags, message in ((["--max_tokens", "512"], "--max_tokens 4096, not 512"),
                           (["--seed", "2"], "--seed 1, not 2")):
        with pytest.raises(ValueError, match=f"^a: the grid point lr0.001-wu100 in .* was trained with {message}"):
            run_stages(parser.parse_args([*flags, "--stages", "tune"]), tmp_path, [{"model": "a"}], train)
    assert trained == [1e-3]
    run_stages(parser.parse_args(["--stages", "tune"]), tmp_path, [{"model": "a"}], train)  # the same: continued
    assert trained == [1e-3, 2e-3]


def test_a_resumed_final_run_without_a_checkpoint_starts_afresh(tmp_path):
    """A final run stopped before its first checkpoint left only its metrics: --resume trains it again from the
    start in a clean folder (the training loop refuses a folder holding another run's metrics)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser, [1e-3], [100], grid_steps=5, max_steps=7, eval_every=2, patience=3)
    folder = tmp_path / "final" / "a"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')
    seen = []

    def train(ident, out, learning_rate, warmup_steps, **loop):
        seen.append((loop["resume"], out.exists()))
        return {"valid_loss": 1.0, "steps": loop["max_steps"]}

    run_stages(parser.parse_args(["--setting", "2e-3", "300", "--resume"]), tmp_path, [{"model": "a"}], train)
    assert seen == [(False, False)]


def test_a_final_run_is_not_trained_over_without_resume(tmp_path):
    parser = argparse.ArgumentParser()
    add_arguments(parser, [1e-3], [100], grid_steps=5, max_steps=7, eval_every=2, patience=3)
    (tmp_path / "final" / "a" / "checkpoints" / "step-2").mkdir(parents=True)
    with pytest.raises(FinalRunExistsError, match="holds a final run: --resume continues it"):
        run_stages(parser.parse_args(["--setting", "2e-3", "300"]), tmp_path, [{"model": "a"}], None)


def test_the_final_stage_waits_for_the_extended_grid(tmp_path):
    """A recorded grid whose best point lies at an edge is not complete until its extension is: the final stage
    refuses to start, and the tune stage trains the missing rate only."""
    parser = argparse.ArgumentParser()
    add_arguments(parser, [1e-3, 2e-3], [100, 300], grid_steps=50, max_steps=7, eval_every=2, patience=3)
    args = parser.parse_args(["--grid_extensions", "1"])
    calls = []

    def train(ident, folder, learning_rate, warmup_steps, **loop):
        calls.append((learning_rate, warmup_steps, loop["max_steps"]))
        loss = loss_valley(4e-3)(learning_rate, warmup_steps, loop["max_steps"], None)["valid_loss"]
        return {"valid_loss": loss, "steps": loop["max_steps"]}

    key = ("model", "learning_rate", "warmup_steps", "budget")
    for rate, warmup in Grid((1e-3, 2e-3), (100, 300), 50).points():  # the grid as it was first run
        record_result(tmp_path / "grid.json", {"model": "a", "learning_rate": rate, "warmup_steps": warmup,
                                               "budget": 50, "valid_loss": 1 / rate + warmup}, key)
    with pytest.raises(MissingRunError, match="a: 4 of the grid's 6 runs"):
        run_stages(parser.parse_args(["--grid_extensions", "1", "--stages", "final"]), tmp_path, [{"model": "a"}],
                   train)
    run_stages(args, tmp_path, [{"model": "a"}], train)
    assert calls == [(4e-3, 100, 50), (4e-3, 300, 50), (4e-3, 100, 7)]  # the extension, then the final run


GAIN_ROWS = [{"learning_rate": 1e-3, "warmup_steps": 100, "valid_loss": 4.6, "valid_source_gain": 0.30},
             {"learning_rate": 1e-3, "warmup_steps": 300, "valid_loss": 4.5, "valid_source_gain": 0.12},
             {"learning_rate": 2e-3, "warmup_steps": 100, "valid_loss": 4.4, "valid_source_gain": 0.0},
             {"learning_rate": 2e-3, "warmup_steps": 300, "valid_loss": float("nan"), "valid_source_gain": 0.5}]


def test_a_source_gain_threshold_chooses_among_the_points_that_read_their_source():
    assert choose(GAIN_ROWS)["valid_loss"] == 4.4  # the lowest loss: an encoder that reads nothing
    assert choose(GAIN_ROWS, 0.1)["valid_loss"] == 4.5
    assert choose(GAIN_ROWS, 0.2)["valid_loss"] == 4.6  # the diverged point is never chosen, whatever its gain
    assert choose(GAIN_ROWS, 0.31) is None
    with pytest.raises(ValueError, match="needs every run's valid_source_gain"):
        choose([{"valid_loss": 1.0}], 0.1)
    with pytest.raises(ValueError, match="min_source_gain must be >= 0"):
        Grid((1e-3,), (100,), 5, min_source_gain=-0.1)


def test_the_grid_extends_past_the_edge_of_the_best_point_that_reads_its_source(tmp_path):
    """Losses fall with the learning rate, but above 1e-3 the encoder stops reading its source: the chosen point lies
    at the smallest rate, so the grid is extended below it, not above the largest."""
    def train(learning_rate, warmup_steps, max_steps, name):
        return {"valid_loss": 1 / learning_rate + warmup_steps, "valid_source_gain": 0.3 * (learning_rate <= 1e-3)}

    grid = Grid((1e-3, 2e-3), (100, 300), 50, extensions=1, min_source_gain=0.1)
    rows, chosen = grid_search({"model": "doc"}, grid, train, tmp_path / "grid.json")
    assert sorted({r["learning_rate"] for r in rows}) == [5e-4, 1e-3, 2e-3]
    assert (chosen["learning_rate"], chosen["warmup_steps"]) == (1e-3, 100)
    plain = Grid((1e-3, 2e-3), (100, 300), 50, extensions=1)
    rows, chosen = grid_search({"model": "lm"}, plain, train, tmp_path / "grid.json")
    assert sorted({r["learning_rate"] for r in rows}) == [1e-3, 2e-3, 4e-3] and chosen["learning_rate"] == 4e-3


def test_the_final_stage_refuses_a_grid_where_no_point_reads_its_source(tmp_path):
    parser = argparse.ArgumentParser()
    add_arguments(parser, [1e-3, 2e-3], [100], grid_steps=50, max_steps=7, eval_every=2, patience=3, extensions=0,
                  min_source_gain=0.1)
    finals = []

    def train(ident, folder, learning_rate, warmup_steps, **loop):
        if loop.get("eval_every"):
            finals.append(learning_rate)
        return {"valid_loss": 1.0 / learning_rate, "valid_source_gain": 0.01 * learning_rate / 1e-3, "steps": 1}

    with pytest.raises(MissingRunError, match=r"doc: no point of its grid reads its source as much as "
                                              r"--grid_min_source_gain 0.1 \(dev source gains: lr0.001-wu100 0.01, "
                                              r"lr0.002-wu100 0.02\); train the grid longer"):
        run_stages(parser.parse_args([]), tmp_path, [{"model": "doc"}], train)
    assert finals == []
    run_stages(parser.parse_args(["--grid_min_source_gain", "0"]), tmp_path, [{"model": "doc"}], train)
    assert finals == [2e-3]  # no threshold: the lowest loss, from the grid already recorded


def _record(args):
    path, i = args
    record_result(path, {"model": f"m{i}", "valid_loss": float(i)}, ("model",))


def test_parallel_runners_share_one_results_file(tmp_path):
    path = tmp_path / "results.json"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_record, [(path, i) for i in range(16)])
    assert sorted(r["model"] for r in json.loads(path.read_text())) == sorted(f"m{i}" for i in range(16))


def test_chrf_scores_text_and_checks_lengths():
    score, signature = corpus_chrf(["a man rides a bike ."], ["a man rides a bike ."])
    assert score == pytest.approx(100.0) and signature.startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0")
    assert corpus_chrf(["a dog"], ["a man rides a bike ."])[0] < 50
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        corpus_chrf(["a", "b"], ["a"])


def test_loss_curves_of_several_runs_in_one_plot(tmp_path):
    for name, losses in {"a": [3.0, 2.0], "b": [3.5, 2.5, 2.2]}.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(
            json.dumps({"step": 10 * (i + 1), "valid_loss": v}) + "\n" for i, v in enumerate(losses)))
    with open(tmp_path / "b.jsonl", "a") as f:  # b's last checkpoints averaged: same step, not on the curve
        f.write(json.dumps({"step": 30, "valid_loss": 2.1, "averaged_checkpoints": 2}) + "\n")
    assert curve(read_metrics(tmp_path / "b.jsonl"), "valid_loss") == ([(10, 3.5), (20, 2.5), (30, 2.2)], [(30, 2.1)])
    image = plot_runs({"a": tmp_path / "a.jsonl", "b": tmp_path / "b.jsonl"}, tmp_path / "curves.png")
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "c.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0}) + "\n")
    with pytest.raises(ValueError, match="no 'valid_loss' record to plot for 'c'"):
        plot_runs({"c": tmp_path / "c.jsonl"}, tmp_path / "none.png")


def test_a_process_killed_while_writing_leaves_the_results_file_whole(tmp_path, monkeypatch):
    """Readers take no lock (grid_rows, the tables): the file they read is the last one written in full."""
    path, key = tmp_path / "grid.json", ("model",)
    record_result(path, {"model": "a", "valid_loss": 1.0}, key)

    def killed_half_way(self, text, *args, **kwargs):
        with open(self, "w") as f:
            f.write(text[: len(text) // 2])
        raise SystemExit("killed")

    monkeypatch.setattr(Path, "write_text", killed_half_way)
    with pytest.raises(SystemExit):
        record_result(path, {"model": "b", "valid_loss": 2.0}, key)
    monkeypatch.undo()
    assert [r["model"] for r in read_rows(path)] == ["a"] and not list(tmp_path.glob(".*.partial"))
    assert [r["model"] for r in record_result(path, {"model": "b", "valid_loss": 2.0}, key)] == ["a", "b"]


def test_a_row_whose_grid_diverged_leaves_the_other_rows_tables(tmp_path):
    """Its grid is listed with nothing chosen, the other rows are tabulated and run, and the runner stops with a
    message (no traceback) naming the divergence."""
    parser = argparse.ArgumentParser()
    add_arguments(parser, [1e-3, 2e-3], [100], grid_steps=5, max_steps=7, eval_every=2, patience=3, extensions=0)
    columns = [("model", lambda r: r["model"]), ("lr", lambda r: f"{r['learning_rate']:g}"),
               ("valid loss", lambda r: f"{r['valid_loss']:.3f}")]

    def train(ident, folder, learning_rate, warmup_steps, **loop):
        diverged = ident["model"] == "bad"
        return {"valid_loss": float("nan") if diverged else learning_rate * 1000, "steps": loop["max_steps"]}

    idents = [{"model": "good"}, {"model": "bad"}]
    with pytest.raises(SystemExit, match="error: every grid run diverged"):
        run_and_tabulate(parser.parse_args(["--stages", "tune"]), tmp_path, idents[::-1], train, idents, columns,
                         columns)
    tables = write_tables(tmp_path, grid_of(parser.parse_args([])), idents, columns, columns)
    assert tables["grid.md"].count("| bad ") == 2 and "| nan |" in tables["grid.md"]
    assert tables["short_budget.md"].count("| good ") == 0  # the good row's grid has not run: the runner stopped
    run_and_tabulate(parser.parse_args(["--stages", "tune"]), tmp_path, idents[:1], train, idents, columns, columns)
    short = (tmp_path / "short_budget.md").read_text()
    assert short.count("| good ") == 1 and "| bad " not in short


def test_the_tables_are_written_when_a_final_runs_folder_is_gone(tmp_path):
    """A recorded final run whose folder was removed (to train it afresh) keeps its results.md row; the plot leaves
    it out with a warning instead of failing before any table is written."""
    parser = argparse.ArgumentParser()
    add_arguments(parser, [1e-3], [100], grid_steps=5, max_steps=7, eval_every=2, patience=3)
    columns = [("model", lambda r: r["model"]), ("valid loss", lambda r: f"{r['valid_loss']:.3f}")]

    def train(ident, folder, learning_rate, warmup_steps, **loop):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.jsonl").write_text('{"step": 2, "valid_loss": 2.0}\n')
        return {"valid_loss": 2.0, "steps": loop["max_steps"]}

    idents = [{"model": "a"}, {"model": "b"}]
    run_and_tabulate(parser.parse_args(["--setting", "1e-3", "100"]), tmp_path, idents, train, idents, columns,
                     columns)
    (tmp_path / "results.md").unlink()
    (tmp_path / "valid_loss.png").unlink()
    shutil.rmtree(tmp_path / "final" / "a")
    with pytest.warns(UserWarning, match="valid_loss.png leaves out a: no metrics.jsonl"):
        tables = write_tables(tmp_path, grid_of(parser.parse_args([])), idents, columns, columns)
    assert tables["results.md"].count("| 2.000 |") == 2 and (tmp_path / "results.md").exists()
    assert (tmp_path / "valid_loss.png").exists()  # b's curve


def test_the_final_runs_take_a_time_cap(tmp_path):
    parser = argparse.ArgumentParser()
    add_arguments(parser, [1e-3], [100], grid_steps=5, max_steps=7, eval_every=2, patience=3)
    caps = []

    def train(ident, folder, learning_rate, warmup_steps, **loop):
        caps.append((loop["max_steps"], loop.get("max_minutes")))
        return {"valid_loss": 1.0, "steps": 1}

    run_stages(parser.parse_args(["--setting", "1e-3", "100", "--max_minutes", "4.5"]), tmp_path, [{"model": "a"}],
               train)
    assert caps == [(7, 4.5)]
