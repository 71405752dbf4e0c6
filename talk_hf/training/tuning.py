"""The protocol of the results tables (scripts/results_*.py): each model's learning rate and warm-up are chosen on
the validation set from one grid, every point trained for the same short budget and judged by its final weights
(for translation, optionally among the points whose encoder reads its source: `Grid.min_source_gain`).
When a model's best point lies at the grid's largest (smallest) learning rate, its grid gains the rate one doubling
(halving) further at every warm-up, and so on up to `Grid.extensions` times, so that no model is held at an edge of
the grid (warm-ups are not extended). Then one run per model with its chosen settings trains until the validation
loss stops improving (TrainConfig.patience) or a cap, and its last checkpoints are averaged.

Every grid run is recorded in a JSON list as it finishes, so a search that stops part-way (an interrupted process,
a machine handed back) continues where it stopped, and the list holds every run's result, the chosen and the
rejected. Several processes may share a grid (`grid_search`'s shards), writing the one list in turn."""

import argparse
import dataclasses
import itertools
import json
import math
import shutil
import warnings
from pathlib import Path

from .plot import plot_runs
from .run import record_result
from .tables import markdown_table


@dataclasses.dataclass(frozen=True)
class Grid:
    """Peak learning rates x inverse-sqrt warm-ups, every point trained for `max_steps` updates; the learning rates
    are extended past an edge holding the best point up to `extensions` times (`extended`). With `min_source_gain`
    only points whose dev source gain (docs/training.md: the loss with swapped sources minus the loss with the right
    ones, nats per token) reaches it may be chosen: an encoder that stopped reading its input leaves a decoder that
    is a language model of the targets, whose validation loss can still be the lowest of the grid."""

    learning_rates: tuple[float, ...]
    warmup_steps: tuple[int, ...]
    max_steps: int
    extensions: int = 0
    min_source_gain: float | None = None

    def __post_init__(self):
        for name in ("learning_rates", "warmup_steps"):
            values = tuple(getattr(self, name))
            if not values or len(set(values)) != len(values) or not all(v > 0 for v in values):
                raise ValueError(f"the grid's {name} must be distinct values > 0, got {values!r}")
            object.__setattr__(self, name, values)
        if self.max_steps < 1:
            raise ValueError(f"the grid's max_steps must be >= 1, got {self.max_steps}")
        if self.extensions < 0:
            raise ValueError(f"the grid's extensions must be >= 0, got {self.extensions}")
        if self.min_source_gain is not None and not self.min_source_gain >= 0:
            raise ValueError(f"the grid's min_source_gain must be >= 0, got {self.min_source_gain}")

    def points(self):
        """(learning rate, warm-up) pairs, learning rate major."""
        return list(itertools.product(self.learning_rates, self.warmup_steps))

    def choose(self, rows):
        """The chosen one of this grid's recorded rows (`choose` with this grid's source-gain threshold), or None."""
        return choose(rows, self.min_source_gain)

    def complete(self, rows):
        """Whether `rows`, this grid's recorded rows (`grid_rows`), hold every point."""
        return len(rows) == len(self.points())

    def extended(self, best):
        """This grid with the learning rate one doubling past its largest rate when `best` (the best point's row)
        has it, or one halving below its smallest; None when `best` lies inside or is None (no point may be
        chosen), the grid has a single rate, or no extension is left."""
        rates = sorted(self.learning_rates)
        if best is None or self.extensions == 0 or len(rates) < 2 or rates[0] < best["learning_rate"] < rates[-1]:
            return None
        rate = 2 * rates[-1] if best["learning_rate"] == rates[-1] else rates[0] / 2
        return dataclasses.replace(self, learning_rates=tuple(sorted((*rates, rate))), extensions=self.extensions - 1)


def point_name(learning_rate, warmup_steps):
    """The run folder of a grid point: lr0.002-wu300."""
    return f"lr{learning_rate:g}-wu{warmup_steps}"


GRID_FIELDS = ("learning_rate", "warmup_steps", "budget")


def _matches(row, ident, learning_rate, warmup_steps, budget):
    return (all(row.get(k) == v for k, v in ident.items())
            and (row.get("learning_rate"), row.get("warmup_steps"), row.get("budget"))
            == (learning_rate, warmup_steps, budget))


def read_rows(results_path):
    path = Path(results_path)
    return json.loads(path.read_text()) if path.exists() else []


def grid_rows(results_path, ident, grid):
    """The recorded runs of `grid` for the row `ident` (e.g. {"model": "talk"}), in grid order (missing points left
    out)."""
    rows = read_rows(results_path)
    found = []
    for learning_rate, warmup_steps in grid.points():
        found += [r for r in rows if _matches(r, ident, learning_rate, warmup_steps, grid.max_steps)][:1]
    return found


def row_grid(results_path, ident, grid):
    """The grid of the row `ident` as far as its recorded runs decide it: `grid`, extended (`Grid.extended`) while
    all its points are recorded and the best of them lies at an edge -> (that grid, its recorded rows in grid order);
    complete (`Grid.complete`) when every point has its row."""
    while True:
        rows = grid_rows(results_path, ident, grid)
        wider = grid.extended(grid.choose(rows)) if grid.complete(rows) else None
        if wider is None:
            return grid, rows
        grid = wider


def grid_search(ident, grid, train, results_path, shard=(0, 1)):
    """Train the row `ident` at every point of its grid (`row_grid`: `grid`, extended past an edge holding the best
    point) not yet recorded in `results_path` -> (its grid rows, the chosen row).

    train(learning_rate, warmup_steps, max_steps, name) -> the result dict of one run, with "valid_loss"; `name` is
    the point's folder name. Each result is recorded (with `ident`, the point and "budget") as soon as it exists.
    The chosen point (`choose`) has the lowest validation loss; a run whose loss is not finite (diverged) is never
    chosen, and a grid where every run diverged raises ValueError.

    shard=(index, count): train only the points whose place in the grid's order is `index` modulo `count`, so that
    `count` processes share one grid; a shard whose points are recorded while others' are missing returns (the
    recorded rows, None), and the shard that completes a grid trains its share of the grid's extension (`count`
    processes started again train the rest)."""
    key = (*ident, *GRID_FIELDS)
    index, count = shard
    while True:
        current, rows = row_grid(results_path, ident, grid)
        if current.complete(rows):
            return rows, current.choose(rows)
        recorded = {(r["learning_rate"], r["warmup_steps"]) for r in rows}
        mine = [point for i, point in enumerate(current.points()) if i % count == index and point not in recorded]
        if not mine:
            return rows, None
        for learning_rate, warmup_steps in mine:
            row = train(learning_rate, warmup_steps, grid.max_steps, point_name(learning_rate, warmup_steps))
            row = {**row, **ident, "learning_rate": learning_rate, "warmup_steps": warmup_steps,
                   "budget": grid.max_steps}
            record_result(results_path, row, key)


def choose(rows, min_source_gain=None):
    """The row with the lowest finite validation loss (ties: the first in grid order) among those whose
    "valid_source_gain" reaches `min_source_gain` when one is given; None when no row does."""
    finite = [r for r in rows if math.isfinite(r["valid_loss"])]
    if not finite:
        raise GridDivergedError(f"every grid run diverged (validation losses {[r['valid_loss'] for r in rows]}): "
                                "train the grid at smaller learning rates")
    if min_source_gain is not None:
        if any("valid_source_gain" not in r for r in finite):
            raise ValueError("a grid that chooses on the source gain needs every run's valid_source_gain (only "
                             "translation runs measure it)")
        finite = [r for r in finite if r["valid_source_gain"] >= min_source_gain]
    return min(finite, key=lambda r: r["valid_loss"], default=None)


def describe_gains(rows):
    """'lr0.001-wu100 0.02, ...': each point's dev source gain, for the message of a grid where none may be chosen."""
    return ", ".join(f"{point_name(r['learning_rate'], r['warmup_steps'])} {r['valid_source_gain']:.2f}"
                     for r in rows if math.isfinite(r["valid_loss"]))


# -- the two stages of a results runner ------------------------------------------------------------------------------

STAGES = ("tune", "final")
FINAL_AVERAGE_LAST = 3  # a final run's model: the mean of its last 3 checkpoints (one per validation)


class MissingRunError(ValueError):
    """A stage needs a run that has not been made yet (a final run before its grid, a row before the row it starts
    from): the runners print it as an error message, without a traceback."""


class FinalRunExistsError(ValueError):
    """A final run's folder holds a run and --resume was not given: printed as MissingRunError is."""


class GridDivergedError(MissingRunError):
    """Every run of a row's grid diverged: there is no setting to choose (the other rows' tables are still
    written)."""


def add_arguments(parser, learning_rates, warmup_steps, grid_steps, max_steps, eval_every, patience, extensions=2,
                  min_source_gain=None):
    """The options every results runner shares, with that runner's defaults (`min_source_gain`: translation
    runners only, whose runs measure the source gain)."""
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    parser.add_argument("--grid_learning_rates", nargs="+", type=float, default=learning_rates)
    parser.add_argument("--grid_warmup_steps", nargs="+", type=int, default=warmup_steps)
    parser.add_argument("--grid_extensions", type=int, default=extensions,
                        help="how many times a model's learning rates may be extended (doubled past the largest, "
                             "halved below the smallest) while its best grid point lies at that edge")
    parser.add_argument("--grid_steps", type=int, default=grid_steps,
                        help="updates of every grid run (the short budget)")
    if min_source_gain is not None:
        parser.add_argument("--grid_min_source_gain", type=float, default=min_source_gain,
                            help="choose only among grid points whose dev source gain (nats per token) reaches this "
                                 "(0: no threshold)")
    parser.add_argument("--grid_shard", nargs=2, type=int, default=(0, 1), action=GridShard,
                        metavar=("INDEX", "COUNT"),
                        help="train only the grid points whose place in the grid's order is INDEX modulo COUNT: "
                             "COUNT processes started at once with the same --output_dir share each row's grid (one "
                             "GPU and several CPU cores); start them again for a grid extended past an edge")
    parser.add_argument("--max_steps", type=int, default=max_steps, help="the cap of the final runs")
    parser.add_argument("--max_minutes", type=float, default=0.0,
                        help="a time cap of the final runs: minutes of training (a resumed run counts its earlier "
                             "ones), after which the run ends as at --max_steps (checkpoints averaged, test scored); "
                             "0: none")
    parser.add_argument("--eval_every", type=int, default=eval_every, help="validation of the final runs, in updates")
    parser.add_argument("--patience", type=int, default=patience,
                        help="a final run stops after this many validations without a new lowest loss")
    parser.add_argument("--resume", action="store_true", help="continue the final runs from their last checkpoints")
    parser.add_argument("--setting", nargs=2, action=FixedSetting, metavar=("LEARNING_RATE", "WARMUP_STEPS"),
                        help="no grid: every final run at this one setting (a fixed-budget comparison, not a tuned "
                             "one; recorded as fixed_setting in results.json)")


class FixedSetting(argparse.Action):
    """--setting LEARNING_RATE WARMUP_STEPS -> {"learning_rate": float > 0, "warmup_steps": int >= 1}."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            setting = {"learning_rate": float(values[0]), "warmup_steps": int(values[1])}
        except ValueError:
            setting = None
        if setting is None or setting["learning_rate"] <= 0 or setting["warmup_steps"] < 1:
            parser.error(f"{option_string} needs a learning rate > 0 and a whole number of warm-up steps >= 1, "
                         f"got {' '.join(values)}")
        setattr(namespace, self.dest, setting)


class GridShard(argparse.Action):
    """--grid_shard INDEX COUNT -> (INDEX, COUNT) with 0 <= INDEX < COUNT."""

    def __call__(self, parser, namespace, values, option_string=None):
        index, count = values
        if not 0 <= index < count:
            parser.error(f"{option_string} needs 0 <= INDEX < COUNT, got {index} {count}")
        setattr(namespace, self.dest, (index, count))


def check_arguments(parser, args):
    """Exit with a usage error (parser.error) when the shared options, --max_tokens or --test_limit are out of range:
    before any data is prepared or any run trained, not at the first run that uses them."""
    from .loop import TrainConfig

    try:
        grid_of(args)
        TrainConfig(output_dir=str(args.output_dir), max_tokens=args.max_tokens, max_steps=args.max_steps,
                    max_minutes=args.max_minutes, eval_every=args.eval_every, patience=args.patience)
    except ValueError as err:
        parser.error(str(err))
    if (error := stage_error(args)) is not None:
        parser.error(error)
    if getattr(args, "test_limit", 0) < 0:
        parser.error(f"--test_limit must be >= 0 (0: every test example), got {args.test_limit}")


def stage_error(args):
    """What is wrong with the stages asked for alongside --setting or --grid_shard, or None."""
    if args.setting is not None and "final" not in args.stages:
        return "--setting trains final runs only (there is no grid to tune): add --stages final"
    if args.grid_shard[1] > 1 and "final" in args.stages:
        return ("--grid_shard shares the tune stage between processes: run the shards with --stages tune, then the "
                "final stage without --grid_shard")
    return None


def grid_of(args):
    return Grid(tuple(args.grid_learning_rates), tuple(args.grid_warmup_steps), args.grid_steps,
                args.grid_extensions, getattr(args, "grid_min_source_gain", None) or None)


def row_folder(ident):
    """The run folder name of a row: its identifying values joined, e.g. "talk" or "rfa_doc-gate-4"."""
    return "-".join(str(v) for v in ident.values())


# the runners' options that change a grid point's validation loss, recorded with each point: a grid compares points
# trained alike (the batch size, the seed)
POINT_SETTINGS = ("max_tokens", "seed")


def point_settings(args):
    """The POINT_SETTINGS options a runner has -> {option: value}."""
    return {k: getattr(args, k) for k in POINT_SETTINGS if hasattr(args, k)}


def check_recorded_settings(out, idents, settings):
    """Refuse to add points to a grid whose recorded points of these rows were trained with other `settings`
    ({option: value}, `point_settings`) than these (an option a point's record lacks is not compared)."""
    rows = read_rows(out / "grid.json")
    for ident in idents:
        for row in rows:
            if not all(row.get(k) == v for k, v in ident.items()):
                continue
            for key, value in settings.items():
                if key in row and row[key] != value:
                    raise ValueError(
                        f"{row_folder(ident)}: the grid point {point_name(row['learning_rate'], row['warmup_steps'])} "
                        f"in {out / 'grid.json'} was trained with --{key} {row[key]}, not {value}: a grid compares "
                        f"points trained alike; run with --{key} {row[key]}, or in another --output_dir")


def tune(out, ident, grid, train, shard=(0, 1), settings=None):
    """The grid runs of one row not yet in <out>/grid.json (`shard`: as in `grid_search`) -> (its grid rows, the
    chosen row); `settings` ({option: value}, `point_settings`) are recorded with each point.

    train(ident, folder, learning_rate, warmup_steps, **loop) -> the row's result dict; `loop`: the TrainConfig
    fields the protocol sets (here max_steps, and one checkpoint at the end, not averaged: a grid point is judged by
    the weights its budget ends with). A point interrupted part-way starts afresh in <out>/grid/<row>/<point>/."""
    folder = out / "grid" / row_folder(ident)

    def point(learning_rate, warmup_steps, max_steps, name):
        shutil.rmtree(folder / name, ignore_errors=True)
        row = train(ident, folder / name, learning_rate, warmup_steps, max_steps=max_steps, save_every=0,
                    keep_checkpoints=1, average_last=0)
        return {**(settings or {}), **row}

    return grid_search(ident, grid, point, out / "grid.json", shard)


def chosen(out, ident, grid):
    """The chosen grid row of `ident`; MissingRunError when its grid (extended as `row_grid` decides) is not complete
    in <out>/grid.json."""
    current, rows = row_grid(out / "grid.json", ident, grid)
    if not current.complete(rows):
        raise MissingRunError(f"{row_folder(ident)}: {len(rows)} of the grid's {len(current.points())} runs are in "
                              f"{out / 'grid.json'}; run the tune stage first")
    best = current.choose(rows)
    if best is None:
        raise MissingRunError(f"{row_folder(ident)}: no point of its grid reads its source as much as "
                              f"--grid_min_source_gain {grid.min_source_gain:g} (dev source gains: "
                              f"{describe_gains(rows)}); train the grid longer (--grid_steps) or at other settings")
    return best


def final(out, ident, grid, train, max_steps, eval_every, patience, resume=False, setting=None, max_minutes=0.0):
    """One row's run at its chosen setting (or at `setting`, {"learning_rate", "warmup_steps"}, without a grid) in
    <out>/final/<row>/, validated every `eval_every` updates until `patience` validations bring no new lowest loss,
    `max_steps` or `max_minutes` of training, its last FINAL_AVERAGE_LAST checkpoints averaged; recorded in
    <out>/results.json -> all rows."""
    fixed = setting is not None
    setting = setting if fixed else chosen(out, ident, grid)
    folder = out / "final" / row_folder(ident)
    if resume and not any((folder / "checkpoints").glob("step-*")):
        shutil.rmtree(folder, ignore_errors=True)  # stopped before its first checkpoint: nothing to continue
        resume = False
    elif not resume and folder.exists() and any(folder.iterdir()):
        raise FinalRunExistsError(f"{folder} holds a final run: --resume continues it (a finished one is tabulated "
                                  "again); remove the folder to train it afresh")
    row = train(ident, folder, setting["learning_rate"], setting["warmup_steps"], max_steps=max_steps,
                max_minutes=max_minutes, eval_every=eval_every, save_every=eval_every, patience=patience,
                resume=resume, keep_checkpoints=FINAL_AVERAGE_LAST, average_last=FINAL_AVERAGE_LAST)
    return record_result(out / "results.json", {**row, **ident, "fixed_setting": fixed}, tuple(ident))


def run_stages(args, out, idents, train, grid_train=None):
    """The stages args.stages asks for, row by row (a row's final run before the next row's grid, so a row may
    start from an earlier row's final model); idents: dicts of identifying fields, in order -> the grid.
    `grid_train`: the grid points' train where it differs from the final runs' (None: `train`).
    With args.setting there is no tune stage: every final run trains at that learning rate and warm-up."""
    grid, setting = grid_of(args), args.setting
    if (error := stage_error(args)) is not None:
        raise ValueError(error)
    settings = point_settings(args)
    if setting is None and "tune" in args.stages:
        check_recorded_settings(out, idents, settings)
    for ident in idents:
        if "tune" in args.stages and setting is None:
            tune(out, ident, grid, grid_train or train, args.grid_shard, settings)
        if "final" in args.stages:
            final(out, ident, grid, train, args.max_steps, args.eval_every, args.patience, args.resume, setting,
                  args.max_minutes)
    return grid


# the columns every results table of final runs has: where the run was best, and what stopped it (a run without
# patience reports no best update, "-", and ends at its cap)
STOP_COLUMNS = [
    ("best update", lambda r: str(r.get("best_step", "-"))),
    ("stopped by", lambda r: "patience" if r.get("stopped_early") else "cap"),
    ("final weights", lambda r: r.get("final_weights", "-")),
]


def run_and_tabulate(args, out, idents, train, table_idents, grid_columns, final_columns, grid_train=None):
    """A runner's main: run_stages for `idents` (`grid_train`: as there), then write_tables for `table_idents` and
    print them -> {file name: table}. A missing earlier run exits with its message, no traceback, after writing the
    tables of what has run (a grid whose points all read too little of their source is in grid.md)."""
    grid = grid_of(args)
    try:
        run_stages(args, out, idents, train, grid_train)
    except (MissingRunError, FinalRunExistsError) as err:
        write_tables(out, grid, table_idents, grid_columns, final_columns)
        raise SystemExit(f"error: {err}") from err
    tables = write_tables(out, grid, table_idents, grid_columns, final_columns)
    for name, table in tables.items():
        print(f"{name}:\n{table}\n")
    return tables


def write_tables(out, grid, idents, grid_columns, final_columns):
    """grid.md (every grid run), short_budget.md (the chosen run of each complete grid that has one), results.md
    (the final runs) and valid_loss.png (their validation losses) for the rows `idents` -> {file name: table}."""
    tables = {}
    grids = {}  # row folder -> (its grid rows, the chosen one of a complete grid or None)
    for ident in idents:
        try:
            current, rows = row_grid(out / "grid.json", ident, grid)
            best = current.choose(rows) if current.complete(rows) else None
        except GridDivergedError:  # listed in grid.md, with nothing chosen
            rows, best = grid_rows(out / "grid.json", ident, grid), None
        grids[row_folder(ident)] = rows, best
    if any(rows for rows, _ in grids.values()):
        tables["grid.md"] = markdown_table([r for rows, _ in grids.values() for r in rows], grid_columns)
        tables["short_budget.md"] = markdown_table([b for _, b in grids.values() if b is not None], grid_columns)
    finals = [r for i in idents for r in read_rows(out / "results.json") if all(r.get(k) == v for k, v in i.items())]
    if finals:
        tables["results.md"] = markdown_table(finals, final_columns)
    for name, table in tables.items():
        (out / name).write_text(table + "\n")
    names = [row_folder({k: r[k] for k in idents[0]}) for r in finals]
    logs = {name: out / "final" / name / "metrics.jsonl" for name in names}
    missing = sorted(name for name, path in logs.items() if not path.exists())
    if missing:  # a recorded run whose folder was removed: its row stays in results.md, its curve cannot be drawn
        warnings.warn(f"valid_loss.png leaves out {', '.join(missing)}: no metrics.jsonl in "
                      f"{out / 'final'} for {'it' if len(missing) == 1 else 'them'}", UserWarning, stacklevel=2)
    if len(missing) < len(logs):
        plot_runs({name: path for name, path in logs.items() if name not in missing}, out / "valid_loss.png")
    return tables
